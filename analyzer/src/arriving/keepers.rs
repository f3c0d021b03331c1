//! Keepers of arriving streams: each process's stream, as it connects to
//! a listener, kept by the analysis library's [`bounded::keep`] on a
//! thread of its own: within a bound (`run --max-trace-size`, `mtrace
//! keep`) or whole (`run`'s consumer of its program's streams, which
//! also keeps the report's books of the program's own).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use mtrace_analysis::bounded::{keep, Bound, Dest, Kept, ReportPoints};
use mtrace_analysis::pipeline::ReportOpts;

use super::listen::Listener;

/// The streams of a program's processes, each kept by [`keep`] on a
/// thread of its own as its process connects.
pub struct Keepers {
    /// Streams not ended yet.
    open: Arc<AtomicUsize>,
    /// The processes of the streams not ended yet (their peers' pids; 0:
    /// unknown).
    pids: Arc<Mutex<Vec<u32>>>,
    /// What each ended one did.
    done: Arc<Mutex<Vec<Result<Kept>>>>,
    /// The listener: its socket (and private folder) go with the keepers.
    _listener: Listener,
}

/// What the keepers do with each stream, besides keeping it in a folder.
#[derive(Clone, Default)]
pub struct Keeping {
    /// The bound of each trace (none: whole).
    pub bound: Bound,
    /// Folder for the .memlog of report points (none: the process's
    /// working directory).
    pub reports: Option<PathBuf>,
    /// Frames per backtrace in those.
    pub depth: Option<usize>,
    /// Without a bound, the books of this report are kept for the streams
    /// of this process's children (`mtrace run`'s program, [`Kept::books`]).
    pub books: Option<ReportOpts>,
}

impl Keepers {
    /// Listens on a private socket (0600, in a 0700 folder) for streams,
    /// keeping each in `dir` as `how` says. Returns the keepers and the
    /// socket's address for `MTRACE_OUTPUT` (`unix:PATH`).
    pub fn start(dir: &Path, how: Keeping) -> Result<(Keepers, String)> {
        let l = Listener::private("mtrace-keep.", "s.sock")?;
        let addr = l.address();
        Ok((Keepers::listen(l, dir, how)?, addr))
    }

    /// [`Keepers::start`] on listener `l` (`mtrace keep`'s socket), which
    /// goes with the keepers.
    /// Errors: no descriptor left for the listening thread.
    pub fn listen(l: Listener, dir: &Path, how: Keeping) -> Result<Keepers> {
        let incoming = l.incoming_unix()?;
        let open = Arc::new(AtomicUsize::new(0));
        let pids = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(Mutex::new(Vec::new()));
        let (o, p, d, dir) = (open.clone(), pids.clone(), done.clone(), dir.to_owned());
        std::thread::spawn(move || {
            for s in incoming {
                let pid = peer_pid(&s);
                o.fetch_add(1, Ordering::AcqRel);
                lock(&p).push(pid);
                let (o, p, d, dir, how) = (o.clone(), p.clone(), d.clone(), dir.clone(), how.clone());
                std::thread::spawn(move || {
                    let mut points = ReportPoints::new(how.reports, how.depth);
                    let books = how.books.as_ref().map(|opts| (opts, std::process::id()));
                    let k = keep(s, Dest::Dir(&dir), how.bound, Some(&mut points), books);
                    lock(&d).push(k);
                    let mut pids = lock(&p);
                    if let Some(i) = pids.iter().position(|&q| q == pid) {
                        pids.swap_remove(i);
                    }
                    drop(pids);
                    o.fetch_sub(1, Ordering::AcqRel);
                });
            }
        });
        Ok(Keepers { open, pids, done, _listener: l })
    }

    /// Streams being kept now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// What each stream that ended since the last call did.
    pub fn ended(&self) -> Vec<Result<Kept>> {
        std::mem::take(&mut *lock(&self.done))
    }

    /// Waits until every stream of a process that has ended is read to
    /// its end (what it sent before it ended, still in the socket or the
    /// keeper's hands; for at most [`DRAIN`]), and the others for `grace`
    /// since the call (a process that outlives the program keeps its
    /// stream open: its trace ends where it got). Returns what each ended
    /// stream did.
    pub fn finish(self, grace: Duration) -> Vec<Result<Kept>> {
        let now = Instant::now();
        let (until, drained) = (now + grace, now + DRAIN);
        // A process that just connected is counted once the listening
        // thread has accepted it.
        std::thread::sleep(Duration::from_millis(20));
        while self.open.load(Ordering::Acquire) > 0 {
            let now = Instant::now();
            let ended = || lock(&self.pids).iter().any(|&pid| !runs(pid));
            if now >= until && (now >= drained || !ended()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::mem::take(&mut *lock(&self.done))
    }
}

/// The longest [`Keepers::finish`] waits for the stream of a process that
/// has ended: what is left of it is at most a socket's buffer and the
/// keeper's few batches, but a child that kept the descriptor (forked and
/// not traced) keeps the stream open after it.
const DRAIN: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The pid of the process at the other end of `s` (as it connected,
/// SO_PEERCRED), 0 when unknown.
fn peer_pid(s: &UnixStream) -> u32 {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    getsockopt(s, PeerCredentials).map_or(0, |c| c.pid() as u32)
}

/// Process `pid` still runs: it is there and not a zombie (an unknown
/// one, 0, is taken to run).
fn runs(pid: u32) -> bool {
    if pid == 0 {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => {
            stat.rsplit_once(')').is_some_and(|(_, rest)| !matches!(rest.trim_start().chars().next(), Some('Z' | 'X')))
        }
        Err(_) => false,
    }
}
