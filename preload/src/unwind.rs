//! Backtrace capture on the allocation path.
//!
//! Uses libgcc's DWARF CFI unwinder through `backtrace::trace_unsynchronized`:
//! complete for code built without frame pointers, takes no global lock and
//! does not allocate. The tracer's own frames (everything inside
//! libmtrace.so at the top of the stack) are dropped.

use std::sync::atomic::{AtomicUsize, Ordering};

static OWN_LO: AtomicUsize = AtomicUsize::new(0);
static OWN_HI: AtomicUsize = AtomicUsize::new(0);

/// Finds this library's address range; call once before the first capture.
pub fn init() {
    if OWN_HI.load(Ordering::Acquire) != 0 {
        return;
    }
    if let Some((lo, hi)) = crate::modules::range_of(init as fn() as usize) {
        OWN_LO.store(lo, Ordering::Release);
        OWN_HI.store(hi, Ordering::Release);
    }
}

/// Writes up to `depth` return addresses, innermost first, into `out` and
/// returns how many. `out` must hold at least `depth` entries.
#[inline(never)]
pub fn capture(out: &mut [u64], depth: usize) -> usize {
    let (lo, hi) = (OWN_LO.load(Ordering::Relaxed) as u64, OWN_HI.load(Ordering::Relaxed) as u64);
    let depth = depth.min(out.len());
    let mut n = 0;
    let mut ours = true;
    // SAFETY: trace_unsynchronized is unsafe only because it must not run
    // concurrently with itself on platforms whose unwinder is not
    // thread-safe; libgcc's is.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as u64;
            if ip == 0 {
                return false;
            }
            if ours && ip >= lo && ip < hi {
                return true;
            }
            ours = false;
            out[n] = ip;
            n += 1;
            n < depth
        });
    }
    n
}
