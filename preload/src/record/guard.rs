//! The per-thread reentrancy guard. While a thread is inside a hook, every
//! allocation it makes (the tracer's own, or the real function's calls back
//! into the hooks, such as libstdc++'s `operator new` calling `malloc`) is
//! forwarded untraced, and kept for the hook to write as it leaves
//! (nested.rs). Its bits live in the thread's word (slot.rs).

use std::cell::Cell;

use crate::record::nested;
use crate::record::slot::{Slot, FORWARDING, IN_HOOK, MARKS, NESTED, PARK_PENDING};

/// What [`Guard::enter_as`] found.
pub enum Entry {
    /// The thread entered the hook.
    Hook(Guard),
    /// The thread already was inside a hook; `forwarding` if that hook's
    /// call forwards to another allocator that ends in ours.
    Nested { forwarding: bool },
}

/// Proof that this thread is inside a hook; leaving the scope leaves the hook
/// (also when a C++ exception unwinds through it), and writes what was kept
/// inside it (nested.rs) but the hook's own block.
pub struct Guard {
    /// This thread's word (slot.rs), found once at the entry.
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
        let g = slot.flags();
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
        self.slot.flags()
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
    let f = slot.flags();
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
            nested::write(alloc, free);
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
            crate::platform::park::park_here(self.own.get().0);
        }
    }
}

/// Before a wait inside a hook that may last (for a report the hook asked
/// for): what the hook kept is written, and its mark taken back, so that
/// the writer's watermark does not wait for the waiting thread (the report
/// waits for the watermark). A later stamp in the hook marks again.
pub fn unmark_now() {
    let slot = Slot::current();
    let f = slot.flags();
    if f.get() & NESTED != 0 {
        nested::write(0, 0);
    }
    let v = f.get();
    if v & NESTED == 0 && v & MARKS != 0 {
        f.set(v & !MARKS);
        slot.unmark(v & MARKS);
    }
}

/// A report point named `name` (written to `out`, or the default
/// .memlog) that the calling hook waits for: its marker written and the
/// report started by the stream, then this thread's mark taken back
/// ([`unmark_now`]) while it waits. True when the report was written.
/// `round` runs while it waits for a socket's reader to answer (a solo
/// process's round, which reads the answer: the session room's
/// `solo::round_now`, handed down since this room never names it).
pub fn report_waited(
    s: &crate::stream::Session,
    name: &str,
    out: Option<&str>,
    round: fn(&crate::stream::Session),
) -> bool {
    s.report_started(name, out).is_some_and(|started| {
        unmark_now();
        s.reporter.wait(started, &|| round(s), &|| s.is_finished())
    })
}

/// Leaves a hook entered with a guard that was forgotten (fork.rs holds
/// the guard from the fork's prepare handler to its parent handler).
pub fn leave_held() {
    drop(Guard { slot: Slot::current(), waiting: false, own: Cell::new((0, 0)) });
}
