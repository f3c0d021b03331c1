//! The report options every reporting command shares (`--json`,
//! `--sort`, `--html`, ...), defined once: the command line's side of the
//! analysis library's [`ReportOpts`].

use std::path::PathBuf;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::Args;
use mtrace_analysis::output::flame::Cost;
use mtrace_analysis::output::OUTPUTS;
use mtrace_analysis::pipeline::ReportOpts;
use mtrace_analysis::report::{self, trace_time, trace_time::TraceTime, SortKey};
use mtrace_analysis::scan;

/// The report options of `report`, `run`, `attach` and `client`, as the
/// analysis library takes them ([`ReportOpts`], which this derefs to).
#[derive(Clone, Debug)]
pub struct ReportFlags(pub ReportOpts);

impl std::ops::Deref for ReportFlags {
    type Target = ReportOpts;
    fn deref(&self) -> &ReportOpts {
        &self.0
    }
}

impl std::ops::DerefMut for ReportFlags {
    fn deref_mut(&mut self) -> &mut ReportOpts {
        &mut self.0
    }
}

// The definitions below are clap's; what a command holds is the library's
// options they fill.
impl clap::FromArgMatches for ReportFlags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut opts = Defs::from_arg_matches(m)?.opts();
        for o in OUTPUTS.iter() {
            if let Some(file) = o.flag.and_then(|flag| m.get_one::<PathBuf>(flag)) {
                opts.files.push((o.format, file.clone()));
            }
        }
        Ok(ReportFlags(opts))
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for ReportFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        file_outputs(Defs::augment_args(cmd))
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        file_outputs(Defs::augment_args_for_update(cmd))
    }
}

/// An option per output the analysis library's registry writes to a file
/// (`--html FILE`, `--pprof FILE`, ...), with the registry's help: a new
/// output brings its option.
fn file_outputs(cmd: clap::Command) -> clap::Command {
    OUTPUTS.iter().filter_map(|o| Some((o.flag?, o.help))).fold(cmd, |cmd, (flag, help)| {
        cmd.arg(
            clap::Arg::new(flag).long(flag).value_name("FILE").value_parser(clap::value_parser!(PathBuf)).help(help),
        )
    })
}

/// Each report option, once, with its help.
#[derive(Args)]
struct Defs {
    #[command(flatten)]
    json: super::Json,
    /// Order of the "not freed" backtraces.
    #[arg(long, default_value = "bytes", value_parser = sort_key())]
    sort: SortKey,
    #[command(flatten)]
    depth: super::Depth,
    /// In text, show at most N frames of a backtrace, 0 for all (valgrind's
    /// option and default); frames below the program's entry (`main`, a
    /// thread's start routine) are left out. JSON, HTML and flamegraphs
    /// have every frame recorded (-d).
    #[arg(long, value_name = "N", default_value_t = ReportOpts::default().num_callers)]
    num_callers: usize,
    #[command(flatten)]
    symbols: super::Symbols,
    /// Report the change in live blocks since this marker (a report number, or a marker's name).
    #[arg(long, value_name = "MARKER")]
    since_marker: Option<String>,
    /// Stop at this marker (a report number, or a marker's name).
    #[arg(long, value_name = "MARKER")]
    until_marker: Option<String>,
    /// Report the change in live blocks since TIME, as --since-marker does
    /// at a marker: after the trace's start (seconds, or with a unit: 90,
    /// 1.5m, 250ms) or on the wall clock (2026-11-29 13:05:00 in this
    /// machine's time zone, 2026-11-29T13:05:00Z, @SECONDS since the epoch).
    #[arg(long, value_name = "TIME", value_parser = trace_time::parse_trace_time, conflicts_with = "since_marker")]
    from: Option<TraceTime>,
    /// Stop reading at TIME (as --from), as --until-marker does at a marker.
    #[arg(long, value_name = "TIME", value_parser = trace_time::parse_trace_time, conflicts_with = "until_marker")]
    to: Option<TraceTime>,
    /// Also show RSS and live heap over time (sampled every 10 ms).
    #[arg(long)]
    timeline: bool,
    /// Also list blocks still live that were allocated more than DURATION
    /// before the end (500ms, 10s, 2m, …).
    #[arg(long, value_name = "DURATION", value_parser = report::parse_duration)]
    older_than: Option<u64>,
    /// With a leak scan, also list the still reachable blocks (and the
    /// program's own mappings).
    #[arg(long)]
    show_reachable: bool,
    /// In text, also the sections heaptrack users know: most allocation
    /// calls, temporary allocations, peak consumers, allocation sizes
    /// (JSON always has them).
    #[arg(long)]
    sections: bool,
    /// Leave out entries matched by this file's `leak:PATTERN` lines
    /// (LeakSanitizer's format; PATTERN against function, file or module);
    /// its `wrapper:PATTERN` lines name the program's own allocation
    /// wrappers (an `xmalloc`), folded with the allocator's frames.
    #[arg(long, value_name = "FILE")]
    suppressions: Option<PathBuf>,
    /// memcheck's heuristics for interior pointers, with the leak scan: all,
    /// none, or some of stdstring, length64, newarray, multipleinheritance
    /// (comma-separated); a block a heuristic's pointer reaches is still
    /// reachable, not possibly lost (docs/SCAN.md).
    #[arg(long, value_name = "SET", default_value = "all", value_parser = scan::Heuristics::parse)]
    leak_check_heuristics: scan::Heuristics,
    /// Also show, per time window of DURATION, the allocations still live at
    /// the end, backtraces that leak in every window first (at most 1,000
    /// windows: a shorter DURATION is widened).
    #[arg(long, value_name = "DURATION", value_parser = report::parse_window)]
    intervals: Option<u64>,
    /// What --folded and --flamegraph measure per backtrace.
    #[arg(long, default_value = "leaked", value_parser = cost())]
    cost: Cost,
    /// Draw the flamegraph upside down (roots at the top).
    #[arg(long)]
    icicle: bool,
}

impl Defs {
    fn opts(self) -> ReportOpts {
        ReportOpts {
            json: self.json.json,
            sort: self.sort,
            depth: self.depth.depth,
            num_callers: self.num_callers,
            sysroot: self.symbols.sysroot,
            binpath: self.symbols.binpath,
            since_marker: self.since_marker,
            until_marker: self.until_marker,
            from: self.from,
            to: self.to,
            timeline: self.timeline,
            older_than: self.older_than,
            show_reachable: self.show_reachable,
            sections: self.sections,
            suppressions: self.suppressions,
            leak_check_heuristics: self.leak_check_heuristics,
            intervals: self.intervals,
            files: Vec::new(),
            cost: self.cost,
            icicle: self.icicle,
        }
    }
}

/// `--sort`'s values: the library's keys with their names and aliases.
fn sort_key() -> impl TypedValueParser<Value = SortKey> {
    let values = SortKey::ALL
        .iter()
        .map(|&(_, name, aliases, help)| PossibleValue::new(name).aliases(aliases.iter().copied()).help(help));
    PossibleValuesParser::new(values).map(|s| SortKey::parse(&s).unwrap_or(SortKey::Bytes))
}

/// `--cost`'s values: the library's costs with their names.
fn cost() -> impl TypedValueParser<Value = Cost> {
    let values = Cost::ALL.iter().map(|&(_, name, help)| PossibleValue::new(name).help(help));
    PossibleValuesParser::new(values).map(|s| Cost::parse(&s).unwrap_or(Cost::Leaked))
}
