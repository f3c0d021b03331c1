//! `mtrace diff OLD NEW`: what changed between two runs, per backtrace.
//! Backtraces are matched by their symbolized frames (function, file and
//! line; module+offset where there is no symbol), not by address, so two
//! builds of a program compare (heaptrack_print's `--diff`).

use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;

use crate::symbolize::{Frame, Symbolizer};
use crate::trace::Trace;

/// One backtrace's totals in one run.
#[derive(Clone, Copy, Default)]
struct Costs {
    leaked_bytes: i64,
    leaked_blocks: i64,
    peak_bytes: i64,
    calls: i64,
}

/// One backtrace's change from OLD to NEW (NEW minus OLD).
#[derive(Serialize, Debug)]
pub struct Change {
    /// Bytes and blocks not freed at the end.
    pub leaked_bytes: i64,
    /// Blocks not freed at the end.
    pub leaked_blocks: i64,
    /// Bytes live at the peak of live memory.
    pub peak_bytes: i64,
    /// Allocation calls over the run.
    pub calls: i64,
    /// The backtrace, symbolized.
    pub frames: Vec<Frame>,
}

/// The whole comparison.
#[derive(Serialize, Debug)]
pub struct Diff {
    /// The earlier trace's path.
    pub old: String,
    /// The later trace's path.
    pub new: String,
    /// The totals' changes: not freed, peak, allocation calls.
    pub leaked_bytes: i64,
    /// Change in blocks not freed.
    pub leaked_blocks: i64,
    /// Change in bytes live at the peak.
    pub peak_bytes: i64,
    /// Change in allocation calls.
    pub calls: i64,
    /// Backtraces whose costs changed, largest change in bytes not freed
    /// first, then in peak bytes, then in calls.
    pub stacks: Vec<Change>,
    /// What makes the comparison less than it seems, one line each: a
    /// module of either trace found only in another build (its frames stay
    /// module+offset, and pair with none of the other trace's).
    pub notices: Vec<String>,
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn key(frames: &[Frame]) -> String {
    frames
        .iter()
        .map(|f| match (&f.function, &f.file, f.line) {
            (Some(func), Some(file), Some(line)) => format!("{func} ({file}:{line})"),
            (Some(func), _, _) => format!("{func} [{}]", f.module),
            _ => format!("{}+{:#x}", f.module, f.offset),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Costs per symbolized backtrace of `t`, with the frames to show.
fn costs(t: &Trace, sym: &mut Symbolizer, depth: Option<usize>) -> HashMap<String, (Costs, Vec<Frame>)> {
    let live = t.books.live_by_stack();
    let peak = t.books.live_at_peak();
    let mut out: HashMap<String, (Costs, Vec<Frame>)> = HashMap::default();
    for s in 0..t.stacks.frames.len() as u32 {
        let calls = t.books.totals_of(s).allocations;
        let (l, p) = (live.get(&s), peak.get(&s));
        if calls == 0 && l.is_none() && p.is_none() {
            continue;
        }
        let frames = super::stack_frames(t, sym, s, depth);
        let e = out.entry(key(&frames)).or_insert_with(|| (Costs::default(), frames));
        e.0.calls += signed(calls);
        if let Some(l) = l {
            e.0.leaked_bytes += signed(l.bytes);
            e.0.leaked_blocks += signed(l.blocks);
        }
        if let Some(p) = p {
            e.0.peak_bytes += signed(p.bytes);
        }
    }
    out
}

/// Compares `old` with `new`, each symbolized with its own symbolizer.
pub fn diff(old: &Trace, new: &Trace, sym: &mut Symbolizer, depth: Option<usize>) -> Diff {
    let a = costs(old, sym, depth);
    let old_builds = sym.other_builds();
    let mut b = costs(new, sym, depth);
    let mut notices: Vec<String> =
        old_builds.iter().map(|o| format!("old: {}", crate::report::other_build_notice(o))).collect();
    notices.extend(
        sym.other_builds()
            .iter()
            .filter(|o| !old_builds.contains(o))
            .map(|o| format!("new: {}", crate::report::other_build_notice(o))),
    );
    let mut stacks = Vec::new();
    let mut keys: Vec<&String> = a.keys().collect();
    keys.extend(b.keys().filter(|k| !a.contains_key(*k)));
    let keys: Vec<String> = keys.into_iter().cloned().collect();
    for k in keys {
        let (o, of) = a.get(&k).cloned().unwrap_or_default();
        let (n, nf) = b.remove(&k).unwrap_or_default();
        let c = Change {
            leaked_bytes: n.leaked_bytes - o.leaked_bytes,
            leaked_blocks: n.leaked_blocks - o.leaked_blocks,
            peak_bytes: n.peak_bytes - o.peak_bytes,
            calls: n.calls - o.calls,
            frames: if nf.is_empty() { of } else { nf },
        };
        if c.leaked_bytes != 0 || c.leaked_blocks != 0 || c.peak_bytes != 0 || c.calls != 0 {
            stacks.push(c);
        }
    }
    stacks.sort_by(|x, y| {
        (y.leaked_bytes.abs(), y.peak_bytes.abs(), y.calls.abs())
            .cmp(&(x.leaked_bytes.abs(), x.peak_bytes.abs(), x.calls.abs()))
            .then_with(|| key(&x.frames).cmp(&key(&y.frames)))
    });
    let total = |t: &Trace| {
        (signed(t.books.cur_bytes), signed(t.books.cur_blocks), signed(t.books.peak_bytes), signed(t.books.allocations))
    };
    let (o, n) = (total(old), total(new));
    Diff {
        old: old.path.display().to_string(),
        new: new.path.display().to_string(),
        leaked_bytes: n.0 - o.0,
        leaked_blocks: n.1 - o.1,
        peak_bytes: n.2 - o.2,
        calls: n.3 - o.3,
        stacks,
        notices,
    }
}
