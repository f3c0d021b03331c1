//! The writer thread: every 5 ms it notices loaded and unloaded libraries,
//! samples the RSS, carries out commands and makes the reports asked for,
//! and collects every thread's buffer, compresses them and writes them:
//! in that round if a buffer is full, else every 50 ms. A process with one
//! thread makes the same rounds on its own thread (solo.rs).

use std::sync::atomic::Ordering;

use crate::lifecycle;
use crate::platform::sys;
use crate::record;
use crate::stream::{
    current, reports, Rounds, Session, PENDING_MAX, QUIET_COLLECT_MS, REAP_EVERY, SAMPLE_EVERY, SIGNAL_REPORT,
    WRITER_POLL_MS,
};

/// One round of the writer's work, by the writer thread or, while the
/// process has one thread, by that thread at its events (solo.rs): module
/// changes (`mtrace attach` redirects the new modules' calls), the
/// stream's part (`Session::write_round`: buffers collected when one is
/// full, else `quiet_ns` after the last collection, an RSS sample every
/// `sample_every` rounds), threads that ended unregistered reaped,
/// commands, scan and report requests. False once tracing stopped (a
/// detach, or the trace lost).
pub fn round(s: &Session, r: &mut Rounds, quiet_ns: u64, sample_every: u64) -> bool {
    r.round += 1;
    if s.is_finished() {
        return true;
    }
    s.refit_clock();
    // Asked of the loader before the file is locked: a thread the leak
    // scan holds may hold the loader's lock, and the scan waits for the
    // file.
    let modules = s.modules_if_changed();
    if modules.is_some() {
        lifecycle::attach::redirect_new();
    }
    let Some(collected_until) = s.write_round(r, modules, quiet_ns, sample_every) else { return true };
    if super::stopped_by_loss() {
        return false;
    }
    if r.round.is_multiple_of(REAP_EVERY) {
        record::thread::reap();
    }
    if !super::commands::poll(s, &mut r.commands) {
        return false;
    }
    if reports::take_scan_request() {
        super::scan_by_writer(s);
    }
    if s.reporter.take_request() {
        s.report_point(SIGNAL_REPORT, None);
    }
    s.reporter.reap();
    r.late = s.written_after(collected_until);
    true
}

fn writer_loop(s: &Session) {
    let gen = s.gen;
    let mut rounds = Rounds::new();
    loop {
        // Behind (threads may be waiting): no pause between rounds.
        if s.pending.load(Ordering::Relaxed) <= PENDING_MAX / 4 {
            sys::sleep_ms(WRITER_POLL_MS);
        }
        if current().map(|s| s.gen) != Some(gen) {
            super::stopped_by_loss();
            return;
        }
        if !round(s, &mut rounds, QUIET_COLLECT_MS * 1_000_000, SAMPLE_EVERY) {
            return;
        }
    }
}

/// The writer thread's body: the tracer's thread for good (never inside
/// the recording of a hook), its stack and id noted for the scan and the
/// stops, then its rounds until its session ends.
pub(super) extern "C" fn writer_main(_: *mut libc::c_void) -> *mut libc::c_void {
    record::slot::hold_forever();
    if let Some(s) = current() {
        if let Some((lo, hi)) = sys::own_stack() {
            s.writer_stack[0].store(lo, Ordering::Relaxed);
            s.writer_stack[1].store(hi, Ordering::Relaxed);
        }
        s.writer_tid.store(sys::gettid(), Ordering::Release);
        writer_loop(s);
    }
    std::ptr::null_mut()
}
