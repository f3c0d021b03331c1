//! A spin lock for the tracer's few short critical sections that a hook
//! may enter: not a parking_lot mutex, whose contended path allocates (its
//! table of parked threads) and would re-enter the hooks or the tracer's
//! heap. A waiter spins, then yields to a holder that was preempted.

use std::sync::atomic::{AtomicBool, Ordering};

/// The lock; `lock` and `unlock` in pairs, by the same thread (nothing
/// checks it: a section that panics never unlocks, and none here can).
pub struct SpinLock {
    locked: AtomicBool,
}

impl SpinLock {
    /// An unlocked lock.
    pub const fn new() -> SpinLock {
        SpinLock { locked: AtomicBool::new(false) }
    }

    /// Takes the lock, spinning 100 times and then yielding the CPU until
    /// it is free.
    pub fn lock(&self) {
        let mut spins = 0u32;
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }

    /// Takes the lock if it is free; whether it did.
    pub fn try_lock(&self) -> bool {
        self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Releases the lock.
    pub fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// Whether some thread holds it now.
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Acquire)
    }
}
