//! libmtrace.so: records every allocation of the program it is preloaded
//! into, with its backtrace, to an mtrace stream (see the `mtrace-format`
//! crate and docs/FORMAT.md).
//!
//! Rooms, from the top down; a room names only rooms below it. The one
//! thing a lower room takes from above is a hook's address (to install it
//! in a GOT or a patched allocator), from the table the crate root wires
//! ([`UP`]). `scripts/module_cycles` checks both: no two rooms reach each
//! other, and each address read through `UP` is a room above its reader.
//! - `hooks`: the exported entry points (malloc, new, mmap, fork, the C API);
//! - `session`: what drives the stream — its creation, the writer
//!   thread's rounds and a solo process's, the console's commands, the
//!   report and scan signals, `mtrace attach`'s calls;
//! - `lifecycle`: constructor's parts and destructor, the end of `exit`,
//!   fork, fatal signals, `mtrace attach`'s redirections;
//! - `snapshot`: the leak scan's snapshot, and stopping the other threads
//!   for it (`stop`);
//! - `record`: a call made a record — the reentrancy guard, per-thread
//!   state and buffers, nested calls, the recorder;
//! - `stream`: the session's data (its file or socket, kept out of the
//!   program's way), the threads' buffers and the order of their records,
//!   what a round writes, report points;
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
mod session;
mod snapshot;
mod stream;
mod unwind;

#[global_allocator]
static ALLOC: platform::allocator::TracerHeap = platform::allocator::TracerHeap;

/// The hooks' addresses the rooms below the hooks install (`mtrace
/// attach`'s GOT redirection, the executable's patched allocator), wired
/// here once (the crate root), since the hooks are the top room. Each is
/// read when a module is redirected or an allocator patched, never on a
/// hook's path. Nothing else calls up: the session (session/), which
/// drives the stream, sits above the rooms it calls.
pub(crate) struct Up {
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
pub(crate) static UP: Up = Up { entry_hook: hook_of_entry_point, shared_free_hook: hook_of_shared_free };

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
static INIT: extern "C" fn() = session::init;

#[cfg(not(test))]
#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = lifecycle::fini;
