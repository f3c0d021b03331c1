//! Hooks of allocators' own entry points (`mtrace_format::functions::
//! ENTRY_POINTS`): jemalloc's `*allocx`, gperftools' `tc_*`, mimalloc's
//! `mi_*`, C23's sized frees. Exported as `mtrace_ep_NAME`, never as NAME:
//! a program that probes for `mallocx` (folly does) must find only the
//! real allocator's. The GOT redirection (lifecycle/attach) points the
//! callers' slots for NAME at these, after it found the real function in
//! the global scope (`platform::real::entry_point`).

use std::ffi::c_void;

use mtrace_format::functions::{entry_point_index as at, ENTRY_POINTS};
use mtrace_format::Family;

use super::traced_realloc;
use super::{traced_free_told, traced_sampled};
use crate::platform::hook_addresses::HookAddress;
use crate::platform::real;
use crate::record::recorder;

/// The family of entry point `i`'s blocks, its row's (`Call::family`), in
/// a const context.
const fn family(i: usize) -> Family {
    match ENTRY_POINTS[i].1.family() {
        Some(f) => f,
        None => panic!("an entry point that makes no block"),
    }
}

/// The real entry point `i` as `F`, when the redirection found it.
///
/// # Safety
/// `F` is the function pointer type of entry point `i`.
#[inline(always)]
unsafe fn real<F: Copy>(i: usize) -> Option<F> {
    // SAFETY: per the contract; an address is one word, like F.
    real::entry_point(i).map(|a| unsafe { std::mem::transmute_copy::<usize, F>(&a) })
}

/// The hook of one row of `mtrace_format::with_entry_points!`, exported
/// as `mtrace_ep_NAME` (NAME with its prefix).
macro_rules! hook {
    ($p:literal (alloc $name:ident ($($a:ident: $t:ty),*) $family:ident $size:ident)) => {
        #[doc = concat!("`", $p, stringify!($name), "`, recorded as an allocation of the ", stringify!($family), " family.")]
        #[export_name = concat!("mtrace_ep_", $p, stringify!($name))]
        extern "C" fn hook($($a: $t),*) -> *mut c_void {
            const I: usize = at(concat!($p, stringify!($name)));
            type F = unsafe extern "C" fn($($t),*) -> *mut c_void;
            let size: usize = $size;
            traced_sampled(
                size,
                // SAFETY: F is the entry point's C signature.
                || match unsafe { real::<F>(I) } {
                    // SAFETY: the real function, with the caller's arguments.
                    Some(f) => unsafe { f($($a),*) },
                    None => std::ptr::null_mut(),
                },
                |&p, at| recorder::alloc(at, const { family(I) }, p, size),
            )
        }
    };
    ($p:literal (calloc $name:ident ($n:ident: $tn:ty, $size:ident: $ts:ty))) => {
        #[doc = concat!("`", $p, stringify!($name), "`, recorded as calloc is.")]
        #[export_name = concat!("mtrace_ep_", $p, stringify!($name))]
        extern "C" fn hook($n: $tn, $size: $ts) -> *mut c_void {
            const I: usize = at(concat!($p, stringify!($name)));
            type F = unsafe extern "C" fn($tn, $ts) -> *mut c_void;
            let bytes = $n.wrapping_mul($size);
            traced_sampled(
                bytes,
                // SAFETY: F is the entry point's C signature.
                || match unsafe { real::<F>(I) } {
                    // SAFETY: the real function, with the caller's arguments.
                    Some(f) => unsafe { f($n, $size) },
                    None => std::ptr::null_mut(),
                },
                |&p, at| recorder::alloc(at, const { family(I) }, p, bytes),
            )
        }
    };
    ($p:literal (realloc $name:ident ($ptr:ident: $tp:ty, $size:ident: $ts:ty $(, $a:ident: $t:ty)*))) => {
        #[doc = concat!("`", $p, stringify!($name), "`, recorded as a realloc.")]
        ///
        /// # Safety
        /// The allocator's contract for the block and arguments.
        #[export_name = concat!("mtrace_ep_", $p, stringify!($name))]
        unsafe extern "C" fn hook($ptr: $tp, $size: $ts $(, $a: $t)*) -> *mut c_void {
            const I: usize = at(concat!($p, stringify!($name)));
            type F = unsafe extern "C" fn($tp, $ts $(, $t)*) -> *mut c_void;
            traced_realloc($ptr, $size, |p, size| {
                // SAFETY: F is the entry point's C signature.
                match unsafe { real::<F>(I) } {
                    // SAFETY: the real function, with the caller's arguments.
                    Some(f) => unsafe { f(p, size $(, $a)*) },
                    None => std::ptr::null_mut(),
                }
            })
        }
    };
    ($p:literal (free $name:ident ($ptr:ident: $tp:ty $(, $a:ident: $t:ty)*) $family:ident)) => {
        hook!(@free $p $name ($ptr: $tp $(, $a: $t)*) $family (0, 0));
    };
    ($p:literal (free $name:ident ($ptr:ident: $tp:ty $(, $a:ident: $t:ty)*) $family:ident told $told:ident)) => {
        hook!(@free $p $name ($ptr: $tp $(, $a: $t)*) $family ($told, 0));
    };
    (@free $p:literal $name:ident ($ptr:ident: $tp:ty $(, $a:ident: $t:ty)*) $family:ident $told:expr) => {
        #[doc = concat!("`", $p, stringify!($name), "`, recorded as a free of the ", stringify!($family), " family.")]
        ///
        /// # Safety
        /// The allocator's contract for the block and arguments.
        #[export_name = concat!("mtrace_ep_", $p, stringify!($name))]
        unsafe extern "C" fn hook($ptr: $tp $(, $a: $t)*) {
            const I: usize = at(concat!($p, stringify!($name)));
            type F = unsafe extern "C" fn($tp $(, $t)*);
            traced_free_told(const { family(I) }, $ptr, $told, false, || {
                // SAFETY: F is the entry point's C signature.
                if let Some(f) = unsafe { real::<F>(I) } {
                    // SAFETY: the real function, with the caller's arguments.
                    unsafe { f($ptr $(, $a)*) }
                }
            })
        }
    };
    ($p:literal (posix_memalign $name:ident ($out:ident: $to:ty, $align:ident: $ta:ty, $size:ident: $ts:ty))) => {
        #[doc = concat!("`", $p, stringify!($name), "`, recorded as posix_memalign is.")]
        ///
        /// # Safety
        /// `out` is a valid pointer to write the block's address to.
        #[export_name = concat!("mtrace_ep_", $p, stringify!($name))]
        unsafe extern "C" fn hook($out: $to, $align: $ta, $size: $ts) -> i32 {
            const I: usize = at(concat!($p, stringify!($name)));
            type F = unsafe extern "C" fn($to, $ta, $ts) -> i32;
            traced_sampled(
                $size,
                // SAFETY: F is the entry point's C signature.
                || match unsafe { real::<F>(I) } {
                    // SAFETY: the real function, with the caller's arguments.
                    Some(f) => unsafe { f($out, $align, $size) },
                    None => libc::ENOMEM,
                },
                // SAFETY: on success the function wrote *out.
                |&rc, at| if rc == 0 { recorder::alloc(at, const { family(I) }, unsafe { *$out }, $size) } else { (0, 0) },
            )
        }
    };
}

/// Every entry point's hook, from the one table: each row's hook is
/// defined in the element of [`HOOKS`] that holds its address, so that no
/// row is without its hook and no hook without its row.
macro_rules! entry_point_hooks {
    ($(($alloc:ident $p:literal ($kind:ident $name:ident $($row:tt)*)))*) => {
        /// The hook of each entry point, by its index in `ENTRY_POINTS`
        /// (both made from the one table, in its order), for the GOT
        /// redirection and the patching of the executable's (registered
        /// by the constructor: `platform::hook_addresses`).
        pub static HOOKS: [HookAddress; ENTRY_POINTS.len()] = [$({
            hook!($p ($kind $name $($row)*));
            HookAddress(hook as *const ())
        }),*];

        // Each hook's index is its row's.
        const _: () = {
            let names = [$(concat!($p, stringify!($name))),*];
            let mut i = 0;
            while i < names.len() {
                assert!(at(names[i]) == i);
                i += 1;
            }
        };
    };
}

mtrace_format::with_entry_points!(entry_point_hooks);
