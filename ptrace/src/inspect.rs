//! What `mtrace attach` needs to know of the process before touching it:
//! its mappings, where its libc's `dlopen`, `dlsym` and `dlerror` are, and
//! whether it can be attached to at all.

use anyhow::{anyhow, bail, Result};
use mtrace_format::maps::Mapping;
use object::{Object, ObjectSymbol};

/// The mappings of process `pid`.
pub fn maps(pid: i32) -> Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow!("no such process: {pid}"),
        std::io::ErrorKind::PermissionDenied => anyhow!("not permitted to read the mappings of process {pid}"),
        _ => anyhow!("process {pid}: {e}"),
    })?;
    Ok(Mapping::all(&text).collect())
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The functions of the process's libc that the injection calls.
pub struct Libc {
    /// `dlopen`'s address in the process.
    pub dlopen: u64,
    /// `dlsym`'s.
    pub dlsym: u64,
    /// `dlerror`'s.
    pub dlerror: u64,
    /// `memfd_create`'s, `socketpair`'s and `close`'s: what reaches a
    /// process in another mount namespace (glibc has had them since
    /// 2.27, older than the `dlopen` in libc this needs); 0 if absent.
    pub memfd_create: u64,
    /// See `memfd_create`.
    pub socketpair: u64,
    /// See `memfd_create`.
    pub close: u64,
    /// `dlclose`'s (0 if absent).
    pub dlclose: u64,
    /// `dladdr`'s (0 if absent).
    pub dladdr: u64,
}

/// What `mtrace attach` found in the process.
pub struct Target {
    /// Where its libc's loader functions are.
    pub libc: Libc,
    /// Text of libc and the loader: a thread stopped there may hold a lock.
    pub busy: Vec<(u64, u64)>,
    /// The symbol versions its libc defines (`GLIBC_2.2.5` … `GLIBC_2.36`).
    pub libc_versions: Vec<String>,
}

/// Refuses, in one line, a process whose memory this process may not read
/// with `process_vm_readv` though ptrace may be allowed: a seccomp profile
/// that forbids the call (Docker's default, in a container without
/// CAP_SYS_PTRACE: its `--ptrace` attach read no code and saw nothing).
/// Other failures (the process ended) are left to the attach.
pub fn check_readable(pid: i32) -> Result<()> {
    let maps = maps(pid)?;
    let Some(m) = maps.iter().find(|m| m.read) else { return Ok(()) };
    let mut word = [0u8; 8];
    let local = [std::io::IoSliceMut::new(&mut word)];
    let remote = [nix::sys::uio::RemoteIoVec { base: m.start as usize, len: 8 }];
    match nix::sys::uio::process_vm_readv(nix::unistd::Pid::from_raw(pid), &mut { local }, &remote) {
        Err(nix::errno::Errno::EPERM) | Err(nix::errno::Errno::ENOSYS) => bail!(
            "not permitted to read the memory of process {pid} (process_vm_readv refused: a seccomp profile, \
             such as Docker's default without --cap-add SYS_PTRACE)"
        ),
        _ => Ok(()),
    }
}

/// Why process `pid` cannot be attached to: it runs with libmtrace.so
/// preloaded (`mtrace run`, `LD_PRELOAD`) and is traced so already.
pub fn preloaded_already(pid: i32) -> anyhow::Error {
    anyhow!(
        "process {pid} already runs with libmtrace.so preloaded: ask it for reports with its signals \
         (kill -USR1 {pid}) or read its trace file"
    )
}

/// Looks the process over. Errors name why it cannot be attached to:
/// no such process, another architecture, statically linked or without
/// `dlopen`, libmtrace.so preloaded already.
pub fn inspect(pid: i32) -> Result<Target> {
    let maps = maps(pid)?;
    let exe = std::fs::read(format!("/proc/{pid}/exe"))
        .map_err(|e| anyhow!("process {pid}: cannot read its executable: {e}"))?;
    let obj = object::File::parse(&*exe).map_err(|e| anyhow!("process {pid}: its executable is not ELF: {e}"))?;
    if obj.architecture() != object::Architecture::X86_64 {
        bail!("process {pid} is {:?}; mtrace attach works on x86_64 processes only", obj.architecture());
    }
    if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
        let preload = env.split(|&b| b == 0).find_map(|v| v.strip_prefix(b"LD_PRELOAD="));
        if preload.is_some_and(|p| String::from_utf8_lossy(p).contains("libmtrace")) {
            return Err(preloaded_already(pid));
        }
    }
    let is_libc = |m: &Mapping| {
        let n = file_name(&m.path);
        n.starts_with("libc.so") || n.starts_with("libc-2.")
    };
    let Some(base) = maps.iter().find(|m| is_libc(m) && m.offset == 0) else {
        bail!(
            "process {pid} is statically linked (no libc.so mapped), so libmtrace.so cannot be loaded into it; \
             mtrace attach --ptrace {pid} traces it from outside (slower)"
        );
    };
    let libc_path = base.path.clone();
    // The very file mapped: a container's is not at its path here.
    let places = base.openable(pid as u32);
    let data = places
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or_else(|| anyhow!("process {pid}: cannot read its libc ({libc_path})"))?;
    let elf = object::File::parse(&*data).map_err(|e| anyhow!("{libc_path}: {e}"))?;
    // The bias: where the file's first PT_LOAD (address 0 in libc) landed.
    let first_load = elf.segments().map(|s| object::ObjectSegment::address(&s)).min().unwrap_or(0) & !0xfff;
    let bias = base.start - first_load;
    let find = |name: &str| {
        elf.dynamic_symbols().find(|s| s.name() == Ok(name) && s.address() != 0).map(|s| bias + s.address())
    };
    let (Some(dlopen), Some(dlsym), Some(dlerror)) = (find("dlopen"), find("dlsym"), find("dlerror")) else {
        bail!(
            "process {pid}: its libc ({libc_path}) has no dlopen (glibc before 2.34 keeps it in libdl, not \
             supported); mtrace attach --ptrace {pid} traces it from outside (slower)"
        );
    };
    let busy = maps
        .iter()
        .filter(|m| m.exec && (is_libc(m) || file_name(&m.path).starts_with("ld-linux")))
        .map(|m| (m.start, m.end))
        .collect();
    let [memfd_create, socketpair, close, dlclose, dladdr] =
        ["memfd_create", "socketpair", "close", "dlclose", "dladdr"].map(|n| find(n).unwrap_or(0));
    let libc_versions = crate::library_file::versions(&data).map(|v| v.defined).unwrap_or_default();
    Ok(Target {
        libc: Libc { dlopen, dlsym, dlerror, memfd_create, socketpair, close, dlclose, dladdr },
        busy,
        libc_versions,
    })
}
