//! Commands from the reader of a socket stream, read by the writer thread
//! (or a solo process's thread) once per round (no signal needed): one per
//! line, ASCII, parsed by `mtrace_format::protocol::Command` and carried
//! out here.
//!
//! | command | effect |
//! |---|---|
//! | `start`, `stop` | start or stop recording allocations (frees are always recorded), as `mtrace_start()`/`mtrace_stop()` |
//! | `depth N` | record at most N frames per backtrace from now on (1–256) |
//! | `marker NAME` | a Marker record (report point 0) named NAME |
//! | `scan` | a leak scan now: snapshot records, then a Marker named `scan` |
//! | `detach` | stop tracing for good: the End record (reason detach), the connection closed; the program goes on |
//! | `answering` | the reader writes every report point's report and answers each (stream/answers.rs) |
//! | `reported SEQ ok\|failed` | its answer for report point SEQ, which `mtrace_report()`/`mtrace_scan()` wait for |
//!
//! The reader closing the connection means `detach`. Unknown lines are
//! ignored, with one warning.

use std::sync::atomic::{AtomicBool, Ordering};

use mtrace_format::protocol::{marker, Command};

use crate::platform::sys;
use crate::record::recorder;
use crate::snapshot;
use crate::stream::Session;

/// One unknown command was warned about.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Reads and carries out the commands that arrived for session `s`, with
/// `pending` the bytes of a line not complete yet; called once per
/// round. False once tracing stopped.
pub fn poll(s: &Session, pending: &mut Vec<u8>) -> bool {
    if !s.receive_commands(pending) {
        detach(s);
        return false;
    }
    while let Some(end) = pending.iter().position(|&b| b == b'\n') {
        let line: Vec<u8> = pending.drain(..=end).collect();
        let line = String::from_utf8_lossy(&line);
        match Command::parse(line.trim()) {
            Ok(None) => {}
            Ok(Some(c)) => {
                if !carry_out(s, c) {
                    return false;
                }
            }
            Err(_) => warn_once(line.trim()),
        }
    }
    true
}

/// Carries out `c` on session `s` (by the writer thread, or the program's
/// thread in a solo process); false when it ended tracing (`detach`).
pub fn carry_out(s: &Session, c: Command) -> bool {
    match c {
        Command::Start => recorder::set_collecting(true),
        Command::Stop => recorder::set_collecting(false),
        Command::Depth(d) => s.set_depth(d),
        Command::Marker(name) => s.marker(0, &name),
        Command::Scan => {
            snapshot::take(s, snapshot::By::asked(s));
            s.marker(0, marker::SCAN);
        }
        Command::Detach => {
            detach(s);
            return false;
        }
        Command::Answering => s.reporter.answers.answering(),
        Command::Reported { seq, written } => s.reporter.answers.answered(seq, written),
    }
    true
}

/// Stops tracing for good while the program goes on: calls are no longer
/// redirected (after `mtrace attach`), everything buffered and an End
/// record (reason detach) are written, the stream is closed.
pub fn detach(s: &Session) {
    crate::lifecycle::attach::undo();
    s.end_detached();
}

fn warn_once(line: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        sys::warn(&format!("unknown command from the analyzer: {line:?}"));
    }
}
