//! When each backtrace's blocks were allocated and freed, coarsely: the
//! HTML report's time ranges ("allocated between A and B and still live at
//! B", memray's temporal view) are answered from it in the browser.
//!
//! Times are kept in buckets of `quantum` ns; the quantum starts at 1 ms
//! and doubles (the buckets merge in pairs) whenever a time passes
//! [`MAX_BUCKETS`] of them, so the table stays small whatever the run's
//! length, and nothing needs a second pass over the trace. A block freed in
//! the bucket it was allocated in is never live at a bucket's end: only
//! blocks that outlive their bucket are kept.

use rustc_hash::FxHashMap as HashMap;

/// Buckets at most: the quantum doubles beyond.
pub const MAX_BUCKETS: u64 = 4096;

/// The bucket of a block still live at the end.
pub const NEVER: u32 = u32::MAX;

/// Bytes and blocks per (backtrace, allocation bucket, free bucket).
#[derive(Debug)]
pub struct Lifetimes {
    /// ns per bucket.
    quantum: u64,
    cells: HashMap<(u32, u32, u32), (u64, u64)>,
}

impl Default for Lifetimes {
    fn default() -> Lifetimes {
        Lifetimes { quantum: 1_000_000, cells: HashMap::default() }
    }
}

impl Lifetimes {
    /// ns per bucket now.
    pub fn quantum(&self) -> u64 {
        self.quantum
    }

    fn bucket(&mut self, t: u64) -> u32 {
        while t / self.quantum >= MAX_BUCKETS {
            self.quantum *= 2;
            let old = std::mem::take(&mut self.cells);
            for ((s, a, f), (bytes, n)) in old {
                let f = if f == NEVER { NEVER } else { f / 2 };
                let e = self.cells.entry((s, a / 2, f)).or_default();
                e.0 = e.0.saturating_add(bytes);
                e.1 += n;
            }
            self.cells.retain(|&(_, a, f), _| f > a);
        }
        (t / self.quantum) as u32
    }

    /// A block of `size` bytes from backtrace `stack`, allocated at
    /// `alloc` and ended at `end` (ns; `None`: live at the end), counted as
    /// `blocks` blocks (more than 1 for a sampled block's estimate).
    pub fn add(&mut self, stack: u32, (size, blocks): (u64, u64), alloc: u64, end: Option<u64>) {
        let f = match end {
            Some(t) => self.bucket(t),
            None => NEVER,
        };
        let a = self.bucket(alloc);
        if f > a {
            let e = self.cells.entry((stack, a, f)).or_default();
            e.0 = e.0.saturating_add(size);
            e.1 += blocks;
        }
    }

    /// Every cell: (backtrace, allocation bucket, free bucket or [`NEVER`],
    /// bytes, blocks).
    pub fn cells(&self) -> impl Iterator<Item = (u32, u32, u32, u64, u64)> + '_ {
        self.cells.iter().map(|(&(s, a, f), &(b, n))| (s, a, f, b, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_lived_blocks_are_not_kept_and_buckets_merge() {
        let mut l = Lifetimes::default();
        l.add(1, (100, 1), 500_000, Some(900_000)); // within bucket 0
        l.add(2, (200, 1), 500_000, Some(2_500_000)); // 0 → 2
        l.add(3, (300, 1), 3_000_000, None); // 3 → never
        let mut c: Vec<_> = l.cells().collect();
        c.sort();
        assert_eq!(c, vec![(2, 0, 2, 200, 1), (3, 3, NEVER, 300, 1)]);
        // A time far on doubles the quantum until it fits: 0 → 2 becomes
        // 0 → 1 (q 2 ms), then 0 → 0 (q 4 ms) and is dropped.
        l.add(4, (400, 1), 16_000_000_000, None);
        assert_eq!(l.quantum(), 4_000_000);
        let mut c: Vec<_> = l.cells().collect();
        c.sort();
        assert_eq!(c, vec![(3, 0, NEVER, 300, 1), (4, 4000, NEVER, 400, 1)]);
    }
}
