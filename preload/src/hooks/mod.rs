//! The exported functions that interpose on the program's calls. Each calls
//! the real function and, unless this thread is already inside a hook,
//! records what happened. Nothing here may panic: these are FFI entry points.

pub mod alloc;
pub mod api;
pub mod cxx;
pub mod fds;
pub mod mmap;
pub mod process;

use crate::record::guard::{Entry, Guard};
use crate::record::recorder::{self, Caller, Own};
use crate::unwind::Here;
use mtrace_format::Family;

/// Runs `call` and then `record` with its result and where it was made
/// (`record` returns the hook's [`Own`] block): in the hook (with the
/// hook's frame, where the backtrace starts) or, when the thread already is
/// inside a hook, nested in it. Inlined into each hook, so that
/// [`Here::now`] reads the hook's own frame.
#[inline(always)]
fn traced<T>(call: impl FnOnce() -> T, record: impl FnOnce(&T, Caller) -> Own) -> T {
    traced_as(false, call, record)
}

/// [`traced`] for a hook whose `call` forwards to another allocator that
/// ends in ours (libstdc++'s `operator new` calls `malloc`): what is
/// allocated inside the call is the hook's own block, so nothing is kept
/// for nested.rs during it, at no cost per nested call.
#[inline(always)]
fn traced_as<T>(forwarding: bool, call: impl FnOnce() -> T, record: impl FnOnce(&T, Caller) -> Own) -> T {
    traced_knowing(forwarding, |_| call(), record)
}

/// [`traced_as`] whose `call` is told whether the thread entered the hook
/// (true), or was inside one already.
#[inline(always)]
fn traced_knowing<T>(forwarding: bool, call: impl FnOnce(bool) -> T, record: impl FnOnce(&T, Caller) -> Own) -> T {
    match Guard::enter_as(forwarding) {
        Entry::Nested { forwarding: true } => call(false),
        Entry::Nested { forwarding: false } => {
            let r = call(false);
            record(&r, Caller::Nested);
            r
        }
        Entry::Hook(g) => {
            if g.waiting() {
                recorder::write_nested(0, 0);
            }
            let r = call(true);
            if forwarding {
                g.end_forwarding();
            }
            g.set_own(record(&r, Caller::Hook(Here::now(), g.slot())));
            r
        }
    }
}

/// Runs the real deallocation `call` for block `p`, stamping the free before
/// the call (see [`mtrace_format::Record::Free`]); `forwarding` as in
/// [`traced_as`] (`operator delete` calls `free`).
#[inline(always)]
fn traced_free(family: Family, p: *mut libc::c_void, forwarding: bool, call: impl FnOnce()) {
    match Guard::enter_as(forwarding) {
        Entry::Nested { forwarding: true } => call(),
        Entry::Nested { forwarding: false } => {
            let t = if p.is_null() { 0 } else { recorder::now() };
            call();
            recorder::nested_free(p, t);
        }
        Entry::Hook(g) => {
            if g.waiting() {
                recorder::write_nested(0, 0);
            }
            if !p.is_null() {
                // Buffered before the real free runs: glibc aborts on the
                // double and invalid frees it detects, and the report of
                // that run must still show them.
                recorder::free(Here::now(), g.slot(), family, p);
            }
            call();
            if forwarding {
                g.end_forwarding();
            }
            g.set_own((0, p as u64));
        }
    }
}
