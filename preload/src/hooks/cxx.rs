//! C++ `operator new` and `operator delete`, every replaceable variant
//! (Itanium C++ ABI names for a 64-bit `size_t`). Each forwards to the next
//! definition (libstdc++'s), so new-handlers and `std::bad_alloc` behave as
//! without the tracer; that is why the new hooks use the "C-unwind" ABI: the
//! exception may pass through them. libstdc++'s new then calls malloc, which
//! this thread's guard forwards untraced.

use std::ffi::{c_void, CStr};

use mtrace_format::Family;

use super::traced_free;
use crate::real::{self, next, NextFn};
use crate::recorder;

const fn cstr(b: &'static [u8]) -> &'static CStr {
    match CStr::from_bytes_with_nul(b) {
        Ok(c) => c,
        Err(_) => panic!("symbol name without NUL"),
    }
}

macro_rules! new_hook {
    ($sym:literal, $name:ident, $family:expr, $fallback:expr, ($($arg:ident : $ty:ty),*)) => {
        /// Traced C++ allocation function; forwards to the next definition.
        #[export_name = $sym]
        pub extern "C-unwind" fn $name(size: usize $(, $arg: $ty)*) -> *mut c_void {
            static NEXT: NextFn = NextFn::new(cstr(concat!($sym, "\0").as_bytes()));
            type F = unsafe extern "C-unwind" fn(usize $(, $ty)*) -> *mut c_void;
            NEXT.resolve_tracked();
            super::traced_as(
                true,
                // SAFETY: F is this symbol's signature in the C++ ABI.
                || match unsafe { next::<F>(&NEXT) } {
                    Some(f) => unsafe { f(size $(, $arg)*) },
                    None => $fallback(size $(, $arg)*),
                },
                |&p, at| recorder::alloc(at, $family, p, size),
            )
        }
    };
}

macro_rules! delete_hook {
    ($sym:literal, $name:ident, $family:expr, ($($arg:ident : $ty:ty),*)) => {
        /// Traced C++ deallocation function; forwards to the next definition.
        ///
        /// # Safety
        /// `p` is null or a block from the matching `operator new`.
        #[export_name = $sym]
        pub unsafe extern "C" fn $name(p: *mut c_void $(, $arg: $ty)*) {
            static NEXT: NextFn = NextFn::new(cstr(concat!($sym, "\0").as_bytes()));
            type F = unsafe extern "C" fn(*mut c_void $(, $ty)*);
            $(let _ = &$arg;)*
            NEXT.resolve_tracked();
            traced_free($family, p, true, || {
                // SAFETY: F is this symbol's signature; p per the caller's contract.
                match unsafe { next::<F>(&NEXT) } {
                    Some(f) => unsafe { f(p $(, $arg)*) },
                    None => unsafe { real::free(p) },
                }
            })
        }
    };
}

type Nothrow = *const c_void;

fn plain(size: usize) -> *mut c_void {
    real::malloc(size)
}
fn plain_nt(size: usize, _: Nothrow) -> *mut c_void {
    real::malloc(size)
}
fn aligned(size: usize, align: usize) -> *mut c_void {
    real::memalign(align, size)
}
fn aligned_nt(size: usize, align: usize, _: Nothrow) -> *mut c_void {
    real::memalign(align, size)
}

new_hook!("_Znwm", new, Family::New, plain, ());
new_hook!("_Znam", new_array, Family::NewArray, plain, ());
new_hook!("_ZnwmRKSt9nothrow_t", new_nothrow, Family::New, plain_nt, (nt: Nothrow));
new_hook!("_ZnamRKSt9nothrow_t", new_array_nothrow, Family::NewArray, plain_nt, (nt: Nothrow));
new_hook!("_ZnwmSt11align_val_t", new_aligned, Family::New, aligned, (align: usize));
new_hook!("_ZnamSt11align_val_t", new_array_aligned, Family::NewArray, aligned, (align: usize));
new_hook!("_ZnwmSt11align_val_tRKSt9nothrow_t", new_aligned_nothrow, Family::New, aligned_nt, (align: usize, nt: Nothrow));
new_hook!("_ZnamSt11align_val_tRKSt9nothrow_t", new_array_aligned_nothrow, Family::NewArray, aligned_nt, (align: usize, nt: Nothrow));

delete_hook!("_ZdlPv", delete, Family::New, ());
delete_hook!("_ZdaPv", delete_array, Family::NewArray, ());
delete_hook!("_ZdlPvm", delete_sized, Family::New, (size: usize));
delete_hook!("_ZdaPvm", delete_array_sized, Family::NewArray, (size: usize));
delete_hook!("_ZdlPvRKSt9nothrow_t", delete_nothrow, Family::New, (nt: Nothrow));
delete_hook!("_ZdaPvRKSt9nothrow_t", delete_array_nothrow, Family::NewArray, (nt: Nothrow));
delete_hook!("_ZdlPvSt11align_val_t", delete_aligned, Family::New, (align: usize));
delete_hook!("_ZdaPvSt11align_val_t", delete_array_aligned, Family::NewArray, (align: usize));
delete_hook!("_ZdlPvmSt11align_val_t", delete_sized_aligned, Family::New, (size: usize, align: usize));
delete_hook!("_ZdaPvmSt11align_val_t", delete_array_sized_aligned, Family::NewArray, (size: usize, align: usize));
delete_hook!("_ZdlPvSt11align_val_tRKSt9nothrow_t", delete_aligned_nothrow, Family::New, (align: usize, nt: Nothrow));
delete_hook!("_ZdaPvSt11align_val_tRKSt9nothrow_t", delete_array_aligned_nothrow, Family::NewArray, (align: usize, nt: Nothrow));
