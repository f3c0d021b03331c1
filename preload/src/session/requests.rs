//! The report and scan signals' handlers (installed by
//! `lifecycle::requests`, whose doc says where each answers): with a
//! writer thread, the handler counts the request for the writer's next
//! round; in a process with one thread it answers itself where it can.

use crate::platform::{allocator, sys};
use crate::record::guard::Guard;
use crate::snapshot::{self, stop, By};
use crate::stream::{self, reports, Session};

/// The handlers, for `lifecycle::requests::install`: report, scan.
pub const HANDLERS: [crate::lifecycle::requests::Handler; 2] = [on_report_signal, on_scan_signal];

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
    let loader = crate::lifecycle::requests::loader_range();
    if inside(snapshot::own_range(false)) || inside(Some(loader)) {
        return;
    }
    // Inside a hook already: the thread may hold the tracer's locks.
    let Some(_g) = Guard::enter() else { return };
    if reports::take_scan_request() {
        // The thread's roots: the registers the signal interrupted, and
        // its stack from there up.
        snapshot::scan_point(s, By::Interrupted { regs, len: regs.len(), live_from }, None, None);
    }
    super::solo::round_now(s);
}
