//! Calling a function of libmtrace.so inside a process it is loaded in
//! (preloaded or attached), by ptrace: how its reader (`mtrace server`,
//! `mtrace attach`) makes a process with one thread, idle in a system
//! call, do the round its commands wait for (docs/PROCESSES.md).
//!
//! The function's address comes from the library's dynamic symbols and
//! where the process mapped it: nothing but the library's own code runs
//! in the process (no `dlopen` or `dlsym`). That code makes no
//! `nanosleep`, the one system call that replaces a thread's restart
//! block without being interrupted (kernel/time/hrtimer.c), so the call
//! the thread was stopped in (a poll or a sleep with a timeout) goes on
//! from its restart block, for its own time, as after any stop
//! ([`Tracee::keep_restart_block`]). A word of the library's is read
//! from outside too ([`InProcess::read_u32`]), the process running on.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use mtrace_format::maps::Mapping;
use object::{Object, ObjectSegment, ObjectSymbol};

use crate::inject::Tracee;

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The name a module was loaded under: its file name, or the name of the
/// memory file `mtrace attach` loaded it from into a container
/// (`/memfd:libmtrace.so (deleted)` in the maps).
fn loaded_name(path: &str) -> &str {
    let name = file_name(path);
    name.strip_prefix("memfd:").map_or(name, |n| n.strip_suffix(" (deleted)").unwrap_or(n))
}

/// libmtrace.so as loaded in one process: the text of libc, the loader
/// and the library, where a stopped thread may hold a lock the library's
/// functions take.
pub struct InProcess {
    pid: i32,
    busy: Vec<(u64, u64)>,
}

impl InProcess {
    /// The library `lib` (found among process `pid`'s mappings by its file
    /// name), and where each of the symbols `names` it exports is in the
    /// process. Errors: it is not mapped, not readable as ELF, or lacks
    /// one of them.
    pub fn find(pid: i32, lib: &Path, names: &[&str]) -> Result<(InProcess, Vec<u64>)> {
        let maps = crate::inspect::maps(pid)?;
        let lib_name = lib.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mapped = maps
            .iter()
            .find(|m| m.offset == 0 && loaded_name(&m.path) == lib_name)
            .ok_or_else(|| anyhow!("process {pid} has no {lib_name} loaded"))?;
        // The very file mapped (another mount namespace's, a memory
        // file), else ours.
        let data = mapped
            .openable(pid as u32)
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .map_or_else(|| std::fs::read(lib), Ok)
            .context(mapped.path.clone())?;
        let elf = object::File::parse(&*data).with_context(|| mapped.path.clone())?;
        let bias = mapped.start - (elf.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff);
        let addrs = names
            .iter()
            .map(|&name| {
                let sym = elf.dynamic_symbols().find(|s| s.name() == Ok(name) && s.address() != 0);
                sym.map(|s| bias + s.address()).ok_or_else(|| anyhow!("{}: no symbol {name}", mapped.path))
            })
            .collect::<Result<Vec<u64>>>()?;
        let busy = maps
            .iter()
            .filter(|m: &&Mapping| {
                let n = file_name(&m.path);
                m.exec && (n.starts_with("libc.so") || n.starts_with("ld-linux") || loaded_name(&m.path) == lib_name)
            })
            .map(|m| (m.start, m.end))
            .collect();
        Ok((InProcess { pid, busy }, addrs))
    }

    /// Calls the function at `func` (one of the library's, taking one
    /// integer) with `arg` on a thread chosen as for the attach (a thread
    /// in a system call that holds no lock, or in the program's own code:
    /// [`Tracee::choose`]; for a process with one thread, its futex waits
    /// too: [`ALONE_SAFE`]); its result. Errors: ptrace refused (another
    /// tracer: a debugger, strace; no permission), no thread free within
    /// 2 s.
    pub fn call(&self, func: u64, arg: u64) -> Result<u64> {
        let mut tracee = Tracee::seize(self.pid)?;
        tracee.choose_among(&self.busy, ALONE_SAFE)?;
        tracee.keep_restart_block();
        let rc = tracee.call(func, &[], |_| vec![arg])?;
        tracee.release()?;
        Ok(rc)
    }

    /// The 32-bit word at `addr` in the process (read from outside, as a
    /// debugger does: the process is not stopped); `None` where it cannot
    /// be read.
    pub fn read_u32(&self, addr: u64) -> Option<u32> {
        let mut word = [0u8; 4];
        let local = [std::io::IoSliceMut::new(&mut word)];
        let remote = [nix::sys::uio::RemoteIoVec { base: addr as usize, len: 4 }];
        let n = nix::sys::uio::process_vm_readv(nix::unistd::Pid::from_raw(self.pid), &mut { local }, &remote).ok()?;
        (n == 4).then(|| u32::from_ne_bytes(word))
    }
}

/// System calls a process with one thread may wait in, beyond those
/// [`Tracee::choose`] takes, with no lock held that the library's
/// functions take: a futex wait (no other thread of the process holds a
/// lock it waits for), and the restart of an interrupted wait (a poll or
/// a sleep a stop interrupted before, this call's last time among them).
const ALONE_SAFE: &[i64] = &[libc::SYS_futex, libc::SYS_restart_syscall];

/// Calls `name(arg)`, a function of the library `lib` loaded in process
/// `pid` that takes one integer (see [`InProcess::call`]), and returns its
/// result. Errors: those of [`InProcess::find`] and [`InProcess::call`].
pub fn call(pid: i32, lib: &Path, name: &str, arg: u64) -> Result<u64> {
    let (l, at) = InProcess::find(pid, lib, &[name])?;
    l.call(at[0], arg)
}

/// The pid of the process tracing process `pid` (a debugger, strace), if
/// one does: `TracerPid` in its status.
pub fn tracer_of(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let t: i32 = status.lines().find_map(|l| l.strip_prefix("TracerPid:"))?.trim().parse().ok()?;
    (t != 0).then_some(t)
}

/// Whether process `pid` has one thread: its tracing then has no writer
/// thread, and it reads commands and writes what it buffered only at its
/// allocation calls, or when its reader makes it ([`call`]).
pub fn single_threaded(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| d.count() == 1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_library_loaded_from_memory_goes_by_its_name() {
        assert_eq!(super::loaded_name("/memfd:libmtrace.so (deleted)"), "libmtrace.so");
        assert_eq!(super::loaded_name("/work/target/release/libmtrace.so"), "libmtrace.so");
        assert_eq!(super::loaded_name("/tmp/x (deleted)"), "x (deleted)");
    }
}
