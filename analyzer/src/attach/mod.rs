//! `mtrace attach PID`: trace a running process for a while, without
//! restarting it, then report what it allocated meanwhile and still holds.
//!
//! The process is made to load libmtrace.so (`dlopen`, through ptrace:
//! inject.rs) and to call its `mtrace_attach_init`, which starts a session
//! whose stream comes here over a UNIX socket (0600, in a folder of ours)
//! and redirects the process's calls to the hooks (preload/src/attach).
//! The stream is saved to a file as it arrives. At the end (`--duration`,
//! Ctrl-C, SIGTERM, or the process exiting) a `detach` command goes back
//! on the socket: the process puts its GOT entries back, writes its End
//! record and closes the stream, and goes on untraced. If `mtrace` itself
//! dies, the closed socket means detach too.

mod interval;
mod kept_modules;
mod owner;
mod ptrace;
mod save;
mod unseen;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use mtrace_format::protocol::Command;

use crate::arriving::listen::Listener;
use crate::flags::report::ReportFlags;
use crate::recording::{find_lib, RecordingArgs};
use crate::wake::Waker;

#[derive(clap::Args)]
pub struct AttachArgs {
    /// The process to trace.
    pid: i32,
    /// Detach after this long (500ms, 10s, 2m, …); default: at Ctrl-C or
    /// SIGTERM, or when the process ends.
    #[arg(long, value_name = "DURATION", value_parser = mtrace_analysis::report::parse_duration)]
    duration: Option<u64>,
    #[command(flatten)]
    report_to: crate::flags::ReportFile,
    #[command(flatten)]
    save: crate::flags::Save,
    /// The window's trace kept within a bound as it arrives, as `mtrace
    /// run` keeps a long run's: the report is still of every block
    /// allocated while attached and not freed, the totals and the peak.
    /// Not with -i or --interval (their views follow the file).
    #[command(flatten)]
    bound: crate::flags::bound::BoundArgs,
    #[command(flatten)]
    interactive: crate::flags::Interactive,
    /// At the detach, scan memory and classify what was allocated while
    /// attached as memcheck does (definitely, indirectly, possibly lost,
    /// still reachable); memory of blocks from before the attach counts as
    /// a root (see docs/SCAN.md).
    #[arg(long)]
    scan: bool,
    /// Every DURATION, print the backtraces whose blocks have been live
    /// longer than --older-than (default: DURATION), most bytes first.
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = mtrace_analysis::report::parse_duration,
        conflicts_with_all = ["max_trace_size", "max_trace_age"]
    )]
    interval: Option<u64>,
    /// With --interval, also write a pprof heap profile of the process so
    /// far into DIR every interval, named PROG.PID.SEQ.pb.gz (SEQ from 1;
    /// the profile's time is the interval's end), for a collector to ship
    /// (Pyroscope, Parca).
    #[arg(long, value_name = "DIR", requires = "interval")]
    pprof_dir: Option<PathBuf>,
    #[command(flatten)]
    rec: RecordingArgs,
    #[command(flatten)]
    opts: ReportFlags,
}

/// Set by SIGINT, SIGTERM and SIGHUP: detach now (`mtrace keep`: stop).
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: i32) {
    STOP.store(true, Ordering::Relaxed);
}

/// Whether SIGINT, SIGTERM or SIGHUP came since [`catch_stop_signals`].
pub(crate) fn stop_asked() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// SIGINT, SIGTERM and SIGHUP set a flag ([`stop_asked`]) instead of
/// ending mtrace, which then ends what it does in order.
pub(crate) fn catch_stop_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// How long the library has to connect after its init returned.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the process has to end its stream after `detach`.
const DETACH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a `detach` sent on the socket may go unanswered before the
/// process is detached by a call made in it (a process with one thread
/// answers at its next allocation call).
const ANSWER_WAIT: Duration = Duration::from_millis(300);

/// `mtrace attach`. Exit status 0 after a report; 2, with one line on
/// stderr, when it could not attach (the process untouched) or report.
pub fn attach(a: AttachArgs) -> Result<ExitCode> {
    a.opts.check_inputs()?;
    a.opts.check_outputs()?;
    // Refused before the process is touched.
    a.bound.bound()?;
    if a.rec.ptrace {
        return ptrace::attach(a);
    }
    // From the start: a SIGTERM during the injection detaches right after it.
    catch_stop_signals();
    let lib = find_lib()?;
    // Another C library's (musl's) loader cannot load libmtrace.so, which
    // is glibc's: its dlopen failed on libgcc_s.so.1 (issue 66).
    if let Some((_, loader)) = mtrace_analysis::report::processes::foreign_loader(&format!("/proc/{}/exe", a.pid)) {
        bail!(
            "process {} was started by {loader}, another C library's loader, which cannot load libmtrace.so \
             (built for glibc); mtrace attach --ptrace {} traces it from outside",
            a.pid,
            a.pid
        );
    }
    let t = mtrace_ptrace::inspect::inspect(a.pid)?;
    mtrace_ptrace::library_file::check_versions(a.pid, &lib, &t.libc_versions)?;
    mtrace_ptrace::inspect::check_readable(a.pid)?;
    let mut rec = a.rec.recording(a.opts.depth)?;
    let dir = tempfile::Builder::new().prefix("mtrace-attach.").tempdir()?;
    // The process's children are not this window's.
    rec.follow_fork = false;
    rec.follow_exec = false;
    // A process that sees this machine's files loads the library by its
    // path and connects to a socket here; one in a container gets both
    // without a path (unseen.rs).
    let listener = if unseen::sees(a.pid, &lib) {
        let listener = Listener::private("mtrace-attach.", "stream.sock")?;
        listener.set_nonblocking(true)?;
        owner::give_to_owner_of(a.pid, &listener.files())?;
        Some(listener)
    } else {
        unseen::check_proc(a.pid)?;
        unseen::check_take(a.pid)?;
        None
    };
    let started = Instant::now();
    let held = inject_library(a.pid, &t, &lib, rec, listener.as_ref())?;
    let stopped_for = started.elapsed();
    let stream = match (held, &listener) {
        (Some(s), _) => s,
        (None, Some(l)) => accept(l)?,
        (None, None) => bail!("process {}: no stream was made", a.pid),
    };
    let inner = unseen::inner_pid(a.pid).map(|p| format!(", {p} in its pid namespace")).unwrap_or_default();
    eprintln!(
        "mtrace: attached to process {}{inner} ({} ms to load libmtrace.so{}); Ctrl-C detaches",
        a.pid,
        stopped_for.as_millis(),
        if listener.is_none() { " from memory: its root does not have it" } else { "" }
    );
    let mut control = stream.try_clone()?;
    let (trace, copier) = save::start(&a, dir.path(), stream)?;
    // The window's books read as its stream arrives: the report is ready
    // at the detach. Not a bounded one, which its keeper cuts, nor where
    // the console or the views keep books of their own (`LiveBooks`).
    let own_books = a.bound.bound()?.is_some() || a.interval.is_some() || a.interactive.interactive;
    let following = if own_books { None } else { a.opts.follow_file(&trace) };
    // The report points' .memlog files (the report signal, mtrace_report())
    // into the process's working directory, as the library writes them,
    // each answered to the process (which waits in mtrace_report()).
    let same_user = owner::runs_as_us(a.pid);
    let answer = control.try_clone().ok().map(|s| (Box::new(s) as Box<dyn std::io::Write + Send>, same_user));
    let points = mtrace_analysis::bounded::follow_report_points(&trace, None, answer);
    // Events an idle process with one thread made just before it went
    // idle are written within about 50 ms, as a writer thread would.
    let detaching = AtomicBool::new(false);
    let waker = crate::wake::Waker::new("mtrace", lib.clone());
    std::thread::scope(|sc| -> Result<()> {
        sc.spawn(|| {
            let streams = || {
                let bytes = std::fs::metadata(&trace).map_or(0, |m| m.len());
                vec![(0, a.pid, bytes)]
            };
            waker.watch(streams, || detaching.load(Ordering::Acquire) || copier.is_finished());
        });
        attached(&a, &trace, &copier, &waker, &mut control)?;
        detaching.store(true, Ordering::Release);
        Ok(())
    })?;
    detach(&a, &copier, &lib, &mut control);
    let copied = copier.join().map_err(|_| anyhow!("the stream reader failed"))??;
    points.finish_within(Duration::from_secs(10));
    let followed = following.and_then(|f| f.finish());
    if copied == 0 {
        bail!("process {} ended before libmtrace.so sent anything", a.pid);
    }
    eprintln!("mtrace: detached from process {} ({} bytes of trace)", a.pid, copied);
    report_window(&a, &trace, followed, dir)
}

/// Writes the report of the window's `trace` (in the temporary folder
/// `dir`, unless `--save` named it) as `a` asks: of `followed`'s books
/// when it was read as it arrived. A file asked for that
/// could not be written is said in one line; the window's trace is then
/// kept (its folder left) and named, for `mtrace report` to write it
/// again, and the status is 2.
fn report_window(
    a: &AttachArgs,
    trace: &std::path::Path,
    followed: Option<mtrace_analysis::pipeline::Followed>,
    dir: tempfile::TempDir,
) -> Result<ExitCode> {
    // A container's modules, for the symbols of this report and later ones.
    let kept = kept_modules::keep(a.pid as u32, trace);
    if !kept.is_empty() && a.save.save.is_some() {
        eprintln!(
            "mtrace: {} module{} of the process's own root kept for the trace's symbols in {}",
            kept.len(),
            if kept.len() == 1 { "" } else { "s" },
            mtrace_analysis::symbolize::kept_beside(trace).display()
        );
    }
    let mut out = mtrace_analysis::output::open(a.report_to.output.as_deref())?;
    // The window's trace is in a temporary folder unless --save named it.
    let temporary = a.save.save.is_none();
    // The follower's symbolizer, warmed while the stream came, unless
    // modules were kept just now: a new one searches them.
    let loaded = match followed {
        Some(f) if kept.is_empty() => f.into_loaded()?,
        Some(f) => (f.into_trace()?, a.opts.symbolizer_for(trace)),
        None => a.opts.load(trace)?,
    };
    let r = a.opts.report_loaded(loaded, Some(&mut *out), |_, _, r| {
        if temporary {
            r.trace = format!("{} (removed at the end; --save FILE keeps it)", r.trace);
        }
    })?;
    out.flush().with_context(|| a.report_to.not_written())?;
    if let Some(e) = r.report.as_ref().and_then(|r| r.summary.error.as_ref()) {
        eprintln!("mtrace: {e}");
    }
    if r.unwritten.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    if a.save.save.is_none() {
        let _ = dir.keep();
    }
    eprintln!("mtrace: the window's trace is kept: {} (mtrace report TRACE --html FILE, ...)", trace.display());
    Ok(ExitCode::from(2))
}

/// While attached: the console (`-i`), then the wait for the end of the
/// window ([`watch`]).
fn attached(
    a: &AttachArgs,
    trace: &std::path::Path,
    copier: &std::thread::JoinHandle<Result<u64>>,
    waker: &Waker,
    control: &mut UnixStream,
) -> Result<()> {
    if a.interactive.interactive {
        let mut live =
            Session { control: control.try_clone()?, trace: trace.to_owned(), copier, pid: a.pid, waker: Some(waker) };
        let _ = crate::console::run(&mut live, &a.opts)?;
        // Leaving the console ends the attach (quit detaches).
        STOP.store(true, Ordering::Relaxed);
    }
    watch(a, trace, copier, Some(waker));
    Ok(())
}

/// The end of the window: the process, if it is still there, is told to
/// detach (the scan first with `--scan`), and its End record waited for.
fn detach(
    a: &AttachArgs,
    copier: &std::thread::JoinHandle<Result<u64>>,
    lib: &std::path::Path,
    control: &mut UnixStream,
) {
    if copier.is_finished() {
        return;
    }
    let detach = Command::Detach.line();
    let cmds = if a.scan { Command::Scan.line() + &detach } else { detach };
    let _ = control.write_all(cmds.as_bytes());
    let until = Instant::now() + DETACH_TIMEOUT;
    let answered = Instant::now() + ANSWER_WAIT;
    while !copier.is_finished() && Instant::now() < answered {
        std::thread::sleep(Duration::from_millis(10));
    }
    if !copier.is_finished() {
        // A process with one thread (no writer thread of the tracer's)
        // answers at its next allocation call: an idle one is detached by
        // a call made in it, as the attach was.
        if let Err(e) = detach_by_call(a.pid, lib, a.scan) {
            eprintln!("mtrace: {e:#}; waiting for process {} to answer the detach", a.pid);
        }
    }
    while !copier.is_finished() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    if !copier.is_finished() {
        let _ = control.shutdown(std::net::Shutdown::Both);
    }
}

/// Waits while the stream comes into `trace` (`copier` copying it) until
/// the process ends, a signal asks to detach, or `--duration` is over;
/// every `--interval`, prints the view of what stays live (and writes a
/// pprof profile into `--pprof-dir`).
fn watch(
    a: &AttachArgs,
    trace: &std::path::Path,
    copier: &std::thread::JoinHandle<Result<u64>>,
    waker: Option<&Waker>,
) {
    let deadline = a.duration.map(|ns| Instant::now() + Duration::from_nanos(ns));
    let mut next_view = a.interval.map(|ns| (Instant::now() + Duration::from_nanos(ns), ns));
    let mut sym = a.opts.symbolizer();
    let mut seq = 0;
    // One follower for every view: the books grow with the stream.
    let live = a.interval.map(|_| mtrace_analysis::input::live::LiveBooks::follow(trace));
    while !copier.is_finished() && !STOP.load(Ordering::Relaxed) && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(20));
        if let Some((at, every)) = next_view.filter(|(at, _)| Instant::now() >= *at) {
            // What an idle process with one thread buffered, written now.
            if let Some(w) = waker.filter(|_| mtrace_ptrace::library_call::single_threaded(a.pid)) {
                w.wake(0, a.pid);
                std::thread::sleep(Duration::from_millis(30));
            }
            let older = a.opts.older_than.unwrap_or(every);
            let view = |st: &mut mtrace_analysis::input::live::State| -> Result<()> {
                let t = st.trace.as_ref().expect("with() has the header");
                interval::print(t, &mut sym, older, &mut std::io::stdout().lock())?;
                if let Some(dir) = &a.pprof_dir {
                    seq += 1;
                    interval::pprof(t, &mut sym, a.opts.depth, dir, seq)?;
                }
                Ok(())
            };
            if let Some(Err(e) | Ok(Err(e))) = live.as_ref().map(|l| l.with(view)) {
                eprintln!("mtrace: {e:#}");
            }
            next_view = Some((at + Duration::from_nanos(every), every));
        }
    }
}

/// The console's view of the attached process.
struct Session<'a> {
    control: UnixStream,
    trace: PathBuf,
    copier: &'a std::thread::JoinHandle<Result<u64>>,
    /// The process, and the library's rounds in it (none under
    /// `--ptrace`): a process with one thread is made to read its
    /// commands now.
    pid: i32,
    waker: Option<&'a Waker>,
}

impl crate::console::Live for Session<'_> {
    fn send(&mut self, cmd: &Command) -> Result<()> {
        self.control.write_all(cmd.line().as_bytes())?;
        // Carried out now by a process with one thread, though it idles.
        if let Some(w) = self.waker {
            w.wake(0, self.pid);
        }
        Ok(())
    }

    fn trace(&self) -> PathBuf {
        self.trace.clone()
    }

    fn ended(&self) -> bool {
        self.copier.is_finished()
    }
}

/// `dlopen`s `lib` in process `pid` and calls its `mtrace_attach_init`
/// with `rec`'s settings; the process's registers are restored after.
/// With `listener`, the process loads `lib` by its path and connects to
/// the listener (the stream is then accepted there: `None`); without,
/// the library and the stream reach it without a path ([`unseen`]), and
/// the stream is returned.
fn inject_library(
    pid: i32,
    t: &mtrace_ptrace::inspect::Target,
    lib: &std::path::Path,
    mut rec: mtrace_format::recording::Recording,
    listener: Option<&Listener>,
) -> Result<Option<UnixStream>> {
    let mut tracee = mtrace_ptrace::inject::Tracee::seize(pid)?;
    tracee.choose(&t.busy)?;
    let (handle, held) = match listener {
        Some(l) => {
            rec.output = Some(l.address());
            let mut path = lib.as_os_str().as_encoded_bytes().to_vec();
            path.push(0);
            let handle = tracee.call(t.libc.dlopen, &path, |p| vec![p, (libc::RTLD_NOW | libc::RTLD_LOCAL) as u64])?;
            if handle == 0 {
                let msg = tracee.call(t.libc.dlerror, &[], |_| vec![])?;
                let why = if msg == 0 { String::from("no reason given") } else { tracee.read_string(msg) };
                tracee.release()?;
                bail!("process {pid} could not load {}: {why}", lib.display());
            }
            (handle, None)
        }
        None => {
            let handle = match unseen::loaded(&mut tracee, t, pid, "libmtrace.so")? {
                Some(h) => h,
                None => {
                    unseen::dependencies(&mut tracee, t, pid, lib)?;
                    unseen::load(&mut tracee, t, pid, "libmtrace.so", lib)?
                }
            };
            let (theirs, ours) = unseen::socket_pair(&mut tracee, t, pid)?;
            rec.output = Some(format!("fd:{theirs}"));
            (handle, Some((theirs, ours)))
        }
    };
    let init = tracee.call(t.libc.dlsym, b"mtrace_attach_init\0", |p| vec![handle, p])?;
    if init == 0 {
        if let Some((theirs, _)) = &held {
            tracee.call(t.libc.close, &[], |_| vec![*theirs as u64])?;
        }
        tracee.release()?;
        bail!("{}: no mtrace_attach_init (an older libmtrace.so?)", lib.display());
    }
    let mut data = rec.lines().into_bytes();
    data.push(0);
    let rc = tracee.call(init, &data, |p| vec![p])? as i32;
    if rc == 0 {
        patch_executable(&mut tracee, t, handle)?;
    } else if let (Some((theirs, _)), -2 | -3) = (&held, rc) {
        // Refused before it read its settings: the socket is not its.
        tracee.call(t.libc.close, &[], |_| vec![*theirs as u64])?;
    }
    tracee.release()?;
    match rc {
        0 => Ok(held.map(|(_, ours)| ours)),
        -2 => bail!("process {pid} is traced already (by another mtrace attach)"),
        // (A program that rewrites its environment for its title, as
        // redis-server does, passes inspect's look at LD_PRELOAD.)
        -3 => Err(mtrace_ptrace::inspect::preloaded_already(pid)),
        _ => bail!("libmtrace.so could not start tracing in process {pid} (its stderr says why)"),
    }
}

/// Detaches process `pid`, whose tracing runs on its own thread (it has
/// one: no writer thread was added), by making that thread call
/// libmtrace.so's `mtrace_attach_detach` (the leak scan first with
/// `scan`).
fn detach_by_call(pid: i32, lib: &std::path::Path, scan: bool) -> Result<()> {
    mtrace_ptrace::library_call::call(pid, lib, "mtrace_attach_detach", u64::from(scan))?;
    Ok(())
}

/// An allocator the executable defines (Chromium's, a static tcmalloc, a
/// Rust service's jemalloc) wins over the GOT entries `mtrace_attach_init`
/// redirected: the library prepared to hook its functions by patching
/// their entry; the jumps are written by `mtrace_attach_patch` while every
/// other thread is held here, told where each one is (a function one of
/// them is inside is left alone), and `mtrace_attach_patched` puts what was
/// done into the stream once they run again. Nothing with a library that
/// has no such functions.
fn patch_executable(
    tracee: &mut mtrace_ptrace::inject::Tracee,
    t: &mtrace_ptrace::inspect::Target,
    handle: u64,
) -> Result<()> {
    let patch = tracee.call(t.libc.dlsym, b"mtrace_attach_patch\0", |p| vec![handle, p])?;
    let patched = tracee.call(t.libc.dlsym, b"mtrace_attach_patched\0", |p| vec![handle, p])?;
    if patch == 0 || patched == 0 {
        return Ok(());
    }
    let ips = tracee.hold_others();
    let done = ips.and_then(|ips| {
        let data: Vec<u8> = ips.iter().flat_map(|ip| ip.to_le_bytes()).collect();
        tracee.call(patch, &data, |p| vec![p, ips.len() as u64])
    });
    tracee.resume_others();
    done?;
    tracee.call(patched, &[], |_| vec![])?;
    Ok(())
}

/// The connection from the library, waited for up to [`CONNECT_TIMEOUT`].
fn accept(listener: &Listener) -> Result<UnixStream> {
    let until = Instant::now() + CONNECT_TIMEOUT;
    accept_while(listener, || Instant::now() < until)?.ok_or_else(|| {
        anyhow!("libmtrace.so was loaded but did not connect back within {} s", CONNECT_TIMEOUT.as_secs())
    })
}

/// A connection to the non-blocking `listener`, waited for while `waiting()`
/// holds; `None` when it stopped holding with none made. `waiting` is
/// asked before each try, so a connection made before it turned false is
/// still taken.
fn accept_while(listener: &Listener, mut waiting: impl FnMut() -> bool) -> Result<Option<UnixStream>> {
    loop {
        let more = waiting();
        match listener.accept_unix() {
            Ok(s) => {
                s.set_nonblocking(false)?;
                return Ok(Some(s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if !more {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => bail!("cannot accept a connection: {e}"),
        }
    }
}
