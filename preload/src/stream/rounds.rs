//! The stream's half of a writer's round (the session room drives the
//! rounds: session/writer.rs, session/solo.rs): the list of modules
//! written when it changed, every thread's buffer collected when one is
//! full or a while has passed, an RSS sample; and what a process with one
//! thread keeps to know when its own thread's next round is due.

use std::sync::atomic::Ordering;

use super::Session;
use crate::platform::sys;

/// While idle, an RSS sample at least every this many sampling rounds (1 s).
const IDLE_SAMPLE_EVERY: u64 = 100;

/// What the writer's rounds carry from one to the next.
pub struct Rounds {
    /// Rounds begun so far.
    pub round: u64,
    /// Bytes of a command line not complete yet.
    pub commands: Vec<u8>,
    /// RSS samples: every `sample_every` rounds while events come or the
    /// RSS changes; while the program is idle, at twice the interval
    /// each time up to once a second (an idle daemon's trace grew 5 MB
    /// an hour with a sample every 10 ms).
    active: bool,
    last_rss: u64,
    idle_rounds: u64,
    idle_every: u64,
    /// When the buffers were last collected, ns.
    last_collect: u64,
    /// The last round wrote records after its collection (a marker, a
    /// scan): no watermark covers them yet.
    pub late: bool,
}

impl Rounds {
    pub const fn new() -> Rounds {
        Rounds {
            round: 0,
            commands: Vec::new(),
            active: false,
            last_rss: 0,
            idle_rounds: 0,
            idle_every: 1,
            last_collect: 0,
            late: false,
        }
    }
}

impl Session {
    /// The stream's part of round `r` (the session counted it): `modules`
    /// (the list's records, when it changed) written, the buffers
    /// collected when one is full or `quiet_ns` passed since the last
    /// collection, an RSS sample every `sample_every` rounds, the records
    /// of programs spawned meanwhile. `None` once the final flush began;
    /// else the time every record written so far is stamped before (ns),
    /// for [`Session::written_after`].
    pub fn write_round(
        &self,
        r: &mut Rounds,
        modules: Option<Vec<u8>>,
        quiet_ns: u64,
        sample_every: u64,
    ) -> Option<u64> {
        {
            self.let_waiters_first();
            // A program's thread comes here from a hook (platform/spin.rs: why not park).
            let _f = crate::platform::spin::lock_unparked(&self.file);
            if self.is_finished() {
                return None;
            }
            if let Some(m) = modules {
                self.write_unordered(&m);
            }
            let now = self.now();
            if self.pending.load(Ordering::Relaxed) > 0 || now >= r.last_collect + quiet_ns {
                r.active |= self.collect(false) > 0;
                r.last_collect = now;
            }
            if r.round.is_multiple_of(sample_every) {
                let rss = sys::rss_bytes();
                r.idle_rounds += 1;
                let busy = r.active || rss != Some(r.last_rss);
                if busy || r.idle_rounds >= r.idle_every {
                    if let Some(rss) = rss {
                        self.write_sample(rss);
                        r.last_rss = rss;
                    }
                    r.idle_every = if busy { 1 } else { (r.idle_every * 2).min(IDLE_SAMPLE_EVERY) };
                    (r.active, r.idle_rounds) = (false, 0);
                }
            }
        }
        let spawned = self.spawned_records();
        if !spawned.is_empty() {
            self.let_waiters_first();
            let _f = crate::platform::spin::lock_unparked(&self.file);
            self.write_unordered(&spawned);
        }
        Some(self.written_until.load(Ordering::Relaxed))
    }

    /// Whether records were written after `until` (from
    /// [`Session::write_round`]) outside a collection: a marker, a scan.
    pub fn written_after(&self, until: u64) -> bool {
        self.written_until.load(Ordering::Relaxed) > until
    }

    /// Refits the clock's rate to the monotonic clock (once a round).
    pub fn refit_clock(&self) {
        self.clock.refit();
    }

    /// Whether the session has no writer thread (see [`Session::solo`]).
    pub fn is_solo(&self) -> bool {
        self.solo.load(Ordering::Acquire)
    }

    /// Before an event of the malloc family stamped `now` (ns), made
    /// outside the program's allocator: whether the process's own thread
    /// is due for the writer's round (while solo: every
    /// [`super::WRITER_POLL_MS`], or at once after full buffers passed 1
    /// MiB, a signal asked for a report or a scan, or a thread not seen
    /// being created wants the writer thread). One load and a compare.
    #[inline(always)]
    pub fn round_due(&self, now: u64) -> bool {
        now >= self.next_round.load(Ordering::Relaxed)
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

    /// A thread not seen being created made its first event while the
    /// process was solo: the next round (due at once) starts the writer
    /// thread ([`Session::take_writer_wanted`]).
    pub fn want_writer(&self) {
        self.writer_wanted.store(true, Ordering::Release);
        self.next_round.store(0, Ordering::Relaxed);
    }

    /// True once after [`Session::want_writer`].
    pub fn take_writer_wanted(&self) -> bool {
        self.writer_wanted.load(Ordering::Relaxed) && self.writer_wanted.swap(false, Ordering::AcqRel)
    }
}
