//! What the hooks call after the real function returned: one function per
//! kind of event. Each captures the backtrace (for allocations), stamps the
//! time and appends the record to the calling thread's buffer. The caller
//! holds the reentrancy guard; errno is preserved for the program.

use std::sync::atomic::{AtomicBool, Ordering};

use mtrace_format::realloc::Realloc;
use mtrace_format::{EndReason, Family, Record};

use crate::platform::static_tls::FastLocal;
use crate::record::slot::Slot;
use crate::record::thread::{AllocAlignedEvent, AllocEvent, Backtrace, Event, FreeEvent, FreeToldEvent, Round, When};
use crate::record::{sample, sampled, thread_end};
use crate::unwind::Here;
use crate::{platform::sys, record::nested, record::thread, stream};

/// Whether allocations are recorded (`MTRACE_START`, `mtrace_start()`,
/// `mtrace_stop()`). Frees are recorded either way, so that blocks
/// allocated while collecting and freed while not are not reported.
static COLLECTING: AtomicBool = AtomicBool::new(true);

/// Sets whether allocations are recorded as a session starts (its stream
/// says so in its first records).
pub fn init_collecting(on: bool) {
    COLLECTING.store(on, Ordering::Release);
}

pub fn collecting() -> bool {
    COLLECTING.load(Ordering::Relaxed)
}

/// Starts or stops recording allocations (`mtrace_start()`, `mtrace_stop()`,
/// glibc's `mtrace()`/`muntrace()`, the console's `start`/`stop`) and says
/// so in the stream ([`Record::Coverage`]): a free of a block the stream
/// never saw, or a second free of an address, may then involve a block
/// allocated while stopped rather than be a wrong free. The caller holds
/// the reentrancy guard (or is the writer thread).
pub fn set_collecting(on: bool) {
    // First: a session starting now sets the flag from MTRACE_START.
    let s = stream::current();
    if COLLECTING.swap(on, Ordering::AcqRel) != on {
        if let Some(s) = s {
            s.write_now(|time_ns| Record::Coverage { time_ns, collecting: on, whole: false });
        }
    }
}

thread_local! {
    /// The block this thread's realloc is freeing while the real realloc
    /// runs, and when (ns; (0, 0): none). glibc aborts inside realloc on
    /// some pointers that are not live blocks; the fatal signal's flush
    /// then writes this free, so that the report shows the wrong free.
    /// Const-initialised, no destructor: safe in the first malloc.
    static REALLOC_OLD_KEY: std::cell::Cell<(u64, u64, u32)> = const { std::cell::Cell::new((0, 0, 0)) };
}
static REALLOC_OLD: FastLocal<std::cell::Cell<(u64, u64, u32)>> = FastLocal::new(&REALLOC_OLD_KEY);

/// Lets the hooks reach this module's thread-local from the thread
/// pointer (platform/static_tls.rs): from the library's constructor.
pub fn find_static_tls() {
    REALLOC_OLD.find();
}

/// With frees' backtraces on (`MTRACE_CHECK_FREES`): the backtrace of the
/// realloc whose hook frame is `at`, defined in the stream before the real
/// realloc runs (so that a realloc glibc aborts in is reported with it)
/// and used again for its record afterwards; else 0. The caller has
/// entered the hook (not nested in one).
pub fn realloc_stack(at: Here) -> u32 {
    match stream::current() {
        Some(s) if s.check_frees && collecting() => {
            let errno = sys::errno();
            let id = thread::intern(s, at);
            sys::set_errno(errno);
            id
        }
        _ => 0,
    }
}

/// The calling thread's realloc is about to free `old` (stamped `t`; its
/// backtrace `stack` from [`realloc_stack`], or 0).
#[inline]
pub fn realloc_begins(old: *mut libc::c_void, t: u64, stack: u32) {
    REALLOC_OLD.with(|c| c.set((old as u64, t, stack)));
}

/// The real realloc returned.
#[inline]
pub fn realloc_ends() {
    REALLOC_OLD.with(|c| c.set((0, 0, 0)));
}

/// `thread::push_in` (with the round the hook handed down), then the
/// thread's exit registered when this was its first event made outside
/// the allocator.
#[inline(always)]
fn push_in(slot: Slot, round: Round, s: &stream::Session, when: When, bt: Backtrace, make: impl Event) {
    if thread::push_in(slot, round, s, when, bt, make) {
        thread_end::register(s, slot);
    }
}

/// Records an event with the backtrace from the hook's frame `at`.
#[inline]
fn with_stack(at: Here, slot: Slot, round: Round, make: impl Event) {
    with_bt(Backtrace::From(at), slot, round, make)
}

/// Records an event with backtrace `bt`, if allocations are collected.
#[inline]
fn with_bt(bt: Backtrace, slot: Slot, round: Round, make: impl Event) {
    if !collecting() {
        return;
    }
    let errno = sys::errno();
    if let Some(s) = stream::current() {
        push_in(slot, round, s, When::Early(s.now()), bt, make);
    }
    sys::set_errno(errno);
}

/// The time of an event the calling hook (its thread's `slot`) buffers
/// for session `s`, ns: the hook is marked first (stream/order.rs).
#[inline(always)]
fn stamp(slot: Slot, s: &stream::Session) -> u64 {
    slot.mark();
    s.now()
}

/// Records an event without a backtrace, stamped `t` (taken before the real
/// call) or now.
#[inline]
fn without_stack(t: Option<u64>, make: impl FnOnce(u64) -> Record) {
    let errno = sys::errno();
    if let Some(s) = stream::current() {
        thread::push(s, t.map_or_else(|| When::Early(s.now()), When::Marked), None, |t, _| make(t));
    }
    sys::set_errno(errno);
}

/// The block a hook itself allocated and freed (0: none), which the events
/// kept inside it leave out (nested.rs).
pub type Own = (u64, u64);

/// Where a hook's event was made.
#[derive(Clone, Copy)]
pub enum Caller {
    /// In the hook, whose frame is where the backtrace starts; with the
    /// thread's slot its guard found, and the writer's round the hook
    /// hands down (see [`Round`]).
    Hook(Here, Slot, Round),
    /// While this thread was already inside a hook (see nested.rs).
    Nested,
}

/// An allocation that returned `addr`; returns the hook's own block.
pub fn alloc(at: Caller, family: Family, addr: *mut libc::c_void, size: usize) -> Own {
    alloc_aligned(at, family, addr, size, 0)
}

/// [`alloc`] of an aligned `operator new` asked for `align` bytes of
/// alignment (0: not an aligned one).
#[inline(always)]
pub fn alloc_aligned(at: Caller, family: Family, addr: *mut libc::c_void, size: usize, align: usize) -> Own {
    if addr.is_null() {
        return (0, 0);
    }
    match at {
        Caller::Hook(at, slot, round) => {
            if collecting() && in_sample(addr as u64) {
                let alloc = AllocEvent { family, addr: addr as u64, size: size as u64 };
                match align {
                    0 => with_stack(at, slot, round, alloc),
                    a => with_stack(at, slot, round, AllocAlignedEvent { alloc, align: a as u64 }),
                }
            }
        }
        Caller::Nested => keep_alloc(addr as u64, size as u64),
    }
    (addr as u64, 0)
}

/// Under sampling, enters `addr`, a block about to be recorded, into the
/// set its free looks in (sampled.rs); false if the set has no room, and
/// the block then goes unrecorded. True when every allocation is recorded.
#[inline]
fn in_sample(addr: u64) -> bool {
    sample::rate() == 0 || stream::current().is_some() && sampled::insert(addr)
}

/// An allocation inside a hook, for the outer hook to write (also while
/// not collecting: it is not the program's, and its free is recorded).
fn keep_alloc(addr: u64, size: u64) {
    if let Some(s) = stream::current().filter(|_| in_sample(addr)) {
        nested::keep(nested::Event::Alloc(addr, size, stamp(Slot::current(), s)));
    }
}

/// A free inside a hook of `p` (stamped `t` before the real free), for the
/// outer hook to write.
pub fn nested_free(p: *mut libc::c_void, t: u64) {
    if !p.is_null() && stream::current().is_some() {
        nested::keep(nested::Event::Free(p as u64, t));
    }
}

/// The session time for an event that must be stamped before the real call
/// (free, munmap, the free half of realloc); 0 when not tracing.
pub fn now() -> u64 {
    stream::current().map_or(0, |s| stamp(Slot::current(), s))
}

/// Records a free before the real free runs (stamped as it is buffered),
/// with its backtrace from the hook's frame `at` when the session checks
/// frees (`MTRACE_CHECK_FREES`) and allocations are collected.
/// A sized or aligned deallocation is told `told` of the block: (size,
/// alignment), bytes, 0 for what it was not told ((0, 0) for a plain free).
pub fn free_sized(at: Here, slot: Slot, round: Round, family: Family, addr: *mut libc::c_void, told: (usize, usize)) {
    free_as(Backtrace::From(at), (slot, round), family, addr, None, told)
}

/// [`free_sized`] with backtrace `bt` (when the session checks frees),
/// stamped `t` (taken with [`now`] before the real call) or as it is
/// buffered.
fn free_as(
    bt: Backtrace,
    (slot, round): (Slot, Round),
    family: Family,
    addr: *mut libc::c_void,
    t: Option<u64>,
    told: (usize, usize),
) {
    if addr.is_null() {
        return;
    }
    let addr = addr as u64;
    let Some(s) = stream::current() else { return };
    let bt = if s.check_frees && collecting() { bt } else { Backtrace::None };
    // The size a sized delete was told, with the frees' checks only (-S):
    // C++14 code deletes with sizes, and a size per free would cost every
    // C++ program's trace. An alignment (rare) always.
    let told = if s.check_frees { told } else { (0, told.1) };
    let errno = sys::errno();
    let when = t.map_or_else(|| When::Early(s.now()), When::Marked);
    let free = FreeEvent { family, addr };
    match told {
        (0, 0) => push_in(slot, round, s, when, bt, free),
        (size, align) => {
            push_in(slot, round, s, when, bt, FreeToldEvent { free, size: size as u64, align: align as u64 })
        }
    }
    sys::set_errno(errno);
}

/// Records the outcome of `realloc(old, size)` that returned `new`, by
/// glibc's rules: realloc(NULL, n) allocates, realloc(p, 0) returning NULL
/// freed p, any other NULL is a failure that leaves `old` live.
/// `t0` is [`now`] before the call; `known` the backtrace's id from
/// [`realloc_stack`], or 0 to unwind now. Under sampling, `old` is null
/// when the old block was not sampled, and `new` null when the new block
/// `returned` is not picked: then only the free of `old` is recorded.
pub fn realloc(
    at: Caller,
    old: *mut libc::c_void,
    new: *mut libc::c_void,
    returned: *mut libc::c_void,
    size: usize,
    t0: u64,
    known: u32,
) -> Own {
    let own = (returned as u64, old as u64);
    if new.is_null() && !returned.is_null() {
        // The new block is not sampled: the old one (if sampled) is gone.
        if !old.is_null() {
            match at {
                Caller::Hook(at, slot, round) => {
                    let bt = if known != 0 { Backtrace::Known(known) } else { Backtrace::From(at) };
                    free_as(bt, (slot, round), Family::Malloc, old, Some(t0), (0, 0));
                }
                Caller::Nested => nested_free(old, t0),
            }
        }
        return own;
    }
    let (at, slot, round) = match at {
        Caller::Hook(at, slot, round) => (at, slot, round),
        Caller::Nested => {
            let outcome = Realloc::of(old as u64, new as u64, size as u64);
            if outcome.frees_old() {
                nested_free(old, t0);
            }
            if matches!(outcome, Realloc::Allocated | Realloc::Resized) {
                keep_alloc(new as u64, size as u64);
            }
            return own;
        }
    };
    let bt = if known != 0 { Backtrace::Known(known) } else { Backtrace::From(at) };
    realloc_in_hook(bt, (slot, round), old, new, size, t0);
    own
}

fn realloc_in_hook(
    bt: Backtrace,
    hook: (Slot, Round),
    old: *mut libc::c_void,
    new: *mut libc::c_void,
    size: usize,
    t0: u64,
) {
    let (slot, round) = hook;
    match Realloc::of(old as u64, new as u64, size as u64) {
        Realloc::Failed => {}
        Realloc::Allocated => {
            if collecting() && in_sample(new as u64) {
                with_bt(bt, slot, round, AllocEvent { family: Family::Malloc, addr: new as u64, size: size as u64 })
            }
        }
        // Not collecting: the old block goes; the new one is not recorded.
        Realloc::Freed | Realloc::Resized if !collecting() => free_as(bt, hook, Family::Malloc, old, Some(t0), (0, 0)),
        Realloc::Freed => free_as(bt, hook, Family::Malloc, old, Some(t0), (0, 0)),
        // The set had no room for the new block: it leaves the stream.
        Realloc::Resized if !in_sample(new as u64) => free_as(bt, hook, Family::Malloc, old, Some(t0), (0, 0)),
        Realloc::Resized => with_bt(bt, slot, round, |time_ns, stack| Record::Realloc {
            time_ns,
            free_time_ns: t0,
            old: old as u64,
            new: new as u64,
            size: size as u64,
            stack,
        }),
    }
}

/// A mapping; those made inside a hook are the tracer's own (its heap, the
/// snapshot's scratch) and are not recorded.
pub fn mmap(at: Caller, addr: *mut libc::c_void, len: usize, prot: i32, flags: i32, fd: i32) -> Own {
    let Caller::Hook(at, slot, round) = at else { return (0, 0) };
    if addr == libc::MAP_FAILED {
        return (0, 0);
    }
    with_stack(at, slot, round, |time_ns, stack| Record::Mmap {
        time_ns,
        addr: addr as u64,
        len: len as u64,
        prot: prot as u32,
        flags: flags as u32,
        fd,
        stack,
    });
    (0, 0)
}

/// `t` is [`now`] before the call.
pub fn munmap(addr: *mut libc::c_void, len: usize, t: u64) {
    without_stack(Some(t), |time_ns| Record::Munmap { time_ns, addr: addr as u64, len: len as u64 });
}

pub fn mremap(at: Caller, old: *mut libc::c_void, old_len: usize, new: *mut libc::c_void, new_len: usize) -> Own {
    let Caller::Hook(at, slot, round) = at else { return (0, 0) };
    if new == libc::MAP_FAILED {
        return (0, 0);
    }
    if !collecting() {
        munmap(old, old_len, now());
        return (0, 0);
    }
    with_stack(at, slot, round, |time_ns, stack| Record::Mremap {
        time_ns,
        old: old as u64,
        old_len: old_len as u64,
        new: new as u64,
        new_len: new_len as u64,
        stack,
    });
    (0, 0)
}

/// Pool names given to `mtrace_alloc()`; a pool's id is its index + 1.
static POOLS: parking_lot::Mutex<Vec<String>> = parking_lot::Mutex::new(Vec::new());

/// The id of pool `name`, defining it in the stream on first use.
fn pool_id(name: &str) -> Option<u32> {
    let mut pools = POOLS.lock();
    if let Some(i) = pools.iter().position(|p| p == name) {
        return Some(i as u32 + 1);
    }
    pools.push(name.to_owned());
    let id = pools.len() as u32;
    drop(pools);
    let s = stream::current()?;
    let name = name.to_owned();
    thread::push(s, When::Early(s.now()), None, move |_, _| Record::PoolName { id, name });
    Some(id)
}

/// `mtrace_alloc(pool, ptr, size)`.
pub fn pool_alloc(at: Here, pool: &str, addr: u64, size: u64) {
    if !collecting() {
        return;
    }
    let Some(pool) = pool_id(pool) else { return };
    // A record of no block of the malloc family: no round before it.
    with_stack(at, Slot::current(), thread::no_round, |time_ns, stack| Record::PoolAlloc {
        time_ns,
        pool,
        addr,
        size,
        stack,
    });
}

/// `mtrace_free(pool, ptr)`.
pub fn pool_free(pool: &str, addr: u64) {
    let Some(pool) = pool_id(pool) else { return };
    without_stack(None, |time_ns| Record::PoolFree { time_ns, pool, addr });
}

/// After dlopen/dlclose: the whole module list, so that the analyzer can
/// symbolize frames of libraries that are gone by the end.
pub fn modules_changed() {
    let list = crate::platform::modules::list();
    without_stack(None, move |time_ns| Record::Modules { time_ns, modules: list });
}

/// Writes everything out before the process ends or execs (with the free
/// of a realloc this thread was inside of, see [`realloc_begins`]).
pub fn final_flush(reason: EndReason, in_signal: bool) {
    if let Some(s) = stream::current() {
        if s.pid == sys::getpid() {
            let pending = REALLOC_OLD.with(|c| c.replace((0, 0, 0)));
            s.final_flush(reason, in_signal, (pending.0 != 0).then_some(pending));
            if s.unwinder == crate::unwind::Unwinder::Check && !in_signal {
                sys::warn(&crate::unwind::check_summary());
            }
        }
    }
}
