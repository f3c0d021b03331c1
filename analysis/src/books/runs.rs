//! The live blocks summed in runs ([`LiveRun`]: neighbours in the books of
//! one backtrace and family), and per backtrace.

use super::{Books, LiveRun, LiveTotals};
use mtrace_format::Family;
use rustc_hash::FxHashMap as HashMap;

impl Books {
    /// The blocks of [`Books::live_blocks`], in its order, summed in runs
    /// (`heap::Heap::live_runs`): the heap's, then each mapping as a run
    /// of its own. The sums a walk of the blocks would make, where each
    /// block stands for itself (a trace not sampled: [`Books::sample_rate`]
    /// 0).
    pub fn live_runs(&self, mut f: impl FnMut(LiveRun)) {
        self.heap.live_runs(|r| {
            if r.family != Family::Internal {
                f(r)
            }
        });
        for b in self.maps.values() {
            f(LiveRun { stack: b.stack, family: b.family, bytes: b.size, blocks: 1, latest: b.time });
        }
    }

    /// Live bytes and blocks per backtrace, with the family of its first
    /// block.
    pub fn live_by_stack(&self) -> HashMap<u32, LiveTotals> {
        let mut m: HashMap<u32, LiveTotals> = HashMap::default();
        let mut add = |stack: u32, bytes: u64, blocks: u64, family: Family| {
            let e = m.entry(stack).or_insert(LiveTotals { bytes: 0, blocks: 0, family });
            e.bytes = e.bytes.saturating_add(bytes);
            e.blocks += blocks;
        };
        if self.sample_rate == 0 {
            self.live_runs(|r| add(r.stack, r.bytes, r.blocks, r.family));
            return m;
        }
        // Sampled: what each block stands for is its own. Summed a run of
        // blocks of one backtrace at a time all the same.
        let mut run: Option<(u32, LiveTotals)> = None;
        self.live_blocks().for_each(|(_, b)| {
            let (bytes, n) = b.estimate(self.sample_rate);
            match &mut run {
                Some((stack, l)) if *stack == b.stack => {
                    l.bytes = l.bytes.saturating_add(bytes);
                    l.blocks += n;
                }
                _ => {
                    if let Some((s, l)) = run.replace((b.stack, LiveTotals { bytes, blocks: n, family: b.family })) {
                        add(s, l.bytes, l.blocks, l.family);
                    }
                }
            }
        });
        if let Some((s, l)) = run {
            add(s, l.bytes, l.blocks, l.family);
        }
        m
    }
}
