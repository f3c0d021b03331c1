//! `mtrace run`: runs a program with libmtrace.so preloaded, like strace
//! runs one under ptrace, and reports on it when it ends.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use mtrace_format::recording::Recording;
use mtrace_format::settings;

use crate::flags::report::ReportFlags;
use crate::recording::{self, find_lib, AtExitArgs, RecordingArgs};
use mtrace_analysis::pipeline::Reporting;
use mtrace_analysis::scan::Kind;

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    report_to: crate::flags::ReportFile,
    #[command(flatten)]
    trace_dir: crate::flags::TraceDir,
    /// Keep the trace files (in --trace-dir, or the temporary folder).
    #[arg(long)]
    keep_traces: bool,
    #[command(flatten)]
    bound: crate::flags::bound::BoundArgs,
    /// After the program's report, report each other process it ran (its
    /// children, their children…) in full, in the order of the process
    /// tree the report starts with (text only).
    #[arg(long)]
    children: bool,
    /// Scan memory at exit and classify leaks as memcheck does
    /// (MTRACE_SCAN=1): the default; the report lists definitely,
    /// indirectly and possibly lost blocks (--show-reachable: all).
    #[arg(long, hide = true, conflicts_with = "no_scan")]
    scan: bool,
    #[command(flatten)]
    at_exit: AtExitArgs,
    /// Exit with N when the scan finds blocks of the kinds in
    /// --errors-for-leak-kinds (after suppressions), or when there were
    /// wrong frees (unless --ignore-wrong-frees).
    #[arg(long, value_name = "N", conflicts_with = "no_scan")]
    error_exitcode: Option<u8>,
    /// Wrong frees do not count for --error-exitcode (they are still reported).
    #[arg(long)]
    ignore_wrong_frees: bool,
    /// Kinds that count for --error-exitcode: definite, indirect, possible,
    /// reachable, all (comma-separated).
    #[arg(long, value_name = "KINDS", default_value = "definite,possible")]
    errors_for_leak_kinds: String,
    #[command(flatten)]
    interactive: crate::flags::Interactive,
    #[command(flatten)]
    rec: RecordingArgs,
    #[command(flatten)]
    opts: ReportFlags,
    #[command(flatten)]
    program: crate::flags::Program,
}

/// mtrace stays to report: SIGTERM, SIGHUP, and SIGINT/SIGQUIT sent to it
/// (not the terminal's) go to the program instead of ending mtrace; so do
/// the report and scan signals (`mtrace_ptrace::signals_to_pass_on`:
/// SIGUSR1 sent to mtrace instead of the program makes the report point
/// the user asked for).
fn forward_signals(r: &Recording) {
    let passed = mtrace_ptrace::signals_to_pass_on(r);
    mtrace_ptrace::pass_on([libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP].into_iter().chain(passed), true);
}

/// Waits for `child`, passing on the signals [`forward_signals`] caught.
fn wait_forwarding(child: &mut std::process::Child) -> Result<std::process::ExitStatus> {
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        for sig in mtrace_ptrace::take_passed_on() {
            // SAFETY: kill with our child's pid and a valid signal.
            unsafe { libc::kill(child.id() as i32, sig) };
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// `mtrace run --ptrace`: the program traced by breakpoints with
/// recording `r`; its pid and exit status (`None`: the tracer detached, it
/// runs on).
fn trace_with_ptrace(a: &RunArgs, r: Recording) -> Result<(u32, Option<std::process::ExitStatus>)> {
    let opts = a.rec.ptrace_options(r, false);
    let (pid, outcome) = mtrace_ptrace::run(&a.program.command, opts)?;
    let raw = match outcome {
        mtrace_ptrace::Outcome::Exited(code) => (code & 0xff) << 8,
        mtrace_ptrace::Outcome::Signaled(sig) => sig & 0x7f,
        mtrace_ptrace::Outcome::Detached(_) => return Ok((pid as u32, None)),
    };
    Ok((pid as u32, Some(std::process::ExitStatus::from_raw(raw))))
}

/// How `run` reports its processes: the program's trace said to be
/// removed at the end where it is (the temporary folder).
fn reporting(a: &RunArgs) -> Reporting {
    let temporary = !a.keep_traces && a.trace_dir.trace_dir.is_none();
    let trace_note = temporary.then(|| "removed at the end; --keep-traces keeps it".to_owned());
    Reporting { trace_note, children: a.children, ..Reporting::default() }
}

/// `mtrace run -i`: the program under a server of our own on a private
/// socket, this process its client with the console.
fn run_interactive(a: RunArgs) -> Result<ExitCode> {
    // The program is started by the server: one that cannot be is said
    // here, in one line, as `run` says it (the client would only see the
    // connection end).
    cannot_run(&a.program.command[0])?;
    let dir = tempfile::Builder::new().prefix("mtrace-run.").tempdir()?;
    let sock = format!("unix:{}", dir.path().join("s.sock").display());
    let mut server = Command::new(std::env::current_exe()?);
    server.args(["server", "--quiet", "--wait", "--listen", &sock]);
    if let Some(d) = a.opts.depth {
        server.args(["-d", &d.to_string()]);
    }
    server.args(a.rec.server_args()).args(a.at_exit.server_args());
    let mut server = server.arg("--").args(&a.program.command).stdin(std::process::Stdio::null()).spawn()?;
    // The server is listening once its socket exists.
    let path = dir.path().join("s.sock");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !path.exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let code =
        crate::relay::client::client(crate::relay::client::ClientArgs::interactive_on(sock, a.report_to, a.opts));
    if crate::relay::client::LEFT_RUNNING.load(std::sync::atomic::Ordering::Relaxed) {
        // `quit`: the program runs on under its server, which keeps the
        // socket in the temporary folder; it is left behind for it.
        let _ = dir.keep();
        return code;
    }
    if code.is_err() {
        // The client could not take the program (it never connected, or
        // the connection broke): the server would wait for one for ever.
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    }
    let _ = server.wait();
    code
}

/// `Err` when `prog` could not be run: not found (`PATH` searched as
/// execvp does), or not an executable file (a directory, no execute
/// permission), with the errno execve gives for it.
fn cannot_run(prog: &str) -> Result<(), mtrace_ptrace::ExecFailed> {
    let fail = |errno| {
        Err(mtrace_ptrace::ExecFailed { program: prog.to_owned(), error: std::io::Error::from_raw_os_error(errno) })
    };
    let Some(path) = mtrace_analysis::report::processes::find(prog) else { return fail(libc::ENOENT) };
    let runnable = path.is_file() && nix::unistd::access(&path, nix::unistd::AccessFlags::X_OK).is_ok();
    if runnable {
        Ok(())
    } else {
        fail(libc::EACCES)
    }
}

pub fn run(mut a: RunArgs) -> Result<ExitCode> {
    a.opts.check_inputs()?;
    a.opts.check_outputs()?;
    a.rec.ptrace_if_static(&a.program.command[0]);
    // The text goes to standard error after the program's own lines; a
    // JSON document there would not parse (valgrind's --xml needs a file
    // or descriptor of its own too).
    if a.opts.json && a.report_to.output.is_none() {
        bail!(
            "--json needs -o FILE: the program writes to the same standard output and error \
             (-o /dev/fd/3 3>&1 >/dev/null gives it to a pipe)"
        );
    }
    if a.interactive.interactive {
        return run_interactive(a);
    }
    let lib = find_lib()?;
    let mut rec = a.rec.recording(a.opts.depth)?;
    let mut temp = None;
    let dir: PathBuf = match &a.trace_dir.trace_dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("{}: cannot create", d.display()))?;
            d.clone()
        }
        None => {
            let t = tempfile::Builder::new().prefix("mtrace-run.").tempdir()?;
            let p = t.path().to_owned();
            temp = Some(t);
            p
        }
    };
    let dir = dir.canonicalize()?;
    // What would fail only after the program ran fails now, with its cause.
    tempfile::tempfile_in(&dir).with_context(|| format!("{}: cannot write trace files there", dir.display()))?;
    // Standard error unlocked: each buffered write takes the lock for
    // itself, so that no other thread of mtrace's that says something
    // while the program runs (a keeper, a progress bar) waits for the end
    // of the run.
    let mut out = Keeping::new(mtrace_analysis::output::buffered(match &a.report_to.output {
        Some(p) => Box::new(mtrace_analysis::output::create_private(p)?),
        None => Box::new(std::io::stderr()),
    }));
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", lib.display()),
        _ => lib.display().to_string(),
    };
    rec.output = Some(dir.join("%e.%p.mtrace").display().to_string());
    let keepers = match a.bound.bound()? {
        Some(bound) => {
            let reports = rec.report_dir.as_ref().map(PathBuf::from);
            let (k, addr) = crate::arriving::keepers::Keepers::start(&dir, bound, reports, a.opts.depth)?;
            rec.output = Some(addr);
            Some(k)
        }
        None => None,
    };
    a.at_exit.apply(&mut rec);
    let mut cmd = Command::new(&a.program.command[0]);
    cmd.args(&a.program.command[1..]).env("LD_PRELOAD", preload);
    recording::hand_to(&mut cmd, &rec);
    // The preload runs this binary to write incremental reports (SIGUSR1).
    if let Ok(me) = std::env::current_exe() {
        cmd.env(settings::BIN.name(), me);
    }
    // Each warning of the tracer once for the whole run, not per process.
    cmd.env(settings::WARN_DIR.name(), &dir);
    let error_kinds = parse_kinds(&a.errors_for_leak_kinds)?;
    let mut following = None;
    let (pid, status) = if a.rec.ptrace {
        match trace_with_ptrace(&a, rec)? {
            (pid, Some(status)) => (pid, status),
            (pid, None) => {
                eprintln!("mtrace: detached from process {pid}: it runs on, untraced");
                let how = Reporting { kept: a.keep_traces || a.trace_dir.trace_dir.is_some(), ..reporting(&a) };
                let _ = mtrace_analysis::pipeline::report_processes(&dir, pid, &a.opts, how, None, &mut out)?;
                out.flush()?;
                return Ok(ExitCode::SUCCESS);
            }
        }
    } else {
        // Before the spawn (the program's exec resets the handlers): mtrace
        // stays to report, and passes on what was sent to it.
        forward_signals(&rec);
        let since = monotonic_ns();
        let mut child =
            cmd.spawn().map_err(|error| mtrace_ptrace::ExecFailed { program: a.program.command[0].clone(), error })?;
        // The program's trace read while it runs, so that its report is
        // ready when it ends; not a bounded one, which its keeper cuts.
        if keepers.is_none() {
            following = a.opts.follow(&dir, child.id(), since);
        }
        let status = wait_forwarding(&mut child)?;
        (child.id(), status)
    };

    if let Some(k) = keepers {
        // A process that outlives the program keeps its stream open: it
        // is reported as far as it got.
        for kept in k.finish(std::time::Duration::from_secs(5)) {
            match kept {
                Ok(k) => {
                    for p in k.problems.iter().chain(&k.error) {
                        eprintln!("mtrace: {}: {p}", k.path.display());
                    }
                }
                Err(e) => eprintln!("mtrace: {e:#}"),
            }
        }
    }
    let show_paths = a.keep_traces || a.trace_dir.trace_dir.is_some();
    let how = Reporting { kept: show_paths, ..reporting(&a) };
    let kept = following.and_then(|f| f.finish());
    let reported = mtrace_analysis::pipeline::report_processes(&dir, pid, &a.opts, how, kept, &mut out)?;
    let r = reported.report;
    // From the kind totals (after suppressions): the entry list leaves out
    // reachable blocks unless --show-reachable.
    let leak_error =
        r.as_ref().and_then(|r| r.kinds).is_some_and(|k| error_kinds.iter().any(|&kind| k.get(kind).blocks > 0));
    let free_error = !a.ignore_wrong_frees && r.is_some_and(|r| !r.errors.is_empty());
    // The report could not be written where asked (a file of
    // --html, --pprof…, or -o's): the run is not lost, its traces stay
    // for `mtrace report`, and the status is still the program's.
    let _ = out.flush();
    let unwritten = match out.error.take() {
        None => !reported.unwritten.is_empty(),
        Some(e) => {
            let why = mtrace_analysis::output::words::without_os_error_codes(&e.to_string());
            eprintln!("mtrace: {}: {why}", a.report_to.not_written());
            true
        }
    };
    if (a.keep_traces || unwritten) && a.trace_dir.trace_dir.is_none() {
        // For the user at the terminal, not into the -o report (which said
        // the traces would be removed, unless --keep-traces).
        let after_all = if a.keep_traces { "" } else { " after all" };
        eprintln!("mtrace: traces kept in {}{after_all}", dir.display());
        if let Some(t) = temp {
            let _ = t.keep();
        }
    }
    if let (Some(code), true) = (a.error_exitcode, leak_error || free_error) {
        return Ok(ExitCode::from(code));
    }
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c as u8),
        (None, Some(sig)) => {
            DIE_OF.store(sig, std::sync::atomic::Ordering::Relaxed);
            ExitCode::from(128 + sig as u8)
        }
        _ => ExitCode::FAILURE,
    })
}

/// CLOCK_MONOTONIC now, ns: a trace's header says its start so.
fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_or(0, |t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// The report's writer under `mtrace run`: when its file fails (a full
/// disk, `-o /proc/version`), the report goes on to its end, unwritten,
/// so that the run still ends with the program's status and its traces
/// kept; the first error is kept for that end.
struct Keeping<W> {
    inner: W,
    error: Option<std::io::Error>,
}

impl<W: Write> Keeping<W> {
    fn new(inner: W) -> Keeping<W> {
        Keeping { inner, error: None }
    }
}

impl<W: Write> Write for Keeping<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.error.is_none() {
            if let Err(e) = self.inner.write_all(buf) {
                self.error = Some(e);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.error.is_none() {
            if let Err(e) = self.inner.flush() {
                self.error = Some(e);
            }
        }
        Ok(())
    }
}

/// The signal the program of `mtrace run` died of (0: none), for
/// [`die_as_the_program`] once the report is written and the temporary
/// folder removed.
static DIE_OF: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Where the program of `mtrace run` died of a signal, ends mtrace by the
/// same signal with its default action, as strace, timeout and valgrind
/// do: a parent's `waitpid` sees the program's death (WIFSIGNALED), not an
/// exit status. No core file of mtrace's own (its RLIMIT_CORE set to 0
/// first). Returns if there is no such signal (or it did not end us: the
/// caller then exits with 128+N).
pub fn die_as_the_program() {
    let sig = DIE_OF.load(std::sync::atomic::Ordering::Relaxed);
    if sig <= 0 {
        return;
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: setrlimit, sigaction, sigprocmask and raise with valid
    // pointers; nothing else runs in this thread meanwhile.
    unsafe {
        let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &sa, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
}

/// `--errors-for-leak-kinds`: a comma-separated list of kinds, or `all`.
fn parse_kinds(s: &str) -> Result<Vec<Kind>> {
    let mut v = Vec::new();
    for k in s.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        match k {
            "definite" => v.push(Kind::Definite),
            "indirect" => v.push(Kind::Indirect),
            "possible" => v.push(Kind::Possible),
            "reachable" => v.push(Kind::Reachable),
            "all" => v.extend([Kind::Definite, Kind::Indirect, Kind::Possible, Kind::Reachable]),
            "none" => {}
            _ => bail!(
                "--errors-for-leak-kinds: unknown kind {k:?} (definite, indirect, possible, reachable, all, none)"
            ),
        }
    }
    Ok(v)
}
