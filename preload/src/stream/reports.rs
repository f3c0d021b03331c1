//! Incremental reports while the program runs (.memlog files).
//!
//! A report point is a Marker record in the stream, written by the writer
//! thread after it collected every thread's buffer. The report itself is
//! made by the analyzer, not here (the recorder stays thin): the writer
//! starts `mtrace report TRACE --since-marker N-1 --until-marker N -o
//! <program>-<pid>-<N>.memlog` in a child process. The child is created with
//! a raw `clone` whose exit signal is 0 (the analyzer runs in a grandchild:
//! see [`spawn`]), so the program gets no SIGCHLD and
//! its `waitpid(-1, …)` never sees it; the writer reaps it with `__WCLONE`.

use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::platform::sys;

/// Report requests from the signal handler, counted.
static REQUESTS: AtomicU64 = AtomicU64::new(0);
/// Requests whose Marker is in the file.
static MARKED: AtomicU64 = AtomicU64::new(0);

/// The report signal's handler. It waits (up to 2 s) until the writer has
/// put the report's Marker in the file, so that the report shows the
/// program as it was when the signal arrived, not a few milliseconds of
/// work later. It only touches atomics and nanosleep (async-signal-safe);
/// should the writer be held up (the interrupted code held a lock it
/// needs), the timeout lets the program go on and the report follows.
extern "C" fn on_report_signal(_: i32) {
    // No session (tracing off in this process): nobody would answer.
    let Some(s) = crate::stream::current() else { return };
    let errno = sys::errno();
    let mine = REQUESTS.fetch_add(1, Ordering::AcqRel) + 1;
    if s.is_solo() {
        // No writer: the program's thread writes the Marker at its next
        // event of the malloc family, after this handler.
        s.round_soon();
        return;
    }
    for _ in 0..400 {
        if MARKED.load(Ordering::Acquire) >= mine {
            break;
        }
        sys::sleep_ms(5);
    }
    sys::set_errno(errno);
}

/// Leak scan requests from the scan signal's handler, counted.
static SCAN_REQUESTS: AtomicU64 = AtomicU64::new(0);
static SCANS_HANDLED: AtomicU64 = AtomicU64::new(0);

/// The scan signal's handler: counts the request for the writer. It does
/// not wait: the scan stops this thread like every other.
extern "C" fn on_scan_signal(_: i32) {
    SCAN_REQUESTS.fetch_add(1, Ordering::AcqRel);
    if let Some(s) = crate::stream::current() {
        s.round_soon();
    }
}

/// True once per scan signal received since the last call.
pub fn take_scan_request() -> bool {
    let done = SCANS_HANDLED.load(Ordering::Relaxed);
    SCAN_REQUESTS.load(Ordering::Acquire) > done
        && SCANS_HANDLED.compare_exchange(done, done + 1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
}

/// Installs the scan signal's handler, unless the program has its own.
pub fn install_scan(sig: i32) {
    set_handler(sig, on_scan_signal);
}

/// Installs the report signal's handler, unless the program has its own.
pub fn install(sig: i32) {
    set_handler(sig, on_report_signal);
}

fn set_handler(sig: i32, handler: extern "C" fn(i32)) {
    // SAFETY: sigaction with valid pointers; replaces only SIG_DFL.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction != libc::SIG_DFL {
            return;
        }
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
    }
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
    children: Mutex<Vec<i32>>,
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
    /// Writes to `out`, or the default .memlog name. Returns the child's pid.
    /// With `since_previous`, the report is the change since report `seq - 1`.
    /// With `waited`, the caller reaps the child with [`Reporter::wait`]
    /// (the writer's [`Reporter::reap`] must not take it first).
    pub fn start(&self, seq: u64, out: Option<&str>, since_previous: bool, waited: bool) -> Option<i32> {
        let Some(analyzer) = &self.analyzer else {
            if seq == 1 && !self.on_socket && sys::getenv(mtrace_format::settings::BIN.var).is_none() {
                sys::warn("no mtrace binary next to libmtrace.so (set MTRACE_BIN); report points are only markers");
            }
            return None;
        };
        let out = out.map_or_else(|| format!("{}{seq}.memlog", self.prefix), str::to_owned);
        let args = mtrace_format::protocol::report_point_argv(&self.trace, seq, &out, since_previous);
        let pid = spawn(analyzer, &args)?;
        if !waited {
            self.children.lock().push(pid);
        }
        Some(pid)
    }

    /// Reaps finished analyzers without blocking.
    pub fn reap(&self) {
        self.children.lock().retain(|&pid| {
            let mut status = 0;
            // SAFETY: waitpid on our own clone child.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG | WCLONE) == 0 }
        });
    }

    /// Waits for analyzer `pid`; true when it exited with status 0.
    pub fn wait(&self, pid: i32) -> bool {
        let mut status = 0;
        // SAFETY: waitpid on our own clone child.
        let rc = unsafe { libc::waitpid(pid, &mut status, WCLONE) };
        rc == pid && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}

/// `mtrace` in the folder of libmtrace.so.
fn next_to_library() -> Option<String> {
    let (lib, _, _) = crate::platform::modules::containing(next_to_library as fn() -> Option<String> as usize)?;
    let dir = std::path::Path::new(&lib.path).parent()?;
    let bin = dir.join("mtrace");
    bin.is_file().then(|| bin.to_string_lossy().into_owned())
}

/// Starts `path` with `args` and the environment minus LD_PRELOAD, as a
/// clone child that sends no SIGCHLD. Exec makes a process's exit signal
/// SIGCHLD again, so the analyzer is a grandchild: the clone child (exit
/// signal 0, never execs) starts it, waits for it and exits with its status.
/// Everything the children need is built
/// before the clone: in a copy of a threaded process only raw system calls
/// are safe.
fn spawn(path: &CString, args: &[String]) -> Option<i32> {
    let args: Vec<CString> = args.iter().filter_map(|a| CString::new(a.as_bytes()).ok()).collect();
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != "LD_PRELOAD")
        .filter_map(|(k, v)| {
            let mut kv = k.into_encoded_bytes();
            kv.push(b'=');
            kv.extend_from_slice(v.as_encoded_bytes());
            CString::new(kv).ok()
        })
        .collect();
    // The analyzer runs in the program's environment: it keeps no
    // symbolized frames in the program's home (a service's) unless asked.
    let cache = mtrace_format::settings::SYMBOL_CACHE.name();
    if std::env::var_os(cache).is_none() {
        env.extend(CString::new(format!("{cache}=off")).ok());
    }
    let mut argv: Vec<*const c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: clone without CLONE_VM is a fork; the children make only raw
    // system calls on memory prepared above, then exec or exit.
    unsafe {
        let pid = libc::syscall(libc::SYS_clone, 0 as libc::c_ulong, 0usize, 0usize, 0usize, 0usize);
        if pid == 0 {
            // The go-between: every signal blocked (the program's handlers
            // must never run in this copy), it waits for the analyzer and
            // exits with its status.
            let full = [u64::MAX; 16];
            libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, full.as_ptr(), 0usize, 8usize);
            let analyzer =
                libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0usize, 0usize, 0usize, 0usize);
            if analyzer == 0 {
                let empty = [0u64; 16];
                libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, empty.as_ptr(), 0usize, 8usize);
                libc::syscall(libc::SYS_execve, path.as_ptr(), argv.as_ptr(), envp.as_ptr());
                libc::syscall(libc::SYS_exit_group, 127);
            }
            let mut status = 0i32;
            let code = loop {
                if analyzer < 0 {
                    break 127;
                }
                let r = libc::syscall(libc::SYS_wait4, analyzer, &mut status as *mut i32, 0usize, 0usize);
                if r == analyzer {
                    break if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 126 };
                }
                if r != -1 || sys::errno() != libc::EINTR {
                    break 127;
                }
            };
            libc::syscall(libc::SYS_exit_group, code);
        }
        (pid > 0).then_some(pid as i32)
    }
}
