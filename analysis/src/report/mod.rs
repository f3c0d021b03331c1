//! The report model: built from a loaded trace (and, when it has one, the
//! leak scan's classes, which `crate::pipeline` makes); `crate::output`
//! renders it.

pub mod allocator_maps;
pub mod allocators;
pub mod diff;
pub mod errors;
mod groups;
pub mod intervals;
pub mod own_code;
pub mod processes;
pub mod sections;
mod sort_key;
pub mod suppress;
pub mod trace_time;

use rustc_hash::FxHashMap as HashMap;

use crate::scan::Kind;
use groups::{Group, Groups};
pub use sort_key::SortKey;

use serde::Serialize;

use crate::symbolize::{Frame, Symbolizer};
use crate::trace::Trace;

/// Whether a live block (address, block) is shown.
pub type BlockFilter<'a> = dyn Fn(u64, &crate::books::Block) -> bool + 'a;

/// What a report shows beyond the trace's own books: the console's
/// `scan new|leak` and its memory of the last scan.
#[derive(Default, Clone, Copy)]
pub struct View<'a> {
    /// Only the live blocks (address, block) this accepts are shown and counted.
    pub keep: Option<&'a BlockFilter<'a>>,
    /// The classification of the trace's snapshot (`crate::pipeline::classify`):
    /// entries are per backtrace and leak kind with it.
    pub classes: Option<&'a crate::scan::Classes>,
    /// Blocks (address, allocation time in ns) an earlier scan found
    /// definitely or indirectly lost: what the sort keys `bytes-leaked`
    /// and `leaks` count when the report has no scan of its own.
    pub lost_before: Option<&'a rustc_hash::FxHashSet<(u64, u64)>>,
    /// memcheck's heuristics the classification uses (all by default).
    pub heuristics: crate::scan::Heuristics,
    /// The program's own allocation wrappers (`wrapper:` lines of the
    /// suppressions file): each entry is named past them too
    /// ([`own_code::headline`]).
    pub wrappers: &'a [String],
}

/// The report's totals (`summary` in JSON).
#[derive(Serialize, Debug)]
pub struct Summary {
    /// Allocation calls: malloc family, new, realloc, mmap, mremap.
    pub allocations: u64,
    /// Deallocation calls: free family, delete, munmap.
    pub frees: u64,
    /// Blocks reallocs freed (moved or resized), not counted in `frees`:
    /// allocation calls = frees + realloc_frees + blocks not freed, where
    /// the trace has every block ([`crate::books::Books::realloc_frees`]).
    pub realloc_frees: u64,
    /// Bytes requested by all allocation calls.
    pub bytes_allocated: u64,
    /// Most bytes live at once (heap blocks and mappings).
    pub peak_bytes: u64,
    /// Blocks live at that peak.
    pub peak_blocks: u64,
    /// When the peak was reached, ns since the start.
    pub peak_time_ns: u64,
    /// Bytes still allocated when the trace ended (with `since_marker`: the
    /// change since that marker, which may be negative).
    pub leaked_bytes: i64,
    /// Blocks still allocated (or their change).
    pub leaked_blocks: i64,
    /// In a sampled trace (not a window's change): one standard error of
    /// `leaked_bytes` and of `leaked_blocks`, `[bytes, blocks]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaked_stderr: Option<[u64; 2]>,
    /// Time of the last event, ns since the start.
    pub duration_ns: u64,
    /// The trace is incomplete: it breaks off inside a record, or the
    /// process ended without writing its End record (SIGKILL, power loss).
    pub truncated: bool,
    /// Why reading stopped early, with the byte offset.
    pub error: Option<String>,
    /// How the process ended: exit, _exit, abort, signal N, exec, detach.
    pub ended_by: Option<String>,
    /// No End record because the process is still running (it holds its
    /// trace open: [`processes::holds_open`]): the report is of what it
    /// wrote so far, not of a process that was killed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub running: bool,
    /// The exit status of an exit or _exit, where the producer knew it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<u8>,
    /// What the process asked `exec` to run, where it ended by an exec.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<String>,
    /// Traced from an attach (`mtrace attach`): blocks from before it are unknown.
    pub attached: bool,
    /// A bounded trace (`mtrace run --max-trace-size`) read from its
    /// oldest checkpoint, of this time (ns since the start): the events
    /// before it were dropped. Every block live at the end, the totals and
    /// the peak are the whole run's; wrong frees before it are counted in
    /// `bad_frees` and `mismatched_frees`, not listed in `errors`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_from_ns: Option<u64>,
    /// Frees of blocks allocated before tracing started (not wrong frees).
    pub unmatched_frees: u64,
    /// Double and invalid frees (the entries of `errors`).
    pub bad_frees: u64,
    /// Mismatched frees (the entries of `errors`).
    pub mismatched_frees: u64,
    /// munmap calls that unmapped nothing the program had mapped with a
    /// traced mmap (allowed; not an error).
    pub unknown_munmaps: u64,
    /// The report is the change since this marker ...
    pub since_marker: Option<String>,
    /// ... up to this one (else to the end of the trace).
    pub until_marker: Option<String>,
    /// The report is the change since this time (`--from`, ns since the
    /// start) ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_ns: Option<u64>,
    /// ... up to this time (`--to`, ns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_ns: Option<u64>,
    /// The trace was sampled (`--sample-rate`): one allocation recorded
    /// per this many bytes allocated, on average. Every byte and block
    /// count of the report is then an unbiased estimate
    /// ([`crate::books::Block::estimate`]); double and invalid frees and
    /// temporary allocations are not found (docs/SAMPLING.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_rate: Option<u64>,
}

/// One backtrace's blocks that were not freed (or, in a report since a
/// marker, the change in its live blocks: negative when more were freed).
#[derive(Serialize, Debug)]
pub struct LeakEntry {
    /// Bytes not freed (or their change since the marker).
    pub bytes: i64,
    /// Blocks not freed (or their change).
    pub blocks: i64,
    /// Allocations made from this backtrace over the whole run.
    pub total_allocations: u64,
    /// Allocator family of the blocks: malloc, new, new[], aligned, mmap,
    /// or `pool NAME` for blocks recorded with `mtrace_alloc`.
    pub family: String,
    /// With a leak scan: memcheck's kind of these blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<crate::scan::Kind>,
    /// For definitely lost entries: bytes of the blocks lost through them
    /// (memcheck's "(D direct, I indirect)").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub indirect_bytes: Option<u64>,
    /// With the sort keys `bytes-leaked` and `leaks`: this entry's bytes
    /// and blocks found definitely or indirectly lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<crate::scan::Total>,
    /// In a sampled trace: one standard error of `bytes` and of `blocks`
    /// ([`mtrace_format::sampling::variance`]), `[bytes, blocks]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr: Option<[u64; 2]>,
    /// The backtrace, symbolized, innermost first.
    pub frames: Vec<Frame>,
    /// The frame a table that names one per backtrace names (an index
    /// into `frames`): the first in the program's own code
    /// ([`own_code::headline`]).
    pub at: usize,
}

/// One standard error from a summed variance `(bytes², blocks²)`:
/// `[bytes, blocks]`, rounded.
fn stderr((b, n): (f64, f64)) -> [u64; 2] {
    [b.sqrt().round() as u64, n.sqrt().round() as u64]
}

/// Rows of `--timeline` at most: longer runs are shown at even steps.
pub const TIMELINE_ROWS: usize = 60;

/// The report of one trace: its JSON document is this, field for field.
#[derive(Serialize, Debug)]
pub struct Report {
    /// The trace's path.
    pub trace: String,
    /// The traced executable.
    pub program: String,
    /// Its process id.
    pub pid: u32,
    /// Its parent's.
    pub ppid: u32,
    /// Its command line.
    pub cmdline: Vec<String>,
    /// The totals.
    pub summary: Summary,
    /// Wrong frees: mismatched, double and invalid frees.
    pub errors: Vec<errors::ErrorEntry>,
    /// The blocks not freed, per backtrace (and leak kind, with the scan), sorted as asked.
    pub stacks: Vec<LeakEntry>,
    /// The allocators found in the process's modules, and whether their
    /// calls were seen (allocators.rs).
    pub allocators: Vec<allocators::Allocator>,
    /// What mtrace could not see, one line each: an allocator whose calls
    /// did not reach it, a static executable without allocator symbols.
    /// Empty when it saw every allocator it found.
    pub notices: Vec<String>,
    /// With `--timeline`: RSS and live heap over time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<crate::trace::TimePoint>>,
    /// Most calls, temporary allocations, peak consumers, size histogram
    /// (not in a report of a window between markers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sections: Option<sections::Sections>,
    /// With `--suppressions`: each rule and what it suppressed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suppressed: Option<Vec<suppress::Rule>>,
    /// With a leak scan (`MTRACE_SCAN=1`): memcheck's four totals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kinds: Option<crate::scan::Kinds>,
    /// With a leak scan: when it was taken and how many threads it stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scan: Option<crate::scan::ScanInfo>,
    /// With `--intervals`: unfreed allocations per time window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intervals: Option<intervals::Intervals>,
    /// After a run that traced several processes: the process tree, this
    /// report's process marked `reported` (processes.rs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<Vec<processes::ProcessNode>>,
    /// The text lists the still reachable blocks and mappings of a scanned
    /// report (`--show-reachable`).
    #[serde(skip)]
    pub show_reachable: bool,
    /// The entries are every backtrace that allocated, by allocation calls
    /// (`--sort stacks`), not only those that left blocks.
    #[serde(skip)]
    pub every_backtrace: bool,
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

/// [`parse_duration`] of a window's length, which must be longer than 0
/// (`--intervals`).
pub fn parse_window(s: &str) -> Result<u64, String> {
    match parse_duration(s)? {
        0 => Err(format!("{s:?}: a window must be longer than 0 (like 500ms, 10s, 2m)")),
        ns => Ok(ns),
    }
}

/// At most `rows` points of `all`, evenly spaced, the last one included.
pub fn thin(all: &[crate::trace::TimePoint], rows: usize) -> Vec<crate::trace::TimePoint> {
    if all.len() <= rows {
        return all.to_vec();
    }
    (0..rows).map(|i| all[(i + 1) * all.len() / rows - 1]).collect()
}

/// A count or size for the signed totals (changes since a marker may be
/// negative): a damaged trace's size beyond i64 is held at its maximum.
fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn end_text(r: mtrace_format::EndReason) -> String {
    processes::end_text(r)
}

/// The symbolized frames of canonical backtrace `stack`, at most `depth`
/// recorded frames (each may expand into inlined frames).
pub fn stack_frames(t: &Trace, sym: &mut Symbolizer, stack: u32, depth: Option<usize>) -> Vec<Frame> {
    let raw = &t.stacks.frames[stack as usize];
    let time = t.stacks.def_time[stack as usize];
    let n = depth.unwrap_or(usize::MAX).min(raw.len());
    raw[..n].iter().flat_map(|&a| sym.frames(&t.modules, a, time)).collect()
}

/// Builds the report: groups the blocks still live by backtrace (minus the
/// baseline at the `since` marker, if any), sorts by `sort`, and symbolizes
/// up to `depth` recorded frames of each.
pub fn build(t: &Trace, sym: &mut Symbolizer, sort: SortKey, depth: Option<usize>, show_reachable: bool) -> Report {
    build_view(t, sym, sort, depth, show_reachable, View::default())
}

/// [`build`], with what `view` adds.
pub fn build_view(
    t: &Trace,
    sym: &mut Symbolizer,
    sort: SortKey,
    depth: Option<usize>,
    show_reachable: bool,
    view: View,
) -> Report {
    // With a leak scan, entries are per (backtrace, kind).
    let classes = view.classes;
    let mut grouped = Groups::default();
    let mut kinds = classes.as_ref().map(|_| crate::scan::Kinds::default());
    // Indirect bytes per owning definitely lost block.
    let mut owned: HashMap<u64, u64> = HashMap::default();
    let mut owner_group: HashMap<u64, u32> = HashMap::default();
    let mut live_total = (0i64, 0i64);
    let mut live_var = (0.0f64, 0.0f64);
    // Blocks that stand for themselves, with no scan, filter or earlier
    // leaks to look up: summed a run of neighbours at a time
    // (`Books::live_runs`; the walk of 20 M live blocks 0.24 -> 0.03 s of
    // perf's samples, the report 2.12-2.55 -> 1.80-1.99 s).
    let plain = classes.is_none() && view.keep.is_none() && view.lost_before.is_none() && t.books.sample_rate == 0;
    if plain {
        t.books.live_runs(|r| {
            live_total.0 = live_total.0.saturating_add(signed(r.bytes));
            live_total.1 += r.blocks as i64;
            let g = grouped.at((r.stack, None), r.family);
            g.bytes = g.bytes.saturating_add(signed(r.bytes));
            g.blocks += r.blocks as i64;
            g.latest = g.latest.max(r.latest);
        });
    } else {
        // `for_each`, not a `for` loop: the loop's `next` through the books'
        // chain of iterators handed each block over through the stack, and
        // reading it back stalled (the walk of 20 M blocks 0.51 -> 0.40 s).
        t.books.live().enumerate().for_each(|(place, l)| {
            // In a sampled trace, what the block stands for: `size`, `n`.
            let (addr, b, size, n) = (l.addr, l.block, l.bytes, l.blocks);
            if view.keep.is_some_and(|k| !k(addr, &b)) {
                return;
            }
            live_total.0 = live_total.0.saturating_add(signed(size));
            live_total.1 += n as i64;
            let var = b.variance(t.books.sample_rate);
            live_var.0 += var.0;
            live_var.1 += var.1;
            let class = classes.as_ref().and_then(|c| c.at(place, addr));
            let kind = class.map(|c| c.kind);
            let lost = match (kind, view.lost_before) {
                (Some(k), _) => matches!(k, Kind::Definite | Kind::Indirect),
                (None, Some(l)) => l.contains(&(addr, b.time)),
                (None, None) => false,
            };
            if let (Some(k), Some(c)) = (kind.as_ref(), class) {
                let all = kinds.as_mut().expect("with classes");
                if let Some(h) = c.via {
                    let v = all.reachable_via_heuristic.get_mut(h);
                    v.bytes = v.bytes.saturating_add(size);
                    v.blocks += n;
                }
                let slot = all.get_mut(*k);
                slot.bytes = slot.bytes.saturating_add(size);
                slot.blocks += n;
                if let Some(o) = c.owner {
                    let e = owned.entry(o).or_default();
                    *e = e.saturating_add(size);
                }
                if *k == Kind::Definite {
                    owner_group.insert(addr, b.stack);
                }
                // (`stacks` lists every backtrace, each as it stands.)
                if *k == Kind::Reachable && !show_reachable && sort != SortKey::Stacks {
                    return;
                }
            }
            // The program's own mappings are roots to the scan, not blocks it
            // classifies: listed with the reachable ones (memcheck and LSan
            // do not track mmap at all).
            if let (Some(c), None, mtrace_format::Family::Mmap) = (classes, kind, b.family) {
                if let Some(all) = kinds.as_mut() {
                    // (An allocator's own mappings are not roots: counted apart.)
                    let t = if c.allocators_mapping(addr) { &mut all.allocator_mappings } else { &mut all.mappings };
                    t.bytes = t.bytes.saturating_add(size);
                    t.blocks += n;
                }
                if !show_reachable {
                    return;
                }
            }
            let g = grouped.at((b.stack, kind), b.family);
            g.bytes = g.bytes.saturating_add(signed(size));
            g.blocks += n as i64;
            g.latest = g.latest.max(b.time);
            g.var.0 += var.0;
            g.var.1 += var.1;
            if lost {
                g.lost.bytes = g.lost.bytes.saturating_add(size);
                g.lost.blocks += n;
            }
        });
    }
    let mut groups = grouped.into_map();
    let mut indirect_of: HashMap<u32, u64> = HashMap::default();
    for (o, bytes) in owned {
        if let Some(&st) = owner_group.get(&o) {
            let e = indirect_of.entry(st).or_default();
            *e = e.saturating_add(bytes);
        }
    }
    if let Some(base) = &t.baseline {
        for (&s, l) in base {
            let g = groups.entry((s, None)).or_insert(Group::empty(l.family));
            g.bytes = g.bytes.saturating_sub(signed(l.bytes));
            g.blocks = g.blocks.saturating_sub(signed(l.blocks));
        }
        groups.retain(|_, g| g.bytes != 0 || g.blocks != 0);
    }
    // `stacks`: also the backtraces with nothing live.
    let every_backtrace = sort == SortKey::Stacks && view.keep.is_none();
    if every_backtrace {
        let used: rustc_hash::FxHashSet<u32> = groups.keys().map(|k| k.0).collect();
        for s in 0..t.stacks.frames.len() as u32 {
            if !used.contains(&s) && t.books.totals_of(s).allocations > 0 {
                let family = mtrace_format::Family::Malloc;
                groups.insert((s, None), Group::empty(family));
            }
        }
    }
    let mut entries: Vec<((u32, Option<Kind>), Group, u64)> =
        groups.into_iter().map(|(k, g)| (k, g, t.books.totals_of(k.0).allocations)).collect();
    let key = |(_, g, total): &((u32, Option<Kind>), Group, u64)| match sort {
        SortKey::Bytes | SortKey::Badfree | SortKey::Mismatched => g.bytes,
        SortKey::Count => g.blocks,
        SortKey::Total | SortKey::Stacks => signed(*total),
        SortKey::Average => g.bytes / g.blocks.max(1),
        SortKey::Tsc => signed(g.latest),
        SortKey::BytesLeaked => signed(g.lost.bytes),
        SortKey::Leaks => signed(g.lost.blocks),
    };
    // Kinds in memcheck's order (definite first), then by the sort key;
    // every backtrace (`stacks`) by its key alone, whatever it left.
    let by_kind = |a: &((u32, Option<Kind>), Group, u64), b: &((u32, Option<Kind>), Group, u64)| {
        if every_backtrace {
            std::cmp::Ordering::Equal
        } else {
            a.0 .1.cmp(&b.0 .1)
        }
    };
    entries.sort_by(|a, b| {
        by_kind(a, b)
            .then(key(b).cmp(&key(a)))
            .then(a.0 .1.cmp(&b.0 .1))
            .then(b.1.bytes.cmp(&a.1.bytes))
            .then(a.0 .0.cmp(&b.0 .0))
    });
    // Not freed: every live block (also the reachable ones an entry list
    // without --show-reachable leaves out); in a window, the net change.
    let (leaked_bytes, leaked_blocks) = if t.baseline.is_some() {
        entries.iter().fold((0, 0), |acc, e| (acc.0 + e.1.bytes, acc.1 + e.1.blocks))
    } else {
        live_total
    };
    let show_lost = matches!(sort, SortKey::BytesLeaked | SortKey::Leaks);
    // A window's change is a difference of two estimates: no error given.
    let sampled = t.books.sample_rate != 0 && t.baseline.is_none();
    let stacks = entries
        .into_iter()
        .map(|((s, kind), g, total)| {
            let frames = stack_frames(t, sym, s, depth);
            let family = match t.stacks.pool_of.get(&s) {
                Some(p) => format!("pool {}", t.pools.get(p).map_or("?", String::as_str)),
                None => g.family.name().to_owned(),
            };
            let indirect_bytes = (kind == Some(Kind::Definite)).then(|| indirect_of.get(&s).copied().unwrap_or(0));
            let lost = show_lost.then_some(g.lost);
            LeakEntry {
                bytes: g.bytes,
                blocks: g.blocks,
                total_allocations: total,
                family,
                kind,
                indirect_bytes,
                lost,
                stderr: sampled.then(|| stderr(g.var)),
                at: own_code::headline(&frames, view.wrappers),
                frames,
            }
        })
        .collect();
    let errors = errors::build(t, sym, sort, depth);
    let (bad_frees, mismatched_frees) = errors::counts(&errors);
    let dropped = t.books.dropped_wrong_frees();
    let (bad_frees, mismatched_frees) = (bad_frees + dropped.0, mismatched_frees + dropped.1);
    let found = allocators::survey(t, sym);
    let mut notices = allocators::notices(t, &found);
    notices.extend(sym.other_builds().iter().map(other_build_notice));
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
            realloc_frees: t.books.realloc_frees,
            bytes_allocated: t.books.bytes_allocated,
            peak_bytes: t.books.peak_bytes,
            peak_blocks: t.books.peak_blocks,
            peak_time_ns: t.books.peak_time,
            leaked_bytes,
            leaked_blocks,
            leaked_stderr: sampled.then(|| stderr(live_var)),
            duration_ns: t.last_time,
            // Reading stopped at --until-marker: no End record is expected.
            truncated: t.error.is_some() || (t.end.is_none() && !t.reached_until),
            error: t.error.as_ref().map(|e| format!("{}: {e}", t.path.display())),
            ended_by: t.end.map(end_text),
            running: t.end.is_none() && t.error.is_none() && processes::holds_open(h.pid, &t.path),
            exit_status: match t.end {
                Some(mtrace_format::EndReason::Exit(s) | mtrace_format::EndReason::UnderscoreExit(s)) => s,
                _ => None,
            },
            exec: t.exec.clone().filter(|_| t.end == Some(mtrace_format::EndReason::Exec)),
            attached: t.attached,
            kept_from_ns: t.kept_from,
            unmatched_frees: t.books.unmatched_frees(),
            bad_frees,
            mismatched_frees,
            unknown_munmaps: t.books.unknown_munmaps,
            since_marker: None,
            until_marker: None,
            from_ns: None,
            to_ns: None,
            sample_rate: (t.books.sample_rate != 0).then_some(t.books.sample_rate),
        },
        errors,
        stacks,
        allocators: found.allocators,
        notices,
        timeline: None,
        sections: None,
        intervals: None,
        processes: None,
        show_reachable,
        every_backtrace,
        suppressed: None,
        scan: kinds.and(crate::scan::info(t)),
        kinds,
    }
}

impl Summary {
    /// The report is a change since a point (`--since-marker`, `--from`),
    /// not the state at the end.
    pub fn is_change(&self) -> bool {
        self.since_marker.is_some() || self.from_ns.is_some()
    }
}

impl Report {
    /// The program as the user ran it, where its name is not the
    /// executable's: `argv[0]` of a symlink (`redis-server`, a link to
    /// `redis-check-rdb`; `python3` to `python3.11`), a busybox applet, a
    /// login shell's `-bash`. `None` when the names agree.
    pub fn ran_as(&self) -> Option<&str> {
        let arg0 = self.cmdline.first().filter(|a| !a.is_empty())?;
        let name = |p: &str| p.rsplit('/').next().unwrap_or(p).to_owned();
        (name(arg0) != name(&self.program)).then_some(arg0.as_str())
    }
}

/// One notice per module whose frames stay unsymbolized because the file
/// found is another build than the one traced (build IDs differ): without
/// it, `??? (prog+0x1167)` would not say why. `which` is one of
/// [`Symbolizer::other_builds`]'s entries.
pub fn other_build_notice(which: &crate::symbolize::OtherBuild) -> String {
    let (module, _, found) = which;
    let at = if std::path::Path::new(module) == found { String::new() } else { format!(" (at {})", found.display()) };
    format!(
        "{module}{at} is not the build that was traced (its build ID differs: rebuilt or updated since?): \
         its frames are left as module+offset; --binpath DIR or --sysroot DIR finds the traced one"
    )
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
