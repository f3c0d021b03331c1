//! The exported functions that interpose on the program's calls. Each calls
//! the real function and, unless this thread is already inside a hook,
//! records what happened. Nothing here may panic: these are FFI entry points.

pub mod alloc;
pub mod api;
pub mod cxx;
pub mod mmap;
pub mod process;

use crate::guard::Guard;
use crate::recorder;
use crate::unwind::Here;
use mtrace_format::Family;

/// Runs `call` and then `record` with its result and the hook's frame
/// (where the backtrace starts), inside the reentrancy guard; when the
/// thread already is inside a hook, only `call` runs. Inlined into each
/// hook, so that [`Here::now`] reads the hook's own frame.
#[inline(always)]
fn traced<T>(call: impl FnOnce() -> T, record: impl FnOnce(&T, Here)) -> T {
    match Guard::enter() {
        None => call(),
        Some(_g) => {
            let r = call();
            record(&r, Here::now());
            r
        }
    }
}

/// Runs the real deallocation `call` for block `p`, stamping the free before
/// the call (see [`mtrace_format::Record::Free`]).
#[inline(always)]
fn traced_free(family: Family, p: *mut libc::c_void, call: impl FnOnce()) {
    match Guard::enter() {
        None => call(),
        Some(_g) => {
            let t = if p.is_null() { 0 } else { recorder::now() };
            call();
            recorder::free(family, p, t);
        }
    }
}
