//! Incremental reports while the program runs (.memlog files).
//!
//! A report point is a Marker record in the stream, written by the writer
//! thread (or, in a process with one thread, by that thread's round)
//! after it collected every thread's buffer. The report itself is made by
//! the analyzer, not here (the recorder stays thin): `mtrace report TRACE
//! --since-marker N-1 --until-marker N -o <program>-<pid>-<N>.memlog`,
//! started in a process that is not the program's child (see [`spawn`]):
//! the program's `wait()` and `waitpid(-1, …, __WALL)` never see it, and
//! it learns the analyzer's exit status through a pipe.

use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::platform::sys;

/// Report requests from the signal handler, counted.
static REQUESTS: AtomicU64 = AtomicU64::new(0);
/// Requests whose Marker is in the file.
static MARKED: AtomicU64 = AtomicU64::new(0);

/// The report signal came (its handler, lifecycle/signals.rs): the
/// request's number.
pub fn request() -> u64 {
    REQUESTS.fetch_add(1, Ordering::AcqRel) + 1
}

/// In the report signal's handler, with a writer thread: waits (up to
/// 2 s) until the writer has put request `mine`'s Marker in the file, so
/// that the report shows the program as it was when the signal arrived,
/// not a few milliseconds of work later. Only atomics and sleeps
/// (async-signal-safe); should the writer be held up (the interrupted
/// code held a lock it needs), the timeout lets the program go on and the
/// report follows.
pub fn wait_marked(mine: u64) {
    for _ in 0..400 {
        if MARKED.load(Ordering::Acquire) >= mine {
            return;
        }
        sys::sleep_ms(5);
    }
}

/// Leak scan requests from the scan signal's handler, counted.
static SCAN_REQUESTS: AtomicU64 = AtomicU64::new(0);
static SCANS_HANDLED: AtomicU64 = AtomicU64::new(0);

/// The scan signal came (its handler): counted for whoever answers.
pub fn request_scan() {
    SCAN_REQUESTS.fetch_add(1, Ordering::AcqRel);
}

/// True once per scan signal received since the last call.
pub fn take_scan_request() -> bool {
    let done = SCANS_HANDLED.load(Ordering::Relaxed);
    SCAN_REQUESTS.load(Ordering::Acquire) > done
        && SCANS_HANDLED.compare_exchange(done, done + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
}

/// Where reports go and how they are made.
pub struct Reporter {
    /// The analyzer binary, if one was found.
    analyzer: Option<CString>,
    /// The stream goes to a socket: report points are markers, by design.
    on_socket: bool,
    /// Absolute path of this session's trace.
    trace: String,
    /// `<program>-<pid>-`, prefixed with the report folder if one is set.
    prefix: String,
    /// Reports made so far (the last report's number).
    seq: AtomicU64,
    handled: AtomicU64,
    /// The reports under way that nobody waits for.
    children: Mutex<Vec<Started>>,
    /// The analyzer's environment: the program's at the session's start,
    /// without LD_PRELOAD (built once: a report may start in a signal's
    /// handler, which must not read `environ` while the program's
    /// `setenv` may be replacing it).
    env: Vec<CString>,
    /// On a socket: what its reader said of the report points.
    pub answers: super::answers::Answers,
}

/// A report under way.
pub enum Started {
    /// Made by an analyzer of our own: the read end of the pipe its exit
    /// status comes through, with the pipe's identity (the program may
    /// close the descriptor and reuse its number: a descriptor that is no
    /// longer that pipe is never read or closed).
    Child { fd: i32, ino: u64 },
    /// Made by the socket's reader, which answers report point `seq`
    /// (answers.rs).
    Answer(u64),
}

const WCLONE: i32 = 0x8000_0000u32 as i32;

impl Reporter {
    /// `on_socket`: the stream goes to a reader, not a file the analyzer
    /// could read: report points are only markers here (the reader
    /// writes the .memlog if it keeps the books, `mtrace run
    /// --max-trace-size`; `mtrace client` reports `--since-marker`).
    pub fn new(trace: String, prog: &str, pid: u32, dir: Option<String>, on_socket: bool) -> Reporter {
        let analyzer = match sys::getenv(mtrace_format::settings::BIN.var) {
            _ if on_socket => None,
            // SAFETY: access with a NUL-terminated path.
            Some(p) => match CString::new(p.clone()) {
                // SAFETY: access with a NUL-terminated path.
                Ok(c) if unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0 => Some(c),
                _ => {
                    sys::warn(&format!("MTRACE_BIN={p:?} is not an executable file; report points are only markers"));
                    None
                }
            },
            None => next_to_library().and_then(|p| CString::new(p).ok()),
        };
        let prefix = match dir {
            Some(d) => format!("{}/{prog}-{pid}-", d.trim_end_matches('/')),
            None => format!("{prog}-{pid}-"),
        };
        Reporter {
            analyzer,
            on_socket,
            trace,
            prefix,
            seq: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            children: Mutex::new(Vec::new()),
            env: analyzer_env(),
            answers: Default::default(),
        }
    }

    /// Number of the next report; the caller writes its Marker.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// True once per report signal received since the last call; the
    /// caller then writes the Marker and calls [`Reporter::marked`].
    pub fn take_request(&self) -> bool {
        let want = REQUESTS.load(Ordering::Acquire);
        let done = self.handled.load(Ordering::Relaxed);
        want > done && self.handled.compare_exchange(done, done + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// The Marker of a signal's report is in the file: its handler may return.
    pub fn marked(&self) {
        MARKED.fetch_add(1, Ordering::AcqRel);
    }

    /// Starts the analyzer on report `seq` (its Marker is in the file).
    /// Writes to `out`, or the default .memlog name. With
    /// `since_previous`, the report is the change since report `seq - 1`.
    /// The caller waits for it ([`Reporter::wait`]) or [`Reporter::keep`]s it.
    /// On a socket, the report is the reader's: its answer is waited for.
    pub fn start(&self, seq: u64, out: Option<&str>, since_previous: bool) -> Option<Started> {
        if self.on_socket {
            return Some(Started::Answer(seq));
        }
        let Some(analyzer) = &self.analyzer else {
            if seq == 1 && !self.on_socket && sys::getenv(mtrace_format::settings::BIN.var).is_none() {
                sys::warn("no mtrace binary next to libmtrace.so (set MTRACE_BIN); report points are only markers");
            }
            return None;
        };
        let out = out.map_or_else(|| format!("{}{seq}.memlog", self.prefix), str::to_owned);
        let args = mtrace_format::protocol::report_point_argv(&self.trace, seq, &out, since_previous);
        spawn(analyzer, &args, &self.env)
    }

    /// Report `r` goes on without anybody waiting: [`Reporter::reap`]
    /// lets it go when it is done.
    pub fn keep(&self, r: Started) {
        if let Started::Child { .. } = r {
            self.children.lock().push(r);
        }
    }

    /// Lets go of the reports that ended, without blocking.
    pub fn reap(&self) {
        self.children.lock().retain(|c| c.status(false).is_none());
    }

    /// Waits for report `r`; true when its analyzer exited with status 0,
    /// or the socket's reader answered that it wrote it. `round` and
    /// `gone` as [`super::answers::Answers::wait`]'s.
    pub fn wait(&self, r: Started, round: &dyn Fn(), gone: &dyn Fn() -> bool) -> bool {
        match r {
            Started::Child { .. } => r.status(true) == Some(0),
            Started::Answer(seq) => self.answers.wait(seq, round, gone),
        }
    }

    /// The stream goes to a socket, whose reader makes the reports.
    pub fn on_socket(&self) -> bool {
        self.on_socket
    }
}

impl Started {
    /// The analyzer's exit status, once it ended (waiting for it with
    /// `block`); 127 when it could not tell (the program closed the
    /// descriptor). Closes the pipe once it answered.
    fn status(&self, block: bool) -> Option<u8> {
        let &Started::Child { fd, ino } = self else { return Some(0) };
        if pipe_ino(fd) != Some(ino) {
            return Some(127);
        }
        let mut code = [127u8];
        // SAFETY: poll and read on our pipe with buffers of their size.
        let n = unsafe {
            let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            if !block && libc::poll(&mut p, 1, 0) == 0 {
                return None;
            }
            loop {
                let n = libc::read(fd, code.as_mut_ptr().cast(), 1);
                if n >= 0 || sys::errno() != libc::EINTR {
                    break n;
                }
            }
        };
        // SAFETY: our pipe's read end, checked above.
        unsafe { libc::close(fd) };
        Some(if n == 1 { code[0] } else { 127 })
    }
}

/// The inode of the pipe open at `fd`, if it is one.
fn pipe_ino(fd: i32) -> Option<u64> {
    // SAFETY: fstat writes a struct stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
    (ok && st.st_mode & libc::S_IFMT == libc::S_IFIFO).then_some(st.st_ino)
}

/// The analyzer's environment: the program's without LD_PRELOAD, and no
/// symbol cache in the program's home (a service's) unless asked.
fn analyzer_env() -> Vec<CString> {
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != "LD_PRELOAD")
        .filter_map(|(k, v)| {
            let mut kv = k.into_encoded_bytes();
            kv.push(b'=');
            kv.extend_from_slice(v.as_encoded_bytes());
            CString::new(kv).ok()
        })
        .collect();
    let cache = mtrace_format::settings::SYMBOL_CACHE.name();
    if std::env::var_os(cache).is_none() {
        env.extend(CString::new(format!("{cache}=off")).ok());
    }
    env
}

/// `mtrace` in the folder of libmtrace.so.
fn next_to_library() -> Option<String> {
    let (lib, _, _) = crate::platform::modules::containing(next_to_library as fn() -> Option<String> as usize)?;
    let dir = std::path::Path::new(&lib.path).parent()?;
    let bin = dir.join("mtrace");
    bin.is_file().then(|| bin.to_string_lossy().into_owned())
}

/// Starts `path` with `args` and `env` in a process that is not the
/// program's child, and returns the pipe its exit status will come
/// through. A child the program could see would be reaped by its
/// `waitpid(-1, …, __WALL)` (and a child's exit signal becomes SIGCHLD at
/// exec): so a clone child with exit signal 0 (the go-between) starts the
/// waiter and exits at once, reaped here; the waiter, an orphan that init
/// (or the nearest subreaper) adopts, starts the analyzer, waits for it
/// and writes its exit status into the pipe. The waiter keeps the
/// standard streams and the pipe, no other descriptor of the program's
/// (a pipe's write end held open would keep its reader from its end of
/// file). Everything the children need is built before the clone: in a
/// copy of a threaded process only raw system calls are safe.
fn spawn(path: &CString, args: &[String], env: &[CString]) -> Option<Started> {
    let args: Vec<CString> = args.iter().filter_map(|a| CString::new(a.as_bytes()).ok()).collect();
    let mut argv: Vec<*const c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let [rd, wr] = fds;
    let ino = pipe_ino(rd)?;
    // SAFETY: clone without CLONE_VM is a fork; the children make only raw
    // system calls on memory prepared above, then exec or exit.
    unsafe {
        let go_between = libc::syscall(libc::SYS_clone, 0 as libc::c_ulong, 0usize, 0usize, 0usize, 0usize);
        if go_between == 0 {
            // Every signal blocked: the program's handlers must never run
            // in these copies.
            let full = [u64::MAX; 16];
            libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, full.as_ptr(), 0usize, 8usize);
            let waiter = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0usize, 0usize, 0usize, 0usize);
            if waiter == 0 {
                wait_for_analyzer(path, &argv, &envp, wr);
            }
            libc::syscall(libc::SYS_exit_group, if waiter > 0 { 0 } else { 1 });
        }
        libc::close(wr);
        if go_between <= 0 {
            libc::close(rd);
            return None;
        }
        let mut status = 0i32;
        while libc::syscall(libc::SYS_wait4, go_between, &mut status as *mut i32, WCLONE, 0usize) < 0
            && sys::errno() == libc::EINTR
        {}
    }
    Some(Started::Child { fd: rd, ino })
}

/// The waiter of [`spawn`]: starts the analyzer, waits for it, writes its
/// exit status (one byte) into `wr` and exits.
///
/// # Safety
/// In a fresh copy of the program made by `clone`; `argv` and `envp` are
/// NULL-terminated arrays of NUL-terminated strings that live in it.
unsafe fn wait_for_analyzer(path: &CString, argv: &[*const c_char], envp: &[*const c_char], wr: i32) -> ! {
    // SAFETY: raw system calls on this copy's own memory, per the contract.
    unsafe {
        // Every descriptor but the standard streams and `wr` (a failure,
        // before Linux 5.9, leaves them open: harmless).
        libc::syscall(libc::SYS_close_range, 3usize, (wr as usize).saturating_sub(1), 0usize);
        libc::syscall(libc::SYS_close_range, wr as usize + 1, u32::MAX as usize, 0usize);
        let analyzer = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0usize, 0usize, 0usize, 0usize);
        if analyzer == 0 {
            let empty = [0u64; 16];
            libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, empty.as_ptr(), 0usize, 8usize);
            libc::syscall(libc::SYS_execve, path.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::syscall(libc::SYS_exit_group, 127);
        }
        let mut status = 0i32;
        let code: u8 = loop {
            if analyzer < 0 {
                break 127;
            }
            let r = libc::syscall(libc::SYS_wait4, analyzer, &mut status as *mut i32, 0usize, 0usize);
            if r == analyzer {
                break if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) as u8 } else { 126 };
            }
            if r != -1 || sys::errno() != libc::EINTR {
                break 127;
            }
        };
        libc::syscall(libc::SYS_write, wr, &code as *const u8, 1usize);
        libc::syscall(libc::SYS_exit_group, 0);
        std::hint::unreachable_unchecked()
    }
}
