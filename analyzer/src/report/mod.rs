//! The leak report: built once from a loaded trace, printed as text or JSON.

pub mod intervals;
pub mod sections;
pub mod text;

use rustc_hash::FxHashMap as HashMap;

use serde::Serialize;

use crate::load::Trace;
use crate::symbolize::{Frame, Symbolizer};

pub use text::write_text;

/// Order of the "not freed" entries (the keys of mtrace-ng).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// Bytes not freed (default).
    Bytes,
    /// Blocks not freed.
    Count,
    /// All allocations made from the backtrace over the run.
    Total,
    /// Average size of the blocks not freed.
    Average,
}

#[derive(Serialize, Debug)]
pub struct Summary {
    /// Allocation calls: malloc family, new, realloc, mmap, mremap.
    pub allocations: u64,
    /// Deallocation calls: free family, delete, munmap.
    pub frees: u64,
    /// Bytes requested by all allocation calls.
    pub bytes_allocated: u64,
    /// Most bytes live at once (heap blocks and mappings).
    pub peak_bytes: u64,
    pub peak_blocks: u64,
    /// When the peak was reached, ns since the start.
    pub peak_time_ns: u64,
    /// Bytes still allocated when the trace ended (with `since_marker`: the
    /// change since that marker, which may be negative).
    pub leaked_bytes: i64,
    pub leaked_blocks: i64,
    /// Time of the last event, ns since the start.
    pub duration_ns: u64,
    /// The trace is incomplete: it breaks off inside a record, or the
    /// process ended without writing its End record (SIGKILL, power loss).
    pub truncated: bool,
    /// Why reading stopped early, with the byte offset.
    pub error: Option<String>,
    /// How the process ended: exit, _exit, abort, signal N, exec.
    pub ended_by: Option<String>,
    /// Frees of blocks allocated before tracing started.
    pub unmatched_frees: u64,
    /// The report is the change since this marker ...
    pub since_marker: Option<String>,
    /// ... up to this one (else to the end of the trace).
    pub until_marker: Option<String>,
}

/// One backtrace's blocks that were not freed (or, in a report since a
/// marker, the change in its live blocks: negative when more were freed).
#[derive(Serialize, Debug)]
pub struct LeakEntry {
    pub bytes: i64,
    pub blocks: i64,
    /// Allocations made from this backtrace over the whole run.
    pub total_allocations: u64,
    /// Allocator family of the blocks: malloc, new, new[], aligned, mmap,
    /// or `pool NAME` for blocks recorded with `mtrace_alloc`.
    pub family: String,
    pub frames: Vec<Frame>,
}

/// Rows of `--timeline` at most: longer runs are shown at even steps.
pub const TIMELINE_ROWS: usize = 60;

#[derive(Serialize, Debug)]
pub struct Report {
    pub trace: String,
    pub program: String,
    pub pid: u32,
    pub ppid: u32,
    pub cmdline: Vec<String>,
    pub summary: Summary,
    pub stacks: Vec<LeakEntry>,
    /// With `--timeline`: RSS and live heap over time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<crate::load::TimePoint>>,
    /// Most calls, temporary allocations, peak consumers, size histogram
    /// (not in a report of a window between markers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sections: Option<sections::Sections>,
    /// With `--intervals`: unfreed allocations per time window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intervals: Option<intervals::Intervals>,
}

/// Parses a duration for `--older-than`: `500ms`, `10s`, `2m`, `1h`, or
/// plain seconds (fractions allowed). Returns ns.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a duration (like 500ms, 10s, 2m)"))?;
    let scale = match unit {
        "" | "s" => 1e9,
        "ms" => 1e6,
        "us" => 1e3,
        "ns" => 1.0,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ns, us, ms, s, m, h)")),
    };
    Ok((v * scale) as u64)
}

/// At most `rows` points of `all`, evenly spaced, the last one included.
pub fn thin(all: &[crate::load::TimePoint], rows: usize) -> Vec<crate::load::TimePoint> {
    if all.len() <= rows {
        return all.to_vec();
    }
    (0..rows).map(|i| all[(i + 1) * all.len() / rows - 1]).collect()
}

fn end_text(r: mtrace_format::EndReason) -> String {
    use mtrace_format::EndReason::*;
    match r {
        Exit => "exit".into(),
        UnderscoreExit => "_exit".into(),
        Abort => "abort".into(),
        Signal(n) => format!("signal {n}"),
        Exec => "exec".into(),
    }
}

/// Builds the report: groups the blocks still live by backtrace (minus the
/// baseline at the `since` marker, if any), sorts by `sort`, and symbolizes
/// up to `depth` recorded frames of each.
pub fn build(t: &Trace, sym: &mut Symbolizer, sort: SortKey, depth: Option<usize>) -> Report {
    let now = t.books.live_by_stack();
    let mut groups: HashMap<u32, (i64, i64, mtrace_format::Family)> =
        now.iter().map(|(&s, l)| (s, (l.bytes as i64, l.blocks as i64, l.family))).collect();
    if let Some(base) = &t.baseline {
        for (&s, l) in base {
            let g = groups.entry(s).or_insert((0, 0, l.family));
            g.0 -= l.bytes as i64;
            g.1 -= l.blocks as i64;
        }
        groups.retain(|_, g| g.0 != 0 || g.1 != 0);
    }
    type Row = (u32, i64, i64, u64, mtrace_format::Family);
    let mut entries: Vec<Row> = groups
        .into_iter()
        .map(|(s, (bytes, blocks, fam))| (s, bytes, blocks, t.books.totals.get(&s).map_or(0, |x| x.allocations), fam))
        .collect();
    let key = |e: &Row| match sort {
        SortKey::Bytes => e.1,
        SortKey::Count => e.2,
        SortKey::Total => e.3 as i64,
        SortKey::Average => e.1 / e.2.max(1),
    };
    entries.sort_by(|a, b| key(b).cmp(&key(a)).then(b.1.cmp(&a.1)).then(a.0.cmp(&b.0)));
    let (leaked_bytes, leaked_blocks) = entries.iter().fold((0, 0), |acc, e| (acc.0 + e.1, acc.1 + e.2));
    let stacks = entries
        .into_iter()
        .map(|(s, bytes, blocks, total, fam)| {
            let raw = &t.stacks.frames[s as usize];
            let time = t.stacks.def_time[s as usize];
            let n = depth.unwrap_or(usize::MAX).min(raw.len());
            let frames = raw[..n].iter().flat_map(|&a| sym.frames(&t.modules, a, time)).collect();
            let family = match t.stacks.pool_of.get(&s) {
                Some(p) => format!("pool {}", t.pools.get(p).map_or("?", String::as_str)),
                None => fam.name().to_owned(),
            };
            LeakEntry { bytes, blocks, total_allocations: total, family, frames }
        })
        .collect();
    let h = &t.header;
    Report {
        trace: t.path.display().to_string(),
        program: h.exe.clone(),
        pid: h.pid,
        ppid: h.ppid,
        cmdline: h.cmdline.clone(),
        summary: Summary {
            allocations: t.books.allocations,
            frees: t.books.frees,
            bytes_allocated: t.books.bytes_allocated,
            peak_bytes: t.books.peak_bytes,
            peak_blocks: t.books.peak_blocks,
            peak_time_ns: t.books.peak_time,
            leaked_bytes,
            leaked_blocks,
            duration_ns: t.last_time,
            // Reading stopped at --until-marker: no End record is expected.
            truncated: t.error.is_some() || (t.end.is_none() && !t.reached_until),
            error: t.error.as_ref().map(|e| format!("{}: {e}", t.path.display())),
            ended_by: t.end.map(end_text),
            unmatched_frees: t.books.unmatched_frees(),
            since_marker: None,
            until_marker: None,
        },
        stacks,
        timeline: None,
        sections: None,
        intervals: None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations() {
        assert_eq!(super::parse_duration("500ms"), Ok(500_000_000));
        assert_eq!(super::parse_duration("2m"), Ok(120_000_000_000));
        assert_eq!(super::parse_duration("1.5"), Ok(1_500_000_000));
        assert!(super::parse_duration("soon").is_err());
        assert!(super::parse_duration("3 weeks").is_err());
    }
}
