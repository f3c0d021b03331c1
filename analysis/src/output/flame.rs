//! A trace's costs per backtrace as collapsed stacks (`--folded`: the
//! text flamegraph.pl, inferno and speedscope read — one line per
//! backtrace, frames outermost first joined by `;`, then a space and the
//! cost) and as an interactive flamegraph SVG (`--flamegraph`, drawn by
//! inferno, the Rust port of flamegraph.pl).

use std::io::{self, Write};

use rustc_hash::FxHashMap as HashMap;

use crate::symbolize::{Frame, Symbolizer};
use crate::trace::Trace;

/// What a flamegraph's widths measure, per backtrace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// Bytes still live at the end of the trace (or its `--until-marker`).
    Leaked,
    /// Bytes requested by all allocations over the run.
    Allocated,
    /// Allocation calls over the run.
    Calls,
    /// Bytes live at the peak of live memory.
    Peak,
}

impl Cost {
    /// Every cost, each with its name and what it measures (for
    /// `--cost`'s help).
    pub const ALL: [(Cost, &'static str, &'static str); 4] = [
        (Cost::Leaked, "leaked", "Bytes still live at the end of the trace (or its `--until-marker`)"),
        (Cost::Allocated, "allocated", "Bytes requested by all allocations over the run"),
        (Cost::Calls, "calls", "Allocation calls over the run"),
        (Cost::Peak, "peak", "Bytes live at the peak of live memory"),
    ];

    /// The cost named `s`, ASCII case ignored.
    pub fn parse(s: &str) -> Option<Cost> {
        Self::ALL.iter().find(|(_, n, _)| n.eq_ignore_ascii_case(s)).map(|e| e.0)
    }

    fn unit(self) -> &'static str {
        match self {
            Cost::Calls => "calls",
            _ => "bytes",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Cost::Leaked => "Memory not freed",
            Cost::Allocated => "Bytes allocated",
            Cost::Calls => "Allocation calls",
            Cost::Peak => "Memory at the peak",
        }
    }
}

/// A frame's name in a collapsed stack: the function, else module+offset
/// (`;` would split the frame, so it becomes `:`).
fn name(f: &Frame) -> String {
    let n = match &f.function {
        Some(func) => func.clone(),
        None => format!("{}+{:#x}", f.module, f.offset),
    };
    n.replace(';', ":")
}

/// The collapsed stacks of `t` weighted by `cost`, sorted; backtraces that
/// symbolize alike are one line. `depth` limits the recorded frames as in
/// the text report.
pub fn folded(t: &Trace, sym: &mut Symbolizer, cost: Cost, depth: Option<usize>) -> Vec<String> {
    let per_stack: Vec<(u32, u64)> = match cost {
        Cost::Leaked => t.books.live_by_stack().into_iter().map(|(s, l)| (s, l.bytes)).collect(),
        Cost::Peak => t.books.live_at_peak().into_iter().map(|(s, l)| (s, l.bytes)).collect(),
        Cost::Allocated | Cost::Calls => (0..t.stacks.frames.len() as u32)
            .map(|s| {
                let totals = t.books.totals_of(s);
                (s, if cost == Cost::Calls { totals.allocations } else { totals.bytes })
            })
            .collect(),
    };
    let mut lines: HashMap<String, u64> = HashMap::default();
    for (s, v) in per_stack.into_iter().filter(|&(_, v)| v > 0) {
        let frames = crate::report::stack_frames(t, sym, s, depth);
        let mut path: Vec<String> = frames.iter().rev().map(name).collect();
        if path.is_empty() {
            path.push("[no backtrace]".to_owned());
        }
        let e = lines.entry(path.join(";")).or_default();
        *e = e.saturating_add(v);
    }
    let mut out: Vec<String> = lines.into_iter().map(|(p, v)| format!("{p} {v}")).collect();
    out.sort();
    out
}

/// Draws `lines` (from [`folded`]) as a flamegraph SVG into `w`; `icicle`
/// puts the roots at the top.
pub fn flamegraph(lines: &[String], cost: Cost, program: &str, icicle: bool, w: impl Write) -> io::Result<()> {
    let mut o = inferno::flamegraph::Options::default();
    o.title = format!("{} — {program}", cost.title());
    o.count_name = cost.unit().to_owned();
    o.colors = inferno::flamegraph::Palette::Basic(inferno::flamegraph::color::BasicPalette::Mem);
    o.direction =
        if icicle { inferno::flamegraph::Direction::Inverted } else { inferno::flamegraph::Direction::Straight };
    if lines.is_empty() {
        // inferno refuses an empty profile; say so in a valid SVG instead.
        let mut w = w;
        return writeln!(
            w,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"600\" height=\"40\"><text x=\"10\" y=\"25\">No {} \
             to draw.</text></svg>",
            cost.unit()
        );
    }
    inferno::flamegraph::from_lines(&mut o, lines.iter().map(String::as_str), w).map_err(io::Error::other)
}
