//! While a process has one thread it has no writer thread (some must stay
//! single-threaded: Chromium's zygote, `unshare(CLONE_NEWUSER)`): its own
//! thread does the writer's rounds at its events of the malloc family, and
//! the writer thread starts with its second thread (docs/PROCESSES.md).
//!
//! The recorder runs [`round`] when the stream says one is due
//! (`Session::round_due`), before the event's append: the hook hands it
//! down (`record::thread::Round`), since the session room sits above the
//! recorder and the recorder never names it.

use std::sync::atomic::Ordering;

use super::writer::{self, writer_main};
use crate::platform::sys;
use crate::stream::{current, order, Session, QUIET_COLLECT_MS, WRITER_POLL_MS};

/// The process gets (or has) a second thread: the current session's
/// writer thread starts, once, before that thread runs (from the hook of
/// `pthread_create`, the constructor of a process that already has
/// threads, `mtrace attach`), or at the next round of a process where a
/// thread that was not seen being created made an event
/// (`Session::want_writer`). Where it cannot start, the session stays
/// solo: the program's threads do the rounds.
pub fn leave_solo() {
    let Some(s) = current() else { return };
    if !s.solo.swap(false, Ordering::AcqRel) {
        return;
    }
    s.next_round.store(u64::MAX, Ordering::Relaxed);
    if sys::spawn_blocked(writer_main) {
        s.writer_started.store(true, Ordering::Release);
    } else {
        sys::warn("cannot start the writer thread; the program's threads write the trace");
        s.next_round.store(0, Ordering::Relaxed);
        s.solo.store(true, Ordering::Release);
    }
}

/// How long a solo process goes between two rounds while it makes events,
/// ns: the writer thread's poll interval.
const SOLO_ROUND_NS: u64 = WRITER_POLL_MS * 1_000_000;

/// The writer's round, by the program's thread in its hook, before an
/// event stamped `now` (ns) whose append follows, once the stream said it
/// is due (`Session::round_due`), with the writer thread's intervals (full
/// buffers each round, the one being filled every 50 ms).
///
/// `block` is the block an allocation's hook has not recorded yet (left
/// out of a scan's roots: its bytes are stale); `restamped`: the event
/// will be stamped again after the round's collection (stream/order.rs),
/// so the hook's mark need not hold back the watermark that follows what
/// the round writes. Has the type `record::thread::Round`.
#[cold]
#[inline(never)]
pub fn round(s: &Session, now: u64, block: Option<(u64, u64)>, restamped: bool) {
    if s.take_writer_wanted() {
        leave_solo();
    }
    round_with(s, now, block, restamped, QUIET_COLLECT_MS * 1_000_000);
}

/// A round now, the buffer being filled written too: `mtrace attach`'s
/// call into an idle process with one thread (for its console and its
/// views, which would otherwise wait for the program's next event), and
/// the report and scan signals' handlers.
pub fn round_now(s: &Session) {
    round_with(s, s.now(), None, false, 0);
}

/// [`round`], the buffer being filled written when `quiet_ns` passed
/// since the last collection.
fn round_with(s: &Session, now: u64, block: Option<(u64, u64)>, restamped: bool, quiet_ns: u64) {
    if !s.is_solo() {
        s.next_round.store(u64::MAX, Ordering::Relaxed);
        return;
    }
    // Another thread's round (a thread not seen created) is under way.
    let Some(mut r) = s.solo_rounds.try_lock() else { return };
    s.next_round.store(now + SOLO_ROUND_NS, Ordering::Relaxed);
    if restamped {
        // What the hook kept is written and its mark taken back: a
        // marker the round writes is then released to a live reader
        // at once, not at the next round.
        crate::record::guard::unmark_now();
    }
    let (lo, hi) = block.unwrap_or((0, 0));
    s.round_block[0].store(lo, Ordering::Relaxed);
    s.round_block[1].store(hi, Ordering::Relaxed);
    // Rounds come 5 ms apart at the least: a sample at each. A buffer
    // being filled is written every 50 ms, as by the writer thread:
    // written every round, its small zstd blocks cost cxx_work 11%
    // more instructions than the writer thread's work (callgrind).
    if !writer::round(s, &mut r, quiet_ns, 1) {
        s.solo.store(false, Ordering::Release);
        s.next_round.store(u64::MAX, Ordering::Relaxed);
    }
    s.round_block[0].store(0, Ordering::Relaxed);
    s.round_block[1].store(0, Ordering::Relaxed);
    // What the round wrote after its collection (a marker, a scan)
    // gets its watermark now: the next round may be far off, and a
    // live reader releases records up to a watermark (order.rs).
    if r.late && s.is_solo() {
        let until = s.written_until.load(Ordering::Relaxed);
        // A watermark is the collection's start less the clocks' skew:
        // it passes what was written once that much time went by.
        while s.now() <= until + order::SKEW_NS {
            std::hint::spin_loop();
        }
        let _f = crate::platform::spin::lock_unparked(&s.file);
        if !s.is_finished() {
            s.collect(false);
        }
    }
}
