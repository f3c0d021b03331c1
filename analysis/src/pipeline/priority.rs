//! The priority of mtrace's threads that work while the traced program
//! runs: they give way to it where they share a core.

/// The niceness of a thread that reads a trace while its program runs
/// (`following.rs`): cfrac under `mtrace run` (`farm-bench -n 3`,
/// medians): 25.0 s with it, 27.3 s at the program's own niceness; the
/// preload alone, 24.7 s.
pub const NICENESS: i32 = 10;

/// Lowers the calling thread's priority to [`NICENESS`] (Linux's nice
/// value is a thread's: `setpriority(PRIO_PROCESS, 0, …)` sets the
/// caller's, and the threads it starts inherit it). Nothing when refused.
pub fn yield_to_the_program() {
    // SAFETY: setpriority takes no pointer.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, NICENESS);
    }
}
