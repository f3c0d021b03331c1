//! Holding the program's threads from outside them for the leak scan: the
//! side of the thread that takes the snapshot. It starts the helper task
//! (helper.rs) and waits until the helper holds every other thread; the
//! threads stay held until the [`Holding`] is dropped.
//!
//! The helper is made with `clone(CLONE_VM | CLONE_UNTRACED)`: it shares
//! the process's memory, not its descriptors (opening /proc in a shared
//! table could take a number a program thread is about to `dup2` onto), and
//! its exit signal is 0, so the program gets no SIGCHLD and its
//! `waitpid(-1, …)` never sees it (only `__WALL` or `__WCLONE` would).

use std::sync::atomic::Ordering;

use super::helper::{self, phase, state, TABLE};
use super::{Parked, RED_ZONE, REGS};
use crate::platform::sys;

/// The helper's stack, bytes (it keeps an 8 KiB listing buffer there),
/// above one guard page.
const STACK: usize = 256 * 1024;
const PAGE: usize = 4096;
/// How long the caller waits for the helper to hold the threads (it gives
/// up on a thread after a second itself), ms.
const ANSWER_MS: u64 = 10_000;

/// The threads the helper holds, until dropped.
pub struct Holding {
    pid: i32,
    stack: *mut u8,
    undo: Undo,
}

/// What was changed in the process for the helper, to put back.
struct Undo {
    /// The process was not dumpable (ptrace refuses a non-dumpable
    /// process to a tracer without CAP_SYS_PTRACE): made dumpable for the
    /// stop, as LeakSanitizer does.
    dumpable: bool,
    /// Yama (ptrace_scope 1) lets a process trace only its descendants:
    /// the helper was named this process's ptracer (PR_SET_PTRACER).
    ptracer: bool,
}

impl Undo {
    fn put_back(&self) {
        // SAFETY: prctl with numbers only.
        unsafe {
            if self.ptracer {
                libc::prctl(libc::PR_SET_PTRACER, 0, 0, 0, 0);
            }
            if self.dumpable {
                libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            }
        }
    }
}

impl Holding {
    /// The helper's stack, [low, high): the tracer's memory, never a root.
    pub fn stack(&self) -> (u64, u64) {
        (self.stack as u64, self.stack as u64 + (STACK + PAGE) as u64)
    }

    /// The held threads, with their registers.
    pub fn parked(&self) -> impl Iterator<Item = Parked> + '_ {
        let n = helper::COUNT.load(Ordering::Acquire);
        TABLE.iter().take(n).filter(|e| e.state.load(Ordering::Relaxed) == state::HELD).map(|e| {
            let mut regs = [0u64; REGS];
            for (r, v) in regs.iter_mut().zip(&e.regs) {
                *r = v.load(Ordering::Relaxed);
            }
            // The stack pointer is the 16th word; a leaf function's data
            // may lie in the red zone below it.
            Parked { tid: e.tid.load(Ordering::Relaxed), regs, len: REGS, live_from: regs[15].saturating_sub(RED_ZONE) }
        })
    }

    /// The threads the helper did not hold although they run: refused,
    /// too late to stop, or past its table.
    pub fn missed(&self, skip: &[i32]) -> Vec<i32> {
        let n = helper::COUNT.load(Ordering::Acquire);
        let listed = || TABLE.iter().take(n);
        let mut missed: Vec<i32> = listed()
            .filter(|e| matches!(e.state.load(Ordering::Relaxed), state::REFUSED | state::LATE | state::SEIZED))
            .map(|e| e.tid.load(Ordering::Relaxed))
            .collect();
        if helper::FULL.load(Ordering::Relaxed) {
            missed.extend(
                super::tasks()
                    .into_iter()
                    .filter(|t| !skip.contains(t) && !listed().any(|e| e.tid.load(Ordering::Relaxed) == *t)),
            );
        }
        missed
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        helper::set_phase(phase::RELEASE);
        reap(self.pid);
        self.undo.put_back();
        // SAFETY: the helper's stack, which nothing uses once it exited.
        unsafe { sys::unmap(self.stack, STACK + PAGE) };
    }
}

/// Waits for the helper `pid` to exit.
fn reap(pid: i32) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own clone child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r == pid || sys::errno() != libc::EINTR {
            return;
        }
    }
}

/// Field `name` of the `/proc/…/status` file at `path`.
fn status_field(path: &std::ffi::CStr, name: &str) -> Option<String> {
    let status = sys::read_file(path)?;
    super::status_field(&String::from_utf8_lossy(&status), name).map(str::to_owned)
}

/// Why the helper cannot be started here, before trying it.
pub fn precluded() -> Option<String> {
    if !cfg!(target_arch = "x86_64") {
        return Some("this architecture's registers are not read from outside yet".into());
    }
    // A seccomp filter may kill the process for a clone or a ptrace (a
    // sandbox's), or hand the call to the program's SIGSYS handler.
    if status_field(c"/proc/thread-self/status", "Seccomp:").is_some_and(|v| v != "0") {
        return Some("a seccomp filter is on".into());
    }
    if yama_scope() == Some(3) {
        return Some("Yama's ptrace_scope is 3".into());
    }
    None
}

/// Yama's ptrace_scope, where the module is on.
fn yama_scope() -> Option<u32> {
    let text = sys::read_file(c"/proc/sys/kernel/yama/ptrace_scope")?;
    String::from_utf8_lossy(&text).trim().parse().ok()
}

/// Holds every thread of the process but those in `skip` (at most two:
/// the calling thread and the writer), from outside them. An error says
/// why not (the caller then stops them by signal): nothing is held then.
pub fn hold(skip: &[i32]) -> Result<Holding, String> {
    helper::PID.store(sys::getpid() as i32, Ordering::Relaxed);
    for (s, &t) in helper::SKIP.iter().zip(skip.iter().chain(std::iter::repeat(&0))) {
        s.store(t, Ordering::Relaxed);
    }
    helper::COUNT.store(0, Ordering::Relaxed);
    helper::FULL.store(false, Ordering::Relaxed);
    helper::REFUSED_ERRNO.store(0, Ordering::Relaxed);
    helper::PHASE.store(phase::READY, Ordering::Release);
    let Some(stack) = sys::map_anon(STACK + PAGE) else { return Err("no memory for the helper's stack".into()) };
    // SAFETY: the guard page is the mapping's lowest, ours.
    unsafe { libc::mprotect(stack.cast(), PAGE, libc::PROT_NONE) };
    let mut undo = Undo { dumpable: false, ptracer: false };
    // SAFETY: prctl with numbers only.
    if unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) } == 0 {
        // SAFETY: as above.
        undo.dumpable = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) } == 0;
    }
    let pid = spawn(stack);
    if pid <= 0 {
        let err = std::io::Error::last_os_error();
        undo.put_back();
        // SAFETY: the stack mapped above, unused.
        unsafe { sys::unmap(stack, STACK + PAGE) };
        return Err(format!("cannot start the helper task: {err}"));
    }
    let yama = yama_scope();
    if yama == Some(1) {
        // SAFETY: prctl with numbers only.
        undo.ptracer = unsafe { libc::prctl(libc::PR_SET_PTRACER, pid as libc::c_ulong, 0, 0, 0) } == 0;
    }
    let holding = Holding { pid, stack, undo };
    helper::set_phase(phase::GO);
    let mut waited = 0u64;
    loop {
        match helper::PHASE.load(Ordering::Acquire) {
            phase::HELD => return Ok(holding),
            phase::REFUSED | phase::DONE => break,
            _ => {}
        }
        if waited >= ANSWER_MS || exited(pid) {
            // SAFETY: kill of our own helper (its tracees are let go).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        helper::futex_wait(phase::GO, 10);
        waited += 10;
    }
    let errno = helper::REFUSED_ERRNO.load(Ordering::Relaxed);
    drop(holding);
    Err(refusal(errno, yama))
}

/// Whether the helper `pid` has exited (then reaped).
fn exited(pid: i32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid on our own clone child.
    unsafe { libc::waitpid(pid, &mut status, libc::__WALL | libc::WNOHANG) == pid }
}

/// Starts the helper on `stack` with every signal blocked (it inherits
/// the mask: no signal handler of the program ever runs in it); its pid.
fn spawn(stack: *mut u8) -> i32 {
    sys::with_signals_blocked(|| {
        // SAFETY: clone gets the top of a fresh mapping as the stack and a
        // function that uses nothing but that stack, raw system calls and
        // static atomics.
        unsafe {
            let top = stack.add(STACK + PAGE).cast::<libc::c_void>();
            libc::clone(helper::run, top, libc::CLONE_VM | libc::CLONE_UNTRACED, std::ptr::null_mut())
        }
    })
}

/// Why ptrace refused (`errno`, under Yama's scope `yama`), for the report.
fn refusal(errno: i32, yama: Option<u32>) -> String {
    if errno == libc::EPERM {
        if status_field(c"/proc/self/status", "TracerPid:").is_some_and(|v| v != "0") {
            return "another tracer (a debugger, strace) holds the threads".into();
        }
        if let Some(scope) = yama.filter(|&s| s >= 1) {
            return format!("ptrace refused (Yama's ptrace_scope is {scope})");
        }
    }
    if errno == 0 {
        return "the helper task did not answer".into();
    }
    format!("ptrace refused ({})", std::io::Error::from_raw_os_error(errno))
}
