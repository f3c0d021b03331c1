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
mod cfi;
#[cfg(target_arch = "x86_64")]
pub mod fast;
pub mod libgcc;
pub mod program_frame;
#[cfg(target_arch = "x86_64")]
mod rule_cache;
#[cfg(target_arch = "x86_64")]
mod walk;

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::platform::config::MAX_DEPTH;
/// The closed set of unwinders, defined with the recording configuration
/// (`MTRACE_UNWINDER`) that chooses one; matched here only.
pub use mtrace_format::recording::Unwinder;

/// What a thread unwinds with: the one place that chooses among the
/// unwinders (`MTRACE_UNWINDER`, [`Unwinder`]); a new unwinder is a
/// variant there and an arm here.
pub struct Unwinding {
    /// The backtrace being recorded (a field, not a local: no 2 KiB of
    /// zeroes per event).
    frames: Box<[u64; MAX_DEPTH]>,
    /// The fast unwinder, made on this thread's first backtrace.
    #[cfg(target_arch = "x86_64")]
    fast: Option<fast::ThreadUnwinder>,
}

impl Default for Unwinding {
    fn default() -> Unwinding {
        Unwinding {
            frames: Box::new([0; MAX_DEPTH]),
            #[cfg(target_arch = "x86_64")]
            fast: None,
        }
    }
}

impl Unwinding {
    /// This thread's backtrace from the hook's frame `at`, at most `depth`
    /// frames, with unwinder `kind`; returns how many frames
    /// [`Unwinding::frames`] then holds.
    #[inline]
    pub fn capture(&mut self, kind: Unwinder, depth: usize, at: Here) -> usize {
        match kind {
            Unwinder::Libgcc => libgcc::capture(&mut self.frames[..], depth),
            Unwinder::Fast | Unwinder::Check => {
                #[cfg(target_arch = "x86_64")]
                {
                    if self.fast.is_none() {
                        self.fast = fast::ThreadUnwinder::new();
                    }
                    if let Some(n) = self.fast.as_mut().and_then(|u| u.capture(&mut self.frames[..], depth, at)) {
                        if kind == Unwinder::Check {
                            check(&self.frames[..n], depth);
                        }
                        return n;
                    }
                }
                // Where the fast unwinder is not (other CPUs) or cannot
                // walk this stack: libgcc's.
                let _ = at;
                libgcc::capture(&mut self.frames[..], depth)
            }
        }
    }

    /// The first `n` frames of the last [`Unwinding::capture`] (return
    /// addresses, innermost first).
    #[inline]
    pub fn frames(&self, n: usize) -> &[u64] {
        &self.frames[..n]
    }
}

static OWN_LO: AtomicUsize = AtomicUsize::new(0);
static OWN_HI: AtomicUsize = AtomicUsize::new(0);

/// Finds this library's address range; call once before the first capture.
pub fn init() {
    if OWN_HI.load(Ordering::Acquire) != 0 {
        return;
    }
    if let Some((lo, hi)) = crate::platform::modules::range_of(init as fn() as usize) {
        OWN_LO.store(lo, Ordering::Release);
        OWN_HI.store(hi, Ordering::Release);
    }
}

/// Where a backtrace starts: the registers of the hook's own frame, read
/// in the hook itself. The fast unwinder walks from there rather than from
/// its own frame, so the tracer's frames between the hook and the unwinder
/// (three or four on the allocation path) are not unwound on every call.
/// Only valid while the frame that read it is live.
#[derive(Clone, Copy)]
pub struct Here {
    #[cfg(target_arch = "x86_64")]
    regs: walk::Regs,
}

impl Here {
    /// The caller's registers (it is inlined into the caller).
    #[inline(always)]
    pub fn now() -> Here {
        #[cfg(target_arch = "x86_64")]
        {
            let (ip, sp, bp): (u64, u64, u64);
            // SAFETY: reads three registers; no memory access.
            unsafe {
                std::arch::asm!("lea {0}, [rip]", "mov {1}, rsp", "mov {2}, rbp",
                    out(reg) ip, out(reg) sp, out(reg) bp, options(nomem, nostack, preserves_flags));
            }
            Here { regs: walk::Regs { ip, sp, bp } }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Here {}
    }
}

static CHECKED: AtomicUsize = AtomicUsize::new(0);
static DIFFERED: AtomicUsize = AtomicUsize::new(0);
/// Differences printed in full; the rest are only counted.
const SHOWN: usize = 5;

/// `MTRACE_UNWINDER=check`: compares the fast unwinder's `frames` with
/// libgcc's backtrace of the same call (up to `depth`), printing the first
/// few that differ on stderr.
#[inline(never)]
pub fn check(frames: &[u64], depth: usize) {
    let mut theirs = [0u64; crate::platform::config::MAX_DEPTH];
    let n = libgcc::capture(&mut theirs, depth);
    CHECKED.fetch_add(1, Ordering::Relaxed);
    if frames != &theirs[..n] && DIFFERED.fetch_add(1, Ordering::Relaxed) < SHOWN {
        crate::platform::sys::warn(&format!("unwinder check: fast {frames:x?}\n  libgcc {:x?}", &theirs[..n]));
    }
}

/// The line `MTRACE_UNWINDER=check` prints at exit.
pub fn check_summary() -> String {
    let (checked, differed) = (CHECKED.load(Ordering::Relaxed), DIFFERED.load(Ordering::Relaxed));
    format!("unwinder check: {differed} of {checked} backtraces differ from libgcc's")
}

/// This library's address range [lo, hi); (0, 0) before [`init`].
#[inline]
pub fn own_range() -> (u64, u64) {
    (OWN_LO.load(Ordering::Relaxed) as u64, OWN_HI.load(Ordering::Relaxed) as u64)
}

/// Copies the addresses `frames` yields into `out`, dropping the leading
/// ones inside this library, up to `depth`; returns how many were written.
#[inline]
pub fn collect(out: &mut [u64], depth: usize, frames: impl Iterator<Item = u64>) -> usize {
    let (lo, hi) = own_range();
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
