//! Stopping the program's other threads by a signal: the fallback where
//! ptrace is refused (docs/SCAN.md). Each thread gets [`stop_signal`] by
//! tgkill; the handler copies the interrupted registers from the signal's
//! ucontext into the thread's place (platform/park.rs), reports itself
//! parked and waits (atomics and nanosleep only) until the scan lets
//! everybody go. A thread
//! that is inside a hook when the signal arrives may hold a lock the scan
//! needs (the real malloc's, its buffer's), so it parks when it leaves the
//! hook instead (record/slot.rs `defer_park`, record/guard.rs), with the
//! registers of that point.
//!
//! What it costs the program: a system call the handler interrupts that is
//! not restarted after a handler (sleeps, poll, select, epoll_wait, futex
//! waits with a timeout, …) returns EINTR. Threads that block the signal
//! for more than [`BLOCKED_WAIT_US`], do not answer within a second, or
//! exceed [`park::PLACES`] are "missed": the scan reads their stacks whole.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{tasks, Parked, RED_ZONE, REGS};
use crate::platform::park;
use crate::platform::sys;

/// How long a thread that blocked the stop signal when it was sent gets to
/// take it, µs (the others get a second).
const BLOCKED_WAIT_US: u32 = 100_000;

static WARNED: AtomicBool = AtomicBool::new(false);

/// The signal that stops threads: SIGRTMAX-1, which glibc does not use.
pub fn stop_signal() -> i32 {
    libc::SIGRTMAX() - 1
}

/// The threads parked by [`stop`], until this is dropped.
pub struct Parking {
    /// Places of the parked threads.
    places: Vec<usize>,
}

impl Parking {
    /// The parked threads, read from their places.
    pub fn parked(&self) -> impl Iterator<Item = Parked> + '_ {
        self.places.iter().map(|&i| {
            let (tid, regs, len, live_from) = park::left_at(i);
            Parked { tid, regs, len, live_from }
        })
    }
}

impl Drop for Parking {
    fn drop(&mut self) {
        park::close();
    }
}

/// Stops every thread of the process except those in `skip` by the
/// stop signal; also the threads it could not stop.
pub fn stop(skip: &[i32]) -> (Parking, Vec<i32>) {
    let tids: Vec<i32> = tasks().into_iter().filter(|t| !skip.contains(t)).collect();
    if tids.is_empty() || !install() {
        return (Parking { places: Vec::new() }, tids);
    }
    let sig = stop_signal();
    let (epoch, n) = park::open(&tids);
    let mut missed: Vec<i32> = tids[n..].to_vec();
    // (place, blocked when sent): a thread that blocks the signal now may
    // unblock it soon (pthread_create blocks every signal around clone),
    // and then takes it: it gets BLOCKED_WAIT_US. A signal still pending
    // after the stop is harmless (the handler sees no stop on).
    let mut waiting = Vec::with_capacity(n);
    for (i, &tid) in tids[..n].iter().enumerate() {
        let blocked = blocks(tid, sig);
        if tgkill(tid, sig) {
            waiting.push((i, blocked));
        } else {
            park::forget(i);
            missed.push(tid);
        }
    }
    for round in 0..10_000u32 {
        let waited_us = round * 100;
        if waiting.iter().all(|&(i, blocked)| park::is_parked(i, epoch) || (blocked && waited_us >= BLOCKED_WAIT_US)) {
            break;
        }
        sys::sleep_us(100);
    }
    let (places, late): (Vec<usize>, Vec<usize>) =
        waiting.into_iter().map(|(i, _)| i).partition(|&i| park::is_parked(i, epoch));
    missed.extend(late.iter().map(|&i| park::tid(i)));
    (Parking { places }, missed)
}

/// Whether thread `tid` blocks `sig` (its SigBlk in /proc).
fn blocks(tid: i32, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")) else { return true };
    let mask = super::status_field(&status, "SigBlk:");
    mask.and_then(|m| u64::from_str_radix(m, 16).ok()).is_none_or(|m| m & (1u64 << (sig - 1)) != 0)
}

fn tgkill(tid: i32, sig: i32) -> bool {
    // SAFETY: tgkill sends a signal to a thread of this process.
    unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, sig) == 0 }
}

/// Installs the stop signal's handler, unless the program has its own.
fn install() -> bool {
    let sig = stop_signal();
    let ours = on_stop_signal as extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) as usize;
    // SAFETY: sigaction with valid pointers; replaces only SIG_DFL/SIG_IGN.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            return false;
        }
        if old.sa_sigaction == ours {
            return true;
        }
        if old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN {
            if !WARNED.swap(true, Ordering::Relaxed) {
                sys::warn("the program handles SIGRTMAX-1: the leak scan cannot stop its threads");
            }
            return false;
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ours;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        // Nothing else runs on a parked thread.
        libc::sigfillset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0
    }
}

extern "C" fn on_stop_signal(_: i32, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if !park::stop_on() {
        return;
    }
    let errno = sys::errno();
    if !crate::record::slot::defer_park() {
        let (regs, live_from) = interrupted(ctx);
        park::park(&regs, live_from);
    }
    sys::set_errno(errno);
}

/// In a signal handler that will not return to the code it interrupted
/// (a fatal signal's, waiting for another thread's flush): parks the
/// calling thread if a stop is on, with the interrupted registers, even
/// inside a hook (the hook never resumes, so the locks it may hold are no
/// reason to wait for its end).
pub fn park_in_signal(ctx: *mut libc::c_void) {
    if park::stop_on() {
        let (regs, live_from) = interrupted(ctx);
        park::park(&regs, live_from);
    }
}

/// The interrupted registers in a signal's ucontext, and the lowest live
/// stack address: the stack pointer minus the red zone.
pub fn interrupted(ctx: *mut libc::c_void) -> ([u64; REGS], u64) {
    let (regs, sp) = interrupted_regs(ctx);
    (regs, sp.saturating_sub(RED_ZONE))
}

/// The instruction pointer among registers [`interrupted`] read; `None`
/// where they are not a signal's (other architectures).
pub fn interrupted_pc(regs: &[u64; REGS]) -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    return Some(regs[libc::REG_RIP as usize]);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = regs;
        None
    }
}

/// The interrupted registers in a signal's ucontext, and the stack pointer.
#[cfg(target_arch = "x86_64")]
fn interrupted_regs(ctx: *mut libc::c_void) -> ([u64; REGS], u64) {
    let mut regs = [0u64; REGS];
    // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO handler.
    let g = unsafe { &(*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    for (r, v) in regs.iter_mut().zip(g.iter()) {
        *r = *v as u64;
    }
    (regs, g[libc::REG_RSP as usize] as u64)
}

/// Elsewhere: no registers; the handler's own frame bounds the stack.
#[cfg(not(target_arch = "x86_64"))]
fn interrupted_regs(_: *mut libc::c_void) -> ([u64; REGS], u64) {
    let regs = park::own_registers();
    let mut out = [0u64; REGS];
    out[..regs.len()].copy_from_slice(&regs);
    (out, regs[regs.len() - 1])
}

/// In a forked child: no stop is on (the child's only thread is not parked).
pub fn reset_in_child() {
    park::close();
}
