//! One address's window: its last [`RING`] events in program order.

use super::{EPS, RING};

/// What came before the oldest kept event of an address.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Before {
    /// Nothing: the window holds the address's whole history.
    Nothing,
    Alloc,
    Free,
}

/// One event: its time (ns), thread, and kind.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ev {
    pub time: u64,
    pub tid: u32,
    pub alloc: bool,
}

/// An event shifted out of the window that a late one may still match:
/// its time, ns.
pub enum Frozen {
    /// A free that followed a free or nothing.
    Orphan(u64),
    /// An allocation followed by an allocation.
    Open(u64),
}

/// What adding an event did.
pub struct Added {
    /// The new event went after all kept ones, nothing else moved.
    pub appended: bool,
    /// The latest event now.
    pub last: Ev,
    pub frozen: Option<Frozen>,
    /// The allocation shifted out last (at this time, ns) became open
    /// (`true`: an allocation now follows it) or was closed (`false`: a
    /// free now does).
    pub before_open: Option<(u64, bool)>,
    /// The change in unmatched frees, kept and frozen (an orphan shifted
    /// out stays unmatched).
    pub unmatched: i64,
    /// What the new event follows in the order now: the event right before
    /// it (or what came before the window), and that event's time, ns.
    pub prev: (Before, u64),
}

/// Whether an event (`alloc` or free) may follow `x` in a history: an
/// allocation after anything but an allocation, a free after an allocation.
fn fits(x: Before, alloc: bool) -> u32 {
    u32::from((x == Before::Alloc) != alloc)
}

fn kind(e: &Ev) -> Before {
    if e.alloc {
        Before::Alloc
    } else {
        Before::Free
    }
}

/// The last events of one address, in program order.
#[derive(Clone, Debug)]
pub struct Window {
    ev: [Ev; RING],
    n: u8,
    before: Before,
    /// The time of the event `before` describes.
    before_time: u64,
}

/// Unmatched frees in `ev` after `before`.
fn unmatched(before: Before, ev: &[Ev]) -> i64 {
    let mut prev = before;
    let mut n = 0;
    for e in ev {
        n += i64::from(!e.alloc && prev != Before::Alloc);
        prev = kind(e);
    }
    n
}

impl Window {
    pub fn new() -> Window {
        Window { ev: [Ev::default(); RING], n: 0, before: Before::Nothing, before_time: 0 }
    }

    fn kept(&self) -> &[Ev] {
        &self.ev[..self.n as usize]
    }

    /// The latest event's time, ns.
    pub fn last_time(&self) -> u64 {
        self.kept().last().map_or(self.before_time, |e| e.time)
    }

    /// The times of the kept allocations, latest first.
    pub fn allocs_from_the_end(&self) -> impl Iterator<Item = u64> + '_ {
        self.kept().iter().rev().filter(|e| e.alloc).map(|e| e.time)
    }

    /// Adds event `e`: after its thread's own kept events; among other
    /// threads' by time, except that events of different threads within
    /// [`EPS`] of each other are put in the order in which they alternate
    /// best. `None`: it is older than the window. An allocation that is
    /// not `e` may end up latest only if `known(time)`: its block is kept.
    pub fn add(&mut self, e: Ev, known: &dyn Fn(u64) -> bool) -> Option<Added> {
        let n = self.n as usize;
        let kept = &self.ev[..n];
        let lo = kept.iter().rposition(|k| k.tid == e.tid).map_or(0, |i| i + 1);
        let natural = kept[lo..].iter().position(|k| k.time > e.time).map_or(n, |i| lo + i);
        let close = kept.iter().any(|k| k.tid != e.tid && k.time.abs_diff(e.time) <= EPS);
        if natural == 0 && self.before != Before::Nothing && e.time <= self.before_time {
            return None;
        }
        if natural == n && !close {
            // The common case: the event is the latest.
            let prev = kept.last().map_or(self.before, kind);
            let prev_time = kept.last().map_or(self.before_time, |k| k.time);
            let mut frozen = None;
            if n == RING {
                frozen = self.freeze(self.ev[0], *self.ev.get(1).unwrap_or(&e));
                self.ev.copy_within(1.., 0);
                self.n -= 1;
            }
            self.ev[self.n as usize] = e;
            self.n += 1;
            let unmatched = i64::from(!e.alloc && prev != Before::Alloc);
            let prev = (prev, prev_time);
            return Some(Added { appended: true, last: e, frozen, before_open: None, unmatched, prev });
        }
        let mut items = [Ev::default(); RING + 1];
        items[..natural].copy_from_slice(&kept[..natural]);
        items[natural] = e;
        items[natural + 1..=n].copy_from_slice(&kept[natural..]);
        // Where the new event ends up.
        let mut at = natural;
        if close {
            // A few events: try every order the threads and times allow.
            let mut order = [0u8; RING + 1];
            let can_end = |i: usize| i == natural || !items[i].alloc || known(items[i].time);
            let identity = std::array::from_fn(|i| i as u8);
            let mut best = (0u32, u64::MAX, identity);
            search(&items[..=n], (self.before, self.before_time), &can_end, &mut order, 0, 0, 0, 0, &mut best);
            // No order passed (the kept ones break the time rule): as read.
            let order = best.2;
            at = order[..=n].iter().position(|&k| k as usize == natural).unwrap_or(natural);
            let mut sorted = items;
            for (o, &k) in sorted.iter_mut().zip(&order[..=n]) {
                *o = items[k as usize];
            }
            items = sorted;
        }
        let prev = match at {
            0 => (self.before, self.before_time),
            _ => (kind(&items[at - 1]), items[at - 1].time),
        };
        let old = unmatched(self.before, kept);
        let was_open = n > 0 && kept[0].alloc;
        let before_open =
            (self.before == Before::Alloc && was_open != items[0].alloc).then_some((self.before_time, items[0].alloc));
        let mut frozen = None;
        let mut items = &items[..=n];
        if n == RING {
            frozen = self.freeze(items[0], items[1]);
            items = &items[1..];
        }
        self.ev[..items.len()].copy_from_slice(items);
        self.n = items.len() as u8;
        let orphan = i64::from(matches!(frozen, Some(Frozen::Orphan(_))));
        let unmatched = unmatched(self.before, self.kept()) + orphan - old;
        Some(Added { appended: false, last: *items.last().unwrap(), frozen, before_open, unmatched, prev })
    }

    /// `first`, followed by `next`, leaves the window: it is what came
    /// before from now on, and is returned when a late event may still
    /// match it. The caller removes it from `ev`.
    fn freeze(&mut self, first: Ev, next: Ev) -> Option<Frozen> {
        let frozen = match (first.alloc, self.before) {
            (false, Before::Alloc) => None,
            (false, _) => Some(Frozen::Orphan(first.time)),
            (true, _) => next.alloc.then_some(Frozen::Open(first.time)),
        };
        self.before = kind(&first);
        self.before_time = first.time;
        frozen
    }
}

/// Depth-first over the orders of `items` that keep each thread's order
/// and the time order of events more than [`EPS`] apart: the best has the
/// most pairs less than EPS apart that alternate (`fits`), then the least skew (the sum, over
/// pairs out of time order, of their times' difference, ns): whatever the
/// order the events were read in. Only an event `can_end` may be last.
#[allow(clippy::too_many_arguments)]
fn search(
    items: &[Ev],
    before: (Before, u64),
    can_end: &dyn Fn(usize) -> bool,
    order: &mut [u8; RING + 1],
    depth: usize,
    used: u32,
    score: u32,
    skew: u64,
    best: &mut (u32, u64, [u8; RING + 1]),
) {
    let m = items.len();
    if depth == m {
        if can_end(order[m - 1] as usize) && (score > best.0 || (score == best.0 && skew < best.1)) {
            *best = (score, skew, *order);
        }
        return;
    }
    let (prev, prev_time) = match depth {
        0 => before,
        _ => {
            let p = &items[order[depth - 1] as usize];
            (kind(p), p.time)
        }
    };
    for i in 0..m {
        if used & 1 << i != 0 {
            continue;
        }
        let e = items[i];
        // Every unused event that must come first: an earlier one of the
        // same thread, or one of another thread more than EPS earlier.
        let blocked = (0..m).any(|j| {
            j != i
                && used & 1 << j == 0
                && if items[j].tid == e.tid { j < i } else { items[j].time.saturating_add(EPS) < e.time }
        });
        if blocked {
            continue;
        }
        order[depth] = i as u8;
        // Only pairs closer than EPS count: a pair farther apart that does
        // not alternate is explained by an event not read yet.
        let close = prev != Before::Nothing && prev_time.abs_diff(e.time) <= EPS;
        let s = score + u32::from(close) * fits(prev, e.alloc);
        let later = (0..m).filter(|&j| j != i && used & 1 << j == 0);
        let k = skew + later.map(|j| e.time.saturating_sub(items[j].time)).sum::<u64>();
        search(items, before, can_end, order, depth + 1, used | 1 << i, s, k, best);
    }
}
