//! Fatal signals: the trace is flushed before the process dies, then the
//! signal takes its default action, so the exit status (and core dump) are
//! the same as without the tracer. Installed only where the program left
//! the default action; a handler the program installs later replaces ours.

use mtrace_format::EndReason;

use crate::recorder;

/// The signals whose default action ends the process that a program meets
/// in practice: faults, abort, and the ones a user or a pipe sends (Ctrl-C,
/// `kill`, a closed terminal, Ctrl-\, a reader that went away). Without a
/// flush, the events of the last writer round (up to 5 ms) were lost when
/// `mtrace run` passed a SIGINT on early (process.rs's signal test failed
/// 4 runs in 30).
const FATAL: [i32; 10] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGPIPE,
];

extern "C" fn on_fatal(sig: i32) {
    let _g = crate::guard::Guard::enter();
    recorder::final_flush(EndReason::Signal(sig as u32), true);
    // SA_RESETHAND restored the default action; the re-raised signal is
    // delivered when this handler returns (or at once) and ends the process.
    // SAFETY: raise is async-signal-safe.
    unsafe { libc::raise(sig) };
}

pub fn install() {
    for sig in FATAL {
        // SAFETY: sigaction with valid pointers; only replaces SIG_DFL.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction != libc::SIG_DFL {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_fatal as extern "C" fn(i32) as usize;
            sa.sa_flags = libc::SA_RESETHAND | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}
