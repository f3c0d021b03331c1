//! Backtrace capture on the allocation path.
//!
//! Two unwinders, both driven by DWARF CFI so that code built without frame
//! pointers unwinds completely:
//! - `fast` (x86_64): framehop, with each module's `.eh_frame_hdr` and
//!   `.eh_frame` copied once and every thread's rule cache kept between
//!   calls; the default.
//! - `libgcc`: libgcc's `_Unwind_Backtrace`, which parses the CFI again on
//!   every call (about 125 ns per frame here). Used where the fast one
//!   cannot run (other architectures, a thread whose state is gone) and with
//!   `MTRACE_UNWINDER=libgcc`, as an independent check of the fast one.
//!
//! Both drop the tracer's own frames (everything inside libmtrace.so at the
//! top of the stack) and return return addresses, innermost first.

#[cfg(target_arch = "x86_64")]
pub mod fast;
pub mod libgcc;

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

/// Copies the addresses `frames` yields into `out`, dropping the leading
/// ones inside this library, up to `depth`; returns how many were written.
#[inline]
pub fn collect(out: &mut [u64], depth: usize, frames: impl Iterator<Item = u64>) -> usize {
    let (lo, hi) = (OWN_LO.load(Ordering::Relaxed) as u64, OWN_HI.load(Ordering::Relaxed) as u64);
    let depth = depth.min(out.len());
    let mut n = 0;
    for ip in frames.skip_while(|&ip| ip >= lo && ip < hi) {
        if ip == 0 || n == depth {
            break;
        }
        out[n] = ip;
        n += 1;
    }
    n
}
