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
use mtrace_format::Family;

use crate::addr_table::Table;

/// Live blocks of one backtrace and family that follow each other in the
/// books ([`Heap::live_runs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveRun {
    /// Their canonical backtrace.
    pub stack: u32,
    /// Their allocator family.
    pub family: Family,
    /// Bytes requested by them, in all.
    pub bytes: u64,
    /// How many.
    pub blocks: u64,
    /// The latest allocation of them, ns since the trace started.
    pub latest: u64,
}

/// The family of a slot's family bits ([`Slot::family_bits`]).
#[inline]
fn family_of(bits: u64) -> Family {
    Family::from_u64(bits).unwrap_or(Family::Malloc)
}

impl LiveRun {
    /// A run from its key (family bits above the backtrace) and sums.
    fn of(key: u64, bytes: u64, blocks: u64, latest: u64) -> LiveRun {
        LiveRun { stack: key as u32, family: family_of(key >> 32), bytes, blocks, latest }
    }
}

/// Events of different threads closer than this (ns) are ordered by the
/// allocator's contract, not by their times: it covers the skew between
/// two threads' stamps (11 ns seen with a bare `rdtsc`; an unfenced `rdtsc`
/// runs at most a reorder window, ~100 cycles, early; invariant TSCs of
/// one machine agree within tens of ns): 250 ns, plus the stream's time
/// unit (64 ns, `mtrace_format::TIME_SHIFT`), by which two stamps' rounding
/// can move them further apart.
pub const EPS: u64 = 250 + (1 << mtrace_format::TIME_SHIFT);

/// One address: the block allocated there last, and its free if any, in
/// 24 bytes (32 with its address in the slab; issue 43: the books' bytes
/// per live block). A live block needs its size, time, backtrace, family
/// and alignment; a freed one its size, backtrace and family (what a
/// second free of it reports) and the free's time and backtrace, which
/// take the places of the allocation's time and the alignment.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// Requested size, bytes.
    size: u64,
    /// Bits 0–55: the allocation's time while live, the latest free's
    /// once freed (ns; [`MAX_TIME`] at most); 56–59: the family; 60:
    /// seen (an allocation at the address was seen, else only frees
    /// were); 61: live.
    word: u64,
    /// The block's backtrace. Meaningless unless seen.
    stack: u32,
    /// While live: the alignment code ([`Block::align`]); once freed: the
    /// latest free's backtrace ([`NO_STACK`]: not recorded).
    aux: u32,
}

/// The latest time a slot keeps (ns, 2^56 − 1: 2.28 years); a later one
/// (only a corrupt trace's) is kept as this.
const MAX_TIME: u64 = (1 << 56) - 1;
const FAMILY_SHIFT: u32 = 56;
const SEEN: u64 = 1 << 60;
const LIVE: u64 = 1 << 61;

impl Slot {
    fn live(b: &Block) -> Slot {
        let word = b.time.min(MAX_TIME) | (b.family as u64) << FAMILY_SHIFT | SEEN | LIVE;
        Slot { size: b.size, word, stack: b.stack, aux: b.align.into() }
    }

    /// A slot for a free of an address never seen allocated.
    fn unknown(time: u64, stack: u32) -> Slot {
        Slot { size: 0, word: time.min(MAX_TIME), stack: NO_STACK, aux: stack }
    }

    #[inline]
    fn is_live(&self) -> bool {
        self.word & LIVE != 0
    }

    #[inline]
    fn seen(&self) -> bool {
        self.word & SEEN != 0
    }

    #[inline]
    fn time(&self) -> u64 {
        self.word & MAX_TIME
    }

    /// The family's bits of `word`.
    #[inline]
    fn family_bits(&self) -> u64 {
        (self.word >> FAMILY_SHIFT) & 0xf
    }

    /// The block as allocated; once freed its time is not kept (0).
    #[inline]
    fn block(&self) -> Block {
        let family = family_of(self.family_bits());
        let (time, align) = if self.is_live() { (self.time(), self.aux as u8) } else { (0, 0) };
        Block { size: self.size, stack: self.stack, family, time, align }
    }

    /// Freed at `time` from backtrace `stack`.
    #[inline]
    fn freed(&mut self, time: u64, stack: u32) {
        self.word = (self.word & !(LIVE | MAX_TIME)) | time.min(MAX_TIME);
        self.aux = stack;
    }
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
    ///
    /// Always inlined, as [`Heap::free`]: with `#[inline]` the compiler
    /// kept both apart (the table's growth inlined makes them large), and
    /// the [`Change`] they return went through memory, read back by
    /// `Books::enter_one` in loads across the stores that wrote it (a
    /// stalled load, 75% of `enter_one`'s samples). Reporting 20 M live
    /// blocks 1.77-2.02 -> 1.67-1.89 s, the random churn 2.87-2.99 ->
    /// 2.72-2.76 s, python3-malloc 0.246-0.276 -> 0.236-0.272 s
    /// (alternated).
    #[inline(always)]
    pub fn alloc(&mut self, addr: u64, b: Block) -> Change {
        let found = self.slots.find(addr);
        let slot = Slot::live(&b);
        let Some(s) = self.slots.at(found) else {
            self.live_slots += 1;
            self.slots.insert(found, addr, slot);
            return Change { born: Some(b), ..Change::default() };
        };
        let ended = s.is_live().then(|| s.block());
        self.live_slots += usize::from(!s.is_live());
        *s = slot;
        Change { ended, born: Some(b), outcome: Outcome::None }
    }

    /// A free of `addr` at `time`, from backtrace `stack` ([`NO_STACK`]:
    /// not recorded).
    #[inline(always)]
    pub fn free(&mut self, addr: u64, time: u64, stack: u32) -> Change {
        let found = self.slots.find(addr);
        let Some(s) = self.slots.at(found) else {
            // Kept, so that a second free of it is one.
            self.unmatched += 1;
            self.slots.insert(found, addr, Slot::unknown(time, stack));
            return Change { outcome: Outcome::Unknown, ..Change::default() };
        };
        if s.is_live() {
            let ended = s.block();
            s.freed(time, stack);
            self.live_slots -= 1;
            return Change { ended: Some(ended), outcome: Outcome::Ended, ..Change::default() };
        }
        self.unmatched += 1;
        let outcome = Outcome::Again { after: s.time(), first_free: s.aux };
        s.freed(time, stack);
        Change { outcome, ..Change::default() }
    }

    /// Whether `addr` has a live block (`None`: no block was ever seen there).
    pub fn is_live(&self, addr: u64) -> Option<bool> {
        self.slots.get(addr).map(|s| s.is_live())
    }

    /// The block allocated last at `addr`, live or freed, if any (a freed
    /// one's time is not kept: 0).
    pub fn block(&self, addr: u64) -> Option<Block> {
        self.slots.get(addr).filter(|s| s.seen()).map(Slot::block)
    }

    /// The block whose bytes hold `addr`, with its start: a live one, else
    /// one already freed (the second of the pair says it is freed). Looks
    /// at every address kept: for the rare free of an address that is not
    /// a block's.
    pub fn containing(&self, addr: u64) -> Option<(u64, Block, bool)> {
        let mut found = self
            .slots
            .iter()
            .filter(|(a, s)| s.seen() && *a <= addr && addr - a < s.size.max(1))
            .map(|(a, s)| (a, s.block(), !s.is_live()));
        let first = found.next()?;
        Some(if first.2 { found.find(|f| !f.2).unwrap_or(first) } else { first })
    }

    /// Frees the index by address: a report's heap, once the trace is
    /// read, is only walked (see [`Table::drop_index`]).
    pub fn drop_index(&mut self) {
        self.slots.drop_index();
    }

    /// Frees of no live block.
    pub fn unmatched(&self) -> u64 {
        self.unmatched
    }

    /// Live blocks with their addresses.
    pub fn live(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        // Nothing live (a program that freed everything): no walk at all.
        let slots = (self.live_slots > 0).then(|| self.slots.iter()).into_iter().flatten();
        slots.filter(|(_, s)| s.is_live()).map(|(a, s)| (a, s.block()))
    }

    /// The live blocks of [`Heap::live`], in its order, summed in runs: each
    /// run the blocks of one backtrace and family that follow each other,
    /// handed to `f` when it ends.
    ///
    /// Why runs: blocks next to each other in the books were mostly
    /// allocated one after the other from one place, and a walk that hands
    /// each block over ([`Heap::live`]) spent 12 ns a block of reporting 20
    /// M of them, mostly reading back what it had just stored.
    pub fn live_runs(&self, mut f: impl FnMut(LiveRun)) {
        if self.live_slots == 0 {
            return;
        }
        // The run's backtrace and family bits in one word (none yet:
        // u64::MAX, which no slot makes).
        let mut key = u64::MAX;
        let (mut bytes, mut blocks, mut latest) = (0u64, 0u64, 0u64);
        for chunk in self.slots.slices() {
            for (_, s) in chunk {
                if !s.is_live() {
                    continue;
                }
                let k = s.family_bits() << 32 | u64::from(s.stack);
                if k != key {
                    if blocks > 0 {
                        f(LiveRun::of(key, bytes, blocks, latest));
                    }
                    (key, bytes, blocks, latest) = (k, 0, 0, 0);
                }
                bytes = bytes.saturating_add(s.size);
                blocks += 1;
                latest = latest.max(s.time());
            }
        }
        if blocks > 0 {
            f(LiveRun::of(key, bytes, blocks, latest));
        }
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
        assert_eq!(std::mem::size_of::<(u64, Slot)>(), 32);
    }
}
