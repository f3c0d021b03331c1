//! Keepers of arriving streams: each process's stream, as it connects to
//! a listener, kept within a bound by the analysis library's
//! [`bounded::keep`] on a thread of its own (`run`'s bounded traces,
//! `mtrace keep`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use mtrace_analysis::bounded::{keep, Bound, Dest, Kept, ReportPoints};

use super::listen::Listener;

/// The streams of a program's processes, each kept by [`keep`] on a
/// thread of its own as its process connects.
pub struct Keepers {
    /// Streams not ended yet.
    open: Arc<AtomicUsize>,
    /// What each ended one did.
    done: Arc<Mutex<Vec<Result<Kept>>>>,
    /// The listener: its socket (and private folder) go with the keepers.
    _listener: Listener,
}

impl Keepers {
    /// Listens on a private socket (0600, in a 0700 folder) for streams,
    /// keeping each in `dir` within `bound`, and writing the .memlog of
    /// each report point into `reports` (none: the process's working
    /// directory) with at most `depth` frames per backtrace. Returns the keepers and
    /// the socket's address for `MTRACE_OUTPUT` (`unix:PATH`).
    pub fn start(
        dir: &Path,
        bound: Bound,
        reports: Option<PathBuf>,
        depth: Option<usize>,
    ) -> Result<(Keepers, String)> {
        let l = Listener::private("mtrace-keep.", "s.sock")?;
        let addr = l.address();
        Ok((Keepers::listen(l, dir, bound, reports, depth)?, addr))
    }

    /// [`Keepers::start`] on listener `l` (`mtrace keep`'s socket), which
    /// goes with the keepers.
    /// Errors: no descriptor left for the listening thread.
    pub fn listen(
        l: Listener,
        dir: &Path,
        bound: Bound,
        reports: Option<PathBuf>,
        depth: Option<usize>,
    ) -> Result<Keepers> {
        let incoming = l.incoming_unix()?;
        let open = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(Mutex::new(Vec::new()));
        let (o, d, dir) = (open.clone(), done.clone(), dir.to_owned());
        std::thread::spawn(move || {
            for s in incoming {
                o.fetch_add(1, Ordering::AcqRel);
                let (o, d, dir, reports) = (o.clone(), d.clone(), dir.clone(), reports.clone());
                std::thread::spawn(move || {
                    let mut points = ReportPoints::new(reports, depth);
                    // The program's mtrace_report()/mtrace_scan() wait for
                    // the report it asked for: answered on its socket.
                    if let Ok(back) = s.try_clone() {
                        points.answer_on(Box::new(back), peer_is_us(&s));
                    }
                    let k = keep(s, Dest::Dir(&dir), bound, Some(&mut points));
                    d.lock().unwrap_or_else(|e| e.into_inner()).push(k);
                    o.fetch_sub(1, Ordering::AcqRel);
                });
            }
        });
        Ok(Keepers { open, done, _listener: l })
    }

    /// Streams being kept now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// What each stream that ended since the last call did.
    pub fn ended(&self) -> Vec<Result<Kept>> {
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Waits until every stream has ended, or `grace` has passed since the
    /// call (a process that outlives the program keeps its stream open).
    /// Returns what each ended stream did.
    pub fn finish(self, grace: Duration) -> Vec<Result<Kept>> {
        let until = Instant::now() + grace;
        // A process that just connected is counted once the listening
        // thread has accepted it.
        std::thread::sleep(Duration::from_millis(20));
        while self.open.load(Ordering::Acquire) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The process at the other end of `s` runs as our effective user
/// (SO_PEERCRED, as it connected): the paths it asks its reports to go to
/// are its own to ask for.
fn peer_is_us(s: &std::os::unix::net::UnixStream) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    getsockopt(s, PeerCredentials).is_ok_and(|c| c.uid() == nix::unistd::geteuid().as_raw())
}
