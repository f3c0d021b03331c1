//! The report and scan signals (`MTRACE_REPORT_SIGNAL`,
//! `MTRACE_SCAN_SIGNAL`): requests while the program runs.
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

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use crate::platform::{allocator, modules, sys};
use crate::record::guard::Guard;
use crate::snapshot::{self, stop, By};
use crate::stream::{self, reports, Session};

/// The loader's mappings, [lo, hi), found at the installation (a handler
/// must not ask the loader).
static LOADER: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Installs the handlers of session `s`'s report and scan signals, each
/// where the program left that signal's default action (at the library's
/// start, or `mtrace attach`'s).
pub fn install(s: &Session) {
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
    for (i, (sig, handler)) in
        [(s.report_signal, on_report_signal as Handler), (s.scan_signal, on_scan_signal)].into_iter().enumerate()
    {
        if let Some(sig) = sig.filter(|&sig| swap_handler(sig, libc::SIG_DFL, handler as usize)) {
            INSTALLED[i].store(sig, Ordering::Release);
        }
    }
}

/// The report and scan signals whose handler [`install`] set (0: none).
static INSTALLED: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];

/// Tracing ended for good in a process that goes on (`mtrace attach`'s
/// detach): the signals whose handler is still ours take their default
/// action again, as before the attach.
pub fn uninstall() {
    let ours = [on_report_signal as Handler as usize, on_scan_signal as Handler as usize];
    for (slot, handler) in INSTALLED.iter().zip(ours) {
        let sig = slot.swap(0, Ordering::AcqRel);
        if sig != 0 {
            swap_handler(sig, handler, libc::SIG_DFL);
        }
    }
}

type Handler = extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void);

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

/// The report signal: the report of this moment.
extern "C" fn on_report_signal(_: i32, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // No session (tracing off in this process): nobody would answer.
    let Some(s) = stream::current() else { return };
    let errno = sys::errno();
    let mine = reports::request();
    if s.is_solo() {
        answer(s, ctx);
    } else {
        reports::wait_marked(mine);
    }
    sys::set_errno(errno);
}

/// The scan signal: a leak scan now, and its report. With a writer
/// thread, the handler does not wait: the scan stops this thread like
/// every other.
extern "C" fn on_scan_signal(_: i32, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    reports::request_scan();
    let Some(s) = stream::current() else { return };
    if s.is_solo() {
        let errno = sys::errno();
        answer(s, ctx);
        sys::set_errno(errno);
    }
}

/// In a process with one thread: the requests counted so far answered in
/// this handler where the signal (its context `ctx`) found the thread at
/// a place that allows it (see the module's doc); else at the thread's
/// next allocation call.
fn answer(s: &Session, ctx: *mut libc::c_void) {
    s.round_soon();
    // A vfork child shares the program's memory, not its session; a
    // process whose trace ended has nothing to answer; a tracer that
    // allocates from the program's malloc (its heap could not be
    // reserved) must not allocate where the signal may have come.
    if s.pid != sys::getpid() || s.is_finished() || allocator::range().is_none() {
        return;
    }
    let (regs, live_from) = stop::interrupted(ctx);
    let Some(pc) = stop::interrupted_pc(&regs) else { return };
    let inside = |r: Option<(u64, u64)>| r.is_some_and(|(lo, hi)| lo <= pc && pc < hi);
    let loader = (LOADER[0].load(Ordering::Relaxed), LOADER[1].load(Ordering::Acquire));
    if inside(snapshot::own_range(false)) || inside(Some(loader)) {
        return;
    }
    // Inside a hook already: the thread may hold the tracer's locks.
    let Some(_g) = Guard::enter() else { return };
    if reports::take_scan_request() {
        // The thread's roots: the registers the signal interrupted, and
        // its stack from there up.
        snapshot::scan_point(s, By::Interrupted { regs, len: regs.len(), live_from }, None, false);
    }
    s.solo_round_now();
}
