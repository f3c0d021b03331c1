//! The per-thread reentrancy guard. While a thread is inside a hook, every
//! allocation it makes (the tracer's own, or the real function's calls back
//! into the hooks, such as libstdc++'s `operator new` calling `malloc`) is
//! forwarded untraced.

use std::cell::Cell;

thread_local! {
    // Const-initialised and without Drop: touching it never allocates or
    // registers a destructor, so it is safe in the very first malloc.
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Proof that this thread is inside a hook; leaving the scope leaves the hook
/// (also when a C++ exception unwinds through it).
pub struct Guard(());

impl Guard {
    /// Enters the hook, or `None` when this thread already is inside one.
    #[inline]
    pub fn enter() -> Option<Guard> {
        // Not `then_some(Guard(()))`: that would build (and drop, clearing
        // the flag) a Guard even when the thread is already inside a hook.
        IN_HOOK.with(|g| if g.replace(true) { None } else { Some(Guard(())) })
    }

    /// Marks the calling thread (the writer) as the tracer's for good.
    pub fn hold_forever() {
        IN_HOOK.with(|g| g.set(true));
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        IN_HOOK.with(|g| g.set(false));
    }
}
