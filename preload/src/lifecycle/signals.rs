//! Fatal signals: the trace is flushed (after a leak scan, when the session
//! scans) before the process dies, then the signal takes its default
//! action, so the exit status (and core dump) are the same as without the
//! tracer. Installed only where the program left
//! the default action; a handler the program installs later replaces ours.

use std::sync::atomic::{AtomicI32, Ordering};

use mtrace_format::EndReason;

use crate::{platform::sys, record::recorder};

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

/// The thread that handles the first fatal signal (0: none yet). Every
/// other thread that meets one waits for it: the process ends once, after
/// one flush (with `SA_RESETHAND`, a second thread faulting during the
/// first one's flush took the default action and ended the process
/// mid-flush, leaving traces without an end and sometimes without events).
static HANDLER: AtomicI32 = AtomicI32::new(0);

/// How long a thread waits for another thread's flush and scan before it
/// ends the process itself (the flush gives up on a lock after ~2 s; the
/// scan reads memory at GB/s).
const WAIT_FOR_FLUSH_MS: u32 = 60_000;

/// Makes the calling thread the one that ends the process (the program's
/// `abort()` calls it before its scan and flush); false if another thread
/// already is.
pub fn claim_the_end() -> bool {
    let me = sys::gettid() as i32;
    match HANDLER.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => true,
        Err(t) => t == me,
    }
}

/// In a forked child: no thread of its own is ending it (a thread of the
/// parent that was is not in the child).
pub fn reset_in_child() {
    HANDLER.store(0, Ordering::Release);
}

extern "C" fn on_fatal(sig: i32, _: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let me = sys::gettid() as i32;
    match HANDLER.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        // A fault inside this thread's own flush, or the signal of the
        // program's abort() after its flush: end at once.
        Err(t) if t == me => die(sig),
        Err(_) => {
            for _ in 0..WAIT_FOR_FLUSH_MS {
                // The flush's scan stops the threads: this one answers
                // with the registers its own signal interrupted.
                crate::snapshot::stop::park_in_signal(ctx);
                sys::sleep_ms(1);
            }
            die(sig)
        }
    }
    let _g = crate::record::guard::Guard::enter();
    scan(ctx);
    recorder::final_flush(EndReason::Signal(sig as u32), true);
    die(sig)
}

/// The leak scan of a process that dies of a signal, as at exit (docs/SCAN.md):
/// the calling thread's roots are the registers the signal interrupted
/// and its stack from there. Skipped, with one line, where it could not
/// end: the tracer's heap stays locked (the signal interrupted the tracer
/// in it).
fn scan(ctx: *mut libc::c_void) {
    let Some(s) = crate::stream::current() else { return };
    if !s.scan || s.pid != sys::getpid() || s.is_finished() || s.writer_tid() == sys::gettid() {
        return;
    }
    if !crate::platform::allocator::free_within(1000) {
        // Written as it is: sys::warn would allocate from that heap.
        sys::write_all(2, b"mtrace: no leak scan: the fatal signal interrupted the tracer inside its own heap\n");
        return;
    }
    let (regs, live_from) = crate::snapshot::stop::interrupted(ctx);
    crate::snapshot::take(s, crate::snapshot::By::Interrupted { regs, len: regs.len(), live_from });
}

/// Ends the process with `sig`'s default action (and its core dump, where
/// the system makes one), as it would have ended without the tracer.
fn die(sig: i32) -> ! {
    // SAFETY: sigaction, sigprocmask and raise are async-signal-safe and
    // get valid pointers; exit_group does not return.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
        // Not reached: every signal of FATAL ends the process by default.
        libc::syscall(libc::SYS_exit_group, 128 + sig);
        std::hint::unreachable_unchecked()
    }
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
            sa.sa_sigaction = on_fatal as extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) as usize;
            // No SA_RESETHAND: a second thread's fatal signal must reach
            // the one flush too (see HANDLER).
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}
