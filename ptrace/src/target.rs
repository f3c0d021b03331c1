//! Reading and writing a stopped target: registers (ptrace), memory
//! (process_vm_readv, and PTRACE_POKEDATA for code, whose pages are not
//! writable), and system calls made in it.

use anyhow::{anyhow, bail, Result};
use nix::sys::ptrace;
use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::arch::{self, Regs};

pub fn regs(tid: Pid) -> Result<Regs> {
    Ok(Regs(ptrace::getregs(tid)?))
}

pub fn set_regs(tid: Pid, r: &Regs) -> Result<()> {
    Ok(ptrace::setregs(tid, r.0)?)
}

/// Whether `st` is the stop a `PTRACE_INTERRUPT` of the tracer's causes
/// (`PTRACE_EVENT_STOP` with SIGTRAP; a group stop has its stop signal).
fn is_interrupt(st: &WaitStatus) -> bool {
    matches!(*st, WaitStatus::PtraceEvent(_, nix::sys::signal::Signal::SIGTRAP, ev)
        if ev == ptrace::Event::PTRACE_EVENT_STOP as i32)
}

/// Called at every stop `st` the tracer waited for: at an interrupt's
/// ([`is_interrupt`]), a system call the interrupt made fail with EINTR
/// (epoll_wait, sigtimedwait …) is set to be made again when the thread
/// goes on (`mtrace_format::interrupted`); a server in epoll_wait saw
/// EINTR at each attach. Other stops: nothing. Best effort: a thread
/// whose registers cannot be read or written is left as it is.
pub fn at_stop(st: &WaitStatus) {
    let WaitStatus::PtraceEvent(tid, ..) = *st else { return };
    if !is_interrupt(st) {
        return;
    }
    let Ok(mut r) = ptrace::getregs(tid) else { return };
    if let Some(rax) = mtrace_format::interrupted::after_stop(r.orig_rax as i64, r.rax as i64) {
        r.rax = rax as u64;
        let _ = ptrace::setregs(tid, r);
    }
}

/// Reads `buf.len()` bytes at `addr` of process `pid`; how many it could.
pub fn read(pid: Pid, addr: u64, buf: &mut [u8]) -> usize {
    let remote = [RemoteIoVec { base: addr as usize, len: buf.len() }];
    process_vm_readv(pid, &mut [std::io::IoSliceMut::new(buf)], &remote).unwrap_or(0)
}

/// The word at `addr`, if readable.
pub fn read_u64(pid: Pid, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    (read(pid, addr, &mut b) == 8).then(|| u64::from_le_bytes(b))
}

/// Writes `bytes` at `addr` of stopped thread `tid`'s process, also into
/// pages that are not writable (code), a word at a time.
pub fn poke(tid: Pid, addr: u64, bytes: &[u8]) -> Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        let at = addr + done as u64;
        let word = at & !7;
        let skip = (at - word) as usize;
        let n = (8 - skip).min(bytes.len() - done);
        let mut w = if skip == 0 && n == 8 {
            [0u8; 8]
        } else {
            let old = ptrace::read(tid, word as ptrace::AddressType)
                .map_err(|e| anyhow!("cannot read {word:#x} of {tid}: {e}"))?;
            old.to_le_bytes()
        };
        w[skip..skip + n].copy_from_slice(&bytes[done..done + n]);
        ptrace::write(tid, word as ptrace::AddressType, i64::from_le_bytes(w))
            .map_err(|e| anyhow!("cannot write {word:#x} of {tid}: {e}"))?;
        done += n;
    }
    Ok(())
}

/// Lets thread `tid`, stopped at the exec event, finish returning from
/// execve: the kernel writes execve's result into the registers after that
/// stop, over whatever the tracer put there (a system call made then
/// would lose its number). It runs to a breakpoint at its own ip.
pub fn settle(tid: Pid, signals: &mut Vec<nix::sys::signal::Signal>) -> Result<()> {
    let saved = regs(tid)?;
    let ip = saved.ip();
    let mut code = [0u8; 1];
    if read(tid, ip, &mut code) != 1 {
        bail!("cannot read the code at {ip:#x} of {tid}");
    }
    poke(tid, ip, &arch::BREAKPOINT)?;
    let done = run_to_trap(tid, signals);
    poke(tid, ip, &code)?;
    done?;
    let mut r = regs(tid)?;
    r.set_ip(ip);
    set_regs(tid, &r)
}

/// Continues `tid` until it traps (signals meanwhile put in `signals`).
fn run_to_trap(tid: Pid, signals: &mut Vec<nix::sys::signal::Signal>) -> Result<()> {
    ptrace::cont(tid, None)?;
    loop {
        let st = match waitpid(tid, Some(WaitPidFlag::__WALL)) {
            // The live streams' tick (live.rs).
            Err(nix::errno::Errno::EINTR) => continue,
            st => st?,
        };
        match st {
            WaitStatus::Stopped(_, nix::sys::signal::Signal::SIGTRAP) => return Ok(()),
            WaitStatus::Stopped(_, sig) => {
                signals.push(sig);
                ptrace::cont(tid, None)?
            }
            WaitStatus::PtraceEvent(..) => ptrace::cont(tid, None)?,
            s => bail!("{tid} ended while the tracer ran it: {s:?}"),
        }
    }
}

/// Makes system call `nr` with `args` in stopped thread `tid` (stopped at
/// a breakpoint or an event, not inside a system call) and returns its
/// result; the thread's registers and code are as before afterwards. A
/// signal that arrives meanwhile is put in `signals`, for the caller to
/// deliver when the thread goes on.
pub fn syscall(tid: Pid, nr: u64, args: [u64; 6], signals: &mut Vec<nix::sys::signal::Signal>) -> Result<u64> {
    let saved = regs(tid)?;
    let ip = saved.ip();
    let mut code = [0u8; arch::SYSCALL_TRAP.len()];
    if read(tid, ip, &mut code) != code.len() {
        bail!("cannot read the code at {ip:#x} of {tid}");
    }
    poke(tid, ip, &arch::SYSCALL_TRAP)?;
    set_regs(tid, &arch::syscall_regs(&saved, ip, nr, args))?;
    let result = run_to_trap(tid, signals).and_then(|()| Ok(regs(tid)?.result()));
    poke(tid, ip, &code)?;
    set_regs(tid, &saved)?;
    result
}

/// Where the stack words the call logic reads come from.
#[derive(Clone, Copy)]
pub enum Stack<'a> {
    /// The stopped thread's memory (a breakpoint stop).
    Live,
    /// The copy a uprobe took, from `base` (the stack pointer) up; nothing
    /// beyond it.
    Copy { base: u64, bytes: &'a [u8] },
}

impl Stack<'_> {
    /// The word at `addr` of process `pid`'s stack.
    pub fn read_u64(&self, pid: Pid, addr: u64) -> Option<u64> {
        match *self {
            Stack::Live => read_u64(pid, addr),
            Stack::Copy { base, bytes } => {
                let off = addr.checked_sub(base)? as usize;
                Some(u64::from_le_bytes(bytes.get(off..off.checked_add(8)?)?.try_into().ok()?))
            }
        }
    }
}
