//! Hooks of deallocation functions that several families share: gperftools'
//! tcmalloc and mimalloc define `free` and `operator delete` as one
//! function (aliases at one address). Patched into an executable that
//! defines such a function (lifecycle/patch/), its hook cannot tell which
//! of the names the program called, so the free is recorded with
//! `Family::Shared`, never judged mismatched. One slot per such function,
//! holding its original, by the most arguments its names take: the
//! hook passes them all on, which on the x86-64 System V ABI (arguments
//! in registers, the caller's to clean up) is the same call for a name
//! that takes fewer — the registers it does not read are left as they
//! were, as an alias of the function would leave them.

use std::ffi::c_void;

use mtrace_format::Family;

use super::traced_free;
use crate::platform::hook_addresses::{shared_free_original, HookAddress, SHARED_FREE_SLOTS as SLOTS};
use crate::platform::real;

/// The original of slot `i` as `F`.
///
/// # Safety
/// `F` is the signature of the function slot `i` holds.
#[inline(always)]
unsafe fn original<F: Copy>(i: usize) -> Option<F> {
    let a = shared_free_original(i);
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

/// One hook address per slot, from `free::<I>` for each I (as many as
/// the array's type asks: [`SLOTS`]).
macro_rules! slots {
    ($free:ident, $($i:literal)*) => {
        [$(HookAddress($free::<$i> as *const ())),*]
    };
}

/// The hooks by count of arguments (1 to 3, at 0 to 2) and slot: the
/// patch of a shared free with `n` arguments claims a slot `i`
/// (`platform::hook_addresses::claim_shared_free`) and jumps to
/// `HOOKS[n - 1][i]`, which calls that slot's original.
pub static HOOKS: [[HookAddress; SLOTS]; 3] =
    [slots!(free1, 0 1 2 3 4 5 6 7), slots!(free2, 0 1 2 3 4 5 6 7), slots!(free3, 0 1 2 3 4 5 6 7)];
