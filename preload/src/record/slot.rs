//! This thread's word of hook state, found with one thread-local access:
//! whether it is inside a hook and why (the bits the reentrancy guard,
//! guard.rs, sets and clears), its mark on the stream's order, its
//! sampling state, and its recorder state's pointer (thread.rs). The
//! bottom of `record`: it names no file of it, so that the guard above
//! (whose leaving writes nested events) and the thread state below that
//! (whose teardown enters the guard) reach it without reaching each
//! other.
//!
//! The guard also tells the leak scan's stop signal (stop.rs) that the
//! thread may hold a lock the scan needs (the real malloc's, a buffer's):
//! such a thread is parked when it leaves the hook instead ([`defer_park`]).

use std::cell::Cell;
use std::sync::atomic::AtomicU64;

use crate::platform::static_tls::FastLocal;

use crate::stream::{self, order, Mark};

/// Bit of [`STATE`]: the thread is inside a hook.
pub(super) const IN_HOOK: u8 = 1;
/// Bit of [`STATE`]: a stop signal arrived inside the hook; park on leaving.
pub(super) const PARK_PENDING: u8 = 2;
/// Bit of [`STATE`]: events made inside a hook wait to be written
/// (nested.rs); kept in this word so that checking costs no extra
/// thread-local access on the way in or out of a hook.
pub(super) const NESTED: u8 = 4;
/// Bit of [`STATE`]: the hook's call forwards to an allocator that ends in
/// ours (see hooks::traced_as): calls nested in it are the hook's own.
pub(super) const FORWARDING: u8 = 8;
/// Bits of [`STATE`]: how the hook told the writer, before its first
/// stamp ([`Slot::mark`]), that it is stamping events (stream/order.rs):
/// in its buffer's word, or in the shared count. Kept in the flags so that
/// a guard left by guard.rs's `leave_held` or torn down by a fork child's
/// reset finds (or forgets) its mark.
pub(super) const MARK_OWN: u8 = 16;
pub(super) const MARK_SHARED: u8 = 32;
pub(super) const MARKS: u8 = MARK_OWN | MARK_SHARED;
/// Bit of [`STATE`]: the thread is the tracer's for good (the writer): it
/// writes its records itself, and never marks.
pub(super) const TRACER: u8 = 64;

/// This thread's hook state and its tracer state (thread.rs), together: a
/// thread-local of a shared library costs a call to `__tls_get_addr` per
/// access (unless its static offset is known: [`FastLocal`]), so a hook
/// finds both with one (guard.rs, `Guard::slot`).
struct Tls {
    flags: Cell<u8>,
    /// The thread's recorder state (thread.rs's `ThreadState`), untyped
    /// here: thread.rs alone makes, reads and frees it.
    thread: Cell<*mut ()>,
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

    /// The cell holding this thread's recorder state (thread.rs: null
    /// until its first event, a marker once torn down at thread exit).
    pub fn thread_state(&self) -> &Cell<*mut ()> {
        &self.tls().thread
    }

    /// This thread's hook state bits (the `IN_HOOK` … `TRACER` above).
    #[inline(always)]
    pub(super) fn flags(&self) -> &Cell<u8> {
        &self.tls().flags
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
    pub(super) fn unmark(&self, m: u8) {
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

/// Marks the calling thread (the writer) as the tracer's for good: inside
/// a hook for ever, never marking.
pub fn hold_forever() {
    STATE.with(|t| t.flags.set(IN_HOOK | TRACER));
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
