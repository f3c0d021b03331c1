//! The report and scan signals (`MTRACE_REPORT_SIGNAL`,
//! `MTRACE_SCAN_SIGNAL`): requests while the program runs. Their handlers
//! are the session's (session/requests.rs); they are installed and
//! uninstalled here, with what they need to know found up front.
//!
//! With a writer thread, the handler counts the request and the writer
//! answers at its next round (stream/reports.rs). A process with one
//! thread has no writer (docs/PROCESSES.md) and may idle for minutes in a
//! `read`, a `poll` or a sleep: there the handler answers itself, at once
//! — the scan, then a round that writes what the thread buffered, the
//! report's marker, and starts the report — wherever the signal found the
//! thread outside the tracer (its hooks, its heap) and the loader. The
//! round touches only the tracer's state, which no other thread shares,
//! allocates from the tracer's heap, writes with system calls, and takes
//! no lock of libc's but the loader's recursive one (`dl_iterate_phdr`,
//! which the thread may hold itself: the signal came in a callback). Where
//! the signal came inside the tracer or the loader, the thread leaves them
//! within microseconds, and its next allocation call answers.
//!
//! The handlers are installed with `SA_RESTART`: the calls the kernel
//! restarts after a handler (`read`, `write`, `accept`, `wait`, a futex
//! wait without a timeout…) go on; `poll`, `epoll_wait`, `select`,
//! `nanosleep` and their kin fail with EINTR after any handler (signal(7)),
//! as they would after a handler of the program's own: the user's signal
//! causes it.

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use crate::platform::modules;
use crate::snapshot;
use crate::stream::Session;

/// The loader's mappings, [lo, hi), found at the installation (a handler
/// must not ask the loader).
static LOADER: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The loader's mappings, [lo, hi), as [`install`] found them ((0, 0)
/// before): a handler must not ask the loader.
pub fn loader_range() -> (u64, u64) {
    (LOADER[0].load(Ordering::Relaxed), LOADER[1].load(Ordering::Acquire))
}

/// A signal handler (`SA_SIGINFO`).
pub type Handler = extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void);

/// Installs `handlers` (report, scan) for session `s`'s report and scan
/// signals, each where the program left that signal's default action (at
/// the library's start, or `mtrace attach`'s).
pub fn install(s: &Session, handlers: [Handler; 2]) {
    if s.report_signal.is_none() && s.scan_signal.is_none() {
        return;
    }
    // Looked up now: the handlers tell the tracer's and the loader's code
    // from the program's by them.
    snapshot::own_range(true);
    if let Some((lo, hi)) = modules::loader_range() {
        LOADER[0].store(lo, Ordering::Relaxed);
        LOADER[1].store(hi, Ordering::Release);
    }
    for (i, (sig, handler)) in [s.report_signal, s.scan_signal].into_iter().zip(handlers).enumerate() {
        if let Some(sig) = sig.filter(|&sig| swap_handler(sig, libc::SIG_DFL, handler as usize)) {
            HANDLERS[i].store(handler as usize, Ordering::Relaxed);
            INSTALLED[i].store(sig, Ordering::Release);
        }
    }
}

/// The report and scan signals whose handler [`install`] set (0: none).
static INSTALLED: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];
/// The handlers [`install`] set, by the same index.
static HANDLERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Tracing ended for good in a process that goes on (`mtrace attach`'s
/// detach): the signals whose handler is still ours take their default
/// action again, as before the attach.
pub fn uninstall() {
    for (slot, handler) in INSTALLED.iter().zip(&HANDLERS) {
        let sig = slot.swap(0, Ordering::AcqRel);
        if sig != 0 {
            swap_handler(sig, handler.load(Ordering::Relaxed), libc::SIG_DFL);
        }
    }
}

/// Sets `sig`'s action to `to` (a handler: with `SA_RESTART`), where it is
/// `from`; whether it did.
fn swap_handler(sig: i32, from: usize, to: usize) -> bool {
    // SAFETY: sigaction with valid pointers.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction != from {
            return false;
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = to;
        if to != libc::SIG_DFL {
            sa.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
        }
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0
    }
}
