//! Books kept while a stream arrives: a thread follows a trace file that
//! another thread is still writing (the stream of `mtrace client`,
//! `attach`, `run -i`) and enters each record as it comes, so the
//! console's commands read books that are already there instead of
//! reading the whole trace again.
//!
//! Two waits make the answers exact:
//! - [`LiveBooks::with`] first waits until the books hold every record in
//!   the file at the moment of the call ("everything saved so far");
//! - [`LiveBooks::at_next_marker`] holds the follower at a marker the
//!   console asked the process for (a report point, a scan), so a report
//!   describes that moment and not the moment its answer was written.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use mtrace_format::{Reader, Record};
use rustc_hash::FxHashMap as HashMap;

use mtrace_format::protocol::marker;

use super::{Flow, Keeper};
use crate::books::LiveTotals;
use crate::trace::{Trace, Window};

/// A process with one thread has no writer thread of mtrace's: it carries
/// out a command at its next allocation call or free (docs/PROCESSES.md).
const SOLO: &str = "one with a single thread answers at its next allocation call or free";
/// How long a command waits before the console says what it waits for.
const WAIT_NOTE: Duration = Duration::from_secs(2);

/// Marker names whose live totals per backtrace are kept when they pass
/// (the latest of each name): the console's report points and resets.
pub const BASELINE_MARKERS: &[&str] = &[marker::REPORT, marker::RESET];

/// How long the follower sleeps when it has read all there is.
const POLL: Duration = Duration::from_millis(5);

/// The books of one stream, and the follower's place.
pub struct State {
    /// None until the stream's header has arrived.
    pub trace: Option<Trace>,
    /// Per name in [`BASELINE_MARKERS`]: the live totals per backtrace at
    /// the latest marker of that name (while the follower is held at one,
    /// the one before it).
    pub baselines: HashMap<String, HashMap<u32, LiveTotals>>,
    /// Stop after the marker `name` when there are this many of that name.
    hold: Option<(String, usize)>,
    /// The console's questions ([`marker::SYNC`]) answered so far.
    syncs: usize,
    /// The follower is stopped at `hold`'s marker.
    held: bool,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    /// Bytes of the file the reader had taken when it last found nothing
    /// more: every record in them is in the books.
    idle_at: AtomicU64,
    /// Stop at the end of the file instead of waiting for more.
    done: AtomicBool,
    /// The follower ended (the stream's End record, a broken stream, or `done`).
    stopped: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves books that are still
        // readable: go on with them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A trace file followed as it grows (see the module's doc).
pub struct LiveBooks {
    shared: Arc<Shared>,
    path: PathBuf,
}

/// The file, read as a stream that waits at its end for more.
struct Follow {
    file: File,
    delivered: u64,
    shared: Arc<Shared>,
}

impl Read for Follow {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.file.read(buf)?;
            if n > 0 {
                self.delivered += n as u64;
                return Ok(n);
            }
            if self.shared.done.load(Ordering::Acquire) {
                return Ok(0);
            }
            self.shared.idle_at.store(self.delivered, Ordering::Release);
            std::thread::sleep(POLL);
        }
    }
}

/// What a follower does at each marker it entered in its books: the
/// books, the marker's report number (0 for a named point) and its name.
pub type OnMarker = Box<dyn FnMut(&mut Trace, u64, &str) + Send>;

impl LiveBooks {
    /// Starts following the trace at `path` (it may still be empty).
    pub fn follow(path: &Path) -> LiveBooks {
        LiveBooks::follow_marking(path, None)
    }

    /// [`LiveBooks::follow`], calling `on_marker` after each marker entered
    /// (`mtrace attach` and `client` write report points' .memlog files
    /// so, beside the copy of the stream, which never waits for them).
    pub fn follow_marking(path: &Path, mut on_marker: Option<OnMarker>) -> LiveBooks {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { trace: None, baselines: HashMap::default(), hold: None, held: false, syncs: 0 }),
            cv: Condvar::new(),
            idle_at: AtomicU64::new(0),
            done: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let (s, p) = (shared.clone(), path.to_owned());
        std::thread::spawn(move || {
            follow(&p, &s, &mut on_marker);
            s.stopped.store(true, Ordering::Release);
            let _g = s.lock();
            s.cv.notify_all();
        });
        LiveBooks { shared, path: path.to_owned() }
    }

    /// The file followed.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The writer is done with the file: stop at its end.
    pub fn finish(&self) {
        self.shared.done.store(true, Ordering::Release);
    }

    /// Waits until the books hold every record the file holds now (or the
    /// follower stopped), then runs `f` on them. Fails when the stream's
    /// header never came.
    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> Result<T> {
        self.catch_up()?;
        let mut g = self.shared.lock();
        if g.trace.is_none() {
            bail!("{}: no trace header yet", self.path.display());
        }
        Ok(f(&mut g))
    }

    fn catch_up(&self) -> Result<()> {
        let len = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        let sh = &self.shared;
        while sh.idle_at.load(Ordering::Acquire) < len && !sh.stopped.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Runs `ask` (which makes the process write a marker named `name`),
    /// waits up to `timeout` for the books to reach that marker, and runs
    /// `f` on the books of that moment, with the marker's number among
    /// its name (from 1). The follower waits meanwhile.
    pub fn at_next_marker<T>(
        &self,
        name: &str,
        timeout: Duration,
        ask: impl FnOnce() -> Result<()>,
        f: impl FnOnce(&mut State, usize) -> T,
    ) -> Result<T> {
        self.catch_up()?;
        let sh = &self.shared;
        let want = {
            let mut g = sh.lock();
            let n = g.trace.as_ref().map_or(0, |t| t.markers.iter().filter(|m| m.name == name).count());
            g.hold = Some((name.to_owned(), n + 1));
            n + 1
        };
        let release = |g: &mut State| {
            g.hold = None;
            g.held = false;
            sh.cv.notify_all();
        };
        if let Err(e) = ask() {
            release(&mut sh.lock());
            return Err(e);
        }
        let asked = Instant::now();
        let until = asked + timeout;
        let mut told = false;
        let mut g = sh.lock();
        while !g.held {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || sh.stopped.load(Ordering::Acquire) {
                release(&mut g);
                bail!("the process did not answer ({SOLO})");
            }
            if !told && asked.elapsed() >= WAIT_NOTE {
                told = true;
                eprintln!("mtrace: waiting for the process ({SOLO})");
            }
            g = sh.cv.wait_timeout(g, left.min(Duration::from_millis(100))).unwrap_or_else(|e| e.into_inner()).0;
        }
        let out = f(&mut g, want);
        release(&mut g);
        Ok(out)
    }
}

impl LiveBooks {
    /// Whether the follower ended: the stream's End record (or a broken
    /// stream) came, and the books hold all there will be.
    pub fn ended(&self) -> bool {
        self.shared.stopped.load(Ordering::Acquire)
    }

    /// [`LiveBooks::finish`], then waits (up to `limit`) for the follower
    /// to have entered everything the file holds.
    pub fn finish_within(&self, limit: Duration) {
        self.finish();
        let until = Instant::now() + limit;
        while !self.ended() && Instant::now() < until {
            std::thread::sleep(POLL);
        }
    }

    /// Runs `ask` (which makes the process write a [`marker::SYNC`]
    /// marker after what it buffered) and waits up to `timeout` for the
    /// books to take it: they then hold every event the process made
    /// before it read the question. False when it did not come in time
    /// (or the stream ended first).
    pub fn sync(&self, timeout: Duration, ask: impl FnOnce() -> Result<()>) -> Result<bool> {
        let sh = &self.shared;
        let want = sh.lock().syncs + 1;
        ask()?;
        let until = Instant::now() + timeout;
        let mut g = sh.lock();
        while g.syncs < want {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || sh.stopped.load(Ordering::Acquire) {
                return Ok(false);
            }
            g = sh.cv.wait_timeout(g, left.min(Duration::from_millis(20))).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(true)
    }
}

impl Drop for LiveBooks {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The follower: reads the file at `path` record by record into the books.
fn follow(path: &Path, sh: &Arc<Shared>, on_marker: &mut Option<OnMarker>) {
    // The file may not be there yet: a keeper makes it once the stream's
    // header came (`mtrace attach`, `client`).
    let file = loop {
        match File::open(path) {
            Ok(f) => break f,
            Err(_) if !sh.done.load(Ordering::Acquire) => std::thread::sleep(POLL),
            Err(_) => return,
        }
    };
    let mut r = Reader::new(Follow { file, delivered: 0, shared: sh.clone() });
    let Ok(header) = r.header() else { return };
    let mut merge = crate::order::Merge::new(header.version);
    let mut sections = super::Sections::default();
    sh.lock().trace = Some(Trace::new(path, header));
    static EVERYTHING: Window = Window { since: None, until: None, from_ns: None, to_ns: None, lifetimes: false };
    let mut keeper = Keeper::new(&EVERYTHING);
    let mut ready = Vec::new();
    loop {
        let (rec, end) = match r.next_record() {
            Ok(Some(rec)) => {
                let end = matches!(rec, Record::End { .. });
                (Some(rec), end)
            }
            Ok(None) => (None, true),
            Err(e) => {
                if let Some(t) = sh.lock().trace.as_mut() {
                    t.error = Some(e);
                }
                (None, true)
            }
        };
        if let Some(rec) = rec {
            sections.pass(&mut merge, r.tid(), rec, &mut |tid, rec| ready.push((tid, rec)));
        }
        // After the End only frees in late destructors may come: the
        // books take everything now.
        if end {
            merge.finish(&mut |tid, rec| ready.push((tid, rec)));
        }
        for (tid, rec) in ready.drain(..) {
            enter(sh, &mut keeper, tid, rec, on_marker);
        }
        if end {
            return;
        }
    }
}

/// Enters record `rec` of thread `tid` into the books, holding at the
/// marker a console command waits for.
fn enter(sh: &Shared, keeper: &mut Keeper, tid: u32, rec: Record, on_marker: &mut Option<OnMarker>) {
    let (seq, marker) = match &rec {
        Record::Marker { seq, name, .. } => (*seq, Some(name.clone())),
        _ => (0, None),
    };
    let mut g = sh.lock();
    let t = g.trace.as_mut().expect("set above");
    let _: Flow = keeper.apply(t, tid, rec);
    if let (Some(f), Some(name)) = (on_marker.as_mut(), &marker) {
        f(t, seq, name);
    }
    if marker.as_deref() == Some(marker::SYNC) {
        g.syncs += 1;
        sh.cv.notify_all();
        return;
    }
    if let Some(name) = marker {
        let n = t.markers.iter().filter(|m| m.name == name).count();
        if g.hold.as_ref().is_some_and(|(h, k)| *h == name && n >= *k) {
            g.held = true;
            sh.cv.notify_all();
            while g.held {
                g = sh.cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
        }
        // After the hold: while held, the baseline is the previous
        // marker's (a report point compares with it).
        if BASELINE_MARKERS.contains(&name.as_str()) {
            let live = g.trace.as_ref().expect("set above").books.live_by_stack();
            g.baselines.insert(name.clone(), live);
        }
    }
}
