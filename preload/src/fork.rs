//! fork: the child of a traced process is traced into a file of its own
//! (or not at all with `MTRACE_FOLLOW_FORK=off`); no write may be half
//! done when the process is copied. Registered with pthread_atfork.

use crate::guard::Guard;
use crate::session::{self, current};

/// pthread_atfork prepare.
pub extern "C" fn before_fork() {
    if let Some(s) = current() {
        s.hold_for_fork();
    }
}

/// pthread_atfork parent: release what `before_fork` took.
pub extern "C" fn after_fork_parent() {
    if let Some(s) = current() {
        // SAFETY: before_fork took the locks, in this thread.
        unsafe { s.release_after_fork() };
    }
}

/// pthread_atfork child: a new session (the parent's buffers, copied into
/// the child, are not written again), or none.
pub extern "C" fn after_fork_child() {
    let Some(parent) = current() else { return };
    let _g = Guard::enter();
    session::restart_in_child(parent.follow_fork);
}
