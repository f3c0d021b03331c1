//! The report's sections beside the leaks, as users of heaptrack know them:
//! most allocation calls, temporary allocations, peak memory consumers, the
//! allocation-size histogram, and (memleax's "expired") blocks still live
//! long after they were allocated.

use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;

use crate::books::LiveTotals;
use crate::stats::BUCKETS;
use crate::symbolize::{Frame, Symbolizer};
use crate::trace::Trace;

/// Entries shown per section.
pub const TOP: usize = 5;

/// A backtrace with a count and bytes.
#[derive(Serialize, Debug)]
pub struct Entry {
    /// Calls or blocks (the section says which).
    pub count: u64,
    /// Bytes.
    pub bytes: u64,
    /// The backtrace, symbolized.
    pub frames: Vec<Frame>,
    /// The frame a one-line table names (`report::own_code::headline`).
    pub at: usize,
}

/// One histogram bucket: allocations of at most `max_size` bytes (and more
/// than the bucket before); `null` for the last, open bucket.
#[derive(Serialize, Debug)]
pub struct Bucket {
    /// The bucket's largest size, bytes.
    pub max_size: Option<u64>,
    /// Allocation calls in it.
    pub calls: u64,
    /// Bytes they requested.
    pub bytes: u64,
}

/// The sections heaptrack users know (`--sections`).
#[derive(Serialize, Debug)]
pub struct Sections {
    /// Backtraces with the most allocation calls (count = calls, bytes = bytes requested).
    pub most_calls: Vec<Entry>,
    /// Allocations freed before the same thread allocated again (count).
    pub temporary: Vec<Entry>,
    /// Temporary allocations of the whole run.
    pub temporary_total: u64,
    /// What each backtrace held live at the peak (count = blocks).
    pub peak_consumers: Vec<Entry>,
    /// Allocation sizes by powers of two.
    pub histogram: Vec<Bucket>,
    /// With `--older-than`: live blocks allocated that long before the end (count = blocks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub older_than: Option<Vec<Entry>>,
}

/// What `build` needs besides the trace.
pub struct Inputs<'a> {
    /// Live blocks per backtrace at the peak ([`crate::books::Books::live_at_peak`]).
    pub at_peak: &'a HashMap<u32, LiveTotals>,
    /// `--older-than`, ns.
    pub older_than_ns: Option<u64>,
    /// Recorded frames per backtrace (`-d`).
    pub depth: Option<usize>,
    /// The program's own allocation wrappers, which no entry is named by
    /// (`own_code::headline`).
    pub wrappers: &'a [String],
}

/// The `TOP` rows of (backtrace, count, bytes), largest `count` first, or
/// largest `bytes` first when `by_bytes`.
fn top(mut v: Vec<(u32, u64, u64)>, by_bytes: bool) -> Vec<(u32, u64, u64)> {
    let key = |r: &(u32, u64, u64)| if by_bytes { (r.2, r.1) } else { (r.1, r.2) };
    v.sort_by(|a, b| key(b).cmp(&key(a)).then(a.0.cmp(&b.0)));
    v.truncate(TOP);
    v
}

/// The sections of `t`.
pub fn build(t: &Trace, sym: &mut Symbolizer, inp: &Inputs) -> Sections {
    let mut entries = |rows: Vec<(u32, u64, u64)>| -> Vec<Entry> {
        rows.into_iter()
            .map(|(s, count, bytes)| {
                let frames = super::stack_frames(t, sym, s, inp.depth);
                Entry { count, bytes, at: super::own_code::headline(&frames, inp.wrappers), frames }
            })
            .collect()
    };
    let most_calls = entries(top(t.books.totals().map(|(s, x)| (s, x.allocations, x.bytes)).collect(), false));
    let temporary = entries(top(t.stats.temporary.iter().map(|(&s, &n)| (s, n, 0)).collect(), false));
    let peak_consumers = entries(top(inp.at_peak.iter().map(|(&s, l)| (s, l.blocks, l.bytes)).collect(), true));
    let older_than = inp.older_than_ns.map(|d| {
        let cutoff = t.last_time.saturating_sub(d);
        let g = t.books.live_by_backtrace(|b| b.time < cutoff);
        entries(top(g.into_iter().map(|(s, (bytes, n))| (s, n, bytes)).collect(), true))
    });
    let histogram = t
        .stats
        .histogram
        .iter()
        .enumerate()
        .filter(|(_, b)| b.0 > 0)
        .map(|(k, b)| Bucket { max_size: (k < BUCKETS - 1).then(|| 1u64 << k), calls: b.0, bytes: b.1 })
        .collect();
    Sections { most_calls, temporary, temporary_total: t.stats.temporary_total, peak_consumers, histogram, older_than }
}
