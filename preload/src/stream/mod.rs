//! One trace stream: its file, the registry of per-thread buffers, the
//! order of their records, what a writer's round writes, and the final
//! flush. A process has one session; a forked child starts a new one. What
//! drives the stream (its creation, the writer thread's and a solo
//! process's rounds, the commands) is the session room above (session/),
//! which calls down into this one and the rooms between.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use mtrace_format::{encode_header, naming, Encoder, Header, Record};
use parking_lot::Mutex;

pub mod answers;
mod buffer;
mod control;
mod end;
pub(crate) use end::lock;
pub mod order;
mod output;
pub mod reports;
mod rounds;
pub mod spawned;
mod state;
mod writer;
mod zstd;

pub use buffer::{BufInner, Handoff, ThreadBuf};
pub use order::Mark;
pub use rounds::Rounds;
use state::stop_tracing;
pub use state::{
    close_the_gate, current, generation, get_or_start, restart_in_child, start_late, stopped_by_loss, tracing_may_start,
};
pub use writer::FileHold;

use crate::platform::clock::Clock;
use crate::{platform::config, platform::modules, platform::sys, unwind};

/// A thread's buffer becomes "full" and goes to the writer at this size.
pub const FLUSH_AT: usize = 60 * 1024;
/// Capacity of a fresh buffer: FLUSH_AT plus room for one large record.
pub const BUF_CAP: usize = 64 * 1024;
/// Full buffers the writer has not written yet, bytes, beyond which threads
/// wait for it: the tracer's memory stays bounded when the program makes
/// events faster than the writer compresses them (two threads on two cores
/// reached 76 MiB of peak RSS without this, 15 MiB natively).
pub const PENDING_MAX: usize = 8 << 20;
/// Full buffers, bytes, beyond which a process with one thread writes
/// them at its next event of the malloc family rather than at its next
/// round (session/solo.rs).
const SOLO_PENDING: usize = 1 << 20;
/// Marker name of the reports the report signal asks for.
pub const SIGNAL_REPORT: &str = mtrace_format::protocol::marker::SIGNAL;
/// Marker name that follows an on-demand leak scan: its report covers
/// everything live, classified (not the change since the last report).
pub const SCAN_REPORT: &str = mtrace_format::protocol::marker::SCAN;
/// How often the writer thread wakes (commands, report and scan requests,
/// RSS samples, full buffers), ms.
pub const WRITER_POLL_MS: u64 = 5;
/// The longest the writer goes without collecting every thread's buffer
/// while none is full, ms. A collection interrupts every running thread
/// of the program (`membarrier`, buffer.rs), so a quiet or sampled
/// program is not interrupted every round: jq sampled at 512K ran 1.077x
/// native with a collection every 5 ms and 1.037x with one every 50 ms
/// (`scripts/ab_preload --runs 31`, docs/SAMPLING.md). It bounds what a
/// SIGKILL loses of a quiet program and how far a live reader lags.
pub const QUIET_COLLECT_MS: u64 = 50;
/// RSS is sampled every this many writer rounds (10 ms).
pub const SAMPLE_EVERY: u64 = 2;
/// Writer rounds between two looks for threads that ended before their
/// exit was registered (record/thread.rs; a system call per such thread):
/// about a second.
pub const REAP_EVERY: u64 = 1000 / WRITER_POLL_MS;

pub struct Session {
    /// Bumped for every new session (fork): thread state of an older one is reset.
    pub gen: u64,
    pub pid: u32,
    /// Event times (ns since `start_mono`).
    clock: Clock,
    /// Frames per backtrace (a command may change it).
    depth: AtomicUsize,
    /// The unwinder (`MTRACE_UNWINDER`).
    pub unwinder: unwind::Unwinder,
    /// The signal that asks for an incremental report, if any.
    pub report_signal: Option<i32>,
    /// The signal that asks for a leak scan and its report, if any.
    pub scan_signal: Option<i32>,
    /// Snapshot memory for the leak scan at exit (`MTRACE_SCAN`).
    pub scan: bool,
    /// Frees record their backtraces (`MTRACE_CHECK_FREES`).
    pub check_frees: bool,
    /// glibc frees what it keeps at exit (`MTRACE_FREERES`).
    pub freeres: bool,
    /// Kernel thread id of the writer thread (0 until it runs): it is the
    /// tracer's, never stopped or scanned.
    pub writer_tid: AtomicU32,
    /// The writer thread was started (its id may not be known yet).
    pub writer_started: AtomicBool,
    /// The writer thread's stack, [low, high): the tracer's, never scanned.
    pub writer_stack: [AtomicU64; 2],
    /// No writer thread: the process has had one thread so far, and that
    /// thread does the writer's rounds at its events (`Session::round_due`,
    /// session/solo.rs).
    /// Some processes must stay single-threaded (a zygote that forks,
    /// `unshare(CLONE_NEWUSER)`); the writer starts with the second thread.
    pub(crate) solo: AtomicBool,
    /// While solo, the time (ns) from which an event does the next round;
    /// `u64::MAX` once the writer runs.
    pub(crate) next_round: AtomicU64,
    /// A thread not seen being created wants the writer thread started
    /// (see [`Session::want_writer`]).
    writer_wanted: AtomicBool,
    /// The rounds' state while solo.
    pub(crate) solo_rounds: Mutex<Rounds>,
    /// The block of the allocation whose hook makes a solo round (see
    /// [`Session::unrecorded_block`]).
    pub(crate) round_block: [AtomicU64; 2],
    /// Trace forked children (`MTRACE_FOLLOW_FORK`).
    pub follow_fork: bool,
    /// Trace programs this one execs (`MTRACE_FOLLOW_EXEC`).
    pub follow_exec: bool,
    pub reporter: crate::stream::reports::Reporter,
    /// The trace file.
    out: output::Output,
    /// Held while anything writes to `out`, so that buffers never
    /// interleave, and while the hooks of `close` and `dup2` move it.
    pub(crate) file: Mutex<()>,
    /// Threads other than the writer waiting for `file` (writer.rs,
    /// `lock_file`): the writer lets them go first.
    file_wanted: AtomicU32,
    /// The writer's compression context (made on first use), and its
    /// mapping's range for the snapshot to leave out.
    zstd: Mutex<Option<zstd::Zstd>>,
    zstd_range: [AtomicU64; 2],
    threads: Mutex<Vec<Arc<ThreadBuf>>>,
    /// How threads' buffers are taken from them (buffer.rs).
    pub handoff: Handoff,
    /// The latest watermark written, ns (order.rs).
    last_watermark: AtomicU64,
    /// Every record written so far is stamped before this, ns.
    pub(crate) written_until: AtomicU64,
    /// Test-only perturbations of the order (`MTRACE_TEST_ORDER`).
    pub test: mtrace_format::recording::TestOrder,
    /// Bytes in threads' full buffers (see [`PENDING_MAX`]).
    pub(crate) pending: AtomicUsize,
    /// Set when a wait for the writer timed out: threads no longer wait.
    throttle_off: AtomicBool,
    next_stack: AtomicU32,
    /// Set by the final flush: from then on events are written synchronously.
    finished: AtomicBool,
    /// The End record has been written.
    ended: AtomicBool,
    /// Scratch for the End record, allocated up front so that the flush in a
    /// signal handler does not allocate.
    end_buf: Mutex<Vec<u8>>,
    /// `modules::generation()` when the module list was last written.
    modules_gen: Mutex<(u64, u64)>,
    /// The loader is asked no more ([`Session::leave_the_loader`]).
    loader_off: AtomicBool,
}

/// Creates the trace file (`MTRACE_OUTPUT`, or `<prog>.<pid>.mtrace` in
/// the working directory), and its absolute path: the analyzer that makes
/// incremental reports, and a reopening after the program closed the
/// descriptor, must find it after a `chdir`.
fn open_output(cfg: &config::Recording, pid: u32, prog: &str) -> Option<(output::Output, String)> {
    let path = match &cfg.output {
        Some(p) => naming::expand(p, pid, prog),
        None => format!("{prog}.{pid}.mtrace"),
    };
    match output::Output::connect(&path) {
        Some(Ok(out)) => return Some((out, path)),
        Some(Err(e)) => {
            sys::warn(&format!("cannot connect to {path}: {e}; not tracing this process"));
            return None;
        }
        None => {}
    }
    let path = match std::env::current_dir() {
        Ok(cwd) if !path.starts_with('/') => cwd.join(&path).to_string_lossy().into_owned(),
        _ => path,
    };
    // An exec keeps the pid: the new image must not overwrite the old
    // image's trace, so a taken name gets a numeric suffix.
    let mut last_err = 0;
    for candidate in naming::candidates(&path) {
        match output::Output::create(&candidate) {
            Ok(out) => return Some((out, candidate)),
            Err(libc::EEXIST) => continue,
            Err(e) => {
                last_err = e;
                break;
            }
        }
    }
    let msg = match last_err {
        // Every name was taken (a fixed MTRACE_OUTPUT for many processes).
        0 => format!("it and {path}.1 to {path}.{} exist (name each process's trace with %p)", naming::MAX_SUFFIX),
        libc::EISDIR => "it is a folder".to_owned(),
        libc::ENXIO => "a FIFO nobody reads".to_owned(),
        libc::ENODEV => "it exists and is neither a regular file, the null device nor a FIFO".to_owned(),
        e => std::io::Error::from_raw_os_error(e).to_string(),
    };
    sys::warn_once_per_run(&format!("cannot create trace file {path}: {msg}; not tracing this process"));
    None
}

impl Session {
    /// A new stream. `from_start`: the process has made no heap block
    /// that this session does not see (its first event, not a fork child's
    /// or an attach's): with collection on, the stream says it is whole
    /// ([`Record::Coverage`]), so that the analyzer can call a free of an
    /// unknown address invalid. With `MTRACE_START=off` it says that
    /// allocations are not collected. `parent`: a fork child's parent pid,
    /// for its header (else the kernel's `getppid`).
    /// `cfg`: the settings read, already given to the rooms that keep them.
    pub fn create(cfg: &config::Recording, from_start: bool, parent: Option<u32>) -> Option<Session> {
        let pid = sys::getpid();
        let cmdline = naming::cmdline_args(&sys::read_file(c"/proc/self/cmdline").unwrap_or_default());
        let exe = sys::readlink(c"/proc/self/exe").unwrap_or_default();
        let prog = naming::program_name(&cmdline, &exe);
        let (out_file, path) = open_output(cfg, pid, &prog)?;
        sys::open_statm();
        unwind::init();
        let start_mono = sys::monotonic_ns();
        // A fork's child names the process it was copied from: asked of
        // the kernel here, after the work above, a parent that exited
        // meanwhile (a shell's `cmd &` then `exit`) was init, and the
        // child a root of the report's process tree.
        let ppid = parent.unwrap_or_else(sys::getppid);
        let header = Header::of_process(pid, ppid, exe, cmdline, (sys::realtime_ns(), start_mono));
        let mut out = Vec::with_capacity(4096);
        encode_header(&mut out, &header);
        // Read the generation before listing so that a concurrent dlopen is
        // noticed by the writer rather than missed.
        let modules_gen = modules::generation();
        let mut enc = Encoder::new();
        enc.encode(&mut out, &Record::Thread { tid: sys::gettid(), time_ns: 0 });
        enc.encode(&mut out, &Record::Modules { time_ns: 0, modules: modules::list() });
        if !cfg.start || from_start {
            let (collecting, whole) = (cfg.start, from_start && cfg.start);
            enc.encode(&mut out, &Record::Coverage { time_ns: 0, collecting, whole });
        }
        // A fork's child: the executable's allocator was patched before
        // it, and its stream says so from its start.
        if let Some(rec) = crate::platform::patch::remembered() {
            enc.encode(&mut out, &rec);
        }
        if cfg.sample_rate != 0 {
            enc.encode(&mut out, &Record::Sampling { time_ns: 0, rate: cfg.sample_rate });
        }
        // The RSS at the start, which later samples (rounds, the end) grow from.
        if let Some(rss) = sys::rss_bytes() {
            enc.encode(&mut out, &Record::Sample { time_ns: 0, rss });
        }
        out_file.write(&out);
        let handoff = Handoff::new();
        order::reset(!handoff.is_fast());
        Some(Session {
            gen: state::next_generation(),
            pid,
            clock: Clock::new(start_mono, cfg.clock == mtrace_format::recording::Clock::Tsc),
            depth: AtomicUsize::new(cfg.depth),
            unwinder: cfg.unwinder,
            // Both installed on a socket too, where a report point (or
            // a scan) is only what it writes into the stream for the
            // reader (which writes the .memlog if it keeps the books:
            // `mtrace run --max-trace-size`, `mtrace keep`): the signal's
            // default action would end the program (`kill -USR1` under
            // `mtrace server` did).
            report_signal: cfg.report_signal,
            scan_signal: cfg.scan_signal,
            scan: cfg.scan,
            check_frees: cfg.check_frees,
            freeres: cfg.freeres,
            writer_tid: AtomicU32::new(0),
            writer_started: AtomicBool::new(false),
            writer_stack: [AtomicU64::new(0), AtomicU64::new(0)],
            solo: AtomicBool::new(true),
            next_round: AtomicU64::new(0),
            writer_wanted: AtomicBool::new(false),
            solo_rounds: Mutex::new(Rounds::new()),
            round_block: [AtomicU64::new(0), AtomicU64::new(0)],
            follow_fork: cfg.follow_fork,
            follow_exec: cfg.follow_exec,
            reporter: crate::stream::reports::Reporter::new(
                path,
                &prog,
                pid,
                cfg.report_dir.clone(),
                out_file.is_socket(),
            ),
            out: out_file,
            file: Mutex::new(()),
            file_wanted: AtomicU32::new(0),
            zstd: Mutex::new(None),
            zstd_range: [AtomicU64::new(0), AtomicU64::new(0)],
            threads: Mutex::new(Vec::new()),
            handoff,
            last_watermark: AtomicU64::new(0),
            written_until: AtomicU64::new(0),
            test: cfg.test_order,
            pending: AtomicUsize::new(0),
            throttle_off: AtomicBool::new(false),
            next_stack: AtomicU32::new(1),
            finished: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            end_buf: Mutex::new(Vec::with_capacity(256)),
            modules_gen: Mutex::new(modules_gen),
            loader_off: AtomicBool::new(false),
        })
    }

    /// ns since the session started.
    #[inline]
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Frames recorded per backtrace.
    #[inline]
    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// Records at most `d` frames per backtrace from now on.
    pub fn set_depth(&self, d: usize) {
        self.depth.store(d, Ordering::Relaxed);
    }

    /// A new backtrace id, unique in this stream.
    pub fn new_stack_id(&self) -> u32 {
        self.next_stack.fetch_add(1, Ordering::Relaxed)
    }

    /// True once the final flush began: events then go through [`Session::write_sync`].
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst)
    }

    /// A thread filled a buffer of `len` bytes; true when the writer is so
    /// far behind that the thread should [`Session::throttle`].
    pub fn buffer_full(&self, len: usize) -> bool {
        let pending = self.pending.fetch_add(len, Ordering::Relaxed) + len;
        // Solo: the round 5 ms after the last writes the full buffers in
        // one block; sooner only when they are many (a round per buffer
        // cost sqlite3 a statm read, a membarrier and a small zstd block
        // every 60 KiB).
        if pending > SOLO_PENDING {
            self.round_soon();
        }
        pending > PENDING_MAX
    }

    /// Waits (outside every lock) until the writer caught up to half of
    /// [`PENDING_MAX`]; stops waiting for good when it makes no progress in
    /// 100 ms (a writer that is not running).
    pub fn throttle(&self) {
        if self.throttle_off.load(Ordering::Relaxed) || !self.writer_started.load(Ordering::Acquire) {
            return;
        }
        for _ in 0..1000 {
            if self.pending.load(Ordering::Relaxed) <= PENDING_MAX / 2 || self.is_finished() {
                return;
            }
            sys::sleep_us(100);
        }
        self.throttle_off.store(true, Ordering::Relaxed);
    }

    /// The writer's compression context's mapping, [start, end) ((0, 0)
    /// before its first use): the tracer's memory, for the snapshot.
    pub fn zstd_range(&self) -> (u64, u64) {
        (self.zstd_range[0].load(Ordering::Acquire), self.zstd_range[1].load(Ordering::Acquire))
    }

    /// Registers a new thread's buffer with the writer. A thread's first
    /// event may come from inside the program's allocator
    /// (record/thread.rs): the list is taken without parking, whose slow
    /// path could call the allocator (platform/spin.rs).
    pub fn register(&self) -> Arc<ThreadBuf> {
        let b = Arc::new(ThreadBuf::new());
        crate::platform::spin::lock_unparked(&self.threads).push(b.clone());
        b
    }

    /// Before the program's other threads are held for good (the end of
    /// `exit`: one may hold the loader's lock, in a `dl_iterate_phdr`
    /// callback): the loader is asked nothing more, the writer's rounds
    /// and the final flush look for loaded libraries no more. Not even
    /// once now: asking waits for a thread inside such a callback to leave
    /// it (ctests/exit_busy.c's made its 50 steps of work meanwhile). A
    /// library loaded in the last round's 5 ms is not in the module list.
    pub fn leave_the_loader(&self) {
        self.loader_off.store(true, Ordering::Release);
    }

    /// Whether a thread may be inside an append to its buffer, or a change
    /// of the list of buffers (its lock is taken): one held there for good
    /// would hold up every later collection (`snapshot::hold_for_exit`).
    pub fn appending(&self) -> bool {
        let Some(list) = self.threads.try_lock() else { return true };
        list.iter().any(|t| !t.exited.load(Ordering::Acquire) && t.is_busy())
    }

    /// Writes `bytes` (complete records starting with a Thread record)
    /// straight to the file, after everything buffered by exited threads.
    /// Used after the final flush and by threads whose state is gone.
    pub fn write_sync(&self, bytes: &[u8]) {
        // A hook (platform/spin.rs: why not park).
        let _f = self.lock_file();
        if !self.is_finished() {
            self.collect(true);
        }
        self.write_unordered(bytes);
    }

    /// An incremental report: every thread's buffer is written, then a
    /// Marker, then the analyzer makes the .memlog (or `out`) from the
    /// file; nobody waits for it. False when no report was started.
    pub fn report_point(&self, name: &str, out: Option<&str>) -> bool {
        self.report_started(name, out).map(|started| self.reporter.keep(started)).is_some()
    }

    /// [`Session::report_point`], the report under way returned for the
    /// caller to wait for ([`reports::Reporter::wait`]): a thread inside
    /// a hook takes back its mark on the order first (the report reads up
    /// to the marker once a watermark passes it: `record::guard`'s
    /// `report_waited`).
    /// On a socket, a path asked for goes before the Marker (a Report to
    /// record, made absolute: the reader does not share our working
    /// directory), for the reader that makes the report.
    pub fn report_started(&self, name: &str, out: Option<&str>) -> Option<reports::Started> {
        let seq = self.reporter.next_seq();
        match out.filter(|_| self.reporter.on_socket()) {
            Some(path) => self.marker_to(seq, name, absolute(path)),
            None => self.marker(seq, name),
        }
        if name == SIGNAL_REPORT {
            self.reporter.marked();
        }
        self.reporter.start(seq, out, name != SCAN_REPORT)
    }
}

impl Session {
    /// Takes the locks a fork must not copy held by another thread (same
    /// order as the writer: file, then registry) and keeps them.
    pub fn hold_for_fork(&self) {
        std::mem::forget(self.file.lock());
        std::mem::forget(self.threads.lock());
    }

    /// Releases what [`Session::hold_for_fork`] took.
    ///
    /// # Safety
    /// The calling thread called `hold_for_fork` and nothing released them since.
    pub unsafe fn release_after_fork(&self) {
        // SAFETY: per the contract, this thread holds both locks.
        unsafe {
            self.file.force_unlock();
            self.threads.force_unlock();
        }
    }
}

/// `path` from the working directory when it is relative (as it stands,
/// should the directory be unknown).
fn absolute(path: &str) -> String {
    match std::env::current_dir() {
        Ok(cwd) if !path.starts_with('/') => cwd.join(path).display().to_string(),
        _ => path.to_owned(),
    }
}
