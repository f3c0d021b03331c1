//! C++ `operator new` and `operator delete`, every replaceable variant
//! (Itanium C++ ABI names for a 64-bit `size_t`). Each forwards to the next
//! definition (libstdc++'s), so new-handlers and `std::bad_alloc` behave as
//! without the tracer; that is why the new hooks use the "C-unwind" ABI: the
//! exception may pass through them. libstdc++'s new then calls malloc, which
//! this thread's guard forwards untraced.
//!
//! The plain and array forms (sized deletes included) call the real malloc
//! and free themselves where that is what libstdc++'s would do (see
//! [`direct`]); a new whose malloc fails still goes to libstdc++'s, which
//! runs the new-handler or throws. That saves the nested hook and its
//! thread-local access on every event (`__tls_get_addr` calls on cxx_work:
//! 3.70 → 2.11 M); cxx_work 300000 under the preload, `scripts/ab_preload`
//! 9–15 rounds, four runs: 0.362 → 0.344, 0.377 → 0.375, 0.366 → 0.351,
//! 0.361 → 0.343 s.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU8, Ordering};

use mtrace_format::functions::{interposed, Call};
use mtrace_format::Family;

use super::traced_free_told;
use crate::platform::real::{self, next, NextFn};
use crate::record::recorder;

macro_rules! new_hook {
    ($sym:literal, $name:ident, $fallback:expr, ($($arg:ident : $ty:ty),*), $direct:expr) => {
        /// The next definition of the operator (one per symbol: `decide`
        /// asks the same).
        mod $name {
            pub(super) static NEXT: super::NextFn = super::NextFn::new(super::real::cstr(concat!($sym, "\0").as_bytes()));
        }

        /// Traced C++ allocation function; forwards to the next definition.
        #[export_name = $sym]
        pub extern "C-unwind" fn $name(size: usize $(, $arg: $ty)*) -> *mut c_void {
            use $name::NEXT;
            type F = unsafe extern "C-unwind" fn(usize $(, $ty)*) -> *mut c_void;
            resolve_tracked(&NEXT);
            // SAFETY: F is this symbol's signature in the C++ ABI.
            let forward = || match unsafe { next::<F>(&NEXT) } {
                // SAFETY: the real function, with the arguments of the caller's C contract.
                Some(f) => unsafe { f(size $(, $arg)*) },
                None => $fallback(size $(, $arg)*),
            };
            // Its family and the argument holding the alignment asked
            // for, from the functions' table; the alignment, bytes (0: not
            // an aligned new).
            const CALL: (Family, Option<u8>) = match interposed($sym) {
                Call::New { family, align } => (family, align),
                _ => panic!("not an operator new"),
            };
            let args: &[usize] = &[size $(, $arg as usize)*];
            let align = CALL.1.map_or(0, |i| args[usize::from(i)]);
            let record = |&p: &*mut c_void, at| recorder::alloc_aligned(at, CALL.0, p, size, align);
            if $direct && direct() {
                // As libstdc++'s: a new of 0 bytes is a malloc of 1.
                let call = || match real::malloc(size.max(1)) {
                    p if p.is_null() => forward(),
                    p => p,
                };
                return super::traced_sampled(size, call, record);
            }
            super::traced_as_sampled(true, size, forward, record)
        }
    };
}

macro_rules! delete_hook {
    ($sym:literal, $name:ident, ($($arg:ident : $ty:ty),*), $direct:expr) => {
        /// The next definition of the operator (one per symbol: `decide`
        /// asks the same).
        mod $name {
            pub(super) static NEXT: super::NextFn = super::NextFn::new(super::real::cstr(concat!($sym, "\0").as_bytes()));
        }

        /// Traced C++ deallocation function; forwards to the next definition.
        ///
        /// # Safety
        /// `p` is null or a block from the matching `operator new`.
        #[export_name = $sym]
        pub unsafe extern "C" fn $name(p: *mut c_void $(, $arg: $ty)*) {
            use $name::NEXT;
            type F = unsafe extern "C" fn(*mut c_void $(, $ty)*);
            // Its family and the arguments holding what a sized or
            // aligned delete is told of the block, from the functions'
            // table; what it is told: (size, alignment), 0 for what it is
            // not told.
            const CALL: (Family, Option<u8>, Option<u8>) = match interposed($sym) {
                Call::Free { family, size, align, .. } => (family, size, align),
                _ => panic!("not an operator delete"),
            };
            let args: &[usize] = &[p as usize $(, $arg as usize)*];
            let told = (CALL.1.map_or(0, |i| args[usize::from(i)]), CALL.2.map_or(0, |i| args[usize::from(i)]));
            resolve_tracked(&NEXT);
            if $direct && direct() {
                // SAFETY: p per the caller's contract: a block of malloc.
                return traced_free_told(CALL.0, p, told, false, || unsafe { real::free(p) });
            }
            traced_free_told(CALL.0, p, told, true, || {
                // SAFETY: F is this symbol's signature; p per the caller's contract.
                match unsafe { next::<F>(&NEXT) } {
                    // SAFETY: the real function, with the arguments of the caller's C contract.
                    Some(f) => unsafe { f(p $(, $arg)*) },
                    // SAFETY: p came from the real allocator, per the caller's contract.
                    None => unsafe { real::free(p) },
                }
            })
        }
    };
}

/// Whether the plain and array forms may call the real malloc and free
/// themselves: this library's new, new[], delete, delete[], malloc and
/// free are the ones the program's calls reach (no earlier object
/// replaces them: libstdc++'s new[] calls the global new, its deletes the
/// global delete, and those call malloc and free), and the next new and
/// delete are libstdc++'s (GCC's libsupc++: `new_op.cc` loops on malloc,
/// `del_op.cc` calls free). Decided at the first call; no after an attach
/// (this library is then not in the global scope).
#[inline]
fn direct() -> bool {
    match DIRECT.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => decide_once(),
    }
}

#[cold]
fn decide_once() -> bool {
    // dlsym may allocate: inside a hook of its own, as NextFn does.
    let _g = crate::record::guard::Guard::enter();
    let yes = decide();
    DIRECT.store(if yes { 1 } else { 2 }, Ordering::Relaxed);
    yes
}

/// 0: not decided yet, 1: direct, 2: forward.
static DIRECT: AtomicU8 = AtomicU8::new(0);

fn decide() -> bool {
    let global = |name: &CStr| {
        // SAFETY: dlsym with a NUL-terminated name.
        unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
    };
    // Ours: defined in this library. (The address of an exported function
    // taken here would be the interposed one, the program's if it defines
    // its own: only the module tells.)
    let own = crate::platform::modules::range_of(decide as fn() -> bool as usize);
    let ours = |name: &CStr| own.is_some_and(|(lo, hi)| (lo..hi).contains(&global(name)));
    let names = [c"_Znwm", c"_Znam", c"_ZdlPv", c"_ZdaPv", c"malloc", c"free"];
    let in_libstdcxx = |f: &NextFn| {
        f.get().is_some_and(|a| {
            // SAFETY: dladdr with an address and an out-structure; the file
            // name it sets is a NUL-terminated string of the loader's.
            unsafe {
                let mut info: libc::Dl_info = std::mem::zeroed();
                libc::dladdr(a as *const c_void, &mut info) != 0
                    && !info.dli_fname.is_null()
                    && CStr::from_ptr(info.dli_fname).to_bytes().windows(9).any(|w| w == b"libstdc++")
            }
        })
    };
    names.iter().all(|&n| ours(n)) && in_libstdcxx(&new::NEXT) && in_libstdcxx(&delete::NEXT)
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

// Each operator's family and its arguments' roles (the alignment a new
// records, what a delete is told) are the functions' table's
// (`mtrace_format::functions::INTERPOSED`); the last argument here: whether
// the form may call the real malloc and free itself ([`direct`]).
new_hook!("_Znwm", new, plain, (), true);
new_hook!("_Znam", new_array, plain, (), true);
new_hook!("_ZnwmRKSt9nothrow_t", new_nothrow, plain_nt, (nt: Nothrow), false);
new_hook!("_ZnamRKSt9nothrow_t", new_array_nothrow, plain_nt, (nt: Nothrow), false);
new_hook!("_ZnwmSt11align_val_t", new_aligned, aligned, (align: usize), false);
new_hook!("_ZnamSt11align_val_t", new_array_aligned, aligned, (align: usize), false);
new_hook!("_ZnwmSt11align_val_tRKSt9nothrow_t", new_aligned_nothrow, aligned_nt, (align: usize, nt: Nothrow), false);
new_hook!("_ZnamSt11align_val_tRKSt9nothrow_t", new_array_aligned_nothrow, aligned_nt, (align: usize, nt: Nothrow), false);

// What a delete is told of the block gives valgrind 3.22's "Mismatched
// new/delete size value" and alignment checks.
delete_hook!("_ZdlPv", delete, (), true);
delete_hook!("_ZdaPv", delete_array, (), true);
delete_hook!("_ZdlPvm", delete_sized, (size: usize), true);
delete_hook!("_ZdaPvm", delete_array_sized, (size: usize), true);
delete_hook!("_ZdlPvRKSt9nothrow_t", delete_nothrow, (nt: Nothrow), false);
delete_hook!("_ZdaPvRKSt9nothrow_t", delete_array_nothrow, (nt: Nothrow), false);
delete_hook!("_ZdlPvSt11align_val_t", delete_aligned, (align: usize), false);
delete_hook!("_ZdaPvSt11align_val_t", delete_array_aligned, (align: usize), false);
delete_hook!("_ZdlPvmSt11align_val_t", delete_sized_aligned, (size: usize, align: usize), false);
delete_hook!("_ZdaPvmSt11align_val_t", delete_array_sized_aligned, (size: usize, align: usize), false);
delete_hook!("_ZdlPvSt11align_val_tRKSt9nothrow_t", delete_aligned_nothrow, (align: usize, nt: Nothrow), false);
delete_hook!("_ZdaPvSt11align_val_tRKSt9nothrow_t", delete_array_aligned_nothrow, (align: usize, nt: Nothrow), false);

/// Resolves `f` now, unless done, with this thread inside a hook of its
/// own (not a forwarding one): what glibc allocates in `dlsym` (its error
/// state) is then kept as internal blocks, whose later frees by the
/// program find them. Called by hooks that forward (libstdc++'s `operator
/// new`), inside which nothing is kept: `nm -D` of libstdc++ had 2 frees
/// of blocks "from before tracing" this way.
#[inline]
fn resolve_tracked(f: &crate::platform::real::NextFn) {
    if f.unresolved() {
        resolve_now(f);
    }
}

#[cold]
fn resolve_now(f: &crate::platform::real::NextFn) {
    let _g = crate::record::guard::Guard::enter();
    f.get();
}
