//! The tracer's side of the uprobe hooks: asking for a thread's probes
//! and holding it until they are open, taking the samples the reader
//! copied and handling them in time order, stopping a thread whose
//! samples pile up, and closing everything at the end.

use std::sync::atomic::Ordering;

use mtrace_format::Record;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use rustc_hash::FxHashMap as HashMap;

use super::{resume, Options, Tracer};
use crate::calls::{self, Hook, Thread};
use crate::perf;
use crate::process::Process;
use crate::stats;
use crate::uprobes::Hit;

/// How long before a whole reading of the rings a sample may have been
/// stamped and not be in its ring yet, ns: the kernel writes it in the
/// probe's handler, right after stamping it (microseconds); a wide margin
/// costs nothing, the watermark trails the program anyway.
const WATERMARK_MARGIN: u64 = 1_000_000;

/// Samples of one thread waiting in memory to be handled (copied out of
/// its ring) above which it is stopped until they were, bytes.
const THROTTLE_BYTES: usize = 256 << 20;

/// A thread kept stopped until its probes are open, or until the tracer
/// has handled its samples.
#[derive(Default)]
pub(super) struct Hold {
    /// Requests the opener has not answered yet.
    pending: usize,
    /// Its samples piled up: it was interrupted, and goes on once they
    /// were handled.
    throttled: bool,
    /// It is in a stop the tracer may resume from, with this signal.
    pub(super) stopped: Option<Option<Signal>>,
}

impl Tracer {
    /// Asks the opener for thread `tid`'s probes of the points its
    /// process has that it has none for; the thread is then held (kept
    /// stopped) until they are open.
    pub(super) fn request(&mut self, tid: Pid) {
        let Some(opener) = &self.opener else { return };
        let Some((pid, _)) = self.threads.get(&tid) else { return };
        let Some(p) = self.procs.get(pid) else { return };
        let probes = self.probes.entry(tid).or_default();
        if opener.request(tid.as_raw(), tid == *pid, probes, &p.points) {
            self.held.entry(tid).or_default().pending += 1;
        }
    }

    /// Thread `tid` may go on (with `sig`), unless it is held: then it
    /// goes on once its probes are open.
    pub(super) fn hold_or_resume(&mut self, tid: Pid, sig: Option<Signal>) {
        match self.held.get_mut(&tid) {
            Some(h) if h.pending > 0 || h.throttled => h.stopped = Some(sig),
            _ => {
                self.held.remove(&tid);
                resume(tid, sig)
            }
        }
    }

    /// Waits, at most `limit`, until the opener made the probes asked for
    /// every thread, taking them in (each thread, held until its own are
    /// in, runs on as they come): an attach's window starts then. Opening
    /// waits for the lock all perf trace events share, which another
    /// tracer's closing holds for seconds: an attach said "4 ms to put
    /// the uprobes in" and its 2 s window saw no call, the program held.
    pub(super) fn wait_for_probes(&mut self, limit: std::time::Duration) {
        let until = std::time::Instant::now() + limit;
        while self.held.values().any(|h| h.pending > 0) && std::time::Instant::now() < until {
            self.collect();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Takes in what the opener made; resumes the threads it was for.
    pub(super) fn collect(&mut self) {
        let Some(opener) = &self.opener else { return };
        let made = opener.made();
        for o in made {
            let tid = Pid::from_raw(o.tid);
            for e in &o.errors {
                eprintln!("mtrace: thread {tid}: no uprobe: {e}");
            }
            if let (Some(p), Some(opener)) = (self.probes.get_mut(&tid), &self.opener) {
                opener.add(p, o);
            }
            let Some(h) = self.held.get_mut(&tid) else { continue };
            h.pending = h.pending.saturating_sub(1);
            self.release(tid);
        }
    }

    /// Resumes held thread `tid` if it is stopped and nothing holds it.
    pub(super) fn release(&mut self, tid: Pid) {
        let Some(h) = self.held.get(&tid) else { return };
        if h.pending == 0 && !h.throttled {
            if let Some(sig) = self.held.remove(&tid).and_then(|h| h.stopped) {
                resume(tid, sig);
            }
        }
    }

    /// Asks for the new points' probes in every thread of process `pid`.
    pub(super) fn request_process(&mut self, pid: Pid) {
        for tid in self.threads_of(pid) {
            self.request(tid);
        }
    }

    /// Thread `tid`'s probes are done: its ring goes, its events wait.
    pub(super) fn retire(&mut self, tid: Pid) {
        self.held.remove(&tid);
        if let Some(p) = self.probes.remove(&tid) {
            self.retired.extend(p.retire());
        }
    }

    /// The end of the uprobes: every thread's events, and the opener's
    /// definitions, closed and removed by a process of their own.
    pub(super) fn close_probes(&mut self) {
        let tids: Vec<Pid> = self.probes.keys().copied().collect();
        for tid in tids {
            self.retire(tid);
        }
        let Some(opener) = self.opener.take() else { return };
        let (late, defs) = opener.finish();
        let mut events = std::mem::take(&mut self.retired);
        for o in late {
            events.extend(o.into_events());
        }
        let removal = defs.map(|d| d.removal()).unwrap_or_default();
        perf::close_detached(events, removal);
    }

    /// Handles the samples in every thread's ring, in the order of their
    /// times: the books order the events of one address across threads by
    /// them (docs/FORMAT.md), so one thread's whole ring must not come
    /// before another's. `all`: also what the rings hold that the reader
    /// has not copied yet (at a stop, and every few ms); then every sample
    /// not handled yet was written to its ring after this began, so each
    /// stream gets a watermark there ([`WATERMARK_MARGIN`] before, for a
    /// sample stamped but not written yet). The number of samples.
    pub(super) fn drain_all(&mut self, all: bool) -> usize {
        let now = std::time::Instant::now();
        if all {
            self.last_whole = now;
        }
        let began: Vec<(Pid, u64)> = self.procs.iter().map(|(&pid, p)| (pid, p.stream.now())).collect();
        if let Some(last) = self.last_drain.replace(now) {
            stats::GAP_NS.fetch_max((now - last).as_nanos() as u64, Ordering::Relaxed);
        }
        let Tracer { probes, threads, procs, opts, frames, lost, held, .. } = self;
        // A thread whose samples pile up faster than the tracer handles
        // them (copied out of its ring, they wait in memory) is stopped
        // until they were handled: memory stays bounded.
        let mut throttle = |tid: Pid, waiting: usize| {
            if waiting > THROTTLE_BYTES {
                let h = held.entry(tid).or_default();
                if !h.throttled && h.stopped.is_none() && ptrace::interrupt(tid).is_ok() {
                    h.throttled = true;
                    stats::THROTTLES.fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        for (&tid, p) in probes.iter_mut() {
            let waiting = p.take(all);
            throttle(tid, waiting);
        }
        let mut n = 0;
        let mut checked = std::time::Instant::now();
        loop {
            // The thread whose next sample is the oldest.
            let mut first: Option<(u64, Pid)> = None;
            for (&tid, p) in probes.iter() {
                if let Some(t) = p.next_time() {
                    if first.is_none_or(|(ft, _)| t < ft) {
                        first = Some((t, tid));
                    }
                }
            }
            let Some((_, tid)) = first else { break };
            let Some(p) = probes.get_mut(&tid) else { break };
            if let Some(hit) = p.next() {
                handle(threads, procs, opts, frames, lost, tid, hit);
            }
            p.advance();
            n += 1;
            if checked.elapsed() > std::time::Duration::from_millis(1) {
                for (&tid, p) in probes.iter() {
                    throttle(tid, p.backlog());
                }
                checked = std::time::Instant::now();
            }
        }
        if all {
            for (pid, t) in began {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.stream.watermark(t.saturating_sub(WATERMARK_MARGIN));
                }
            }
        }
        // Threads stopped for their piled-up samples: handled now, they go on.
        let done: Vec<Pid> =
            self.held.iter().filter(|(_, h)| h.throttled && h.stopped.is_some()).map(|(t, _)| *t).collect();
        for tid in done {
            if let Some(h) = self.held.get_mut(&tid) {
                h.throttled = false;
            }
            self.release(tid);
        }
        n
    }

    /// Waits a millisecond for the reader to copy more samples.
    pub(super) fn wait_rings(&self) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// One sample of thread `tid`: an entry or a return, handled as a
/// breakpoint stop would be, from the registers and stack the kernel
/// copied; a loss makes the stream not whole from there on (the wrong
/// frees are not judged: an allocation may be missing).
fn handle(
    threads: &mut HashMap<Pid, (Pid, Thread)>,
    procs: &mut HashMap<Pid, Process>,
    opts: &Options,
    frames: &mut Vec<u64>,
    lost: &mut u64,
    tid: Pid,
    hit: Hit,
) {
    let Some((pid, th)) = threads.get_mut(&tid) else { return };
    let Some(p) = procs.get_mut(pid) else { return };
    let (point, ret, time, mut regs, stack) = match hit {
        Hit::Lost(n) => {
            // Each lost sample is at most one call; each call awaiting its
            // return is one more unless its return is among them: at most
            // this many calls go unrecorded.
            *lost += n + th.pending.len() as u64;
            // The returns awaited may be among the lost samples: forgotten,
            // so that a lost return costs its one call. Kept, the outer
            // call they belong to stays "running", and later calls from the
            // same frame (whose slot holds the same return address again)
            // can be taken for its nested ones; the likely cause of a run
            // of queue.c that lost 2,886 allocations to 42 lost samples.
            th.pending.clear();
            th.outer = None;
            let time_ns = p.stream.now();
            p.stream.record(tid.as_raw() as u32, &Record::Coverage { time_ns, collecting: true, whole: false });
            return;
        }
        Hit::Call { point, ret, time, regs, stack } => (point, ret, time, regs, stack),
    };
    stats::SAMPLES.fetch_add(1, Ordering::Relaxed);
    let Some(pt) = p.points.get(point) else { return };
    let hook = Hook { at: pt.at, call: pt.call, module: pt.module };
    let stack = crate::target::Stack::Copy { base: regs.sp(), bytes: stack };
    let time = p.stream.at(time);
    if ret {
        calls::returned(p, th, tid, &mut regs, stack, time);
    } else {
        p.sample(tid.as_raw() as u32);
        let at = calls::Entry { regs: &regs, stack, time };
        calls::entry(p, th, tid, &hook, &at, &opts.recording, frames);
    }
}
