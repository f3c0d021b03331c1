//! The library's life in a process: its constructor's parts and the
//! destructor, the end of `exit`, fork, fatal signals, the report and
//! scan signals' installation, the executable's allocator patched, and
//! `mtrace attach`'s redirections. Calls down into snapshot, record,
//! stream, unwind and platform; the session room above drives it.

pub mod attach;
pub mod fork;
pub mod patch;
pub mod requests;
pub mod signals;

use mtrace_format::EndReason;

use crate::platform::{real, sys};
use crate::record::guard::Guard;
use crate::record::recorder;
use crate::snapshot;
use crate::stream;

/// The library constructor's first part (session/mod.rs's `init` is the
/// constructor): the thread-locals the hooks reach from the thread
/// pointer found; false when `mtrace attach` loaded the library (it stays
/// dormant until `mtrace_attach_init`). The caller holds the guard.
pub fn constructing() -> bool {
    crate::record::slot::find_static_tls();
    crate::record::nested::find_static_tls();
    crate::record::recorder::find_static_tls();
    real::find_static_tls();
    fork::find_static_tls();
    attach::preloaded()
}

/// The constructor's part after its session `s` started (and its writer
/// thread, where the process has more than one thread already): fatal
/// signals' handlers, the report and scan signals' `handlers`, the fork
/// handlers (the child's `child`), the end of `exit`, the allocators'
/// own entry points followed.
pub fn constructed(s: &stream::Session, handlers: [requests::Handler; 2], child: extern "C" fn()) {
    if s.scan {
        // Looked up now: a fatal signal's scan must not ask the loader.
        snapshot::own_range(true);
    }
    real::resolve_the_end();
    signals::install();
    requests::install(s, handlers);
    if !s.follow_exec {
        sys::drop_from_preload("libmtrace.so");
    }
    fork::install_once(child);
    AT_THE_END.store(real::at_the_end_of_exit(the_end), std::sync::atomic::Ordering::Release);
    // jemalloc's `mallocx`, mimalloc's `mi_malloc`…: through the GOT.
    attach::follow_entry_points();
}

/// [`the_end`] is registered to run at the end of `exit`.
static AT_THE_END: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Library destructor: runs in `exit()` after the program's atexit
/// handlers, among the libraries' destructors. The end of the trace waits
/// for [`the_end`], after all of them, where it could be registered.
pub extern "C" fn fini() {
    if !AT_THE_END.load(std::sync::atomic::Ordering::Acquire) {
        end_of_exit(None);
    }
}

/// The last of `exit`'s handlers: after the program's atexit handlers and
/// every library's destructor (libstdc++'s, libpython's), as memcheck's
/// end comes after them; told the exit status.
extern "C" fn the_end(status: i32, _: *mut libc::c_void) {
    end_of_exit(Some(status as u8));
}

/// The end of a process that exits (with `status`, where known): glibc's
/// freeres, the leak scan, the trace's end; later events are written
/// synchronously.
fn end_of_exit(status: Option<u8>) {
    // What glibc keeps for the process's lifetime is not the program's
    // leak: it frees it, outside any hook so that its frees are recorded
    // (docs/SCAN.md). It also empties the environment (setenv.c's
    // free_mem): nothing may run after it that reads it. Only where no
    // other thread of the program runs: freeres frees what a running
    // thread may be using (the loader's dependency lists under a dlclose:
    // ctests/loader_busy.c crashed in 1 run of about 350), as valgrind
    // runs it only once the other threads are gone.
    if let Some(s) = stream::current() {
        if s.freeres && s.pid == sys::getpid() && !s.is_finished() && alone(s) {
            real::libc_freeres();
        }
    }
    let _g = Guard::enter();
    // Natively the process would be gone now: the program's other threads
    // make no progress while the tracer scans and writes the trace's end
    // (held until the exit_group ends them; LeakSanitizer's libdl_deadlock
    // test's thread made 49 more steps of work under mtrace run).
    let mut held = None;
    if let Some(s) = stream::current().filter(|s| s.pid == sys::getpid() && !s.is_finished()) {
        // The roots: the program's frame that called exit (a return from
        // main calls it too), not the exit path below it. Found before
        // the threads are held: the unwinder may ask the loader.
        let by = s.scan.then(|| snapshot::By::program_calling(real::libc_exit()));
        if !alone(s) {
            // A thread that allocates stops at once, at its next hook.
            stream::close_the_gate();
            // A held thread may hold the loader's lock.
            s.leave_the_loader();
            held = snapshot::hold_for_exit(s);
        }
        match (by, &held) {
            (Some(by), Some(h)) => _ = snapshot::take_held(s, by, h),
            (Some(by), None) => _ = snapshot::take(s, by),
            (None, _) => {}
        }
    }
    recorder::final_flush(EndReason::Exit(status), false);
    // Never let go: the process ends with them.
    std::mem::forget(held);
}

/// Whether the calling thread is the program's only one (the writer
/// aside).
fn alone(s: &stream::Session) -> bool {
    let (me, writer) = (sys::gettid() as i32, s.writer_tid() as i32);
    sys::numbered_entries(c"/proc/self/task").into_iter().all(|t| t == me || t == writer)
}

/// A session starts (its settings read, before its stream is made):
/// collection is on or off as `MTRACE_START` says, and sampling as
/// `MTRACE_SAMPLE_RATE` says.
pub fn starting(cfg: &crate::platform::config::Recording) {
    recorder::init_collecting(cfg.start);
    crate::record::sample::configure(cfg.sample_rate, cfg.sample_seed);
}
