//! Sampled recording (`MTRACE_SAMPLE_RATE`, `--sample-rate`): which
//! allocations are recorded, by the rule of `mtrace_format::sampling`
//! (tcmalloc's and Go's: an exponential count-down of bytes per thread,
//! and every allocation of at least the rate). An allocation not picked
//! passes straight to glibc inside its hook's guard: no unwinding, no
//! clock, no record. A picked block's address goes into the set of
//! sampled blocks (sampled.rs), which its free looks up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mtrace_format::sampling;

use crate::platform::sys;
use crate::record::slot::Slot;

/// Mean bytes between samples; 0: every allocation is recorded.
static RATE: AtomicU64 = AtomicU64::new(0);
/// `MTRACE_SAMPLE_SEED`, if given.
static SEED: AtomicU64 = AtomicU64::new(0);
static SEEDED: AtomicBool = AtomicBool::new(false);
/// Threads that drew a first sample point: with a seed, the n-th such
/// thread's points come from seed and n, so that a run repeats.
static THREADS: AtomicU64 = AtomicU64::new(0);

/// Sets the rate (bytes; 0: exact) and seed as a session starts.
pub fn configure(rate: u64, seed: Option<u64>) {
    SEED.store(seed.unwrap_or(0), Ordering::Relaxed);
    SEEDED.store(seed.is_some(), Ordering::Relaxed);
    RATE.store(rate, Ordering::Release);
}

/// The mean bytes between samples; 0 when every allocation is recorded.
#[inline(always)]
pub fn rate() -> u64 {
    RATE.load(Ordering::Relaxed)
}

/// Whether the allocation of `size` bytes the hook holding `slot` makes is
/// recorded, under sampling with mean `rate` > 0 bytes: always when
/// `size ≥ rate`; else when it reaches the thread's sample point, which
/// is then drawn anew.
#[inline(always)]
pub fn pick(slot: Slot, size: usize, rate: u64) -> bool {
    let (left, rng) = slot.sampling();
    let (mut l, mut r) = (left.get(), rng.get());
    let picked = sampling::pick(&mut l, &mut r, size as u64, rate, seed);
    left.set(l);
    rng.set(r);
    picked
}

/// The random state of a thread's first sample point.
#[cold]
fn seed() -> u64 {
    let n = THREADS.fetch_add(1, Ordering::Relaxed);
    if SEEDED.load(Ordering::Relaxed) {
        SEED.load(Ordering::Relaxed) ^ n.wrapping_mul(0xd1b5_4a32_d192_ed03)
    } else {
        sys::monotonic_ns() ^ (sys::gettid() as u64) << 32
    }
}
