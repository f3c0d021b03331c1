//! libmtrace.so: records every allocation of the program it is preloaded
//! into, with its backtrace, to an mtrace stream (see the `mtrace-format`
//! crate and docs/FORMAT.md).
//!
//! Layout: `hooks` are the exported entry points; `recorder` turns a call
//! into a record; `thread` keeps per-thread buffers and interned
//! backtraces; `session` owns the file (kept out of the program's way:
//! `session/output.rs`, `hooks/fds.rs`), the writer thread and the final
//! flush; `real` finds the functions the hooks forward to; `attach` starts
//! tracing in a running process (`mtrace attach`). `unsafe` lives in
//! `attach`, `real`, `sys`, `hooks`, `modules`, `signals`, `stop`, `snapshot` and
//! `allocator` (and a few blocks elsewhere), each block with its `SAFETY:`
//! comment: clippy's `undocumented_unsafe_blocks` is denied workspace-wide.

// The unit tests run as an ordinary executable: without the hooks and the
// constructor, so that the test binary does not trace itself.
#![cfg_attr(test, allow(dead_code))]

mod allocator;
mod attach;
mod clock;
mod config;
mod fork;
mod guard;
#[cfg(not(test))]
mod hooks;
mod modules;
mod nested;
mod real;
mod recorder;
mod reports;
mod session;
mod signals;
mod snapshot;
mod stop;
mod sys;
mod thread;
mod unwind;

use guard::Guard;
use mtrace_format::EndReason;

#[global_allocator]
static ALLOC: allocator::TracerHeap = allocator::TracerHeap;

/// Library constructor. Events before it (other libraries' constructors)
/// are already recorded: the session starts lazily on the first event; this
/// adds the writer thread, fatal-signal handlers and fork handlers.
extern "C" fn init() {
    let _g = Guard::enter();
    // Loaded by `mtrace attach`: dormant until it calls mtrace_attach_init.
    if !attach::preloaded() {
        return;
    }
    let Some(s) = session::get() else { return };
    session::start_writer();
    if s.scan {
        // Looked up now: a fatal signal's scan must not ask the loader.
        snapshot::own_range(true);
    }
    signals::install();
    if let Some(sig) = s.report_signal {
        reports::install(sig);
    }
    if let Some(sig) = s.scan_signal {
        reports::install_scan(sig);
    }
    if !s.follow_exec {
        sys::drop_from_preload("libmtrace.so");
    }
    fork::install_once();
    AT_THE_END.store(real::at_the_end_of_exit(the_end), std::sync::atomic::Ordering::Release);
}

/// [`the_end`] is registered to run at the end of `exit`.
static AT_THE_END: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Library destructor: runs in `exit()` after the program's atexit
/// handlers, among the libraries' destructors. The end of the trace waits
/// for [`the_end`], after all of them, where it could be registered.
extern "C" fn fini() {
    if !AT_THE_END.load(std::sync::atomic::Ordering::Acquire) {
        end_of_exit();
    }
}

/// The last of `exit`'s handlers: after the program's atexit handlers and
/// every library's destructor (libstdc++'s, libpython's), as memcheck's
/// end comes after them.
extern "C" fn the_end(_: *mut libc::c_void) {
    end_of_exit();
}

/// The end of a process that exits: glibc's freeres, the leak scan, the
/// trace's end; later events are written synchronously.
fn end_of_exit() {
    // What glibc keeps for the process's lifetime is not the program's
    // leak: it frees it, outside any hook so that its frees are recorded
    // (docs/SCAN.md). It also empties the environment (setenv.c's
    // free_mem): nothing may run after it that reads it.
    if let Some(s) = session::current() {
        if s.freeres && s.pid == sys::getpid() && !s.is_finished() {
            real::libc_freeres();
        }
    }
    let _g = Guard::enter();
    if let Some(s) = session::current() {
        if s.scan && s.pid == sys::getpid() && !s.is_finished() {
            // The roots: the program's frame that called exit (a return
            // from main calls it too), not the exit path below it.
            snapshot::take(s, snapshot::By::program_calling(real::libc_exit()));
        }
    }
    recorder::final_flush(EndReason::Exit, false);
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[cfg(not(test))]
#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;
