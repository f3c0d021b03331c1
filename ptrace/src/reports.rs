//! Report points by signal under ptrace, as under the preload: SIGUSR1 to
//! a traced process whose own disposition of it is the default (it would
//! be killed) is taken by the tracer, never delivered; the stream gets a
//! report point's Marker (`signal`, numbered from 1), and `mtrace report`
//! writes `<program>-<pid>-<n>.memlog` from it (the change since the
//! previous point), in `MTRACE_REPORT_DIR` or the current folder — the
//! command line the preload runs (`mtrace_format::protocol::report_point_argv`).
//! The interrupted call goes on (a sleep is restarted): unlike the
//! preload's handler, nothing returns EINTR.

use mtrace_format::protocol::{marker, report_point_argv};
use mtrace_format::{settings, Record};
use nix::unistd::Pid;

use crate::stream::Stream;

/// The report signal.
pub const SIGNAL: i32 = libc::SIGUSR1;

/// Whether process `pid` neither catches nor ignores signal `sig` (its
/// `SigCgt` and `SigIgn` in /proc/PID/status): delivered, it would end it.
pub fn default_disposition(pid: Pid, sig: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    let mask = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(u64::MAX)
    };
    let bit = 1u64 << (sig - 1);
    mask("SigCgt:") & bit == 0 && mask("SigIgn:") & bit == 0
}

/// Writes report point `seq` into `stream` (thread `tid`'s Marker), puts
/// it in the file, and starts the analyzer on it (not waited for: the
/// tracer reaps it with its other children). False when the analyzer
/// cannot be started (the point stays a marker).
pub fn point(stream: &mut Stream, tid: Pid, pid: Pid, seq: u64) -> bool {
    let time_ns = stream.now();
    stream.record(tid.as_raw() as u32, &Record::Marker { time_ns, seq, name: marker::SIGNAL.to_owned() });
    stream.sync();
    let dir = std::env::var(settings::REPORT_DIR.name()).map_or_else(|_| std::path::PathBuf::from("."), Into::into);
    let out = dir.join(format!("{}-{pid}-{seq}.memlog", stream.program()));
    let argv = report_point_argv(stream.path(), seq, &out.display().to_string(), true);
    let Ok(me) = std::env::current_exe() else { return false };
    let started = std::process::Command::new(me)
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn();
    match started {
        Ok(_) => true,
        Err(e) => {
            eprintln!("mtrace: report point {seq} of process {pid}: {e}");
            false
        }
    }
}
