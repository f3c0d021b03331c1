//! Hooks of allocators' own entry points (`mtrace_format::functions::
//! ENTRY_POINTS`): jemalloc's `*allocx`, gperftools' `tc_*`, mimalloc's
//! `mi_*`, C23's sized frees. Exported as `mtrace_ep_NAME`, never as NAME:
//! a program that probes for `mallocx` (folly does) must find only the
//! real allocator's. The GOT redirection (lifecycle/attach) points the
//! callers' slots for NAME at these, after it found the real function in
//! the global scope (`platform::real::entry_point`).

use std::ffi::c_void;

use mtrace_format::functions::ENTRY_POINTS;
use mtrace_format::Family;

use super::alloc::traced_realloc;
use super::{traced_free_told, traced_sampled};
use crate::platform::real;
use crate::record::recorder;

/// The index of `name` in `ENTRY_POINTS` (a compile-time error when it is
/// not there).
const fn at(name: &str) -> usize {
    let mut i = 0;
    while i < ENTRY_POINTS.len() {
        let (n, _) = ENTRY_POINTS[i];
        if n.len() == name.len() {
            let (a, b) = (n.as_bytes(), name.as_bytes());
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not in ENTRY_POINTS")
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

/// An allocation entry point: `size` is the bytes it asks for.
macro_rules! allocating {
    ($hook:ident, $name:literal, $family:expr, ($($a:ident: $t:ty),*), $size:expr) => {
        #[doc = concat!("`", $name, "`, recorded as an allocation of the ", stringify!($family), " family.")]
        #[no_mangle]
        pub extern "C" fn $hook($($a: $t),*) -> *mut c_void {
            const I: usize = at($name);
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
                |&p, at| recorder::alloc(at, $family, p, size),
            )
        }
    };
}

/// A deallocation entry point: its first argument is the block; `told`,
/// what it is told of the block (size, alignment; 0 for what it is not).
macro_rules! freeing {
    ($hook:ident, $name:literal, $family:expr, ($p:ident $(, $a:ident: $t:ty)*)) => {
        freeing!($hook, $name, $family, ($p $(, $a: $t)*), told((0, 0)));
    };
    ($hook:ident, $name:literal, $family:expr, ($p:ident $(, $a:ident: $t:ty)*), told($told:expr)) => {
        #[doc = concat!("`", $name, "`, recorded as a free of the ", stringify!($family), " family.")]
        ///
        /// # Safety
        /// The allocator's contract for the block and arguments.
        #[no_mangle]
        pub unsafe extern "C" fn $hook($p: *mut c_void $(, $a: $t)*) {
            const I: usize = at($name);
            type F = unsafe extern "C" fn(*mut c_void $(, $t)*);
            traced_free_told($family, $p, $told, false, || {
                // SAFETY: F is the entry point's C signature.
                if let Some(f) = unsafe { real::<F>(I) } {
                    // SAFETY: the real function, with the caller's arguments.
                    unsafe { f($p $(, $a)*) }
                }
            })
        }
    };
}

/// A resizing entry point: block, new size, then its own arguments.
macro_rules! resizing {
    ($hook:ident, $name:literal, ($p:ident, $size:ident $(, $a:ident: $t:ty)*)) => {
        #[doc = concat!("`", $name, "`, recorded as a realloc.")]
        ///
        /// # Safety
        /// The allocator's contract for the block and arguments.
        #[no_mangle]
        pub unsafe extern "C" fn $hook($p: *mut c_void, $size: usize $(, $a: $t)*) -> *mut c_void {
            const I: usize = at($name);
            type F = unsafe extern "C" fn(*mut c_void, usize $(, $t)*) -> *mut c_void;
            traced_realloc($p, $size, |p, size| {
                // SAFETY: F is the entry point's C signature.
                match unsafe { real::<F>(I) } {
                    // SAFETY: the real function, with the caller's arguments.
                    Some(f) => unsafe { f(p, size $(, $a)*) },
                    None => std::ptr::null_mut(),
                }
            })
        }
    };
}

/// A `posix_memalign` of an allocator's own: `*out` gets the block.
macro_rules! posix_memaligning {
    ($hook:ident, $name:literal) => {
        #[doc = concat!("`", $name, "`, recorded as posix_memalign is.")]
        ///
        /// # Safety
        /// `out` is a valid pointer to write the block's address to.
        #[no_mangle]
        pub unsafe extern "C" fn $hook(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
            const I: usize = at($name);
            type F = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> i32;
            traced_sampled(
                size,
                // SAFETY: F is the entry point's C signature.
                || match unsafe { real::<F>(I) } {
                    // SAFETY: the real function, with the caller's arguments.
                    Some(f) => unsafe { f(out, align, size) },
                    None => libc::ENOMEM,
                },
                // SAFETY: on success the function wrote *out.
                |&rc, at| if rc == 0 { recorder::alloc(at, Family::Aligned, unsafe { *out }, size) } else { (0, 0) },
            )
        }
    };
}

/// Every entry point's hook, each listed once: the hooks, and
/// [`hook_of`] from the same list (a name left out of one would never be
/// followed, silently).
macro_rules! entry_points {
    ($($kind:ident!($hook:ident, $name:literal $($rest:tt)*);)*) => {
        $($kind!($hook, $name $($rest)*);)*

        /// The hook of entry point `name` (for the GOT redirection and
        /// the patching of the executable's, through the root's table),
        /// `None` for a name of no entry point.
        pub fn hook_of(name: &str) -> Option<usize> {
            Some(match name {
                $($name => $hook as *const () as usize,)*
                _ => return None,
            })
        }
    };
}

entry_points! {
    // jemalloc(3): `flags` are MALLOCX_* bits.
    allocating!(mtrace_ep_mallocx, "mallocx", Family::Malloc, (size: usize, flags: i32), size);
    resizing!(mtrace_ep_rallocx, "rallocx", (p, size, flags: i32));
    freeing!(mtrace_ep_sdallocx, "sdallocx", Family::Malloc, (p, size: usize, flags: i32));
    freeing!(mtrace_ep_dallocx, "dallocx", Family::Malloc, (p, flags: i32));

    // jemalloc built with a prefix: Rust's tikv-jemalloc-sys (`_rjem_`).
    allocating!(mtrace_ep__rjem_malloc, "_rjem_malloc", Family::Malloc, (size: usize), size);
    allocating!(mtrace_ep__rjem_calloc, "_rjem_calloc", Family::Malloc, (n: usize, size: usize), n.wrapping_mul(size));
    resizing!(mtrace_ep__rjem_realloc, "_rjem_realloc", (p, size));
    freeing!(mtrace_ep__rjem_free, "_rjem_free", Family::Malloc, (p));
    posix_memaligning!(mtrace_ep__rjem_posix_memalign, "_rjem_posix_memalign");
    allocating!(mtrace_ep__rjem_aligned_alloc, "_rjem_aligned_alloc", Family::Aligned, (align: usize, size: usize), size);
    allocating!(mtrace_ep__rjem_mallocx, "_rjem_mallocx", Family::Malloc, (size: usize, flags: i32), size);
    resizing!(mtrace_ep__rjem_rallocx, "_rjem_rallocx", (p, size, flags: i32));
    freeing!(mtrace_ep__rjem_sdallocx, "_rjem_sdallocx", Family::Malloc, (p, size: usize, flags: i32));
    freeing!(mtrace_ep__rjem_dallocx, "_rjem_dallocx", Family::Malloc, (p, flags: i32));

    // jemalloc built with the `je_` prefix (redis's own build, FreeBSD-style).
    allocating!(mtrace_ep_je_malloc, "je_malloc", Family::Malloc, (size: usize), size);
    allocating!(mtrace_ep_je_calloc, "je_calloc", Family::Malloc, (n: usize, size: usize), n.wrapping_mul(size));
    resizing!(mtrace_ep_je_realloc, "je_realloc", (p, size));
    freeing!(mtrace_ep_je_free, "je_free", Family::Malloc, (p));
    posix_memaligning!(mtrace_ep_je_posix_memalign, "je_posix_memalign");
    allocating!(mtrace_ep_je_aligned_alloc, "je_aligned_alloc", Family::Aligned, (align: usize, size: usize), size);
    allocating!(mtrace_ep_je_mallocx, "je_mallocx", Family::Malloc, (size: usize, flags: i32), size);
    resizing!(mtrace_ep_je_rallocx, "je_rallocx", (p, size, flags: i32));
    freeing!(mtrace_ep_je_sdallocx, "je_sdallocx", Family::Malloc, (p, size: usize, flags: i32));
    freeing!(mtrace_ep_je_dallocx, "je_dallocx", Family::Malloc, (p, flags: i32));

    // gperftools' tcmalloc.h.
    allocating!(mtrace_ep_tc_malloc, "tc_malloc", Family::Malloc, (size: usize), size);
    allocating!(mtrace_ep_tc_calloc, "tc_calloc", Family::Malloc, (n: usize, size: usize), n.wrapping_mul(size));
    resizing!(mtrace_ep_tc_realloc, "tc_realloc", (p, size));
    freeing!(mtrace_ep_tc_free, "tc_free", Family::Malloc, (p));
    freeing!(mtrace_ep_tc_free_sized, "tc_free_sized", Family::Malloc, (p, size: usize));
    allocating!(mtrace_ep_tc_memalign, "tc_memalign", Family::Aligned, (align: usize, size: usize), size);
    posix_memaligning!(mtrace_ep_tc_posix_memalign, "tc_posix_memalign");
    allocating!(mtrace_ep_tc_new, "tc_new", Family::New, (size: usize), size);
    allocating!(mtrace_ep_tc_newarray, "tc_newarray", Family::NewArray, (size: usize), size);
    freeing!(mtrace_ep_tc_delete, "tc_delete", Family::New, (p));
    freeing!(mtrace_ep_tc_deletearray, "tc_deletearray", Family::NewArray, (p));
    freeing!(mtrace_ep_tc_delete_sized, "tc_delete_sized", Family::New, (p, size: usize));
    freeing!(mtrace_ep_tc_deletearray_sized, "tc_deletearray_sized", Family::NewArray, (p, size: usize));

    // mimalloc.h: every block is mi_free's, aligned or not.
    allocating!(mtrace_ep_mi_malloc, "mi_malloc", Family::Malloc, (size: usize), size);
    allocating!(mtrace_ep_mi_zalloc, "mi_zalloc", Family::Malloc, (size: usize), size);
    allocating!(mtrace_ep_mi_calloc, "mi_calloc", Family::Malloc, (n: usize, size: usize), n.wrapping_mul(size));
    resizing!(mtrace_ep_mi_realloc, "mi_realloc", (p, size));
    freeing!(mtrace_ep_mi_free, "mi_free", Family::Malloc, (p));
    freeing!(mtrace_ep_mi_free_size, "mi_free_size", Family::Malloc, (p, size: usize));
    freeing!(mtrace_ep_mi_free_aligned, "mi_free_aligned", Family::Malloc, (p, align: usize));
    freeing!(mtrace_ep_mi_free_size_aligned, "mi_free_size_aligned", Family::Malloc, (p, size: usize, align: usize));
    allocating!(mtrace_ep_mi_malloc_aligned, "mi_malloc_aligned", Family::Malloc, (size: usize, align: usize), size);
    allocating!(mtrace_ep_mi_zalloc_aligned, "mi_zalloc_aligned", Family::Malloc, (size: usize, align: usize), size);
    resizing!(mtrace_ep_mi_realloc_aligned, "mi_realloc_aligned", (p, size, align: usize));

    // C23 (glibc 2.41): the size (and alignment) the block was allocated
    // with; a size that is not the block's is a mismatched free.
    freeing!(mtrace_ep_free_sized, "free_sized", Family::Malloc, (p, size: usize), told((size, 0)));
    freeing!(mtrace_ep_free_aligned_sized, "free_aligned_sized", Family::Malloc, (p, align: usize, size: usize), told((size, 0)));
}
