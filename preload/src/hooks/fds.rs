//! The calls that close or replace descriptors: before the program's call
//! frees the trace's descriptor, the trace moves to another number
//! (stream/output.rs), and a range the program closes leaves it out. The
//! program sees what it asked for: the number it closed is free, the number
//! it `dup2`ed onto is its file. Calls the tracer itself makes (inside a
//! hook) go straight through.

use crate::platform::real::{next, CLOSE, CLOSEFROM, CLOSE_RANGE, DUP2, DUP3};
use crate::record::guard::Guard;
use crate::stream;

/// `close_range` flag: mark close-on-exec instead of closing (linux/close_range.h).
const CLOSE_RANGE_CLOEXEC: i32 = 1 << 2;

/// The session, unless this thread is inside a hook (the tracer's own call).
fn program_call() -> Option<(Guard, &'static stream::Session)> {
    let g = Guard::enter()?;
    Some((g, stream::current()?))
}

fn real_close(fd: i32) -> i32 {
    type F = unsafe extern "C" fn(i32) -> i32;
    // SAFETY: F is close's signature.
    match unsafe { next::<F>(&CLOSE) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(fd) },
        // SAFETY: the close system call on any number is safe.
        None => unsafe { libc::syscall(libc::SYS_close, fd) as i32 },
    }
}

fn real_close_range(first: u32, last: u32, flags: i32) -> i32 {
    type F = unsafe extern "C" fn(u32, u32, i32) -> i32;
    // SAFETY: F is close_range's signature (glibc 2.34).
    match unsafe { next::<F>(&CLOSE_RANGE) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(first, last, flags) },
        // SAFETY: the close_range system call (Linux 5.9) on any range.
        None => unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) as i32 },
    }
}

/// # Safety
/// The C contract of close.
#[no_mangle]
pub unsafe extern "C" fn close(fd: i32) -> i32 {
    if let Some((_g, s)) = program_call() {
        s.make_way(fd);
    }
    real_close(fd)
}

/// # Safety
/// The C contract of dup2.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: i32, new: i32) -> i32 {
    if let Some((_g, s)) = program_call() {
        if old != new {
            s.make_way(new);
        }
    }
    type F = unsafe extern "C" fn(i32, i32) -> i32;
    // SAFETY: F is dup2's signature.
    match unsafe { next::<F>(&DUP2) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(old, new) },
        // SAFETY: the dup2 system call on any numbers.
        None => unsafe { libc::syscall(libc::SYS_dup2, old, new) as i32 },
    }
}

/// # Safety
/// The C contract of dup3.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: i32, new: i32, flags: i32) -> i32 {
    if let Some((_g, s)) = program_call() {
        if old != new {
            s.make_way(new);
        }
    }
    type F = unsafe extern "C" fn(i32, i32, i32) -> i32;
    // SAFETY: F is dup3's signature.
    match unsafe { next::<F>(&DUP3) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(old, new, flags) },
        // SAFETY: the dup3 system call on any numbers.
        None => unsafe { libc::syscall(libc::SYS_dup3, old, new, flags) as i32 },
    }
}

/// Closes `[first, last]` but the trace's descriptor (held still by the
/// session's file lock). Returns close_range's result.
fn close_range_but_trace(s: &stream::Session, first: u32, last: u32, flags: i32) -> i32 {
    let hold = s.hold_file_number();
    let Some(fd) = hold.fd().filter(|&fd| (first..=last).contains(&fd)) else {
        return real_close_range(first, last, flags);
    };
    let mut rc = 0;
    if fd > first {
        rc = real_close_range(first, fd - 1, flags);
    }
    if fd < last && rc == 0 {
        rc = real_close_range(fd + 1, last, flags);
    }
    rc
}

/// # Safety
/// The C contract of close_range.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: u32, last: u32, flags: i32) -> i32 {
    match program_call() {
        Some((_g, s)) if flags & CLOSE_RANGE_CLOEXEC == 0 => close_range_but_trace(s, first, last, flags),
        _ => real_close_range(first, last, flags),
    }
}

/// # Safety
/// The C contract of closefrom.
#[no_mangle]
pub unsafe extern "C" fn closefrom(low: i32) {
    let low = low.max(0) as u32;
    if let Some((_g, s)) = program_call() {
        if close_range_but_trace(s, low, u32::MAX, 0) == 0 {
            return;
        }
        // No close_range system call (Linux before 5.9): one by one below
        // the trace, then glibc's own way above it.
        let hold = s.hold_file_number();
        if let Some(fd) = hold.fd().filter(|&fd| fd >= low) {
            for n in low..fd {
                real_close(n as i32);
            }
            return closefrom_real(fd + 1);
        }
    }
    closefrom_real(low)
}

fn closefrom_real(low: u32) {
    type F = unsafe extern "C" fn(i32);
    // SAFETY: F is closefrom's signature (glibc 2.34); closing descriptors
    // is what the program asked for.
    match unsafe { next::<F>(&CLOSEFROM) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(low.min(i32::MAX as u32) as i32) },
        None => {
            real_close_range(low, u32::MAX, 0);
        }
    }
}
