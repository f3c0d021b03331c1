//! Heap blocks by address: the block allocated last at each address, live
//! or freed.
//!
//! Events reach the heap in the order they happened: the stream's records
//! are merged by time up to the producer's watermarks (`crate::order`),
//! and events of different threads whose stamps are too close for their
//! order to be known are put in the order the allocator's contract allows
//! (`super::ties`). So each event is judged against the address's state
//! alone: an allocation over a live block ends it (its free was not
//! traced), a free of a freed block is a second free, a free of an address
//! never seen is of a block from before tracing (or invalid).
//!

use super::Block;

mod hint;
mod table;
use table::Table;

/// Events of different threads closer than this (ns) are ordered by the
/// allocator's contract, not by their times: it covers the skew between
/// two threads' stamps (11 ns seen with a bare `rdtsc`; an unfenced `rdtsc`
/// runs at most a reorder window, ~100 cycles, early; invariant TSCs of
/// one machine agree within tens of ns): 250 ns, plus the stream's time
/// unit (64 ns, `mtrace_format::TIME_SHIFT`), by which two stamps' rounding
/// can move them further apart.
pub const EPS: u64 = 250 + (1 << mtrace_format::TIME_SHIFT);

/// One address: the block allocated there last, and its free if any.
#[derive(Clone, Debug)]
struct Slot {
    /// Its time is the allocation's. Meaningless unless `seen`.
    block: Block,
    /// An allocation at the address was seen (else only frees were).
    seen: bool,
    live: bool,
    /// The latest free's time (ns) and backtrace ([`NO_STACK`]: not
    /// recorded), once freed.
    free_time: u64,
    free_stack: u32,
}

/// A backtrace index that stands for none.
pub const NO_STACK: u32 = u32::MAX;

/// What an event did to the live blocks.
#[derive(Debug, Default)]
pub struct Change {
    /// A block that ended: freed, or ended by a new allocation at its address.
    pub ended: Option<Block>,
    /// The event's own block, now live.
    pub born: Option<Block>,
    /// For a free: what it follows in the address's history.
    pub outcome: Outcome,
}

/// What a free follows in its address's history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    /// Not a free.
    #[default]
    None,
    /// The allocation of the block in [`Change::ended`].
    Ended,
    /// A free at `after` (ns), from backtrace `first_free`: the block
    /// allocated there last ([`Heap::block`]) is freed again.
    Again { after: u64, first_free: u32 },
    /// Nothing: the stream never saw a block allocated at the address.
    Unknown,
}

/// The heap: every address ever allocated, with its latest block.
#[derive(Default)]
pub struct Heap {
    slots: Table<Slot>,
    /// Frees of no live block (allocated before tracing, as far as is known).
    unmatched: u64,
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

    /// An allocation of block `b` at `addr` (a live block there ends: its
    /// free was not traced).
    #[inline]
    pub fn alloc(&mut self, addr: u64, b: Block) -> Change {
        let found = self.slots.find(addr);
        let Some(s) = self.slots.at(found) else {
            self.live_slots += 1;
            let change = Change { born: Some(b.clone()), ..Change::default() };
            self.slots.insert(
                found,
                addr,
                Slot { block: b, seen: true, live: true, free_time: 0, free_stack: NO_STACK },
            );
            return change;
        };
        let born = Some(b.clone());
        let old = std::mem::replace(&mut s.block, b);
        let ended = s.live.then_some(old);
        self.live_slots += usize::from(!s.live);
        s.live = true;
        s.seen = true;
        Change { ended, born, outcome: Outcome::None }
    }

    /// A free of `addr` at `time`, from backtrace `stack` ([`NO_STACK`]:
    /// not recorded).
    #[inline]
    pub fn free(&mut self, addr: u64, time: u64, stack: u32) -> Change {
        let found = self.slots.find(addr);
        let Some(s) = self.slots.at(found) else {
            // Kept, so that a second free of it is one.
            self.unmatched += 1;
            let none = Block { size: 0, stack: NO_STACK, family: mtrace_format::Family::Malloc, time: 0, align: 0 };
            let slot = Slot { block: none, seen: false, live: false, free_time: time, free_stack: stack };
            self.slots.insert(found, addr, slot);
            return Change { outcome: Outcome::Unknown, ..Change::default() };
        };
        if s.live {
            s.live = false;
            (s.free_time, s.free_stack) = (time, stack);
            self.live_slots -= 1;
            return Change { ended: Some(s.block.clone()), outcome: Outcome::Ended, ..Change::default() };
        }
        self.unmatched += 1;
        let outcome = Outcome::Again { after: s.free_time, first_free: s.free_stack };
        (s.free_time, s.free_stack) = (time, stack);
        Change { outcome, ..Change::default() }
    }

    /// Whether `addr` has a live block (`None`: no block was ever seen there).
    pub fn is_live(&self, addr: u64) -> Option<bool> {
        self.slots.get(addr).map(|s| s.live)
    }

    /// The block allocated last at `addr`, live or freed, if any.
    pub fn block(&self, addr: u64) -> Option<&Block> {
        self.slots.get(addr).filter(|s| s.seen).map(|s| &s.block)
    }

    /// The block whose bytes hold `addr`, with its start: a live one, else
    /// one already freed (the second of the pair says it is freed). Looks
    /// at every address kept: for the rare free of an address that is not
    /// a block's.
    pub fn containing(&self, addr: u64) -> Option<(u64, &Block, bool)> {
        let mut found = self
            .slots
            .iter()
            .filter(|(a, s)| s.seen && *a <= addr && addr - a < s.block.size.max(1))
            .map(|(a, s)| (a, &s.block, !s.live));
        let first = found.next()?;
        Some(if first.2 { found.find(|f| !f.2).unwrap_or(first) } else { first })
    }

    /// Frees of no live block.
    pub fn unmatched(&self) -> u64 {
        self.unmatched
    }

    /// Live blocks with their addresses.
    pub fn live(&self) -> impl Iterator<Item = (u64, &Block)> {
        // Nothing live (a program that freed everything): no walk at all.
        let slots = (self.live_slots > 0).then(|| self.slots.iter()).into_iter().flatten();
        slots.filter(|(_, s)| s.live).map(|(a, s)| (a, &s.block))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtrace_format::Family;

    fn blk(size: u64, time: u64) -> Block {
        Block { size, stack: 0, family: Family::Malloc, time, align: 0 }
    }

    #[test]
    fn each_event_against_the_address_state() {
        let mut h = Heap::default();
        assert_eq!(h.is_live(0x10), None);
        let c = h.alloc(0x10, blk(8, 1));
        assert_eq!(c.born.map(|b| b.size), Some(8));
        // A second allocation while live ends the first.
        let c = h.alloc(0x10, blk(16, 2));
        assert_eq!((c.ended.map(|b| b.size), c.born.map(|b| b.size)), (Some(8), Some(16)));
        assert_eq!((h.live().count(), h.is_live(0x10)), (1, Some(true)));
        let c = h.free(0x10, 3, 5);
        assert_eq!((c.outcome, c.ended.map(|b| b.size)), (Outcome::Ended, Some(16)));
        assert_eq!((h.live().count(), h.is_live(0x10)), (0, Some(false)));
        // A second free: the first's time and backtrace.
        let c = h.free(0x10, 4, 6);
        assert_eq!(c.outcome, Outcome::Again { after: 3, first_free: 5 });
        assert_eq!(h.block(0x10).map(|b| b.size), Some(16));
        // Never seen; then freed again.
        assert_eq!(h.free(0x20, 5, NO_STACK).outcome, Outcome::Unknown);
        assert_eq!(h.free(0x20, 6, 7).outcome, Outcome::Again { after: 5, first_free: NO_STACK });
        assert_eq!((h.unmatched(), h.block(0x20).is_some(), h.is_live(0x20)), (3, false, Some(false)));
        assert_eq!(h.containing(0x18).map(|(a, _, freed)| (a, freed)), Some((0x10, true)));
    }

    #[test]
    fn a_slot_is_small() {
        assert_eq!(std::mem::size_of::<(u64, Slot)>(), 48);
    }
}
