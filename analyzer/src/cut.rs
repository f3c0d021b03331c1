//! `mtrace cut TRACE -o OUT --max-trace-size SIZE` (or `--max-trace-age
//! DURATION`): a trace that grew too large (a run without a bound, a plain
//! `LD_PRELOAD` trace) cut to its end, as `run` would have kept it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use mtrace_analysis::bounded::{self, Dest};

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("keep").required(true).multiple(true).args(["max_trace_size", "max_trace_age"])))]
pub struct CutArgs {
    /// The trace file to cut (it is left as it is).
    trace: PathBuf,
    /// The cut trace, a new file (never overwritten).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    /// The newest part of the trace kept (at least one of the two),
    /// starting at a checkpoint that restates every block live then.
    #[command(flatten)]
    bound: crate::flags::bound::BoundArgs,
}

pub fn cut(a: CutArgs) -> Result<ExitCode> {
    // One of the two at least: clap requires it (the group "keep").
    let bound = a.bound.bound()?.unwrap_or_default();
    let f = std::fs::File::open(&a.trace).with_context(|| format!("{}: cannot open", a.trace.display()))?;
    let len = f.metadata().map_or(0, |m| m.len());
    let kept = bounded::keep(f, Dest::File(&a.output), bound, None)?;
    let out_len = std::fs::metadata(&a.output).map_or(0, |m| m.len());
    eprintln!(
        "mtrace: {} ({len} bytes) -> {} ({out_len} bytes, {} checkpoints{})",
        a.trace.display(),
        a.output.display(),
        kept.checkpoints,
        if kept.dropped > 0 { ", kept from the newest that fit" } else { "; nothing dropped" }
    );
    if let Some(e) = kept.error {
        eprintln!("mtrace: {}: {e}; cut what was read before it", a.trace.display());
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
