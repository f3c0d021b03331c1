//! The books: which blocks are live, what each backtrace allocated, and the
//! peak. Memory is bounded by live blocks and distinct backtraces.
//!
//! Events come in the order they happened (`crate::order` merges the
//! stream by time); [`ties`] orders those of different threads that are
//! closer than the clocks' skew by the allocator's contract, and [`heap`]
//! keeps the blocks by address.

use std::collections::BTreeMap;

mod checkpoint;
mod heap;
pub mod lifetimes;
mod live;
mod runs;
mod ties;
pub mod wrong;

pub use heap::{LiveRun, EPS};
pub use live::Live;
use mtrace_format::Family;
use wrong::{Concerned, Dealloc, WrongFree, WrongKind};
// FxHash: the keys are addresses and ids from our own producer, not
// attacker-chosen, and SipHash was a fifth of the analyzer's time.
use rustc_hash::FxHashMap as HashMap;

/// A live heap block or mapping.
#[derive(Clone, Copy, Debug)]
pub struct Block {
    /// Requested size, bytes.
    pub size: u64,
    /// Canonical backtrace index (see [`crate::trace::Stacks`]).
    pub stack: u32,
    /// Allocator family.
    pub family: Family,
    /// Allocation time, ns since the trace started.
    pub time: u64,
    /// The alignment an aligned `operator new` was asked for, as
    /// [`wrong::align_code`] keeps it (0: none; in the struct's padding).
    pub align: u8,
}

impl Block {
    /// What this block stands for in a trace sampled at `rate` bytes
    /// (0: not sampled): (bytes, blocks), by
    /// `mtrace_format::sampling::estimate` keyed by the block's size and
    /// time; mappings and pool blocks are never sampled.
    #[inline]
    pub fn estimate(&self, rate: u64) -> (u64, u64) {
        if rate == 0 || matches!(self.family, Family::Mmap | Family::Pool) {
            return (self.size, 1);
        }
        mtrace_format::sampling::estimate(self.size, rate, self.size ^ self.time.rotate_left(17))
    }

    /// The variance this block adds to a sum of [`Block::estimate`]s:
    /// (bytes², blocks²), by `mtrace_format::sampling::variance`; 0 where
    /// the block is exact (not sampled, a mapping, a pool block).
    pub fn variance(&self, rate: u64) -> (f64, f64) {
        if rate == 0 || matches!(self.family, Family::Mmap | Family::Pool) {
            return (0.0, 0.0);
        }
        mtrace_format::sampling::variance(self.size, rate)
    }
}

/// Totals of one backtrace over the whole run.
#[derive(Clone, Copy, Debug, Default)]
pub struct StackTotals {
    /// Allocation calls.
    pub allocations: u64,
    /// Bytes requested by them.
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
    /// Bytes live.
    pub bytes: u64,
    /// Blocks live.
    pub blocks: u64,
    /// Their family (of the latest block).
    pub family: Family,
}

/// The books of one trace: every live block and mapping, totals per backtrace, the peak, the wrong frees.
pub struct Books {
    /// Heap blocks (and pool blocks, at their own keys) by address, with
    /// blocks glibc allocated inside a hook (`Family::Internal`): kept so
    /// that their frees find them, but neither counted nor live for reports.
    heap: heap::Heap,
    /// Heap events held until the allocator's contract orders them.
    ties: ties::Ties,
    /// Double and invalid frees found so far, in the order found.
    wrong: Vec<WrongFree>,
    /// Mappings by start address; `Block::size` is the length.
    maps: BTreeMap<u64, Block>,
    /// Per canonical backtrace index: totals and what it holds live.
    per_stack: Vec<PerStack>,
    /// Bumped each time the peak rises: the current peak's number.
    peak_id: u64,
    /// Allocation calls (malloc family, new, realloc, mmap, mremap).
    pub allocations: u64,
    /// Deallocation calls (free family, delete, munmap); realloc's implied
    /// free is not counted, nor the free of an internal block.
    pub frees: u64,
    /// Blocks a realloc freed (moved or resized: the old half of each
    /// successful realloc of a live block). With `frees` and the blocks
    /// not freed they account for the allocation calls.
    pub realloc_frees: u64,
    /// Bytes requested by all allocation calls.
    pub bytes_allocated: u64,
    /// Bytes live now (heap blocks and mappings).
    pub cur_bytes: u64,
    /// Blocks live now.
    pub cur_blocks: u64,
    /// Most bytes live at once.
    pub peak_bytes: u64,
    /// Blocks live at that peak.
    pub peak_blocks: u64,
    /// When the peak was reached, ns since the start.
    pub peak_time: u64,
    /// The stream holds every heap block of the process so far
    /// ([`mtrace_format::Record::Coverage`]): a free of an address it never
    /// saw allocated is an invalid free, not one of a block from before
    /// tracing.
    pub whole: bool,
    /// Since when allocations have been collected without a break (ns;
    /// `None`: not now): a second free of an address is a double free only
    /// if the first came after this, or an allocation between the two may
    /// have gone unrecorded.
    pub collecting_since: Option<u64>,
    /// Mismatched frees found so far.
    mismatches: wrong::Mismatches,
    /// How many more invalid frees may look for the block their address
    /// points into (a walk over every address kept).
    lookups_left: u32,
    /// munmap calls that unmapped nothing the program had mapped with its
    /// own traced mmap (allowed by POSIX; counted, not an error).
    pub unknown_munmaps: u64,
    /// Every function that hands out the program's heap blocks is followed
    /// (false: an allocator of the program's own, hooked by patching its
    /// malloc family, may also allocate through functions of its own that
    /// no producer sees): only then is a second free of an address a
    /// double free.
    pub every_path_seen: bool,
    /// Second frees of an address not called double frees, because
    /// [`Books::every_path_seen`] did not hold.
    pub frees_again: u64,
    /// Frees of another family than the block's allocation (or told
    /// another size or alignment) not called mismatched, because
    /// [`Books::every_path_seen`] did not hold: the block the books hold
    /// at the address may have been freed, and the address handed out
    /// again, by functions no producer sees (Chromium's browser process:
    /// some 12 such blocks a run, freed later by another family in one
    /// run of some 65).
    pub frees_unjudged: u64,
    /// Wrong frees (double and invalid, mismatched) in the part of a
    /// bounded trace its oldest checkpoint replaced: counted, not listed.
    dropped_wrong: (u64, u64),
    /// When blocks were allocated and freed, per backtrace, if kept (the
    /// HTML report's time ranges).
    pub lifetimes: Option<Box<lifetimes::Lifetimes>>,
    /// The time of the event being entered, ns.
    clock: u64,
    /// A promise of the reader's ([`Books::promise`]): no event of a
    /// thread other than `.0` still to come is stamped before `.1` (ns).
    ahead: (u32, u64),
    /// The stream is sampled at this mean of bytes
    /// ([`mtrace_format::Record::Sampling`]; 0: every allocation is in
    /// it): every count and byte sum here is then the estimate of
    /// [`Block::estimate`].
    pub sample_rate: u64,
}

/// Invalid frees that look for the block they point into, per trace.
const LOOKUPS: u32 = 1000;

impl Default for Books {
    fn default() -> Books {
        Books {
            heap: Default::default(),
            ties: Default::default(),
            wrong: Vec::new(),
            maps: Default::default(),
            per_stack: Default::default(),
            peak_id: 0,
            allocations: 0,
            frees: 0,
            realloc_frees: 0,
            bytes_allocated: 0,
            cur_bytes: 0,
            cur_blocks: 0,
            peak_bytes: 0,
            peak_blocks: 0,
            peak_time: 0,
            whole: false,
            collecting_since: Some(0),
            mismatches: Default::default(),
            lookups_left: LOOKUPS,
            unknown_munmaps: 0,
            every_path_seen: true,
            frees_again: 0,
            frees_unjudged: 0,
            dropped_wrong: (0, 0),
            lifetimes: None,
            clock: 0,
            ahead: (0, 0),
            sample_rate: 0,
        }
    }
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

    /// Counts allocation `b` (its estimate, in a sampled trace). Inlined
    /// ([`Books::alloc`]): its reference to `b` kept the block in memory.
    #[inline(always)]
    fn count_alloc(&mut self, b: &Block) {
        let (size, n) = b.estimate(self.sample_rate);
        // Saturating: a damaged trace may claim any size.
        self.allocations += n;
        self.bytes_allocated = self.bytes_allocated.saturating_add(size);
        let t = &mut self.stack(b.stack).totals;
        t.allocations += n;
        t.bytes = t.bytes.saturating_add(size);
    }

    /// Adds `blocks` blocks of `bytes` in total to what `b`'s backtrace holds.
    fn live_add(&mut self, b: &Block, bytes: u64, blocks: u64) {
        let peak_id = self.peak_id;
        let s = self.stack(b.stack);
        if s.snap != peak_id {
            s.at_peak = s.live;
            s.snap = peak_id;
        }
        s.live.0 = s.live.0.saturating_add(bytes);
        s.live.1 += blocks;
        s.family.get_or_insert(b.family);
        self.cur_bytes = self.cur_bytes.saturating_add(bytes);
        self.cur_blocks += blocks;
    }

    fn grow(&mut self, b: &Block) {
        let (bytes, n) = b.estimate(self.sample_rate);
        self.live_add(b, bytes, n);
        if self.cur_bytes > self.peak_bytes {
            self.peak_bytes = self.cur_bytes;
            self.peak_blocks = self.cur_blocks;
            self.peak_time = b.time;
            self.peak_id += 1;
        }
    }

    fn shrink(&mut self, b: &Block) {
        let (bytes, n) = b.estimate(self.sample_rate);
        if let Some(l) = &mut self.lifetimes {
            l.add(b.stack, (bytes, n), b.time, Some(self.clock));
        }
        let peak_id = self.peak_id;
        let s = self.stack(b.stack);
        if s.snap != peak_id {
            s.at_peak = s.live;
            s.snap = peak_id;
        }
        s.live.0 = s.live.0.saturating_sub(bytes);
        s.live.1 = s.live.1.saturating_sub(n);
        self.cur_bytes = self.cur_bytes.saturating_sub(bytes);
        self.cur_blocks = self.cur_blocks.saturating_sub(n);
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

    /// Prepares for an event at `addr` some records from now: `slot`
    /// false fetches the line of the address's index, true (a few records
    /// later) its slot. Only a hint: nothing changes.
    #[inline]
    pub fn prefetch(&self, addr: u64, slot: bool) {
        if slot {
            self.heap.prefetch_slot(addr)
        } else {
            self.heap.prefetch_index(addr)
        }
    }

    /// A block came into existence (malloc, new, the new half of realloc)
    /// in thread `tid`.
    ///
    /// Always inlined: apart, `b` came in through memory, written by the
    /// caller a field at a time and copied into the ties' event in 16-byte
    /// loads (a stalled load, 40% of its samples). Reporting 20 M live
    /// blocks 1.66-2.18 -> 1.63-1.75 s, 5 M 0.411-0.428 -> 0.387-0.421 s,
    /// jq and the churn the same (alternated).
    #[inline(always)]
    pub fn alloc(&mut self, tid: u32, addr: u64, b: Block) {
        if b.family != Family::Internal {
            self.count_alloc(&b);
        }
        self.enter(ties::Event::Alloc { tid, addr, block: b });
    }

    /// Promises that no event of a thread other than `tid` still to come
    /// is stamped before `until` (ns), until the next promise: the next
    /// events of `tid` more than [`EPS`] before it go into the books at
    /// once, with those of `tid` waiting in the ties before them, when no
    /// other thread's is waiting (no other thread's event can be tied with
    /// them). The reader of a merged stream knows this from
    /// its batch (`input/ahead.rs`); without a promise every event waits.
    #[inline]
    pub fn promise(&mut self, tid: u32, until: u64) {
        self.ahead = (tid, until);
    }

    /// Takes heap event `e`; enters it, and those waiting before it, once
    /// the ties have ordered them: at once when [`Books::promise`] says
    /// no other thread's event can be tied with it.
    #[inline]
    fn enter(&mut self, e: ties::Event) {
        let (tid, now) = match &e {
            ties::Event::Alloc { tid, block, .. } => (*tid, block.time),
            ties::Event::Free { tid, time, .. } => (*tid, *time),
        };
        if tid == self.ahead.0 && now.saturating_add(EPS) < self.ahead.1 && self.ties.all_of(tid) {
            // Those waiting, of the same thread, are before it in its order.
            self.settle();
            return self.enter_one(e);
        }
        self.ties.push(e);
        self.advance(now);
    }

    /// The stream has every event stamped before `time` (ns): the ties
    /// enter those waiting that nothing still to come can precede.
    pub fn advance(&mut self, time: u64) {
        while let Some(e) = self.ties.next(Some(time), |a| self.heap.is_live(a)) {
            self.enter_one(e);
        }
    }

    /// Enters every event waiting in the ties: the stream ended (or is
    /// reported as it is).
    pub fn settle(&mut self) {
        while let Some(e) = self.ties.next(None, |a| self.heap.is_live(a)) {
            self.enter_one(e);
        }
    }

    /// Enters heap event `e` into the books.
    #[inline]
    fn enter_one(&mut self, e: ties::Event) {
        match e {
            ties::Event::Alloc { addr, block, .. } => {
                self.clock = block.time;
                let c = self.heap.alloc(addr, block);
                self.apply(c);
            }
            ties::Event::Free { addr, time, d, .. } => {
                let c = self.heap.free(addr, time, d.stack.unwrap_or(heap::NO_STACK));
                self.clock = time;
                // The free of a block glibc allocated inside a hook is not
                // counted, as its allocation is not. One such block: the
                // 32-byte entry `__cxa_thread_atexit_impl` makes for
                // parking_lot's thread-local when a lock in a hook had to
                // wait (seen with gdb), freed when the thread ends;
                // counting its free made ctests/threads.c's frees vary with
                // the timing. Nor is realloc's implied free.
                let internal = c.ended.as_ref().is_some_and(|b| b.family == Family::Internal);
                if !internal && !d.realloc {
                    self.frees += c.ended.as_ref().map_or(1, |b| b.estimate(self.sample_rate).1);
                } else if !internal {
                    self.realloc_frees += c.ended.as_ref().map_or(0, |b| b.estimate(self.sample_rate).1);
                }
                // The common case, a free of the block allocated there by
                // its own family, is right at once.
                let right = c.outcome == heap::Outcome::Ended
                    && c.ended.as_ref().is_some_and(|b| {
                        !wrong::mismatched(b.family, d.family)
                            && ((d.size | d.align) == 0 && b.align == 0 || wrong::misdescribed(b, &d).is_none())
                    });
                if !right && d.family != Family::Pool {
                    self.judge(addr, time, d, &c);
                }
                self.apply(c);
            }
        }
    }

    /// The live blocks changed: `c.ended` is gone, `c.born` is live.
    fn apply(&mut self, c: heap::Change) {
        if let Some(old) = c.ended.filter(|o| o.family != Family::Internal) {
            self.shrink(&old);
        }
        if let Some(new) = c.born.filter(|b| b.family != Family::Internal) {
            self.grow(&new);
        }
    }

    /// Blocks glibc allocated inside a hook, live now: (address, size, time).
    pub fn internal_blocks(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.heap.live().filter(|(_, b)| b.family == Family::Internal).map(|(a, b)| (a, b.size, b.time))
    }

    /// A `free()` call at `time` in thread `tid`, without backtrace.
    pub fn free(&mut self, tid: u32, addr: u64, time: u64) {
        self.dealloc(tid, addr, time, Dealloc::free());
    }

    /// A deallocation call `d` (free, delete, delete[], a pool's free, the
    /// free half of a realloc) of `addr` at `time` in thread `tid`.
    #[inline]
    pub fn dealloc(&mut self, tid: u32, addr: u64, time: u64, d: Dealloc) {
        self.enter(ties::Event::Free { tid, addr, time, d });
    }

    /// Finds what is wrong with the free `d` of `addr` that made change `c`.
    #[cold]
    #[inline(never)]
    fn judge(&mut self, addr: u64, time: u64, d: Dealloc, c: &heap::Change) {
        let wrong = |kind, block, first_free| WrongFree { kind, call: d, addr, time, block, first_free };
        if let Some(b) = c.ended.as_ref() {
            // The family first; then, of the right family, what the free
            // was told of the block (its size, its alignment).
            let kind = match wrong::mismatched(b.family, d.family) {
                true => Some(WrongKind::Mismatched),
                false => wrong::misdescribed(b, &d),
            };
            match kind {
                Some(_) if !self.every_path_seen => self.frees_unjudged += 1,
                Some(kind) => {
                    let block = Concerned { addr, block: *b, freed: false };
                    self.mismatches.add(wrong(kind, Some(block), None));
                }
                None => {}
            }
        }
        let w = match c.outcome {
            heap::Outcome::Again { .. } if !self.every_path_seen => {
                self.frees_again += 1;
                return;
            }
            heap::Outcome::Again { after, first_free } if self.collecting_since.is_some_and(|since| after >= since) => {
                let first = (first_free != heap::NO_STACK).then_some(first_free);
                let freed = self.heap.block(addr).map(|b| Concerned { addr, block: b, freed: true });
                wrong(WrongKind::DoubleFree, freed, first)
            }
            heap::Outcome::Unknown if self.whole => {
                let inside = if self.lookups_left > 0 {
                    self.lookups_left -= 1;
                    self.heap.containing(addr).map(|(a, b, freed)| Concerned { addr: a, block: b, freed })
                } else {
                    None
                };
                wrong(WrongKind::InvalidFree, inside, None)
            }
            // A block from before tracing or allocated while not
            // collecting.
            _ => return,
        };
        self.wrong.push(w);
    }

    /// A successful realloc in thread `tid`: `old` freed at `free_time`,
    /// `new` allocated (`b.stack`, the realloc's backtrace, is the free's too).
    pub fn realloc(&mut self, tid: u32, old: u64, free_time: u64, new: u64, b: Block) {
        self.realloc_free(tid, old, free_time, Some(b.stack));
        self.alloc(tid, new, b);
    }

    /// The free half of a realloc of `old` at `free_time` (from backtrace
    /// `stack`), entered on its own: its allocation comes later (the merge
    /// puts each half at its own time), or never (the process ended inside
    /// the realloc: glibc aborted on `old`, no live block).
    pub fn realloc_free(&mut self, tid: u32, old: u64, free_time: u64, stack: Option<u32>) {
        let d = Dealloc { family: Family::Malloc, stack, realloc: true, size: 0, align: 0 };
        self.dealloc(tid, old, free_time, d);
    }

    /// How many wrong frees were found: (double and invalid, mismatched).
    pub fn wrong_free_counts(&self) -> (u64, u64) {
        let mismatched = self.mismatches.groups().map(|(_, n)| n).sum();
        (self.wrong.len() as u64, mismatched)
    }

    /// The wrong frees found, grouped by kind, call and backtraces (see
    /// [`wrong::key`]): each group's first wrong free (the earliest) and
    /// how many there were, earliest group first.
    pub fn wrong_frees(&self) -> Vec<(WrongFree, u64)> {
        let mut groups: HashMap<wrong::GroupKey, (WrongFree, u64)> = HashMap::default();
        for (w, n) in self.mismatches.groups() {
            groups.insert(wrong::key(w), (w.clone(), n));
        }
        for s in &self.wrong {
            let g = groups.entry(wrong::key(s)).or_insert_with(|| (s.clone(), 0));
            if s.time < g.0.time {
                g.0 = s.clone();
            }
            g.1 += 1;
        }
        let mut v: Vec<_> = groups.into_values().collect();
        v.sort_by_key(|(w, _)| (w.time, w.addr));
        v
    }

    /// A new mapping; it replaces whatever it overlaps (MAP_FIXED).
    pub fn mmap(&mut self, addr: u64, b: Block) {
        self.clock = b.time;
        self.count_alloc(&b);
        self.unmap_range(addr, b.size);
        self.grow(&b);
        self.maps.insert(addr, b);
    }

    /// munmap of `[addr, addr+len)` at `time`, which may cut mappings in pieces.
    pub fn munmap(&mut self, addr: u64, len: u64, time: u64) {
        self.frees += 1;
        self.clock = time;
        if !self.unmap_range(addr, len) {
            self.unknown_munmaps += 1;
        }
    }

    /// mremap: the old range goes, the new one is a new mapping.
    pub fn mremap(&mut self, old: u64, old_len: u64, new: u64, b: Block) {
        self.clock = b.time;
        self.unmap_range(old, old_len);
        self.mmap(new, b);
    }

    /// Removes what `[addr, addr+len)` covers; false when it covered no mapping.
    fn unmap_range(&mut self, addr: u64, len: u64) -> bool {
        let end = addr.saturating_add(page_len(len));
        // Mappings never overlap each other, so walking down from `end`
        // stops at the first one that ends before `addr`.
        let overlapping: Vec<u64> =
            self.maps.range(..end).rev().take_while(|(&s, b)| s + page_len(b.size) > addr).map(|(&s, _)| s).collect();
        let any = !overlapping.is_empty();
        for s in overlapping {
            let b = self.maps.remove(&s).expect("listed above");
            self.shrink(&b);
            let b_end = s + page_len(b.size);
            if s < addr {
                let head = Block { size: addr - s, ..b };
                self.live_add(&head, head.size, 1);
                self.maps.insert(s, head);
            }
            if b_end > end {
                let tail = Block { size: b_end - end, ..b };
                self.live_add(&tail, tail.size, 1);
                self.maps.insert(end, tail);
            }
        }
        any
    }

    /// Frees what only entering events needs, for books that will only be
    /// read from now on (a report's, once its trace is read): the heap's
    /// index by address, a quarter of the books at 20 M live blocks. An
    /// event entered later is still entered right, after the index is
    /// built again.
    pub fn done_entering(&mut self) {
        self.heap.drop_index();
    }

    /// Everything still live: heap blocks and mappings, with their addresses.
    pub fn live_blocks(&self) -> impl Iterator<Item = (u64, Block)> + '_ {
        self.heap.live().filter(|(_, b)| b.family != Family::Internal).chain(self.maps.iter().map(|(&a, &b)| (a, b)))
    }

    /// Frees whose block was never seen and that are not wrong frees:
    /// allocated before tracing started (or while it was stopped).
    pub fn unmatched_frees(&self) -> u64 {
        self.heap.unmatched().saturating_sub(self.wrong.len() as u64)
    }
}

/// Length rounded up to whole pages, as the kernel maps and unmaps.
fn page_len(len: u64) -> u64 {
    len.max(1).next_multiple_of(4096)
}

#[cfg(test)]
mod tests;
