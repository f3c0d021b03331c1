//! `mtrace cut TRACE -o OUT --max-trace-size SIZE`: a trace that grew too
//! large (a run without `--max-trace-size`, a plain `LD_PRELOAD` trace)
//! cut to its end, as `run --max-trace-size` would have kept it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use mtrace_analyzer::bounded::{self, Dest};

#[derive(clap::Args)]
pub struct CutArgs {
    /// The trace file to cut (it is left as it is).
    trace: PathBuf,
    /// The cut trace, a new file (never overwritten).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    /// At most SIZE bytes (K, M, G suffixes: powers of 1024; at least
    /// 64K), plus a checkpoint: the newest part of the trace, starting at a
    /// checkpoint that restates every block live then.
    #[arg(long, value_name = "SIZE", value_parser = crate::relay::server::parse_size)]
    max_trace_size: u64,
}

pub fn cut(a: CutArgs) -> Result<ExitCode> {
    bounded::check_bound(a.max_trace_size)?;
    let f = std::fs::File::open(&a.trace).with_context(|| format!("{}: cannot open", a.trace.display()))?;
    let len = f.metadata().map_or(0, |m| m.len());
    let kept = bounded::keep(f, Dest::File(&a.output), a.max_trace_size, None)?;
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
