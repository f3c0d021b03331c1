//! `mtrace diff OLD NEW`: two traces compared per backtrace.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use mtrace_analysis::{input, output, report, symbolize::Symbolizer};

#[derive(Args)]
pub struct DiffArgs {
    /// The trace of the earlier run.
    old: PathBuf,
    /// The trace of the later run.
    new: PathBuf,
    #[command(flatten)]
    json: crate::flags::Json,
    #[command(flatten)]
    report_to: crate::flags::ReportFile,
    #[command(flatten)]
    frames: crate::flags::Depth,
    /// Show at most N backtraces in the text (JSON has all).
    #[arg(long, value_name = "N", default_value = "30")]
    limit: usize,
    #[command(flatten)]
    symbols: crate::flags::Symbols,
}

/// `mtrace diff OLD NEW`.
pub fn diff(a: DiffArgs) -> anyhow::Result<ExitCode> {
    let old = input::load(&a.old)?;
    let new = input::load(&a.new)?;
    let mut sym = Symbolizer::new(a.symbols.search_paths());
    let d = report::diff::diff(&old, &new, &mut sym, a.frames.depth);
    let mut out = output::open(a.report_to.output.as_deref())?;
    if a.json.json {
        output::json(&d, &mut *out)?;
    } else {
        output::diff::write_text(&d, a.limit, &mut *out)?;
    }
    out.flush()?;
    // As `report` does: a trace read only in part is said, and exits 1
    // (the comparison above covers what could be read).
    let mut whole = true;
    for (path, t) in [(&a.old, &old), (&a.new, &new)] {
        if let Some(e) = &t.error {
            eprintln!("mtrace: {}: {e}; compared what was read before it", path.display());
            whole = false;
        } else if t.end.is_none() {
            eprintln!(
                "mtrace: {}: the trace has no end record (the process was killed, or is still running)",
                path.display()
            );
            whole = false;
        }
    }
    Ok(if whole { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
