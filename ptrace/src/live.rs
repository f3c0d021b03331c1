//! Streams to a socket, for the console (`mtrace server --ptrace`, `mtrace
//! run --ptrace -i`): each process's stream goes to a socket (the output
//! `unix:PATH` or `tcp:HOST:PORT`, as `MTRACE_OUTPUT` for the preload), and its reader
//! sends commands back on it, one per line
//! (`mtrace_format::protocol::Command`: start, stop, depth N, marker NAME,
//! scan, detach; the reader closing the connection means detach).
//!
//! A thread per stream reads the commands into [`COMMANDS`]. The tracer
//! waits in `waitpid`, which only a signal interrupts: every [`TICK`], and
//! as soon as a command arrives, its thread gets [`WAKE`] (a handler that
//! does nothing, without SA_RESTART). Woken, the tracer carries out the
//! commands and hands what it collected to the writers, so that the
//! console sees the program as it is, within a tick, also when it makes no
//! calls.

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use anyhow::{Context, Result};
use mtrace_format::address::Socket;
use mtrace_format::protocol::Command;

/// How often the tracer flushes the streams and looks for commands.
pub const TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// The signal that wakes the tracer's thread.
pub const WAKE: i32 = libc::SIGURG;

/// Commands that arrived, with the pid of the process whose stream they
/// came on.
static COMMANDS: Mutex<Vec<(u32, Command)>> = Mutex::new(Vec::new());

/// The tracer's thread (0: no live stream yet).
static TRACER: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_wake(_: i32) {}

/// The commands that arrived since the last call.
pub fn take() -> Vec<(u32, Command)> {
    std::mem::take(&mut *COMMANDS.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Wakes the tracer's thread, if it waits.
fn wake() {
    let tid = TRACER.load(Ordering::Acquire);
    if tid != 0 {
        // SAFETY: tgkill with our own process and thread ids.
        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, WAKE) };
    }
}

/// Called by the tracer's thread before its first live stream: the wake
/// signal's handler, and a timer that sends it to this thread every
/// [`TICK`]. Once per process.
pub fn start_ticks() -> Result<()> {
    // SAFETY: gettid has no arguments.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    if TRACER.swap(me, Ordering::AcqRel) != 0 {
        return Ok(());
    }
    // SAFETY: a handler that does nothing; no SA_RESTART, so that it
    // interrupts waitpid.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_wake as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(WAKE, &sa, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error()).context("sigaction");
        }
    }
    std::thread::Builder::new().name("mtrace-tick".into()).spawn(|| loop {
        std::thread::sleep(TICK);
        wake();
    })?;
    Ok(())
}

/// Reads the command lines of process `pid`'s stream from `sock` until
/// it closes: a detach, then, unless `done` says the tracer ended the
/// stream itself (the process ended, or the tracer left), which shut the
/// connection down: a detach would make the tracer leave every other
/// process.
pub fn read_commands(sock: Socket, pid: u32, done: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let spawned = std::thread::Builder::new().name("mtrace-commands".into()).spawn(move || {
        let mut lines = BufReader::new(sock);
        let mut line = String::new();
        loop {
            line.clear();
            let cmd = match lines.read_line(&mut line) {
                Ok(0) | Err(_) if done.load(Ordering::Acquire) => return,
                Ok(0) | Err(_) => Some(Command::Detach),
                Ok(_) => match Command::parse(&line) {
                    Ok(c) => c,
                    Err(bad) => {
                        eprintln!("mtrace: unknown command {bad:?} ignored");
                        None
                    }
                },
            };
            let end = cmd == Some(Command::Detach);
            if let Some(c) = cmd {
                COMMANDS.lock().unwrap_or_else(|e| e.into_inner()).push((pid, c));
                wake();
            }
            if end {
                return;
            }
        }
    });
    if let Err(e) = spawned {
        eprintln!("mtrace: no commands for process {pid}: {e}");
    }
}
