//! fork: the child of a traced process is traced into a file of its own
//! (or not at all with `MTRACE_FOLLOW_FORK=off`); no write may be half
//! done when the process is copied. Registered with pthread_atfork.

use std::cell::Cell;

use crate::platform::static_tls::FastLocal;

use crate::record::guard::{self, Guard};
use crate::record::slot;
use crate::stream::{self, current};

thread_local! {
    /// The forking thread entered the hook guard in `before_fork`: it holds
    /// the tracer's locks until the fork is done, and a leak scan's stop
    /// must not park it there.
    static HELD_KEY: Cell<bool> = const { Cell::new(false) };
}
static HELD: FastLocal<Cell<bool>> = FastLocal::new(&HELD_KEY);

/// Lets the fork handlers reach this module's thread-local from the
/// thread pointer (platform/static_tls.rs): from the library's constructor.
pub fn find_static_tls() {
    HELD.find();
}

/// pthread_atfork prepare.
pub extern "C" fn before_fork() {
    if let Some(g) = Guard::enter() {
        std::mem::forget(g);
        HELD.with(|h| h.set(true));
    }
    // The tracer's lists a thread's first event changes, before the heap
    // (they allocate while held).
    crate::record::thread::hold_for_fork();
    crate::record::dead_stacks::hold_for_fork();
    if let Some(s) = current() {
        s.hold_for_fork();
    }
    crate::platform::allocator::hold_for_fork();
    crate::record::sampled::hold_for_fork();
}

/// pthread_atfork parent: release what `before_fork` took.
pub extern "C" fn after_fork_parent() {
    crate::record::sampled::release_after_fork();
    // SAFETY: before_fork took the heap's lock, in this thread.
    unsafe { crate::platform::allocator::release_after_fork() };
    if let Some(s) = current() {
        // SAFETY: before_fork took the locks, in this thread.
        unsafe { s.release_after_fork() };
    }
    crate::record::dead_stacks::release_after_fork();
    crate::record::thread::release_after_fork();
    if HELD.with(|h| h.replace(false)) {
        guard::leave_held();
    }
}

/// In the pthread_atfork child handler (session/mod.rs's, which then
/// starts the child's own session or none: the parent's buffers, copied
/// into the child, are not written again): what `before_fork` took is
/// released and the parent's per-thread state reset. The parent's session
/// (whether it follows forks, its pid), if it had one.
pub fn in_child() -> Option<(bool, u32)> {
    crate::record::sampled::release_after_fork();
    // SAFETY: before_fork took the heap's lock, in the thread the child runs.
    unsafe { crate::platform::allocator::release_after_fork() };
    crate::snapshot::stop::reset_in_child();
    crate::lifecycle::signals::reset_in_child();
    slot::reset_in_child();
    stream::order::reset_in_child();
    crate::record::nested::reset_in_child();
    crate::record::dead_stacks::release_after_fork();
    crate::record::thread::release_after_fork();
    crate::record::thread::reset_in_child();
    HELD.with(|h| h.set(false));
    current().map(|parent| (parent.follow_fork, parent.pid))
}

/// Registers the fork handlers, once per process (from the constructor, or
/// from `mtrace_attach_init`, which may run again after a detach), `child`
/// the child's (which calls [`in_child`]).
pub fn install_once(child: extern "C" fn()) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the three handlers are plain extern "C" functions.
        unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(child)) };
    });
}
