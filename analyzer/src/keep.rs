//! `mtrace keep --listen unix:PATH`: keeps the trace of every process that
//! streams to PATH within a bound, as `mtrace run --max-trace-size` keeps
//! its program's (`mtrace_analysis::bounded`). For programs that cannot
//! be started by mtrace (a service whose manager sets `LD_PRELOAD`): they
//! get `MTRACE_OUTPUT=unix:PATH`, and a day-long run leaves a trace within
//! its bound instead of one that only grows.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use mtrace_format::address::Address;

use crate::arriving::{keepers::Keepers, listen::Listener};
use crate::flags::bound::BoundArgs;

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("keep").required(true).multiple(true).args(["max_trace_size", "max_trace_age"])))]
pub struct KeepArgs {
    /// The socket the processes stream to (`MTRACE_OUTPUT=unix:PATH`),
    /// made with mode 0600 (a stale one left by a keeper that died is
    /// replaced; any other file there is refused).
    #[arg(long, value_name = "unix:PATH")]
    listen: String,
    #[command(flatten)]
    trace_dir: crate::flags::TraceDir,
    /// Folder for the .memlog of report points (kill -USR1,
    /// mtrace_report()); default: each process's working directory.
    #[arg(long, value_name = "DIR")]
    report_dir: Option<PathBuf>,
    #[command(flatten)]
    frames: crate::flags::Depth,
    /// The bound of each process's trace (at least one of the two).
    #[command(flatten)]
    bound: BoundArgs,
}

/// How long the streams still open at SIGINT or SIGTERM have to end.
const GRACE: Duration = Duration::from_secs(10);

/// Runs until SIGINT, SIGTERM or SIGHUP, then waits up to [`GRACE`] for
/// the streams still open. Says on standard error where it listens and
/// what each ended stream left. Fails (in one line) when the socket or
/// the folder cannot be used.
pub fn keep(a: KeepArgs) -> Result<ExitCode> {
    let bound = a.bound.bound()?.unwrap_or_default();
    let Some(sock) = a.listen.strip_prefix("unix:").map(PathBuf::from) else {
        bail!("--listen {}: unix:PATH (mtrace keep listens on a UNIX socket only)", a.listen);
    };
    let dir = a.trace_dir.trace_dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let dir = dir.canonicalize().with_context(|| format!("{}: not a folder mtrace can use", dir.display()))?;
    tempfile::tempfile_in(&dir).with_context(|| format!("{}: cannot write trace files there", dir.display()))?;
    let l = Listener::bind(&Address::Unix(sock.display().to_string()), false)?;
    crate::attach::catch_stop_signals();
    let keepers = Keepers::listen(l, &dir, bound, a.report_dir.clone(), a.frames.depth)?;
    eprintln!("mtrace keep: listening on unix:{}; traces go to {} (Ctrl-C stops)", sock.display(), dir.display());
    while !crate::attach::stop_asked() {
        std::thread::sleep(Duration::from_millis(100));
        say(&keepers);
    }
    let until = Instant::now() + GRACE;
    while keepers.open() > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        say(&keepers);
    }
    say(&keepers);
    if keepers.open() > 0 {
        eprintln!("mtrace keep: stopped with {} streams still open: their traces end where they were", keepers.open());
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per stream that ended since the last call.
fn say(keepers: &Keepers) {
    for k in keepers.ended() {
        match k {
            Ok(k) => {
                let kept =
                    if k.dropped > 0 { format!("{} bytes dropped at checkpoints", k.dropped) } else { "whole".into() };
                let broke = k.error.map(|e| format!("; the stream broke off: {e}")).unwrap_or_default();
                eprintln!("mtrace keep: {} ({}, {} checkpoints{broke})", k.path.display(), kept, k.checkpoints);
                for p in k.problems {
                    eprintln!("mtrace keep: {}: {p}", k.path.display());
                }
            }
            Err(e) => eprintln!("mtrace keep: {e:#}"),
        }
    }
}
