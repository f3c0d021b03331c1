//! Events of different threads whose stamps are too close to order by time.
//!
//! The books receive the heap's events merged by time (`crate::order`).
//! Two threads' stamps can be out of their true order by the clocks' skew
//! (a consumer's free stamped a few ns before the producer's malloc of the
//! block), so between events of different threads less than [`EPS`] apart
//! the allocator's contract decides instead (C11 7.22.3, and glibc's
//! malloc): an address is not handed out again while its block is live,
//! and a block is freed once.
//!
//! So every heap event waits until the stream has reached [`EPS`] past its
//! time: then every event that could have come before it is known. An
//! event with no other thread's waiting at its address goes into the
//! books as it is (the common case: one comparison per waiting event).
//! Where threads meet at an address, its waiting events are ordered
//! together once no more can join them (the latest is [`EPS`] behind the
//! stream): the first of the best order goes, of the orders that keep each
//! thread's events in their order and events more than [`EPS`] apart in
//! time order — the one whose events follow the address's state and each
//! other as the contract allows most often, then the one least out of time
//! order. The rest are ordered again from the new state.

use std::collections::VecDeque;

use super::heap::EPS;
use super::wrong::Dealloc;
use super::Block;

/// Events waiting at most: a stream whose times stand still (a damaged
/// one) must not make the books wait for ever, or search long.
const MAX_HELD: usize = 256;

/// Events of one address ordered by search at most (their orders are
/// tried: 6! = 720).
const MAX_GROUP: usize = 6;

/// A heap event: an allocation (a `block`) or a deallocation (`d`, at `time`).
#[derive(Clone, Debug)]
pub enum Event {
    Alloc { tid: u32, addr: u64, block: Block },
    Free { tid: u32, addr: u64, time: u64, d: Dealloc },
}

impl Event {
    fn addr(&self) -> u64 {
        match *self {
            Event::Alloc { addr, .. } | Event::Free { addr, .. } => addr,
        }
    }

    fn tid(&self) -> u32 {
        match *self {
            Event::Alloc { tid, .. } | Event::Free { tid, .. } => tid,
        }
    }

    /// ns.
    fn time(&self) -> u64 {
        match self {
            Event::Alloc { block, .. } => block.time,
            Event::Free { time, .. } => *time,
        }
    }

    fn is_alloc(&self) -> bool {
        matches!(self, Event::Alloc { .. })
    }
}

/// The waiting events, in the order they arrived (their time order, but
/// for the skew of the merge's input).
#[derive(Default)]
pub struct Ties {
    held: VecDeque<Event>,
}

impl Ties {
    /// Every event waiting (if any) is of thread `tid`.
    #[inline]
    pub fn all_of(&self, tid: u32) -> bool {
        self.held.iter().all(|e| e.tid() == tid)
    }

    pub fn push(&mut self, e: Event) {
        self.held.push_back(e);
    }

    /// The next event to enter now that the stream has reached `now` (ns;
    /// `None`: its end, every event is due), if one is due; `live(addr)`
    /// tells the address's state in the books (`None`: never seen).
    #[inline]
    pub fn next(&mut self, now: Option<u64>, live: impl Fn(u64) -> Option<bool>) -> Option<Event> {
        let over = self.held.len() > MAX_HELD;
        let due = |t: u64| over || now.is_none_or(|n| t.saturating_add(EPS) < n);
        let h = self.held.front()?;
        if !due(h.time()) {
            return None;
        }
        let (addr, tid) = (h.addr(), h.tid());
        // The other events of the address waiting: with none of another
        // thread, the thread's order is the order.
        let (mut last, mut mixed, mut n) = (h.time(), false, 1);
        for x in self.held.iter().skip(1).filter(|x| x.addr() == addr) {
            (last, mixed, n) = (last.max(x.time()), mixed || x.tid() != tid, n + 1);
        }
        if !mixed {
            return self.held.pop_front();
        }
        // Threads meet at the address: ordered once no more can join
        // (the latest is EPS behind the stream), all together.
        if !due(last) && n < MAX_GROUP {
            return None;
        }
        let i = self.best_first(addr, live(addr));
        self.held.remove(i)
    }

    /// The held position of the event of `addr` to enter first (see the
    /// module), the address being `live` (`None`: never seen).
    #[cold]
    fn best_first(&self, addr: u64, live: Option<bool>) -> usize {
        let at: Vec<usize> = self.held.iter().enumerate().filter(|(_, e)| e.addr() == addr).map(|(i, _)| i).collect();
        let group: Vec<&Event> = at.iter().take(MAX_GROUP).map(|&i| &self.held[i]).collect();
        let state = match live {
            None => State::Nothing,
            Some(true) => State::Alloc,
            Some(false) => State::Free,
        };
        let mut s = Search { group: &group, order: [0; MAX_GROUP], best: None };
        s.go(state, 0, 0, 0, 0);
        at[s.best.map_or(0, |(_, _, first)| first)]
    }
}

/// What came last at an address.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Nothing,
    Alloc,
    Free,
}

/// Whether an allocation (`alloc`) or a free may follow `s`: an allocation
/// after anything but an allocation, a free after an allocation.
fn fits(s: State, alloc: bool) -> u32 {
    u32::from((s == State::Alloc) != alloc)
}

/// A depth-first search over the orders of a group.
struct Search<'a> {
    group: &'a [&'a Event],
    order: [usize; MAX_GROUP],
    /// The best so far: (fits, skew in ns, its first event).
    best: Option<(u32, u64, usize)>,
}

impl Search<'_> {
    /// Extends `order[..depth]` (its events `used`, following `state`).
    fn go(&mut self, state: State, depth: usize, used: u32, score: u32, skew: u64) {
        let g = self.group;
        if depth == g.len() {
            let better = match self.best {
                None => true,
                Some((s, k, _)) => score > s || (score == s && skew < k),
            };
            if better {
                self.best = Some((score, skew, self.order[0]));
            }
            return;
        }
        for i in 0..g.len() {
            if used & 1 << i != 0 {
                continue;
            }
            let e = g[i];
            // Every unused event that must come first: an earlier one of
            // the same thread, or one of another thread more than EPS earlier.
            let blocked = (0..g.len()).any(|j| {
                j != i
                    && used & 1 << j == 0
                    && if g[j].tid() == e.tid() { j < i } else { g[j].time().saturating_add(EPS) < e.time() }
            });
            if blocked {
                continue;
            }
            self.order[depth] = i;
            let later = (0..g.len()).filter(|&j| j != i && used & 1 << j == 0);
            let k = skew + later.map(|j| e.time().saturating_sub(g[j].time())).sum::<u64>();
            let next = if e.is_alloc() { State::Alloc } else { State::Free };
            self.go(next, depth + 1, used | 1 << i, score + fits(state, e.is_alloc()), k);
        }
    }
}
