//! Report points by signal under ptrace, as under the preload: the report
//! signal (`MTRACE_REPORT_SIGNAL`, SIGUSR1 unless the recording says
//! otherwise) to a traced process whose own disposition of it is the default (it would
//! be killed) is taken by the tracer, never delivered; the stream gets a
//! report point's Marker (`signal`, numbered from 1), and `mtrace report`
//! writes `<program>-<pid>-<n>.memlog` from it (the change since the
//! previous point), in `MTRACE_REPORT_DIR` or the current folder — the
//! command line the preload runs (`mtrace_format::protocol::report_point_argv`).
//! The interrupted call goes on (a sleep is restarted): unlike the
//! preload's handler, nothing returns EINTR.

use mtrace_format::protocol::report_point_argv;
use mtrace_format::Record;
use nix::unistd::Pid;

use crate::stream::Stream;

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

/// Writes report point `at` named `name` (the marker kinds of
/// `mtrace_format::protocol::marker`: `signal`, or `scan` after a
/// snapshot) into `stream` as its thread's Marker, puts it in the file,
/// and starts the analyzer on it (not waited for: the tracer reaps it with
/// its other children): the change since the previous point, or with
/// `since_previous` false everything live there (a scan's). False when
/// the analyzer cannot be started (the point stays a marker).
pub fn point(stream: &mut Stream, at: Point, name: &str, since_previous: bool) -> bool {
    point_to(stream, at, name, since_previous, None).is_some()
}

/// Where a report point is made: by thread `tid` of process `pid`, its
/// number `seq`, its memlog going to folder `dir` (`MTRACE_REPORT_DIR`;
/// `None`: the working directory).
pub struct Point<'a> {
    /// The thread the point's Marker is written as.
    pub tid: Pid,
    /// Its process.
    pub pid: Pid,
    /// The point's number, from 1.
    pub seq: u64,
    /// The folder of the memlog.
    pub dir: Option<&'a str>,
}

/// [`point`], the memlog written to `out` when given (the C API's
/// `mtrace_report(path)`); the analyzer's process, to wait for.
pub fn point_to(
    stream: &mut Stream,
    at: Point,
    name: &str,
    since_previous: bool,
    out: Option<&str>,
) -> Option<std::process::Child> {
    let Point { tid, pid, seq, dir } = at;
    let time_ns = stream.now();
    stream.record(tid.as_raw() as u32, &Record::Marker { time_ns, seq, name: name.to_owned() });
    stream.sync();
    let out = out.map_or_else(
        || {
            let dir = std::path::Path::new(dir.unwrap_or("."));
            dir.join(format!("{}-{pid}-{seq}.memlog", stream.program())).display().to_string()
        },
        str::to_owned,
    );
    let argv = report_point_argv(stream.path(), seq, &out, since_previous);
    let me = std::env::current_exe().ok()?;
    let started = std::process::Command::new(me)
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn();
    match started {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("mtrace: report point {seq} of process {pid}: {e}");
            None
        }
    }
}
