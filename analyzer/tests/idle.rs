//! A process with one thread, idle in a system call, answers what it is
//! asked within a second under every way of tracing it (docs/PROCESSES.md):
//! the report and scan signals, the console's commands; the calls it waits
//! in go on as natively, and its children are its own.

mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// How soon an idle process answers, at most.
const ANSWER: Duration = Duration::from_secs(1);

/// Waits up to [`ANSWER`] for `p` to exist and hold something, then until
/// it stopped growing; its text.
fn within_a_second(p: &Path, what: &str) -> String {
    let asked = Instant::now();
    while !std::fs::metadata(p).is_ok_and(|m| m.len() > 0) {
        assert!(asked.elapsed() < ANSWER, "{what}: no {} within {ANSWER:?}", p.display());
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_for_file(p)
}

/// The pid of `parent`'s only child (the program `mtrace run` or `mtrace
/// server` started).
fn child_of(parent: u32) -> i32 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap_or_default();
        if let Some(k) = kids.split_whitespace().next() {
            return k.parse().unwrap();
        }
        assert!(Instant::now() < until, "process {parent} started no program");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill on a process this test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// The ways of tracing a program that the tests go through.
#[derive(Clone, Copy, Debug)]
enum Way {
    Preload,
    Run,
    Server,
    Attach,
}

/// attach_target.c traced one way, idle in `read` between the commands
/// it is given; with a console (`client -i`, `attach -i`) where the way
/// has one.
struct Traced {
    program: AttachTarget,
    pid: i32,
    /// The mtrace processes (run, server, client, attach).
    others: Vec<Child>,
    console: Option<(ChildStdin, Lines)>,
}

impl Traced {
    /// Started in `dir` (where its .memlog files go) and told to lose 777
    /// bytes.
    fn start(way: Way, dir: &Path, prog: &Path) -> Traced {
        let mut others = Vec::new();
        let mut console = None;
        let (program, pid) = match way {
            Way::Preload => {
                let t = AttachTarget::spawn(
                    Command::new(prog)
                        .current_dir(dir)
                        .env("LD_PRELOAD", lib())
                        .env("MTRACE_OUTPUT", dir.join("preload.mtrace")),
                );
                let pid = t.child.id() as i32;
                (t, pid)
            }
            Way::Run => {
                let t = AttachTarget::spawn(Command::new(mtrace()).current_dir(dir).args(["run", "--"]).arg(prog));
                let pid = child_of(t.child.id());
                (t, pid)
            }
            Way::Server => {
                let addr = format!("unix:{}", dir.join("s.sock").display());
                let t = AttachTarget::spawn(
                    Command::new(mtrace()).current_dir(dir).args(["server", "--listen", &addr, "--"]).arg(prog),
                );
                let pid = child_of(t.child.id());
                let (c, io) = console_of(Command::new(mtrace()).current_dir(dir).args(["client", "-i", &addr]));
                others.push(c);
                console = Some(io);
                (t, pid)
            }
            Way::Attach => {
                let t = AttachTarget::spawn(Command::new(prog).current_dir(dir));
                let pid = t.child.id() as i32;
                let (c, io) =
                    console_of(Command::new(mtrace()).current_dir(dir).args(["attach", &pid.to_string(), "-i"]));
                others.push(c);
                console = Some(io);
                (t, pid)
            }
        };
        let mut t = Traced { program, pid, others, console };
        assert_eq!(t.program.ask("lose 777"), "ok lose 777\n", "{way:?}");
        t
    }

    /// Sends a console command and returns its output up to the line
    /// that contains `until`, and how long that took.
    fn console(&mut self, cmd: &str, until: &str) -> (String, Duration) {
        let (input, output) = self.console.as_mut().expect("a console");
        let asked = Instant::now();
        writeln!(input, "{cmd}").unwrap();
        let text = output.until(until);
        (text, asked.elapsed())
    }

    /// The program quits (status 3); the mtrace processes end with it.
    fn quit(mut self) {
        if let Some((input, _)) = self.console.as_mut() {
            writeln!(input, "wait").unwrap();
        }
        assert_eq!(self.program.ask("quit"), "holding 0 blocks\n");
        drop(self.console.take());
        assert_eq!(self.program.child.wait().unwrap().code(), Some(3));
        for mut o in self.others {
            o.wait().unwrap();
        }
    }
}

/// A console's output, line by line, read by a thread of its own.
struct Lines(std::sync::mpsc::Receiver<String>);

impl Lines {
    fn of(out: ChildStdout) -> Lines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Lines(rx)
    }

    /// The lines up to the first that contains `until` (waiting up to 30 s
    /// for each; a failure shows what came).
    fn until(&mut self, until: &str) -> String {
        let mut text = String::new();
        loop {
            match self.0.recv_timeout(Duration::from_secs(30)) {
                Ok(l) => {
                    text.push_str(&l);
                    text.push('\n');
                    if l.contains(until) {
                        return text;
                    }
                }
                Err(e) => panic!("no line with {until:?} ({e}); the console said:\n{text}"),
            }
        }
    }
}

/// A console command (client -i, attach -i) with its input and output
/// piped, once it has said it is ready.
fn console_of(cmd: &mut Command) -> (Child, (ChildStdin, Lines)) {
    let mut c = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let (input, mut output) = (c.stdin.take().unwrap(), Lines::of(c.stdout.take().unwrap()));
    output.until("mtrace console");
    (c, (input, output))
}

#[test]
fn the_report_signal_is_answered_while_the_program_waits_in_read() {
    let m = markers("attach_target.c");
    for way in [Way::Preload, Way::Run, Way::Server, Way::Attach] {
        let dir = scratch(&format!("idle-report-{way:?}"));
        let prog = build("attach_target.c", &dir.join("attach_target"), &["-g", "-O0"]);
        let t = Traced::start(way, &dir, &prog);
        signal(t.pid, libc::SIGUSR1);
        let memlog = within_a_second(&dir.join(format!("attach_target-{}-1.memlog", t.pid)), &format!("{way:?}"));
        // The block lost before the signal, where it was allocated.
        let at = format!("lose ({}:{})", ctests_dir().join("attach_target.c").display(), m["lost"]);
        assert!(memlog.contains("777 bytes in 1 block") && memlog.contains(&at), "{way:?}: {at}\n{memlog}");
        t.quit();
    }
}

#[test]
fn the_console_scans_an_idle_process_within_a_second() {
    for way in [Way::Server, Way::Attach] {
        let dir = scratch(&format!("idle-console-{way:?}"));
        let prog = build("attach_target.c", &dir.join("attach_target"), &["-g", "-O0"]);
        let mut t = Traced::start(way, &dir, &prog);
        let (out, took) = t.console("scan", "definitely lost:");
        assert!(out.contains("definitely lost: 777 bytes in 1 block"), "{way:?}: {out}");
        assert!(took < ANSWER, "{way:?}: the scan took {took:?}");
        // A view has the books take what the process buffered first: the
        // lost block (and, traced from its start, the one from before it),
        // not "All blocks were freed."
        let (out, took) = t.console("status", "in use:");
        let in_use = if matches!(way, Way::Attach) { "777 bytes in 1 block" } else { "1,777 bytes in 2 blocks" };
        assert!(out.contains(&format!("in use: {in_use}")), "{way:?}: {out}");
        assert!(took < ANSWER, "{way:?}: status took {took:?}");
        t.quit();
    }
}

#[test]
fn the_scan_signal_is_answered_while_the_program_waits_in_read() {
    let dir = scratch("idle-scan-signal");
    let prog = build("attach_target.c", &dir.join("attach_target"), &["-g", "-O0"]);
    let t = AttachTarget::spawn(
        Command::new(&prog)
            .current_dir(&dir)
            .env("LD_PRELOAD", lib())
            .env("MTRACE_OUTPUT", dir.join("t.mtrace"))
            .env("MTRACE_SCAN_SIGNAL", "USR2"),
    );
    let mut t = t;
    assert_eq!(t.ask("lose 555"), "ok lose 555\n");
    signal(t.child.id() as i32, libc::SIGUSR2);
    let memlog = within_a_second(&dir.join(format!("attach_target-{}-1.memlog", t.child.id())), "scan");
    assert!(memlog.contains("definitely lost: 555 bytes in 1 block"), "{memlog}");
    // fgets went on reading after the handler (SA_RESTART).
    assert_eq!(t.ask("quit"), "holding 0 blocks\n");
    assert_eq!(t.child.wait().unwrap().code(), Some(3));
}

#[test]
fn python_asleep_answers_the_report_signal() {
    let dir = scratch("idle-python");
    let script = "import time; print('ready', flush=True); t = time.time(); time.sleep(5); \
                  print('slept %.1f' % (time.time() - t))";
    let mut py = Command::new("python3")
        .current_dir(&dir)
        .args(["-c", script])
        .env("LD_PRELOAD", lib())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/deps installs it)");
    let mut out = BufReader::new(py.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // (python3 may be a shim, pyenv's: it execs python, in the same process.)
    let pid = py.id() as i32;
    std::thread::sleep(Duration::from_millis(300));
    signal(pid, libc::SIGUSR1);
    let memlog = memlog_of(&dir, pid);
    assert!(memlog.contains("mtrace report for"), "{memlog}");
    line.clear();
    out.read_line(&mut line).unwrap();
    // Python sleeps on for the time left after the handler's EINTR (PEP 475).
    assert_eq!(line, "slept 5.0\n");
    assert!(py.wait().unwrap().success());
}

/// The first .memlog of process `pid` in `dir`, whatever its program's
/// name, within a second.
fn memlog_of(dir: &Path, pid: i32) -> String {
    let asked = Instant::now();
    loop {
        let found: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.to_string_lossy().ends_with(&format!("-{pid}-1.memlog")))
            .collect();
        if let Some(p) = found.first().filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0)) {
            return wait_for_file(p);
        }
        assert!(asked.elapsed() < ANSWER, "no .memlog of process {pid} within {ANSWER:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What `waits solo MS KIND…` printed: (kind, rc, errno, ms) per wait.
fn waited(out: &str) -> Vec<(String, i64, i64, f64)> {
    out.lines()
        .filter(|l| l.contains(" rc="))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let v = |i: usize| w[i].split_once('=').unwrap().1.to_owned();
            (w[0].to_owned(), v(1).parse().unwrap(), v(2).parse().unwrap(), v(3).parse().unwrap())
        })
        .collect()
}

#[test]
fn waits_go_on_through_fifty_scans_and_fifty_reports() {
    let dir = scratch("idle-waits");
    let prog = build("waits.c", &dir.join("waits"), &["-g", "-O0", "-pthread"]);
    let kinds = [
        "poll",
        "nanosleep",
        "clock_nanosleep",
        "select",
        "sem_timedwait",
        "cond_timedwait",
        "futex",
        "epoll_wait",
        "sigtimedwait",
    ];
    let ms = 1500.0;
    let args: Vec<String> =
        ["solo".to_owned(), (ms as u32).to_string()].into_iter().chain(kinds.map(String::from)).collect();
    let native = Command::new(&prog).args(&args).output().unwrap();
    let natively = waited(&String::from_utf8_lossy(&native.stdout));
    assert_eq!(natively.len(), kinds.len(), "{natively:?}");
    let addr = format!("unix:{}", dir.join("s.sock").display());
    let mut server = Command::new(mtrace())
        .current_dir(&dir)
        .args(["server", "--no-scan", "--listen", &addr, "--"])
        .arg(&prog)
        .args(&args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let (mut client, (mut input, mut output)) =
        console_of(Command::new(mtrace()).current_dir(&dir).args(["client", "-i", &addr]));
    // Each answer read before the next is asked.
    let (mut scans, mut reports) = (0, 0);
    for i in 0..100 {
        let (cmd, until) = if i % 2 == 0 { ("scan", "definitely lost:") } else { ("report", "mtrace report for") };
        writeln!(input, "{cmd}").unwrap();
        let text = output.until(until);
        assert!(!text.contains("did not answer"), "after {scans} scans, {reports} reports: {text}");
        *(if i % 2 == 0 { &mut scans } else { &mut reports }) += 1;
    }
    assert_eq!((scans, reports), (50, 50));
    writeln!(input, "wait").unwrap();
    drop(input);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(server.wait().unwrap().success());
    client.wait().unwrap();
    let traced = waited(&rest);
    assert_eq!(traced.len(), kinds.len(), "{rest}");
    for ((kind, rc, errno, took), (nkind, nrc, nerrno, _)) in traced.iter().zip(&natively) {
        // Its own result, at its own time: a restart did not wait the
        // whole timeout again.
        assert_eq!((kind, rc, errno), (nkind, nrc, nerrno), "{rest}");
        assert!((ms - 1.0..ms + 250.0).contains(took), "{kind} took {took} ms, asked {ms}: {rest}");
    }
}

#[test]
fn the_programs_children_are_its_own() {
    let dir = scratch("idle-children");
    let prog = build("children.c", &dir.join("children"), &["-g", "-O0"]);
    let expected = "wait: ECHILD\nreaped: own, status 7\nafter: ECHILD\n";
    let native = Command::new(&prog).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&native.stdout), expected);
    // Under the preload, a report (its analyzer's processes) under way at
    // each wait.
    let out = Command::new(&prog)
        .current_dir(&dir)
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", dir.join("children.%p.mtrace"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "{}", String::from_utf8_lossy(&out.stderr));
    let memlogs = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "memlog"));
    assert!(memlogs.count() >= 1, "no report was made");
    let out = Command::new(mtrace()).current_dir(&dir).args(["run", "--"]).arg(&prog).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn what_an_idle_process_made_reaches_the_stream_though_it_is_killed() {
    let m = markers("attach_target.c");
    for way in ["server", "attach"] {
        let dir = scratch(&format!("idle-killed-{way}"));
        let prog = build("attach_target.c", &dir.join("attach_target"), &["-g", "-O0"]);
        let report = dir.join("report.json");
        let addr = format!("unix:{}", dir.join("s.sock").display());
        let (mut t, mut reader) = if way == "server" {
            let t = AttachTarget::spawn(Command::new(mtrace()).args(["server", "--listen", &addr, "--"]).arg(&prog));
            let c = Command::new(mtrace()).args(["client", &addr, "--json", "-o"]).arg(&report).spawn().unwrap();
            std::thread::sleep(Duration::from_millis(100));
            (t, c)
        } else {
            let t = AttachTarget::spawn(&mut Command::new(&prog));
            let pid = t.child.id().to_string();
            let c = spawn_until(
                Command::new(mtrace()).args(["attach", &pid, "--json", "-o"]).arg(&report),
                "mtrace: attached",
            );
            (t, c)
        };
        assert_eq!(t.ask("leak 100"), "ok leak 100\n");
        // The allocation's event waits in the thread's buffer (its round
        // came before it); the process idles in read, then is killed.
        std::thread::sleep(Duration::from_millis(300));
        let pid = if way == "server" { child_of(t.child.id()) } else { t.child.id() as i32 };
        signal(pid, libc::SIGKILL);
        let status = reader.wait().unwrap();
        let _ = t.child.wait();
        let text = std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("{way} ({status}): {e}"));
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert!(
            leaks_in(&r, "attach_target.c").contains(&leak(100, 1, "malloc", "keep", m["window"])),
            "{way}: {:?}",
            leaks_in(&r, "attach_target.c")
        );
    }
}
