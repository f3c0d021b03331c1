//! The event clock: nanoseconds since the session's start.
//!
//! Every event reads it once, so its cost is per event: clock_gettime
//! (CLOCK_MONOTONIC through the vDSO) costs 24 ns here, `lfence; rdtsc`
//! 17 ns and a bare `rdtsc` 10 ns (a 20M-iteration C loop on this machine).
//! Where the time stamp counter is invariant (CPUID 8000_0007H EDX bit 8:
//! constant rate, runs in deep C-states) and the kernel itself keeps time
//! with it (clocksource "tsc"), events read the TSC and convert with a line
//! (ns = base_ns + (tsc − base_tsc) · mult / 2³²) fitted to CLOCK_MONOTONIC:
//! 50 µs of calibration at start, then refitted by the writer thread every
//! round over everything since the start, so its error shrinks as the run
//! goes on (each refit starts where the previous line is at that moment, so
//! times never go back). Elsewhere, or with `MTRACE_CLOCK=monotonic`,
//! events read CLOCK_MONOTONIC.
//!
//! Ordering across threads is not the clock's job: a bare `rdtsc` may run
//! some tens of cycles early, so a consumer's free of a block can be
//! stamped a few ns before the producer's malloc of it (11 ns seen, a
//! producer/consumer program handing 2,000,000 blocks over, 1 run in 11).
//! The analyzer merges the threads' events by time up to the watermarks
//! (stream/order.rs), and orders events of different threads closer than
//! `EPS` (250 ns) by the allocator's contract (analysis/src/books/ties.rs).
//! Until they did, every stamp was `lfence; rdtsc` (17 ns against 10).
//! Invariant TSCs of one machine are synchronized across cores.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::platform::sys;

/// The session's clock.
pub struct Clock {
    /// CLOCK_MONOTONIC at the session's start, ns.
    start_mono: u64,
    tsc: Option<TscLine>,
}

/// The TSC → ns line, a seqlock: `seq` is odd while the writer changes it.
struct TscLine {
    seq: AtomicU64,
    base_tsc: AtomicU64,
    base_ns: AtomicU64,
    /// ns per tick · 2³².
    mult: AtomicU64,
    /// The first calibration pair (tsc, ns since start): refits measure
    /// from here.
    origin: (u64, u64),
}

/// Calibration time at start, ns: spent by every traced process before
/// its first event. 50 µs puts the first line's slope within about 4·10⁻⁴
/// (a pair is read within some 10 ns), at most 2 µs off by the writer's
/// first refit 5 ms later. It was 200 µs: a tenth of the whole cost
/// `perf stat` measured for tracing a program that makes one malloc.
const CALIBRATE_NS: u64 = 50_000;

impl Clock {
    /// A clock whose zero is `start_mono` (CLOCK_MONOTONIC, ns); uses the
    /// TSC when `allow_tsc` and the machine's TSC is fit for it.
    pub fn new(start_mono: u64, allow_tsc: bool) -> Clock {
        let tsc = (allow_tsc && tsc_usable()).then(|| TscLine::calibrate(start_mono));
        Clock { start_mono, tsc }
    }

    /// Whether events read the TSC.
    #[cfg(test)]
    pub fn uses_tsc(&self) -> bool {
        self.tsc.is_some()
    }

    /// Now, ns since the start, read after everything before it completed.
    #[inline]
    pub fn now(&self) -> u64 {
        match &self.tsc {
            Some(l) => l.at(tsc),
            None => sys::monotonic_ns().saturating_sub(self.start_mono),
        }
    }

    /// The session time of CLOCK_MONOTONIC's `mono_ns` (ns): for a moment
    /// taken where the clock could not be (a vfork child's exec).
    pub fn of_monotonic(&self, mono_ns: u64) -> u64 {
        mono_ns.saturating_sub(self.start_mono)
    }

    /// Refits the line to CLOCK_MONOTONIC (the writer thread, every round).
    pub fn refit(&self) {
        if let Some(l) = &self.tsc {
            l.refit(self.start_mono);
        }
    }
}

impl TscLine {
    fn calibrate(start_mono: u64) -> TscLine {
        let origin = pair(start_mono);
        let mut last = origin;
        while last.1 < origin.1 + CALIBRATE_NS {
            last = pair(start_mono);
        }
        let line = TscLine {
            seq: AtomicU64::new(0),
            base_tsc: AtomicU64::new(origin.0),
            base_ns: AtomicU64::new(origin.1),
            mult: AtomicU64::new(slope(origin, last)),
            origin,
        };
        line.refit(start_mono);
        line
    }

    /// ns since the start at the counter value `read()` returns.
    #[inline(always)]
    fn at(&self, read: impl Fn() -> u64) -> u64 {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            let base_tsc = self.base_tsc.load(Ordering::Relaxed);
            let base_ns = self.base_ns.load(Ordering::Relaxed);
            let mult = self.mult.load(Ordering::Relaxed);
            let t = read();
            fence(Ordering::Acquire);
            if s1 & 1 == 0 && self.seq.load(Ordering::Relaxed) == s1 {
                return base_ns + scale(t.saturating_sub(base_tsc), mult);
            }
            std::hint::spin_loop();
        }
    }

    fn refit(&self, start_mono: u64) {
        let now = pair(start_mono);
        if now.0 <= self.origin.0 || now.1 <= self.origin.1 {
            return;
        }
        let mult = slope(self.origin, now);
        // Continue from where the current line is now, with the new slope.
        let here = self.at(|| now.0);
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        self.base_tsc.store(now.0, Ordering::Relaxed);
        self.base_ns.store(here, Ordering::Relaxed);
        self.mult.store(mult, Ordering::Relaxed);
        self.seq.store(s + 2, Ordering::Release);
    }
}

/// ns for `ticks` at `mult` (ns per tick · 2³²).
#[inline(always)]
fn scale(ticks: u64, mult: u64) -> u64 {
    ((ticks as u128 * mult as u128) >> 32) as u64
}

/// ns per tick · 2³² between two (tsc, ns) pairs.
fn slope(a: (u64, u64), b: (u64, u64)) -> u64 {
    let (ticks, ns) = (b.0.saturating_sub(a.0).max(1), b.1.saturating_sub(a.1));
    (((ns as u128) << 32) / ticks as u128).min(u64::MAX as u128) as u64
}

/// A (tsc, ns since `start_mono`) pair read as close together as three
/// tries allow: the TSC is the middle of the two reads around the clock.
fn pair(start_mono: u64) -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..3 {
        let t1 = tsc();
        let ns = sys::monotonic_ns().saturating_sub(start_mono);
        let t2 = tsc();
        if t2.wrapping_sub(t1) < best.0 {
            best = (t2.wrapping_sub(t1), t1 + t2.wrapping_sub(t1) / 2, ns);
        }
    }
    (best.1, best.2)
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tsc() -> u64 {
    // SAFETY: rdtsc reads a counter, usable in user mode on Linux (CR4.TSD
    // clear), checked by tsc_usable() before any call.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc() -> u64 {
    0
}

/// The CPU's TSC is invariant and the kernel keeps time with it.
fn tsc_usable() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::__cpuid;
        let invariant = __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0;
        invariant
            && sys::read_file(c"/sys/devices/system/clocksource/clocksource0/current_clocksource").as_deref()
                == Some(b"tsc\n")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_arithmetic() {
        // 3 GHz: a third of a ns per tick.
        let m = slope((1_000, 0), (3_001_000, 1_000_000));
        assert_eq!(scale(3_000_000, m), 999_999);
        assert_eq!(scale(0, m), 0);
        // No time or no ticks: no division by zero.
        assert_eq!(slope((5, 5), (5, 5)), 0);
    }

    #[test]
    fn tsc_clock_follows_the_monotonic_clock() {
        let start = sys::monotonic_ns();
        let c = Clock::new(start, true);
        let mut last = 0;
        for _ in 0..1000 {
            let t = c.now();
            assert!(t >= last);
            last = t;
        }
        // The calibration's line alone, 5 ms on: within 50 µs (1%; about
        // 2 µs expected, see CALIBRATE_NS).
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (ours, theirs) = (c.now(), sys::monotonic_ns() - start);
        assert!(ours.abs_diff(theirs) < 50_000, "{ours} vs {theirs} before a refit (tsc: {})", c.uses_tsc());
        std::thread::sleep(std::time::Duration::from_millis(15));
        c.refit();
        let (ours, theirs) = (c.now(), sys::monotonic_ns() - start);
        // Within 50 µs of CLOCK_MONOTONIC after 20 ms (either clock).
        assert!(ours.abs_diff(theirs) < 50_000, "{ours} vs {theirs} (tsc: {})", c.uses_tsc());
        assert!(c.now() >= ours);
    }
}
