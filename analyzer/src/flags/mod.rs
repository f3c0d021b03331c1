//! The command line's options that several commands share, each defined
//! once with its help: the report options ([`report::ReportFlags`]), the
//! trace bounds ([`bound::BoundArgs`]), the depth of a backtrace
//! ([`Depth`]), the report's file ([`ReportFile`]) and where a trace's
//! binaries are found ([`Symbols`]). An option only one command has sits
//! with that command's arguments.

pub mod bound;
pub mod report;

use std::path::PathBuf;

use clap::Args;
use mtrace_analysis::symbolize::SearchPaths;

/// `-d N`, the frames per backtrace, in every command that records,
/// shows or compares backtraces.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct Depth {
    /// At most N frames per backtrace: recorded (`run`, `server` and
    /// `attach`: MTRACE_DEPTH), shown (`report`, the .memlog reports of
    /// `keep`), compared (`diff`).
    #[arg(short = 'd', long = "depth", value_name = "N")]
    pub depth: Option<usize>,
}

/// `-o FILE`, where a command's report goes.
#[derive(Args, Clone, Debug, Default)]
pub struct ReportFile {
    /// Write the report to FILE instead of the terminal: standard output,
    /// or standard error for `run` and `client`, whose program shares
    /// standard output (so `run --json` needs it).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

impl ReportFile {
    /// The words for a report that could not be written there.
    pub fn not_written(&self) -> String {
        match &self.output {
            Some(p) => format!("{}: the report could not be written", p.display()),
            None => "the report could not be written".to_owned(),
        }
    }
}

/// `--sysroot` and `--binpath`: where the traced machine's binaries are
/// found, for their symbols.
#[derive(Args, Clone, Debug, Default)]
pub struct Symbols {
    /// Root folder holding the traced machine's files (for traces made elsewhere).
    #[arg(long)]
    pub sysroot: Option<PathBuf>,
    /// Folder to search for binaries by file name; may be repeated.
    #[arg(long)]
    pub binpath: Vec<PathBuf>,
}

impl Symbols {
    /// The symbolizer's search paths.
    pub fn search_paths(&self) -> SearchPaths {
        SearchPaths { sysroot: self.sysroot.clone(), binpath: self.binpath.clone(), kept: None }
    }
}

/// `-i`, the interactive console, in every command that can open it on a
/// running program. Not with a bound: its views follow the whole stream.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct Interactive {
    /// The interactive console on the program while it runs (report, dump,
    /// scan, status, detach, …; `help` lists them); the report when it
    /// ends or the console is left. Under `run` the console reads the
    /// terminal, so the program's standard input is /dev/null.
    #[arg(short = 'i', long = "interactive", conflicts_with_all = ["max_trace_size", "max_trace_age"])]
    pub interactive: bool,
}

/// `--save FILE`: the stream received kept as a trace.
#[derive(Args, Clone, Debug, Default)]
pub struct Save {
    /// Keep the stream received in FILE (another process's in FILE.PID),
    /// to report again offline with `mtrace report`.
    #[arg(long, value_name = "FILE")]
    pub save: Option<std::path::PathBuf>,
}

/// `--token-file FILE`, the shared secret of `server` and `client`.
#[derive(Args, Clone, Debug, Default)]
pub struct TokenFile {
    /// The secret a client presents to the server (the first line of FILE);
    /// the server requires one to listen on a TCP address other than
    /// loopback.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
}

/// `--json`, one JSON document instead of text.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct Json {
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `--trace-dir DIR`, where the commands that keep trace files put them.
#[derive(Args, Clone, Debug, Default)]
pub struct TraceDir {
    /// Folder for the trace files, PROG.PID.mtrace (a taken name gets a
    /// suffix, nothing is overwritten); default: for `run` a temporary
    /// folder removed at the end (--keep-traces keeps it), for `keep` the
    /// working directory.
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<PathBuf>,
}

/// The program a command starts (`run`, `server`), after `--`.
#[derive(Args, Clone, Debug, Default)]
pub struct Program {
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "PROG")]
    pub command: Vec<String>,
}
