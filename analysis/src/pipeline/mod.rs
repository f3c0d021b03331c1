//! The report pipeline every command runs: load a trace (its modules'
//! debug info opened meanwhile), classify its snapshot with the leak scan,
//! build the report model, apply suppressions and the extra sections, and
//! write each form asked for. `mtrace report`, `run`, `attach`, `client`,
//! the console and the fuzz target all go through it; its options are the
//! report options those commands share ([`ReportOpts`]).

use std::io::Write;
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap as HashMap;

use crate::input;
use crate::output::{self, flame, Format, Style};
use crate::report::trace_time::TraceTime;
use crate::report::{self, Report, SortKey, View};
use crate::scan;
use crate::symbolize::{kept_beside, SearchPaths, Symbolizer};
use crate::trace::{MarkerSel, Trace, Window};

mod following;
mod priority;
mod processes;
pub use following::{Followed, Following};
pub use processes::{report_processes, Reporting};

/// What a report reads, shows and writes: the report options that
/// `report`, `run`, `attach`, `client` and the console share (the command
/// line's `--json`, `--sort`, ... fill it; [`Default`] is their defaults).
#[derive(Clone, Debug)]
pub struct ReportOpts {
    /// One JSON document instead of text on the command's own output.
    pub json: bool,
    /// Order of the "not freed" backtraces.
    pub sort: SortKey,
    /// At most this many recorded frames per backtrace (`None`: all).
    pub depth: Option<usize>,
    /// In text, at most this many frames of a backtrace, 0 for all.
    pub num_callers: usize,
    /// Root folder holding the traced machine's files.
    pub sysroot: Option<PathBuf>,
    /// Folders searched for binaries by file name.
    pub binpath: Vec<PathBuf>,
    /// The change in live blocks since this marker (number or name).
    pub since_marker: Option<String>,
    /// Stop at this marker (number or name).
    pub until_marker: Option<String>,
    /// The change in live blocks since this time.
    pub from: Option<TraceTime>,
    /// Stop reading at this time.
    pub to: Option<TraceTime>,
    /// RSS and live heap over time too.
    pub timeline: bool,
    /// Blocks still live allocated more than this many ns before the end.
    pub older_than: Option<u64>,
    /// The still reachable blocks too (with a leak scan).
    pub show_reachable: bool,
    /// heaptrack's sections in text too.
    pub sections: bool,
    /// A file of `leak:PATTERN` lines (LeakSanitizer's format) to leave out.
    pub suppressions: Option<PathBuf>,
    /// memcheck's heuristics for interior pointers.
    pub leak_check_heuristics: scan::Heuristics,
    /// Live allocations per time window of this many ns.
    pub intervals: Option<u64>,
    /// The forms written to files of their own (the rows of
    /// `output::OUTPUTS` with an option), each with its file (`-`:
    /// standard output), in the order given.
    pub files: Vec<(Format, PathBuf)>,
    /// What the folded stacks and the flamegraph measure.
    pub cost: flame::Cost,
    /// The flamegraph upside down.
    pub icicle: bool,
}

impl Default for ReportOpts {
    fn default() -> ReportOpts {
        ReportOpts {
            json: false,
            sort: SortKey::Bytes,
            depth: None,
            num_callers: output::words::NUM_CALLERS,
            sysroot: None,
            binpath: Vec::new(),
            since_marker: None,
            until_marker: None,
            from: None,
            to: None,
            timeline: false,
            older_than: None,
            show_reachable: false,
            sections: false,
            suppressions: None,
            leak_check_heuristics: scan::Heuristics::ALL,
            intervals: None,
            files: Vec::new(),
            cost: flame::Cost::Leaked,
            icicle: false,
        }
    }
}

impl ReportOpts {
    /// Reads the input files the report will need (`--suppressions`), so
    /// that a missing or malformed one is refused before a program runs
    /// rather than after. Errors: the file's first problem.
    pub fn check_inputs(&self) -> anyhow::Result<()> {
        if let Some(f) = &self.suppressions {
            report::suppress::read(f)?;
        }
        Ok(())
    }

    /// The program's own allocation wrappers: the `wrapper:` lines of
    /// `--suppressions` (none when it has none or cannot be read, which
    /// [`Self::check_inputs`] refuses before).
    pub fn wrappers(&self) -> Vec<String> {
        self.suppressions.as_ref().and_then(|f| report::suppress::read(f).ok()).map(|s| s.wrappers).unwrap_or_default()
    }

    /// Checks that each file asked for (`--html FILE`, ...) can be written,
    /// so that a run is not made for a report that cannot be: an existing
    /// file is opened for writing (and left as it is), a new one's folder
    /// must take a file. Errors: the first that cannot, naming it and why.
    pub fn check_outputs(&self) -> anyhow::Result<()> {
        for (f, path) in self.files() {
            if path == Path::new("-") {
                continue;
            }
            let why = if path.exists() {
                std::fs::OpenOptions::new().append(true).open(path).err()
            } else {
                let folder = match path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                tempfile::tempfile_in(folder).err()
            };
            if let Some(e) = why {
                anyhow::bail!("{}: the {} cannot be written there: {e}", path.display(), f.name());
            }
        }
        Ok(())
    }

    /// A symbolizer searching `--sysroot` and `--binpath`.
    pub fn symbolizer(&self) -> Symbolizer {
        Symbolizer::new(SearchPaths { sysroot: self.sysroot.clone(), binpath: self.binpath.clone(), kept: None })
    }

    /// [`ReportOpts::symbolizer`] for `trace`: the modules kept beside it
    /// searched first, when there are ([`kept_beside`]).
    pub fn symbolizer_for(&self, trace: &Path) -> Symbolizer {
        let kept = Some(kept_beside(trace)).filter(|d| d.is_dir());
        Symbolizer::new(SearchPaths { sysroot: self.sysroot.clone(), binpath: self.binpath.clone(), kept })
    }

    /// The part of the trace to read: `--since-marker` to `--until-marker`
    /// or `--from` to `--to` in a trace that started at
    /// `start_realtime_ns` (its header's), with the blocks' lifetimes when
    /// the HTML page will show them. Fails for a wall-clock time before
    /// the start.
    pub fn window(&self, start_realtime_ns: u64) -> anyhow::Result<Window> {
        let (from_ns, to_ns) = self.range(start_realtime_ns)?;
        Ok(Window {
            since: self.since_marker.clone().map(MarkerSel),
            until: self.until_marker.clone().map(MarkerSel),
            from_ns,
            to_ns,
            lifetimes: self.files.iter().any(|(f, _)| f.output().needs_lifetimes),
        })
    }

    /// `--from` and `--to` in ns after the start of a trace that started
    /// at `start_realtime_ns`.
    fn range(&self, start_realtime_ns: u64) -> anyhow::Result<(Option<u64>, Option<u64>)> {
        let at = |t: Option<TraceTime>, opt: &str| {
            t.map(|t| t.since_start(start_realtime_ns).map_err(|e| anyhow::anyhow!("--{opt} {t}: {e}"))).transpose()
        };
        Ok((at(self.from, "from")?, at(self.to, "to")?))
    }

    /// The form of the report on the command's own output: JSON or text.
    pub fn format(&self) -> Format {
        if self.json {
            Format::Json
        } else {
            Format::Text
        }
    }

    /// The forms asked to go to files (`--html`, `--folded`, ...), each
    /// with its file, in the registry's order (`output::OUTPUTS`).
    pub fn files(&self) -> Vec<(Format, &Path)> {
        let mut out: Vec<(Format, &Path)> = self.files.iter().map(|(f, p)| (*f, p.as_path())).collect();
        out.sort_by_key(|(f, _)| output::OUTPUTS.iter().position(|o| o.format == *f));
        out
    }

    /// How the outputs present the report.
    pub fn style(&self) -> Style {
        Style {
            depth: self.depth,
            num_callers: self.num_callers,
            sections: self.sections,
            cost: self.cost,
            icicle: self.icicle,
            wrappers: self.wrappers(),
        }
    }

    /// Loads `trace` ([`input::load_window`]) and a symbolizer for it. The
    /// debug info of the modules loaded at the start (the program, libc,
    /// ...) is opened and decompressed on a second core while the trace is
    /// read (a fifth of a report's time on churn), until the reading is
    /// done: the rest is opened when first needed. Not for small traces,
    /// read faster than a module is opened.
    pub fn load(&self, trace: &Path) -> anyhow::Result<(Trace, Symbolizer)> {
        // A wall-clock --from or --to is placed by the trace's start.
        let start = match (self.from, self.to) {
            (Some(TraceTime::At(_)), _) | (_, Some(TraceTime::At(_))) => input::start_realtime_ns(trace)?,
            _ => 0,
        };
        let window = self.window(start)?;
        let big = std::fs::metadata(trace).is_ok_and(|m| m.len() >= WARM_FROM_BYTES);
        let done = std::sync::atomic::AtomicBool::new(!big);
        let (t, sym) = std::thread::scope(|sc| {
            let warm = sc.spawn(|| {
                let mut sym = self.symbolizer_for(trace);
                if big {
                    sym.open_modules(&input::first_modules(trace), &done);
                }
                sym
            });
            let t = input::load_window(trace, &window);
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            (t, warm.join().unwrap_or_else(|_| self.symbolizer_for(trace)))
        });
        Ok((t?, sym))
    }

    /// The report model of `t`: classified by the leak scan when `t` has a
    /// snapshot (and `view` brings no classes of its own), grouped and
    /// sorted as the options say, suppressions applied, with the sections,
    /// intervals and timeline asked for. Fails only when the suppressions
    /// file cannot be read.
    pub fn build(&self, t: &Trace, sym: &mut Symbolizer, view: View) -> anyhow::Result<Report> {
        let (rules, wrappers) = match &self.suppressions {
            Some(f) => report::suppress::read(f).map(|s| (Some(s.rules), s.wrappers))?,
            None => (None, Vec::new()),
        };
        let wrappers = &wrappers[..];
        let view = View { heuristics: self.leak_check_heuristics, wrappers, ..view };
        let mut r = build(t, sym, self.sort, self.depth, self.show_reachable, view);
        if let Some(mut rules) = rules {
            report::suppress::apply(&mut r, &mut rules);
            r.suppressed = Some(rules);
        }
        r.summary.since_marker = self.since_marker.clone();
        r.summary.until_marker = self.until_marker.clone();
        (r.summary.from_ns, r.summary.to_ns) = self.range(t.header.start_realtime_ns)?;
        if self.timeline {
            r.timeline = Some(report::thin(&t.timeline, report::TIMELINE_ROWS));
        }
        if let Some(d) = self.intervals {
            r.intervals = Some(report::intervals::build(t, sym, d, self.depth));
        }
        // Whole-run sections, not for a window (and so not in .memlog reports).
        if self.since_marker.is_none() && self.until_marker.is_none() && self.from.is_none() && self.to.is_none() {
            let at_peak = t.books.live_at_peak();
            let inp = report::sections::Inputs {
                at_peak: &at_peak,
                older_than_ns: self.older_than,
                depth: self.depth,
                wrappers,
            };
            r.sections = Some(report::sections::build(t, sym, &inp));
        }
        Ok(r)
    }

    /// Writes `src` to `out` in [`Self::format`] (nothing when `out` is
    /// `None`), and each of [`Self::files`] to its file, saying so on
    /// standard error. A file that cannot be written is said there in one
    /// line and the others are written still: returns those not written.
    /// Errors: only `out`'s.
    pub fn write(
        &self,
        src: &mut output::Sources,
        sym: &mut Symbolizer,
        out: Option<&mut dyn Write>,
    ) -> anyhow::Result<Vec<PathBuf>> {
        let style = self.style();
        let mut unwritten = Vec::new();
        for (f, path) in self.files() {
            // `-`: standard output, as inferno's and flamegraph.pl's tools do.
            let stdout = path == Path::new("-");
            let written = output::open((!stdout).then_some(path)).and_then(|mut w| {
                output::write(f, src, sym, &style, &mut w)?;
                Ok(w.flush()?)
            });
            match written {
                Ok(()) if !stdout => eprintln!("mtrace: wrote {}", path.display()),
                Ok(()) => {}
                Err(e) => {
                    let why = output::words::without_os_error_codes(&format!("{e:#}"));
                    eprintln!("mtrace: could not write the {}: {why}", f.name());
                    unwritten.push(path.to_owned());
                }
            }
        }
        if let Some(out) = out {
            output::write(self.format(), src, sym, &style, out)?;
        }
        Ok(unwritten)
    }

    /// Loads `trace`, builds its report and writes it to `out` (none when
    /// `out` is `None`) and to the files asked for. A trace that breaks off
    /// is still reported (with its error named). The report is `None` when
    /// no form asked for needed it (only `--folded`/`--flamegraph`): it is
    /// not built then, nor is the scan run.
    pub fn report(&self, trace: &Path, out: Option<&mut dyn Write>) -> anyhow::Result<Reported> {
        self.report_with(trace, out, |_, _, _| {})
    }

    /// [`ReportOpts::report`], with `add` given the trace and the report
    /// built before it is written (the process tree goes in so).
    pub fn report_with(
        &self,
        trace: &Path,
        out: Option<&mut dyn Write>,
        add: impl FnOnce(&Trace, &mut Symbolizer, &mut Report),
    ) -> anyhow::Result<Reported> {
        self.report_loaded(self.load(trace)?, out, add)
    }

    /// [`ReportOpts::report_with`] of a trace already read, with its
    /// symbolizer ([`ReportOpts::load`], or a [`Followed`] trace's).
    pub fn report_loaded(
        &self,
        (t, mut sym): (Trace, Symbolizer),
        out: Option<&mut dyn Write>,
        add: impl FnOnce(&Trace, &mut Symbolizer, &mut Report),
    ) -> anyhow::Result<Reported> {
        let needed = out.is_some() || self.files().iter().any(|(f, _)| f.needs_report());
        let classes_shown = self.files.iter().any(|(f, _)| f.output().needs_classes);
        let (classes, marking_s) = match needed || classes_shown {
            true => classify(&t, &mut sym, self.leak_check_heuristics),
            false => (None, 0.0),
        };
        let mut r = match needed {
            true => Some(self.build(&t, &mut sym, View { classes: classes.as_ref(), ..View::default() })?),
            false => None,
        };
        if let Some(s) = r.as_mut().and_then(|r| r.scan.as_mut()) {
            s.marking_s = marking_s;
        }
        if let Some(r) = r.as_mut() {
            add(&t, &mut sym, r);
        }
        let mut src = output::Sources { trace: &t, report: r.as_mut(), classes: classes.as_ref() };
        let unwritten = self.write(&mut src, &mut sym, out)?;
        Ok(Reported { report: r, unwritten })
    }
}

/// What a report wrote: its model (`None` when no form asked for needed
/// it), and the files asked for that could not be written (each said on
/// standard error), for a command to keep what it would have removed.
#[derive(Debug, Default)]
pub struct Reported {
    /// The report model.
    pub report: Option<Report>,
    /// Files of `ReportOpts::files` not written.
    pub unwritten: Vec<PathBuf>,
}

/// The leak scan's classes of `t`'s blocks by address, when `t` has a
/// complete snapshot and is not a window since a marker (whose baseline
/// blocks the snapshot does not tell apart); and the seconds it took.
/// `sym` tells the allocator's own mappings from the program's
/// (report/allocator_maps.rs).
pub fn classify(t: &Trace, sym: &mut Symbolizer, heuristics: scan::Heuristics) -> (Option<scan::Classes>, f64) {
    if t.baseline.is_some() || t.snapshot.is_none() {
        return (None, 0.0);
    }
    let started = std::time::Instant::now();
    let allocators = report::allocator_maps::of(t, sym);
    let classes = scan::classify(t, heuristics, &allocators);
    (classes, started.elapsed().as_secs_f64())
}

/// Runs `f` on `t` as a report at this moment sees it: with `baseline` as
/// the `since` marker's live blocks, the on-demand snapshot only when
/// `snapshot`, and reading stopped here (no End record is missing): the
/// console's answers and the report points a keeper writes
/// (`bounded::ReportPoints`) are reports of books still growing.
pub fn view<T>(
    t: &mut Trace,
    baseline: Option<HashMap<u32, crate::books::LiveTotals>>,
    snapshot: bool,
    f: impl FnOnce(&Trace) -> T,
) -> T {
    let base = std::mem::replace(&mut t.baseline, baseline);
    let snap = if snapshot { None } else { t.snapshot.take() };
    let reached = std::mem::replace(&mut t.reached_until, true);
    let out = f(t);
    t.baseline = base;
    if snap.is_some() {
        t.snapshot = snap;
    }
    t.reached_until = reached;
    out
}

/// [`report::build_view`] with the leak scan's classes: `view`'s own, or
/// else [`classify`]'s of `t`'s snapshot (the report's `scan` says how
/// long that took).
pub fn build(
    t: &Trace,
    sym: &mut Symbolizer,
    sort: SortKey,
    depth: Option<usize>,
    show_reachable: bool,
    view: View,
) -> Report {
    if view.classes.is_some() {
        return report::build_view(t, sym, sort, depth, show_reachable, view);
    }
    let (classes, marking_s) = classify(t, sym, view.heuristics);
    let mut r = report::build_view(t, sym, sort, depth, show_reachable, View { classes: classes.as_ref(), ..view });
    if let Some(s) = &mut r.scan {
        s.marking_s = marking_s;
    }
    r
}

/// Traces from this size (bytes) on have their modules' debug info opened
/// while they are read: a small one is read before the first module is
/// open, and then waits for it (the benchmark's python3 trace, 27 KiB:
/// reported in 0.064 s without, 0.080 s with). From 4 MiB down to 256 KiB
/// (medians of 9): cxx_work's 3.9 MB trace 0.24 → 0.21 s, python3-malloc's
/// 4.0 MB 0.49 → 0.44 s, jq's 1.2 MB 0.37 → 0.35 s, sqlite3's 295 KB 0.09
/// → 0.08 s.
pub(crate) const WARM_FROM_BYTES: u64 = 1 << 18;
