//! Commands from the reader of a socket stream, read by the writer thread
//! once per round (no signal needed): one per line, ASCII, parsed here and
//! carried out by `lifecycle::commands` (through [`crate::Up::command`]).
//!
//! | command | effect |
//! |---|---|
//! | `start`, `stop` | start or stop recording allocations (frees are always recorded), as `mtrace_start()`/`mtrace_stop()` |
//! | `depth N` | record at most N frames per backtrace from now on (1–256) |
//! | `marker NAME` | a Marker record (report point 0) named NAME |
//! | `scan` | a leak scan now: snapshot records, then a Marker named `scan` |
//! | `detach` | stop tracing for good: the End record (reason detach), the connection closed; the program goes on |
//!
//! The reader closing the connection means `detach`. Unknown lines are
//! ignored, with one warning.

use std::sync::atomic::{AtomicBool, Ordering};

use mtrace_format::protocol::Command;
use mtrace_format::{Encoder, EndReason, Record};

use super::Session;
use crate::platform::sys;

/// One unknown command was warned about.
static WARNED: AtomicBool = AtomicBool::new(false);

impl Session {
    /// Reads and carries out the commands that arrived; called by the
    /// writer thread between rounds. False once tracing stopped.
    pub(super) fn poll_commands(&self, pending: &mut Vec<u8>) -> bool {
        if !self.out.receive(pending) {
            self.detach();
            return false;
        }
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if !self.command(line.trim()) {
                return false;
            }
        }
        true
    }

    /// Carries out one command line (`mtrace_format::protocol`); false
    /// when it ended tracing.
    fn command(&self, line: &str) -> bool {
        match Command::parse(line) {
            Ok(None) => true,
            Ok(Some(c)) => (crate::UP.command)(self, c),
            Err(_) => {
                warn_once(line);
                true
            }
        }
    }

    /// Writes a Marker record after everything buffered so far.
    pub fn marker(&self, seq: u64, name: &str) {
        self.write_now(|time_ns| Record::Marker { time_ns, seq, name: name.to_owned() });
    }

    /// Writes the record `make` builds from the time now after everything
    /// the threads buffered so far.
    pub fn write_now(&self, make: impl FnOnce(u64) -> Record) {
        let _f = self.file.lock();
        self.collect(false);
        let now = self.now();
        let mut buf = Vec::with_capacity(128);
        let mut enc = Encoder::new();
        enc.encode(&mut buf, &Record::Thread { tid: sys::gettid(), time_ns: now });
        enc.encode(&mut buf, &make(now));
        self.write_unordered(&buf);
    }

    /// Stops tracing for good while the program goes on: calls are no
    /// longer redirected (after `mtrace attach`), everything buffered and
    /// an End record (reason detach) are written, the stream is closed.
    pub fn detach(&self) {
        (crate::UP.stopped)();
        self.final_flush(EndReason::Detach, false, None);
        super::stop_tracing();
        self.out.close();
        // The process's descriptors are its own again.
        sys::close_statm();
    }
}

fn warn_once(line: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        sys::warn(&format!("unknown command from the analyzer: {line:?}"));
    }
}
