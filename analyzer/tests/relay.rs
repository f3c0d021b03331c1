//! `mtrace server` and `mtrace client`: the same report as `mtrace run`
//! over UNIX and TCP sockets, late and second clients, the console, and
//! refusals.

mod common;
use common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `mtrace server --listen ADDR extra… -- prog`, once it listens. The
/// server scans at exit as `run` does; a test comparing every block not
/// freed gives `--no-scan`.
fn server(addr: &str, extra: &[&str], prog: &Path, stdin: bool) -> Child {
    server_env(addr, extra, prog, stdin, &[])
}

/// [`server`] with `env` added to its (and the program's) environment.
fn server_env(addr: &str, extra: &[&str], prog: &Path, stdin: bool, env: &[(&str, &str)]) -> Child {
    spawn_until(
        Command::new(mtrace())
            .envs(env.iter().copied())
            .args(["server", "--listen", addr])
            .args(extra)
            .arg("--")
            .arg(prog)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped()),
        "mtrace server: listening on",
    )
}

/// `mtrace client ADDR --json -o REPORT extra…`, run to its end.
fn client(addr: &str, dir: &Path, extra: &[&str]) -> (serde_json::Value, std::process::Output) {
    let report = dir.join("client.json");
    let _ = std::fs::remove_file(&report);
    // In `dir`: the report points' .memlog files go to the client's
    // working directory, never the checkout.
    let out = Command::new(mtrace())
        .current_dir(dir)
        .args(["client", addr, "--json", "-o"])
        .arg(&report)
        .args(extra)
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    (serde_json::from_str(&text).unwrap_or_default(), out)
}

/// `mtrace client ADDR -i -o REPORT`, its console's input held here.
fn console_client(addr: &str, report: &Path) -> (Child, std::process::ChildStdin) {
    let mut c = Command::new(mtrace())
        .current_dir(report.parent().unwrap())
        .args(["client", addr, "-i", "-o"])
        .arg(report)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let console = c.stdin.take().unwrap();
    (c, console)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn client_reports_equal_run_over_unix_and_tcp() {
    let dir = scratch("relay-same");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    let (plain, _) = run_json(&dir, &[], &prog, &[]);
    let want = leaks_in(&plain, "families.c");
    assert_eq!(want.len(), 9);
    let sock = format!("unix:{}", dir.join("s.sock").display());
    let tcp = format!("tcp:127.0.0.1:{}", free_port());
    for addr in [sock.as_str(), tcp.as_str()] {
        let mut s = server(addr, &["--wait"], &prog, false);
        let saved = dir.join("saved.mtrace");
        let (r, out) = client(addr, &dir, &["--save", saved.to_str().unwrap()]);
        assert!(out.status.success(), "{addr}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(leaks_in(&r, "families.c"), want, "{addr}");
        assert_eq!(leaks_in(&report_json(&saved), "families.c"), want, "{addr}");
        // The report names the saved trace, not the deleted received one.
        assert_eq!(r["trace"].as_str(), saved.to_str(), "{addr}");
        // Its books, read as the stream arrived, are those of the saved
        // trace read afterwards.
        assert_eq!(untimed(r), untimed(report_json(&saved)), "{addr}");
        assert!(s.wait().unwrap().success());
    }
    let mut s = server(&sock, &["--wait"], &prog, false);
    let (r, _) = client(&sock, &dir, &[]);
    assert_eq!(r["trace"], "received, not kept (--save FILE keeps it)");
    assert!(s.wait().unwrap().success());
}

#[test]
fn a_late_client_misses_nothing() {
    let dir = scratch("relay-late");
    let prog = build("fork.c", &dir.join("fork"), &["-g", "-O0"]);
    let m = markers("fork.c");
    let addr = format!("unix:{}", dir.join("s.sock").display());
    let mut s = server(&addr, &["--no-scan"], &prog, false);
    // The program (parent and forked child) is over before the client comes.
    std::thread::sleep(Duration::from_millis(500));
    let (r, out) = client(&addr, &dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        leaks_in(&r, "fork.c"),
        vec![leak(401, 1, "malloc", "main", m["before_fork"]), leak(403, 1, "malloc", "main", m["after_fork"])]
    );
    assert!(s.wait().unwrap().success());
}

/// attach_target.c under a server: the program's stdin and stdout are the server's.
struct Target {
    server: Child,
    stdin: std::process::ChildStdin,
    out: BufReader<std::process::ChildStdout>,
}

impl Target {
    fn start(addr: &str, prog: &Path, extra: &[&str]) -> Target {
        Target::start_env(addr, prog, extra, &[])
    }

    fn start_env(addr: &str, prog: &Path, extra: &[&str], env: &[(&str, &str)]) -> Target {
        let mut server = server_env(addr, extra, prog, true, env);
        let stdin = server.stdin.take().unwrap();
        let out = BufReader::new(server.stdout.take().unwrap());
        Target { server, stdin, out }
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.line()
    }
}

/// After a first client left: the program (attach_target.c, told `leak
/// 10` before) runs on, and a second client gets the whole run.
fn a_second_client_gets_the_whole_run(mut t: Target, addr: &str, dir: &Path) {
    let m = markers("attach_target.c");
    assert_eq!(t.ask("leak 20"), "ok leak 20\n");
    let c = std::thread::spawn({
        let (addr, dir) = (addr.to_owned(), dir.to_owned());
        move || client(&addr, &dir, &[])
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(t.ask("quit"), "holding 2 blocks\n");
    let (r, out) = c.join().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        leaks_in(&r, "attach_target.c"),
        vec![leak(30, 2, "malloc", "keep", m["window"]), leak(1000, 1, "malloc", "main", m["before"])]
    );
    assert_eq!(t.server.wait().unwrap().code(), Some(3));
}

#[test]
fn a_second_client_after_the_first_left() {
    let dir = scratch("relay-second");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let addr = format!("unix:{}", dir.join("s.sock").display());
    let mut t = Target::start(&addr, &prog, &["--no-scan"]);
    assert_eq!(t.line(), "ready\n");
    let mut first = Command::new(mtrace()).args(["client", &addr, "-o", "/dev/null"]).spawn().unwrap();
    assert_eq!(t.ask("leak 10"), "ok leak 10\n");
    std::thread::sleep(Duration::from_millis(200));
    first.kill().unwrap();
    first.wait().unwrap();
    // The program went on; a second client gets the whole run.
    a_second_client_gets_the_whole_run(t, &addr, &dir);
}

/// Waits until `f` exists and has stopped growing.
fn written(f: &Path) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if let Ok(s) = std::fs::read_to_string(f) {
            std::thread::sleep(Duration::from_millis(100));
            if std::fs::read_to_string(f).ok().as_deref() == Some(&s) && !s.is_empty() {
                return s;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} was not written", f.display());
}

/// attach_target.c has one thread, so no writer thread of mtrace's: what
/// the console asks of it is carried out, and what it did reaches the
/// books, at its next allocation call (docs/PROCESSES.md). Lets a command
/// reach it, then has it make one.
fn nudge(t: &mut Target) {
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(t.ask("nudge"), "ok nudge\n");
}

/// [`written`], nudging the program until `f` appears.
fn answered(f: &Path, t: &mut Target) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until && std::fs::metadata(f).map_or(true, |m| m.len() == 0) {
        nudge(t);
    }
    written(f)
}

#[test]
fn console_on_a_served_program() {
    let dir = scratch("relay-console");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let m = markers("attach_target.c");
    let at = |name: &str| format!("({}:{})", ctests_dir().join("attach_target.c").display(), m[name]);
    let addr = format!("unix:{}", dir.join("s.sock").display());
    let mut t = Target::start(&addr, &prog, &["--wait", "-S"]);
    let (c, mut console) = console_client(&addr, &dir.join("final.txt"));
    assert_eq!(t.line(), "ready\n");
    for cmd in ["leak 100", "leak 100", "leak 50", "lose 33"] {
        t.ask(cmd);
    }
    nudge(&mut t);
    std::thread::sleep(Duration::from_millis(300));
    let f = |n: &str| -> PathBuf { dir.join(n) };
    // dump usage: the backtraces by bytes held (the block from before the
    // commands first).
    writeln!(console, "dump usage >{}", f("dump").display()).unwrap();
    let d = written(&f("dump"));
    let entries: Vec<&str> = d.split("\n#").skip(1).collect();
    assert!(entries[0].starts_with("1: 1,000 bytes in 1 block") && entries[0].contains(&at("before")), "{d}");
    assert!(entries[1].starts_with("2: 250 bytes in 3 blocks") && entries[1].contains(&at("window")), "{d}");
    assert!(entries[2].starts_with("3: 33 bytes in 1 block") && entries[2].contains(&at("lost")), "{d}");
    // pprof: the same live blocks in a heap profile pprof reads.
    writeln!(console, "pprof {} >{}", f("heap.pb.gz").display(), f("pprof_said").display()).unwrap();
    assert_eq!(written(&f("pprof_said")), format!("wrote {}\n", f("heap.pb.gz").display()));
    let in_use = pprof_in_use(&f("heap.pb.gz"));
    assert_eq!(in_use.get(&("attach_target.c".to_owned(), m["window"])), Some(&(3, 250)), "{in_use:?}");
    assert_eq!(in_use.get(&("attach_target.c".to_owned(), m["lost"])), Some(&(1, 33)), "{in_use:?}");
    // scan: the dropped block is lost.
    writeln!(console, "scan >{}", f("scan").display()).unwrap();
    let s = answered(&f("scan"), &mut t);
    assert!(s.contains("definitely lost: 33 bytes in 1 block"), "{s}");
    // scan new: only what was allocated since (the kept blocks are older).
    t.ask("lose 21");
    t.ask("tmp 12");
    std::thread::sleep(Duration::from_millis(300));
    writeln!(console, "scan new >{}", f("scan_new").display()).unwrap();
    let s = answered(&f("scan_new"), &mut t);
    assert!(s.contains("definitely lost: 21 bytes in 1 block\n"), "{s}");
    assert!(s.contains("still reachable: 0 bytes in 0 blocks\n"), "{s}");
    // scan leak: the blocks the last scan found lost, both still lost.
    writeln!(console, "scan leak >{}", f("scan_leak").display()).unwrap();
    let s = answered(&f("scan_leak"), &mut t);
    assert!(s.contains("definitely lost: 54 bytes in 2 blocks\n"), "{s}");
    assert!(s.contains("still reachable: 0 bytes in 0 blocks\n"), "{s}");
    // dump leaks: the lost backtrace first, though it holds the fewest bytes.
    writeln!(console, "dump leaks >{}", f("dump_leaks").display()).unwrap();
    let d = written(&f("dump_leaks"));
    let first = d.split("\n#").nth(1).unwrap_or_default();
    assert!(first.starts_with("1: 54 bytes in 2 blocks not freed") && first.contains(&at("lost")), "{d}");
    assert!(first.contains("of which lost at the last scan: 54 bytes in 2 blocks"), "{d}");
    // A mismatched free: dump badfree shows it with both backtraces.
    t.ask("mismatch 33");
    nudge(&mut t);
    std::thread::sleep(Duration::from_millis(300));
    writeln!(console, "dump badfree >{}", f("dump_badfree").display()).unwrap();
    let d = written(&f("dump_badfree"));
    let e = d.split("\n#").nth(1).unwrap_or_else(|| panic!("{d}"));
    assert!(e.starts_with("1: Mismatched free() / delete / delete []: delete of a block from malloc, 1 time"), "{d}");
    let (free_at, alloc_at) = e.split_once("inside a block of size 33 alloc'd").unwrap_or_else(|| panic!("{d}"));
    assert!(free_at.contains(&at("mismatch_free")) && alloc_at.contains(&at("mismatch_alloc")), "{d}");
    writeln!(console, "status >{}", f("status").display()).unwrap();
    let st = written(&f("status"));
    assert!(st.contains("  lost at the last scan: 54 bytes in 2 blocks\n"), "{st}");
    assert!(st.contains("  wrong frees: 0 double or invalid, 1 mismatched\n"), "{st}");
    // dump stacks: also the backtrace whose block was freed, by calls.
    writeln!(console, "dump stacks >{}", f("dump_stacks").display()).unwrap();
    let d = written(&f("dump_stacks"));
    let tmp = d.split("\n#").find(|e| e.contains(&at("tmp"))).unwrap_or_else(|| panic!("{d}"));
    assert!(tmp.contains(": every block freed (malloc), 1 allocation from this backtrace"), "{d}");
    // stop: allocations are not recorded.
    writeln!(console, "stop").unwrap();
    nudge(&mut t);
    t.ask("leak 77");
    // set depth 2: new backtraces have two frames.
    writeln!(console, "start").unwrap();
    writeln!(console, "set depth 2").unwrap();
    nudge(&mut t);
    t.ask("leak 66");
    nudge(&mut t);
    std::thread::sleep(Duration::from_millis(300));
    writeln!(console, "dump >{}", f("dump2").display()).unwrap();
    let d = written(&f("dump2"));
    assert!(!d.contains("77 bytes"), "{d}");
    let e66 = d.split("\n#").find(|e| e.contains(": 66 bytes")).unwrap_or_else(|| panic!("{d}"));
    assert_eq!(e66.lines().count(), 3, "two frames: {e66}");
    // reset: what comes after only.
    writeln!(console, "reset").unwrap();
    nudge(&mut t);
    std::thread::sleep(Duration::from_millis(400));
    t.ask("leak 55");
    nudge(&mut t);
    std::thread::sleep(Duration::from_millis(300));
    writeln!(console, "dump >{}", f("dump3").display()).unwrap();
    let d = written(&f("dump3"));
    assert!(d.contains("Change in live blocks") && d.contains("+55 bytes in +1 block"), "{d}");
    assert!(!d.contains("250 bytes") && !d.contains("66 bytes"), "{d}");
    writeln!(console, "proclist").unwrap();
    writeln!(console, "wait").unwrap();
    drop(console);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(t.ask("quit"), "holding 6 blocks\n");
    let out = c.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let text = String::from_utf8_lossy(&out.stdout);
    // proclist: the program's process, still traced then.
    let target = dir.join("target").display().to_string();
    assert!(text.lines().any(|l| l.contains(" traced ") && l.trim_end().ends_with(&target)), "{text}");
    t.server.wait().unwrap();
}

#[test]
fn a_unix_socket_is_made_only_in_place_of_a_stale_one_and_goes_at_the_end() {
    let dir = scratch("relay-socket-file");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    // A file of the user's where the socket was asked for: refused in one
    // line, the file left as it was (it used to be removed).
    let report = dir.join("report.txt");
    std::fs::write(&report, "the user's\n").unwrap();
    let mut refused = Command::new(mtrace())
        .args(["server", "--listen", &format!("unix:{}", report.display()), "--"])
        .arg(&prog)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while refused.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = refused.kill();
            panic!("the server listens in place of the user's file");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = refused.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim(), format!("mtrace: {}: exists and is not a socket", report.display()));
    assert_eq!(std::fs::read_to_string(&report).unwrap(), "the user's\n");
    // A stale socket (nobody listens) is replaced; the server's own goes
    // when it is done.
    let sock = dir.join("s.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let addr = format!("unix:{}", sock.display());
    let mut s = server(&addr, &["--wait"], &prog, false);
    let (r, out) = client(&addr, &dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(leaks_in(&r, "families.c").len(), 9);
    assert!(s.wait().unwrap().success());
    assert!(!sock.exists(), "the server's socket was left behind");
    // A program that cannot be started: a shell's 127, and the socket
    // goes too.
    let out = Command::new(mtrace())
        .args(["server", "--quiet", "--listen", &addr, "--", "/nonexistent/prog"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        (out.status.code(), err.as_ref()),
        (Some(127), "mtrace: cannot run /nonexistent/prog: No such file or directory\n")
    );
    assert!(!sock.exists(), "the server's socket was left behind");
}

#[test]
fn refusals_are_one_line_and_the_server_keeps_running() {
    let dir = scratch("relay-refused");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    let port = free_port();
    let addr = format!("tcp:127.0.0.1:{port}");
    let token = dir.join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "guess\n").unwrap();
    let mut s = server(&addr, &["--wait", "--token-file", token.to_str().unwrap()], &prog, false);
    // Garbage on the socket.
    let mut g = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    g.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut answer = String::new();
    g.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "denied: not an mtrace client\n");
    // A wrong token.
    let (_, out) = client(&addr, &dir, &["--token-file", wrong.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim(), format!("mtrace: {addr}: denied: wrong token"));
    // The right one: the whole report.
    let (r, out) = client(&addr, &dir, &["--token-file", token.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(leaks_in(&r, "families.c").len(), 9);
    assert!(s.wait().unwrap().success());
    // Nothing listening.
    let (_, out) = client(&addr, &dir, &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1);
    assert!(err.contains("cannot connect to") && err.contains("refused"), "{err}");
    // A non-loopback TCP address needs a token.
    let out = Command::new(mtrace()).args(["server", "--listen", "tcp:0.0.0.0:0", "--"]).arg(&prog).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --token-file"));
}

#[test]
fn run_interactive_reports_where_run_does() {
    // Its final report on standard error, as run's (issue 65, item 6: it
    // went to stdout, with the console), naming no option run refuses.
    let dir = scratch("run-i-stderr");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    let out = Command::new(mtrace()).args(["run", "-i", "--"]).arg(&prog).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("mtrace report for"), "{text}");
    assert!(err.starts_with("mtrace report for "), "{err}");
    assert!(err.contains("\n  trace:            received, not kept\n"), "{err}");
    assert!(!err.contains("--save"), "{err}");
}

#[test]
fn run_interactive_console() {
    let dir = scratch("run-i");
    // python3 has one thread: no writer thread of mtrace's, so it answers
    // `report` at its next allocation call (docs/PROCESSES.md). While it
    // waits it allocates a list every 5 ms.
    let script = "import time\nd = [str(i) * 10 for i in range(2000)]\n\
                  for i in range(300):\n    time.sleep(0.005)\n    x = [i] * 100\nprint(len(d))";
    let mut c = Command::new(mtrace())
        .args(["run", "-i", "-o"])
        .arg(dir.join("final.txt"))
        .args(["--", "/usr/bin/python3", "-c", script])
        .env("PYTHONMALLOC", "malloc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut console = c.stdin.take().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    for cmd in [
        "status",
        "show info",
        "show searchpath",
        "set searchpath /nowhere:/either",
        "show s",
        "timeline",
        "report",
        "dump tsc 999999",
        "wait",
    ] {
        writeln!(console, "{cmd}").unwrap();
    }
    drop(console);
    let out = c.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let calls = text.lines().find(|l| l.contains("allocation calls:")).unwrap_or_else(|| panic!("{text}"));
    // "allocation calls: 30,747, frees: 17,926": thousands separated.
    let n: u64 =
        calls.split(", frees").next().unwrap().split(':').nth(1).unwrap().trim().replace(',', "").parse().unwrap();
    assert!(n > 2000, "{calls}");
    assert!(text.contains("program: /usr/bin/python3"), "{text}");
    assert!(text.contains("sysroot: /\n"), "{text}");
    assert!(text.contains("binpath: /nowhere\nbinpath: /either"), "{text}");
    assert!(text.contains("        time           RSS"), "{text}");
    assert!(text.contains("mtrace report for /usr/bin/python3"), "{text}");
    assert!(text.contains("no process 999999 (proclist lists them)"), "{text}");
    // The final report, when python ended.
    let fin = std::fs::read_to_string(dir.join("final.txt")).unwrap();
    assert!(fin.contains("ended by:         exit"), "{fin}");
}

#[test]
fn the_console_in_a_pseudo_terminal() {
    // A terminal: rustyline edits lines; a long answer goes to the pager
    // (one that marks its lines here), a short one does not.
    let cmd = format!(
        "env 'PAGER=sed s/^/PAGED:/' LINES=8 {} run -i -o /dev/null -- /usr/bin/python3 -c 'import time; time.sleep(3)'",
        mtrace().display()
    );
    let mut p = rexpect::spawn(&cmd, Some(20_000)).unwrap();
    p.exp_string("mtrace> ").unwrap();
    p.send_line("stat").unwrap();
    p.exp_string("\n  allocation calls:").unwrap();
    p.exp_string("mtrace> ").unwrap();
    p.send_line("help").unwrap();
    // (rexpect reads bytes as Latin-1: only ASCII is compared.)
    p.exp_string("PAGED:  quit").unwrap();
    // Which help says.
    p.exp_string("PAGED:An answer longer than the terminal goes through $PAGER").unwrap();
    p.exp_string("mtrace> ").unwrap();
    p.send_line("nonsense").unwrap();
    p.exp_string("unknown command \"nonsense\"").unwrap();
    p.send_line("quit").unwrap();
    p.exp_eof().unwrap();
}

#[test]
fn quit_leaves_at_once_and_the_program_runs_on_for_the_next_client() {
    // In a terminal, as a user types it: `quit` ends the client within a
    // second (exit status 75, EX_TEMPFAIL: no status of the program's
    // yet); the program and the server go on, and a later client gets
    // the whole run.
    let dir = scratch("relay-quit");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let addr = format!("unix:{}", dir.join("s.sock").display());
    let mut t = Target::start(&addr, &prog, &["--no-scan"]);
    assert_eq!(t.line(), "ready\n");
    assert_eq!(t.ask("leak 10"), "ok leak 10\n");
    let cmd = format!("{} client {addr} -i -o /dev/null", mtrace().display());
    let mut p = rexpect::spawn(&cmd, Some(20_000)).unwrap();
    p.exp_string("mtrace> ").unwrap();
    let asked = Instant::now();
    p.send_line("quit").unwrap();
    p.exp_string("the program runs on under mtrace server").unwrap();
    p.exp_eof().unwrap();
    let status = format!("{:?}", p.process.wait().unwrap());
    assert!(asked.elapsed() < Duration::from_secs(1), "{:?}", asked.elapsed());
    assert!(status.contains("Exited") && status.ends_with(", 75)"), "{status}");
    // Still running, still traced.
    a_second_client_gets_the_whole_run(t, &addr, &dir);
}

#[test]
fn proclist_shows_every_process_of_a_forking_and_execing_program() {
    let dir = scratch("relay-proclist");
    let script = dir.join("prog.sh");
    std::fs::write(&script, "#!/bin/sh\nls / >/dev/null\ncat /dev/null\nsleep 1\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let addr = format!("unix:{}", dir.join("s.sock").display());
    let mut s = server(&addr, &["--wait"], &script, false);
    let (c, mut console) = console_client(&addr, Path::new("/dev/null"));
    std::thread::sleep(Duration::from_millis(600));
    writeln!(console, "proclist").unwrap();
    writeln!(console, "wait").unwrap();
    drop(console);
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // The shell, and the programs it forked and exec'd, each a stream.
    for prog in ["/dash", "/ls", "/cat"] {
        assert!(text.lines().any(|l| l.trim_end().ends_with(prog)), "{prog}: {text}");
    }
    assert!(s.wait().unwrap().success());
}

#[test]
fn the_spool_stays_under_its_bound_and_the_program_waits_for_a_client() {
    // queue.c writes a 3–4 MB trace; the spool may hold 1 MiB.
    let dir = scratch("relay-bounded");
    let prog = build("queue.c", &dir.join("queue"), &["-g", "-O0", "-pthread"]);
    let m = markers("queue.c");
    let addr = format!("unix:{}", dir.join("s.sock").display());
    let spool = dir.join("spool");
    let mut s = spawn_until(
        Command::new(mtrace())
            .args(["server", "--listen", &addr, "--no-scan", "--spool-max", "1M", "--spool"])
            .arg(&spool)
            .args(["--"])
            .arg(&prog)
            .arg("leak")
            .stdout(Stdio::null()),
        "mtrace server: listening on",
    );
    // Without a client the program stops at the bound: the spool holds
    // at most 1 MiB on disk, and stops growing.
    let on_disk = || std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&spool).unwrap()) * 512;
    std::thread::sleep(Duration::from_millis(1500));
    let (a, len_a) = (on_disk(), std::fs::metadata(&spool).unwrap().len());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(std::fs::metadata(&spool).unwrap().len(), len_a, "the program waits");
    assert!(a > 0 && a <= 1 << 20, "{a} bytes on disk");
    // A client gets everything; what it took is cut from the spool.
    let (r, out) = client(&addr, &dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        leaks_in(&r, "queue.c"),
        vec![leak(1090, 10, "malloc", "producer", m["kept"]), leak(1554, 2, "malloc", "producer", m["producer"])]
    );
    // The whole trace went through it (3.0–3.7 MB, by how the rounds
    // compress), twice the bound and more.
    assert!(std::fs::metadata(&spool).unwrap().len() > 2 << 20, "{}", std::fs::metadata(&spool).unwrap().len());
    assert!(on_disk() <= 1 << 20, "{} bytes on disk", on_disk());
    assert!(s.wait().unwrap().success());
}

#[test]
fn report_points_top_and_markers_in_the_console() {
    let dir = scratch("relay-points");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let m = markers("attach_target.c");
    let at = |name: &str| format!("({}:{})", ctests_dir().join("attach_target.c").display(), m[name]);
    let addr = format!("unix:{}", dir.join("s.sock").display());
    let mut t = Target::start(&addr, &prog, &["--wait"]);
    let (c, mut console) = console_client(&addr, Path::new("/dev/null"));
    assert_eq!(t.line(), "ready\n");
    let f = |n: &str| -> PathBuf { dir.join(n) };
    t.ask("leak 100");
    std::thread::sleep(Duration::from_millis(300));
    // The first report point: everything live.
    writeln!(console, "report >{}", f("r1").display()).unwrap();
    let r = answered(&f("r1"), &mut t);
    assert!(r.contains("  not freed:        1,100 bytes in 2 blocks\n"), "{r}");
    assert!(r.contains("Live at marker report#1, by backtrace (2 backtraces)"), "{r}");
    // The next: the change since the first.
    t.ask("leak 40");
    t.ask("leak 2");
    t.ask("tmp 5000");
    std::thread::sleep(Duration::from_millis(300));
    writeln!(console, "report >{}", f("r2").display()).unwrap();
    let r = answered(&f("r2"), &mut t);
    assert!(r.contains("  change:           since marker report#1 until marker report#2\n"), "{r}");
    assert!(r.contains("  live change:      +42 bytes in +2 blocks\n"), "{r}");
    let e: Vec<&str> = r.split("\n#").skip(1).collect();
    assert_eq!(e.len(), 1, "{r}");
    assert!(e[0].starts_with("1: +42 bytes in +2 blocks live (malloc)") && e[0].contains(&at("window")), "{r}");
    // top 1: the backtrace holding the most bytes.
    writeln!(console, "top 1 >{}", f("top").display()).unwrap();
    let top = written(&f("top"));
    let e: Vec<&str> = top.split("\n#").skip(1).collect();
    assert_eq!(e.len(), 1, "{top}");
    assert!(e[0].starts_with("1: 1,000 bytes in 1 block not freed") && e[0].contains(&at("before")), "{top}");
    // marker, then markers: the two report points and the named one.
    writeln!(console, "marker here").unwrap();
    nudge(&mut t);
    std::thread::sleep(Duration::from_millis(300));
    writeln!(console, "markers >{}", f("markers").display()).unwrap();
    // (The table's heading first, as `mtrace report --markers` prints it.)
    let names: Vec<String> = written(&f("markers"))
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().last().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(names, ["report", "report", "here"]);
    writeln!(console, "wait").unwrap();
    drop(console);
    assert_eq!(t.ask("quit"), "holding 3 blocks\n");
    assert_eq!(c.wait_with_output().unwrap().status.code(), Some(3));
    t.server.wait().unwrap();
}

#[test]
fn the_preload_streams_to_an_address_in_the_shared_syntax() {
    // MTRACE_OUTPUT takes the addresses `mtrace server` and `client` take
    // (mtrace_format::address): `localhost` without a name lookup, and a
    // malformed one is one warning, with the program untouched.
    let dir = scratch("relay-preload-tcp");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    let native = Command::new(&prog).output().unwrap();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut bytes = Vec::new();
        s.read_to_end(&mut bytes).unwrap();
        bytes
    });
    let out = Command::new(&prog)
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", format!("tcp:localhost:{port}"))
        .output()
        .unwrap();
    assert_eq!((out.status.code(), &out.stdout, &out.stderr), (native.status.code(), &native.stdout, &native.stderr));
    let bytes = reader.join().unwrap();
    let trace = dir.join("got.mtrace");
    std::fs::write(&trace, &bytes).unwrap();
    assert_eq!(leaks_in(&report_json(&trace), "families.c").len(), 9);
    let out = Command::new(&prog).env("LD_PRELOAD", lib()).env("MTRACE_OUTPUT", "tcp:localhost:http").output().unwrap();
    assert_eq!((out.status.code(), &out.stdout), (native.status.code(), &native.stdout));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().filter(|l| l.starts_with("mtrace: ")).count(), 1, "{err}");
    assert!(err.contains("the port is a number from 0 to 65535"), "{err}");
}

/// memcheck's four kinds of a report, (bytes, blocks) each.
fn kinds(r: &serde_json::Value) -> [(Option<u64>, Option<u64>); 4] {
    ["definite", "indirect", "possible", "reachable"]
        .map(|k| (r["kinds"][k]["bytes"].as_u64(), r["kinds"][k]["blocks"].as_u64()))
}

/// `mtrace run -i --json -o REPORT extra… -- prog` whose console is told `wait`.
fn run_i_json(dir: &Path, extra: &[&str], prog: &Path) -> serde_json::Value {
    let report = dir.join("run-i.json");
    let mut c = Command::new(mtrace())
        .args(["run", "-i", "--json", "-o"])
        .arg(&report)
        .args(extra)
        .arg("--")
        .arg(prog)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(c.stdin.take().unwrap(), "wait").unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap()
}

#[test]
fn run_run_i_and_server_client_give_the_same_leak_summary() {
    // The exit scan runs in the target; its snapshot travels in the stream
    // to whichever analyzer keeps the books (issue 42, item 11).
    let dir = scratch("relay-kinds");
    let prog = build("scan.c", &dir.join("scan"), &["-g", "-O0"]);
    let (plain, _) = run_json(&dir, &["--scan"], &prog, &[]);
    let want = kinds(&plain);
    assert_eq!(want[..3], [(Some(185), Some(4)), (Some(72), Some(3)), (Some(112), Some(1))], "{}", plain["kinds"]);
    assert_eq!(kinds(&run_i_json(&dir, &[], &prog)), want);
    let sock = format!("unix:{}", dir.join("s.sock").display());
    let mut s = server(&sock, &["--wait"], &prog, false);
    let (r, out) = client(&sock, &dir, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(kinds(&r), want);
    assert!(s.wait().unwrap().success());
    // --no-scan reaches the target through run -i's server: no kinds.
    let r = run_i_json(&dir, &["--no-scan"], &prog);
    assert!(r["kinds"].is_null(), "{}", r["kinds"]);
    assert_eq!(r["summary"]["leaked_bytes"].as_u64(), Some(185 + 72 + 112 + want[3].0.unwrap()), "{}", r["summary"]);
}

#[test]
fn report_and_scan_signals_under_the_server_mark_the_stream_and_the_program_runs_on() {
    // The report and scan signals' default action ends a program: under
    // the server, whose stream goes to a socket, the preload installs
    // their handlers too, and the report point or scan is in the stream.
    let dir = scratch("relay-usr1");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let addr = format!("unix:{}", dir.join("s.sock").display());
    let mut t = Target::start_env(&addr, &prog, &["--no-scan"], &[("MTRACE_SCAN_SIGNAL", "USR2")]);
    assert_eq!(t.line(), "ready\n");
    assert_eq!(t.ask("leak 100"), "ok leak 100\n");
    let pgrep = Command::new("pgrep").args(["-P", &t.server.id().to_string(), "-x", "target"]).output().unwrap();
    let pid: i32 = String::from_utf8_lossy(&pgrep.stdout).trim().parse().unwrap();
    // SAFETY: kill with a valid pid and signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR1) }, 0);
    assert_eq!(t.ask("leak 2"), "ok leak 2\n");
    // SAFETY: kill with a valid pid and signal.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR2) }, 0);
    assert_eq!(t.ask("leak 3"), "ok leak 3\n");
    let saved = dir.join("saved.mtrace");
    let c = std::thread::spawn({
        let (addr, dir, saved) = (addr.clone(), dir.clone(), saved.clone());
        move || client(&addr, &dir, &["--save", saved.to_str().unwrap()])
    });
    std::thread::sleep(Duration::from_millis(300));
    // Alive to the end: it exits with its own status, 3, not the signal's.
    assert_eq!(t.ask("quit"), "holding 3 blocks\n");
    let (_, out) = c.join().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(t.server.wait().unwrap().code(), Some(3));
    // The client wrote the report point's .memlog where it runs: what was
    // live at the signal, the 1,000 and 100 bytes.
    let memlog = std::fs::read_to_string(dir.join(format!("target-{pid}-1.memlog"))).unwrap();
    assert!(memlog.contains("  not freed:        1,100 bytes in 2 blocks"), "{memlog}");
    // The marker stands where the signal came: since it, the 2 bytes.
    let r = Command::new(mtrace()).args(["report", "--since-marker", "1"]).arg(&saved).output().unwrap();
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(text.contains("  live change:      +5 bytes in +2 blocks"), "{text}");
    // Marker 2, the scan's: the blocks then, classified (the 1,000 bytes
    // from its start, 100 and 2: kept in the program's array, still
    // reachable).
    let r = Command::new(mtrace()).args(["report", "--until-marker", "2"]).arg(&saved).output().unwrap();
    let text = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(text.contains("Leak summary (memcheck's kinds, from the scan at "), "{text}");
    assert!(text.contains("  still reachable: 1,102 bytes in 3 blocks"), "{text}");
}
