//! Which session the process has, if any: made once (by the session
//! room's maker, handed in), stopped for good (a loss, a detach), a new
//! one in a forked child; and the gate that holds the program's threads
//! after the end of `exit` began.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};

use super::Session;
use crate::platform::sys;

const UNINIT: u8 = 0;
const INITIALIZING: u8 = 1;
const READY: u8 = 2;
const DISABLED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// The thread that ends the process, from the end of its `exit` on (its
/// tid; 0: none): every other thread of the program that asks for the
/// session then stops there for good ([`close_the_gate`]).
static EXIT_GATE: AtomicU32 = AtomicU32::new(0);
static SESSION: AtomicPtr<Session> = AtomicPtr::new(std::ptr::null_mut());
static GEN: AtomicU64 = AtomicU64::new(0);

/// The generation of a session being made: one more than the last.
pub(super) fn next_generation() -> u64 {
    GEN.fetch_add(1, Ordering::Relaxed) + 1
}

/// The current session, made by `start` on first use (the session room's
/// creation: `crate::session::get`); `None` when tracing is off (the trace
/// file could not be created, a detach). A thread of the program that asks
/// after the end of `exit` began stops here ([`close_the_gate`]).
pub fn get_or_start(start: impl FnOnce() -> Option<Session>) -> Option<&'static Session> {
    let mut start = Some(start);
    loop {
        match STATE.load(Ordering::Acquire) {
            READY => {
                // SAFETY: SESSION is set before READY and sessions are never freed.
                let s = unsafe { &*SESSION.load(Ordering::Acquire) };
                if EXIT_GATE.load(Ordering::Relaxed) != 0 {
                    at_the_gate(s);
                }
                return Some(s);
            }
            DISABLED => return None,
            UNINIT => {
                if STATE.compare_exchange(UNINIT, INITIALIZING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                    install(start.take().and_then(|f| f()));
                }
            }
            _ => std::thread::yield_now(),
        }
    }
}

fn install(s: Option<Session>) {
    match s {
        Some(s) => {
            SESSION.store(Box::into_raw(Box::new(s)), Ordering::Release);
            STATE.store(READY, Ordering::Release);
        }
        None => STATE.store(DISABLED, Ordering::Release),
    }
}

/// From the end of `exit` on, in a process with other threads: each of
/// them that enters a hook (asks for the session) stops there for good,
/// holding none of the tracer's locks, so that a thread that allocates
/// makes no progress while the tracer scans and writes the end of the
/// trace, as natively the process would be gone (the others are held from
/// outside: `snapshot::hold_for_exit`). The calling thread and the writer
/// go on.
pub fn close_the_gate() {
    EXIT_GATE.store(sys::gettid(), Ordering::Release);
}

/// A thread at the closed gate ([`close_the_gate`]): stops for good, but
/// the thread ending the process and the writer. The exit_group ends it.
#[cold]
#[inline(never)]
fn at_the_gate(s: &Session) {
    let me = sys::gettid();
    let exiting = EXIT_GATE.load(Ordering::Acquire);
    if exiting == 0 || exiting == me || s.writer_tid.load(Ordering::Acquire) == me || s.pid != sys::getpid() {
        return;
    }
    loop {
        sys::futex_wait_forever(&EXIT_GATE, exiting);
    }
}

/// The generation of the newest session (see [`Session::gen`]).
#[inline(always)]
pub fn generation() -> u64 {
    GEN.load(Ordering::Relaxed)
}

/// False once tracing is off in this process (the trace could not be
/// created, a forked child not followed, a detach): no event will be
/// stamped.
pub fn tracing_may_start() -> bool {
    STATE.load(Ordering::Relaxed) != DISABLED
}

/// The session if one exists, without creating it.
pub fn current() -> Option<&'static Session> {
    if STATE.load(Ordering::Acquire) == READY {
        // SAFETY: as in get().
        Some(unsafe { &*SESSION.load(Ordering::Acquire) })
    } else {
        None
    }
}

/// Tracing stopped for good with the trace lost (its file or socket
/// failed), and `mtrace attach`'s redirections were not undone yet: the
/// session undoes them when it finds this ([`stopped_by_loss`]).
static LOST: AtomicBool = AtomicBool::new(false);

/// The trace was lost (`lost`) or detached: no more events are recorded,
/// the writer stops. After a loss, the session room puts back the calls
/// `mtrace attach` redirected at the next hook or writer round
/// ([`stopped_by_loss`]); a detach does it itself, first.
pub(super) fn stop_tracing(lost: bool) {
    STATE.store(DISABLED, Ordering::Release);
    if lost {
        LOST.store(true, Ordering::Release);
    }
}

/// True once after the trace was lost ([`stop_tracing`]): the caller
/// undoes `mtrace attach`'s redirections.
pub fn stopped_by_loss() -> bool {
    LOST.load(Ordering::Relaxed) && LOST.swap(false, Ordering::AcqRel)
}

/// A session made by `start` (`mtrace attach`'s), in a process with none:
/// the first attach, or one after a detach. False when it could not start.
pub fn start_late(start: impl FnOnce() -> Option<Session>) -> bool {
    let state = STATE.load(Ordering::Acquire);
    if state == READY || STATE.compare_exchange(state, INITIALIZING, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return false;
    }
    install(start());
    STATE.load(Ordering::Acquire) == READY
}

/// In a forked child: the session `start` makes (its own file), or,
/// without one, tracing off.
pub fn restart_in_child(start: Option<impl FnOnce() -> Option<Session>>) {
    // A fork made after the gate closed: the child's own threads go on.
    EXIT_GATE.store(0, Ordering::Release);
    match start {
        Some(start) => install(start()),
        None => STATE.store(DISABLED, Ordering::Release),
    }
}
