//! libmtrace.so: records every allocation of the program it is preloaded
//! into, with its backtrace, to an mtrace stream (see the `mtrace-format`
//! crate and docs/FORMAT.md).
//!
//! Rooms, from the top down; a room names only rooms below it, and what a
//! lower room needs done above it goes through the table the crate root
//! wires ([`UP`]). `scripts/module_cycles` checks both: no two rooms reach
//! each other, and each call through `UP` lands in a room above its
//! caller.
//! - `hooks`: the exported entry points (malloc, new, mmap, fork, the C API);
//! - `lifecycle`: constructor and destructor, the end of `exit`, fork,
//!   fatal signals, `mtrace attach`, the console's commands;
//! - `snapshot`: the leak scan's snapshot, and stopping the other threads
//!   for it (`stop`);
//! - `record`: a call made a record — the reentrancy guard, per-thread
//!   state and buffers, nested calls, the recorder;
//! - `stream`: the session (its file or socket, kept out of the program's
//!   way), the writer thread, the order of threads' records, report points;
//! - `unwind`: the unwinders (the fast CFI unwinder, libgcc's);
//! - `platform`: system calls, the clock, the recording configuration
//!   read (`mtrace_format::recording`), the loaded modules, the tracer's
//!   own heap, the real functions behind the hooks.
//!
//! `unsafe` lives in `lifecycle::attach`, `platform` (`real`, `sys`, `park`,
//! `modules`, `allocator`), `hooks`, `lifecycle::signals`, `snapshot` (and a
//! few blocks elsewhere), each block with its `SAFETY:` comment: clippy's
//! `undocumented_unsafe_blocks` is denied workspace-wide.

// The unit tests run as an ordinary executable: without the hooks and the
// constructor, so that the test binary does not trace itself.
#![cfg_attr(test, allow(dead_code))]

#[cfg(not(test))]
mod hooks;
mod lifecycle;
mod platform;
mod record;
mod snapshot;
mod stream;
mod unwind;

#[global_allocator]
static ALLOC: platform::allocator::TracerHeap = platform::allocator::TracerHeap;

/// The calls a room makes into a room above it, wired here once (the
/// crate root) so that no module names one above it: the stream starts
/// lazily on the program's first event, from whichever hook sees it, so
/// these cannot be registered at run time. Each is rare (a session's
/// start, a stop, a scan, a dlopen), never on a hook's fast path.
pub(crate) struct Up {
    /// A session starts (its settings read): the functions the hooks
    /// forward to are resolved before any is needed, collection and
    /// sampling set.
    pub starting: fn(&platform::config::Recording),
    /// Tracing stopped for good (the trace was lost, or detached): `mtrace
    /// attach`'s redirections are undone.
    pub stopped: fn(),
    /// The writer thread was asked for a leak scan (`MTRACE_SCAN_SIGNAL`).
    pub scan: fn(&stream::Session),
    /// A command from the socket's reader, parsed by the writer thread:
    /// carried out; false when it ended tracing.
    pub command: fn(&stream::Session, mtrace_format::protocol::Command) -> bool,
    /// Modules were loaded or unloaded (seen by the writer): `mtrace
    /// attach` redirects the new ones.
    pub modules_changed: fn(),
    /// The calling thread (the writer) never enters a hook's recording.
    pub hold_guard: fn(),
    /// The calling thread is about to wait inside a hook: its mark on the
    /// stream's order is taken back first.
    pub unmark: fn(),
    /// Now and then, from the writer: the states of threads that ended
    /// before their exit was registered are freed, their buffers let go.
    pub reap: fn(),
    /// The hook of an allocator's own entry point, by the entry point's
    /// name (`mtrace_format::functions::ENTRY_POINTS`), for the GOT
    /// redirection (`lifecycle::attach`).
    pub entry_hook: fn(&str) -> Option<usize>,
    /// The hook of a free that several families share (tcmalloc's `free`
    /// is its `operator delete`), patched into the executable: (its
    /// arguments, its original) → the hook, in a slot of its own.
    pub shared_free_hook: fn(usize, usize) -> Option<usize>,
}

/// The wiring of [`Up`].
pub(crate) static UP: Up = Up {
    starting: session_starting,
    stopped: lifecycle::attach::undo,
    scan: lifecycle::scan_by_writer,
    command: lifecycle::commands::carry_out,
    modules_changed: lifecycle::attach::redirect_new,
    hold_guard: record::slot::hold_forever,
    unmark: record::guard::unmark_now,
    reap: record::thread::reap,
    entry_hook: hook_of_entry_point,
    shared_free_hook: hook_of_shared_free,
};

/// [`Up::shared_free_hook`]: `hooks::shared_free`; none in the unit tests.
fn hook_of_shared_free(args: usize, original: usize) -> Option<usize> {
    #[cfg(not(test))]
    return hooks::shared_free::hook(args, original);
    #[cfg(test)]
    {
        let _ = (args, original);
        None
    }
}

/// [`Up::entry_hook`]: `hooks::entry_points`; none in the unit tests,
/// which have no hooks.
fn hook_of_entry_point(name: &str) -> Option<usize> {
    #[cfg(not(test))]
    return hooks::entry_points::hook_of(name);
    #[cfg(test)]
    {
        let _ = name;
        None
    }
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = lifecycle::init;

#[cfg(not(test))]
#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = lifecycle::fini;

/// [`Up::starting`]: the functions the file-descriptor hooks forward to
/// are resolved before the trace's file is opened (a `dlsym` in a later
/// `close` could wait for the loader's lock), then the session's settings
/// go to the rooms that keep them.
fn session_starting(cfg: &platform::config::Recording) {
    #[cfg(not(test))]
    hooks::fds::init();
    lifecycle::starting(cfg);
}
