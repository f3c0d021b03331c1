//! Reaching a process that cannot see this machine's files: one in a
//! container (its own mount namespace and root), where libmtrace.so's path
//! and the attacher's socket path mean nothing. Nothing is put into its
//! root or its `/tmp`:
//! - the library, and a library it needs that the process's root lacks
//!   (`libgcc_s.so.1` in a root of libc alone), go in as memory files: the
//!   process makes a `memfd_create` file, this process writes the bytes
//!   into it through `/proc/PID/fd/N`, the process `dlopen`s
//!   `/proc/self/fd/N` and closes it (its mapping keeps it; it shows as
//!   `/memfd:NAME (deleted)` in the process's maps);
//! - the stream and the commands cross on a socket pair the process makes
//!   (`socketpair`): this process takes one end with `pidfd_getfd` (Linux
//!   5.6; the same right as ptrace) and the process closes that end; the
//!   library is told to use the other (`fd:N`), and closes it when it
//!   detaches.
//!
//! The process needs `/proc` mounted (every container runtime mounts it).
//! The `unsafe` here is the two pidfd system calls, which nix (0.29) has
//! not.

use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use mtrace_ptrace::inject::Tracee;
use mtrace_ptrace::inspect::Target;

/// Whether process `pid` sees `lib` at its path: the file under its root
/// is this one (same device and inode). False for a container's root.
pub fn sees(pid: i32, lib: &Path) -> bool {
    let here = std::fs::metadata(lib);
    let there = std::fs::metadata(format!("/proc/{pid}/root{}", lib.display()));
    matches!((here, there), (Ok(a), Ok(b)) if a.dev() == b.dev() && a.ino() == b.ino())
}

/// Refuses, in one line naming `--ptrace`, a process whose root has no
/// `/proc` mounted: it could not open its memory files by path.
pub fn check_proc(pid: i32) -> Result<()> {
    use nix::sys::statfs::{statfs, PROC_SUPER_MAGIC};
    if statfs(format!("/proc/{pid}/root/proc").as_str()).is_ok_and(|s| s.filesystem_type() == PROC_SUPER_MAGIC) {
        return Ok(());
    }
    bail!(
        "process {pid} does not see libmtrace.so (another root) and has no /proc mounted, through which it \
         would load it from memory; mtrace attach --ptrace {pid} traces it from outside"
    )
}

/// Makes a connected socket pair in the process: the number of its end
/// there, and the other end, taken out (the process keeps no copy).
/// Errors: the process's libc has no `socketpair`, the call failed, or
/// `pidfd_getfd` is refused (a kernel before 5.6, no ptrace right).
pub fn socket_pair(tracee: &mut Tracee, t: &Target, pid: i32) -> Result<(i32, UnixStream)> {
    if t.libc.socketpair == 0 || t.libc.close == 0 {
        bail!("process {pid}: its libc has no socketpair or close");
    }
    let kind = (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64;
    let (rc, fds) = tracee.call_out(t.libc.socketpair, &[0u8; 8], |p| vec![libc::AF_UNIX as u64, kind, 0, p])?;
    if rc as i32 != 0 {
        bail!("process {pid}: socketpair failed in it");
    }
    let theirs = i32::from_ne_bytes(fds[0..4].try_into().expect("4 bytes"));
    let taken = i32::from_ne_bytes(fds[4..8].try_into().expect("4 bytes"));
    let ours = take_descriptor(pid, taken);
    // Its copy of our end goes whatever happened: the pair breaks if ours
    // failed, and the library gives up at once.
    tracee.call(t.libc.close, &[], |_| vec![taken as u64])?;
    match ours {
        Ok(s) => Ok((theirs, s)),
        Err(e) => {
            tracee.call(t.libc.close, &[], |_| vec![theirs as u64])?;
            Err(e)
        }
    }
}

/// Refuses, in one line, a process whose descriptors this process may not
/// take (`pidfd_getfd`: a kernel before 5.6, or a seccomp profile, such as
/// Docker's default without CAP_SYS_PTRACE), before anything is loaded
/// into it: one of its descriptors is taken and let go again (a copy,
/// which changes nothing for the process). Nothing to try with a process
/// that has none open.
pub fn check_take(pid: i32) -> Result<()> {
    let first = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map_err(|e| anyhow!("process {pid}: its descriptors: {e}"))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .min();
    match first {
        Some(fd) => take_descriptor(pid, fd).map(drop).map_err(|e| {
            anyhow!(
                "{e:#} (a seccomp profile such as Docker's default forbids it without --cap-add SYS_PTRACE); \
                 mtrace attach --ptrace {pid} needs no descriptor of it"
            )
        }),
        None => Ok(()),
    }
}

/// A copy of process `pid`'s descriptor `fd` (`pidfd_getfd(2)`).
fn take_descriptor(pid: i32, fd: i32) -> Result<UnixStream> {
    // SAFETY: pidfd_open takes a pid and flags; it returns a new
    // descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if pidfd < 0 {
        bail!("process {pid}: pidfd_open: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned here from now on.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number of that
    // process and flags; it returns a new descriptor or -1.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, std::os::fd::AsRawFd::as_raw_fd(&pidfd), fd, 0) } as i32;
    if got < 0 {
        bail!(
            "cannot take a socket out of process {pid} (pidfd_getfd, Linux 5.6): {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: a descriptor pidfd_getfd just made (close-on-exec), ours.
    Ok(unsafe { UnixStream::from_raw_fd(got) })
}

/// The handle of the copy of `name` an earlier attach loaded into the
/// process from memory, if there is one: attaches after the first use it
/// (a second copy would not load: the library's thread-local variables
/// take room in the process's static TLS block, which has little to
/// spare; the third copy here failed with "cannot allocate memory in
/// static TLS block"). The loader names the copy by the path it was
/// opened by (`dladdr` of its first byte), and gives its handle for that
/// name (`RTLD_NOLOAD`).
pub fn loaded(tracee: &mut Tracee, t: &Target, pid: i32, name: &str) -> Result<Option<u64>> {
    let memfd = format!("/memfd:{name} (deleted)");
    let maps = mtrace_ptrace::inspect::maps(pid)?;
    let Some(m) = maps.iter().find(|m| m.offset == 0 && m.path == memfd) else { return Ok(None) };
    if t.libc.dladdr == 0 {
        bail!("process {pid}: its libc has no dladdr");
    }
    // Dl_info: dli_fname, dli_fbase, dli_sname, dli_saddr.
    let (found, info) = tracee.call_out(t.libc.dladdr, &[0u8; 32], |p| vec![m.start, p])?;
    let fname = u64::from_ne_bytes(info[0..8].try_into().expect("8 bytes"));
    if found as i32 == 0 || fname == 0 {
        bail!("process {pid}: the loader does not know its {memfd}");
    }
    let mut path = tracee.read_string(fname).into_bytes();
    path.push(0);
    let h = tracee.call(t.libc.dlopen, &path, |p| vec![p, (libc::RTLD_NOW | libc::RTLD_NOLOAD) as u64])?;
    Ok((h != 0).then_some(h))
}

/// Loads `file` into the process as a memory file named `name` (see the
/// module's comment): the `dlopen` handle. Errors: no `memfd_create` in
/// its libc or the call failed, the file cannot be written, or `dlopen`
/// failed (its message).
pub fn load(tracee: &mut Tracee, t: &Target, pid: i32, name: &str, file: &Path) -> Result<u64> {
    if t.libc.memfd_create == 0 {
        bail!("process {pid}: its libc has no memfd_create");
    }
    let mut cname = name.as_bytes().to_vec();
    cname.push(0);
    let fd = tracee.call(t.libc.memfd_create, &cname, |p| vec![p, libc::MFD_CLOEXEC as u64])? as i32;
    if fd < 0 {
        bail!("process {pid}: memfd_create failed in it");
    }
    let copied = copy_into(pid, fd, file);
    let handle = copied.and_then(|()| {
        let path = fresh_name(tracee, t, fd)?;
        tracee.call(t.libc.dlopen, path.as_bytes(), |p| vec![p, (libc::RTLD_NOW | libc::RTLD_LOCAL) as u64])
    });
    // The mapping holds the file now; the descriptor goes either way.
    tracee.call(t.libc.close, &[], |_| vec![fd as u64])?;
    let handle = handle?;
    if handle == 0 {
        let msg = tracee.call(t.libc.dlerror, &[], |_| vec![])?;
        let why = if msg == 0 { String::from("no reason given") } else { tracee.read_string(msg) };
        bail!("process {pid} could not load {} from memory: {why}", file.display());
    }
    Ok(handle)
}

/// A path of memory file `fd` (NUL-terminated) that names no library the
/// process has loaded: the loader takes a library whose name is the path
/// asked for as loaded already, without opening the file, and the number
/// of a memory file loaded before (closed since) comes again. So
/// `/proc/self/fd/N`, else with `./` once, twice … after `/proc/self/`,
/// until the loader knows the name not (`RTLD_NOLOAD`).
fn fresh_name(tracee: &mut Tracee, t: &Target, fd: i32) -> Result<String> {
    for k in 0..64 {
        let path = format!("/proc/self/{}fd/{fd}\0", "./".repeat(k));
        let h =
            tracee.call(t.libc.dlopen, path.as_bytes(), |p| vec![p, (libc::RTLD_LAZY | libc::RTLD_NOLOAD) as u64])?;
        if h == 0 {
            return Ok(path);
        }
        // The reference RTLD_NOLOAD took goes back.
        if t.libc.dlclose != 0 {
            tracee.call(t.libc.dlclose, &[], |_| vec![h])?;
        }
    }
    bail!("no free name for a memory file among 64")
}

/// Writes what the loader reads of `file` into process `pid`'s memory
/// file `fd` (`library_file::loadable_image`: no debug information, whose
/// bytes would cost the process RAM).
fn copy_into(pid: i32, fd: i32, file: &Path) -> Result<()> {
    let bytes = mtrace_ptrace::library_file::loadable_image(file)?;
    let into = format!("/proc/{pid}/fd/{fd}");
    let mut f = std::fs::OpenOptions::new().write(true).open(&into).with_context(|| into.clone())?;
    f.write_all(&bytes).with_context(|| into.clone())
}

/// Makes the libraries `lib` needs besides libc and the loader loadable in
/// the process: its own copy where its root has one (a `dlopen` by name
/// succeeds), else this machine's, through a memory file (its soname then
/// matches the `DT_NEEDED` entry). Errors: a library found neither there
/// nor here, or one that would not load.
pub fn dependencies(tracee: &mut Tracee, t: &Target, pid: i32, lib: &Path) -> Result<()> {
    for soname in mtrace_ptrace::library_file::needed(lib)? {
        let mut name = soname.clone().into_bytes();
        name.push(0);
        let h = tracee.call(t.libc.dlopen, &name, |p| vec![p, (libc::RTLD_NOW | libc::RTLD_LOCAL) as u64])?;
        if h != 0 {
            continue;
        }
        let here = host_copy(&soname).ok_or_else(|| {
            anyhow!("{}: needs {soname}, which neither process {pid} nor this machine has", lib.display())
        })?;
        load(tracee, t, pid, &soname, &here)?;
    }
    Ok(())
}

/// Where this machine keeps library `soname` (the loader's default
/// folders, Debian's multiarch one first).
fn host_copy(soname: &str) -> Option<PathBuf> {
    ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"]
        .iter()
        .map(|d| Path::new(d).join(soname))
        .find(|p| p.is_file())
}

/// Process `pid`'s number in its own pid namespace, when that differs
/// (`NSpid` in its status: the host's number first, its own last).
pub fn inner_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let inner: i32 = line.split_whitespace().last()?.parse().ok()?;
    (inner != pid).then_some(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_has_the_librarys_needs() {
        assert_eq!(host_copy("libgcc_s.so.1").map(|p| p.is_file()), Some(true));
        assert_eq!(host_copy("libnothing.so.7"), None);
    }

    #[test]
    fn a_process_sees_our_files_in_our_namespace() {
        let me = std::process::id() as i32;
        assert!(sees(me, &std::env::current_exe().unwrap()));
        assert!(!sees(me, Path::new("/nonexistent/libmtrace.so")));
        assert_eq!(inner_pid(me), None);
    }
}
