//! `--html FILE`: the report as one self-contained page — no network access
//! when opened, works from `file://` — with memory over time, flamegraphs
//! of four costs, a time range picked on the chart (what was allocated in
//! it and is still live at its end), and the tables of the text report.
//!
//! The page is the data (JSON in a `<script type="application/json">`)
//! and a small hand-written script (`report.js`, beside this file) that
//! draws it: the flamegraphs of a time range are computed in the browser,
//! so the same drawing serves the four fixed costs too. What the data holds
//! is bounded whatever the trace: per backtrace (at most [`MAX_STACKS`], the
//! rest summed as one), per time bucket ([`crate::books::lifetimes`]), and
//! at most [`MAX_POINTS`] points of the chart and [`MAX_ROWS`] rows of a
//! table.

use std::io::{self, Write};

use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;

use crate::books::lifetimes::{Lifetimes, NEVER};
use crate::report::{stack_frames, LeakEntry, Report};
use crate::symbolize::{Frame, Symbolizer};
use crate::trace::Trace;

/// Backtraces drawn one by one; the others are summed into one.
pub const MAX_STACKS: usize = 3000;
/// Points of the memory chart at most.
pub const MAX_POINTS: usize = 2000;
/// Rows of the leaks table at most.
pub const MAX_ROWS: usize = 1000;

const SCRIPT: &str = include_str!("report.js");
const STYLE: &str = include_str!("report.css");

/// One backtrace of the flamegraphs: frames (indices into
/// [`Data::frames`]), outermost first, and its four costs.
#[derive(Serialize)]
struct Stack {
    f: Vec<u32>,
    /// Bytes not freed at the end, bytes allocated, allocation calls,
    /// bytes live at the peak.
    v: [u64; 4],
}

/// A row of the leaks table: an entry of the report, its frames as
/// indices into [`Data::frames`], innermost first.
#[derive(Serialize)]
struct Row<'a> {
    bytes: i64,
    blocks: i64,
    total_allocations: u64,
    family: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<crate::scan::Kind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    indirect_bytes: Option<u64>,
    f: Vec<u32>,
    /// The frame the "where" column names (an index into `f`).
    at: usize,
}

#[derive(Serialize)]
struct Data<'a> {
    /// The report as JSON has it, without its entries (`leaks` has them).
    report: serde_json::Value,
    /// The leaks table: the report's entries, at most [`MAX_ROWS`].
    leaks: Vec<Row<'a>>,
    /// How many entries the report has.
    leaks_total: usize,
    duration_ns: u64,
    /// (time ns, RSS bytes, live heap bytes).
    timeline: Vec<(u64, u64, u64)>,
    /// (time ns, name) of each marker.
    markers: Vec<(u64, &'a str)>,
    /// Function names, and locations (`file:line`, else module+offset).
    names: Vec<String>,
    locs: Vec<String>,
    /// (name, location) per frame.
    frames: Vec<(u32, u32)>,
    stacks: Vec<Stack>,
    /// ns per bucket of `life`.
    quantum_ns: u64,
    /// (stack, allocation bucket, free bucket or 4294967295 for never,
    /// bytes, blocks): blocks that outlived the bucket they were
    /// allocated in.
    life: Vec<(u32, u32, u32, u64, u64)>,
}

/// Interns frame names and locations.
#[derive(Default)]
struct Tables {
    names: Vec<String>,
    locs: Vec<String>,
    frames: Vec<(u32, u32)>,
    by_name: HashMap<String, u32>,
    by_loc: HashMap<String, u32>,
    by_frame: HashMap<(u32, u32), u32>,
}

fn intern(v: &mut Vec<String>, by: &mut HashMap<String, u32>, s: String) -> u32 {
    if let Some(&i) = by.get(&s) {
        return i;
    }
    v.push(s.clone());
    by.insert(s, v.len() as u32 - 1);
    v.len() as u32 - 1
}

impl Tables {
    fn frame(&mut self, f: &Frame) -> u32 {
        let name = f.function.clone().unwrap_or_else(|| format!("{}+{:#x}", f.module, f.offset));
        let loc = match (&f.file, f.line) {
            (Some(file), Some(line)) => format!("{file}:{line}"),
            (Some(file), None) => file.clone(),
            _ => format!("{}+{:#x}", f.module, f.offset),
        };
        let loc = if f.inlined { format!("{loc} (inlined)") } else { loc };
        let key = (intern(&mut self.names, &mut self.by_name, name), intern(&mut self.locs, &mut self.by_loc, loc));
        if let Some(&i) = self.by_frame.get(&key) {
            return i;
        }
        self.frames.push(key);
        self.by_frame.insert(key, self.frames.len() as u32 - 1);
        self.frames.len() as u32 - 1
    }
}

/// The four costs of every backtrace with any.
fn costs(t: &Trace) -> HashMap<u32, [u64; 4]> {
    let mut m: HashMap<u32, [u64; 4]> = HashMap::default();
    for (s, l) in t.books.live_by_stack() {
        m.entry(s).or_default()[0] = l.bytes;
    }
    for (s, tot) in t.books.totals() {
        let e = m.entry(s).or_default();
        e[1] = tot.bytes;
        e[2] = tot.allocations;
    }
    for (s, l) in t.books.live_at_peak() {
        m.entry(s).or_default()[3] = l.bytes;
    }
    m
}

/// Keeps the [`MAX_STACKS`] backtraces with the largest share of any cost;
/// returns them, most first, and the costs of the others summed.
fn keep(costs: &HashMap<u32, [u64; 4]>) -> (Vec<u32>, [u64; 4]) {
    let mut total = [0u64; 4];
    for v in costs.values() {
        for i in 0..4 {
            total[i] = total[i].saturating_add(v[i]);
        }
    }
    let share = |v: &[u64; 4]| (0..4).map(|i| v[i] as f64 / total[i].max(1) as f64).fold(0.0, f64::max);
    let mut all: Vec<(u32, f64)> = costs.iter().map(|(&s, v)| (s, share(v))).collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut rest = [0u64; 4];
    for (s, _) in all.iter().skip(MAX_STACKS) {
        for i in 0..4 {
            rest[i] = rest[i].saturating_add(costs[s][i]);
        }
    }
    (all.into_iter().take(MAX_STACKS).map(|(s, _)| s).collect(), rest)
}

/// The lifetimes' cells, with the blocks still live at the end, by kept
/// backtrace (`index` maps a canonical backtrace to its place; the others
/// go to `other`).
fn life(t: &Trace, l: &Lifetimes, index: &HashMap<u32, u32>, other: u32) -> Vec<(u32, u32, u32, u64, u64)> {
    let mut cells: HashMap<(u32, u32, u32), (u64, u64)> = HashMap::default();
    let q = l.quantum();
    let live = t.books.live().map(|l| (l.block.stack, (l.block.time / q) as u32, NEVER, l.bytes, l.blocks));
    for (s, a, f, bytes, n) in l.cells().chain(live) {
        let e = cells.entry((index.get(&s).copied().unwrap_or(other), a, f)).or_default();
        e.0 = e.0.saturating_add(bytes);
        e.1 += n;
    }
    let mut v: Vec<_> = cells.into_iter().map(|((s, a, f), (b, n))| (s, a, f, b, n)).collect();
    v.sort_unstable();
    v
}

/// Writes the page of trace `t` (loaded with lifetimes) and its report `r`
/// to `w`. `r` is as it was when this returns (its entries are set aside
/// while the rest is made into JSON).
pub fn write(t: &Trace, r: &mut Report, sym: &mut Symbolizer, depth: Option<usize>, w: impl Write) -> io::Result<()> {
    // The page has the entries apart (`leaks`, their frames shared): the
    // report's JSON without them. Made with them and then cut, their tree
    // of JSON values was half of the peak memory of cc1plus's page (440 of
    // 850 MB, by `mtrace run` of this).
    let stacks = std::mem::take(&mut r.stacks);
    let report = serde_json::to_value(&*r);
    r.stacks = stacks;
    let mut report = report.map_err(io::Error::other)?;
    if let Some(o) = report.as_object_mut() {
        o.remove("stacks");
    }
    let r = &*r;
    let costs = costs(t);
    let (kept, rest) = keep(&costs);
    let mut tables = Tables::default();
    let mut stacks = Vec::with_capacity(kept.len() + 1);
    let mut index: HashMap<u32, u32> = HashMap::default();
    for &s in &kept {
        let frames = stack_frames(t, sym, s, depth);
        let mut f: Vec<u32> = frames.iter().rev().map(|fr| tables.frame(fr)).collect();
        if f.is_empty() {
            f.push(tables.frame(&synthetic("[no backtrace]")));
        }
        index.insert(s, stacks.len() as u32);
        stacks.push(Stack { f, v: costs[&s] });
    }
    let other = stacks.len() as u32;
    stacks.push(Stack { f: vec![tables.frame(&synthetic("[other backtraces]"))], v: rest });
    let empty = Lifetimes::default();
    let lifetimes = t.books.lifetimes.as_deref().unwrap_or(&empty);
    let leaks = r.stacks.iter().take(MAX_ROWS).map(|e| row(e, &mut tables)).collect();
    let data = Data {
        report,
        leaks,
        leaks_total: r.stacks.len(),
        duration_ns: t.last_time,
        timeline: crate::report::thin(&t.timeline, MAX_POINTS)
            .iter()
            .map(|p| (p.time_ns, p.rss_bytes, p.heap_bytes))
            .collect(),
        markers: t.markers.iter().map(|m| (m.time_ns, m.name.as_str())).collect(),
        life: life(t, lifetimes, &index, other),
        quantum_ns: lifetimes.quantum(),
        names: tables.names,
        locs: tables.locs,
        frames: tables.frames,
        stacks,
    };
    let json = serde_json::to_string(&data).map_err(io::Error::other)?;
    page(&r.program, &json, w)
}

fn row<'a>(e: &'a LeakEntry, tables: &mut Tables) -> Row<'a> {
    Row {
        bytes: e.bytes,
        blocks: e.blocks,
        total_allocations: e.total_allocations,
        family: &e.family,
        kind: e.kind,
        indirect_bytes: e.indirect_bytes,
        f: e.frames.iter().map(|f| tables.frame(f)).collect(),
        at: e.at,
    }
}

/// A frame that stands for something other than code.
fn synthetic(name: &str) -> Frame {
    Frame {
        address: 0,
        function: Some(name.to_owned()),
        file: None,
        line: None,
        module: String::new(),
        offset: 0,
        inlined: false,
    }
}

/// The page around `json`.
fn page(program: &str, json: &str, mut w: impl Write) -> io::Result<()> {
    // Inside <script>, "</script" or "<!--" would end or change the
    // element: '<' only occurs inside JSON strings, where "\u003c" is it too.
    let json = json.replace('<', "\\u003c");
    let title = escape(&format!("mtrace — {program}"));
    write!(
        w,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <main id=\"app\"><noscript>This report is drawn by JavaScript.</noscript></main>\n\
         <script type=\"application/json\" id=\"data\">{json}</script>\n<script>\n{SCRIPT}</script>\n</body>\n</html>\n"
    )
}

/// `s` as HTML text.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_data_cannot_end_its_script_element() {
        let mut out = Vec::new();
        super::page("a<b>", r#"{"name":"</script><!--"}"#, &mut out).unwrap();
        let html = String::from_utf8(out).unwrap();
        assert_eq!(html.matches("</script>").count(), 2, "{html}");
        assert!(html.contains(r#"{"name":"\u003c/script>\u003c!--"}"#), "{html}");
        assert!(html.contains("<title>mtrace — a&lt;b&gt;</title>"));
    }
}
