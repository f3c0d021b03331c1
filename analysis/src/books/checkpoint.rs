//! The books at a checkpoint (docs/FORMAT.md, record 28): what a bounded
//! trace restates so that it reads whole without its older part — the
//! counters and per-backtrace totals written out, and entered again by a
//! reader that starts at the checkpoint.

use mtrace_format::Family;

use super::{Block, Books, PerStack, StackTotals};

/// A backtrace's books at a checkpoint: (canonical index, totals, bytes
/// and blocks it held live at the peak).
pub type StackAtCheckpoint = (u32, StackTotals, (u64, u64));

/// A counter a checkpoint carries: its name (docs/FORMAT.md, record 28),
/// how the writer reads it, how a reader that starts there sets it. The
/// wrong frees before the checkpoint are counted there, not listed.
type Counter = (&'static str, fn(&Books) -> u64, fn(&mut Books, u64));

const COUNTERS: [Counter; 12] = [
    ("allocations", |b| b.allocations, |b, v| b.allocations = v),
    ("frees", |b| b.frees, |b, v| b.frees = v),
    ("realloc_frees", |b| b.realloc_frees, |b, v| b.realloc_frees = v),
    ("bytes_allocated", |b| b.bytes_allocated, |b, v| b.bytes_allocated = v),
    ("peak_bytes", |b| b.peak_bytes, |b, v| b.peak_bytes = v),
    ("peak_blocks", |b| b.peak_blocks, |b, v| b.peak_blocks = v),
    ("peak_time", |b| b.peak_time, |b, v| b.peak_time = v),
    ("unknown_munmaps", |b| b.unknown_munmaps, |b, v| b.unknown_munmaps = v),
    ("frees_again", |b| b.frees_again, |b, v| b.frees_again = v),
    ("frees_unjudged", |b| b.frees_unjudged, |b, v| b.frees_unjudged = v),
    ("wrong_frees", |b| b.wrong_free_counts().0 + b.dropped_wrong.0, |b, v| b.dropped_wrong.0 = v),
    ("mismatched_frees", |b| b.wrong_free_counts().1 + b.dropped_wrong.1, |b, v| b.dropped_wrong.1 = v),
];

impl Books {
    /// The counters a checkpoint carries, by the names docs/FORMAT.md
    /// gives them (counts, bytes, ns).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        COUNTERS.iter().map(|(name, get, _)| (*name, get(self))).collect()
    }

    /// Sets counter `name` as a checkpoint gave it; false for a name this
    /// reader does not know (a newer writer's: ignored).
    pub fn restore_counter(&mut self, name: &str, v: u64) -> bool {
        let Some((_, _, set)) = COUNTERS.iter().find(|(n, _, _)| *n == name) else { return false };
        set(self, v);
        true
    }

    /// Every backtrace with allocations or blocks live at the peak.
    pub fn stacks_at_checkpoint(&self) -> impl Iterator<Item = StackAtCheckpoint> + '_ {
        self.per_stack.iter().enumerate().filter_map(|(i, s)| {
            let at_peak = if s.snap == self.peak_id { s.at_peak } else { s.live };
            (s.totals.allocations > 0 || at_peak.1 > 0).then_some((i as u32, s.totals, at_peak))
        })
    }

    /// Sets backtrace `stack`'s totals and what it held at the peak, from a
    /// checkpoint (after its blocks were restored).
    pub fn restore_stack(&mut self, stack: u32, totals: StackTotals, at_peak: (u64, u64)) {
        let peak_id = self.peak_id;
        let s: &mut PerStack = self.stack(stack);
        s.totals = totals;
        s.at_peak = at_peak;
        s.snap = peak_id;
    }

    /// Every block the books hold, for a checkpoint: heap blocks (those
    /// allocated inside a hook and pool blocks too, at their keys) and
    /// mappings (`true`).
    pub fn every_block(&self) -> impl Iterator<Item = (u64, Block, bool)> + '_ {
        self.heap.live().map(|(a, b)| (a, b, false)).chain(self.maps.iter().map(|(&a, &b)| (a, b, true)))
    }

    /// A block live at a checkpoint (`mapping`: a mapping), entered as
    /// live without counting an allocation call or moving the peak (the
    /// checkpoint's counters say those).
    pub fn restore_block(&mut self, addr: u64, b: Block, mapping: bool) {
        if b.family != Family::Internal {
            let (bytes, n) = b.estimate(self.sample_rate);
            self.live_add(&b, bytes, n);
        }
        if mapping {
            self.maps.insert(addr, b);
        } else {
            let _ = self.heap.alloc(addr, b);
        }
    }

    /// Wrong frees before the oldest checkpoint a trace kept: (double and
    /// invalid, mismatched), counted there and not listed.
    pub fn dropped_wrong_frees(&self) -> (u64, u64) {
        self.dropped_wrong
    }
}
