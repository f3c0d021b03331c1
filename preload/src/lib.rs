//! libmtrace.so: records every allocation of the program it is preloaded
//! into, with its backtrace, to an mtrace stream (see the `mtrace-format`
//! crate and docs/FORMAT.md).
//!
//! Rooms, from the top down; a room names only rooms below it
//! (`scripts/module_cycles` checks it). The one thing a lower room takes
//! from above is a hook's address (to install it in a GOT or a patched
//! allocator): the constructor registers the hooks' tables once, in
//! `platform::hook_addresses`.
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

/// The library's constructor: the hooks' addresses registered for the
/// rooms below that install them (`platform::hook_addresses`: the GOT
/// redirection, the executable's patched allocator), then the session's
/// constructor.
#[cfg(not(test))]
extern "C" fn init() {
    platform::hook_addresses::register(platform::hook_addresses::Tables {
        entry_points: &hooks::entry_points::HOOKS,
        shared_frees: &hooks::shared_free::HOOKS,
    });
    session::init();
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[cfg(not(test))]
#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = lifecycle::fini;
