//! The event loop: every stop of every traced thread, in the order the
//! kernel reports them. Threads (PTRACE_O_TRACECLONE) belong to their
//! process; a fork or vfork makes a process with a stream of its own; an
//! exec ends the image's stream and starts the next. Signals go to the
//! program unchanged; a stop at none of the tracer's breakpoints is the
//! program's own SIGTRAP.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use mtrace_format::{EndReason, Record};
use nix::errno::Errno;
use nix::sys::ptrace::{self, Event};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use rustc_hash::FxHashMap as HashMap;

use crate::arch;
use crate::calls::{self, Hook, Thread};
use crate::perf;
use crate::process::{parent_of, Process};
use crate::reports;
use crate::snapshot;
use crate::spawn::{self, DETACH};
use crate::stats;
use crate::target;
use crate::uprobes::{Opener, Probes};
use mtrace_format::protocol::marker;
use mtrace_format::recording::Recording;
use nix::sys::resource::{getrlimit, setrlimit, Resource};

mod api;
mod commands;
mod samples;
use samples::Hold;

/// How tracing the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It exited with this status.
    Exited(i32),
    /// It was killed by this signal.
    Signaled(i32),
    /// The tracer was asked to leave (SIGINT, SIGTERM): the program runs
    /// on, untraced; its pid.
    Detached(i32),
}

/// How the interposed functions are hooked (`--hooks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hooks {
    /// Kernel uprobes where this process may use them, else breakpoints.
    Auto,
    /// Breakpoints the tracer handles: a stop per call (any user who may
    /// ptrace the program).
    Breakpoints,
    /// Kernel uprobes (`uprobes.rs`): no stop; needs root and uprobe
    /// events in tracefs.
    Uprobes,
}

impl Hooks {
    /// Every way, in the order `--hooks` lists them.
    pub const ALL: [Hooks; 3] = [Hooks::Auto, Hooks::Uprobes, Hooks::Breakpoints];

    /// Its name, as `--hooks` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Hooks::Auto => "auto",
            Hooks::Uprobes => "uprobes",
            Hooks::Breakpoints => "breakpoints",
        }
    }
}

/// What to record, where, and how to hook.
pub struct Options {
    /// The recording configuration, as the preload reads it: its output
    /// (the trace files: `%p` the pid, `%e` the program; or a socket),
    /// depth, frees' backtraces, scan at exit, sampling, report and scan
    /// signals, report folder. What only the preload can do (the unwinder,
    /// the clock, freeres, follow fork/exec off, start off) is not done.
    pub recording: Recording,
    /// Also a leak scan's snapshot when the tracer detaches (`attach --scan`).
    pub scan_at_detach: bool,
    /// Breakpoints or uprobes.
    pub hooks: Hooks,
}

impl Options {
    /// Where the streams go: the recording's output, else
    /// `<program>.<pid>.mtrace` in the working directory (as the preload).
    pub fn output(&self) -> &str {
        self.recording.output.as_deref().unwrap_or("%e.%p.mtrace")
    }
}

/// Under uprobes, how often the rings are read whole while the program
/// runs: each time the streams get a watermark (analyzer's memory: the
/// records in between).
const WHOLE_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

struct Tracer {
    opts: Options,
    /// Processes by pid.
    procs: HashMap<Pid, Process>,
    /// Threads: their process and state.
    threads: HashMap<Pid, (Pid, Thread)>,
    /// New threads or children that stopped before the event that names
    /// them: resumed once it came.
    early: HashSet<Pid>,
    main: Pid,
    frames: Vec<u64>,
    /// Under uprobes: the opener thread, each thread's probes, and the
    /// threads kept stopped until their probes are open.
    opener: Option<Opener>,
    probes: HashMap<Pid, Probes>,
    held: HashMap<Pid, Hold>,
    /// Calls that may be missing from the stream: samples the kernel
    /// dropped because a ring was full, and calls whose returns were
    /// awaited when it did (samples.rs).
    lost: u64,
    /// Events of threads that ended, closed at the end (closing waits).
    retired: Vec<perf::Event>,
    /// When the rings were last read.
    last_drain: Option<std::time::Instant>,
    /// When they were last read whole (a watermark could be stated).
    last_whole: std::time::Instant,
    /// `MTRACE_SCAN_SIGNAL`: the signal that makes a scan's report point.
    scan_signal: Option<Signal>,
    /// When the live streams were last flushed and their commands read.
    last_tick: std::time::Instant,
}

/// Runs `cmd` traced until it ends (and every process it started), or
/// until the tracer is told to leave; returns its pid and how it ended.
pub fn run(cmd: &[String], opts: Options) -> Result<(i32, Outcome)> {
    spawn::catch_signals(&opts.recording)?;
    let up = opener(&opts)?;
    let main = spawn::spawn(cmd)?;
    let mut t = Tracer::new(opts, main, up);
    Ok((main.as_raw(), t.event_loop()?))
}

/// Traces running process `pid` from now on, until `duration` passed (if
/// given), the tracer is told to leave, or the process ends; then the
/// process runs on untraced. The path of the trace written (`opts.output`
/// expanded, with a suffix if that name was taken) and how it ended.
pub fn attach(pid: i32, opts: Options, duration: Option<std::time::Duration>) -> Result<(String, Outcome)> {
    spawn::catch_signals(&opts.recording)?;
    let up = opener(&opts)?;
    let uprobes = up.is_some();
    crate::inspect::check_readable(pid)?;
    let main = Pid::from_raw(pid);
    let tids = spawn::seize_all(main)?;
    let mut t = Tracer::new(opts, main, up);
    let started = std::time::Instant::now();
    let mut signals = Vec::new();
    let first = *tids.first().context("no thread could be stopped")?;
    let trace = match Process::attach(main, first, t.opts.output(), uprobes, &mut signals) {
        Ok(mut p) => {
            p.sample_at(t.opts.recording.sample_rate);
            let trace = p.stream.path().to_string();
            t.procs.insert(main, p);
            trace
        }
        Err(e) => {
            for &tid in &tids {
                let _ = ptrace::detach(tid, None);
            }
            return Err(e);
        }
    };
    for &tid in &tids {
        t.threads.insert(tid, (main, Thread::default()));
        t.request(tid);
    }
    for &tid in &tids {
        t.hold_or_resume(tid, if tid == first { signals.first().copied() } else { None });
    }
    if uprobes {
        t.wait_for_probes(std::time::Duration::from_secs(30));
    }
    eprintln!(
        "mtrace: attached to process {pid} with ptrace ({} ms to put the {} in); Ctrl-C detaches",
        started.elapsed().as_millis(),
        if uprobes { "uprobes" } else { "breakpoints" }
    );
    if let Some(d) = duration {
        spawn::detach_after(d);
    }
    Ok((trace, t.event_loop()?))
}

/// The uprobes' opener `opts` asks for: `None` for breakpoints. Errors
/// when uprobes are required and cannot be had.
fn opener(opts: &Options) -> Result<Option<Opener>> {
    match opts.hooks {
        Hooks::Breakpoints => Ok(None),
        Hooks::Uprobes => Ok(Some(Opener::start(opts.recording.check_frees).context("uprobes")?)),
        Hooks::Auto => Ok(Opener::start(opts.recording.check_frees).ok()),
    }
}

impl Tracer {
    fn new(opts: Options, main: Pid, opener: Option<Opener>) -> Tracer {
        if opener.is_some() {
            // Some 50 events per thread: as many descriptors as allowed.
            if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
                let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
            }
        }
        let scan_signal = opts.recording.scan_signal.and_then(|n| Signal::try_from(n).ok());
        Tracer {
            opts,
            procs: HashMap::default(),
            threads: HashMap::default(),
            early: HashSet::new(),
            main,
            frames: Vec::with_capacity(256),
            opener,
            probes: HashMap::default(),
            held: HashMap::default(),
            lost: 0,
            retired: Vec::new(),
            last_drain: None,
            last_whole: std::time::Instant::now(),
            scan_signal,
            last_tick: std::time::Instant::now(),
        }
    }

    /// The threads of process `pid`.
    fn threads_of(&self, pid: Pid) -> Vec<Pid> {
        self.threads.iter().filter(|(_, (p, _))| *p == pid).map(|(t, _)| *t).collect()
    }

    /// The next stop of any traced thread: blocking under breakpoints;
    /// under uprobes, handling the rings while none comes.
    fn next_stop(&mut self) -> nix::Result<WaitStatus> {
        if self.opener.is_none() {
            return waitpid(None, Some(WaitPidFlag::__WALL));
        }
        loop {
            match waitpid(None, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {}
                other => return other,
            }
            if DETACH.load(Ordering::Relaxed) {
                return Err(Errno::EINTR);
            }
            self.tick(false);
            self.collect();
            // Whole every few ms: then a watermark says how far the
            // stream is complete (samples.rs).
            let whole = self.last_whole.elapsed() >= WHOLE_EVERY;
            if self.drain_all(whole) == 0 {
                self.wait_rings();
            }
        }
    }

    fn event_loop(&mut self) -> Result<Outcome> {
        let mut outcome = None;
        loop {
            if DETACH.load(Ordering::Relaxed) {
                self.detach_all();
                return Ok(Outcome::Detached(self.main.as_raw()));
            }
            for sig in spawn::take_passed_on().into_iter().filter_map(|s| Signal::try_from(s).ok()) {
                let _ = nix::sys::signal::kill(self.main, sig);
            }
            let waited = std::time::Instant::now();
            self.tick(false);
            let st = match self.next_stop() {
                Ok(st) => st,
                Err(Errno::EINTR) => {
                    self.tick(true);
                    continue;
                }
                Err(Errno::ECHILD) => break,
                Err(e) => return Err(e).context("waitpid"),
            };
            stats::add(&stats::WAIT_NS, waited);
            stats::STOPS.fetch_add(1, Ordering::Relaxed);
            let handling = std::time::Instant::now();

            // What the threads did before this stop comes first.
            if self.opener.is_some() {
                self.drain_all(true);
            }
            target::at_stop(&st);
            match st {
                WaitStatus::Exited(tid, code) => {
                    self.gone(tid, EndReason::Exit(Some(code as u8)));
                    if tid == self.main {
                        outcome = Some(Outcome::Exited(code));
                    }
                }
                WaitStatus::Signaled(tid, sig, _) => {
                    self.gone(tid, EndReason::Signal(sig as u32));
                    if tid == self.main {
                        outcome = Some(Outcome::Signaled(sig as i32));
                    }
                }
                WaitStatus::Stopped(tid, Signal::SIGTRAP) => self.trap(tid),
                WaitStatus::Stopped(tid, sig) if Some(sig) == self.scan_signal && self.scan_point(tid, sig) => {
                    resume(tid, None)
                }
                WaitStatus::Stopped(tid, sig)
                    if Some(sig as i32) == self.opts.recording.report_signal && self.report_point(tid, sig) =>
                {
                    resume(tid, None)
                }
                WaitStatus::Stopped(tid, sig) => resume(tid, Some(sig)),
                WaitStatus::PtraceEvent(tid, _, ev) => self.event(tid, ev),
                _ => {}
            }
            stats::add(&stats::HANDLE_NS, handling);

            if outcome.is_some() && self.procs.is_empty() {
                break;
            }
        }

        self.drain_all(true);
        for p in self.procs.values_mut() {
            p.stream.finish();
        }

        self.close_probes();
        if self.lost > 0 {
            eprintln!(
                "mtrace: up to {} calls were not recorded (the kernel's buffers overflowed before the tracer read \
                 them): counts and leaks may be off by as many; --hooks breakpoints records every call",
                self.lost
            );
        }
        stats::print();
        Ok(outcome.unwrap_or(Outcome::Exited(0)))
    }

    /// A stop of `tid` at a breakpoint (or the program's own SIGTRAP).
    fn trap(&mut self, tid: Pid) {
        // A probe that stops its thread after its sample (perf.rs
        // `Spec::stop`): the sample was handled at this stop (run's
        // drain), with the thread's memory as the sample left it; the
        // signal is the tracer's, never the program's.
        if self.opener.is_some()
            && ptrace::getsiginfo(tid).is_ok_and(|i| i.si_code == crate::perf::TRAP_PERF && i.si_signo == libc::SIGTRAP)
        {
            return resume(tid, None);
        }
        let Some((pid, th)) = self.threads.get_mut(&tid) else { return resume(tid, Some(Signal::SIGTRAP)) };
        let Some(p) = self.procs.get_mut(pid) else { return resume(tid, None) };
        let Ok(mut r) = target::regs(tid) else { return resume(tid, None) };
        let at = arch::trapped_at(r.ip());
        if at == p.trampoline && at != 0 {
            let now = p.stream.now();
            if calls::returned(p, th, tid, &mut r, crate::target::Stack::Live, now) {
                let _ = target::set_regs(tid, &r);
                return resume(tid, None);
            }
        } else if let Some(api) = p.api_at(at) {
            return self.api_call(tid, api, r);
        } else if let Some(b) = p.breakpoints.get(&at).copied() {
            p.sample(tid.as_raw() as u32);
            p.patch_api_after_relocation(tid);
            let hook = Hook { at: b.at, call: b.call, module: b.module };
            let at = calls::Entry { regs: &r, stack: crate::target::Stack::Live, time: p.stream.now() };
            let reload = calls::entry(p, th, tid, &hook, &at, &self.opts.recording, &mut self.frames);
            if reload {
                let mut signals = Vec::new();
                if let Err(e) = p.update_modules(tid, &mut signals) {
                    eprintln!("mtrace: {e:#}");
                }
            }
            r.set_ip(b.displaced);
            let _ = target::set_regs(tid, &r);
            if reload {
                let pid = p.pid;
                self.request_process(pid);
            }
            return self.hold_or_resume(tid, None);
        }
        resume(tid, Some(Signal::SIGTRAP))
    }

    fn event(&mut self, tid: Pid, ev: i32) {
        let new = || ptrace::getevent(tid).ok().map(|n| Pid::from_raw(n as i32));
        match ev {
            e if e == Event::PTRACE_EVENT_EXEC as i32 => self.exec(tid),
            e if e == Event::PTRACE_EVENT_CLONE as i32 => {
                if let (Some(child), Some(&(pid, _))) = (new(), self.threads.get(&tid)) {
                    self.threads.insert(child, (pid, Thread::default()));
                    self.request(child);
                    if self.early.remove(&child) {
                        self.hold_or_resume(child, None);
                    }
                }
                resume(tid, None);
            }
            e if e == Event::PTRACE_EVENT_FORK as i32 || e == Event::PTRACE_EVENT_VFORK as i32 => {
                if let Some(child) = new() {
                    self.fork(tid, child);
                }
                resume(tid, None);
            }
            e if e == Event::PTRACE_EVENT_EXIT as i32 => {
                self.exiting(tid);
                resume(tid, None);
            }
            e if e == Event::PTRACE_EVENT_STOP as i32 => {
                if self.threads.contains_key(&tid) {
                    // A group stop (SIGSTOP and the like): the program goes
                    // on; job control is not kept under --ptrace. (A new
                    // thread's first stop: it goes on once its probes are
                    // open.)
                    self.hold_or_resume(tid, None);
                } else {
                    // A new thread or child before the event naming it.
                    self.early.insert(tid);
                }
            }
            _ => resume(tid, None),
        }
    }

    /// `tid`'s process exec'd: its image's stream ends, the new image's
    /// starts (the thread is now the process's only one, its id the pid).
    fn exec(&mut self, tid: Pid) {
        let pid = self.threads.get(&tid).map_or(tid, |t| t.0);
        // The old image's probes (events outlive an exec).
        for t in self.threads_of(pid).into_iter().chain([tid]) {
            self.retire(t);
        }
        let ppid = match self.procs.remove(&pid) {
            Some(mut old) => {
                // The image it became (the exec is done: its executable).
                if let Ok(path) = std::fs::read_link(format!("/proc/{}/exe", pid.as_raw())) {
                    let time_ns = old.stream.now();
                    let path = path.to_string_lossy().into_owned();
                    old.stream.record(tid.as_raw() as u32, &mtrace_format::Record::Exec { time_ns, path });
                }
                old.stream.end(tid.as_raw() as u32, EndReason::Exec);
                parent_of(pid)
            }
            None => parent_of(pid),
        };
        self.threads.retain(|_, (p, _)| *p != pid);
        let mut signals = Vec::new();
        match Process::exec(pid, ppid, self.opts.output(), self.opener.is_some(), &mut signals) {
            Ok(mut p) => {
                p.sample_at(self.opts.recording.sample_rate);
                self.procs.insert(pid, p);
                self.threads.insert(pid, (pid, Thread::default()));
                self.request(pid);
            }
            Err(e) => eprintln!("mtrace: process {pid} is not traced: {e:#}"),
        }
        self.hold_or_resume(pid, signals.first().copied());
    }

    /// Thread `tid` forked `child`.
    fn fork(&mut self, tid: Pid, child: Pid) {
        let Some((pid, th)) = self.threads.get(&tid) else { return };
        let Some(parent) = self.procs.get(pid) else { return };
        match Process::fork(parent, child, self.opts.output()) {
            Ok(p) => {
                // Only the forking thread lives on in the child, inside the
                // same calls.
                let copy =
                    Thread { outer: th.outer, pending: th.pending.clone(), exit_call: None, sampling: th.sampling };
                self.procs.insert(child, p);
                self.threads.insert(child, (child, copy));
                self.request(child);
            }
            Err(e) => eprintln!("mtrace: process {child} is not traced: {e:#}"),
        }
        if self.early.remove(&child) {
            self.hold_or_resume(child, None);
        }
    }

    /// The report signal `sig` (`MTRACE_REPORT_SIGNAL`) came for thread
    /// `tid`: a report point when its process would be killed by it
    /// (reports.rs); false to deliver it.
    fn report_point(&mut self, tid: Pid, sig: Signal) -> bool {
        let Some(&(pid, _)) = self.threads.get(&tid) else { return false };
        if !reports::default_disposition(pid, sig as i32) {
            return false;
        }
        let Some(p) = self.procs.get_mut(&pid) else { return false };
        if p.stream.is_live() {
            // No file for a report to read: as the preload, which
            // installs no handler then.
            return false;
        }
        p.reports += 1;
        let dir = self.opts.recording.report_dir.as_deref();
        reports::point(&mut p.stream, reports::Point { tid, pid, seq: p.reports, dir }, marker::SIGNAL, true);
        true
    }

    /// The scan signal came for thread `tid` (`MTRACE_SCAN_SIGNAL`): when
    /// its process would be killed by it, every thread of the process is
    /// stopped, the leak scan's snapshot taken, and a report point of it
    /// written (a memlog of everything live, classified), as the
    /// preload's; false to deliver it.
    fn scan_point(&mut self, tid: Pid, sig: Signal) -> bool {
        let Some(&(pid, _)) = self.threads.get(&tid) else { return false };
        if !reports::default_disposition(pid, sig as i32) || self.procs.get(&pid).is_none_or(|p| p.stream.is_live()) {
            return false;
        }
        let Ok(r) = target::regs(tid) else { return false };
        let others: Vec<Pid> = self.threads_of(pid).into_iter().filter(|&t| t != tid).collect();
        let stopped = self.interrupt_all(&others);
        if let Some(p) = self.procs.get_mut(&pid) {
            let mut threads = vec![snapshot::interrupted(tid, r)];
            threads.extend(stopped.iter().map(|&(t, r, _)| snapshot::interrupted(t, r)));
            if snapshot_now(p, pid, &threads) {
                p.reports += 1;
                let dir = self.opts.recording.report_dir.as_deref();
                reports::point(&mut p.stream, reports::Point { tid, pid, seq: p.reports, dir }, marker::SCAN, false);
            }
        }
        resume_interrupted(stopped);
        true
    }

    /// Stops `tids` (PTRACE_INTERRUPT) and returns their registers and
    /// whether each was held stopped already (under uprobes, until its
    /// probes are open: it stays so). Two seconds at most
    /// ([`Tracer::stops_at`]); a thread that did not stop by then is left
    /// out.
    fn interrupt_all(&mut self, tids: &[Pid]) -> Vec<(Pid, arch::Regs, bool)> {
        let mut got = Vec::new();
        let mut waiting = Vec::new();
        for &t in tids {
            if self.held.get(&t).is_some_and(|h| h.stopped.is_some()) {
                if let Ok(r) = target::regs(t) {
                    got.push((t, r, true));
                }
            } else if ptrace::interrupt(t).is_ok() {
                waiting.push(t);
            }
        }
        let stopped = self.stops_at(waiting, Event::PTRACE_EVENT_STOP, std::time::Duration::from_secs(2));
        got.extend(stopped.into_iter().map(|(t, r)| (t, r, false)));
        got
    }

    /// Waits (`limit` at most) until each of `waiting` reports `event`, and
    /// returns their registers there, the threads left stopped. The stops
    /// that come first are handled as usual (a breakpoint's, a signal's,
    /// another event); a thread that ends meanwhile, or whose registers
    /// cannot be read, is left out.
    fn stops_at(&mut self, mut waiting: Vec<Pid>, event: Event, limit: std::time::Duration) -> Vec<(Pid, arch::Regs)> {
        let mut got = Vec::new();
        let until = std::time::Instant::now() + limit;
        while !waiting.is_empty() && std::time::Instant::now() < until {
            let mut moved = false;
            for i in (0..waiting.len()).rev() {
                let t = waiting[i];
                let st = waitpid(t, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG));
                moved |= !matches!(st, Ok(WaitStatus::StillAlive));
                if let Ok(st) = &st {
                    target::at_stop(st);
                }
                match st {
                    Ok(WaitStatus::StillAlive) => {}
                    Ok(WaitStatus::PtraceEvent(_, _, ev)) if ev == event as i32 => {
                        waiting.swap_remove(i);
                        match target::regs(t) {
                            Ok(r) => got.push((t, r)),
                            Err(_) => resume(t, None),
                        }
                    }
                    // A breakpoint's stop, handled (an interrupt stays pending).
                    Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => self.trap(t),
                    Ok(WaitStatus::Stopped(_, sig)) => resume(t, Some(sig)),
                    Ok(WaitStatus::PtraceEvent(_, _, ev)) => self.event(t, ev),
                    Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) | Err(_) => {
                        waiting.swap_remove(i);
                        self.gone(t, EndReason::Exit(None));
                    }
                    Ok(_) => resume(t, None),
                }
            }
            if !moved {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        got
    }

    /// Thread `tid` stopped on its way out (`PTRACE_EVENT_EXIT`). When its
    /// process ends with it (an `exit_group`, a fatal signal, its last
    /// thread's exit), the leak scan's snapshot is taken now, once per
    /// process image, while all its memory is still there, with the other
    /// threads at their own exit stops; else its stack is dead from now on.
    fn exiting(&mut self, tid: Pid) {
        if !self.opts.recording.scan && self.scan_signal.is_none() {
            return;
        }
        let Some(&(pid, _)) = self.threads.get(&tid) else { return };
        let others: Vec<Pid> = self.threads_of(pid).into_iter().filter(|&t| t != tid).collect();
        let Ok(r) = target::regs(tid) else { return };
        // The wait status the thread exits with: a signal in its low bits.
        let status = ptrace::getevent(tid).unwrap_or(0);
        let ends = r.0.orig_rax == libc::SYS_exit_group as u64 || status & 0x7f != 0 || others.is_empty();
        {
            let Some(p) = self.procs.get_mut(&pid) else { return };
            if p.scanned {
                return;
            }
            if !ends {
                // glibc hands a cached stack to the next thread: once each.
                if let Some(d) = snapshot::dead_stack(pid, &r).filter(|d| !p.dead_stacks.contains(d)) {
                    p.dead_stacks.push(d);
                }
                return;
            }
            if !self.opts.recording.scan {
                return;
            }
            p.scanned = true;
        }
        let stopped = |t: Pid, r: arch::Regs, th: Option<&calls::Thread>| match th.and_then(|th| th.exit_call) {
            Some(at_exit) => snapshot::calling_exit(t, at_exit),
            None => snapshot::interrupted(t, r),
        };
        let mut threads = vec![stopped(tid, r, self.threads.get(&tid).map(|t| &t.1))];
        // The others, which the process's end is killing, at their own
        // exit stops (a second at most).
        for (t, r) in self.stops_at(others, Event::PTRACE_EVENT_EXIT, std::time::Duration::from_secs(1)) {
            threads.push(stopped(t, r, self.threads.get(&t).map(|t| &t.1)));
        }
        let Some(p) = self.procs.get_mut(&pid) else { return };
        let image = snapshot::image(pid, p.static_exe);
        let dead = std::mem::take(&mut p.dead_stacks);
        let started = std::time::Instant::now();
        match snapshot::take(&mut p.stream, pid, &threads, &dead, image) {
            Ok(w) => stats::scanned(w.bytes, started),
            Err(e) => eprintln!("mtrace: no leak scan of process {pid}: {e:#}"),
        }
        for &(t, _, _) in &threads[1..] {
            resume(t, None);
        }
    }

    /// Thread `tid` is gone: its process ends with it when it was the last.
    fn gone(&mut self, tid: Pid, reason: EndReason) {
        self.retire(tid);
        let Some((pid, _)) = self.threads.remove(&tid) else { return };
        if tid == pid {
            if let Some(mut p) = self.procs.remove(&pid) {
                p.stream.end(tid.as_raw() as u32, reason);
            }
        }
    }

    /// Leaves every process running untraced: each thread stopped, the
    /// breakpoints' bytes and the replaced return addresses put back.
    fn detach_all(&mut self) {
        let tids: Vec<Pid> = self.threads.keys().copied().collect();
        // Threads held stopped report no other stop.
        let mut stopped: HashSet<Pid> =
            self.held.iter().filter(|(_, h)| h.stopped.is_some()).map(|(t, _)| *t).collect();
        let mut signals: HashMap<Pid, Signal> = HashMap::default();
        for (&tid, h) in &self.held {
            if let Some(Some(sig)) = h.stopped {
                signals.insert(tid, sig);
            }
        }
        for &tid in &tids {
            if !stopped.contains(&tid) {
                let _ = ptrace::interrupt(tid);
            }
        }
        // Each thread reports a stop (its interrupt, or an event before it).
        while stopped.len() < tids.len() {
            let st = waitpid(None, Some(WaitPidFlag::__WALL));
            if let Ok(st) = &st {
                target::at_stop(st);
            }
            match st {
                Ok(WaitStatus::Stopped(tid, sig)) => {
                    if sig == Signal::SIGTRAP {
                        self.unstep(tid);
                    } else {
                        signals.insert(tid, sig);
                    }
                    stopped.insert(tid);
                }
                Ok(WaitStatus::PtraceEvent(tid, _, _)) => {
                    stopped.insert(tid);
                }
                Ok(WaitStatus::Exited(tid, _)) | Ok(WaitStatus::Signaled(tid, _, _)) => {
                    self.gone(tid, EndReason::Detach);
                    stopped.insert(tid);
                }
                Ok(_) => {}
                Err(Errno::EINTR) => {}
                Err(_) => break,
            }
        }
        self.drain_all(true);
        if self.opts.scan_at_detach {
            self.scan_at_detach();
        }
        // Closing the events takes the uprobes out; the kernel's return
        // probes still pending return through its trampoline as before.
        let uprobes = self.opener.is_some();
        self.close_probes();
        for (tid, (pid, th)) in self.threads.iter_mut() {
            if !uprobes {
                calls::restore_returns(th, *tid);
            }
            if let Some(p) = self.procs.get_mut(pid) {
                p.remove_breakpoints(*tid);
            }
        }
        for p in self.procs.values_mut() {
            p.stream.end(p.pid.as_raw() as u32, EndReason::Detach);
        }
        for &tid in self.threads.keys() {
            let _ = ptrace::detach(tid, signals.get(&tid).copied());
        }
    }

    /// `attach --ptrace --scan`: every process's snapshot at the detach,
    /// its threads all stopped, followed by a `scan` marker (an on-demand
    /// scan, which the report of a stream ended by a detach keeps).
    fn scan_at_detach(&mut self) {
        let pids: Vec<Pid> = self.procs.keys().copied().collect();
        for pid in pids {
            let threads: Vec<snapshot::Stopped> = self
                .threads_of(pid)
                .into_iter()
                .filter_map(|t| target::regs(t).ok().map(|r| snapshot::interrupted(t, r)))
                .collect();
            let Some(p) = self.procs.get_mut(&pid) else { continue };
            let image = snapshot::image(pid, p.static_exe);
            let dead = p.dead_stacks.clone();
            let started = std::time::Instant::now();
            match snapshot::take(&mut p.stream, pid, &threads, &dead, image) {
                Ok(w) => {
                    stats::scanned(w.bytes, started);
                    p.reports += 1;
                    let time_ns = p.stream.now();
                    let name = marker::SCAN.to_owned();
                    p.stream.record(pid.as_raw() as u32, &Record::Marker { time_ns, seq: p.reports, name });
                }
                Err(e) => eprintln!("mtrace: no leak scan of process {pid}: {e:#}"),
            }
        }
    }

    /// A thread that trapped at a breakpoint while the tracer was leaving:
    /// it goes on from the function's first instruction, put back.
    fn unstep(&mut self, tid: Pid) {
        let Some((pid, th)) = self.threads.get_mut(&tid) else { return };
        let Some(p) = self.procs.get_mut(pid) else { return };
        let Ok(mut r) = target::regs(tid) else { return };
        let at = arch::trapped_at(r.ip());
        let now = p.stream.now();
        if at == p.trampoline && at != 0 && calls::returned(p, th, tid, &mut r, crate::target::Stack::Live, now) {
            let _ = target::set_regs(tid, &r);
        } else if p.breakpoints.contains_key(&at) {
            r.set_ip(at);
            let _ = target::set_regs(tid, &r);
        }
    }
}

/// Resumes a stopped thread, delivering `sig`.
/// The leak scan's snapshot of process `pid` (`p`), with `threads`'
/// registers and stacks, into its stream; false, with a line on stderr,
/// when it could not be taken.
fn snapshot_now(p: &mut Process, pid: Pid, threads: &[snapshot::Stopped]) -> bool {
    let image = snapshot::image(pid, p.static_exe);
    let dead = p.dead_stacks.clone();
    let started = std::time::Instant::now();
    match snapshot::take(&mut p.stream, pid, threads, &dead, image) {
        Ok(w) => {
            stats::scanned(w.bytes, started);
            true
        }
        Err(e) => {
            eprintln!("mtrace: no leak scan of process {pid}: {e:#}");
            false
        }
    }
}

/// Lets the threads [`Tracer::interrupt_all`] stopped go on (not those
/// that were held stopped already).
fn resume_interrupted(stopped: Vec<(Pid, arch::Regs, bool)>) {
    for (t, _, held) in stopped {
        if !held {
            resume(t, None);
        }
    }
}

fn resume(tid: Pid, sig: Option<Signal>) {
    let _ = ptrace::cont(tid, sig);
}
