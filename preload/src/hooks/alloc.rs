//! The C allocation functions: malloc, free, calloc, realloc, reallocarray,
//! the aligned family, cfree and malloc_usable_size.

use std::ffi::c_void;

use mtrace_format::Family;

use super::{traced_free, traced_knowing, traced_sampled};
use crate::platform::real::{self, next, NextFn};
use crate::record::guard::{self, Quiet};
use crate::record::{recorder, sample, sampled};
use crate::unwind::Here;

#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    traced_sampled(size, || real::malloc(size), |&p, at| recorder::alloc(at, Family::Malloc, p, size))
}

/// # Safety
/// `p` is null or a block from this allocator (the C contract of free).
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || real::in_arena(p) {
        return;
    }
    // SAFETY: forwarded under the caller's contract.
    traced_free(Family::Malloc, p, false, || unsafe { real::free(p) })
}

/// glibc's old alias of free, still exported for old binaries.
///
/// # Safety
/// As [`free`].
#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: same contract.
    unsafe { free(p) }
}

#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let total = n.wrapping_mul(size);
    traced_sampled(total, || real::calloc(n, size), |&p, at| recorder::alloc(at, Family::Malloc, p, total))
}

/// # Safety
/// `p` is null or a live block from this allocator.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: forwarded under the caller's contract.
    traced_realloc(p, size, |p, size| unsafe { real::realloc(p, size) })
}

/// [`realloc`]'s recording around `resize`, the real function: glibc's
/// realloc, or an allocator's own (`rallocx`, `mi_realloc`), called with
/// the caller's block and size. Inlined into each hook, whose frame the
/// backtrace starts at.
#[inline(always)]
pub(super) fn traced_realloc(
    p: *mut c_void,
    size: usize,
    resize: impl Fn(*mut c_void, usize) -> *mut c_void,
) -> *mut c_void {
    // The hook's frame, for a backtrace taken before the real call.
    let here = Here::now();
    let t0 = std::cell::Cell::new(0);
    let known = std::cell::Cell::new(0);
    // Under sampling (record/sample.rs) a realloc is a free and an
    // allocation, each judged on its own: the free is recorded if the old
    // block was sampled (else `old` becomes null), the new block if it is
    // picked by its size (`new_sampled`), so that every block's weight
    // follows from its size alone.
    let old = std::cell::Cell::new(if real::in_arena(p) { std::ptr::null_mut() } else { p });
    let new_sampled = std::cell::Cell::new(true);
    // Under sampling, (old block sampled, new block picked), once decided.
    let decided = std::cell::Cell::new(None);
    let rate = sample::rate();
    if rate != 0 {
        let skip = |slot| {
            let both = (!old.get().is_null() && sampled::remove(p as u64), sample::pick(slot, size, rate));
            decided.set(Some(both));
            both == (false, false)
        };
        let call = |(), _| resize(p, size);
        if let Quiet::Ran(r) = guard::quiet(false, skip, (), call) {
            return r;
        }
    }
    traced_knowing(
        false,
        |slot| {
            if rate != 0 {
                let (old_sampled, picked) = decided.take().unwrap_or_else(|| {
                    (
                        !old.get().is_null() && sampled::remove(p as u64),
                        slot.is_none_or(|s| sample::pick(s, size, rate)),
                    )
                });
                if !old_sampled {
                    old.set(std::ptr::null_mut());
                }
                new_sampled.set(picked);
            }
            if old.get().is_null() {
                return resize(p, size);
            }
            t0.set(recorder::now());
            if slot.is_some() {
                known.set(recorder::realloc_stack(here));
            }
            // glibc may abort inside on a pointer that is no live block:
            // the fatal signal's flush then writes this free.
            recorder::realloc_begins(p, t0.get(), known.get());
            let r = resize(p, size);
            recorder::realloc_ends();
            if rate != 0 && r.is_null() && size != 0 {
                // Failed: the block is still the program's, and sampled.
                sampled::insert(p as u64);
            }
            r
        },
        |&r, at| {
            // An arena block moving to real memory is a new allocation.
            let new = if new_sampled.get() { r } else { std::ptr::null_mut() };
            recorder::realloc(at, old.get(), new, r, size, t0.get(), known.get())
        },
    )
}

/// # Safety
/// As [`realloc`].
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: same contract; glibc's reallocarray is realloc after the overflow check.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            crate::platform::sys::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

static ALIGNED_ALLOC: NextFn = NextFn::new(c"aligned_alloc");
static MEMALIGN: NextFn = NextFn::new(c"memalign");
static VALLOC: NextFn = NextFn::new(c"valloc");
static PVALLOC: NextFn = NextFn::new(c"pvalloc");
static USABLE_SIZE: NextFn = NextFn::new(c"malloc_usable_size");

type AlignFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type SizeFn = unsafe extern "C" fn(usize) -> *mut c_void;

fn call_align(f: &NextFn, align: usize, size: usize) -> *mut c_void {
    // SAFETY: aligned_alloc and memalign have the AlignFn signature.
    match unsafe { next::<AlignFn>(f) } {
        // SAFETY: plain call with value arguments.
        Some(f) => unsafe { f(align, size) },
        None => std::ptr::null_mut(),
    }
}

fn call_size(f: &NextFn, size: usize) -> *mut c_void {
    // SAFETY: valloc and pvalloc have the SizeFn signature.
    match unsafe { next::<SizeFn>(f) } {
        // SAFETY: plain call with a value argument.
        Some(f) => unsafe { f(size) },
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// `out` is a valid pointer to write the block's address to.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> i32;
    traced_sampled(
        size,
        // SAFETY: F is posix_memalign's signature; out is valid per contract.
        || match unsafe { next::<F>(&crate::platform::real::POSIX_MEMALIGN) } {
            // SAFETY: the real function, with the arguments of the caller's C contract.
            Some(f) => unsafe { f(out, align, size) },
            None => libc::ENOMEM,
        },
        // SAFETY: on success posix_memalign wrote *out.
        |&rc, at| if rc == 0 { recorder::alloc(at, Family::Aligned, unsafe { *out }, size) } else { (0, 0) },
    )
}

#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    traced_sampled(
        size,
        || call_align(&ALIGNED_ALLOC, align, size),
        |&p, at| recorder::alloc(at, Family::Aligned, p, size),
    )
}

#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    traced_sampled(size, || call_align(&MEMALIGN, align, size), |&p, at| recorder::alloc(at, Family::Aligned, p, size))
}

#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    traced_sampled(size, || call_size(&VALLOC, size), |&p, at| recorder::alloc(at, Family::Aligned, p, size))
}

#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    traced_sampled(size, || call_size(&PVALLOC, size), |&p, at| recorder::alloc(at, Family::Aligned, p, size))
}

/// Passes through (arena blocks report their requested size).
///
/// # Safety
/// `p` is null or a live block from this allocator.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if real::in_arena(p) {
        return real::arena_size(p);
    }
    type F = unsafe extern "C" fn(*mut c_void) -> usize;
    // SAFETY: F is malloc_usable_size's signature; p per contract.
    match unsafe { next::<F>(&USABLE_SIZE) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(p) },
        None => 0,
    }
}
