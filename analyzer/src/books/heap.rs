//! Heap blocks by address, in the order the program made them, whatever
//! order the threads' chunks are read in.
//!
//! The stream gives each thread's events in program order, but chunks of
//! different threads arrive in the order the writer collected them, and a
//! thread's chunk can come late (it was preempted between stamping an event
//! and buffering it). What restores the order of the events on one address
//! is the allocator's contract (C11 7.22.3, and glibc's malloc): an address
//! is never handed out again while its block is live, and a block is freed
//! once. So on one address the true history alternates — alloc, free,
//! alloc, free … — except for frees of blocks allocated untraced (before
//! tracing started, while collection was stopped), which follow a free or
//! nothing. Timestamps only break ties between threads: events of
//! different threads less than [`EPS`] apart are put in the order in which
//! they alternate best (then the one least out of time order).
//!
//! From that order:
//! - the live block at an address is the allocation that is its latest
//!   event, if the latest event is an allocation: so a late event (one read
//!   after later events at its address) never makes a block live, and an
//!   allocation at an address whose block is live ends that block (its free
//!   is late or was not traced: either way the block is gone);
//! - a free is unmatched (a block from before tracing) when the event before
//!   it is a free, or nothing.
//!
//! Each address keeps its last [`RING`] events (its window, `slot.rs`). A
//! late event inside the window is put in its place and the frees around
//! it are matched again. A late event older than the window matches what
//! the events shifted out of it left unmatched (see [`Heap::late`]).
//! Addresses with nothing live forget their events after [`HORIZON`] ns of
//! trace time, and unmatched events outside the windows are final then.
//! Those are the bounds: a free read more than `HORIZON` after the events
//! around it, or whose allocation comes that late, is counted as a free of
//! a block from before tracing. Exact for any read order while the late
//! events of an address are inside its window or more than `EPS` from
//! other threads' (`heap/tests.rs` tries every interleaving).

use rustc_hash::FxHashMap as HashMap;

use super::wrong::Suspect;
use super::Block;

/// Events kept per address.
pub const RING: usize = 4;

/// Events of different threads closer than this (ns) are ordered by the
/// allocator's contract, not by their times: it covers the skew between
/// two threads' stamps (11 ns seen with a bare `rdtsc`; an unfenced `rdtsc`
/// runs at most a reorder window, ~100 cycles, early; invariant TSCs of
/// one machine agree within tens of ns): 250 ns, plus the stream's time
/// unit (64 ns, `mtrace_format::TIME_SHIFT`), by which two stamps' rounding
/// can move them further apart.
pub const EPS: u64 = 250 + (1 << mtrace_format::TIME_SHIFT);

/// How long (ns of trace time) an address with nothing live keeps its
/// events, and an unmatched free waits for a late allocation.
pub const HORIZON: u64 = 1_000_000_000;

mod hint;
mod slot;
mod table;
use slot::{Before, Ev, Frozen, Window};
use table::{Either, Table};

/// One address: its window of events and the blocks of its two latest
/// allocations in it (the live one, if any, among them).
#[derive(Clone, Debug)]
struct Slot {
    window: Window,
    /// The second is needed when a late event makes the one before the
    /// latest allocation the latest event again.
    blocks: [Option<Block>; 2],
    /// The latest event is the allocation of `blocks[0]`.
    live: bool,
    /// The backtrace of the latest free read ([`NO_STACK`]: none), the
    /// first free of a double free.
    free_stack: u32,
}

impl Slot {
    fn new() -> Slot {
        Slot { window: Window::new(), blocks: [None, None], live: false, free_stack: NO_STACK }
    }
}

/// An address whose whole history is one allocation, maybe followed by
/// its free, read in order: what a [`Slot`] holding those one or two
/// events would say, in 48 bytes instead of 136. Most addresses of a
/// program that keeps its blocks to the end never need more (jq's 1.6
/// million: `mtrace report`'s time went to the page faults of the full
/// slots' 230 MB).
#[derive(Clone, Debug)]
struct Small {
    /// The allocation's block; its time is the allocation's.
    block: Block,
    /// The allocating thread.
    tid: u32,
    freed: bool,
    /// The free's thread, time (ns) and backtrace ([`NO_STACK`]: not
    /// recorded), once `freed`.
    free_tid: u32,
    free_time: u64,
    free_stack: u32,
}

impl Small {
    /// The same history as a full slot: its events added to a new one, in
    /// their order (each comes last: nothing else happens).
    fn full(&self) -> Slot {
        let mut s = Slot::new();
        let alloc = Ev { time: self.block.time, tid: self.tid, alloc: true };
        s.window.add(alloc, &|_| true);
        s.blocks[0] = Some(self.block.clone());
        s.live = true;
        if self.freed {
            s.window.add(Ev { time: self.free_time, tid: self.free_tid, alloc: false }, &|_| true);
            s.live = false;
            s.free_stack = self.free_stack;
        }
        s
    }

    /// Whether a free by `tid` at `time` comes after the allocation as
    /// [`Window::add`] would put it: a later event of the same thread, or
    /// of another more than [`EPS`] after it.
    fn follows(&self, tid: u32, time: u64) -> bool {
        !self.freed && (tid == self.tid || time.checked_sub(self.block.time).is_some_and(|d| d > EPS))
    }
}

/// A backtrace index that stands for none.
pub const NO_STACK: u32 = u32::MAX;

/// An unmatched event outside its address's window.
struct Wait {
    /// ns.
    time: u64,
    /// It came older than the window (else it was shifted out of it).
    late: bool,
}

/// Events of one address outside its window, still unmatched.
#[derive(Default)]
struct Waiting {
    orphans: Vec<Wait>,
    open: Vec<Wait>,
}

/// What an event did to the live blocks.
#[derive(Debug, Default)]
pub struct Change {
    /// A block that ended: freed, or ended by a new allocation at its address.
    pub ended: Option<Block>,
    /// A block now live: the event's own, or (when the events were put in
    /// another order) an earlier one.
    pub born: Option<Block>,
    /// For a free: what it follows in the address's history.
    pub outcome: Outcome,
    /// The change in unmatched frees of the address: positive when the
    /// event made some (the books then add as many [`Suspect`]s with
    /// [`Heap::suspect`]); the heap drops suspects itself when it is
    /// negative.
    pub orphans: i64,
}

/// What a free follows in its address's history, as the events read so far
/// order it. Small: every event returns one (the blocks it names are asked
/// for with [`Heap::block`] in the rare cases that need them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    /// Not a free.
    #[default]
    None,
    /// The allocation of the block in [`Change::ended`] (the common case:
    /// the free came after the allocation, nothing moved).
    Ended,
    /// The allocation at this time (ns): the free ends that block.
    Freed(u64),
    /// A free at `after` (ns): the block freed again is the latest
    /// allocation before it, first freed at backtrace `first_free`.
    Again { after: u64, first_free: u32 },
    /// Nothing: the stream never saw a block allocated at the address.
    Unknown,
    /// Older than its address's window (a late thread's chunk): matched
    /// with what the window shifted out, or waiting; not judged.
    Late,
}

/// The heap: every address with a live block or recent events.
#[derive(Default)]
pub struct Heap {
    slots: Table<Small, Slot>,
    /// Events shifted out of their address's window unmatched, waiting (up
    /// to [`HORIZON`]) for a late event to match them.
    waiting: HashMap<u64, Waiting>,
    /// Frees now unmatched (allocated before tracing, as far as is known).
    unmatched: u64,
    /// Unmatched frees the books judged wrong (double or invalid), by
    /// address: dropped again, latest first, when a late event matches
    /// frees of the address.
    suspects: HashMap<u64, Vec<Suspect>>,
    /// Latest time read, ns.
    now: u64,
    sweep_at: usize,
    /// Slots whose `live` is set.
    live_slots: usize,
}

impl Heap {
    /// Asks the CPU for the index line of `addr` (the first of two steps
    /// of fetching its slot ahead: see `table.rs`).
    #[inline]
    pub fn prefetch_index(&self, addr: u64) {
        self.slots.prefetch_index(addr);
    }

    /// Asks the CPU for the lines of the slot of `addr`, if there is one
    /// (best some records after [`Heap::prefetch_index`]).
    #[inline]
    pub fn prefetch_slot(&self, addr: u64) {
        self.slots.prefetch_slot(addr);
    }

    /// An allocation at `addr` by thread `tid`; `b.time` is its time.
    pub fn alloc(&mut self, tid: u32, addr: u64, b: Block) -> Change {
        self.event(tid, addr, b.time, Some(b), NO_STACK)
    }

    /// A free of `addr` by thread `tid` at `time`, from backtrace `stack`
    /// ([`NO_STACK`]: not recorded).
    pub fn free(&mut self, tid: u32, addr: u64, time: u64, stack: u32) -> Change {
        self.event(tid, addr, time, None, stack)
    }

    /// Keeps `s`, a wrong free the books made of an unmatched free at `addr`.
    pub fn suspect(&mut self, addr: u64, s: Suspect) {
        self.suspects.entry(addr).or_default().push(s);
    }

    /// The wrong frees kept, with their addresses.
    pub fn suspects(&self) -> impl Iterator<Item = (u64, &Suspect)> {
        self.suspects.iter().flat_map(|(&a, v)| v.iter().map(move |s| (a, s)))
    }

    /// `n` unmatched frees of `addr` were matched after all: the latest
    /// suspects of the address go.
    fn matched(&mut self, addr: u64, n: u64) {
        if let Some(v) = self.suspects.get_mut(&addr) {
            v.truncate(v.len().saturating_sub(n as usize));
            if v.is_empty() {
                self.suspects.remove(&addr);
            }
        }
    }

    /// The block allocated at `addr` at `time` (ns), or, with `before`, the
    /// latest allocated there at or before `time`, if still kept.
    pub fn block(&self, addr: u64, time: u64, before: bool) -> Option<&Block> {
        let fits = |b: &&Block| if before { b.time <= time } else { b.time == time };
        match self.slots.get(addr)? {
            Either::Small(s) => Some(&s.block).filter(fits),
            Either::Full(s) => s.blocks.iter().flatten().find(fits),
        }
    }

    /// The block whose bytes hold `addr`, with its start: a live one, else
    /// one already freed whose address has not been forgotten (the second
    /// of the pair says it is freed). Looks at every address kept: for the
    /// rare free of an address that is not a block's.
    pub fn containing(&self, addr: u64) -> Option<(u64, &Block, bool)> {
        let mut found = self.slots.iter().filter_map(|(a, s)| {
            let (b, freed) = match s {
                Either::Small(s) => (&s.block, s.freed),
                Either::Full(s) => (s.blocks[0].as_ref()?, !s.live),
            };
            (a <= addr && addr - a < b.size.max(1)).then_some((a, b, freed))
        });
        let first = found.next()?;
        Some(if first.2 { found.find(|f| !f.2).unwrap_or(first) } else { first })
    }

    fn event(&mut self, tid: u32, addr: u64, time: u64, mut block: Option<Block>, stack: u32) -> Change {
        self.now = self.now.max(time);
        if self.slots.len() >= self.sweep_at {
            self.sweep();
        }
        let alloc = block.is_some();
        let found = self.slots.find(addr);
        // The common histories first: an address's first allocation, and
        // its free in order; they change nothing else.
        match (self.slots.at(found), block) {
            (None, Some(block)) => {
                self.live_slots += 1;
                let change = Change { born: Some(block.clone()), ..Change::default() };
                let small = Small { block, tid, freed: false, free_tid: 0, free_time: 0, free_stack: NO_STACK };
                self.slots.insert_small(found, addr, small);
                return change;
            }
            (Some(Either::Small(s)), None) if s.follows(tid, time) => {
                (s.freed, s.free_tid, s.free_time, s.free_stack) = (true, tid, time, stack);
                self.live_slots -= 1;
                return Change { ended: Some(s.block.clone()), outcome: Outcome::Ended, ..Change::default() };
            }
            // Any other: the full slot's path below, with the block given back.
            (_, b) => block = b,
        }
        let slot = self.slots.full(found, addr, Slot::new, Small::full);
        let known = [0, 1].map(|i| slot.blocks[i].as_ref().map(|b| b.time));
        let e = Ev { time, tid, alloc };
        let Some(added) = slot.window.add(e, &|t| known.contains(&Some(t))) else {
            let orphans = self.late(addr, time, alloc);
            let outcome = if alloc { Outcome::None } else { Outcome::Late };
            return Change { outcome, orphans, ..Change::default() };
        };
        self.unmatched = self.unmatched.wrapping_add_signed(added.unmatched);
        let first_free = slot.free_stack;
        if !alloc {
            slot.free_stack = stack;
        }
        let old = slot.live.then(|| slot.blocks[0].clone()).flatten();
        if added.appended {
            if let Some(b) = block {
                slot.blocks[1] = slot.blocks[0].replace(b);
            }
        } else {
            // The blocks of the two latest allocations, as far as known.
            let mut by_time = |t: u64| match &block {
                Some(b) if t == time => Some(b.clone()),
                _ => slot.blocks.iter_mut().find(|b| b.as_ref().is_some_and(|b| b.time == t)).and_then(Option::take),
            };
            let mut latest = slot.window.allocs_from_the_end();
            let (first, second) = (latest.next(), latest.next());
            slot.blocks = [first.and_then(&mut by_time), second.and_then(&mut by_time)];
        }
        self.live_slots = self.live_slots + usize::from(added.last.alloc) - usize::from(slot.live);
        slot.live = added.last.alloc;
        let new = slot.live.then(|| slot.blocks[0].clone()).flatten();
        let (prev, prev_time) = added.prev;
        let ends_old = added.appended && old.is_some();
        let outcome = match (alloc, prev) {
            (true, _) => Outcome::None,
            (false, Before::Alloc) if ends_old => Outcome::Ended,
            (false, Before::Alloc) => Outcome::Freed(prev_time),
            (false, Before::Free) => Outcome::Again { after: prev_time, first_free },
            (false, Before::Nothing) => Outcome::Unknown,
        };
        let mut change = Change { outcome, orphans: added.unmatched, ..Change::default() };
        if old.as_ref().map(|b| b.time) != new.as_ref().map(|b| b.time) {
            change.ended = old;
            change.born = new;
        }
        if added.unmatched < 0 {
            self.matched(addr, added.unmatched.unsigned_abs());
        }
        match added.frozen {
            Some(Frozen::Orphan(t)) => {
                self.waiting.entry(addr).or_default().orphans.push(Wait { time: t, late: false })
            }
            Some(Frozen::Open(t)) => self.waiting.entry(addr).or_default().open.push(Wait { time: t, late: false }),
            None => {}
        }
        match added.before_open {
            Some((t, true)) => self.waiting.entry(addr).or_default().open.push(Wait { time: t, late: false }),
            Some((t, false)) => {
                if let Some(w) = self.waiting.get_mut(&addr) {
                    if let Some(k) = w.open.iter().position(|o| o.time == t && !o.late) {
                        w.open.swap_remove(k);
                    }
                    if w.orphans.is_empty() && w.open.is_empty() {
                        self.waiting.remove(&addr);
                    }
                }
            }
            None => {}
        }
        change
    }

    /// An event older than its address's window. Where it stood among the
    /// events shifted out is unknown, but not what it must have done there,
    /// since the true history alternates: a free ends an allocation whose
    /// free was missing (an *open* one), an allocation gives its block to
    /// an unmatched free (an *orphan*). Taken in this order: one the times
    /// allow (an open allocation before the free, an orphan after the
    /// allocation); one that came late too (a late thread's chunk frees a
    /// block and allocates the address again, both older than the window);
    /// else the event waits, as an orphan or open.
    /// Returns the change in unmatched frees.
    fn late(&mut self, addr: u64, time: u64, alloc: bool) -> i64 {
        let w = self.waiting.entry(addr).or_default();
        let (mine, theirs) = if alloc { (&mut w.open, &mut w.orphans) } else { (&mut w.orphans, &mut w.open) };
        // The nearest the times allow: the latest open allocation before a
        // free, the earliest orphan after an allocation.
        let gap = |o: &Wait| if alloc { o.time.checked_sub(time) } else { time.checked_sub(o.time) };
        let nearest = theirs.iter().enumerate().filter_map(|(k, o)| Some((gap(o)?, k))).min().map(|(_, k)| k);
        let k = nearest.or_else(|| theirs.iter().position(|o| o.late));
        let mut orphans = 0;
        if let Some(k) = k {
            theirs.swap_remove(k);
            if alloc {
                orphans = -1;
            }
        } else {
            mine.push(Wait { time, late: true });
            if !alloc {
                orphans = 1;
            }
        }
        if w.orphans.is_empty() && w.open.is_empty() {
            self.waiting.remove(&addr);
        }
        self.unmatched = self.unmatched.wrapping_add_signed(orphans);
        if orphans < 0 {
            self.matched(addr, 1);
        }
        orphans
    }

    /// Frees whose block was never seen.
    pub fn unmatched(&self) -> u64 {
        self.unmatched
    }

    /// Live blocks with their addresses.
    pub fn live(&self) -> impl Iterator<Item = (u64, &Block)> {
        // Nothing live (a program that freed everything): no walk at all.
        let slots = (self.live_slots > 0).then(|| self.slots.iter()).into_iter().flatten();
        slots.filter_map(|(a, s)| match s {
            Either::Small(s) => (!s.freed).then_some((a, &s.block)),
            Either::Full(s) => s.blocks[0].as_ref().filter(|_| s.live).map(|b| (a, b)),
        })
    }

    /// Forgets addresses with nothing live and no event for [`HORIZON`],
    /// and orphans as old; run when the table has doubled since the last
    /// time, so its cost per event stays constant.
    fn sweep(&mut self) {
        let cutoff = self.now.saturating_sub(HORIZON);
        // Only worth a walk over the slots if a quarter or more could go.
        if (self.slots.len() - self.live_slots) * 4 >= self.slots.len() {
            self.slots.retain(|s| match s {
                Either::Small(s) => !s.freed || s.free_time >= cutoff,
                Either::Full(s) => s.live || s.window.last_time() >= cutoff,
            });
        }
        self.waiting.retain(|_, w| {
            w.orphans.retain(|o| o.time >= cutoff);
            w.open.retain(|o| o.time >= cutoff);
            !(w.orphans.is_empty() && w.open.is_empty())
        });
        self.sweep_at = (self.slots.len() * 2).max(1 << 16);
    }
}

#[cfg(test)]
mod tests;
