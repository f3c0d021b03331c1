//! The report options shared by `mtrace report`, `run`, `attach` and
//! `client`, and the report they make of one trace: text, JSON, HTML.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use mtrace_analyzer::{load, report, scan};

use report::SortKey;

use crate::symbolize::{SearchPaths, Symbolizer};

/// Options shared by `report` and `run`.
#[derive(Args, Clone)]
pub struct ReportOpts {
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Order of the "not freed" backtraces.
    #[arg(long, value_enum, default_value = "bytes")]
    pub(crate) sort: SortKey,
    /// Show at most this many recorded frames per backtrace (`run` also records only this many).
    #[arg(short = 'd', long = "depth")]
    pub(crate) depth: Option<usize>,
    /// In text, show at most N frames of a backtrace, 0 for all (valgrind's
    /// option and default); frames below the program's entry (`main`, a
    /// thread's start routine) are left out. JSON, HTML and flamegraphs
    /// have every frame recorded (-d).
    #[arg(long, value_name = "N", default_value_t = report::text::NUM_CALLERS)]
    pub(crate) num_callers: usize,
    /// Root folder holding the traced machine's files (for traces made elsewhere).
    #[arg(long)]
    pub(crate) sysroot: Option<PathBuf>,
    /// Folder to search for binaries by file name; may be repeated.
    #[arg(long)]
    pub(crate) binpath: Vec<PathBuf>,
    /// Report the change in live blocks since this marker (a report number, or a marker's name).
    #[arg(long, value_name = "MARKER")]
    pub(crate) since_marker: Option<String>,
    /// Stop at this marker (a report number, or a marker's name).
    #[arg(long, value_name = "MARKER")]
    pub(crate) until_marker: Option<String>,
    /// Also show RSS and live heap over time (sampled every 10 ms).
    #[arg(long)]
    pub(crate) timeline: bool,
    /// Also list blocks still live that were allocated more than DURATION
    /// before the end (500ms, 10s, 2m, …).
    #[arg(long, value_name = "DURATION", value_parser = report::parse_duration)]
    pub(crate) older_than: Option<u64>,
    /// With a leak scan, also list the still reachable blocks (and the
    /// program's own mappings).
    #[arg(long)]
    pub(crate) show_reachable: bool,
    /// In text, also the sections heaptrack users know: most allocation
    /// calls, temporary allocations, peak consumers, allocation sizes
    /// (JSON always has them).
    #[arg(long)]
    pub(crate) sections: bool,
    /// Leave out entries matched by this file's `leak:PATTERN` lines
    /// (LeakSanitizer's format; PATTERN against function, file or module).
    #[arg(long, value_name = "FILE")]
    pub(crate) suppressions: Option<PathBuf>,
    /// memcheck's heuristics for interior pointers, with the leak scan: all,
    /// none, or some of stdstring, length64, newarray, multipleinheritance
    /// (comma-separated); a block a heuristic's pointer reaches is still
    /// reachable, not possibly lost (docs/SCAN.md).
    #[arg(long, value_name = "SET", default_value = "all", value_parser = scan::Heuristics::parse)]
    pub(crate) leak_check_heuristics: scan::Heuristics,
    /// Also show, per time window of DURATION, the allocations still live at
    /// the end, backtraces that leak in every window first.
    #[arg(long, value_name = "DURATION", value_parser = report::parse_duration)]
    pub(crate) intervals: Option<u64>,
    /// Also write the report as one self-contained HTML page to FILE: memory
    /// over time, flamegraphs, what a time range left live, the tables
    /// (`mtrace report`: instead of the text).
    #[arg(long, value_name = "FILE")]
    pub(crate) html: Option<PathBuf>,
}

impl ReportOpts {
    pub(crate) fn symbolizer(&self) -> Symbolizer {
        Symbolizer::new(SearchPaths { sysroot: self.sysroot.clone(), binpath: self.binpath.clone() })
    }

    /// Loads `trace` and writes its report to `out` (text or JSON; none
    /// when `out` is `None`), and the page of `--html`. A trace that breaks
    /// off is still reported (with its error named).
    pub fn report(&self, trace: &std::path::Path, out: Option<&mut dyn Write>) -> anyhow::Result<report::Report> {
        let window = load::Window {
            since: self.since_marker.clone().map(load::MarkerSel),
            until: self.until_marker.clone().map(load::MarkerSel),
            lifetimes: self.html.is_some(),
        };
        // The debug info of the modules loaded at the start (the program,
        // libc, ...) is opened and decompressed on a second core while the
        // trace is read (a fifth of a report's time on churn), until the
        // reading is done: the rest is opened when first needed, as before.
        // Not for small traces, read faster than a module is opened.
        let big = std::fs::metadata(trace).is_ok_and(|m| m.len() >= WARM_FROM_BYTES);
        let done = std::sync::atomic::AtomicBool::new(!big);
        let (t, mut sym) = std::thread::scope(|sc| {
            let warm = sc.spawn(|| {
                let mut sym = self.symbolizer();
                if big {
                    sym.open_modules(&load::first_modules(trace), &done);
                }
                sym
            });
            let t = load::load_window(trace, &window);
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            (t, warm.join().unwrap_or_else(|_| self.symbolizer()))
        });
        let t = t?;
        let view = report::View { heuristics: self.leak_check_heuristics, ..report::View::default() };
        let mut r = report::build_view(&t, &mut sym, self.sort, self.depth, self.show_reachable, view);
        if let Some(f) = &self.suppressions {
            let mut rules = report::suppress::read(f)?;
            report::suppress::apply(&mut r, &mut rules);
            r.suppressed = Some(rules);
        }
        r.summary.since_marker = self.since_marker.clone();
        r.summary.until_marker = self.until_marker.clone();
        r.text_sections = self.sections;
        r.text_callers = self.num_callers;
        if self.timeline {
            r.timeline = Some(report::thin(&t.timeline, report::TIMELINE_ROWS));
        }
        if let Some(d) = self.intervals {
            r.intervals = Some(report::intervals::build(&t, &mut sym, d, self.depth));
        }
        // Whole-run sections, not for a window (and so not in .memlog reports).
        if self.since_marker.is_none() && self.until_marker.is_none() {
            let at_peak = t.books.live_at_peak();
            let inp = report::sections::Inputs { at_peak: &at_peak, older_than_ns: self.older_than, depth: self.depth };
            r.sections = Some(report::sections::build(&t, &mut sym, &inp));
        }
        if let Some(f) = &self.html {
            let w = std::io::BufWriter::new(crate::create_private(f)?);
            report::html::write(&t, &mut r, &mut sym, self.depth, w)?;
            eprintln!("mtrace: wrote {}", f.display());
        }
        match out {
            Some(out) if self.json => {
                serde_json::to_writer_pretty(&mut *out, &r)?;
                writeln!(out)?;
            }
            Some(out) => report::write_text(&r, out)?,
            None => {}
        }
        Ok(r)
    }
}

/// Traces from this size (bytes) on have their modules' debug info opened
/// while they are read: a small one is read before the first module is
/// open, and then waits for it (the benchmark's python3 trace, 27 KiB:
/// reported in 0.064 s without, 0.080 s with). From 4 MiB down to 256 KiB
/// (medians of 9): cxx_work's 3.9 MB trace 0.24 → 0.21 s, python3-malloc's
/// 4.0 MB 0.49 → 0.44 s, jq's 1.2 MB 0.37 → 0.35 s, sqlite3's 295 KB 0.09
/// → 0.08 s.
const WARM_FROM_BYTES: u64 = 1 << 18;

/// `--hooks`: how `--ptrace` hooks the allocation functions
/// (docs/PTRACE.md).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Hooks {
    /// Uprobes where this user and kernel allow them, else breakpoints.
    Auto,
    /// Kernel uprobes: the program does not stop (root).
    Uprobes,
    /// Breakpoints: a stop per call (any user who may ptrace it).
    Breakpoints,
}

impl From<Hooks> for mtrace_ptrace::Hooks {
    fn from(h: Hooks) -> mtrace_ptrace::Hooks {
        match h {
            Hooks::Auto => mtrace_ptrace::Hooks::Auto,
            Hooks::Uprobes => mtrace_ptrace::Hooks::Uprobes,
            Hooks::Breakpoints => mtrace_ptrace::Hooks::Breakpoints,
        }
    }
}
