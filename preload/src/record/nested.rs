//! Allocations and frees a thread makes while it is inside a hook.
//!
//! The reentrancy guard forwards them untraced, and most are the same block
//! the outer hook records (libstdc++'s `operator new` calling `malloc`,
//! `operator delete` calling `free`). The others are real heap blocks the
//! program may free later: glibc allocates a thread's larger DTV when the
//! tracer's thread-local first touches it, dlsym's error state, a signal
//! handler's malloc that interrupted a hook. Untraced, their later free was
//! an unmatched free, and a block they reused looked leaked (a producer/
//! consumer program: pthread_join freed a DTV at an address last seen
//! freed). So they are kept here, with their time, and the outer hook
//! writes them after its own event (`Family::Internal`, no backtrace),
//! dropping those at the address the outer hook itself allocated or freed.
//!
//! Fixed-size and thread-local, const-initialised: no allocation and no
//! destructor, as everything reachable from the hooks.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use mtrace_format::{Family, Record};

use crate::platform::static_tls::FastLocal;
use crate::record::thread::{self, When};
use crate::{platform::sys, stream};

/// One event made inside a hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// (address, size, time ns).
    Alloc(u64, u64, u64),
    /// (address, time ns).
    Free(u64, u64),
}

/// Events kept per thread until the outer hook writes them; more are
/// counted in [`DROPPED`] (the writer thread, always "inside", fills it).
const CAP: usize = 16;

thread_local! {
    static EVENTS_KEY: [Cell<Option<Event>>; CAP] = const { [const { Cell::new(None) }; CAP] };
    static LEN_KEY: Cell<usize> = const { Cell::new(0) };
}
static EVENTS: FastLocal<[Cell<Option<Event>>; CAP]> = FastLocal::new(&EVENTS_KEY);
static LEN: FastLocal<Cell<usize>> = FastLocal::new(&LEN_KEY);

/// Lets the hooks reach this module's thread-locals from the thread
/// pointer (platform/static_tls.rs): from the library's constructor.
pub fn find_static_tls() {
    EVENTS.find();
    LEN.find();
}

/// Events that found the list full.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Keeps `e` for the outer hook.
pub fn keep(e: Event) {
    let n = LEN.with(|l| l.get());
    if n == CAP {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    EVENTS.with(|v| v[n].set(Some(e)));
    LEN.with(|l| l.set(n + 1));
    crate::record::slot::set_nested(true);
}

/// Takes the kept events in order, leaving out allocations at
/// `outer_alloc` and frees at `outer_free` (the outer hook's own block).
pub fn take(outer_alloc: u64, outer_free: u64, mut f: impl FnMut(Event)) {
    let n = LEN.with(|l| l.replace(0));
    crate::record::slot::set_nested(false);
    for i in 0..n {
        let Some(e) = EVENTS.with(|v| v[i].take()) else { continue };
        match e {
            Event::Alloc(a, ..) if a == outer_alloc => {}
            Event::Free(a, _) if a == outer_free => {}
            e => f(e),
        }
    }
}

/// Writes the kept events into this thread's buffer, but those of the
/// current hook's own block: allocated at `own_alloc`, freed at
/// `own_free` (0: none). Called by the guard when it knows some wait
/// (guard.rs), and by a hook before its call when some waited at its
/// entry.
pub fn write(own_alloc: u64, own_free: u64) {
    let errno = sys::errno();
    let s = stream::current();
    take(own_alloc, own_free, |e| {
        let Some(s) = s else { return };
        match e {
            Event::Alloc(addr, size, t) => thread::push(s, When::Marked(t), None, |time_ns, _| Record::Alloc {
                time_ns,
                family: Family::Internal,
                addr,
                size,
                stack: 0,
                align: 0,
            }),
            Event::Free(addr, t) => thread::push(s, When::Marked(t), None, |time_ns, _| Record::Free {
                time_ns,
                family: Family::Malloc,
                addr,
                stack: 0,
                align: 0,
                size: 0,
            }),
        }
    });
    sys::set_errno(errno);
}

/// In a forked child: events of the parent's hook are the parent's.
pub fn reset_in_child() {
    LEN.with(|l| l.set(0));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_in_order_and_leaves_out_the_outer_block() {
        keep(Event::Alloc(0x10, 8, 1));
        keep(Event::Free(0x20, 2));
        keep(Event::Alloc(0x30, 16, 3));
        keep(Event::Free(0x40, 4));
        let mut got = Vec::new();
        take(0x30, 0x40, |e| got.push(e));
        assert_eq!(got, vec![Event::Alloc(0x10, 8, 1), Event::Free(0x20, 2)]);
        take(0, 0, |_| panic!("taken twice"));
        for i in 0..CAP as u64 + 2 {
            keep(Event::Free(i, i));
        }
        assert_eq!(DROPPED.load(Ordering::Relaxed), 2);
        let mut n = 0;
        take(0, u64::MAX, |_| n += 1);
        assert_eq!(n, CAP);
    }
}
