//! While a process has one thread it has no writer thread (some must stay
//! single-threaded: Chromium's zygote, `unshare(CLONE_NEWUSER)`): its own
//! thread does the writer's rounds at its events of the malloc family, and
//! the writer thread starts with its second thread (docs/PROCESSES.md).

use std::sync::atomic::Ordering;

use super::writer::writer_main;
use super::{current, order, Session, QUIET_COLLECT_MS, WRITER_POLL_MS};
use crate::platform::sys;

/// The process gets (or has) a second thread: the current session's
/// writer thread starts, once, before that thread runs (from the hook of
/// `pthread_create`, the constructor of a process that already has
/// threads, `mtrace attach`), or at the first event of the malloc family
/// of a thread that was not seen being created. Where it cannot start,
/// the session stays solo: the program's threads do the rounds.
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

impl Session {
    /// Whether the session has no writer thread (see [`Session::solo`]).
    pub fn is_solo(&self) -> bool {
        self.solo.load(Ordering::Acquire)
    }

    /// Before an event of the malloc family stamped `now` (ns), made
    /// outside the program's allocator: while solo, the writer's round
    /// when it is due (every [`SOLO_ROUND_NS`], or at once after full
    /// buffers passed 1 MiB or a signal asked for a report or a scan). One
    /// load and a compare otherwise.
    ///
    /// `block` is the block an allocation's hook has not recorded yet
    /// (left out of a scan's roots: its bytes are stale); `restamped`:
    /// the event will be stamped again after the round's collection
    /// (order.rs), so the hook's mark need not hold back the watermark
    /// that follows what the round writes.
    #[inline(always)]
    pub fn solo_due(&self, now: u64, block: Option<(u64, u64)>, restamped: bool) {
        if now >= self.next_round.load(Ordering::Relaxed) {
            self.solo_round(now, block, restamped);
        }
    }

    /// The block of the allocation whose hook is making a solo round,
    /// [start, end), or (0, 0): a scan then leaves its bytes out of the
    /// roots. Not recorded yet, it is no block of the books, and its bytes
    /// are what the chunk held before, not the program's.
    pub fn unrecorded_block(&self) -> (u64, u64) {
        (self.round_block[0].load(Ordering::Relaxed), self.round_block[1].load(Ordering::Relaxed))
    }

    /// While solo, the next event of the malloc family does a round
    /// (async-signal-safe: one store).
    pub fn round_soon(&self) {
        if self.is_solo() {
            self.next_round.store(0, Ordering::Relaxed);
        }
    }

    /// A round now, the buffer being filled written too: `mtrace attach`'s
    /// call into an idle process with one thread (for its console and its
    /// views, which would otherwise wait for the program's next event).
    pub fn solo_round_now(&self) {
        self.solo_round_with(self.now(), None, false, 0);
    }

    /// The writer's round, by the program's thread in its hook, with the
    /// writer thread's intervals (full buffers each round, the one being
    /// filled every 50 ms).
    #[cold]
    #[inline(never)]
    fn solo_round(&self, now: u64, block: Option<(u64, u64)>, restamped: bool) {
        self.solo_round_with(now, block, restamped, QUIET_COLLECT_MS * 1_000_000);
    }

    /// [`Session::solo_round`], the buffer being filled written when
    /// `quiet_ns` passed since the last collection.
    fn solo_round_with(&self, now: u64, block: Option<(u64, u64)>, restamped: bool, quiet_ns: u64) {
        if !self.is_solo() {
            self.next_round.store(u64::MAX, Ordering::Relaxed);
            return;
        }
        // Another thread's round (a thread not seen created) is under way.
        let Some(mut r) = self.solo_rounds.try_lock() else { return };
        self.next_round.store(now + SOLO_ROUND_NS, Ordering::Relaxed);
        if restamped {
            // What the hook kept is written and its mark taken back: a
            // marker the round writes is then released to a live reader
            // at once, not at the next round.
            (crate::UP.unmark)();
        }
        let (lo, hi) = block.unwrap_or((0, 0));
        self.round_block[0].store(lo, Ordering::Relaxed);
        self.round_block[1].store(hi, Ordering::Relaxed);
        // Rounds come 5 ms apart at the least: a sample at each. A buffer
        // being filled is written every 50 ms, as by the writer thread:
        // written every round, its small zstd blocks cost cxx_work 11%
        // more instructions than the writer thread's work (callgrind).
        if !self.round(&mut r, quiet_ns, 1) {
            self.solo.store(false, Ordering::Release);
            self.next_round.store(u64::MAX, Ordering::Relaxed);
        }
        self.round_block[0].store(0, Ordering::Relaxed);
        self.round_block[1].store(0, Ordering::Relaxed);
        // What the round wrote after its collection (a marker, a scan)
        // gets its watermark now: the next round may be far off, and a
        // live reader releases records up to a watermark (order.rs).
        if r.late && self.is_solo() {
            let until = self.written_until.load(Ordering::Relaxed);
            // A watermark is the collection's start less the clocks' skew:
            // it passes what was written once that much time went by.
            while self.now() <= until + order::SKEW_NS {
                std::hint::spin_loop();
            }
            let _f = crate::platform::spin::lock_unparked(&self.file);
            if !self.is_finished() {
                self.collect(false);
            }
        }
    }
}
