//! The per-thread reentrancy guard. While a thread is inside a hook, every
//! allocation it makes (the tracer's own, or the real function's calls back
//! into the hooks, such as libstdc++'s `operator new` calling `malloc`) is
//! forwarded untraced.
//!
//! The guard also tells the leak scan's stop signal (stop.rs) that the
//! thread may hold a lock the scan needs (the real malloc's, a buffer's):
//! such a thread is parked when it leaves the hook instead.

use std::cell::Cell;

/// Bit of [`STATE`]: the thread is inside a hook.
const IN_HOOK: u8 = 1;
/// Bit of [`STATE`]: a stop signal arrived inside the hook; park on leaving.
const PARK_PENDING: u8 = 2;

thread_local! {
    // Const-initialised and without Drop: touching it never allocates or
    // registers a destructor, so it is safe in the very first malloc.
    static STATE: Cell<u8> = const { Cell::new(0) };
}

/// Proof that this thread is inside a hook; leaving the scope leaves the hook
/// (also when a C++ exception unwinds through it).
pub struct Guard(());

impl Guard {
    /// Enters the hook, or `None` when this thread already is inside one.
    #[inline]
    pub fn enter() -> Option<Guard> {
        STATE.with(|g| {
            if g.get() & IN_HOOK != 0 {
                None
            } else {
                g.set(IN_HOOK);
                Some(Guard(()))
            }
        })
    }

    /// Marks the calling thread (the writer) as the tracer's for good.
    pub fn hold_forever() {
        STATE.with(|g| g.set(IN_HOOK));
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        if STATE.with(|g| g.replace(0)) & PARK_PENDING != 0 {
            crate::stop::park_here();
        }
    }
}

/// Leaves a hook entered with a guard that was forgotten (fork.rs holds
/// the guard from the fork's prepare handler to its parent handler).
pub fn leave_held() {
    drop(Guard(()));
}

/// From the stop signal's handler: true when the thread is inside a hook,
/// in which case it parks when it leaves the hook.
pub fn defer_park() -> bool {
    STATE.with(|g| {
        let v = g.get();
        if v & IN_HOOK != 0 {
            g.set(v | PARK_PENDING);
        }
        v & IN_HOOK != 0
    })
}

/// In a forked child: the only thread left is not inside a hook of the
/// parent's, and no stop is pending.
pub fn reset_in_child() {
    STATE.with(|g| g.set(0));
}
