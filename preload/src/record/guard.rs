//! The per-thread reentrancy guard. While a thread is inside a hook, every
//! allocation it makes (the tracer's own, or the real function's calls back
//! into the hooks, such as libstdc++'s `operator new` calling `malloc`) is
//! forwarded untraced.
//!
//! The guard also tells the leak scan's stop signal (stop.rs) that the
//! thread may hold a lock the scan needs (the real malloc's, a buffer's):
//! such a thread is parked when it leaves the hook instead.

use std::cell::Cell;
use std::sync::atomic::AtomicU64;

use crate::platform::static_tls::FastLocal;

use crate::stream::{self, order, Mark};

/// Bit of [`STATE`]: the thread is inside a hook.
const IN_HOOK: u8 = 1;
/// Bit of [`STATE`]: a stop signal arrived inside the hook; park on leaving.
const PARK_PENDING: u8 = 2;
/// Bit of [`STATE`]: events made inside a hook wait to be written
/// (nested.rs); kept in this word so that checking costs no extra
/// thread-local access on the way in or out of a hook.
const NESTED: u8 = 4;
/// Bit of [`STATE`]: the hook's call forwards to an allocator that ends in
/// ours (see hooks::traced_as): calls nested in it are the hook's own.
const FORWARDING: u8 = 8;
/// Bits of [`STATE`]: how the hook told the writer, before its first
/// stamp ([`Slot::mark`]), that it is stamping events (stream/order.rs):
/// in its buffer's word, or in the shared count. Kept in the flags so that
/// a guard left by [`leave_held`] or torn down by a fork child's reset
/// finds (or forgets) its mark.
const MARK_OWN: u8 = 16;
const MARK_SHARED: u8 = 32;
const MARKS: u8 = MARK_OWN | MARK_SHARED;
/// Bit of [`STATE`]: the thread is the tracer's for good (the writer): it
/// writes its records itself, and never marks.
const TRACER: u8 = 64;

/// What [`Guard::enter_as`] found.
pub enum Entry {
    /// The thread entered the hook.
    Hook(Guard),
    /// The thread already was inside a hook; `forwarding` if that hook's
    /// call forwards to another allocator that ends in ours.
    Nested { forwarding: bool },
}

/// This thread's hook state and its tracer state (thread.rs), together: a
/// thread-local of a shared library costs a call to `__tls_get_addr` per
/// access (unless its static offset is known: [`FastLocal`]), so a hook
/// finds both with one (see [`Guard::slot`]).
struct Tls {
    flags: Cell<u8>,
    thread: Cell<*mut crate::record::thread::ThreadState>,
    /// The word of this thread's buffer its hooks mark (stream/order.rs),
    /// and the session it belongs to; null while the thread has none.
    since: Cell<*const AtomicU64>,
    since_gen: Cell<u64>,
    /// Under sampling (sample.rs): bytes this thread still allocates
    /// before its next sample (0: none drawn yet), and its random state.
    /// Here so that the sampling decision costs no access of its own.
    to_sample: Cell<u64>,
    rng: Cell<u64>,
}

thread_local! {
    // Const-initialised and without Drop: touching it never allocates or
    // registers a destructor, so it is safe in the very first malloc.
    static STATE_KEY: Tls = const {
        Tls {
            flags: Cell::new(0),
            thread: Cell::new(std::ptr::null_mut()),
            since: Cell::new(std::ptr::null()),
            since_gen: Cell::new(0),
            to_sample: Cell::new(0),
            rng: Cell::new(0),
        }
    };
}

/// This thread's [`Tls`], reached from the thread pointer once found in
/// the static TLS area (platform/static_tls.rs).
static STATE: FastLocal<Tls> = FastLocal::new(&STATE_KEY);

/// Lets the hooks find [`STATE`] from the thread pointer: from the
/// constructor, on the thread that runs it.
pub fn find_static_tls() {
    STATE.find();
}

/// This thread's pointer to its tracer state (thread.rs), as the hook that
/// entered found it. Not `Send`: it is the entering thread's own.
#[derive(Clone, Copy)]
pub struct Slot(*const Tls);

impl Slot {
    /// The calling thread's slot (one thread-local access: a read of the
    /// thread pointer once [`STATE`]'s static offset is known, else a call
    /// to `__tls_get_addr`, before the constructor).
    #[inline(always)]
    pub fn current() -> Slot {
        STATE.with(|t| Slot(t))
    }

    /// The cell holding this thread's tracer state (thread.rs: null until
    /// its first event, a marker once torn down at thread exit).
    pub fn cell(&self) -> &Cell<*mut crate::record::thread::ThreadState> {
        &self.tls().thread
    }

    /// The word of this thread's buffer in session `gen` its hooks mark
    /// (null: none; thread.rs sets it with the buffer).
    pub fn set_since(&self, since: *const AtomicU64, gen: u64) {
        self.tls().since.set(since);
        self.tls().since_gen.set(gen);
    }

    /// Marks the thread inside its hook as stamping events, unless it is
    /// already (or is the tracer's, or in no hook): before every stamp of
    /// an event a hook buffers. Only the hook's stamps hold the writer's
    /// watermark back, not its whole call (an API call that waits for a
    /// report must not wait for itself).
    #[inline(always)]
    pub fn mark(&self) {
        let t = self.tls();
        let v = t.flags.get();
        if v & (MARKS | TRACER) != 0 || v & IN_HOOK == 0 {
            return;
        }
        let p = t.since.get();
        let m = if !p.is_null() && t.since_gen.get() == stream::generation() {
            // SAFETY: set by thread.rs to the word of the buffer this
            // thread's state holds, and cleared before that state goes.
            order::enter(Some(unsafe { &*p }))
        } else if stream::tracing_may_start() {
            // No buffer in the current session yet: its first event.
            order::enter(None)
        } else {
            return;
        };
        t.flags.set(v | if m == Mark::Own { MARK_OWN } else { MARK_SHARED });
    }

    /// Takes back the mark `m` of [`Slot::mark`] (the flags cleared by
    /// the caller).
    #[inline(always)]
    fn unmark(&self, m: u8) {
        let p = self.tls().since.get();
        match m {
            // A word of an older session (a fork or an attach in between)
            // is that session's: clearing it is harmless.
            // SAFETY: as in `mark`.
            MARK_OWN if !p.is_null() => order::leave(Mark::Own, Some(unsafe { &*p })),
            MARK_SHARED => order::leave(Mark::Shared, None),
            _ => {}
        }
    }

    /// This thread's sampling state: (bytes to its next sample, random
    /// state); see sample.rs.
    #[inline(always)]
    pub fn sampling(&self) -> (&Cell<u64>, &Cell<u64>) {
        let t = self.tls();
        (&t.to_sample, &t.rng)
    }

    #[inline(always)]
    fn tls(&self) -> &Tls {
        // SAFETY: this thread's STATE (a Slot is not Send), a thread-local
        // without destructor: it lives as long as the thread.
        unsafe { &*self.0 }
    }
}

/// Proof that this thread is inside a hook; leaving the scope leaves the hook
/// (also when a C++ exception unwinds through it), and writes what was kept
/// inside it (nested.rs) but the hook's own block.
pub struct Guard {
    /// This thread's STATE, found once at the entry.
    slot: Slot,
    /// Events from earlier hooks were waiting at the entry.
    waiting: bool,
    /// The hook's own block: (allocated at, freed at), 0 for none.
    own: Cell<(u64, u64)>,
}

impl Guard {
    /// Enters the hook, or `None` when this thread already is inside one.
    #[inline]
    pub fn enter() -> Option<Guard> {
        match Guard::enter_as(false) {
            Entry::Hook(g) => Some(g),
            Entry::Nested { .. } => None,
        }
    }

    /// [`Guard::enter`] that tells a nested call whether the hook it is in
    /// forwards (and, entering, marks this hook so when `forwarding`).
    #[inline]
    pub fn enter_as(forwarding: bool) -> Entry {
        let slot = Slot::current();
        let g = &slot.tls().flags;
        let v = g.get();
        if v & IN_HOOK != 0 {
            Entry::Nested { forwarding: v & FORWARDING != 0 }
        } else {
            // A mark kept by the previous hook for its waiting events
            // (see Drop) stands.
            g.set(IN_HOOK | (v & NESTED) | (v & MARKS) | if forwarding { FORWARDING } else { 0 });
            Entry::Hook(Guard { slot, waiting: v & NESTED != 0, own: Cell::new((0, 0)) })
        }
    }

    /// The forwarding call returned: calls nested from now on are not the
    /// hook's own.
    #[inline]
    pub fn end_forwarding(&self) {
        let g = self.flags();
        g.set(g.get() & !FORWARDING);
    }

    /// This thread's tracer state slot, for the hook's event.
    #[inline]
    pub fn slot(&self) -> Slot {
        self.slot
    }

    fn flags(&self) -> &Cell<u8> {
        &self.slot.tls().flags
    }

    /// Whether events kept by earlier hooks waited at the entry (the hook
    /// writes them before its call, so that what is kept during the call
    /// is the call's).
    #[inline]
    pub fn waiting(&self) -> bool {
        self.waiting
    }

    /// Records the hook's own block, which events kept inside it leave out.
    #[inline]
    pub fn set_own(&self, own: (u64, u64)) {
        self.own.set(own);
    }

    /// Marks the calling thread (the writer) as the tracer's for good.
    pub fn hold_forever() {
        STATE.with(|t| t.flags.set(IN_HOOK | TRACER));
    }
}

/// What [`quiet`] did with the call `C`.
pub enum Quiet<T, C> {
    /// The call ran inside the guard and is recorded nowhere: the hook is
    /// done.
    Ran(T),
    /// The thread is inside a hook or has hook state to honour (events
    /// waiting, a mark kept): the general path ([`Guard::enter_as`]).
    Busy(C),
    /// `skip` said the call is recorded (having decided it, with its side
    /// effects): the general path, which must not decide again.
    Recorded(C),
}

impl<T, C> Quiet<T, C> {
    /// The call's result if it ran; else the call back, and whether `skip`
    /// decided it is recorded.
    #[inline(always)]
    pub fn ran(self) -> Result<T, (C, bool)> {
        match self {
            Quiet::Ran(r) => Ok(r),
            Quiet::Recorded(c) => Err((c, true)),
            Quiet::Busy(c) => Err((c, false)),
        }
    }
}

/// The short way through a hook that records nothing (under sampling, an
/// allocation the count-down does not pick, a free of a block never
/// sampled): when the thread is in no hook and has nothing waiting, and
/// `skip` (given the thread's slot) says so, runs `call` by `run` inside
/// the guard as [`Guard::enter_as`] would, with one thread-local access
/// and no bookkeeping but the flags. Without it the hooks made 94
/// instructions per call on jq (`valgrind --tool=cachegrind`).
#[inline(always)]
pub fn quiet<T, C>(
    forwarding: bool,
    skip: impl FnOnce(Slot) -> bool,
    call: C,
    run: impl FnOnce(C, Slot) -> T,
) -> Quiet<T, C> {
    // The slot first, and the rest outside `with`: inside it, the whole
    // hook became one function that was not inlined (an extra call and
    // 80 instructions more per operation on churn).
    let slot = Slot::current();
    let f = &slot.tls().flags;
    // The general path's branches are marked cold, so that the short way's
    // instructions lie together (13 cache lines for a malloc and a free
    // before, where the program's own code competes for the first-level
    // instruction cache; see docs/SAMPLING.md).
    if f.get() != 0 {
        std::hint::cold_path();
        return Quiet::Busy(call);
    }
    let inside = IN_HOOK | if forwarding { FORWARDING } else { 0 };
    // Inside the guard while deciding too: the decision may take the
    // sampled set's lock (sampled.rs), where no stop may park it.
    f.set(inside);
    if !skip(slot) {
        std::hint::cold_path();
        leave_quiet(f, inside, slot);
        return Quiet::Recorded(call);
    }
    let r = run(call, slot);
    leave_quiet(f, inside, slot);
    Quiet::Ran(r)
}

/// Leaves [`quiet`]'s guard, entered with the flags `inside`.
#[inline(always)]
fn leave_quiet(f: &Cell<u8>, inside: u8, slot: Slot) {
    if f.get() == inside {
        f.set(0);
    } else {
        std::hint::cold_path();
        // Something happened inside (a nested event kept, a stop signal):
        // leave as the general path's guard does.
        f.set(f.get() & !FORWARDING);
        drop(Guard { slot, waiting: false, own: Cell::new((0, 0)) });
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        let g = self.flags();
        let mut v = g.get();
        if v & NESTED == 0 {
            g.set(0);
        } else {
            let (alloc, free) = self.own.get();
            crate::record::recorder::write_nested(alloc, free);
            // Events kept while writing (rare) wait for the next hook,
            // which writes them: the mark stays until then, since their
            // stamps are in no buffer yet.
            let keep = g.get() & NESTED;
            v = g.replace(if keep != 0 { keep | (g.get() & MARKS) } else { 0 });
            if keep != 0 {
                v &= !MARKS;
            }
        }
        // After the hook's last push; before parking, which may last.
        if v & MARKS != 0 {
            self.slot.unmark(v & MARKS);
        }
        if v & PARK_PENDING != 0 {
            (crate::UP.park)(self.own.get().0);
        }
    }
}

/// Before a wait inside a hook that may last (for a report the hook asked
/// for): what the hook kept is written, and its mark taken back, so that
/// the writer's watermark does not wait for the waiting thread (the report
/// waits for the watermark). A later stamp in the hook marks again.
pub fn unmark_now() {
    let slot = Slot::current();
    let f = &slot.tls().flags;
    if f.get() & NESTED != 0 {
        crate::record::recorder::write_nested(0, 0);
    }
    let v = f.get();
    if v & NESTED == 0 && v & MARKS != 0 {
        f.set(v & !MARKS);
        slot.unmark(v & MARKS);
    }
}

/// Leaves a hook entered with a guard that was forgotten (fork.rs holds
/// the guard from the fork's prepare handler to its parent handler).
pub fn leave_held() {
    drop(Guard { slot: Slot::current(), waiting: false, own: Cell::new((0, 0)) });
}

/// Notes that events wait in nested.rs (`waiting`) or that none do.
pub fn set_nested(waiting: bool) {
    STATE.with(|t| t.flags.set(if waiting { t.flags.get() | NESTED } else { t.flags.get() & !NESTED }));
}

/// From the stop signal's handler: true when the thread is inside a hook,
/// in which case it parks when it leaves the hook.
pub fn defer_park() -> bool {
    STATE.with(|t| {
        let v = t.flags.get();
        if v & IN_HOOK != 0 {
            t.flags.set(v | PARK_PENDING);
        }
        v & IN_HOOK != 0
    })
}

/// The calling thread's state is torn down inside a hook (thread exit):
/// a mark kept in its buffer's word moves to the shared count, where the
/// rest of the hook finds it, and the thread has no word from now on.
pub fn mark_to_shared() {
    STATE.with(|t| {
        let v = t.flags.get();
        let p = t.since.replace(std::ptr::null());
        if v & MARK_OWN != 0 && !p.is_null() {
            // SAFETY: as in Slot::mark; the state holding its buffer is
            // still alive here.
            order::to_shared(unsafe { &*p });
            t.flags.set(v & !MARK_OWN | MARK_SHARED);
        }
    })
}

/// In a forked child: the only thread left is not inside a hook of the
/// parent's, no stop is pending, and its buffer is the parent's.
pub fn reset_in_child() {
    STATE.with(|t| {
        t.flags.set(0);
        t.since.set(std::ptr::null());
    });
}
