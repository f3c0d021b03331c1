//! `mtrace`: reads traces written by libmtrace.so and reports what leaked.

mod attach;
mod console;
mod relay;
mod run;

use mtrace_analyzer::{books, live, load, malloc_trace, report, scan, symbolize};

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use report::SortKey;
use symbolize::{SearchPaths, Symbolizer};

#[derive(Parser)]
#[command(name = "mtrace", version, about = "Memory tracer and leak finder for C and C++ programs")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the report of a trace file.
    Report(ReportArgs),
    /// Run a program under the tracer and print its report when it ends.
    #[command(after_help = ENV_HELP)]
    Run(run::RunArgs),
    /// Compare two traces (two runs, or two builds): per backtrace, the
    /// change in bytes not freed, at the peak, and in allocation calls.
    Diff(DiffArgs),
    /// Trace a running process for a while, then report what it allocated
    /// meanwhile and still holds; the process goes on untraced.
    Attach(attach::AttachArgs),
    /// Run a program on this machine (the target) and relay its trace to
    /// one `mtrace client` at a time.
    Server(relay::server::ServerArgs),
    /// Connect to an `mtrace server`, keep and report the program's trace
    /// here (the host); `-i` for the console while it runs.
    Client(relay::client::ClientArgs),
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the manual pages, mtrace(1) and one per subcommand
    /// (mtrace-report(1), …), into DIR (e.g. ~/.local/share/man/man1).
    Manpage { dir: PathBuf },
}

/// The environment variables of libmtrace.so, for `mtrace run --help`.
const ENV_HELP: &str = "\
Environment (read by libmtrace.so; an invalid value warns once and the default is used):
  MTRACE_OUTPUT=PATH          trace file (%p pid, %e program); `run` sets it
  MTRACE_DEPTH=N              frames per backtrace, 1-256 (default 64; `run -d` sets it)
  MTRACE_START=on|off         off: record no allocations until mtrace_start() or mtrace()
  MTRACE_SCAN=0|1             1: memory snapshot at exit for the leak scan (`run` sets it unless --no-scan)
  MTRACE_CHECK_FREES=0|1      1: frees record their backtraces too (`run -S`)
  MTRACE_SCAN_SIGNAL=SIG      signal that scans for leaks now and writes a .memlog (default off)
  MTRACE_FOLLOW_FORK=on|off   off: forked children run untraced
  MTRACE_FOLLOW_EXEC=on|off   off: programs this one execs run untraced
  MTRACE_REPORT_SIGNAL=SIG    signal that writes an incremental report (default USR1; off)
  MTRACE_REPORT_DIR=DIR       where <program>-<pid>-<n>.memlog reports go (default: cwd)
  MTRACE_UNWINDER=U           fast, libgcc, or check (both, differences on stderr); default fast
  MTRACE_CLOCK=tsc|monotonic  event clock (default tsc where the TSC is invariant)
  MTRACE_BIN=PATH             the mtrace binary that writes .memlog reports (`run` sets it)
  MTRACE_LIB=PATH             the libmtrace.so that `run` preloads (default: next to mtrace)";

/// Options shared by `report` and `run`.
#[derive(Args, Clone)]
pub struct ReportOpts {
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Order of the "not freed" backtraces.
    #[arg(long, value_enum, default_value = "bytes")]
    sort: SortKey,
    /// Show at most this many recorded frames per backtrace (`run` also records only this many).
    #[arg(short = 'd', long = "depth")]
    pub(crate) depth: Option<usize>,
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
    timeline: bool,
    /// Also list blocks still live that were allocated more than DURATION
    /// before the end (500ms, 10s, 2m, …).
    #[arg(long, value_name = "DURATION", value_parser = report::parse_duration)]
    pub(crate) older_than: Option<u64>,
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
    /// (LeakSanitizer's format; PATTERN against function, file or module).
    #[arg(long, value_name = "FILE")]
    suppressions: Option<PathBuf>,
    /// memcheck's heuristics for interior pointers, with the leak scan: all,
    /// none, or some of stdstring, length64, newarray, multipleinheritance
    /// (comma-separated); a block a heuristic's pointer reaches is still
    /// reachable, not possibly lost (docs/SCAN.md).
    #[arg(long, value_name = "SET", default_value = "all", value_parser = scan::Heuristics::parse)]
    pub(crate) leak_check_heuristics: scan::Heuristics,
    /// Also show, per time window of DURATION, the allocations still live at
    /// the end, backtraces that leak in every window first.
    #[arg(long, value_name = "DURATION", value_parser = report::parse_duration)]
    intervals: Option<u64>,
}

#[derive(Args)]
struct DiffArgs {
    /// The trace of the earlier run.
    old: PathBuf,
    /// The trace of the later run.
    new: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// Write the comparison to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Match backtraces on at most this many recorded frames.
    #[arg(short = 'd', long = "depth")]
    depth: Option<usize>,
    /// Show at most N backtraces in the text (JSON has all).
    #[arg(long, value_name = "N", default_value = "30")]
    limit: usize,
    /// Root folder holding the traced machine's files.
    #[arg(long)]
    sysroot: Option<PathBuf>,
    /// Folder to search for binaries by file name; may be repeated.
    #[arg(long)]
    binpath: Vec<PathBuf>,
}

/// `mtrace manpage DIR`: mtrace.1 and mtrace-SUBCOMMAND.1 (clap_mangen).
fn write_manpages(dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let cmd = <Cli as clap::CommandFactory>::command();
    let mut pages = vec![("mtrace".to_owned(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("mtrace-{}", sub.get_name());
        let bin = format!("mtrace {}", sub.get_name());
        pages.push((name.clone(), sub.clone().display_name(name).bin_name(bin)));
    }
    for (name, c) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut f = std::fs::File::create(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        clap_mangen::Man::new(c).render(&mut f)?;
        println!("{}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `mtrace diff OLD NEW`.
fn diff(a: DiffArgs) -> anyhow::Result<ExitCode> {
    let old = load::load(&a.old)?;
    let new = load::load(&a.new)?;
    let mut sym = Symbolizer::new(SearchPaths { sysroot: a.sysroot.clone(), binpath: a.binpath.clone() });
    let d = report::diff::diff(&old, &new, &mut sym, a.depth);
    let mut out = open_output(&a.output)?;
    if a.json {
        serde_json::to_writer_pretty(&mut *out, &d)?;
        writeln!(out)?;
    } else {
        report::diff::write_text(&d, a.limit, &mut *out)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
struct ReportArgs {
    /// The trace file (`<program>.<pid>.mtrace`).
    trace: PathBuf,
    /// Write the report to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// List the trace's markers (report points and named points) instead.
    #[arg(long)]
    markers: bool,
    /// Write the collapsed stacks of --cost to FILE instead of the report
    /// (flamegraph.pl's, inferno's and speedscope's input).
    #[arg(long, value_name = "FILE")]
    folded: Option<PathBuf>,
    /// Write an interactive flamegraph SVG of --cost to FILE instead of the report.
    #[arg(long, value_name = "FILE")]
    flamegraph: Option<PathBuf>,
    /// What --folded and --flamegraph measure per backtrace.
    #[arg(long, value_enum, default_value = "leaked")]
    cost: report::flame::Cost,
    /// Draw the flamegraph upside down (roots at the top).
    #[arg(long)]
    icicle: bool,
    #[command(flatten)]
    opts: ReportOpts,
}

impl ReportOpts {
    pub(crate) fn symbolizer(&self) -> Symbolizer {
        Symbolizer::new(SearchPaths { sysroot: self.sysroot.clone(), binpath: self.binpath.clone() })
    }

    /// Loads `trace` and writes its report to `out`. A trace that breaks off
    /// is still reported (with its error named); returns whether it was whole.
    pub fn report(&self, trace: &std::path::Path, out: &mut dyn Write) -> anyhow::Result<report::Report> {
        let window = load::Window {
            since: self.since_marker.clone().map(load::MarkerSel),
            until: self.until_marker.clone().map(load::MarkerSel),
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
        if self.json {
            serde_json::to_writer_pretty(&mut *out, &r)?;
            writeln!(out)?;
        } else {
            report::write_text(&r, out)?;
        }
        Ok(r)
    }
}

/// Traces from this size (bytes) on have their modules' debug info opened
/// while they are read: a small one is read before the first module is
/// open, and then waits for it (the benchmark's python3 trace, 27 KiB:
/// reported in 0.064 s without, 0.080 s with).
const WARM_FROM_BYTES: u64 = 4 << 20;

/// `mtrace report --markers`: one line per marker (or a JSON array).
fn list_markers(trace: &std::path::Path, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let t = load::load(trace)?;
    if json {
        serde_json::to_writer_pretty(&mut *out, &t.markers)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "{:>6}  {:>12}  name", "report", "time")?;
    for m in &t.markers {
        let seq = if m.seq == 0 { "-".to_owned() } else { m.seq.to_string() };
        writeln!(out, "{seq:>6}  {:>10.3} s  {}", m.time_ns as f64 / 1e9, m.name)?;
    }
    Ok(())
}

pub(crate) fn open_output(p: &Option<PathBuf>) -> anyhow::Result<Box<dyn Write>> {
    Ok(match p {
        Some(p) => Box::new(create_private(p)?),
        None => Box::new(std::io::stdout().lock()),
    })
}

/// Creates (or truncates) the file at `p` for a report, mode 0600 when new.
pub(crate) fn create_private(p: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(p)
        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
}

/// `mtrace report --folded/--flamegraph`: writes the collapsed stacks and
/// the SVG of the trace's cost per backtrace.
fn write_flame(a: &ReportArgs) -> anyhow::Result<()> {
    let window = load::Window {
        since: a.opts.since_marker.clone().map(load::MarkerSel),
        until: a.opts.until_marker.clone().map(load::MarkerSel),
    };
    let t = load::load_window(&a.trace, &window)?;
    let mut sym = a.opts.symbolizer();
    let lines = report::flame::folded(&t, &mut sym, a.cost, a.opts.depth);
    if let Some(f) = &a.folded {
        let mut w = std::io::BufWriter::new(create_private(f)?);
        for l in &lines {
            writeln!(w, "{l}")?;
        }
        w.flush()?;
        eprintln!("mtrace: wrote {} ({} stacks)", f.display(), lines.len());
    }
    if let Some(f) = &a.flamegraph {
        let w = std::io::BufWriter::new(create_private(f)?);
        report::flame::flamegraph(&lines, a.cost, &t.header.exe, a.icicle, w)?;
        eprintln!("mtrace: wrote {}", f.display());
    }
    Ok(())
}

/// `mtrace [PROG] LOG` without a subcommand: glibc's mtrace script's usage.
fn glibc_compat(args: &[String]) -> Option<ExitCode> {
    let known = [
        "report",
        "run",
        "diff",
        "attach",
        "server",
        "client",
        "completions",
        "manpage",
        "help",
        "-h",
        "--help",
        "-V",
        "--version",
    ];
    if args.len() < 2 || args.len() > 3 || known.contains(&args[1].as_str()) || args[1].starts_with('-') {
        return None;
    }
    let (prog, log) = match args {
        [_, log] => (None, PathBuf::from(log)),
        [_, prog, log] => (Some(PathBuf::from(prog)), PathBuf::from(log)),
        _ => return None,
    };
    let mut out = std::io::stdout().lock();
    Some(match malloc_trace::print_compat(&log, prog.as_deref(), &mut out) {
        Ok(anything) => ExitCode::from(anything as u8),
        Err(e) => {
            eprintln!("mtrace: {e:#}");
            ExitCode::from(2)
        }
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(code) = glibc_compat(&args) {
        return code;
    }
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Report(a) => open_output(&a.output).and_then(|mut out| {
            // Into a pipe that closed (`| head`): end quietly, as Unix tools do.
            // SAFETY: restoring a signal's default action has no preconditions.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            if a.markers {
                list_markers(&a.trace, a.opts.json, &mut *out)?;
                return Ok(ExitCode::SUCCESS);
            }
            if a.folded.is_some() || a.flamegraph.is_some() {
                write_flame(&a)?;
                return Ok(ExitCode::SUCCESS);
            }
            let r = a.opts.report(&a.trace, &mut *out)?;
            out.flush()?;
            if let Some(e) = &r.summary.error {
                eprintln!("mtrace: {e}");
                return Ok(ExitCode::from(1));
            }
            if r.summary.truncated {
                eprintln!(
                    "mtrace: {}: the trace has no end record (the process was killed, or is still running)",
                    a.trace.display()
                );
                return Ok(ExitCode::from(1));
            }
            Ok(ExitCode::SUCCESS)
        }),
        Cmd::Run(a) => run::run(a),
        Cmd::Diff(a) => diff(a),
        Cmd::Attach(a) => attach::attach(a),
        Cmd::Server(a) => relay::server::server(a),
        Cmd::Client(a) => relay::client::client(a),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "mtrace", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Manpage { dir } => write_manpages(&dir),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mtrace: {e:#}");
            ExitCode::from(2)
        }
    }
}
