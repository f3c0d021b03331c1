//! The path every allocation hook takes, from the hook's entry to the
//! event in the thread's buffer: under sampling, whether it is recorded
//! (sample.rs); the reentrancy guard (guard.rs); the session, made at the
//! program's first event; the real call; the event recorded (recorder.rs:
//! unwound, interned, encoded into the thread's buffer); the guard left,
//! writing what was kept meanwhile (nested.rs). The hooks (hooks/) only
//! name their real function and their event.

use mtrace_format::Family;

use crate::platform::real;
use crate::record::guard::{self, Entry, Guard, Quiet};
use crate::record::recorder::{self, Caller, Own};
use crate::record::slot::Slot;
use crate::record::thread::Round;
use crate::record::{nested, sample, sampled};
use crate::stream::Session;
use crate::unwind::Here;

/// What a hook hands the recorder from the session room above it, which
/// the recorder never names: how to find the session (made at the
/// program's first event: `session::get`), and the writer's round of a
/// process with one thread ([`Round`]: `session::solo::round`).
#[derive(Clone, Copy)]
pub struct Hooked {
    pub session: fn() -> Option<&'static Session>,
    pub round: Round,
}

/// Runs `call` and then `record` with its result and where it was made
/// (`record` returns the hook's [`Own`] block): in the hook (with the
/// hook's frame, where the backtrace starts) or, when the thread already is
/// inside a hook, nested in it. Inlined into each hook, so that
/// [`Here::now`] reads the hook's own frame.
#[inline(always)]
pub fn traced<T>(h: Hooked, call: impl FnOnce() -> T, record: impl FnOnce(&T, Caller) -> Own) -> T {
    traced_as(h, false, call, record)
}

/// [`traced`] for an allocation of `size` bytes that sampling applies to
/// (the malloc family and the C++ operators; record/sample.rs): under
/// sampling, one the thread's count-down does not pick runs inside the
/// guard and is not recorded.
#[inline(always)]
pub fn traced_sampled<T>(
    h: Hooked,
    size: usize,
    call: impl FnOnce() -> T,
    record: impl FnOnce(&T, Caller) -> Own,
) -> T {
    traced_picked(h, false, Some(size), |_| call(), record)
}

/// [`traced`] for a hook whose `call` forwards to another allocator that
/// ends in ours (libstdc++'s `operator new` calls `malloc`): what is
/// allocated inside the call is the hook's own block, so nothing is kept
/// for nested.rs during it, at no cost per nested call.
#[inline(always)]
pub fn traced_as<T>(
    h: Hooked,
    forwarding: bool,
    call: impl FnOnce() -> T,
    record: impl FnOnce(&T, Caller) -> Own,
) -> T {
    traced_knowing(h, forwarding, |_| call(), record)
}

/// [`traced_as`] and [`traced_sampled`] together: a forwarding hook's
/// allocation of `size` bytes.
#[inline(always)]
pub fn traced_as_sampled<T>(
    h: Hooked,
    forwarding: bool,
    size: usize,
    call: impl FnOnce() -> T,
    record: impl FnOnce(&T, Caller) -> Own,
) -> T {
    traced_picked(h, forwarding, Some(size), |_| call(), record)
}

/// [`traced_as`] whose `call` is given the thread's slot when it entered
/// the hook (`None`: it was inside one already).
#[inline(always)]
pub fn traced_knowing<T>(
    h: Hooked,
    forwarding: bool,
    call: impl FnOnce(Option<Slot>) -> T,
    record: impl FnOnce(&T, Caller) -> Own,
) -> T {
    traced_picked(h, forwarding, None, call, record)
}

/// [`traced_knowing`], with `sampled` the size of an allocation sampling
/// applies to (`None`: always recorded).
#[inline(always)]
fn traced_picked<T>(
    h: Hooked,
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
            (h.session)();
            if g.waiting() {
                nested::write(0, 0);
            }
            let r = call(Some(g.slot()));
            if forwarding {
                g.end_forwarding();
            }
            g.set_own(record(&r, Caller::Hook(Here::now(), g.slot(), h.round)));
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
pub fn traced_free(h: Hooked, family: Family, p: *mut libc::c_void, forwarding: bool, call: impl FnOnce()) {
    traced_free_told(h, family, p, (0, 0), forwarding, call)
}

/// [`traced_free`] of a sized or aligned deallocation, told `told` of the
/// block: (size, alignment), bytes, 0 for what it was not told.
#[inline(always)]
pub fn traced_free_told(
    h: Hooked,
    family: Family,
    p: *mut libc::c_void,
    told: (usize, usize),
    forwarding: bool,
    call: impl FnOnce(),
) {
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
            (h.session)();
            if g.waiting() {
                nested::write(0, 0);
            }
            if !p.is_null() {
                // Buffered before the real free runs: glibc aborts on the
                // double and invalid frees it detects, and the report of
                // that run must still show them.
                recorder::free_sized(Here::now(), g.slot(), h.round, family, p, told);
            }
            call();
            if forwarding {
                g.end_forwarding();
            }
            g.set_own((0, p as u64));
        }
    }
}

/// A realloc's recording around `resize`, the real function: glibc's
/// realloc, or an allocator's own (`rallocx`, `mi_realloc`), called with
/// the caller's block and size. Inlined into each hook, whose frame the
/// backtrace starts at.
#[inline(always)]
pub fn traced_realloc(
    h: Hooked,
    p: *mut libc::c_void,
    size: usize,
    resize: impl Fn(*mut libc::c_void, usize) -> *mut libc::c_void,
) -> *mut libc::c_void {
    // The hook's frame, for a backtrace taken before the real call.
    let here = Here::now();
    let t0 = std::cell::Cell::new(0);
    let known = std::cell::Cell::new(0);
    // Under sampling (record/sample.rs) a realloc is a free and an
    // allocation, each judged on its own: the free is recorded if the old
    // block was sampled (else `old` becomes null), the new block if it is
    // picked by its size (`new_sampled`), so that every block's weight
    // follows from its size alone.
    let old = std::cell::Cell::new(if real::in_arena(p) { std::ptr::null_mut() } else { p });
    let new_sampled = std::cell::Cell::new(true);
    // Under sampling, (old block sampled, new block picked), once decided.
    let decided = std::cell::Cell::new(None);
    let rate = sample::rate();
    if rate != 0 {
        let skip = |slot| {
            let both = (!old.get().is_null() && sampled::remove(p as u64), sample::pick(slot, size, rate));
            decided.set(Some(both));
            both == (false, false)
        };
        let call = |(), _| resize(p, size);
        if let Quiet::Ran(r) = guard::quiet(false, skip, (), call) {
            return r;
        }
    }
    traced_knowing(
        h,
        false,
        |slot| {
            if rate != 0 {
                let (old_sampled, picked) = decided.take().unwrap_or_else(|| {
                    (
                        !old.get().is_null() && sampled::remove(p as u64),
                        slot.is_none_or(|s| sample::pick(s, size, rate)),
                    )
                });
                if !old_sampled {
                    old.set(std::ptr::null_mut());
                }
                new_sampled.set(picked);
            }
            if old.get().is_null() {
                return resize(p, size);
            }
            t0.set(recorder::now());
            if slot.is_some() {
                known.set(recorder::realloc_stack(here));
            }
            // glibc may abort inside on a pointer that is no live block:
            // the fatal signal's flush then writes this free.
            recorder::realloc_begins(p, t0.get(), known.get());
            let r = resize(p, size);
            recorder::realloc_ends();
            if rate != 0 && r.is_null() && size != 0 {
                // Failed: the block is still the program's, and sampled.
                sampled::insert(p as u64);
            }
            r
        },
        |&r, at| {
            // An arena block moving to real memory is a new allocation.
            let new = if new_sampled.get() { r } else { std::ptr::null_mut() };
            recorder::realloc(at, old.get(), new, r, size, t0.get(), known.get())
        },
    )
}
