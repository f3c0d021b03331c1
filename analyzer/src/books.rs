//! The books: which blocks are live, what each backtrace allocated, and the
//! peak. Memory is bounded by live blocks and distinct backtraces.
//!
//! Events of different threads reach the stream in the order their buffers
//! were written, not in time order, so an address can be freed by one
//! thread and reused by another before the free is read. Times settle it:
//! a free (stamped before the real free) belongs to the block at its
//! address with the latest allocation time not after it; a free read before
//! its allocation waits in `pending_frees` for it.

use std::collections::BTreeMap;

use mtrace_format::Family;
// FxHash: the keys are addresses and ids from our own producer, not
// attacker-chosen, and SipHash was a fifth of the analyzer's time.
use rustc_hash::FxHashMap as HashMap;

/// A live heap block or mapping.
#[derive(Clone, Debug)]
pub struct Block {
    /// Requested size, bytes.
    pub size: u64,
    /// Canonical backtrace index (see [`crate::load::Stacks`]).
    pub stack: u32,
    pub family: Family,
    /// Allocation time, ns since the trace started.
    pub time: u64,
}

/// Totals of one backtrace over the whole run.
#[derive(Clone, Copy, Debug, Default)]
pub struct StackTotals {
    pub allocations: u64,
    pub bytes: u64,
}

/// One backtrace's books: totals, live now, and live at the latest peak
/// (kept lazily: `at_peak` holds the value at peak `snap`, taken before the
/// first change after that peak; unchanged since the peak means `live` is
/// still that value). So the peak consumers need no second pass.
#[derive(Clone, Copy, Debug, Default)]
struct PerStack {
    totals: StackTotals,
    live: (u64, u64),
    at_peak: (u64, u64),
    snap: u64,
    family: Option<Family>,
}

/// What one backtrace holds live at a moment.
#[derive(Clone, Copy, Debug)]
pub struct LiveTotals {
    pub bytes: u64,
    pub blocks: u64,
    pub family: Family,
}

#[derive(Default)]
pub struct Books {
    /// One live block per address, the common case.
    live: HashMap<u64, Block>,
    /// Further live blocks at an address whose free has not been read yet
    /// (another thread's reuse read first).
    also_live: HashMap<u64, Vec<Block>>,
    pending_frees: HashMap<u64, Vec<u64>>,
    /// Blocks glibc allocated inside a hook (`Family::Internal`): address →
    /// (size, time). Kept so that their frees find them; not counted, not
    /// live for reports.
    internal: HashMap<u64, (u64, u64)>,
    /// Mappings by start address; `Block::size` is the length.
    maps: BTreeMap<u64, Block>,
    /// Per canonical backtrace index: totals and what it holds live.
    per_stack: Vec<PerStack>,
    /// Bumped each time the peak rises: the current peak's number.
    peak_id: u64,
    /// Allocation calls (malloc family, new, realloc, mmap, mremap).
    pub allocations: u64,
    /// Deallocation calls (free family, delete, munmap); realloc's implied free is not counted.
    pub frees: u64,
    /// Bytes requested by all allocation calls.
    pub bytes_allocated: u64,
    pub cur_bytes: u64,
    pub cur_blocks: u64,
    pub peak_bytes: u64,
    pub peak_blocks: u64,
    pub peak_time: u64,
}

impl Books {
    /// The books of backtrace `stack`, made on first use (indices are the
    /// loader's canonical ones: dense, from 0).
    fn stack(&mut self, stack: u32) -> &mut PerStack {
        let i = stack as usize;
        if i >= self.per_stack.len() {
            self.per_stack.resize(i + 1, PerStack { snap: self.peak_id, ..Default::default() });
        }
        &mut self.per_stack[i]
    }

    fn count_alloc(&mut self, stack: u32, size: u64) {
        self.allocations += 1;
        self.bytes_allocated += size;
        let t = &mut self.stack(stack).totals;
        t.allocations += 1;
        t.bytes += size;
    }

    /// Adds `blocks` blocks of `bytes` in total to what `b`'s backtrace holds.
    fn live_add(&mut self, b: &Block, bytes: u64, blocks: u64) {
        let peak_id = self.peak_id;
        let s = self.stack(b.stack);
        if s.snap != peak_id {
            s.at_peak = s.live;
            s.snap = peak_id;
        }
        s.live.0 += bytes;
        s.live.1 += blocks;
        s.family.get_or_insert(b.family);
        self.cur_bytes += bytes;
        self.cur_blocks += blocks;
    }

    fn grow(&mut self, b: &Block) {
        self.live_add(b, b.size, 1);
        if self.cur_bytes > self.peak_bytes {
            self.peak_bytes = self.cur_bytes;
            self.peak_blocks = self.cur_blocks;
            self.peak_time = b.time;
            self.peak_id += 1;
        }
    }

    fn shrink(&mut self, b: &Block) {
        let peak_id = self.peak_id;
        let s = self.stack(b.stack);
        if s.snap != peak_id {
            s.at_peak = s.live;
            s.snap = peak_id;
        }
        s.live.0 = s.live.0.saturating_sub(b.size);
        s.live.1 = s.live.1.saturating_sub(1);
        self.cur_bytes = self.cur_bytes.saturating_sub(b.size);
        self.cur_blocks = self.cur_blocks.saturating_sub(1);
    }

    /// Allocation calls and bytes per backtrace, for those with any.
    pub fn totals(&self) -> impl Iterator<Item = (u32, &StackTotals)> {
        self.per_stack.iter().enumerate().filter(|(_, s)| s.totals.allocations > 0).map(|(i, s)| (i as u32, &s.totals))
    }

    /// Allocation calls and bytes of backtrace `stack`.
    pub fn totals_of(&self, stack: u32) -> StackTotals {
        self.per_stack.get(stack as usize).map_or_else(StackTotals::default, |s| s.totals)
    }

    /// Live bytes and blocks per backtrace when the peak was reached (the
    /// latest time the total rose to it).
    pub fn live_at_peak(&self) -> HashMap<u32, LiveTotals> {
        let mut m = HashMap::default();
        for (i, s) in self.per_stack.iter().enumerate() {
            let (bytes, blocks) = if s.snap == self.peak_id { s.at_peak } else { s.live };
            if blocks > 0 {
                let family = s.family.unwrap_or(Family::Malloc);
                m.insert(i as u32, LiveTotals { bytes, blocks, family });
            }
        }
        m
    }

    /// A block came into existence (malloc, new, the new half of realloc).
    pub fn alloc(&mut self, addr: u64, b: Block) {
        if b.family == Family::Internal {
            return self.internal_alloc(addr, b.size, b.time);
        }
        self.count_alloc(b.stack, b.size);
        self.insert(addr, b);
    }

    fn internal_alloc(&mut self, addr: u64, size: u64, time: u64) {
        if let Some(times) = self.pending_frees.get_mut(&addr) {
            if let Some(i) = times.iter().position(|&t| t >= time) {
                times.swap_remove(i);
                if times.is_empty() {
                    self.pending_frees.remove(&addr);
                }
                return;
            }
        }
        self.internal.insert(addr, (size, time));
    }

    /// Blocks glibc allocated inside a hook, live now: (address, size, time).
    pub fn internal_blocks(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.internal.iter().map(|(&a, &(size, time))| (a, size, time))
    }

    fn insert(&mut self, addr: u64, b: Block) {
        // A free of this block that was read before it: both are done.
        // (Rare: the emptiness check spares a lookup per allocation.)
        if let Some(times) = (!self.pending_frees.is_empty()).then(|| self.pending_frees.get_mut(&addr)).flatten() {
            if let Some(i) =
                times.iter().enumerate().filter(|(_, &t)| t >= b.time).min_by_key(|(_, &t)| t).map(|(i, _)| i)
            {
                times.swap_remove(i);
                if times.is_empty() {
                    self.pending_frees.remove(&addr);
                }
                return;
            }
        }
        self.grow(&b);
        if let Some(old) = self.live.insert(addr, b) {
            self.also_live.entry(addr).or_default().push(old);
        }
    }

    /// A free call at `time`.
    pub fn free(&mut self, addr: u64, time: u64) {
        self.frees += 1;
        self.remove(addr, time);
    }

    fn remove(&mut self, addr: u64, time: u64) {
        // An internal block at the address, if the latest allocated there
        // before the free.
        if let Some(&(_, t)) = (!self.internal.is_empty()).then(|| self.internal.get(&addr)).flatten() {
            if t <= time && self.latest_before(addr, time).is_none_or(|l| l < t) {
                self.internal.remove(&addr);
                return;
            }
        }
        if let Some(b) = self.take_block(addr, time) {
            self.shrink(&b);
        } else {
            self.pending_frees.entry(addr).or_default().push(time);
        }
    }

    /// The latest allocation time not after `time` of the blocks at `addr`.
    fn latest_before(&self, addr: u64, time: u64) -> Option<u64> {
        let main = self.live.get(&addr).map(|b| b.time);
        let extra = self.also_live.get(&addr).into_iter().flatten().map(|b| b.time);
        main.into_iter().chain(extra).filter(|&t| t <= time).max()
    }

    /// Removes the block at `addr` that a free at `time` frees: the one with
    /// the latest allocation time not after it.
    fn take_block(&mut self, addr: u64, time: u64) -> Option<Block> {
        let Some(extra) = (!self.also_live.is_empty()).then(|| self.also_live.get_mut(&addr)).flatten() else {
            return self.live.remove_entry(&addr).and_then(|(a, b)| {
                if b.time <= time {
                    Some(b)
                } else {
                    self.live.insert(a, b);
                    None
                }
            });
        };
        let main_time = self.live.get(&addr).map(|b| b.time).filter(|&t| t <= time);
        let extra_best = extra.iter().enumerate().filter(|(_, b)| b.time <= time).max_by_key(|(_, b)| b.time);
        let taken = match (main_time, extra_best) {
            (Some(mt), Some((_, eb))) if mt >= eb.time => self.live.remove(&addr),
            (_, Some((i, _))) => Some(extra.swap_remove(i)),
            (Some(_), None) => self.live.remove(&addr),
            (None, None) => None,
        };
        // Keep one block in `live` while any remain.
        if let std::collections::hash_map::Entry::Vacant(slot) = self.live.entry(addr) {
            if let Some(b) = extra.pop() {
                slot.insert(b);
            }
        }
        if extra.is_empty() {
            self.also_live.remove(&addr);
        }
        taken
    }

    /// A successful realloc: `old` freed at `free_time`, `new` allocated.
    pub fn realloc(&mut self, old: u64, free_time: u64, new: u64, b: Block) {
        self.remove(old, free_time);
        self.alloc(new, b);
    }

    /// A new mapping; it replaces whatever it overlaps (MAP_FIXED).
    pub fn mmap(&mut self, addr: u64, b: Block) {
        self.count_alloc(b.stack, b.size);
        self.unmap_range(addr, b.size);
        self.grow(&b);
        self.maps.insert(addr, b);
    }

    /// munmap of `[addr, addr+len)`, which may cut mappings in pieces.
    pub fn munmap(&mut self, addr: u64, len: u64) {
        self.frees += 1;
        self.unmap_range(addr, len);
    }

    /// mremap: the old range goes, the new one is a new mapping.
    pub fn mremap(&mut self, old: u64, old_len: u64, new: u64, b: Block) {
        self.unmap_range(old, old_len);
        self.mmap(new, b);
    }

    fn unmap_range(&mut self, addr: u64, len: u64) {
        let end = addr.saturating_add(page_len(len));
        // Mappings never overlap each other, so walking down from `end`
        // stops at the first one that ends before `addr`.
        let overlapping: Vec<u64> =
            self.maps.range(..end).rev().take_while(|(&s, b)| s + page_len(b.size) > addr).map(|(&s, _)| s).collect();
        for s in overlapping {
            let b = self.maps.remove(&s).expect("listed above");
            self.shrink(&b);
            let b_end = s + page_len(b.size);
            if s < addr {
                let head = Block { size: addr - s, ..b.clone() };
                self.live_add(&head, head.size, 1);
                self.maps.insert(s, head);
            }
            if b_end > end {
                let tail = Block { size: b_end - end, ..b.clone() };
                self.live_add(&tail, tail.size, 1);
                self.maps.insert(end, tail);
            }
        }
    }

    /// Everything still live: heap blocks and mappings, with their addresses.
    pub fn live_blocks(&self) -> impl Iterator<Item = (u64, &Block)> {
        self.live
            .iter()
            .map(|(&a, b)| (a, b))
            .chain(self.also_live.iter().flat_map(|(&a, v)| v.iter().map(move |b| (a, b))))
            .chain(self.maps.iter().map(|(&a, b)| (a, b)))
    }

    /// Live bytes and blocks per backtrace, with the family of its blocks.
    pub fn live_by_stack(&self) -> HashMap<u32, LiveTotals> {
        let mut m: HashMap<u32, LiveTotals> = HashMap::default();
        for (_, b) in self.live_blocks() {
            let e = m.entry(b.stack).or_insert(LiveTotals { bytes: 0, blocks: 0, family: b.family });
            e.bytes += b.size;
            e.blocks += 1;
        }
        m
    }

    /// Frees whose block was never seen: allocated before tracing started.
    pub fn unmatched_frees(&self) -> u64 {
        self.pending_frees.values().map(|v| v.len() as u64).sum()
    }
}

/// Length rounded up to whole pages, as the kernel maps and unmaps.
fn page_len(len: u64) -> u64 {
    len.max(1).next_multiple_of(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(size: u64, time: u64) -> Block {
        Block { size, stack: 1, family: Family::Malloc, time }
    }

    #[test]
    fn free_read_before_reuse_frees_the_older_block() {
        // Thread A frees 0x10 at t=5, thread B reuses it at t=6, but B's
        // buffer is read first.
        let mut b = Books::default();
        b.alloc(0x10, blk(8, 1));
        b.alloc(0x10, blk(16, 6));
        b.free(0x10, 5);
        let live: Vec<_> = b.live_blocks().map(|(_, b)| b.size).collect();
        assert_eq!(live, vec![16]);
        assert_eq!(b.cur_bytes, 16);
    }

    #[test]
    fn live_at_peak_is_the_state_when_the_total_last_rose() {
        let at = |stack: u32, size: u64, time: u64| Block { size, stack, family: Family::Malloc, time };
        let mut b = Books::default();
        b.alloc(0x10, at(0, 100, 1));
        b.alloc(0x20, at(1, 50, 2));
        b.free(0x10, 3);
        b.alloc(0x30, at(2, 30, 4));
        // Peak: 150 bytes at t=2 (stacks 0 and 1); stack 1 grows past it
        // later while the total stays lower, stack 2 came after it.
        b.alloc(0x40, at(1, 60, 5));
        b.free(0x20, 6);
        let peak = b.live_at_peak();
        let mut got: Vec<_> = peak.iter().map(|(&s, l)| (s, l.bytes, l.blocks)).collect();
        got.sort();
        assert_eq!(got, vec![(0, 100, 1), (1, 50, 1)]);
        assert_eq!((b.peak_bytes, b.peak_time), (150, 2));
        // A new peak: everything live now.
        b.alloc(0x50, at(2, 200, 7));
        let mut got: Vec<_> = b.live_at_peak().iter().map(|(&s, l)| (s, l.bytes, l.blocks)).collect();
        got.sort();
        assert_eq!(got, vec![(1, 60, 1), (2, 230, 2)]);
        assert_eq!(b.totals_of(2).allocations, 2);
        assert_eq!(b.totals().count(), 3);
    }

    #[test]
    fn internal_blocks_are_freed_but_neither_counted_nor_live() {
        let internal = |size: u64, time: u64| Block { size, stack: 0, family: Family::Internal, time };
        let mut b = Books::default();
        // The program frees a block, glibc reuses its address inside a hook
        // (a thread's DTV), then the program frees that (pthread_join).
        b.alloc(0x10, blk(8, 1));
        b.free(0x10, 2);
        b.alloc(0x10, internal(288, 3));
        assert_eq!((b.live_blocks().count(), b.internal_blocks().count()), (0, 1));
        b.free(0x10, 4);
        assert_eq!((b.unmatched_frees(), b.internal_blocks().count()), (0, 0));
        assert_eq!((b.allocations, b.frees, b.cur_bytes, b.peak_bytes), (1, 2, 0, 8));
        // A free read before its internal block also finds it.
        b.free(0x20, 9);
        b.alloc(0x20, internal(16, 8));
        assert_eq!((b.unmatched_frees(), b.internal_blocks().count()), (0, 0));
        // A later program block at the same address is the one freed.
        b.alloc(0x30, internal(16, 10));
        b.alloc(0x30, blk(24, 11));
        b.free(0x30, 12);
        assert_eq!((b.internal_blocks().count(), b.live_blocks().count()), (1, 0));
    }

    #[test]
    fn free_read_before_its_alloc_cancels_it() {
        let mut b = Books::default();
        b.free(0x20, 9);
        b.alloc(0x20, blk(8, 3));
        assert_eq!(b.live_blocks().count(), 0);
        assert_eq!(b.unmatched_frees(), 0);
        assert_eq!((b.allocations, b.frees), (1, 1));
    }

    #[test]
    fn partial_munmap_splits_a_mapping() {
        let mut b = Books::default();
        b.mmap(0x10000, blk(4 * 4096, 1));
        b.munmap(0x11000, 4096);
        let mut live: Vec<_> = b.live_blocks().map(|(a, b)| (a, b.size)).collect();
        live.sort();
        assert_eq!(live, vec![(0x10000, 4096), (0x12000, 2 * 4096)]);
        assert_eq!(b.cur_bytes, 3 * 4096);
        b.munmap(0x10000, 4 * 4096);
        assert_eq!(b.live_blocks().count(), 0);
        assert_eq!(b.cur_bytes, 0);
    }

    #[test]
    fn peak_is_tracked() {
        let mut b = Books::default();
        b.alloc(1, blk(100, 1));
        b.alloc(2, blk(50, 2));
        b.free(1, 3);
        b.alloc(3, blk(10, 4));
        assert_eq!((b.peak_bytes, b.peak_blocks, b.peak_time), (150, 2, 2));
    }
}
