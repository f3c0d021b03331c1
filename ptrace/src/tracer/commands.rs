//! The tracer's side of live streams (crate::live): every tick it hands
//! what it collected to the writers, so that the console sees the program
//! as it is, and carries out the commands that came back — what
//! preload/src/session/commands.rs does for libmtrace.so.

use std::sync::atomic::Ordering;

use mtrace_format::protocol::{marker, Command};
use mtrace_format::Record;
use nix::unistd::Pid;

use super::{resume_interrupted, snapshot_now, Tracer};
use crate::live;
use crate::snapshot;
use crate::spawn::DETACH;

impl Tracer {
    /// Flushes the live streams and carries out the commands that
    /// arrived, if a tick has passed since the last time (or `now`).
    pub(super) fn tick(&mut self, now: bool) {
        if (!now && self.last_tick.elapsed() < live::TICK) || !self.procs.values().any(|p| p.stream.is_live()) {
            return;
        }
        self.last_tick = std::time::Instant::now();
        for (pid, cmd) in live::take() {
            self.command(Pid::from_raw(pid as i32), cmd);
        }
        for (pid, p) in self.procs.iter_mut() {
            // An RSS sample (at most every 10 ms) moves a quiet program's
            // trace on, as the preload's writer does: a view of what stays
            // live for a while (`attach --interval`) measures by the
            // trace's time.
            p.sample(pid.as_raw() as u32);
            if !p.uprobes {
                let time_ns = p.stream.now();
                p.stream.watermark(time_ns);
            }
            p.stream.flush();
        }
    }

    /// Carries out `cmd`, which came on process `pid`'s stream.
    fn command(&mut self, pid: Pid, cmd: Command) {
        let tid = pid.as_raw() as u32;
        match cmd {
            Command::Start | Command::Stop => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.set_collecting(tid, cmd == Command::Start);
                }
            }
            Command::Depth(d) => self.opts.recording.depth = d,
            Command::Marker(name) => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    let time_ns = p.stream.now();
                    p.stream.record(tid, &Record::Marker { time_ns, seq: 0, name });
                }
            }
            Command::Scan => self.scan_now(pid),
            // Every process: the tracer leaves as a whole.
            Command::Detach => DETACH.store(true, Ordering::Relaxed),
            // The tracer's report points spawn their own report (reports.rs):
            // a reader's answers have nobody waiting for them.
            Command::Answering | Command::Reported { .. } => {}
        }
    }

    /// The console's `scan`: every thread of process `pid` stopped where
    /// it is, the leak scan's snapshot, then a `scan` marker.
    fn scan_now(&mut self, pid: Pid) {
        let tids = self.threads_of(pid);
        let stopped = self.interrupt_all(&tids);
        if let Some(p) = self.procs.get_mut(&pid) {
            let threads: Vec<_> = stopped.iter().map(|&(t, r, _)| snapshot::interrupted(t, r)).collect();
            if snapshot_now(p, pid, &threads) {
                let time_ns = p.stream.now();
                p.stream.record(pid.as_raw() as u32, &Record::Marker { time_ns, seq: 0, name: marker::SCAN.into() });
                p.stream.flush();
            }
        }
        resume_interrupted(stopped);
    }
}
