//! The live blocks as a report reads them: each weighed once, by its
//! estimate in a sampled trace ([`Block::estimate`]), for every report
//! and view (the text and its sections, the intervals, the HTML page,
//! pprof, the process tree, `attach --interval`, the console).

use rustc_hash::FxHashMap as HashMap;

use super::{Block, Books};

/// A live block as a report reads it ([`Books::live`]).
#[derive(Clone, Copy, Debug)]
pub struct Live {
    /// Its address.
    pub addr: u64,
    /// The block.
    pub block: Block,
    /// The bytes it stands for (its size, or its estimate in a sampled trace).
    pub bytes: u64,
    /// The blocks it stands for (1, or its estimate in a sampled trace).
    pub blocks: u64,
}

impl Books {
    /// Everything still live, as [`Books::live_blocks`] in the same order,
    /// each with what it stands for: in a sampled trace its estimate
    /// ([`Block::estimate`] at the books' rate), else its own size and 1.
    /// The one place a live block is weighed for a report.
    #[inline]
    pub fn live(&self) -> impl Iterator<Item = Live> + '_ {
        let rate = self.sample_rate;
        self.live_blocks().map(move |(addr, block)| {
            let (bytes, blocks) = block.estimate(rate);
            Live { addr, block, bytes, blocks }
        })
    }

    /// What the live blocks `keep` lets through hold per backtrace:
    /// backtrace → (bytes, blocks), weighed as [`Books::live`] does.
    pub fn live_by_backtrace(&self, keep: impl Fn(&Block) -> bool) -> HashMap<u32, (u64, u64)> {
        let mut by: HashMap<u32, (u64, u64)> = HashMap::default();
        for l in self.live().filter(|l| keep(&l.block)) {
            let e = by.entry(l.block.stack).or_default();
            e.0 = e.0.saturating_add(l.bytes);
            e.1 += l.blocks;
        }
        by
    }
}
