//! The process tree of a run that traced several processes (a shell
//! script, a build, `git gc`): each process once, however many images it
//! ran (a child that forked and then exec'd is one process), under the
//! process that forked it, with how it ended and what it left. Built from
//! the traces of one folder (pipeline/processes.rs); the report's table of
//! contents, in text and in JSON (`processes`).

use std::path::{Path, PathBuf};

use mtrace_format::{EndReason, Header};
use serde::Serialize;

/// One image a process ran: from its start or a fork, or from an exec.
#[derive(Clone, Debug, Serialize)]
pub struct Image {
    /// The executable.
    pub exe: String,
    /// Its command line.
    pub cmdline: Vec<String>,
    /// Its trace.
    pub trace: PathBuf,
}

/// One process of the run, with the processes it forked.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessNode {
    /// Its process id.
    pub pid: u32,
    /// Its parent's.
    pub ppid: u32,
    /// The images it ran, in order.
    pub images: Vec<Image>,
    /// How it ended: exit, _exit, abort, signal N, exec (into an image
    /// that wrote no trace), detach; none without an End record (killed by
    /// SIGKILL, or still running: [`ProcessNode::running`]).
    pub ended_by: Option<String>,
    /// The exit status of an exit or _exit, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<u8>,
    /// Its last image exec'd a program that wrote no trace: what it asked
    /// to run, and why that could not be traced, where known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_traced: Option<NotTraced>,
    /// Allocation calls over all its images.
    pub allocations: u64,
    /// Bytes and blocks (mappings included) its last image had not freed
    /// when it ended (an exec ends the image before it, and its heap).
    pub not_freed_bytes: u64,
    /// The blocks of `not_freed_bytes`.
    pub not_freed_blocks: u64,
    /// mtrace did not see every allocator of its last image (that image's
    /// report says which).
    pub blind: bool,
    /// No End record because it was still running when the report was
    /// made (a daemon the program forked and left behind): its last
    /// image's trace is the part written so far.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub running: bool,
    /// The process reported in full (the program's).
    pub reported: bool,
    /// The processes it forked, in the order they started.
    pub children: Vec<ProcessNode>,
}

/// An exec whose image wrote no trace.
#[derive(Clone, Debug, Serialize)]
pub struct NotTraced {
    /// What the process asked `exec` to run.
    pub exec: String,
    /// Why the preload could not trace it, in a few words ("a static
    /// executable", "setuid", "another architecture"); none when the
    /// analyzer could not tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// What one trace says of its image, as read whole.
#[derive(Clone, Debug)]
pub struct ImageFacts {
    /// Its header.
    pub header: Header,
    /// The trace's path.
    pub path: PathBuf,
    /// Its End record's reason, if it wrote one.
    pub end: Option<EndReason>,
    /// What it asked `exec` to run last (its Exec record).
    pub exec: Option<String>,
    /// Children it started where its tracing may not follow them (its
    /// Spawned records): (when, ns since its trace's start; pid; what they
    /// were to run).
    pub spawned: Vec<(u64, u32, String)>,
    /// Its allocation calls.
    pub allocations: u64,
    /// Bytes and blocks not freed at its end.
    pub not_freed: (u64, u64),
    /// Not every allocator of it was seen.
    pub blind: bool,
    /// It wrote no End record and still has its trace open
    /// ([`holds_open`]): running when the report was made.
    pub running: bool,
}

/// Whether process `pid` has the file at `path` open (one of the links
/// in `/proc/PID/fd`): a traced process that wrote no End record and
/// still holds its trace is running, not killed; a pid used again by
/// another process since does not hold it. False where `/proc` cannot
/// tell (another user's process, no such process).
pub fn holds_open(pid: u32, path: &Path) -> bool {
    let Ok(want) = std::fs::canonicalize(path) else { return false };
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == want))
}

/// The processes of `images` (any order) as a forest: each process under
/// the one whose pid is its parent's, roots those whose parent was not
/// traced; `reported` is the pid reported in full.
pub fn tree(mut images: Vec<ImageFacts>, reported: u32) -> Vec<ProcessNode> {
    images.sort_by_key(|i| i.header.start_monotonic_ns);
    let mut procs: Vec<(u64, ProcessNode)> = Vec::new();
    let spawned: Vec<(u64, u32, u32, String)> = images
        .iter()
        .flat_map(|i| {
            let start = i.header.start_monotonic_ns;
            i.spawned.iter().map(move |(t, pid, path)| (start + t, *pid, i.header.pid, path.clone()))
        })
        .collect();
    for i in images {
        let start = i.header.start_monotonic_ns;
        let idx = match procs.iter().position(|(_, p)| p.pid == i.header.pid) {
            Some(k) => k,
            None => {
                procs.push((start, node(i.header.pid, i.header.ppid, reported)));
                procs.len() - 1
            }
        };
        let p = &mut procs[idx].1;
        p.images.push(Image { exe: i.header.exe.clone(), cmdline: i.header.cmdline.clone(), trace: i.path });
        p.allocations += i.allocations;
        // The last image's end and heap.
        (p.not_freed_bytes, p.not_freed_blocks) = i.not_freed;
        p.blind = i.blind;
        p.running = i.running;
        p.ended_by = i.end.map(end_text);
        p.exit_status = match i.end {
            Some(EndReason::Exit(s) | EndReason::UnderscoreExit(s)) => s,
            _ => None,
        };
        p.not_traced = match (i.end, i.exec) {
            (Some(EndReason::Exec), Some(exec)) => Some(NotTraced { why: None, exec }),
            _ => None,
        };
    }
    // A later image of the process (an exec that was traced) replaced the
    // one that ended by exec: not "not traced" then.
    for (_, p) in &mut procs {
        if p.ended_by.as_deref() != Some("exec") {
            p.not_traced = None;
        }
    }
    // Children started past the hooks (posix_spawn, vfork) that wrote no
    // trace: a node each, under the process that started them.
    for (start, pid, ppid, path) in spawned {
        if procs.iter().any(|(_, p)| p.pid == pid) {
            continue;
        }
        let mut n = node(pid, ppid, reported);
        n.ended_by = Some("exec".into());
        n.not_traced = Some(NotTraced { why: None, exec: path });
        let at = procs.iter().position(|(s, _)| *s > start).unwrap_or(procs.len());
        procs.insert(at, (start, n));
    }
    // Why, for the execs left untraced only (each a look at a file).
    for (_, p) in &mut procs {
        if let Some(n) = &mut p.not_traced {
            n.why = why_not_traced(&n.exec);
        }
    }
    // Children under parents, from the last started: each moves into its
    // parent, which started before it.
    let mut roots: Vec<ProcessNode> = Vec::new();
    while let Some((_, p)) = procs.pop() {
        match procs.iter_mut().rev().find(|(_, q)| q.pid == p.ppid) {
            Some((_, parent)) => parent.children.insert(0, p),
            None => roots.insert(0, p),
        }
    }
    roots
}

fn node(pid: u32, ppid: u32, reported: u32) -> ProcessNode {
    ProcessNode {
        pid,
        ppid,
        images: Vec::new(),
        ended_by: None,
        exit_status: None,
        not_traced: None,
        allocations: 0,
        not_freed_bytes: 0,
        not_freed_blocks: 0,
        blind: false,
        running: false,
        reported: pid == reported,
        children: Vec::new(),
    }
}

/// How a process ended, as the report's summary says it.
pub fn end_text(r: EndReason) -> String {
    match r {
        EndReason::Exit(_) => "exit".into(),
        EndReason::UnderscoreExit(_) => "_exit".into(),
        EndReason::Abort => "abort".into(),
        EndReason::Signal(n) => format!("signal {n}"),
        EndReason::Exec => "exec".into(),
        EndReason::Detach => "detach".into(),
    }
}

/// Why an exec of `exec` wrote no trace, from its file (looked up in
/// `PATH` when it is a bare name, as `execvp` does): a static executable
/// (no `PT_INTERP`: the loader, which preloads, never runs), setuid or
/// setgid (the loader drops `LD_PRELOAD`), another architecture, an
/// absolute path not found here (another root); `None` for a bare name not
/// found or none of these. Reads the file's headers only ([`ElfHead`]).
pub fn why_not_traced(exec: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = find(exec) else {
        // An absolute path that is not here: the process had changed its
        // root (chroot, a container), where libmtrace.so is not, and the
        // exec left it out of LD_PRELOAD (preload/src/platform/exec_env.rs).
        return exec.starts_with('/').then(|| {
            "not at that path here: run under another root (chroot, a container), which has no libmtrace.so \
             (mtrace run --ptrace traces it)"
                .to_owned()
        });
    };
    let meta = std::fs::metadata(&path).ok()?;
    if meta.permissions().mode() & 0o6000 != 0 {
        return Some(format!("{}: setuid or setgid (the loader ignores LD_PRELOAD)", path.display()));
    }
    let cache = object::ReadCache::new(std::fs::File::open(&path).ok()?);
    let Some(head) = ElfHead::read(&cache) else {
        // Not a 64-bit ELF file of this machine: which one, if ELF at all
        // (the section headers too, on this rare path).
        use object::Object;
        let file = object::File::parse(&cache).ok()?;
        let arch = file.architecture();
        return (arch != host_architecture()).then(|| format!("{}: another architecture ({arch:?})", path.display()));
    };
    head.is_static().then(|| format!("{}: a static executable (mtrace run --ptrace traces it)", path.display()))
}

/// The file of `exec` (looked up in `PATH` as [`why_not_traced`] does)
/// when it is a static executable of this machine's architecture: a
/// 64-bit ELF file without `PT_INTERP`, into which no loader runs to
/// preload libmtrace.so (static-pie too). `None` for a dynamic
/// executable, a script, another architecture, or a file not found or
/// not readable.
pub fn static_executable(exec: &str) -> Option<PathBuf> {
    let path = find(exec)?;
    let cache = object::ReadCache::new(std::fs::File::open(&path).ok()?);
    ElfHead::read(&cache)?.is_static().then_some(path)
}

/// The loader of `exec` (its `PT_INTERP`) when it is another C library's
/// than glibc's (musl's `/lib/ld-musl-x86_64.so.1`): libmtrace.so, built
/// against glibc, cannot be loaded there (musl's loader stops at its
/// glibc symbols, `_Unwind_Resume` among them). `None` for glibc's
/// loader (`ld-linux*`), a static executable, a script, another
/// architecture, or a file not found.
pub fn foreign_loader(exec: &str) -> Option<(PathBuf, String)> {
    let path = find(exec)?;
    let cache = object::ReadCache::new(std::fs::File::open(&path).ok()?);
    let interp = ElfHead::interp(&cache)?;
    let name = interp.rsplit('/').next().unwrap_or(&interp);
    (!name.starts_with("ld-linux")).then_some((path, interp))
}

/// What the ELF header and program headers of an executable of this
/// machine say of how it starts. Read through object's `ReadCache`, which
/// reads just the byte ranges parsed: the file may be a 250 MB browser
/// (reading it whole took 0.6 s of a Chromium run's report).
struct ElfHead {
    /// `ET_EXEC` or `ET_DYN`.
    executable_kind: bool,
    /// A `PT_LOAD` segment.
    loads: bool,
    /// A `PT_INTERP` segment: the loader runs, and with it the preload.
    interp: bool,
    /// `e_entry`.
    entry: u64,
}

impl ElfHead {
    /// `None` for what is not a 64-bit ELF file of this machine's
    /// architecture (x86-64, AArch64).
    fn read<'a, R: object::ReadRef<'a>>(data: R) -> Option<ElfHead> {
        use object::read::elf::{FileHeader, ProgramHeader};
        let elf = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
        let endian = elf.endian().ok()?;
        let machine = match host_architecture() {
            object::Architecture::X86_64 => object::elf::EM_X86_64,
            object::Architecture::Aarch64 => object::elf::EM_AARCH64,
            _ => return None,
        };
        if elf.e_machine(endian) != machine {
            return None;
        }
        let kind = elf.e_type(endian);
        let phdrs = elf.program_headers(endian, data).ok()?;
        Some(ElfHead {
            executable_kind: kind == object::elf::ET_EXEC || kind == object::elf::ET_DYN,
            loads: phdrs.iter().any(|p| p.p_type(endian) == object::elf::PT_LOAD),
            interp: phdrs.iter().any(|p| p.p_type(endian) == object::elf::PT_INTERP),
            entry: elf.e_entry(endian),
        })
    }

    /// The path in `PT_INTERP`, for an executable of this machine that
    /// has one.
    fn interp<'a, R: object::ReadRef<'a>>(data: R) -> Option<String> {
        use object::read::elf::{FileHeader, ProgramHeader};
        ElfHead::read(data)?;
        let elf = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
        let endian = elf.endian().ok()?;
        let phdrs = elf.program_headers(endian, data).ok()?;
        let p = phdrs.iter().find(|p| p.p_type(endian) == object::elf::PT_INTERP)?;
        let bytes = p.data(endian, data).ok()?;
        let text = bytes.split(|&b| b == 0).next()?;
        Some(String::from_utf8_lossy(text).into_owned())
    }

    /// No loader runs in it. A shared library is `ET_DYN` without
    /// `PT_INTERP` too, but it has no entry point of its own to run
    /// (`mtrace run -- libfoo.so` fails as it does natively); an
    /// executable has a `PT_LOAD` and an entry.
    fn is_static(&self) -> bool {
        self.executable_kind && self.loads && !self.interp && self.entry != 0
    }
}

fn host_architecture() -> object::Architecture {
    match std::env::consts::ARCH {
        "x86_64" => object::Architecture::X86_64,
        "aarch64" => object::Architecture::Aarch64,
        "x86" => object::Architecture::I386,
        _ => object::Architecture::Unknown,
    }
}

/// `exec` as a file: itself when it has a slash, else the first match in
/// `PATH` (as `execvp` looks it up).
pub fn find(exec: &str) -> Option<PathBuf> {
    if exec.contains('/') {
        return Path::new(exec).exists().then(|| PathBuf::from(exec));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(exec)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn img(pid: u32, ppid: u32, start: u64, exe: &str, end: Option<EndReason>) -> ImageFacts {
        ImageFacts {
            header: Header { pid, ppid, start_monotonic_ns: start, exe: exe.into(), ..Header::default() },
            path: PathBuf::from(format!("{exe}.{pid}.{start}")),
            end,
            exec: None,
            spawned: Vec::new(),
            allocations: 10,
            not_freed: (100, 1),
            blind: false,
            running: false,
        }
    }

    #[test]
    fn a_fork_then_exec_is_one_process_under_its_parent() {
        let t = tree(
            vec![
                img(10, 1, 1, "/bin/sh", Some(EndReason::Exit(Some(0)))),
                img(11, 10, 2, "/bin/sh", Some(EndReason::Exec)),
                img(11, 10, 3, "/bin/ls", Some(EndReason::Exit(Some(2)))),
                img(12, 10, 4, "/bin/sh", Some(EndReason::Signal(9))),
                img(13, 11, 5, "/bin/cat", None),
            ],
            10,
        );
        assert_eq!(t.len(), 1);
        let sh = &t[0];
        assert!(sh.reported);
        assert_eq!(sh.children.iter().map(|c| c.pid).collect::<Vec<_>>(), [11, 12]);
        let ls = &sh.children[0];
        assert_eq!(ls.images.len(), 2);
        assert_eq!((ls.ended_by.as_deref(), ls.exit_status, ls.allocations), (Some("exit"), Some(2), 20));
        assert!(ls.not_traced.is_none());
        assert_eq!(ls.children[0].pid, 13);
        assert_eq!(ls.children[0].ended_by, None);
        assert_eq!(sh.children[1].ended_by.as_deref(), Some("signal 9"));
    }

    #[test]
    fn only_an_elf_file_without_an_interpreter_is_a_static_executable() {
        // A dynamic executable, by path and by name in PATH; a script; a
        // shared library; nothing there. (The static one: tests/ptrace.rs.)
        let lib = "/lib/x86_64-linux-gnu/libm.so.6";
        for exec in ["/bin/sh", "sh", "/usr/bin/ldd", lib, "/nonexistent/prog"] {
            assert_eq!(static_executable(exec), None, "{exec}");
        }
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("text");
        std::fs::write(&text, "not an ELF file").unwrap();
        assert_eq!(static_executable(text.to_str().unwrap()), None);
    }

    #[test]
    fn an_exec_that_wrote_no_trace_says_why_where_it_can() {
        let mut last = img(20, 1, 1, "/bin/sh", Some(EndReason::Exec));
        last.exec = Some("/nonexistent/prog".into());
        let t = tree(vec![last], 20);
        let n = t[0].not_traced.as_ref().unwrap();
        let why = "not at that path here: run under another root (chroot, a container), which has no libmtrace.so \
                   (mtrace run --ptrace traces it)";
        assert_eq!((n.exec.as_str(), n.why.as_deref()), ("/nonexistent/prog", Some(why)));
        // A dynamic executable: nothing to say against it.
        assert_eq!(why_not_traced("/bin/sh"), None);
    }
}
