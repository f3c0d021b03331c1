//! Per-thread recorder state: the thread's buffer and its table of interned
//! backtraces. Nothing here takes a lock another thread holds for long: the
//! buffer's mutex is contended only when the writer collects full buffers.

use std::sync::Arc;

use mtrace_format::{Encoder, Family, Record};

use crate::platform::config::MAX_DEPTH;
use crate::platform::spin::SpinMutex;
use crate::record::slot::Slot;
use crate::record::stack_ids::StackIds;
use crate::stream::{order, BufInner, Session, ThreadBuf, BUF_CAP, FLUSH_AT};
use crate::unwind::Here;
use crate::{platform::sys, unwind};

pub struct ThreadState {
    gen: u64,
    tid: u32,
    buf: Arc<ThreadBuf>,
    /// Backtrace → id, for the backtraces this thread has defined in the stream.
    stacks: StackIds,
    unwinding: unwind::Unwinding,
    /// Events pushed, counted only for `MTRACE_TEST_ORDER`'s stalls.
    events: u64,
    /// [`tear_down`] is registered for this thread's exit (see
    /// [`registering`]); until then the state is in [`UNREGISTERED`].
    exit_registered: bool,
}

/// Marks a thread whose state was torn down at thread exit.
const DEAD: usize = 1;

// This thread's state pointer lives in its word of hook state (slot.rs
// `Slot`): a hook finds it with the one access it makes to enter. Thread
// exit is handled by a TLS destructor (`__cxa_thread_atexit_impl`, as C++
// `thread_local` and Rust's `thread_local!` use on glibc), not a pthread
// key: the program keeps all PTHREAD_KEYS_MAX (1,024) of its keys. The
// destructor (thread_end.rs) enters the guard, and then tears the state
// down here ([`tear_down`]).

/// The state pointer in `slot`.
#[inline(always)]
fn state_ptr(slot: Slot) -> *mut ThreadState {
    slot.thread_state().get().cast()
}

/// Tears down the state `p` registered for the calling thread's exit
/// ([`registering`]), inside the guard: its buffer goes to the writer as
/// an exited thread's. Nothing when `p` is not this thread's current
/// state (a fork child's copy of its parent's registration).
pub fn tear_down(p: *mut libc::c_void) {
    let st = p as *mut ThreadState;
    if st.is_null() || st as usize == DEAD {
        return;
    }
    let slot = Slot::current();
    if state_ptr(slot) != st {
        return;
    }
    // SAFETY: p is the Box pointer registered by state_in for this thread.
    let st = unsafe { Box::from_raw(st) };
    // The hook this runs in stays marked, without the buffer's word.
    crate::record::slot::mark_to_shared();
    super::dead_stacks::thread_ended();
    st.buf.exited.store(true, std::sync::atomic::Ordering::Release);
    slot.thread_state().set(DEAD as *mut ());
}

// Registering the thread's exit calls the allocator: glibc's
// `__cxa_thread_atexit_impl` `calloc`s its list entry. A thread's first
// event may come from inside the program's allocator, with the
// allocator's lock held: an allocator that is not interposed (one in the
// executable, or one a thread was inside when `mtrace attach` came) calls
// `mmap`, whose hook records the thread's first event; a `calloc` there
// waits for the lock its own thread holds. So a state is made without
// calling the allocator, and its exit is registered after the thread's
// first event of the malloc family or the C++ operators
// ([`Event::REGISTERS`]), which are made outside the allocator, around
// the real call ([`push_in`] says so). A thread that ends before one is
// found ended by [`reap`].

/// The states of threads whose exit is not registered yet, with their
/// thread ids: [`reap`] frees those whose thread is gone. Behind a spin
/// lock (see `SpinMutex`): a thread's first event adds its own.
static UNREGISTERED: SpinMutex<Vec<(u32, usize)>> = SpinMutex::new(Vec::new());

/// The calling thread's exit is being registered (after an event made
/// outside the allocator, with session `s`): its state leaves the
/// unregistered list, and the pointer to register for [`tear_down`] at
/// its exit; `None` for the main thread, whose end is the process's (exit
/// runs the library destructor instead), or a thread without state. A
/// thread other than the main one that was not seen being created (a raw
/// `clone`, a thread libc started itself) ends the session's solo time
/// here: the next round starts its writer (`Session::want_writer`).
#[cold]
pub fn registering(s: &Session, slot: Slot) -> Option<*mut libc::c_void> {
    let st = state_in(s, slot)?;
    if st.exit_registered {
        return None;
    }
    if st.tid != sys::getpid() && s.is_solo() {
        s.want_writer();
    }
    st.exit_registered = true;
    let p = st as *mut ThreadState as usize;
    UNREGISTERED.lock().retain(|&(_, q)| q != p);
    (st.tid != sys::getpid()).then_some(p as *mut libc::c_void)
}

/// Frees the states of threads that ended before their exit was
/// registered (their events are all in their buffers, which the writer
/// then empties and lets go): from the writer, about once a second. Their
/// stacks are not marked dead: such a thread made no event of the malloc
/// family, and its dead frames stay roots.
pub fn reap() {
    let pid = sys::getpid();
    let mut gone = Vec::new();
    UNREGISTERED.lock().retain(|&(tid, p)| {
        let alive = sys::thread_alive(pid, tid);
        if !alive {
            gone.push(p);
        }
        alive
    });
    for p in gone {
        // SAFETY: the Box of a thread that has ended, left by state_in;
        // nothing else frees it (its exit was never registered) and
        // nothing reads it now.
        let st = unsafe { Box::from_raw(p as *mut ThreadState) };
        st.buf.exited.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Before a fork: the list of unregistered threads is not being changed
/// while the process is copied (`release_after_fork` in both processes).
pub fn hold_for_fork() {
    UNREGISTERED.hold();
}

/// After a fork, in the parent and in the child (before [`reset_in_child`]).
pub fn release_after_fork() {
    UNREGISTERED.release();
}

/// In a fork's child: the threads of the list are the parent's, but the
/// forking thread, whose state the child keeps, under its new id.
pub fn reset_in_child() {
    let mine = state_ptr(Slot::current()) as usize;
    UNREGISTERED.lock().retain(|&(_, p)| p == mine);
    if let Some(e) = UNREGISTERED.lock().first_mut() {
        e.0 = sys::gettid();
    }
}

/// This thread's state for session `s`, created (or reset after a fork) on
/// demand; `None` once the thread's state was torn down at thread exit.
fn state(s: &Session) -> Option<&'static mut ThreadState> {
    state_in(s, Slot::current())
}

/// [`state`] from the thread's `slot`, found by its hook.
fn state_in(s: &Session, slot: Slot) -> Option<&'static mut ThreadState> {
    let p = state_ptr(slot);
    if p as usize == DEAD {
        return None;
    }
    if !p.is_null() {
        // SAFETY: p is this thread's own Box, alive until tear_down.
        let st = unsafe { &mut *p };
        if st.gen != s.gen {
            // A forked child: start over in the child's stream.
            st.gen = s.gen;
            st.tid = sys::gettid();
            st.buf = s.register();
            st.stacks.clear();
            slot.set_since(&st.buf.since, s.gen);
        }
        return Some(st);
    }
    let tid = sys::gettid();
    let st = Box::into_raw(Box::new(ThreadState {
        gen: s.gen,
        tid,
        buf: s.register(),
        stacks: StackIds::default(),
        unwinding: unwind::Unwinding::default(),
        events: 0,
        exit_registered: false,
    }));
    UNREGISTERED.lock().push((tid, st as usize));
    slot.thread_state().set(st.cast());
    super::dead_stacks::thread_began();
    // SAFETY: just created, owned by this thread.
    let buf: &ThreadBuf = unsafe { &(*st).buf };
    slot.set_since(&buf.since, s.gen);
    // SAFETY: just created, owned by this thread.
    Some(unsafe { &mut *st })
}

/// Where an event's backtrace comes from.
#[derive(Clone, Copy)]
pub enum Backtrace {
    None,
    /// Unwound from the hook's frame.
    From(Here),
    /// Defined in the stream already, by [`intern`].
    Known(u32),
}

/// When an event was stamped (ns since the start), as `stream/order.rs`
/// tells them apart.
#[derive(Clone, Copy)]
pub enum When {
    /// Just now, by a hook that did not mark itself: the append stamps it
    /// again if a collection began since.
    Early(u64),
    /// Before the real call, by a hook that marked itself first (a free
    /// half, a nested event): kept.
    Marked(u64),
}

/// Appends one event to this thread's buffer, stamped `when`, with this
/// thread's backtrace from the hook's frame `stack_at` when given; `make`
/// builds the record from the time and the backtrace id.
#[inline(always)]
pub fn push(s: &Session, when: When, stack_at: Option<Here>, make: impl FnOnce(u64, u32) -> Record) {
    push_as(s, when, stack_at.map_or(Backtrace::None, Backtrace::From), make)
}

/// Defines this thread's backtrace from the hook's frame `at` in the
/// stream (unless it was already) without an event; returns its id, for
/// an event [`push_as`] writes later (0 when this thread can no longer
/// buffer).
pub fn intern(s: &Session, at: Here) -> u32 {
    let Some(st) = state(s) else { return 0 };
    let n = st.unwinding.capture(s.unwinder, s.depth(), at);
    st.buf.own(&s.handoff, |b| {
        if s.is_finished() {
            return 0;
        }
        b.begin(st.tid, || s.now());
        intern_in(s, &mut st.stacks, b, st.unwinding.frames(n))
    })
}

/// The id of backtrace `f` in this thread's table, defined in buffer `b` if new.
fn intern_in(s: &Session, stacks: &mut StackIds, b: &mut BufInner, f: &[u64]) -> u32 {
    stacks.intern(f, || s.new_stack_id(), |id, f| b.enc.stack(&mut b.cur, id, f))
}

/// An event to append: written into a buffer with its time (ns) and
/// backtrace id. A closure builds its [`Record`]; the hot events write
/// themselves without one ([`AllocEvent`], [`FreeEvent`]).
pub trait Event {
    /// Made outside the program's allocator (an event of the malloc
    /// family or the C++ operators, recorded around the real call): the
    /// thread's exit may be registered, which calls the allocator.
    const REGISTERS: bool = false;
    fn write(self, enc: &mut Encoder, out: &mut Vec<u8>, time_ns: u64, stack: u32);
    /// The block, [start, end), that the real call returned and this
    /// event records: until it is recorded, nothing of the program's
    /// holds it and its bytes are stale (`Session::round_due`, session/solo.rs).
    fn block(&self) -> Option<(u64, u64)> {
        None
    }
}

impl<F: FnOnce(u64, u32) -> Record> Event for F {
    #[inline(always)]
    fn write(self, enc: &mut Encoder, out: &mut Vec<u8>, time_ns: u64, stack: u32) {
        enc.encode(out, &self(time_ns, stack));
    }
}

/// A [`Record::Alloc`] of `size` bytes at `addr`.
pub struct AllocEvent {
    pub family: Family,
    pub addr: u64,
    pub size: u64,
}

/// A [`Record::Alloc`] of an aligned `operator new`, asked for `align`
/// bytes of alignment: an event of its own, so that every other
/// allocation's stays as small (it is moved into the buffer's closure).
pub struct AllocAlignedEvent {
    pub alloc: AllocEvent,
    pub align: u64,
}

impl Event for AllocAlignedEvent {
    const REGISTERS: bool = true;
    fn block(&self) -> Option<(u64, u64)> {
        self.alloc.block()
    }
    #[inline(always)]
    fn write(self, enc: &mut Encoder, out: &mut Vec<u8>, time_ns: u64, stack: u32) {
        let a = self.alloc;
        enc.alloc_aligned(out, time_ns, a.family, a.addr, a.size, stack, self.align);
    }
}

impl Event for AllocEvent {
    const REGISTERS: bool = true;
    fn block(&self) -> Option<(u64, u64)> {
        Some((self.addr, self.addr.saturating_add(self.size)))
    }
    #[inline(always)]
    fn write(self, enc: &mut Encoder, out: &mut Vec<u8>, time_ns: u64, stack: u32) {
        enc.alloc(out, time_ns, self.family, self.addr, self.size, stack);
    }
}

/// A [`Record::Free`] of the block at `addr`.
pub struct FreeEvent {
    pub family: Family,
    pub addr: u64,
}

/// A [`Record::Free`] by a sized or aligned deallocation, told `size` and
/// `align` of the block (bytes; 0: not told): an event of its own, as
/// [`AllocAlignedEvent`] is.
pub struct FreeToldEvent {
    pub free: FreeEvent,
    pub size: u64,
    pub align: u64,
}

impl Event for FreeToldEvent {
    const REGISTERS: bool = true;
    #[inline(always)]
    fn write(self, enc: &mut Encoder, out: &mut Vec<u8>, time_ns: u64, stack: u32) {
        let f = self.free;
        enc.free_sized(out, time_ns, f.family, f.addr, stack, self.size, self.align);
    }
}

impl Event for FreeEvent {
    const REGISTERS: bool = true;
    #[inline(always)]
    fn write(self, enc: &mut Encoder, out: &mut Vec<u8>, time_ns: u64, stack: u32) {
        enc.free(out, time_ns, self.family, self.addr, stack);
    }
}

/// The writer's round a hook hands the recorder, for a process with one
/// thread (no writer thread): run by [`push_in`] before an event of the
/// malloc family when the stream says one is due (`Session::round_due`),
/// with the event's stamp (ns), the block it allocates and does not
/// record yet ([start, end)), and whether the stamp is taken again after
/// the round's collection. The hooks hand down the session's
/// (`session::solo::round`): the session room sits above this one, which
/// never names it.
pub type Round = fn(&Session, u64, Option<(u64, u64)>, bool);

/// The [`Round`] of events that make none (closures, which are of no
/// block of the malloc family).
pub fn no_round(_: &Session, _: u64, _: Option<(u64, u64)>, _: bool) {}

/// [`push`] with a backtrace from `bt`.
pub fn push_as(s: &Session, when: When, bt: Backtrace, make: impl FnOnce(u64, u32) -> Record) {
    // No event of a closure registers the thread's exit or makes a round.
    let _ = push_in(Slot::current(), no_round, s, when, bt, make);
}

/// [`push_as`] of any [`Event`] by a hook that found this thread's `slot`
/// on entering, stamped `when`, `round` the writer's round it hands down
/// (see [`Round`]). True when the event is the thread's first made outside
/// the allocator ([`Event::REGISTERS`]): the caller then has its exit
/// registered (thread_end.rs), which calls the allocator.
#[inline(always)]
#[must_use = "the thread's exit is registered by the caller"]
pub fn push_in<E: Event>(slot: Slot, round: Round, s: &Session, when: When, bt: Backtrace, make: E) -> bool {
    // Written outside the buffer: stamped again, marked first
    // (stream/order.rs), unless marked already.
    let stamp = || match when {
        When::Marked(t) => t,
        When::Early(_) => {
            slot.mark();
            s.now()
        }
    };
    if E::REGISTERS {
        // A process with one thread does the writer's round here, outside
        // the allocator, before this event: a report asked for before it
        // leaves it out (an Early stamp is taken again after the round's
        // collection, stream/order.rs). Before the thread's state is
        // borrowed: the round may write the hook's nested events.
        let (t, restamped) = match when {
            When::Early(t) => (t, true),
            When::Marked(t) => (t, false),
        };
        if s.round_due(t) {
            round(s, t, make.block(), restamped);
        }
    }
    let Some(st) = state_in(s, slot) else {
        let mut buf = [0u64; MAX_DEPTH];
        let n = if matches!(bt, Backtrace::From(_)) { unwind::libgcc::capture(&mut buf, s.depth()) } else { 0 };
        let frames = matches!(bt, Backtrace::From(_)).then_some(&buf[..n]);
        write_sync(s, sys::gettid(), stamp(), frames, known(bt), make);
        return false;
    };
    let register = E::REGISTERS && !st.exit_registered;
    if s.test.stall_every != 0 {
        stall(s, &mut st.events);
    }
    // Unwind before appending: the writer may be waiting for the append.
    let n = match bt {
        Backtrace::From(at) => Some(st.unwinding.capture(s.unwinder, s.depth(), at)),
        _ => None,
    };
    let frames = n.map(|n| st.unwinding.frames(n));
    let mut make = Some(make);
    // Some(behind): appended; None: the stream has ended, write it now.
    let appended = st.buf.own(&s.handoff, |b| {
        if s.is_finished() {
            return None;
        }
        let now = match when {
            // A collection began since the stamp: it may state a
            // watermark past it without this event (stream/order.rs).
            When::Early(t) if t < order::epoch() => s.now(),
            When::Early(t) | When::Marked(t) => t,
        };
        b.begin(st.tid, || now);
        let id = match frames {
            None => known(bt),
            Some(f) => intern_in(s, &mut st.stacks, b, f),
        };
        make.take()?.write(&mut b.enc, &mut b.cur, now, id);
        let mut behind = false;
        if b.cur.len() >= FLUSH_AT {
            let full = std::mem::replace(&mut b.cur, Vec::with_capacity(BUF_CAP));
            b.full_bytes += full.len();
            behind = s.buffer_full(full.len());
            b.full.push(full);
        }
        Some(behind)
    });
    match (appended, make) {
        (Some(true), _) => s.throttle(),
        (None, Some(make)) => write_sync(s, st.tid, stamp(), frames, known(bt), make),
        _ => {}
    }
    register
}

/// `MTRACE_TEST_ORDER`'s stall: every K-th event of the thread (counted
/// in `events`) sleeps between its stamp and its push.
#[cold]
fn stall(s: &Session, events: &mut u64) {
    *events += 1;
    if events.is_multiple_of(s.test.stall_every) {
        sys::sleep_us(s.test.stall_us);
    }
}

/// The id of a backtrace [`intern`] defined, else 0.
fn known(bt: Backtrace) -> u32 {
    match bt {
        Backtrace::Known(id) => id,
        _ => 0,
    }
}

/// The slow path after the final flush or after this thread's exit: encode
/// the event on its own (defining its backtrace again, or with the id
/// `known` defined before) and write it now.
fn write_sync(s: &Session, tid: u32, now: u64, frames: Option<&[u64]>, known: u32, make: impl Event) {
    let mut out = Vec::with_capacity(256);
    let mut enc = Encoder::new();
    enc.encode(&mut out, &Record::Thread { tid, time_ns: now });
    let id = match frames {
        None => known,
        Some(f) => {
            let id = s.new_stack_id();
            enc.stack(&mut out, id, f);
            id
        }
    };
    make.write(&mut enc, &mut out, now, id);
    s.write_sync(&out);
}
