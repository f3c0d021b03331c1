//! The C allocation functions: malloc, free, calloc, realloc, reallocarray,
//! the aligned family, cfree and malloc_usable_size.

use std::ffi::c_void;

use mtrace_format::functions::{interposed, interposed_family, Call};
use mtrace_format::Family;

use super::{traced_free, traced_realloc, traced_sampled};
use crate::platform::real::{self, cstr, next, NextFn};
use crate::record::recorder;

// Each hook's family is the functions' table's
// (`mtrace_format::functions::INTERPOSED`), read at compile time.

#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    const FAMILY: Family = interposed_family("malloc");
    traced_sampled(size, || real::malloc(size), |&p, at| recorder::alloc(at, FAMILY, p, size))
}

/// # Safety
/// `p` is null or a block from this allocator (the C contract of free).
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() || real::in_arena(p) {
        return;
    }
    const FAMILY: Family = interposed_family("free");
    // SAFETY: forwarded under the caller's contract.
    traced_free(FAMILY, p, false, || unsafe { real::free(p) })
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
    const FAMILY: Family = interposed_family("calloc");
    let total = n.wrapping_mul(size);
    traced_sampled(total, || real::calloc(n, size), |&p, at| recorder::alloc(at, FAMILY, p, total))
}

/// # Safety
/// `p` is null or a live block from this allocator.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: forwarded under the caller's contract.
    traced_realloc(p, size, |p, size| unsafe { real::realloc(p, size) })
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

/// A hook of the aligned family (`aligned_alloc(align, size)`,
/// `memalign(align, size)`, `valloc(size)`, `pvalloc(size)`), forwarding
/// to the next definition of its symbol (one `NextFn` each); its family
/// and which argument is the size are the functions' table's.
macro_rules! aligned_hook {
    ($name:ident($($arg:ident),+)) => {
        #[no_mangle]
        pub extern "C" fn $name($($arg: usize),+) -> *mut c_void {
            static NEXT: NextFn = NextFn::new(cstr(concat!(stringify!($name), "\0").as_bytes()));
            const CALL: (Family, usize) = match interposed(stringify!($name)) {
                Call::Alloc { family, size } => (family, size),
                _ => panic!("not an allocation"),
            };
            type F = unsafe extern "C" fn($(aligned_hook!(@usize $arg)),+) -> *mut c_void;
            let size = [$($arg),+][CALL.1];
            // SAFETY: F is this symbol's signature (glibc's stdlib.h, malloc.h).
            let forward = || match unsafe { next::<F>(&NEXT) } {
                // SAFETY: the real function, with the arguments of the caller's C contract.
                Some(f) => unsafe { f($($arg),+) },
                None => std::ptr::null_mut(),
            };
            traced_sampled(size, forward, |&p, at| recorder::alloc(at, CALL.0, p, size))
        }
    };
    (@usize $arg:ident) => { usize };
}

aligned_hook!(aligned_alloc(align, size));
aligned_hook!(memalign(align, size));
aligned_hook!(valloc(size));
aligned_hook!(pvalloc(size));

static USABLE_SIZE: NextFn = NextFn::new(c"malloc_usable_size");

/// # Safety
/// `out` is a valid pointer to write the block's address to.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> i32;
    const FAMILY: Family = interposed_family("posix_memalign");
    traced_sampled(
        size,
        // SAFETY: F is posix_memalign's signature; out is valid per contract.
        || match unsafe { next::<F>(&crate::platform::real::POSIX_MEMALIGN) } {
            // SAFETY: the real function, with the arguments of the caller's C contract.
            Some(f) => unsafe { f(out, align, size) },
            None => libc::ENOMEM,
        },
        // SAFETY: on success posix_memalign wrote *out.
        |&rc, at| if rc == 0 { recorder::alloc(at, FAMILY, unsafe { *out }, size) } else { (0, 0) },
    )
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
