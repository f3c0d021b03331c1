//! The session: what drives the stream. It is made at the program's first
//! event (from the hook that sees it), by the constructor, by `mtrace
//! attach` or in a forked child; its writer's rounds run on the writer
//! thread (writer.rs) or, while the process has one thread, on the
//! program's own thread inside its hooks (solo.rs); it reads the
//! commands of a socket's reader (commands.rs) and answers the report and
//! scan signals (requests.rs). It sits above lifecycle, snapshot and
//! record and calls them directly; the stream below holds the data it
//! drives.

pub mod attach;
pub mod commands;
pub mod requests;
pub mod solo;
pub mod writer;

use crate::platform::{config, real, sys};
use crate::record::guard::Guard;
use crate::stream::{self, Session};
use crate::{lifecycle, snapshot};

/// The current session, made at the first call (the program's first
/// event, of a process that loaded the library at its start: the stream
/// has all of its heap); `None` when tracing is off. A thread of the
/// program that asks after the end of `exit` began stops here
/// (`stream::close_the_gate`). After the trace was lost, the first caller
/// puts back the calls `mtrace attach` redirected.
#[inline]
pub fn get() -> Option<&'static Session> {
    let s = stream::get_or_start(|| create(true, None));
    if s.is_none() && stream::stopped_by_loss() {
        lifecycle::attach::undo();
    }
    s
}

/// True once after the trace was lost (`stream::stopped_by_loss`), with
/// `mtrace attach`'s redirections and signal handlers undone here.
#[cold]
pub fn stopped_by_loss() -> bool {
    let lost = stream::stopped_by_loss();
    if lost {
        lifecycle::attach::undo();
    }
    lost
}

/// A new session's stream (see `Session::create` for `from_start` and
/// `parent`), once the functions the tracer and the hooks call are
/// resolved and the settings given to the rooms that keep them
/// ([`lifecycle::starting`]).
fn create(from_start: bool, parent: Option<u32>) -> Option<Session> {
    real::init();
    let cfg = config::load();
    lifecycle::starting(&cfg);
    Session::create(&cfg, from_start, parent)
}

/// The writer thread (or a solo process's thread) was asked for a leak
/// scan: a snapshot taken by it, then the scan's report point.
pub fn scan_by_writer(s: &Session) {
    snapshot::scan_point(s, snapshot::By::asked(s), None, None);
}

/// Library constructor. Events before it (other libraries' constructors)
/// are already recorded: the session starts lazily on the first event;
/// this adds fatal-signal handlers and fork handlers, and the writer
/// thread where the process has more than one thread already.
pub extern "C" fn init() {
    let _g = Guard::enter();
    // Loaded by `mtrace attach`: dormant until it calls mtrace_attach_init.
    if !lifecycle::constructing() {
        return;
    }
    let Some(s) = get() else { return };
    // An allocator in the executable wins over the hooks by name: its
    // entry points are patched, before anything below looks for them.
    lifecycle::patch::executable(s);
    // A process with one thread stays so (solo::leave_solo): another
    // library's constructor may have started one already.
    if sys::numbered_entries(c"/proc/self/task").len() > 1 {
        solo::leave_solo();
    }
    lifecycle::constructed(s, requests::HANDLERS, after_fork_child);
}

/// pthread_atfork child: a session of the child's own (its own file),
/// where the parent's follows forks, or tracing off. The parent's blocks
/// are the child's too, unseen by its stream; the child has one thread:
/// solo, as at a process's start.
extern "C" fn after_fork_child() {
    let Some((follow, parent)) = lifecycle::fork::in_child() else { return };
    let _g = Guard::enter();
    stream::restart_in_child(follow.then_some(|| create(false, Some(parent))));
}
