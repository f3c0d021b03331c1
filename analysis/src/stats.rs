//! Whole-run statistics beside the books, in the spirit of heaptrack's
//! report sections: temporary allocations and the allocation-size
//! histogram. (Most calls come from the books' per-backtrace totals, peak
//! consumers from the books' per-backtrace state at the peak.)

use rustc_hash::FxHashMap as HashMap;

/// Histogram buckets: sizes up to 2^0, 2^1, … 2^(BUCKETS-2) bytes, and larger.
pub const BUCKETS: usize = 26;

/// What the run did, counted while the books are kept: temporary allocations and the size histogram.
#[derive(Default)]
pub struct RunStats {
    /// Backtrace → allocations freed right after being made: heaptrack's
    /// definition, no other allocation by the same thread in between.
    pub temporary: HashMap<u32, u64>,
    /// Temporary allocations in all.
    pub temporary_total: u64,
    /// The thread of the latest allocation, and its (address, backtrace):
    /// apart from the other threads' (most programs have one thread
    /// allocating at a time; a map update per allocation was 1.5% of a
    /// report).
    last: Option<(u32, u64, u32)>,
    /// Per other thread, its last allocation: (address, backtrace).
    others: HashMap<u32, (u64, u32)>,
    /// Per bucket: (allocation calls, bytes); estimates in a sampled trace.
    pub histogram: [(u64, u64); BUCKETS],
    /// The trace is sampled at this mean of bytes (0: not sampled). A
    /// sampled trace cannot tell temporary allocations (the allocations
    /// in between were not recorded): none are counted.
    pub sample_rate: u64,
}

/// The bucket of an allocation of `size` bytes: the smallest k with size ≤ 2^k.
pub fn bucket(size: u64) -> usize {
    let k = if size <= 1 { 0 } else { 64 - (size - 1).leading_zeros() as usize };
    k.min(BUCKETS - 1)
}

impl RunStats {
    /// Counts an allocation of `size` bytes at `addr` by thread `tid` from backtrace `stack`.
    pub fn alloc(&mut self, tid: u32, addr: u64, size: u64, stack: u32) {
        match self.last.replace((tid, addr, stack)) {
            Some(l) if l.0 == tid => {}
            prev => {
                self.others.remove(&tid);
                if let Some((t, a, s)) = prev {
                    self.others.insert(t, (a, s));
                }
            }
        }
        let b = &mut self.histogram[bucket(size)];
        // Rounded as the books round a block (the same rule, keyed by
        // the address), so that the counts stay unbiased.
        let (bytes, n) = mtrace_format::sampling::estimate(size, self.sample_rate, addr ^ size.rotate_left(17));
        b.0 += n;
        b.1 = b.1.saturating_add(bytes);
    }

    /// Counts a free of `addr` by thread `tid`: temporary if it is that thread's latest allocation.
    pub fn free(&mut self, tid: u32, addr: u64) {
        if self.sample_rate != 0 {
            return;
        }
        let stack = match self.last {
            Some((t, a, stack)) if t == tid => {
                if a != addr {
                    return;
                }
                self.last = None;
                stack
            }
            _ => match self.others.get(&tid) {
                Some(&(a, stack)) if a == addr => {
                    self.others.remove(&tid);
                    stack
                }
                _ => return,
            },
        };
        *self.temporary.entry(stack).or_default() += 1;
        self.temporary_total += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!([bucket(0), bucket(1), bucket(2), bucket(3), bucket(4), bucket(5)], [0, 0, 1, 2, 2, 3]);
        assert_eq!(bucket(1 << 20), 20);
        assert_eq!(bucket((1 << 20) + 1), 21);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn temporary_means_no_allocation_in_between() {
        let mut s = RunStats::default();
        s.alloc(1, 0x10, 8, 7);
        s.free(1, 0x10); // temporary
        s.alloc(1, 0x20, 8, 7);
        s.alloc(1, 0x30, 8, 9);
        s.free(1, 0x20); // not: 0x30 came in between
        s.alloc(2, 0x40, 8, 9);
        s.free(1, 0x40); // not: another thread's block
        assert_eq!(s.temporary_total, 1);
        assert_eq!(s.temporary.get(&7), Some(&1));
        // Threads taking turns: each one's last allocation is its own.
        s.alloc(1, 0x50, 8, 3);
        s.alloc(2, 0x60, 8, 4);
        s.free(2, 0x60); // temporary (thread 2's last)
        s.alloc(1, 0x70, 8, 5);
        s.free(1, 0x50); // not: 0x70 came in between in thread 1
        s.alloc(2, 0x80, 8, 6);
        s.free(1, 0x70); // temporary (thread 1's last, while 2 allocated)
        assert_eq!(s.temporary_total, 3);
        assert_eq!((s.temporary.get(&4), s.temporary.get(&5), s.temporary.get(&3)), (Some(&1), Some(&1), None));
    }
}
