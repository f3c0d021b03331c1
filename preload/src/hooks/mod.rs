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

use crate::record::guard::{self, Entry, Guard};
use crate::record::recorder::{self, Caller, Own};
use crate::record::slot::Slot;
use crate::record::{nested, sample, sampled};
use crate::session;
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

/// [`traced`] for an allocation of `size` bytes that sampling applies to
/// (the malloc family and the C++ operators; record/sample.rs): under
/// sampling, one the thread's count-down does not pick runs inside the
/// guard and is not recorded.
#[inline(always)]
fn traced_sampled<T>(size: usize, call: impl FnOnce() -> T, record: impl FnOnce(&T, Caller) -> Own) -> T {
    traced_picked(false, Some(size), |_| call(), record)
}

/// [`traced`] for a hook whose `call` forwards to another allocator that
/// ends in ours (libstdc++'s `operator new` calls `malloc`): what is
/// allocated inside the call is the hook's own block, so nothing is kept
/// for nested.rs during it, at no cost per nested call.
#[inline(always)]
fn traced_as<T>(forwarding: bool, call: impl FnOnce() -> T, record: impl FnOnce(&T, Caller) -> Own) -> T {
    traced_knowing(forwarding, |_| call(), record)
}

/// [`traced_as`] and [`traced_sampled`] together: a forwarding hook's
/// allocation of `size` bytes.
#[inline(always)]
fn traced_as_sampled<T>(
    forwarding: bool,
    size: usize,
    call: impl FnOnce() -> T,
    record: impl FnOnce(&T, Caller) -> Own,
) -> T {
    traced_picked(forwarding, Some(size), |_| call(), record)
}

/// [`traced_as`] whose `call` is given the thread's slot when it entered
/// the hook (`None`: it was inside one already).
#[inline(always)]
fn traced_knowing<T>(
    forwarding: bool,
    call: impl FnOnce(Option<Slot>) -> T,
    record: impl FnOnce(&T, Caller) -> Own,
) -> T {
    traced_picked(forwarding, None, call, record)
}

/// [`traced_knowing`], with `sampled` the size of an allocation sampling
/// applies to (`None`: always recorded).
#[inline(always)]
fn traced_picked<T>(
    forwarding: bool,
    sampled: Option<usize>,
    call: impl FnOnce(Option<Slot>) -> T,
    record: impl FnOnce(&T, Caller) -> Own,
) -> T {
    // One load of the rate (two atomic loads are not merged).
    let rate = sample::rate();
    let (call, picked) = match sampled {
        Some(size) if rate != 0 => {
            // Not picked: inside the guard all the same, so that what the
            // call allocates is its own, and a stop for the scan waits
            // until it leaves glibc's locks.
            match guard::quiet(forwarding, |slot| !sample::pick(slot, size, rate), call, |c, slot| c(Some(slot))).ran()
            {
                Ok(r) => return r,
                Err(back) => back,
            }
        }
        _ => (call, false),
    };
    // Picked already: recorded.
    let sampled = sampled.filter(|_| !picked);
    match Guard::enter_as(forwarding) {
        Entry::Nested { forwarding: true } => call(None),
        Entry::Nested { forwarding: false } => {
            let r = call(None);
            record(&r, Caller::Nested);
            r
        }
        Entry::Hook(g) => {
            if let Some(size) = sampled {
                let rate = sample::rate();
                if rate != 0 && !sample::pick(g.slot(), size, rate) {
                    return call(Some(g.slot()));
                }
            }
            // The session, made at the program's first event (a thread
            // that comes after the end of `exit` began stops there).
            session::get();
            if g.waiting() {
                nested::write(0, 0);
            }
            let r = call(Some(g.slot()));
            if forwarding {
                g.end_forwarding();
            }
            g.set_own(record(&r, Caller::Hook(Here::now(), g.slot(), session::solo::round)));
            r
        }
    }
}

/// Under sampling, whether the free of `p` concerns the stream: only a
/// sampled block's does, and it leaves the set here, before the real free
/// can hand its address to another thread. Always true when every
/// allocation is recorded.
#[inline(always)]
fn free_recorded(p: *mut libc::c_void) -> bool {
    sample::rate() == 0 || sampled::remove(p as u64)
}

/// Runs the real deallocation `call` for block `p`, stamping the free before
/// the call (see [`mtrace_format::Record::Free`]); `forwarding` as in
/// [`traced_as`] (`operator delete` calls `free`).
#[inline(always)]
fn traced_free(family: Family, p: *mut libc::c_void, forwarding: bool, call: impl FnOnce()) {
    traced_free_told(family, p, (0, 0), forwarding, call)
}

/// [`traced_free`] of a sized or aligned deallocation, told `told` of the
/// block: (size, alignment), bytes, 0 for what it was not told.
#[inline(always)]
fn traced_free_told(family: Family, p: *mut libc::c_void, told: (usize, usize), forwarding: bool, call: impl FnOnce()) {
    let (call, sampled) = if sample::rate() != 0 && !p.is_null() {
        // A block never sampled: out of the stream, inside the guard.
        match guard::quiet(forwarding, |_| !sampled::remove(p as u64), call, |c, _| c()).ran() {
            Ok(()) => return,
            Err(back) => back,
        }
    } else {
        (call, false)
    };
    // Under sampling, whether the free concerns the stream (decided once).
    let recorded = |p| sampled || free_recorded(p);
    match Guard::enter_as(forwarding) {
        Entry::Nested { forwarding: true } => call(),
        Entry::Nested { forwarding: false } if p.is_null() || !recorded(p) => call(),
        Entry::Nested { forwarding: false } => {
            let t = recorder::now();
            call();
            recorder::nested_free(p, t);
        }
        Entry::Hook(g) if !p.is_null() && !recorded(p) => {
            // Not sampled: out of the stream. The forwarding flag goes
            // with the guard.
            let _ = &g;
            call()
        }
        Entry::Hook(g) => {
            session::get();
            if g.waiting() {
                nested::write(0, 0);
            }
            if !p.is_null() {
                // Buffered before the real free runs: glibc aborts on the
                // double and invalid frees it detects, and the report of
                // that run must still show them.
                recorder::free_sized(Here::now(), g.slot(), session::solo::round, family, p, told);
            }
            call();
            if forwarding {
                g.end_forwarding();
            }
            g.set_own((0, p as u64));
        }
    }
}
