//! Calling functions inside another process with ptrace: the way
//! `mtrace attach` makes a running program `dlopen` libmtrace.so.
//!
//! Every thread is seized (`PTRACE_SEIZE`) and interrupted
//! (`PTRACE_INTERRUPT`) so that one can be chosen that holds no lock the
//! calls need (the allocator's, the loader's): a thread blocked in a system
//! call that glibc never makes with such a lock held (read, poll, accept,
//! sleeps …), else one running the program's own code (outside libc and
//! the loader). The others run on meanwhile, so that a lock one of them
//! holds is released as it would be. On the chosen thread: its general
//! and extended (x87/SSE/AVX) registers are saved, the arguments written
//! below its stack's red zone, and it is made to call the function with a
//! return address of 0, so that it stops with SIGSEGV at address 0 when the
//! function returns (the signal is not delivered). Afterwards its
//! registers are put back exactly; a system call it was interrupted in is
//! restarted by the kernel as after any signal (that is why `orig_rax` is
//! -1 while the function runs: no restart into the injected code), but
//! for one the kernel would restart from the thread's restart block (a
//! poll, a sleep), which the calls may have replaced: it is made again
//! from its own arguments ([`resumed`]). A call that the interrupt made
//! fail with EINTR (epoll_wait, sigtimedwait …), on any thread, is set to
//! be made again at the stop ([`crate::target::at_stop`]).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// `NT_X86_XSTATE` (linux/elf.h): the extended register state.
const NT_X86_XSTATE: i32 = 0x202;
/// Bytes kept of the extended state (its size is at most a few KiB).
const XSTATE_MAX: usize = 16 << 10;
/// How long an injected call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// System calls in which a thread holds none of glibc's internal locks.
const SAFE_SYSCALLS: &[i64] = &[
    libc::SYS_read,
    libc::SYS_readv,
    libc::SYS_pread64,
    libc::SYS_write,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_pause,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_rt_sigsuspend,
    libc::SYS_rt_sigtimedwait,
];

/// A process whose threads are seized.
pub struct Tracee {
    pid: i32,
    /// Seized threads.
    tids: Vec<i32>,
    /// The thread the calls run on, and its registers as found.
    victim: Option<(i32, libc::user_regs_struct, Vec<u8>)>,
    /// Threads [`Tracee::hold_others`] stopped, with the signal each
    /// stopped for instead (delivered when they go on).
    held: Vec<(i32, Option<Signal>)>,
    /// The calls leave the chosen thread's restart block as they found
    /// it ([`Tracee::keep_restart_block`]).
    restart_block_kept: bool,
    /// This process is the tracee's parent: its end is left for the
    /// thread that waits for it (`wait_stop`).
    parent: bool,
}

/// Text ranges of libc and the loader, where a stopped thread may hold a lock.
pub type Ranges = Vec<(u64, u64)>;

fn tasks(pid: i32) -> Result<Vec<i32>> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| anyhow!("process {pid}: {e}"))?;
    Ok(dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
}

/// Waits for a stop of `tid` (ptrace-stop), up to `limit`. At an
/// interrupt's stop, a system call the interrupt made fail with EINTR is
/// set to be made again ([`crate::target::at_stop`]): every thread the
/// attach stops goes on as it was. With `leave_exits` (the caller is the
/// process's parent, `mtrace server`), its end is left for the thread
/// that waits for the program: a wait here would take its exit status.
fn wait_stop(tid: i32, limit: Duration, leave_exits: bool) -> Result<WaitStatus> {
    let start = Instant::now();
    let any = WaitPidFlag::__WALL | WaitPidFlag::WNOHANG;
    loop {
        if leave_exits {
            let peek = any | WaitPidFlag::WEXITED | WaitPidFlag::WSTOPPED | WaitPidFlag::WNOWAIT;
            if let Ok(s @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) =
                waitid(Id::Pid(Pid::from_raw(tid)), peek)
            {
                bail!("thread {tid} ended ({s:?})");
            }
        }
        match waitpid(Pid::from_raw(tid), Some(any)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(s @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => bail!("thread {tid} ended ({s:?})"),
            Ok(s) => {
                crate::target::at_stop(&s);
                return Ok(s);
            }
            Err(e) => bail!("waiting for thread {tid}: {e}"),
        }
        if start.elapsed() > limit {
            bail!("thread {tid} did not stop within {limit:?}");
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

impl Tracee {
    /// Seizes every thread of `pid`. Fails (touching nothing) when the
    /// first cannot be seized: no such process, or no permission.
    pub fn seize(pid: i32) -> Result<Tracee> {
        let parent = std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|st| {
            st.lines().find_map(|l| l.strip_prefix("PPid:")).is_some_and(|p| p.trim() == std::process::id().to_string())
        });
        let mut t = Tracee { pid, tids: Vec::new(), victim: None, held: Vec::new(), restart_block_kept: false, parent };
        for tid in tasks(pid)? {
            match ptrace::seize(Pid::from_raw(tid), ptrace::Options::empty()) {
                Ok(()) => t.tids.push(tid),
                Err(nix::errno::Errno::EPERM) if t.tids.is_empty() => bail!(
                    "not permitted to trace process {pid} (EPERM: another tracer, a different user, or \
                     kernel.yama.ptrace_scope; run as the process's user or root)"
                ),
                Err(nix::errno::Errno::ESRCH) => {} // the thread ended
                Err(e) if t.tids.is_empty() => bail!("cannot trace process {pid}: {e}"),
                Err(_) => {}
            }
        }
        if t.tids.is_empty() {
            bail!("process {pid} has no thread left to trace");
        }
        Ok(t)
    }

    /// Interrupts the seized threads and picks one to run the calls on
    /// (see the module's comment), retrying for up to 2 s while every
    /// thread is busy inside libc or the loader (`busy`).
    pub fn choose(&mut self, busy: &Ranges) -> Result<()> {
        self.choose_among(busy, &[])
    }

    /// [`Tracee::choose`], a thread stopped in one of the system calls
    /// `also_safe` taken too (in a process with one thread, a futex wait
    /// is no wait for a lock another thread of it holds).
    pub fn choose_among(&mut self, busy: &Ranges, also_safe: &[i64]) -> Result<()> {
        let start = Instant::now();
        loop {
            let mut stopped = Vec::new();
            let mut pick = None;
            for &tid in &self.tids {
                if ptrace::interrupt(Pid::from_raw(tid)).is_err()
                    || wait_stop(tid, Duration::from_secs(2), self.parent).is_err()
                {
                    continue;
                }
                stopped.push(tid);
                let Ok(regs) = ptrace::getregs(Pid::from_raw(tid)) else { continue };
                let in_syscall = regs.orig_rax as i64 >= 0;
                let safe = if in_syscall {
                    SAFE_SYSCALLS.contains(&(regs.orig_rax as i64)) || also_safe.contains(&(regs.orig_rax as i64))
                } else {
                    !busy.iter().any(|&(a, b)| (a..b).contains(&regs.rip))
                };
                // The main thread first: servers wait there.
                if safe && (pick.is_none() || tid == self.pid) {
                    pick = Some((tid, regs));
                }
            }
            if let Some((tid, regs)) = pick {
                let xstate = get_xstate(tid)?;
                for &o in stopped.iter().filter(|&&o| o != tid) {
                    let _ = ptrace::cont(Pid::from_raw(o), None);
                }
                self.victim = Some((tid, regs, xstate));
                return Ok(());
            }
            for &o in &stopped {
                let _ = ptrace::cont(Pid::from_raw(o), None);
            }
            if start.elapsed() > Duration::from_secs(2) {
                bail!("every thread of process {} stayed busy inside libc or the loader for 2 s", self.pid);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Calls `func(args…)` (at most 6 integer arguments) on the chosen
    /// thread, after writing `data` below its stack; `data`'s address in
    /// the process is given to `args` (`args(data_addr)`). Returns `rax`.
    pub fn call(&mut self, func: u64, data: &[u8], args: impl FnOnce(u64) -> Vec<u64>) -> Result<u64> {
        Ok(self.call_out(func, data, args)?.0)
    }

    /// [`Tracee::call`], and `data`'s bytes after the call (what the
    /// function wrote there: a `socketpair`'s two descriptors). The
    /// function's own stack frames lie below `data`.
    pub fn call_out(&mut self, func: u64, data: &[u8], args: impl FnOnce(u64) -> Vec<u64>) -> Result<(u64, Vec<u8>)> {
        let (tid, saved, _) = self.victim.as_ref().ok_or_else(|| anyhow!("no thread chosen"))?;
        let (tid, mut regs) = (*tid, *saved);
        // Below the red zone (128 bytes, System V x86-64 ABI 3.2.2).
        let data_at = (saved.rsp - 256 - data.len() as u64) & !15;
        write_mem(tid, data_at, data)?;
        let rsp = data_at - 8;
        write_mem(tid, rsp, &0u64.to_le_bytes())?;
        let a = args(data_at);
        let slots = [&mut regs.rdi, &mut regs.rsi, &mut regs.rdx, &mut regs.rcx, &mut regs.r8, &mut regs.r9];
        for (slot, v) in slots.into_iter().zip(a) {
            *slot = v;
        }
        regs.rip = func;
        regs.rsp = rsp;
        regs.rax = 0;
        regs.orig_rax = u64::MAX;
        let p = Pid::from_raw(tid);
        ptrace::setregs(p, regs)?;
        ptrace::cont(p, None)?;
        let start = Instant::now();
        loop {
            let st = wait_stop(tid, CALL_TIMEOUT.saturating_sub(start.elapsed()), self.parent)?;
            match st {
                WaitStatus::Stopped(_, Signal::SIGSEGV) => {
                    let r = ptrace::getregs(p)?;
                    if r.rip != 0 {
                        bail!("the call at {func:#x} crashed at {:#x} in process {}", r.rip, self.pid);
                    }
                    return Ok((r.rax, read_mem(tid, data_at, data.len())?));
                }
                // Another signal meanwhile: delivered as it would have been.
                WaitStatus::Stopped(_, sig) => ptrace::cont(p, Some(sig))?,
                _ => ptrace::cont(p, None)?,
            }
        }
    }

    /// Stops every thread but the chosen one, those started since the
    /// seizure too, until [`Tracee::resume_others`]: for a call that
    /// rewrites code they may run. Returns where each was (its instruction
    /// pointer; the chosen thread's as found), `u64::MAX` for a thread that
    /// did not stop (its place is unknown).
    pub fn hold_others(&mut self) -> Result<Vec<u64>> {
        let (victim, regs, _) = self.victim.as_ref().ok_or_else(|| anyhow!("no thread chosen"))?;
        let (victim, mut ips) = (*victim, vec![regs.rip]);
        // A thread is started only by a running one: once every thread
        // listed is stopped, the list is whole.
        loop {
            let new: Vec<i32> = tasks(self.pid)?
                .into_iter()
                .filter(|t| {
                    !self.tids.contains(t) && ptrace::seize(Pid::from_raw(*t), ptrace::Options::empty()).is_ok()
                })
                .collect();
            for &tid in new.iter().chain(&self.tids).filter(|&&t| t != victim) {
                if self.held.iter().any(|&(h, _)| h == tid) {
                    continue;
                }
                let p = Pid::from_raw(tid);
                let stop =
                    ptrace::interrupt(p).ok().and_then(|()| wait_stop(tid, Duration::from_secs(2), self.parent).ok());
                let sig = match stop {
                    Some(WaitStatus::Stopped(_, s)) => Some(s),
                    Some(_) => None,
                    None => {
                        ips.push(u64::MAX);
                        continue;
                    }
                };
                self.held.push((tid, sig));
                ips.push(ptrace::getregs(p).map_or(u64::MAX, |r| r.rip));
            }
            let done = new.is_empty();
            self.tids.extend(new);
            if done {
                return Ok(ips);
            }
        }
    }

    /// Lets the threads [`Tracee::hold_others`] stopped go on.
    pub fn resume_others(&mut self) {
        for (tid, sig) in self.held.drain(..) {
            let _ = ptrace::cont(Pid::from_raw(tid), sig);
        }
    }

    /// The functions this tracee is made to call make no call that
    /// replaces the chosen thread's restart block (libmtrace.so's own:
    /// crate::library_call): a call it was stopped in that the kernel
    /// restarts from that block (a poll or a sleep with a timeout) goes on
    /// from it at the release, for the time it had left, as after any
    /// stop ([`resumed`] makes it again from its arguments otherwise).
    pub fn keep_restart_block(&mut self) {
        self.restart_block_kept = true;
    }

    /// The registers the chosen thread, stopped with `saved`, goes on with.
    fn going_on(&self, saved: libc::user_regs_struct) -> libc::user_regs_struct {
        if self.restart_block_kept {
            saved
        } else {
            resumed(saved)
        }
    }

    /// Reads a NUL-terminated string at `addr` (up to 4 KiB).
    pub fn read_string(&self, addr: u64) -> String {
        let Some((tid, ..)) = &self.victim else { return String::new() };
        let mut out = Vec::new();
        for i in 0..512u64 {
            let Ok(w) = ptrace::read(Pid::from_raw(*tid), (addr + 8 * i) as ptrace::AddressType) else { break };
            let bytes = w.to_le_bytes();
            if let Some(n) = bytes.iter().position(|&b| b == 0) {
                out.extend_from_slice(&bytes[..n]);
                break;
            }
            out.extend_from_slice(&bytes);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Puts the chosen thread's registers back and lets every thread go.
    pub fn release(mut self) -> Result<()> {
        let mut res = Ok(());
        let victim = self.victim.take().map(|(tid, regs, xstate)| {
            let p = Pid::from_raw(tid);
            res = set_xstate(tid, &xstate).and_then(|_| Ok(ptrace::setregs(p, self.going_on(regs))?));
            tid
        });
        for &tid in &self.tids {
            detach_running(tid, Some(tid) == victim, self.parent);
        }
        self.tids.clear();
        res
    }
}

/// Detaches thread `tid`, stopping it first unless it is `stopped`
/// (PTRACE_DETACH works only on a stopped tracee: the threads `choose`
/// let run stayed traced by `mtrace attach` until it exited, so the leak
/// scan's own ptrace stop was refused for them). A signal that stops it
/// meanwhile is delivered at the detach.
fn detach_running(tid: i32, stopped: bool, parent: bool) {
    let p = Pid::from_raw(tid);
    let mut sig = None;
    if !stopped {
        if ptrace::interrupt(p).is_err() {
            return;
        }
        match wait_stop(tid, Duration::from_secs(2), parent) {
            Ok(WaitStatus::Stopped(_, s)) => sig = Some(s),
            Ok(_) => {}
            // Ended, or never stopped: it is let go when this process exits.
            Err(_) => return,
        }
    }
    let _ = ptrace::detach(p, sig);
}

impl Drop for Tracee {
    fn drop(&mut self) {
        let victim = self.victim.take().map(|(tid, regs, xstate)| {
            let _ = set_xstate(tid, &xstate);
            let _ = ptrace::setregs(Pid::from_raw(tid), self.going_on(regs));
            tid
        });
        for &tid in &self.tids {
            detach_running(tid, Some(tid) == victim, self.parent);
        }
    }
}

/// The registers a thread found stopped with `saved` goes on with
/// once the calls made on it are done.
///
/// A system call stopped with `-ERESTART_RESTARTBLOCK` (poll with a
/// timeout, nanosleep, clock_nanosleep, a futex wait with a timeout) is
/// restarted by the kernel from the thread's restart block, which the
/// calls made meanwhile may have replaced: nanosleep sets it to "no
/// restart" on entry (kernel/time/hrtimer.c), so the program's poll
/// failed with EINTR after an attach whose library slept once (CI saw
/// ctests/own_malloc.c end so). Such a call is given `-ERESTARTNOHAND`
/// instead: the kernel makes it again from its own arguments, which it
/// left in their registers (and fails it with EINTR should a signal with a
/// handler come, as the restart block's way does) — a sleep from the time
/// left that the kernel wrote to its `rem` argument (from the start where
/// there is none), an absolute wait as it was, a poll or a relative futex
/// wait with its whole timeout again (longer by what it had waited: never
/// an error). Registers of any other stop are `saved` (a call the
/// interrupt made fail with EINTR was set to go on at the stop:
/// [`crate::target::at_stop`]).
fn resumed(saved: libc::user_regs_struct) -> libc::user_regs_struct {
    use mtrace_format::interrupted::{ERESTARTNOHAND, ERESTART_RESTARTBLOCK};
    let mut r = saved;
    let nr = r.orig_rax as i64;
    if nr < 0 || r.rax as i64 != ERESTART_RESTARTBLOCK || nr == libc::SYS_restart_syscall {
        // (A restart itself interrupted has no arguments left to make it
        // again from: the kernel's way, as before.)
        return r;
    }
    match nr {
        libc::SYS_nanosleep if r.rsi != 0 => r.rdi = r.rsi,
        libc::SYS_clock_nanosleep if r.rsi & libc::TIMER_ABSTIME as u64 == 0 && r.r10 != 0 => r.rdx = r.r10,
        _ => {}
    }
    r.rax = ERESTARTNOHAND as u64;
    r
}

fn write_mem(tid: i32, addr: u64, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(format!("/proc/{tid}/mem"))?;
    f.write_all_at(data, addr).map_err(|e| anyhow!("writing the memory of thread {tid}: {e}"))
}

fn read_mem(tid: i32, addr: u64, len: usize) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{tid}/mem"))?;
    let mut out = vec![0u8; len];
    f.read_exact_at(&mut out, addr).map_err(|e| anyhow!("reading the memory of thread {tid}: {e}"))?;
    Ok(out)
}

fn get_xstate(tid: i32) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; XSTATE_MAX];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: iov describes `buf`; the kernel writes at most iov_len bytes
    // and sets iov_len to what it wrote.
    let rc = unsafe { libc::ptrace(libc::PTRACE_GETREGSET, tid, NT_X86_XSTATE as usize, &mut iov) };
    if rc < 0 {
        bail!("reading the registers of thread {tid}: {}", std::io::Error::last_os_error());
    }
    buf.truncate(iov.iov_len);
    Ok(buf)
}

fn set_xstate(tid: i32, state: &[u8]) -> Result<()> {
    let mut copy = state.to_vec();
    let mut iov = libc::iovec { iov_base: copy.as_mut_ptr().cast(), iov_len: copy.len() };
    // SAFETY: iov describes `copy`, as GETREGSET filled it.
    let rc = unsafe { libc::ptrace(libc::PTRACE_SETREGSET, tid, NT_X86_XSTATE as usize, &mut iov) };
    if rc < 0 {
        bail!("restoring the registers of thread {tid}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registers of a thread stopped in system call `nr` with `rax`.
    fn stopped_in(nr: i64, rax: i64) -> libc::user_regs_struct {
        // SAFETY: user_regs_struct is plain integers; all zero is valid.
        let mut r: libc::user_regs_struct = unsafe { std::mem::zeroed() };
        (r.orig_rax, r.rax, r.rip) = (nr as u64, rax as u64, 0x1002);
        (r.rdi, r.rsi, r.rdx, r.r10) = (0xa0, 0xb0, 0xc0, 0xd0);
        r
    }

    #[test]
    fn a_call_the_kernel_restarts_from_its_restart_block_is_made_again() {
        use mtrace_format::interrupted::{ERESTARTNOHAND, ERESTART_RESTARTBLOCK};
        let again = |r: libc::user_regs_struct| (r.rax as i64, r.rip, r.orig_rax as i64, r.rdi, r.rdx);
        // poll: again with its arguments as they were (the kernel moves
        // back to its `syscall` instruction).
        let r = resumed(stopped_in(libc::SYS_poll, ERESTART_RESTARTBLOCK));
        assert_eq!(again(r), (ERESTARTNOHAND, 0x1002, libc::SYS_poll, 0xa0, 0xc0));
        // nanosleep(req, rem): for the time left, which the kernel put in rem.
        let r = resumed(stopped_in(libc::SYS_nanosleep, ERESTART_RESTARTBLOCK));
        assert_eq!(again(r), (ERESTARTNOHAND, 0x1002, libc::SYS_nanosleep, 0xb0, 0xc0));
        // clock_nanosleep(clock, 0, req, rem): the same; absolute: as it was.
        let r = resumed(stopped_in(libc::SYS_clock_nanosleep, ERESTART_RESTARTBLOCK));
        assert_eq!(again(r), (ERESTARTNOHAND, 0x1002, libc::SYS_clock_nanosleep, 0xa0, 0xd0));
        let mut abs = stopped_in(libc::SYS_clock_nanosleep, ERESTART_RESTARTBLOCK);
        abs.rsi = libc::TIMER_ABSTIME as u64;
        assert_eq!(again(resumed(abs)), (ERESTARTNOHAND, 0x1002, libc::SYS_clock_nanosleep, 0xa0, 0xc0));
        // Other stops as they were: a read the kernel restarts by itself
        // (-ERESTARTSYS), a restart interrupted, code outside a system
        // call, an epoll_wait set to go on at its stop.
        for r in [
            stopped_in(libc::SYS_read, -512),
            stopped_in(libc::SYS_restart_syscall, ERESTART_RESTARTBLOCK),
            stopped_in(-1, 5),
            stopped_in(libc::SYS_epoll_wait, ERESTARTNOHAND),
        ] {
            assert_eq!(again(resumed(r)), again(r));
        }
    }
}
