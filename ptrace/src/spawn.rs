//! Starting the program under ptrace: fork, seize the child before it
//! execs (it waits on a pipe meanwhile), let it exec. And the tracer's own
//! SIGINT/SIGTERM, which make it detach rather than die.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Context, Result};
use nix::sys::ptrace::{self, Options};
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::{fork, ForkResult, Pid};

/// What the tracer follows: threads, forks, vforks (posix_spawn), execs,
/// and exits (a stop while the thread's memory is still there: under
/// uprobes its last samples are read then, when the code and the maps
/// they refer to can still be read).
pub fn options() -> Options {
    Options::PTRACE_O_TRACECLONE
        | Options::PTRACE_O_TRACEFORK
        | Options::PTRACE_O_TRACEVFORK
        | Options::PTRACE_O_TRACEEXEC
        | Options::PTRACE_O_TRACEEXIT
}

/// The program could not be started: its exec failed (`error`: ENOENT,
/// EACCES, ENOEXEC…). The caller exits as a shell would (and env(1),
/// valgrind): 127 for a program not found, 126 for one that cannot run.
#[derive(Debug)]
pub struct ExecFailed {
    /// The program as given (`cmd[0]`).
    pub program: String,
    /// What the exec (or the spawn) returned.
    pub error: std::io::Error,
}

impl ExecFailed {
    /// 127 if the program was not found (ENOENT), else 126.
    pub fn exit_code(&self) -> u8 {
        if self.error.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        }
    }
}

impl std::fmt::Display for ExecFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // mtrace's main drops Rust's " (os error N)", as of every error.
        write!(f, "cannot run {}: {}", self.program, self.error)
    }
}

impl std::error::Error for ExecFailed {}

/// Forks `cmd` seized by this process; its first stop is its exec.
/// Errors: [`ExecFailed`] if the exec failed (the child is reaped).
pub fn spawn(cmd: &[String]) -> Result<Pid> {
    let args: Vec<CString> =
        cmd.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<_, _>>().context("a NUL in the command")?;
    let (r, w) = nix::unistd::pipe()?;
    // The exec's errno comes back on this one; a successful exec closes it.
    let (er, ew) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: the child only closes, reads, execs, writes and exits (all
    // async-signal-safe; execvp's PATH search does not allocate in glibc),
    // and this process has no other threads yet.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(w);
            drop(er);
            let mut b = [0u8; 1];
            let _ = nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&r), &mut b);
            let e = nix::unistd::execvp(&args[0], &args).err().map_or(0, |e| e as i32);
            let _ = nix::unistd::write(&ew, &e.to_ne_bytes());
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => {
            drop(r);
            drop(ew);
            let seized = ptrace::seize(child, options());
            // The child goes on either way (untraced if the seize failed).
            drop(w);
            seized.with_context(|| format!("cannot trace {child} (ptrace PTRACE_SEIZE)"))?;
            // Nothing stops the child before its exec closes the pipe
            // (close-on-exec comes before the exec's ptrace stop) or its
            // errno is written (before its exit's stop): this read ends.
            let mut b = [0u8; 4];
            let n = nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&er), &mut b).unwrap_or(0);
            if n == b.len() {
                reap(child);
                let error = std::io::Error::from_raw_os_error(i32::from_ne_bytes(b));
                return Err(ExecFailed { program: cmd[0].clone(), error }.into());
            }
            Ok(child)
        }
    }
}

/// Lets a seized child whose exec failed end (it stops at its exit, and
/// before that maybe at a signal) and reaps it.
fn reap(child: Pid) {
    use nix::sys::wait::{waitpid, WaitStatus};
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_) => return,
            Ok(_) => {
                let _ = ptrace::cont(child, None);
            }
        }
    }
}

/// Set by SIGINT or SIGTERM to the tracer: leave the program running.
pub static DETACH: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: i32) {
    DETACH.store(true, Ordering::Relaxed);
}

/// Signals sent to `mtrace` that are its program's, a bit per number,
/// until [`take_passed_on`] takes them.
static PASS_ON: AtomicU64 = AtomicU64::new(0);

/// `si_code` of a signal the kernel sent (the terminal's keys, a hangup).
const SI_KERNEL: i32 = 0x80;

extern "C" fn on_pass_on(sig: i32, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    // The terminal's Ctrl-C, Ctrl-\ and window changes reach the program by
    // themselves (same process group); what was sent to mtrace alone is
    // passed on.
    if sig != libc::SIGTERM && sig != libc::SIGHUP && code == SI_KERNEL {
        return;
    }
    PASS_ON.fetch_or(1 << sig, Ordering::Relaxed);
}

/// Keeps each of `sigs` sent to `mtrace` for its program
/// ([`take_passed_on`]) instead of its default action. With `restart`
/// (SA_RESTART) a call the signal interrupts goes on; without, a wait
/// returns EINTR, so that a loop blocked in `waitpid` notices at once.
pub fn pass_on(sigs: impl IntoIterator<Item = i32>, restart: bool) {
    for sig in sigs {
        // SAFETY: a handler that only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_pass_on as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | if restart { libc::SA_RESTART } else { 0 };
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The signals [`pass_on`] kept since the last call.
pub fn take_passed_on() -> Vec<i32> {
    let bits = PASS_ON.swap(0, Ordering::Relaxed);
    (1..64).filter(|s| bits & (1 << s) != 0).collect()
}

/// The signals `mtrace` passes on to the program it runs or traces when
/// they are sent to `mtrace` itself (`pgrep` finds both, and a report
/// signal sent to the wrong one must not end `mtrace`): SIGUSR1, SIGUSR2,
/// and the recording's report and scan signals (`MTRACE_REPORT_SIGNAL`,
/// `MTRACE_SCAN_SIGNAL`) if others. Never SIGINT, SIGTERM or SIGHUP,
/// whose meaning for `mtrace` is its own.
pub fn signals_to_pass_on(r: &mtrace_format::recording::Recording) -> Vec<i32> {
    let mut v = vec![libc::SIGUSR1, libc::SIGUSR2];
    for sig in [r.report_signal, r.scan_signal].into_iter().flatten() {
        if !v.contains(&sig) && ![libc::SIGINT, libc::SIGTERM, libc::SIGHUP].contains(&sig) {
            v.push(sig);
        }
    }
    v
}

/// SIGINT, SIGTERM and SIGHUP (and SIGALRM, which [`detach_after`]
/// sends) make the tracer detach; its waits are interrupted (no
/// SA_RESTART) so that it notices. The [`signals_to_pass_on`] are kept
/// for the program.
pub fn catch_signals(r: &mtrace_format::recording::Recording) -> Result<()> {
    let sa = SigAction::new(SigHandler::Handler(on_signal), SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGALRM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { signal::sigaction(sig, &sa) }?;
    }
    pass_on(signals_to_pass_on(r), false);
    Ok(())
}

/// Makes the tracer detach after `d`: a thread of its own sleeps, then
/// sends this process SIGALRM (which it blocks itself, so that the signal
/// interrupts the tracer's wait).
pub fn detach_after(d: std::time::Duration) {
    std::thread::spawn(move || {
        let mut block = SigSet::empty();
        block.add(Signal::SIGALRM);
        let _ = block.thread_block();
        std::thread::sleep(d);
        let _ = signal::kill(nix::unistd::getpid(), Signal::SIGALRM);
    });
}

/// Whether thread `tid` of process `pid` has exited: it is gone, or a
/// zombie (proc(5): state Z or X in `/proc/PID/task/TID/stat`, after the
/// command's closing parenthesis).
fn exited(pid: Pid, tid: Pid) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")) else { return true };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z' | 'X') | None)
}

/// Seizes every thread of running process `pid` and stops them; the
/// threads, stopped. Errors in one line: no such process, not permitted.
pub fn seize_all(pid: Pid) -> Result<Vec<Pid>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).with_context(|| format!("no process {pid}"))?;
    let mut tids: Vec<Pid> =
        tasks.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).map(Pid::from_raw).collect();
    tids.sort();
    let mut seized = Vec::new();
    for &tid in &tids {
        match ptrace::seize(tid, options()) {
            Ok(()) => seized.push(tid),
            // A thread that ended meanwhile; or one ending: the kernel
            // refuses to trace a task that has exited (EPERM while it is
            // a zombie, before it is gone), as a thread that returned in
            // the middle of the seizing is (ctests/waits.c's waiters,
            // attached to as they time out).
            Err(nix::errno::Errno::ESRCH) => {}
            Err(nix::errno::Errno::EPERM) if tid != pid && exited(pid, tid) => {}
            Err(e) => {
                for &t in &seized {
                    let _ = ptrace::detach(t, None);
                }
                let why = match e {
                    nix::errno::Errno::EPERM => {
                        "not permitted (another tracer, another user, or kernel.yama.ptrace_scope)".to_owned()
                    }
                    e => e.to_string(),
                };
                anyhow::bail!("cannot trace process {pid}: {why}");
            }
        }
    }
    for &tid in &seized {
        let _ = ptrace::interrupt(tid);
    }
    let mut stopped = Vec::new();
    for &tid in &seized {
        loop {
            match nix::sys::wait::waitpid(tid, Some(nix::sys::wait::WaitPidFlag::__WALL)) {
                Ok(st @ (nix::sys::wait::WaitStatus::PtraceEvent(..) | nix::sys::wait::WaitStatus::Stopped(..))) => {
                    crate::target::at_stop(&st);
                    stopped.push(tid);
                    break;
                }
                Err(nix::errno::Errno::EINTR) => continue,
                _ => break,
            }
        }
    }
    Ok(stopped)
}
