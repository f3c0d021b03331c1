//! `--intervals DURATION`: unfreed allocations per time window, in the
//! spirit of libmemleak. The run is cut into windows of DURATION; for each
//! backtrace, the allocations made in each window that are still live at
//! the end. A backtrace that leaves memory behind in every window is
//! growing steadily, the signature of a leak in a long-running program, and
//! is ranked first (then by bytes per second).

use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;

use crate::symbolize::{Frame, Symbolizer};
use crate::trace::Trace;

/// Backtraces shown.
pub const TOP: usize = 5;

/// The most windows a run is cut into: a shorter window than the run
/// allows is widened (each backtrace holds a row of windows; `1ns` on a
/// one-second run asked for 10^9 of them and ran out of memory).
pub const MAX_WINDOWS: u64 = 1000;

/// One time window of `--intervals`.
#[derive(Serialize, Debug, Clone, Copy, Default)]
pub struct Window {
    /// Start, ns since the trace started.
    pub start_ns: u64,
    /// Allocations made in this window and never freed.
    pub allocations: u64,
    /// Bytes of those allocations.
    pub bytes: u64,
}

/// A backtrace whose allocations left live memory in many windows.
#[derive(Serialize, Debug)]
pub struct Grower {
    /// Windows in which this backtrace left live memory.
    pub windows_with_growth: u64,
    /// Unfreed bytes per second over the run.
    pub bytes_per_s: f64,
    /// Unfreed allocations per second over the run.
    pub allocations_per_s: f64,
    /// Its allocations per window.
    pub per_window: Vec<Window>,
    /// The backtrace, symbolized.
    pub frames: Vec<Frame>,
}

/// `--intervals`: the run cut into windows, the backtraces that left memory live in the most of them first.
#[derive(Serialize, Debug)]
pub struct Intervals {
    /// A window's length, ns.
    pub duration_ns: u64,
    /// How many windows (at most [`MAX_WINDOWS`]).
    pub windows: u64,
    /// The window asked for, ns, when it was widened to keep to
    /// [`MAX_WINDOWS`]; None when `duration_ns` is the one asked for.
    pub asked_ns: Option<u64>,
    /// The backtraces, at most [`TOP`].
    pub stacks: Vec<Grower>,
}

/// The intervals of `t` in windows of `duration_ns` (ns), widened to at
/// most [`MAX_WINDOWS`]; `depth` recorded frames per backtrace.
pub fn build(t: &Trace, sym: &mut Symbolizer, duration_ns: u64, depth: Option<usize>) -> Intervals {
    let asked = duration_ns.max(1);
    let d = asked.max((t.last_time / MAX_WINDOWS).saturating_add(1));
    let asked_ns = (d != asked).then_some(asked);
    let windows = t.last_time / d + 1;
    let mut per: HashMap<u32, Vec<Window>> = HashMap::default();
    for l in t.books.live() {
        let b = l.block;
        let w = per
            .entry(b.stack)
            .or_insert_with(|| (0..windows).map(|i| Window { start_ns: i * d, ..Default::default() }).collect());
        let slot = &mut w[((b.time / d) as usize).min(windows as usize - 1)];
        slot.allocations += l.blocks;
        slot.bytes = slot.bytes.saturating_add(l.bytes);
    }
    let run_s = (t.last_time.max(1)) as f64 / 1e9;
    let mut rows: Vec<(u32, u64, u64, Vec<Window>)> = per
        .into_iter()
        .map(|(s, w)| {
            let growing = w.iter().filter(|x| x.allocations > 0).count() as u64;
            let bytes = w.iter().map(|x| x.bytes).sum();
            (s, growing, bytes, w)
        })
        .collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)));
    rows.truncate(TOP);
    let stacks = rows
        .into_iter()
        .map(|(s, growing, bytes, per_window)| {
            let allocations: u64 = per_window.iter().map(|x| x.allocations).sum();
            Grower {
                windows_with_growth: growing,
                bytes_per_s: bytes as f64 / run_s,
                allocations_per_s: allocations as f64 / run_s,
                per_window,
                frames: super::stack_frames(t, sym, s, depth),
            }
        })
        .collect();
    Intervals { duration_ns: d, windows, asked_ns, stacks }
}
