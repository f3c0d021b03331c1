//! `mtrace report TRACE`: a trace file's report, in the forms asked for,
//! through the analysis library's pipeline; `--markers` lists its markers.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use mtrace_analysis::{input, output};

use crate::flags::report::ReportFlags;

#[derive(Args)]
pub struct ReportArgs {
    /// The trace file (`<program>.<pid>.mtrace`).
    pub trace: PathBuf,
    #[command(flatten)]
    pub report_to: crate::flags::ReportFile,
    /// List the trace's markers (report points and named points) instead.
    #[arg(long)]
    markers: bool,
    #[command(flatten)]
    pub opts: ReportFlags,
}

/// `mtrace report`. Exit status 0, or 1 (said on stderr) for a trace read
/// only in part or without its end record.
pub fn report(a: ReportArgs) -> anyhow::Result<ExitCode> {
    let mut out = output::open(a.report_to.output.as_deref())?;
    // Into a pipe that closed (`| head`): end quietly, as Unix tools do.
    // SAFETY: restoring a signal's default action has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    if a.markers {
        list_markers(&a.trace, a.opts.json, &mut *out)?;
        return Ok(ExitCode::SUCCESS);
    }
    // A file of another form instead of the text.
    let text = a.opts.files().is_empty().then_some(&mut *out as &mut dyn Write);
    let reported = a.opts.report(&a.trace, text)?;
    out.flush()?;
    if !reported.unwritten.is_empty() {
        // Each said on stderr already.
        return Ok(ExitCode::from(2));
    }
    let Some(r) = reported.report else { return Ok(ExitCode::SUCCESS) };
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
}

/// `mtrace report --markers`: one line per marker (or a JSON array).
fn list_markers(trace: &std::path::Path, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let t = input::load(trace)?;
    if json {
        output::json(&t.markers, out)?;
        return Ok(());
    }
    Ok(output::text::write_markers(&t.markers, out)?)
}
