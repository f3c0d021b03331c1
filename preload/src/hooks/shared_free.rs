//! Hooks of deallocation functions that several families share: gperftools'
//! tcmalloc and mimalloc define `free` and `operator delete` as one
//! function (aliases at one address). Patched into an executable that
//! defines such a function (lifecycle/patch.rs), its hook cannot tell which
//! of the names the program called, so the free is recorded with
//! `Family::Shared`, never judged mismatched. One slot per such function,
//! holding its original, by the most arguments its names take: the
//! hook passes them all on, which on the x86-64 System V ABI (arguments
//! in registers, the caller's to clean up) is the same call for a name
//! that takes fewer — the registers it does not read are left as they
//! were, as an alias of the function would leave them.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

use mtrace_format::Family;

use super::traced_free;
use crate::platform::real;

/// Functions of this kind one process may have (tcmalloc has two: the
/// plain and the sized free).
const SLOTS: usize = 8;

/// Each slot's original function (0: free slot).
static ORIGINAL: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

/// The original of slot `i` as `F`.
///
/// # Safety
/// `F` is the signature of the function slot `i` holds.
#[inline(always)]
unsafe fn original<F: Copy>(i: usize) -> Option<F> {
    let a = ORIGINAL[i].load(Ordering::Acquire);
    // SAFETY: per the contract; an address is one word, like F.
    (a != 0).then(|| unsafe { std::mem::transmute_copy::<usize, F>(&a) })
}

/// A free of one argument (`free`, `operator delete(void*)`).
unsafe extern "C" fn free1<const I: usize>(p: *mut c_void) {
    if real::in_arena(p) {
        return;
    }
    traced_free(Family::Shared, p, true, || {
        // SAFETY: slot I holds a function of this signature.
        if let Some(f) = unsafe { original::<unsafe extern "C" fn(*mut c_void)>(I) } {
            // SAFETY: the original, with the caller's arguments.
            unsafe { f(p) }
        }
    })
}

/// A free of two arguments (a sized free, `operator delete(void*, size_t)`).
unsafe extern "C" fn free2<const I: usize>(p: *mut c_void, a: usize) {
    traced_free(Family::Shared, p, true, || {
        // SAFETY: slot I holds a function of this signature.
        if let Some(f) = unsafe { original::<unsafe extern "C" fn(*mut c_void, usize)>(I) } {
            // SAFETY: the original, with the caller's arguments.
            unsafe { f(p, a) }
        }
    })
}

/// A free of three arguments (sized and aligned).
unsafe extern "C" fn free3<const I: usize>(p: *mut c_void, a: usize, b: usize) {
    traced_free(Family::Shared, p, true, || {
        // SAFETY: slot I holds a function of this signature.
        if let Some(f) = unsafe { original::<unsafe extern "C" fn(*mut c_void, usize, usize)>(I) } {
            // SAFETY: the original, with the caller's arguments.
            unsafe { f(p, a, b) }
        }
    })
}

type Free1 = unsafe extern "C" fn(*mut c_void);
type Free2 = unsafe extern "C" fn(*mut c_void, usize);
type Free3 = unsafe extern "C" fn(*mut c_void, usize, usize);

const FREE1: [Free1; SLOTS] =
    [free1::<0>, free1::<1>, free1::<2>, free1::<3>, free1::<4>, free1::<5>, free1::<6>, free1::<7>];
const FREE2: [Free2; SLOTS] =
    [free2::<0>, free2::<1>, free2::<2>, free2::<3>, free2::<4>, free2::<5>, free2::<6>, free2::<7>];
const FREE3: [Free3; SLOTS] =
    [free3::<0>, free3::<1>, free3::<2>, free3::<3>, free3::<4>, free3::<5>, free3::<6>, free3::<7>];

/// The hook of a shared free of `args` arguments (1 to 3) whose original
/// is `original`, in a slot of its own; `None` when `args` is out of range
/// or every slot is taken.
pub fn hook(args: usize, original: usize) -> Option<usize> {
    if !(1..=3).contains(&args) {
        return None;
    }
    let i =
        ORIGINAL.iter().position(|s| s.compare_exchange(0, original, Ordering::AcqRel, Ordering::Acquire).is_ok())?;
    Some(match args {
        1 => FREE1[i] as *const () as usize,
        2 => FREE2[i] as *const () as usize,
        _ => FREE3[i] as *const () as usize,
    })
}
