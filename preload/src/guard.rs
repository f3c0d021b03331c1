//! The per-thread reentrancy guard. While a thread is inside a hook, every
//! allocation it makes (the tracer's own, or the real function's calls back
//! into the hooks, such as libstdc++'s `operator new` calling `malloc`) is
//! forwarded untraced.
//!
//! The guard also tells the leak scan's stop signal (stop.rs) that the
//! thread may hold a lock the scan needs (the real malloc's, a buffer's):
//! such a thread is parked when it leaves the hook instead.

use std::cell::Cell;

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
/// access, so a hook finds both with one (see [`Guard::slot`]).
struct Tls {
    flags: Cell<u8>,
    thread: Cell<*mut crate::thread::ThreadState>,
}

thread_local! {
    // Const-initialised and without Drop: touching it never allocates or
    // registers a destructor, so it is safe in the very first malloc.
    static STATE: Tls = const { Tls { flags: Cell::new(0), thread: Cell::new(std::ptr::null_mut()) } };
}

/// This thread's pointer to its tracer state (thread.rs), as the hook that
/// entered found it. Not `Send`: it is the entering thread's own.
#[derive(Clone, Copy)]
pub struct Slot(*const Tls);

impl Slot {
    /// The calling thread's slot (one thread-local access).
    pub fn current() -> Slot {
        STATE.with(|t| Slot(t))
    }

    /// The cell holding this thread's tracer state (thread.rs: null until
    /// its first event, a marker once torn down at thread exit).
    pub fn cell(&self) -> &Cell<*mut crate::thread::ThreadState> {
        &self.tls().thread
    }

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
        STATE.with(|t| {
            let g = &t.flags;
            let v = g.get();
            if v & IN_HOOK != 0 {
                Entry::Nested { forwarding: v & FORWARDING != 0 }
            } else {
                g.set(IN_HOOK | (v & NESTED) | if forwarding { FORWARDING } else { 0 });
                Entry::Hook(Guard { slot: Slot(t), waiting: v & NESTED != 0, own: Cell::new((0, 0)) })
            }
        })
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
        STATE.with(|t| t.flags.set(IN_HOOK));
    }
}

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        let g = self.flags();
        let mut v = g.get();
        if v & NESTED == 0 {
            g.set(0);
        }
        if v & NESTED != 0 {
            let (alloc, free) = self.own.get();
            crate::recorder::write_nested(alloc, free);
            v = g.replace(g.get() & NESTED);
        }
        if v & PARK_PENDING != 0 {
            crate::stop::park_here(self.own.get().0);
        }
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

/// In a forked child: the only thread left is not inside a hook of the
/// parent's, and no stop is pending.
pub fn reset_in_child() {
    STATE.with(|t| t.flags.set(0));
}
