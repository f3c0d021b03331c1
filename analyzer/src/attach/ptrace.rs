//! `mtrace attach --ptrace`: the ptrace tracer on the process for the
//! window (no library loaded), then the report of it; with `-i` (the
//! console) or `--interval` (views of what stays live) on the way, the
//! tracer's stream coming over a socket as the library's does
//! (ptrace/src/live.rs carries out the commands).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use mtrace_format::protocol::Command;

use super::{accept_while, catch_stop_signals, watch, AttachArgs, Session, DETACH_TIMEOUT, STOP};
use crate::arriving::listen::Listener;

/// The tracer's options for `a`, its stream going to `output`.
fn options(a: &AttachArgs, output: String) -> Result<mtrace_ptrace::Options> {
    let mut rec = a.rec.recording(a.opts.depth)?;
    rec.output = Some(output);
    rec.scan = a.scan;
    Ok(a.rec.ptrace_options(rec, a.scan))
}

/// `mtrace attach --ptrace`.
pub fn attach(a: AttachArgs) -> Result<ExitCode> {
    if a.interactive.interactive || a.interval.is_some() {
        return live(a);
    }
    let dir = tempfile::Builder::new().prefix("mtrace-attach.").tempdir()?;
    let pattern = match &a.save.save {
        Some(p) => p.display().to_string(),
        None => dir.path().join("%p.mtrace").display().to_string(),
    };
    let duration = a.duration.map(Duration::from_nanos);
    // The tracer's own path: a taken --save name gets a suffix there.
    let (trace, outcome) = mtrace_ptrace::attach(a.pid, options(&a, pattern)?, duration)?;
    match outcome {
        mtrace_ptrace::Outcome::Detached(_) => eprintln!("mtrace: detached from process {}", a.pid),
        o => eprintln!("mtrace: process {} ended ({o:?})", a.pid),
    }
    super::report_window(&a, &PathBuf::from(trace), None, dir)
}

/// `mtrace attach --ptrace` with `-i` or `--interval`: the tracer (a
/// thread of its own: the kernel ties a tracee to the thread that seized
/// it) streams to a socket of ours. The console reads the copy of it and
/// sends its commands back, and leaving it detaches; or the views of what
/// stays live come every interval until the process ends, a signal or
/// `--duration` (then the tracer detaches).
fn live(a: AttachArgs) -> Result<ExitCode> {
    if !a.interactive.interactive {
        // From the start: a SIGTERM while the tracer attaches detaches
        // right after.
        catch_stop_signals();
    }
    let dir = tempfile::Builder::new().prefix("mtrace-attach.").tempdir()?;
    let listener = Listener::private("mtrace-attach.", "stream.sock")?;
    listener.set_nonblocking(true)?;
    let opts = options(&a, listener.address())?;
    let pid = a.pid;
    let tracer = std::thread::spawn(move || mtrace_ptrace::attach(pid, opts, None));
    // Waited for as long as the tracer runs, not the library's timeout
    // (super::accept): seizing a busy process and placing the hooks may
    // take longer (over 5 s seen with the test suite loading both CPUs),
    // and a tracer that connects after nobody waits any more streams into
    // a full socket for ever.
    let stream = match accept_while(&listener, || !tracer.is_finished()) {
        Ok(Some(s)) => s,
        // The tracer ended without connecting: it says why.
        Ok(None) => {
            return match tracer.join() {
                Ok(Err(why)) => Err(why),
                _ => Err(anyhow!("the tracer ended before it streamed anything for process {pid}")),
            };
        }
        Err(e) => return Err(e),
    };
    let leave = if a.interactive.interactive { "quit" } else { "Ctrl-C" };
    eprintln!("mtrace: attached to process {pid} from outside (ptrace); {leave} detaches");
    let mut control = stream.try_clone()?;
    let (trace, copier) = super::save::start(&a, dir.path(), stream)?;
    if a.interactive.interactive {
        let mut live =
            Session { control: control.try_clone()?, trace: trace.clone(), copier: &copier, pid, waker: None };
        let _ = crate::console::run(&mut live, &a.opts)?;
        STOP.store(true, Ordering::Relaxed);
    } else {
        watch(&a, &trace, &copier, None);
    }
    if !copier.is_finished() {
        let _ = control.write_all(Command::Detach.line().as_bytes());
        let until = Instant::now() + DETACH_TIMEOUT;
        while !copier.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let copied = copier.join().map_err(|_| anyhow!("the stream reader failed"))??;
    match tracer.join() {
        Ok(Ok((_, mtrace_ptrace::Outcome::Detached(_)))) => eprintln!("mtrace: detached from process {pid}"),
        Ok(Ok((_, o))) => eprintln!("mtrace: process {pid} ended ({o:?})"),
        Ok(Err(e)) => eprintln!("mtrace: {e:#}"),
        Err(_) => bail!("the tracer failed"),
    }
    if copied == 0 {
        bail!("the tracer sent nothing for process {pid}");
    }
    super::report_window(&a, &trace, None, dir)
}
