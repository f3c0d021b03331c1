//! `mtrace attach`'s calls into the process (lifecycle/attach says how
//! the library gets there and redirects the calls): the session started
//! with the attacher's settings, a round on an idle program's thread, the
//! detach of a process with one thread.

use std::ffi::{c_char, CStr};

use mtrace_format::protocol::Command;

use super::commands;
use crate::lifecycle::{self, attach};
use crate::platform::{real, sys};
use crate::record::guard::Guard;
use crate::stream;

/// Called by `mtrace attach` in a process whose tracing has no writer
/// thread (one thread: it answers commands at its next allocation call)
/// when the `detach` it sent was not answered: the leak scan first when
/// `scan` is not 0, then the detach, on the calling thread (the program's
/// own, stopped outside the tracer, libc and the loader). Returns 0, or 1
/// when there was nothing to do (no solo session: its writer answers).
#[no_mangle]
pub extern "C" fn mtrace_attach_detach(scan: i32) -> i32 {
    let _g = Guard::enter();
    let Some(s) = stream::current().filter(|s| attach::attached() && s.is_solo() && !s.is_finished()) else {
        return 1;
    };
    if scan != 0 {
        commands::carry_out(s, Command::Scan);
    }
    commands::carry_out(s, Command::Detach);
    0
}

/// Called by the reader of a process whose tracing has no writer thread
/// (`mtrace attach`, `mtrace server`), by ptrace, when a command it sent
/// or its console's views need what the program buffered (an idle
/// program with one thread makes no round of its own: docs/PROCESSES.md):
/// a round now on the calling thread (the program's, stopped outside the
/// tracer, libc and the loader), its commands read and carried out, its
/// buffer written. Makes no `nanosleep` (platform/sys.rs's sleeps): the
/// call the thread was stopped in goes on from its restart block, for its
/// own time. Returns 0, or 1 when there was nothing to do (no session, or
/// one with a writer thread).
#[no_mangle]
pub extern "C" fn mtrace_round_now() -> i32 {
    let Some(_g) = Guard::enter() else { return 1 };
    let Some(s) = stream::current().filter(|s| s.is_solo() && !s.is_finished()) else {
        return 1;
    };
    if s.pid != sys::getpid() {
        return 1;
    }
    super::solo::round_now(s);
    0
}

/// Starts tracing with `settings` (`NAME=value` lines, as the `MTRACE_*`
/// environment variables; `MTRACE_OUTPUT` the attacher's socket) and
/// redirects the process's calls to the hooks. Called by `mtrace attach`
/// inside the process. Returns 0, or -1 when no session could start (the
/// reason is on the program's stderr), -2 when another attach traces it,
/// -3 when it runs with the library preloaded (`mtrace run`,
/// `LD_PRELOAD`) and traced.
///
/// # Safety
/// `settings` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mtrace_attach_init(settings: *const c_char) -> i32 {
    let _g = Guard::enter();
    if let Err(code) = attach::may_start() {
        return code;
    }
    // SAFETY: per the contract.
    let text = unsafe { CStr::from_ptr(settings) }.to_string_lossy().into_owned();
    crate::platform::config::set_overrides(&text);
    real::resolve_from_default();
    // Before anything resolves the malloc family: an allocator in the
    // executable gets its trampolines, its hooks their originals (the
    // jumps come with mtrace_attach_patch, the other threads held).
    lifecycle::patch::prepare_attached();
    if !stream::start_late(|| super::create(false, None)) {
        return -1;
    }
    // Tells the analyzer that blocks from before this point are unknown.
    if let Some(s) = stream::current() {
        s.marker(0, mtrace_format::protocol::marker::ATTACH);
    }
    // A writer thread only where the process has more than one thread: one
    // with a single thread keeps it (docs/PROCESSES.md); it answers the
    // console at its events, and an idle one is detached by a call
    // `mtrace attach` makes in it (mtrace_attach_detach).
    if sys::numbered_entries(c"/proc/self/task").len() > 1 {
        super::solo::leave_solo();
    }
    lifecycle::fork::install_once(super::after_fork_child);
    if let Some(s) = stream::current() {
        // Its reports go to the attacher's socket as markers: `mtrace
        // attach` writes their .memlog files.
        lifecycle::requests::install(s, super::requests::HANDLERS);
    }
    attach::started();
    0
}
