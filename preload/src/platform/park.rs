//! Where a thread parks while a stop by signal holds the program
//! (snapshot/stop/signal.rs): a place per stopped thread, in which it
//! leaves its registers and says it is parked, then waits (atomics and
//! nanosleep only) until the stop is over. The stopper fills and reads
//! the places; the thread parks from the stop signal's handler, or, if the
//! signal came inside a hook, as it leaves the hook (record/guard.rs), so
//! both reach it from here, below them.

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::platform::sys;

/// Words of registers kept per thread (x86_64: gregs R8 … RIP).
pub const REGS: usize = 17;
/// Threads a stop can hold at once.
pub const PLACES: usize = 1024;

struct Place {
    tid: AtomicI32,
    /// The stop's epoch once this thread is parked in it.
    parked: AtomicU64,
    /// Lowest live stack address (the stack pointer, minus the red zone
    /// when interrupted by the signal).
    live_from: AtomicU64,
    len: AtomicUsize,
    regs: [AtomicU64; REGS],
}

impl Place {
    const fn new() -> Place {
        Place {
            tid: AtomicI32::new(0),
            parked: AtomicU64::new(0),
            live_from: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            regs: [const { AtomicU64::new(0) }; REGS],
        }
    }
}

// Static, so that a thread answering late never reads freed memory.
static PLACE: [Place; PLACES] = [const { Place::new() }; PLACES];
/// Places in use by the current stop.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// The current stop's epoch; 0 when no stop is on.
static ACTIVE: AtomicU64 = AtomicU64::new(0);
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// A stop begins for threads `tids` (at most [`PLACES`], the first ones
/// taking places 0, 1, …): their epoch, and how many got a place.
pub fn open(tids: &[i32]) -> (u64, usize) {
    let epoch = EPOCH.fetch_add(1, Ordering::Relaxed) + 1;
    let n = tids.len().min(PLACES);
    for (place, &tid) in PLACE.iter().zip(&tids[..n]) {
        place.tid.store(tid, Ordering::Relaxed);
        place.parked.store(0, Ordering::Relaxed);
    }
    COUNT.store(n, Ordering::SeqCst);
    ACTIVE.store(epoch, Ordering::SeqCst);
    (epoch, n)
}

/// The stop is over: parked threads go on (also in a forked child, whose
/// only thread is not parked).
pub fn close() {
    ACTIVE.store(0, Ordering::SeqCst);
}

/// Whether a stop is on.
pub fn stop_on() -> bool {
    ACTIVE.load(Ordering::Acquire) != 0
}

/// Place `i` is no thread's (its signal could not be sent).
pub fn forget(i: usize) {
    PLACE[i].tid.store(0, Ordering::Relaxed);
}

/// The thread of place `i`.
pub fn tid(i: usize) -> i32 {
    PLACE[i].tid.load(Ordering::Relaxed)
}

/// Whether the thread of place `i` is parked in the stop of `epoch`.
pub fn is_parked(i: usize, epoch: u64) -> bool {
    PLACE[i].parked.load(Ordering::Acquire) == epoch
}

/// What the thread of place `i` left there: (thread id, registers, how
/// many of them, lowest live stack address).
pub fn left_at(i: usize) -> (i32, [u64; REGS], usize, u64) {
    let p = &PLACE[i];
    let mut regs = [0u64; REGS];
    for (r, v) in regs.iter_mut().zip(&p.regs) {
        *r = v.load(Ordering::Relaxed);
    }
    (p.tid.load(Ordering::Relaxed), regs, p.len.load(Ordering::Relaxed), p.live_from.load(Ordering::Relaxed))
}

/// Parks the calling thread, which is leaving a hook, if a stop is on.
/// `returning` is the block the hook is about to return (0 for none): the
/// program does not hold it anywhere yet, so it is a root of its own.
pub fn park_here(returning: u64) {
    if !stop_on() {
        return;
    }
    // The hook's own frames stay roots: they hold the program's
    // callee-saved registers that the hook saved. Finding the program's
    // frame with libgcc's unwinder here (as for exit) made a parked thread
    // miss the stop's one-second deadline under load (docs/SCAN.md).
    let at = own_registers();
    let mut regs = [0u64; 8];
    regs[..7].copy_from_slice(&at);
    regs[7] = returning;
    park(&regs, at[6]);
}

/// Saves `regs` in this thread's place and waits until the stop is over.
pub fn park(regs: &[u64], live_from: u64) {
    let epoch = ACTIVE.load(Ordering::Acquire);
    let tid = sys::gettid() as i32;
    let n = COUNT.load(Ordering::Acquire);
    let Some(place) = PLACE[..n].iter().find(|s| s.tid.load(Ordering::Relaxed) == tid) else { return };
    for (s, &r) in place.regs.iter().zip(regs) {
        s.store(r, Ordering::Relaxed);
    }
    place.len.store(regs.len().min(REGS), Ordering::Relaxed);
    place.live_from.store(live_from, Ordering::Relaxed);
    place.parked.store(epoch, Ordering::Release);
    while ACTIVE.load(Ordering::Acquire) == epoch {
        sys::sleep_us(50);
    }
}

/// Callee-saved registers and the stack pointer (last) of the calling
/// thread: at a call, every other register's live value is on the stack.
#[cfg(target_arch = "x86_64")]
pub fn own_registers() -> [u64; 7] {
    let (rbx, rbp, r12, r13, r14, r15, rsp): (u64, u64, u64, u64, u64, u64, u64);
    // SAFETY: copies registers; no memory access.
    unsafe {
        std::arch::asm!("mov {0}, rbx", "mov {1}, rbp", "mov {2}, r12", "mov {3}, r13", "mov {4}, r14",
            "mov {5}, r15", "mov {6}, rsp",
            out(reg) rbx, out(reg) rbp, out(reg) r12, out(reg) r13, out(reg) r14, out(reg) r15, out(reg) rsp,
            options(nomem, nostack, preserves_flags));
    }
    [rbx, rbp, r12, r13, r14, r15, rsp]
}

/// Elsewhere: no registers, and the address of a local as the stack pointer.
#[cfg(not(target_arch = "x86_64"))]
pub fn own_registers() -> [u64; 7] {
    let here = 0u64;
    [0, 0, 0, 0, 0, 0, std::hint::black_box(&here) as *const u64 as u64]
}
