//! Starting the program under ptrace: fork, seize the child before it
//! execs (it waits on a pipe meanwhile), let it exec. And the tracer's own
//! SIGINT/SIGTERM, which make it detach rather than die.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use nix::sys::ptrace::{self, Options};
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::unistd::{fork, ForkResult, Pid};

/// What the tracer follows: threads, forks, vforks (posix_spawn), execs.
pub fn options() -> Options {
    Options::PTRACE_O_TRACECLONE
        | Options::PTRACE_O_TRACEFORK
        | Options::PTRACE_O_TRACEVFORK
        | Options::PTRACE_O_TRACEEXEC
}

/// Forks `cmd` seized by this process; its first stop is its exec.
pub fn spawn(cmd: &[String]) -> Result<Pid> {
    let args: Vec<CString> =
        cmd.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<_, _>>().context("a NUL in the command")?;
    let (r, w) = nix::unistd::pipe()?;
    // SAFETY: the child only closes, reads, execs and exits (all
    // async-signal-safe; execvp's PATH search does not allocate in glibc),
    // and this process has no other threads yet.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(w);
            let mut b = [0u8; 1];
            let _ = nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&r), &mut b);
            let _ = nix::unistd::execvp(&args[0], &args);
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => {
            drop(r);
            let seized = ptrace::seize(child, options());
            // The child goes on either way (untraced if the seize failed).
            drop(w);
            seized.with_context(|| format!("cannot trace {child} (ptrace PTRACE_SEIZE)"))?;
            Ok(child)
        }
    }
}

/// Set by SIGINT or SIGTERM to the tracer: leave the program running.
pub static DETACH: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: i32) {
    DETACH.store(true, Ordering::Relaxed);
}

/// SIGINT, SIGTERM and SIGHUP make the tracer detach; its waits are
/// interrupted (no SA_RESTART) so that it notices.
pub fn catch_signals() -> Result<()> {
    let sa = SigAction::new(SigHandler::Handler(on_signal), SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { signal::sigaction(sig, &sa) }?;
    }
    Ok(())
}
