//! The uprobe hooks: instead of a breakpoint the tracer handles (two
//! context switches per stop), a kernel uprobe on each interposed function
//! and a return probe on those whose result counts. The thread that hits
//! one does not stop: the kernel writes its registers and the top of its
//! stack to the thread's ring (`perf`), and the tracer reads the rings
//! while the program runs, unwinding each backtrace from the stack copy.
//! The call logic (`calls`) is the same for both kinds of hooks.
//!
//! Each thread has its own events on the shared definitions (`tracefs`),
//! all written to one ring per thread, so its records come in its program
//! order. They are opened when the tracer sees the thread appear
//! (PTRACE_EVENT_CLONE, a fork, an exec) before it runs, and for every
//! thread when the dynamic loader maps a new module. Opening waits on a
//! kernel lock that another tracer's closes may hold for seconds, so it
//! is done by a thread of its own (`Opener`): the thread it is for stays
//! stopped meanwhile, and the tracer goes on reading the other rings.
//!
//! The kernel does not wait for the tracer: a full ring drops samples.
//! So the rings are read by a thread that does nothing else (`Reader`,
//! real-time priority), which copies each record out into memory; the
//! tracer handles the copies at its own pace (the first backtraces through
//! a big module take it 200 µs each while framehop reads the unwind
//! tables: long enough, before the reader, to overflow an 8 MiB ring).

use std::collections::VecDeque;
use std::ffi::CString;
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use rustc_hash::FxHashMap as HashMap;

use crate::arch;
use crate::funcs::Call;
use crate::perf::{self, Event, Rec, Ring};
use crate::tracefs::Defs;

/// An interposed function probed in a process.
#[derive(Clone, Debug)]
pub struct Point {
    /// Its address in the process.
    pub at: u64,
    pub call: Call,
    /// [start, end) of the module that defines it.
    pub module: (u64, u64),
    /// The file and the offset in it of its first instruction.
    pub path: Arc<CString>,
    pub offset: u64,
}

/// What each probe copies of the stack.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Stack bytes copied at an allocation's entry (for its backtrace).
    pub stack: u32,
    /// At a free's: enough to see whether it is nested in another call,
    /// or `stack` when frees record their backtraces (`-S`).
    pub free_stack: u32,
}

/// Stack bytes copied at an allocation's entry, from the stack pointer up:
/// as many as the breakpoint tracer reads at once.
const STACK: u32 = 16 << 10;
/// At a free's entry without -S; at posix_memalign's return (its `*out`
/// is usually the caller's local; where it is not, the thread stops at
/// that return: [`perf::Spec::stop`]).
const SMALL_STACK: u32 = 2 << 10;

/// The stack bytes an allocation's probe copies: `MTRACE_PTRACE_STACK`
/// (bytes, 1024 to 65528, a multiple of 8: perf's limits) or [`STACK`].
/// More gives whole backtraces through deeper frames (the walk stops where
/// the copy ends); less costs the program less at each call. A bad value
/// gets one warning and the default.
fn stack_bytes() -> u32 {
    let Some(v) = std::env::var_os(mtrace_format::settings::PTRACE_STACK.name()) else { return STACK };
    match v.to_str().and_then(|v| v.parse::<u32>().ok()) {
        Some(n) if (1024..=65528).contains(&n) && n % 8 == 0 => n,
        _ => {
            eprintln!("mtrace: MTRACE_PTRACE_STACK={v:?} is not a multiple of 8 from 1024 to 65528; using {STACK}");
            STACK
        }
    }
}

/// Whether a call's result counts: it gets a return probe.
fn returns(call: Call) -> bool {
    matches!(
        call,
        Call::Alloc { .. } | Call::Calloc | Call::PosixMemalign | Call::Realloc { .. } | Call::Mmap | Call::Mremap
    )
}

/// One probe a thread needs: the point's index, a return probe, where.
struct Want {
    point: usize,
    ret: bool,
    path: Arc<CString>,
    offset: u64,
    stack: u32,
    /// The thread stops after the sample (posix_memalign's return: its
    /// `*out`, a global as often as a local, is read then, before the
    /// program can change it; read after, families.c's was already
    /// `keep[i] ^ 1`, the block recorded one byte off).
    stop: bool,
}

/// A request to the opener: thread `tid`'s events for these probes, sent
/// to the ring of `ring` (the thread's, if it has one already).
struct Request {
    tid: i32,
    wants: Vec<Want>,
    ring: Option<std::os::fd::OwnedFd>,
    /// Data pages of a new ring ([`perf::MAIN_RING_PAGES`] for a
    /// process's main thread).
    pages: usize,
}

/// What the opener made for a request: the events (point, return probe,
/// event), the thread's new ring if it had none (mapping one takes
/// milliseconds), and what could not be opened.
pub struct Opened {
    pub tid: i32,
    events: Vec<(usize, bool, Event)>,
    ring: Option<Ring>,
    pub errors: Vec<String>,
}

impl Opened {
    /// Its events (at the end: to be closed).
    pub fn into_events(self) -> Vec<Event> {
        self.events.into_iter().map(|(_, _, e)| e).collect()
    }

    /// Opens what `r` asks for.
    fn make(r: Request, defs: &mut Defs) -> Opened {
        let mut out = Opened { tid: r.tid, events: Vec::new(), ring: None, errors: Vec::new() };
        for w in r.wants {
            let t = std::time::Instant::now();
            let e = defs.id(&w.path, w.offset, w.ret).and_then(|id| {
                let spec = perf::Spec { id, stack: w.stack, regs: arch::PERF_REGS, stop: w.stop };
                let e = perf::open(r.tid, &spec)?;
                match (&r.ring, &out.ring) {
                    (Some(fd), _) => perf::redirect(&e, fd.as_fd())?,
                    (None, Some(ring)) => ring.redirect(&e)?,
                    (None, None) => out.ring = Some(Ring::new(&e, r.pages).context("mapping the ring")?),
                }
                Ok(e)
            });
            crate::stats::add(&crate::stats::OPEN_NS, t);
            crate::stats::OPENS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match e {
                Ok(e) => out.events.push((w.point, w.ret, e)),
                Err(e) => out.errors.push(format!("{}:{:#x}: {e:#}", w.path.to_string_lossy(), w.offset)),
            }
        }
        out
    }
}

/// The opener thread: defines the probes and opens the events, in the
/// order asked; the tracer collects what it made.
pub struct Opener {
    reader: Reader,
    to: mpsc::Sender<Request>,
    from: mpsc::Receiver<Opened>,
    /// The definitions, handed back when the opener ends.
    done: Option<std::thread::JoinHandle<Defs>>,
    pub cfg: Config,
}

impl Opener {
    /// Starts the opener, once tracefs is known to work here. Errors: no
    /// tracefs or uprobe events, or not root.
    pub fn start(check_frees: bool) -> Result<Opener> {
        // Errors here (no tracefs, not root), not in the middle of a run.
        let mut defs = Defs::new()?;
        let (to, requests) = mpsc::channel::<Request>();
        let (made, from) = mpsc::channel();
        let done = std::thread::Builder::new().name("mtrace-opener".into()).spawn(move || {
            for r in requests {
                if made.send(Opened::make(r, &mut defs)).is_err() {
                    break;
                }
            }
            defs
        })?;
        let stack = stack_bytes();
        let free_stack = if check_frees { stack } else { SMALL_STACK.min(stack) };
        let reader = Reader::start()?;
        Ok(Opener { reader, to, from, done: Some(done), cfg: Config { stack, free_stack } })
    }

    /// Asks for thread `tid`'s events for the points of `points` it has
    /// none for yet (`main`: the thread is its process's first, which gets
    /// a larger ring); `false` if there were none to ask for.
    pub fn request(&self, tid: i32, main: bool, probes: &mut Probes, points: &[Point]) -> bool {
        let mut wants = Vec::new();
        // (The loader's `_dl_debug_state` is never a point: it stays a
        // breakpoint, process.rs.)
        for (i, p) in points.iter().enumerate().skip(probes.asked) {
            let stack = match p.call {
                Call::Free { .. } | Call::Munmap => self.cfg.free_stack,
                _ => self.cfg.stack,
            };
            let stop = |ret| ret && p.call == Call::PosixMemalign;
            let w = |ret, stack| Want { point: i, ret, path: p.path.clone(), offset: p.offset, stack, stop: stop(ret) };
            wants.push(w(false, stack));
            if returns(p.call) {
                wants.push(w(true, if p.call == Call::PosixMemalign { SMALL_STACK } else { 0 }));
            }
        }
        probes.asked = points.len();
        let ring = probes.ring.as_ref().and_then(|r| r.shared.fd.try_clone().ok());
        let pages = if main { perf::MAIN_RING_PAGES } else { perf::RING_PAGES };
        !wants.is_empty() && self.to.send(Request { tid, wants, ring, pages }).is_ok()
    }

    /// What the opener made since the last call.
    pub fn made(&self) -> Vec<Opened> {
        self.from.try_iter().collect()
    }

    /// Takes in the events (and ring) the opener made for a thread: its
    /// ring goes to the reader.
    pub fn add(&self, probes: &mut Probes, o: Opened) {
        if let (None, Some(ring)) = (&probes.ring, o.ring) {
            let Ok(fd) = ring.fd().try_clone_to_owned() else { return };
            let shared =
                Arc::new(Shared { ring: Mutex::new(ring), fd, bytes: Default::default(), spare: Default::default() });
            let (to, from) = mpsc::channel();
            if let Ok(mut list) = self.reader.added.list.lock() {
                list.push(Copying { shared: shared.clone(), to: to.clone() });
            }
            probes.ring = Some(Channel { shared, from, to });
        }
        for (point, ret, e) in o.events {
            probes.ids.insert(e.id, (point, ret));
            probes.events.push(e);
        }
    }

    /// Waits for what the opener is still making (at the end), and for
    /// the reader to let go of the rings the probes retired.
    pub fn finish(mut self) -> (Vec<Opened>, Option<Defs>) {
        let Opener { to, from, done, reader, .. } = &mut self;
        drop(std::mem::replace(to, mpsc::channel().0));
        let defs = done.take().and_then(|d| d.join().ok());
        reader.stop();
        (from.try_iter().collect(), defs)
    }
}

/// A ring shared by the reader, which copies out of it, and the thread's
/// probes, which take the copies.
///
/// The reader never waits for the tracer's threads: they run at normal
/// priority, and a real-time thread that waits by spinning keeps them off
/// its CPU, so the wait lasts until the kernel lends them some time (the
/// reader spun in `sched_yield` inside a channel's `try_recv` for 30–107
/// ms, while the tracer, between claiming a slot of the channel of spare
/// batches and writing it, waited for the CPU cc1plus held: `perf record
/// -a -g` of `mtrace run --ptrace --hooks uprobes -- g++ …`; every lost
/// sample of that run fell in such a pause). So the copies travel on a
/// channel the reader only sends on, and what the tracer gives the reader
/// (rings, spare batches) waits behind locks the reader only tries: what
/// is locked now waits for the next round. Batches handled go back to the
/// reader to be filled again, so that it neither allocates nor page-faults
/// (a fault waits for the address space lock, which the tracer's unmapping
/// of a freed batch held: the reader stalled 23 ms so).
struct Shared {
    /// Tried by the reader for a round of copying, locked by the tracer
    /// only to read a thread's last samples at a stop ([`Probes::take`]).
    ring: Mutex<Ring>,
    /// The ring's descriptor, for more events of the thread.
    fd: std::os::fd::OwnedFd,
    /// Copied bytes not taken yet.
    bytes: std::sync::atomic::AtomicUsize,
    /// Batches handled, for the reader to fill again.
    spare: Mutex<Vec<perf::Batch>>,
}

/// The reader's end of a ring.
struct Copying {
    shared: Arc<Shared>,
    to: mpsc::Sender<perf::Batch>,
}

/// Rings for the reader to take, and whether no more will come.
#[derive(Default)]
struct Added {
    list: Mutex<Vec<Copying>>,
    closed: std::sync::atomic::AtomicBool,
}

/// The reader thread: copies the rings' records out as they come.
struct Reader {
    added: Arc<Added>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Reader {
    /// Ends the reader and waits for it: it unmaps and closes the rings
    /// nobody else holds. Those must be gone while this process runs on:
    /// a ring's mapping holds its probe's event, and when the last one of
    /// a probe goes at the process's exit, with SIGKILL pending in every
    /// thread, the kernel cannot write the function's first byte back
    /// (its page lookup gives up on a fatal signal). It says "failed to
    /// unregister, leaking uprobe" and leaves the breakpoint instruction
    /// in the program until the function's next call (measured: 3 of 6
    /// runs of analyzer/tests/ptrace_again.rs, where a breakpoints
    /// attach then waited for that byte in an idle program).
    fn stop(&mut self) {
        self.added.closed.store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Reader {
    fn start() -> Result<Reader> {
        let added = Arc::new(Added::default());
        let to_reader = added.clone();
        let thread = std::thread::Builder::new().name("mtrace-reader".into()).spawn(move || {
            let added = to_reader;
            perf::raise_priority();
            let mut rings: Vec<Copying> = Vec::new();
            let mut open = true;
            let mut last = std::time::Instant::now();
            while open || !rings.is_empty() {
                let now = std::time::Instant::now();
                crate::stats::READER_GAP_NS
                    .fetch_max((now - last).as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
                last = now;
                // Closed: the last rings are taken whatever it waits.
                if added.closed.load(std::sync::atomic::Ordering::Acquire) {
                    open = false;
                    if let Ok(mut l) = added.list.lock() {
                        rings.append(&mut l);
                    }
                } else if let Ok(mut l) = added.list.try_lock() {
                    rings.append(&mut l);
                }
                // A ring its thread's probes let go of is done.
                rings.retain(|r| Arc::strong_count(&r.shared) > 1);
                let mut got = 0;
                for r in &rings {
                    let spare = r.shared.spare.try_lock().ok().and_then(|mut s| s.pop());
                    got += copy_round(&r.shared, &r.to, spare.unwrap_or_default(), false);
                }
                if got == 0 {
                    if !open {
                        break;
                    }
                    // Not poll(): a ring whose thread ended reports POLLHUP
                    // at once, and this real-time thread would spin.
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
        })?;
        Ok(Reader { added, thread: Some(thread) })
    }
}

/// Copies what `shared`'s ring holds into `batch` and sends it on `to`,
/// the ring locked throughout (so that batches arrive in the ring's
/// order, whoever copies); the bytes copied. Unless `wait`, a ring locked
/// now is left for the next round (see [`Shared`]).
fn copy_round(shared: &Shared, to: &mpsc::Sender<perf::Batch>, mut batch: perf::Batch, wait: bool) -> usize {
    batch.data.clear();
    batch.records.clear();
    let ring = if wait { shared.ring.lock().ok() } else { shared.ring.try_lock().ok() };
    let Some(mut ring) = ring else { return 0 };
    let n = ring.copy_out(&mut batch);
    if n > 0 {
        shared.bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        let _ = to.send(batch);
    }
    n
}

/// One sample, decoded, read in place from the ring.
// One at a time, on the stack: the registers are not worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Hit<'a> {
    /// Point `point`'s entry (`ret`: its return), at CLOCK_MONOTONIC
    /// `time` ns, with the registers and the stack copy.
    Call { point: usize, ret: bool, time: u64, regs: arch::Regs, stack: &'a [u8] },
    /// Samples the kernel dropped (the ring was full).
    Lost(u64),
}

/// The tracer's end of a thread's ring.
struct Channel {
    shared: Arc<Shared>,
    from: mpsc::Receiver<perf::Batch>,
    /// To send what the tracer copies itself at a stop, in order.
    to: mpsc::Sender<perf::Batch>,
}

/// A thread's probes, their ring, and the records copied out of it.
#[derive(Default)]
pub struct Probes {
    events: Vec<Event>,
    ring: Option<Channel>,
    /// Event id → (the point's index, a return probe).
    ids: HashMap<u64, (usize, bool)>,
    /// Points asked for: the process's first `asked`.
    asked: usize,
    /// Batches taken from the reader, being handled, and the next record
    /// of the first.
    batches: VecDeque<perf::Batch>,
    at: usize,
}

impl Probes {
    /// Takes the records the reader copied so far (with `all`, also what
    /// the ring holds now: at a stop of the thread, so that nothing it did
    /// before is left behind); the bytes now waiting here to be handled.
    pub fn take(&mut self, all: bool) -> usize {
        if let Some(c) = &self.ring {
            if all {
                copy_round(&c.shared, &c.to, perf::Batch::default(), true);
            }
            for b in c.from.try_iter() {
                c.shared.bytes.fetch_sub(b.data.len(), std::sync::atomic::Ordering::Relaxed);
                self.batches.push_back(b);
            }
        }
        self.batches.iter().map(|b| b.data.len()).sum()
    }

    /// The bytes copied and not taken yet.
    pub fn backlog(&self) -> usize {
        self.ring.as_ref().map_or(0, |c| c.shared.bytes.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The first record not handled: (kind, body).
    fn front(&self) -> Option<(u32, &[u8])> {
        self.batches.front()?.get(self.at)
    }

    /// The time of the next sample taken (0 for a loss: it comes first).
    pub fn next_time(&self) -> Option<u64> {
        let (kind, body) = self.front()?;
        match perf::parse(kind, body) {
            Some(Rec::Sample { time, .. }) => Some(time),
            _ => Some(0),
        }
    }

    /// The next sample taken (`None` for one of no event of this thread's).
    pub fn next(&self) -> Option<Hit<'_>> {
        let (kind, body) = self.front()?;
        match perf::parse(kind, body) {
            Some(Rec::Lost(n)) => Some(Hit::Lost(n)),
            Some(Rec::Sample { id, time, regs, stack }) => {
                let &(point, ret) = self.ids.get(&id)?;
                Some(Hit::Call { point, ret, time, regs: arch::Regs::from_perf(regs)?, stack })
            }
            // Too short for its layout.
            None => Some(Hit::Lost(1)),
        }
    }

    /// Steps past the sample [`Probes::next`] returned.
    pub fn advance(&mut self) {
        self.at += 1;
        if self.batches.front().is_some_and(|b| self.at >= b.records.len()) {
            self.at = 0;
            if let (Some(b), Some(c)) = (self.batches.pop_front(), &self.ring) {
                // Back to the reader rather than freed here: a free of its
                // memory takes its malloc arena's lock.
                if let Ok(mut spare) = c.shared.spare.lock() {
                    spare.push(b);
                }
            }
        }
    }

    /// Lets the ring go (the reader unmaps it) and hands back the events,
    /// to be closed later ([`perf::close_detached`]): the last close of a
    /// probe waits.
    pub fn retire(mut self) -> Vec<Event> {
        self.ring = None;
        std::mem::take(&mut self.events)
    }
}
