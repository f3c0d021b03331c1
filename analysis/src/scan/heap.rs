//! The heap blocks the marking walks, by address, 16 bytes each, and what
//! glibc's layout of them tells the marking (the chunk after a block,
//! blocks mapped on their own).

use std::cell::Cell;
use std::collections::HashMap;

/// A block as the marking holds it: its start, its size, and its place
/// among the books' live blocks (where its verdict goes, `classes.rs`),
/// in 16 bytes: sorted as 24-byte triples, then kept as 16-byte (start,
/// size) pairs beside a table of places, the blocks took 28 bytes each at
/// once, and the report of 20 M blocks with the scan peaked at 1,576 MiB
/// (1,499 so). A size that does not fit 32 bits is [`HUGE`] here, and
/// kept aside ([`Heap::huge`]).
#[derive(Clone, Copy)]
pub(super) struct Block {
    pub start: u64,
    size: u32,
    pub place: u32,
}

/// The size field of a block of 4 GiB or more.
const HUGE: u32 = u32::MAX;

impl Block {
    /// Block `size` bytes at `start`, the `place`th live block; and whether
    /// its size must be kept aside ([`Heap::new`]'s `huge`).
    pub fn new(start: u64, size: u64, place: u32) -> (Block, bool) {
        let small = u32::try_from(size).ok().filter(|&s| s != HUGE);
        (Block { start, size: small.unwrap_or(HUGE), place }, small.is_none())
    }
}

/// The blocks sorted by address, with what finds one fast.
pub(super) struct Heap {
    blocks: Vec<Block>,
    /// The sizes of the blocks whose own say [`HUGE`], by place.
    huge: HashMap<u32, u64>,
    /// The lowest start and the highest end: most words (small numbers,
    /// code and stack addresses) fall outside and skip the search.
    lo: u64,
    hi: u64,
    /// The start of every [`RUN`]th block: a search finds the run in this
    /// array, small enough to stay in the cache (2.5 MB at 20 M blocks),
    /// then the block within the run's 1 KiB, rather than 25 steps over
    /// all the blocks, most of them a wait for memory. scripts/bench_scale.c
    /// with 20 M blocks: marking 6.57 -> 6.27 s, though its pointers come
    /// in address order, where the full search's path stays cached.
    runs: Vec<u64>,
    /// The run of the latest block found: the pointers the marking reads
    /// one after the other mostly lead to blocks in the same run, or the
    /// next or the one before (an array's pointers to blocks allocated in
    /// turn), found without a search (20 M blocks: the search was a tenth
    /// of the report's time).
    latest_run: Cell<usize>,
}

/// Blocks per run of [`Heap::runs`].
const RUN: usize = 64;

impl Heap {
    /// The heap of `blocks` (in any order; disjoint, as live blocks are),
    /// with `huge`, the sizes (bytes) of those that [`Block::new`] could
    /// not hold, by place.
    pub fn new(mut blocks: Vec<Block>, huge: HashMap<u32, u64>) -> Heap {
        blocks.sort_unstable_by_key(|b| b.start);
        let mut heap = Heap { blocks, huge, lo: u64::MAX, hi: 0, runs: Vec::new(), latest_run: Cell::new(0) };
        heap.lo = heap.blocks.first().map_or(u64::MAX, |b| b.start);
        heap.hi = (0..heap.len()).map(|i| heap.end(i)).max().unwrap_or(0);
        heap.runs = heap.blocks.iter().step_by(RUN).map(|b| b.start).collect();
        heap
    }

    /// How many blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// The `i`th block by address: its start and size (bytes).
    #[inline]
    pub fn block(&self, i: usize) -> (u64, u64) {
        let b = self.blocks[i];
        let size =
            if b.size == HUGE { self.huge.get(&b.place).copied().unwrap_or(u64::from(HUGE)) } else { b.size.into() };
        (b.start, size)
    }

    /// The end of the `i`th block (a zero-sized block still has its start).
    fn end(&self, i: usize) -> u64 {
        let (start, size) = self.block(i);
        start + size.max(1)
    }

    /// The blocks overlapping `[lo, hi)`, by address: (start, size).
    pub fn within(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self.blocks.partition_point(|b| b.start < lo);
        // The block before `first` starts below `lo` and may reach into it.
        let first = if first > 0 && self.end(first - 1) > lo { first - 1 } else { first };
        (first..self.len()).map(|i| self.block(i)).take_while(move |b| b.0 < hi)
    }

    /// Whether a block overlaps `[lo, hi)`.
    pub fn overlaps(&self, lo: u64, hi: u64) -> bool {
        self.within(lo, hi).next().is_some()
    }

    /// The block holding `p`, and whether `p` is its start.
    #[inline]
    pub fn find(&self, p: u64) -> Option<(usize, bool)> {
        if p < self.lo || p >= self.hi {
            return None;
        }
        let run = self.run_after(p);
        if run == 0 {
            return None;
        }
        self.latest_run.set(run - 1);
        let first = (run - 1) * RUN;
        let blocks = &self.blocks[first..(first + RUN).min(self.blocks.len())];
        // At least 1: the run's first block starts at or below `p`.
        let i = first + blocks.partition_point(|b| b.start <= p) - 1;
        let (start, size) = self.block(i);
        if p != start && p == next_chunk(start, size) {
            return None;
        }
        // A zero-sized block still has a start.
        (p < start + size.max(1)).then_some((i, p == start))
    }

    /// The number of the first run starting above `p` (0: none starts at
    /// or below it), as a search of [`Heap::runs`] would give.
    #[inline]
    fn run_after(&self, p: u64) -> usize {
        let latest = self.latest_run.get();
        // Run r holds `p` if it starts at or below it and the next does not.
        let holds = |r: usize| self.runs[r] <= p && self.runs.get(r + 1).is_none_or(|&next| next > p);
        for r in [latest, latest + 1, latest.wrapping_sub(1)] {
            if r < self.runs.len() && holds(r) {
                return r + 1;
            }
        }
        self.runs.partition_point(|&s| s <= p)
    }

    /// The blocks' places, by address, and their starts: the 16 bytes a
    /// block handed back as 4 and 8 (the starts written over the blocks,
    /// then the rest given back), for the verdicts (`classes.rs`).
    pub fn into_places_and_starts(self) -> (Vec<u32>, Vec<u64>) {
        let places = self.blocks.iter().map(|b| b.place).collect();
        let mut starts: Vec<u64> = self.blocks.into_iter().map(|b| b.start).collect();
        starts.shrink_to_fit();
        (places, starts)
    }
}

/// glibc's smallest threshold for serving a block by a mapping of its own
/// (DEFAULT_MMAP_THRESHOLD_MIN, malloc/malloc.c), bytes.
const MMAP_THRESHOLD_MIN: u64 = 128 * 1024;
const PAGE: u64 = 4096;

/// The mmap'd chunks of the heap blocks overlapping `[lo, hi)`, if every
/// one of them is such a block: at least [`MMAP_THRESHOLD_MIN`] bytes, 16
/// bytes into a page (the chunk's header fills the mapping's first 16
/// bytes, malloc/malloc.c's sysmalloc_mmap). `None` when a block is not
/// one (the mapping is an arena, all malloc's) or no block overlaps. The
/// first block of the brk heap can look like one; then the rest of that
/// heap is read as a root, which can hide a leak, never make one.
pub(super) fn mmapped_chunks_only(heap: &Heap, lo: u64, hi: u64) -> Option<Vec<(u64, u64)>> {
    let mut chunks = Vec::new();
    for (start, size) in heap.within(lo, hi) {
        if size < MMAP_THRESHOLD_MIN - 16 || start % PAGE != 16 {
            return None;
        }
        // The chunk: 16-byte aligned size with its 8-byte size field,
        // rounded up to pages.
        let len = ((size + 8 + 15) & !15) + 8;
        chunks.push((start - 16, (start - 16 + len).next_multiple_of(PAGE)));
    }
    (!chunks.is_empty()).then_some(chunks)
}

/// Where glibc's malloc puts the header of the chunk after the block at
/// `start` of `size` bytes (64-bit: 16-byte chunk alignment, 8-byte size
/// field, 32-byte minimum chunk; glibc's malloc/malloc.c). When the size
/// leaves no padding (24, 40, 56, … bytes) that header lies inside the
/// block, and malloc's own pointers to it (the top chunk, free lists, all
/// in memory the scan reads: libc's data, arena headers) would make the
/// block look possibly lost. Such a word is not counted as a pointer;
/// memcheck never sees those pointers, since its allocator is its own.
fn next_chunk(start: u64, size: u64) -> u64 {
    let chunk = (size + 8 + 15).max(32) & !15;
    start - 16 + chunk
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_by_address_with_sizes_past_32_bits() {
        let big = 5u64 << 30;
        let made = [Block::new(0x9000_0000, big, 7), Block::new(0x1000, 32, 2), Block::new(0x2000, 0, 4)];
        assert_eq!(made.map(|(_, aside)| aside), [true, false, false]);
        let heap = Heap::new(made.iter().map(|b| b.0).collect(), HashMap::from([(7, big)]));
        assert_eq!((heap.block(0), heap.block(1), heap.block(2)), ((0x1000, 32), (0x2000, 0), (0x9000_0000, big)));
        assert_eq!(heap.find(0x9000_0000 + big - 8), Some((2, false)));
        assert_eq!(
            (heap.find(0x1000), heap.find(0x101f), heap.find(0x1020)),
            (Some((0, true)), Some((0, false)), None)
        );
        // A zero-sized block holds its start.
        assert_eq!((heap.find(0x2000), heap.find(0x2001)), (Some((1, true)), None));
        assert_eq!(heap.within(0x1010, 0x2001).collect::<Vec<_>>(), [(0x1000, 32), (0x2000, 0)]);
        assert!(heap.overlaps(0x1018, 0x1020) && !heap.overlaps(0x1020, 0x2000) && heap.overlaps(0x2000, 0x2001));
        let (places, starts) = heap.into_places_and_starts();
        assert_eq!((places, starts), (vec![2, 4, 7], vec![0x1000, 0x2000, 0x9000_0000]));
    }

    #[test]
    fn finds_in_any_order_agree_with_a_search() {
        // 1,000 blocks of 48 bytes, 64 bytes apart (16 runs), looked up
        // forwards, backwards and by jumps, at starts, insides, the gaps
        // between blocks and past both ends.
        let blocks = (0..1000u64).map(|i| Block::new(0x10_0000 + 64 * i, 48, i as u32).0).collect();
        let heap = Heap::new(blocks, HashMap::new());
        let want = |p: u64| {
            let off = p.checked_sub(0x10_0000)?;
            (off < 64 * 1000 && off % 64 < 48).then_some(((off / 64) as usize, off % 64 == 0))
        };
        let forwards: Vec<u64> = (0x0f_ff00..0x11_0000u64).step_by(8).collect();
        let mut x = 12345u64;
        let jumps = (0..5000).map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            0x0f_ff00 + (x >> 33) % 0x1_0200
        });
        for p in forwards.iter().copied().chain(forwards.iter().rev().copied()).chain(jumps) {
            assert_eq!(heap.find(p), want(p), "{p:#x}");
        }
    }
}
