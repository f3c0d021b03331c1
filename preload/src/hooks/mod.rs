//! The exported functions that interpose on the program's calls. Each calls
//! the real function and, unless this thread is already inside a hook,
//! records what happened. Nothing here may panic: these are FFI entry points.

pub mod alloc;
pub mod api;
pub mod cxx;
pub mod entry_points;
pub mod fds;
pub mod mmap;
pub mod process;
pub mod shared_free;

use crate::record::recorder::{Caller, Own};
use crate::record::traced::{self, Hooked};
use crate::session;
use mtrace_format::Family;

/// What every hook hands the recorder: the session's way in and its round
/// (record/traced.rs).
const HOOKED: Hooked = Hooked { session: session::get, round: session::solo::round };

// The hooks' ways into the recorder (record/traced.rs says what each does),
// with the session's [`HOOKED`]. Inlined into each hook, so that the
// backtrace starts at the hook's own frame.

#[inline(always)]
fn traced<T>(call: impl FnOnce() -> T, record: impl FnOnce(&T, Caller) -> Own) -> T {
    traced::traced(HOOKED, call, record)
}

#[inline(always)]
fn traced_sampled<T>(size: usize, call: impl FnOnce() -> T, record: impl FnOnce(&T, Caller) -> Own) -> T {
    traced::traced_sampled(HOOKED, size, call, record)
}

#[inline(always)]
fn traced_as_sampled<T>(
    forwarding: bool,
    size: usize,
    call: impl FnOnce() -> T,
    record: impl FnOnce(&T, Caller) -> Own,
) -> T {
    traced::traced_as_sampled(HOOKED, forwarding, size, call, record)
}

#[inline(always)]
fn traced_free(family: Family, p: *mut libc::c_void, forwarding: bool, call: impl FnOnce()) {
    traced::traced_free(HOOKED, family, p, forwarding, call)
}

#[inline(always)]
fn traced_free_told(family: Family, p: *mut libc::c_void, told: (usize, usize), forwarding: bool, call: impl FnOnce()) {
    traced::traced_free_told(HOOKED, family, p, told, forwarding, call)
}

#[inline(always)]
fn traced_realloc(
    p: *mut libc::c_void,
    size: usize,
    resize: impl Fn(*mut libc::c_void, usize) -> *mut libc::c_void,
) -> *mut libc::c_void {
    traced::traced_realloc(HOOKED, p, size, resize)
}
