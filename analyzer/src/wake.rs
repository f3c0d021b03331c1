//! The reader's side (`mtrace server`, `mtrace attach`) of a process with
//! one thread (docs/PROCESSES.md): it has no writer thread of mtrace's,
//! and carries out commands and writes what it buffered only at its
//! allocation calls. One that idles (in `read`, `poll`, a sleep) is made
//! to do a round by a call of libmtrace.so's `mtrace_round_now` made in
//! it with ptrace (`mtrace_ptrace::library_call`): when it did not take a
//! command within [`ANSWER_GRACE`], and when its stream stood still for
//! [`STILL`] while it had events waiting (the library's word
//! `mtrace_unwritten`, read from outside), so that the stream is never
//! much more behind than a writer thread would leave it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mtrace_ptrace::library_call::{self, InProcess};

/// How long a process with one thread may take to read a command by
/// itself (at its next allocation call, its rounds 5 ms apart while it
/// makes them) before it is made to: an idle one makes none.
pub const ANSWER_GRACE: Duration = Duration::from_millis(10);

/// How long a stream stands still, its process's events waiting, before
/// the process is made to write them: a writer thread writes a quiet
/// thread's events every 50 ms.
const STILL: Duration = Duration::from_millis(40);

/// How often the streams are looked at.
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// The library in one process: the function to call, the word to read.
struct Located {
    lib: InProcess,
    round: u64,
    unwritten: u64,
}

/// Makes the program's processes with one thread do their rounds.
pub struct Waker {
    /// Who says what could not be done (`mtrace server`, `mtrace`).
    who: &'static str,
    /// libmtrace.so, which the processes preload.
    lib: PathBuf,
    /// Per stream (an exec's image is a stream of its own): the library
    /// in its process, `None` where it could not be found.
    located: Mutex<HashMap<u32, Option<Arc<Located>>>>,
    /// Processes said to be traced by another program (said once each).
    told: Mutex<Vec<i32>>,
    /// One call at a time (a second ptrace of a process is refused).
    calling: Mutex<()>,
}

impl Waker {
    /// For the processes that preload `lib`; `who` names the reader in
    /// its messages.
    pub fn new(who: &'static str, lib: PathBuf) -> Waker {
        Waker { who, lib, located: Mutex::default(), told: Mutex::default(), calling: Mutex::default() }
    }

    /// The library in process `pid` of stream `stream`, found once.
    fn located(&self, stream: u32, pid: i32) -> Option<Arc<Located>> {
        let mut m = self.located.lock().expect("located lock");
        m.entry(stream)
            .or_insert_with(|| {
                let (lib, at) = InProcess::find(pid, &self.lib, &["mtrace_round_now", "mtrace_unwritten"]).ok()?;
                Some(Arc::new(Located { lib, round: at[0], unwritten: at[1] }))
            })
            .clone()
    }

    /// Stream `stream` of process `pid` ended.
    pub fn forget(&self, stream: u32) {
        self.located.lock().expect("located lock").remove(&stream);
    }

    /// Makes process `pid` (of stream `stream`) do a round now, if it has
    /// one thread. A process another program traces (a debugger, strace)
    /// cannot be: it answers at its next allocation call or free, and the
    /// server says so once.
    pub fn wake(&self, stream: u32, pid: i32) {
        if !library_call::single_threaded(pid) {
            return;
        }
        let Some(l) = self.located(stream, pid) else { return };
        let done = {
            let _one = self.calling.lock().expect("calling lock");
            l.lib.call(l.round, 0)
        };
        let Err(e) = done else { return };
        let mut told = self.told.lock().expect("told lock");
        match library_call::tracer_of(pid) {
            Some(t) if !told.contains(&pid) => {
                told.push(pid);
                eprintln!(
                    "{}: process {pid} is traced by another program (pid {t}): it carries out commands at its \
                     next allocation call or free",
                    self.who
                );
            }
            Some(_) => {}
            None if library_call::single_threaded(pid) => {
                eprintln!("{}: process {pid} did not take the command now: {e:#}", self.who)
            }
            None => {}
        }
    }

    /// Until `ended()`: every [`LOOK_EVERY`], each stream `streams()` lists
    /// as (stream, pid, bytes received so far) that stood still for
    /// [`STILL`] while its process has events waiting is made to write
    /// them (a process with one thread that went idle right after them).
    pub fn watch(&self, streams: impl Fn() -> Vec<(u32, i32, u64)>, ended: impl Fn() -> bool) {
        // Per stream: its bytes when last seen to change, and since when.
        let mut seen: HashMap<u32, (u64, Instant)> = HashMap::new();
        while !ended() {
            std::thread::sleep(LOOK_EVERY);
            let now = Instant::now();
            let listed = streams();
            seen.retain(|id, _| listed.iter().any(|l| l.0 == *id));
            for (id, pid, bytes) in listed {
                let (last, since) = seen.entry(id).or_insert((bytes, now));
                if *last != bytes {
                    (*last, *since) = (bytes, now);
                    continue;
                }
                if now.duration_since(*since) < STILL {
                    continue;
                }
                // Looked at again only after as long once more.
                *since = now;
                let waiting = library_call::single_threaded(pid)
                    && self.located(id, pid).is_some_and(|l| l.lib.read_u32(l.unwritten) == Some(1));
                if waiting {
                    self.wake(id, pid);
                }
            }
        }
    }
}

/// Waits until the program (process `pid`, the server's child) has
/// ended, without taking its status. A plain wait would also take the
/// stops of the calls [`Waker::wake`] makes in it: the kernel tells a
/// parent whose thread group also traces its child of every ptrace stop,
/// whatever the options; so the wait only looks (`WNOWAIT`), and lets a
/// stop pass to the thread that made it.
pub fn until_it_ends(pid: i32) {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    loop {
        match waitid(Id::Pid(nix::unistd::Pid::from_raw(pid)), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(nix::errno::Errno::ECHILD) => return,
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}
