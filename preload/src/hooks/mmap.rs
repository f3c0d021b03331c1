//! mmap, mmap64, munmap and mremap.

use std::ffi::c_void;

use super::traced;
use crate::platform::real::{next, NextFn};
use crate::record::guard::Guard;
use crate::record::recorder;

static MMAP: NextFn = NextFn::new(c"mmap");
static MUNMAP: NextFn = NextFn::new(c"munmap");
static MREMAP: NextFn = NextFn::new(c"mremap");

type MmapFn = unsafe extern "C" fn(*mut c_void, usize, i32, i32, i32, i64) -> *mut c_void;

/// # Safety
/// The C contract of mmap.
#[no_mangle]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut c_void {
    traced(
        // SAFETY: MmapFn is mmap's signature on LP64 (off_t is 64-bit).
        || match unsafe { next::<MmapFn>(&MMAP) } {
            // SAFETY: the real function, with the arguments of the caller's C contract.
            Some(f) => unsafe { f(addr, len, prot, flags, fd, off) },
            // SAFETY: the same system call, with the caller's arguments.
            None => unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void },
        },
        |&p, at| recorder::mmap(at, p, len, prot, flags, fd),
    )
}

/// On LP64, mmap64 is mmap.
///
/// # Safety
/// As [`mmap`].
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: i64,
) -> *mut c_void {
    // SAFETY: same contract.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// The C contract of munmap.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    type F = unsafe extern "C" fn(*mut c_void, usize) -> i32;
    // SAFETY: F is munmap's signature.
    let call = || match unsafe { next::<F>(&MUNMAP) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(addr, len) },
        // SAFETY: the same system call, with the caller's arguments.
        None => unsafe { libc::syscall(libc::SYS_munmap, addr, len) as i32 },
    };
    let Some(_g) = Guard::enter() else { return call() };
    crate::session::get();
    let t = recorder::now();
    let rc = call();
    if rc == 0 {
        recorder::munmap(addr, len, t);
    }
    rc
}

/// glibc declares mremap variadic; the fifth argument is read only with
/// MREMAP_FIXED, and on x86_64 and aarch64 a variadic integer argument is
/// passed like a fixed one.
///
/// # Safety
/// The C contract of mremap.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new_addr: *mut c_void,
) -> *mut c_void {
    type F = unsafe extern "C" fn(*mut c_void, usize, usize, i32, *mut c_void) -> *mut c_void;
    traced(
        // SAFETY: F matches how mremap reads its arguments (see above).
        || match unsafe { next::<F>(&MREMAP) } {
            // SAFETY: the real function, with the arguments of the caller's C contract.
            Some(f) => unsafe { f(old, old_len, new_len, flags, new_addr) },
            None => libc::MAP_FAILED,
        },
        |&p, at| recorder::mremap(at, old, old_len, p, new_len),
    )
}
