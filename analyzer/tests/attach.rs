//! `mtrace attach`: a running process is traced for a while and goes on
//! unchanged after the detach.

mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Starts `mtrace attach PID --json -o REPORT extra…` and waits until it
/// says it is attached.
fn attach(pid: u32, report: &Path, extra: &[&str]) -> Child {
    let mut c = Command::new(mtrace());
    c.arg("attach").arg(pid.to_string()).arg("--json").arg("-o").arg(report).args(extra);
    spawn_until(&mut c, "attached to process")
}

fn wait_ok(c: &mut Child) {
    let st = c.wait().unwrap();
    assert!(st.success(), "mtrace attach: {st}");
}

fn sigterm(c: &Child) {
    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
}

#[test]
fn leaks_made_while_attached_to_a_program_waiting_in_read() {
    let dir = scratch("attach-read");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let m = markers("attach_target.c");
    let script = ["leak 10", "leak 100", "leak 200", "tmp 50", "free", "leak 7"];
    // Unattached: the answers and exit status to compare with.
    let mut plain = AttachTarget::start(&prog);
    let answers: Vec<String> = script.iter().map(|c| plain.ask(c)).collect();
    let quit = plain.ask("quit");
    assert_eq!(plain.child.wait().unwrap().code(), Some(3));

    let mut t = AttachTarget::start(&prog);
    let mut got = vec![t.ask(script[0])];
    let report = dir.join("report.json");
    let window = dir.join("window.mtrace");
    let _ = std::fs::remove_file(&window);
    let mut a = attach(t.child.id(), &report, &["--save", window.to_str().unwrap()]);
    got.extend(script[1..5].iter().map(|c| t.ask(c)));
    sigterm(&a);
    wait_ok(&mut a);
    got.push(t.ask(script[5]));
    assert_eq!(got, answers);
    assert_eq!(t.ask("quit"), quit);
    assert_eq!(t.child.wait().unwrap().code(), Some(3));

    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let s = &r["summary"];
    // Within the window: 100 and 200 kept, 50 freed; the free of the block
    // from before the attach is unmatched, not an error.
    assert_eq!(leaks_in(&r, "attach_target.c"), vec![leak(300, 2, "malloc", "keep", m["window"])]);
    assert_eq!((s["allocations"].as_u64(), s["frees"].as_u64()), (Some(3), Some(2)), "{s}");
    assert_eq!(s["unmatched_frees"], 1, "{s}");
    assert_eq!(r["errors"], serde_json::json!([]), "{s}");
    assert_eq!(s["ended_by"], "detach", "{s}");
    // The books read while the stream arrived (pipeline/following.rs)
    // report as the window's saved trace read afterwards.
    assert_eq!(untimed(r), untimed(report_json(&window)));
}

#[test]
fn a_process_with_one_thread_keeps_one_while_attached() {
    // No writer thread of the tracer's: a zygote, or a process about to
    // unshare a user namespace, must stay single-threaded. It answers at
    // its allocation calls, and the attach makes it write what it
    // buffered (and detaches it) by calls made in it, as the attach was.
    let dir = scratch("attach-one-thread");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let m = markers("attach_target.c");
    let mut t = AttachTarget::start(&prog);
    let pid = t.child.id();
    let threads = || std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().count();
    assert_eq!(threads(), 1);
    let report = dir.join("report.json");
    let mut a = attach(pid, &report, &[]);
    t.ask("leak 100");
    for _ in 0..10 {
        assert_eq!(threads(), 1);
        std::thread::sleep(Duration::from_millis(30));
    }
    // Idle in read now: the detach is a call made in it.
    sigterm(&a);
    wait_ok(&mut a);
    assert_eq!(threads(), 1);
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["summary"]["ended_by"], "detach");
    assert_eq!(leaks_in(&r, "attach_target.c"), vec![leak(100, 1, "malloc", "keep", m["window"])]);
    // It goes on untraced.
    assert_eq!(t.ask("leak 10"), "ok leak 10\n");
    t.ask("quit");
    t.child.wait().unwrap();
}

/// Attaches and detaches `cycles` times while `prog` runs; checks every
/// report and that the program ends normally.
#[test]
fn a_poll_the_injection_interrupted_goes_on_without_eintr() {
    // The chosen thread waits in poll (restarted from its restart block);
    // the call made on it sleeps (nanosleep replaces that block), as
    // libmtrace.so's start may: the poll must go on, not fail with EINTR
    // (ctests/own_malloc.c, attached, ended once so).
    let dir = scratch("attach-poll");
    let prog = build("poll_wait.c", &dir.join("poll_wait"), &["-g", "-O0"]);
    let mut child = Command::new(&prog).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id() as i32;
    let t = mtrace_ptrace::inspect::inspect(pid).unwrap();
    let mut tracee = mtrace_ptrace::inject::Tracee::seize(pid).unwrap();
    tracee.choose(&t.busy).unwrap();
    // dlsym(RTLD_DEFAULT, "usleep"), then usleep(1000).
    let usleep = tracee.call(t.libc.dlsym, b"usleep\0", |p| vec![0, p]).unwrap();
    assert_ne!(usleep, 0);
    tracee.call(usleep, &[], |_| vec![1000]).unwrap();
    tracee.release().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "poll: 1\n");
}

/// The injection's thread held in epoll_wait, which the stop set to be
/// made again: a signal with a handler sent meanwhile still makes the wait
/// fail with EINTR when the thread goes on, as it does natively (and a
/// poll restarted from its restart block the same).
#[test]
fn a_signal_sent_while_the_thread_is_held_still_interrupts_its_wait() {
    let dir = scratch("attach-held-signal");
    let prog = build("poll_wait.c", &dir.join("poll_wait"), &["-g", "-O0"]);
    for (arg, call) in [("epoll", "epoll_wait"), ("poll", "poll")] {
        let child = Command::new(&prog).arg(arg).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let pid = child.id() as i32;
        let t = mtrace_ptrace::inspect::inspect(pid).unwrap();
        let mut tracee = mtrace_ptrace::inject::Tracee::seize(pid).unwrap();
        tracee.choose(&t.busy).unwrap();
        // SAFETY: kill of our own child, held stopped.
        unsafe { libc::kill(pid, libc::SIGUSR1) };
        tracee.release().unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{call} failed: Interrupted system call\n"));
    }
}

/// Calls signal(7) lists as failing with EINTR after a stop (epoll_wait,
/// semtimedop, sigtimedwait, recv with a timeout) go on through an attach,
/// by the library and by ptrace with each hook: on the main thread, the
/// one the injection runs on (ctests/poll_wait.c), and on the threads it
/// only stops (ctests/waits.c). Each returns what it returns natively,
/// after its whole timeout (counted again from the attach's last stop).
/// Before, each failed with EINTR.
#[test]
fn waits_a_stop_would_fail_go_on_through_attaches() {
    let dir = scratch("attach-stop-list");
    let poll_wait = build("poll_wait.c", &dir.join("poll_wait"), &["-g", "-O0"]);
    let waits = build("waits.c", &dir.join("waits"), &["-g", "-O0"]);
    let list = ["epoll_wait", "semtimedop", "sigtimedwait", "recv_timeout"];
    // What each returns at its timeout (waits.c's lines: rc, errno).
    let natively = [(0, 0), (-1, libc::EAGAIN), (-1, libc::EAGAIN), (-1, libc::EAGAIN)];
    let mut ways = vec![vec![]];
    ways.extend(ptrace_hooks().iter().map(|h| vec!["--ptrace", "--hooks", h]));
    for way in &ways {
        let attach_to = |pid: u32| {
            let out = Command::new(mtrace())
                .args(["attach", &pid.to_string(), "--duration", "200ms", "-o", "/dev/null"])
                .args(way)
                .output()
                .unwrap();
            assert!(out.status.success(), "{way:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let mut child =
            Command::new(&poll_wait).arg("epoll").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        attach_to(child.id());
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "epoll_wait: 1\n", "{way:?}");

        let child = Command::new(&waits)
            .args(["wait", "1500"])
            .args(list)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        attach_to(child.id());
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{way:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{way:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        for (kind, (rc, errno)) in list.iter().zip(natively) {
            let line = stdout.lines().find(|l| l.starts_with(&format!("{kind} "))).unwrap_or_default();
            assert!(line.starts_with(&format!("{kind} rc={rc} errno={errno} ms=")), "{way:?}: {stdout}");
            let ms: f64 = line.rsplit("ms=").next().unwrap().parse().unwrap();
            assert!(ms >= 1499.0, "{way:?}: {kind} returned early: {stdout}");
        }
    }
}

fn cycles(prog: &Path, cycles: usize, max_live: u64) {
    let dir = prog.parent().unwrap();
    let mut child = Command::new(prog).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..cycles {
        let r = attach_for(child.id(), "200ms", &dir.join(format!("report{i}.json")), &format!("cycle {i}"));
        let s = &r["summary"];
        assert_eq!(s["ended_by"], "detach", "cycle {i}: {s}");
        assert!(s["allocations"].as_u64().unwrap() > 1000, "cycle {i}: {s}");
        // What is live at the detach is what the threads hold: every free
        // of a block from the window found its block.
        assert!(s["leaked_blocks"].as_u64().unwrap() <= max_live, "cycle {i}: {s}");
    }
    // The end of its input ends the program.
    drop(child.stdin.take());
    let Output { status, stdout, .. } = child.wait_with_output().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(String::from_utf8_lossy(&stdout), "done ok\n");
}

#[test]
fn twenty_attaches_to_two_busy_threads() {
    let dir = scratch("attach-busy");
    let prog = build("busy_threads.c", &dir.join("busy"), &["-g", "-O2"]);
    cycles(&prog, 20, 2 * 64);
}

#[test]
fn attaches_to_cxx_std_threads() {
    let dir = scratch("attach-busy-cxx");
    let prog = build("busy_threads.cpp", &dir.join("busy"), &["-g", "-O1"]);
    // 64 strings and 100 map entries per thread.
    cycles(&prog, 10, 2 * (64 + 100));
}

#[test]
fn python_runs_on_after_a_detach() {
    // Loops until its standard input ends.
    let code = "import sys, threading\nend = threading.Event()\nthreading.Thread(target=lambda: (sys.stdin.read(), end.set())).start()\nd = {}\ni = 0\nwhile not end.is_set():\n    d[i % 1000] = [i] * 10\n    i += 1\nprint('done', len(d))";
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", code])
        .env("PYTHONMALLOC", "malloc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let dir = scratch("attach-python");
    for i in 0..2 {
        let r = attach_for(child.id(), "300ms", &dir.join(format!("r{i}.json")), &format!("attach {i}"));
        assert!(r["summary"]["allocations"].as_u64().unwrap() > 100, "{}", r["summary"]);
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done 1000\n");
}

/// `mtrace attach ARGS`: exit status 2 and one line on stderr naming the cause.
fn refused(args: &[&str], cause: &str) {
    let out = Command::new(mtrace()).arg("attach").args(args).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(cause), "{err:?} should name {cause:?}");
}

#[test]
fn refusals_name_their_cause_and_leave_the_process_alone() {
    refused(&["999999999"], "no such process");

    let dir = scratch("attach-refused");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    // Statically linked: no dlopen to call.
    let stat = dir.join("target-static");
    let ok = Command::new("cc")
        .args(["-static", "-O0"])
        .arg(ctests_dir().join("attach_target.c"))
        .arg("-o")
        .arg(&stat)
        .status();
    // Refused with what `why` says (given the pid), and it goes on.
    let refused_and_untouched = |prog: &std::path::Path, why: &dyn Fn(&str) -> String| {
        let mut t = AttachTarget::start(prog);
        let pid = t.child.id().to_string();
        refused(&[&pid], &why(&pid));
        assert_eq!(t.ask("leak 1"), "ok leak 1\n");
        t.ask("quit");
        t.child.wait().unwrap();
    };
    if ok.is_ok_and(|s| s.success()) {
        refused_and_untouched(&stat, &|pid| {
            format!("statically linked (no libc.so mapped), so libmtrace.so cannot be loaded into it; mtrace attach --ptrace {pid} traces it from outside")
        });
    } else {
        cannot_run("the static case: cc -static failed (no static libc)");
    }
    // Another C library's (musl's): said, where its loader's dlopen failed
    // on libgcc_s.so.1 (issue 66).
    if has("musl-gcc") {
        let musl = build_with("musl-gcc", "attach_target.c", &dir.join("target-musl"), &["-O0"]);
        refused_and_untouched(&musl, &|pid| {
            format!("process {pid} was started by /lib/ld-musl-x86_64.so.1, another C library's loader, which cannot load libmtrace.so (built for glibc); mtrace attach --ptrace {pid} traces it from outside")
        });
    } else {
        cannot_run("musl-gcc is not installed (musl-tools)");
    }
    // Preloaded already.
    let mut child = Command::new(&prog)
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", dir.join("pre.mtrace"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    refused(&[&child.id().to_string()], "already runs with libmtrace.so preloaded");
    // Its environment rewritten, as redis-server's title: the library
    // itself tells (said "traced already (by another mtrace attach)").
    let mut input = child.stdin.take().unwrap();
    writeln!(input, "title").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ok title\n");
    let environ = std::fs::read(format!("/proc/{}/environ", child.id())).unwrap();
    assert!(!String::from_utf8_lossy(&environ).contains("LD_PRELOAD"));
    refused(&[&child.id().to_string()], "already runs with libmtrace.so preloaded");
    drop(input);
    assert_eq!(child.wait().unwrap().code(), Some(0));
    // Another tracer holds it.
    let mut t = AttachTarget::start(&prog);
    let pid = nix::unistd::Pid::from_raw(t.child.id() as i32);
    nix::sys::ptrace::seize(pid, nix::sys::ptrace::Options::empty()).unwrap();
    refused(&[&t.child.id().to_string()], "not permitted");
    nix::sys::ptrace::interrupt(pid).unwrap();
    nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::__WALL)).unwrap();
    nix::sys::ptrace::detach(pid, None).unwrap();
    let start = Instant::now();
    assert_eq!(t.ask("leak 2"), "ok leak 2\n");
    assert!(start.elapsed() < Duration::from_secs(5));
    t.ask("quit");
    assert_eq!(t.child.wait().unwrap().code(), Some(3));
}

/// `mtrace attach --interval 400ms --older-than 200ms` with `extra` on
/// `t` while `work` runs, then 1.3 s, then SIGTERM: its standard output
/// and the last view's first line.
fn interval_views(t: &mut AttachTarget, extra: &[&str], work: impl FnOnce(&mut AttachTarget)) -> (String, String) {
    let a = spawn_until(
        Command::new(mtrace())
            .args(["attach", &t.child.id().to_string(), "--interval", "400ms", "--older-than", "200ms"])
            .args(extra)
            .stdout(Stdio::piped()),
        "attached to process",
    );
    work(t);
    std::thread::sleep(Duration::from_millis(1300));
    sigterm(&a);
    let out = a.wait_with_output().unwrap();
    assert!(out.status.success());
    let views = String::from_utf8_lossy(&out.stdout).into_owned();
    let last = views.lines().rfind(|l| l.starts_with('[')).unwrap_or_default().to_owned();
    (views, last)
}

#[test]
fn interval_views_show_what_stays_live() {
    let dir = scratch("attach-interval");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let m = markers("attach_target.c");
    let mut t = AttachTarget::start(&prog);
    let report = dir.join("report.json");
    let extra = ["--json", "-o", report.to_str().unwrap(), "--pprof-dir", dir.to_str().unwrap()];
    let (views, last) = interval_views(&mut t, &extra, |t| {
        for _ in 0..5 {
            t.ask("leak 1000");
            t.ask("tmp 64");
        }
    });
    assert!(last.ends_with("live for more than 0.2 s: 5,000 bytes in 5 blocks, 1 backtrace"), "{views}");
    let at = format!("keep ({}:{})", ctests_dir().join("attach_target.c").display(), m["window"]);
    assert!(views.contains("#1: 5,000 bytes in 5 blocks") && views.contains(&at), "{views}");
    // --pprof-dir: a profile per interval, the last with the five blocks.
    let name = |seq: u32| dir.join(format!("target.{}.{seq}.pb.gz", t.child.id()));
    assert!(name(1).exists() && name(2).exists(), "{:?}", std::fs::read_dir(&dir).unwrap().collect::<Vec<_>>());
    let last = (1..).take_while(|&n| name(n).exists()).last().unwrap();
    let in_use = pprof_in_use(&name(last));
    assert_eq!(in_use.get(&("attach_target.c".to_owned(), m["window"])), Some(&(5, 5000)), "{in_use:?}");
    t.ask("quit");
    t.child.wait().unwrap();
}

#[test]
fn sampled_interval_views_estimate_what_stays_live() {
    let dir = scratch("attach-interval-sampled");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let m = markers("attach_target.c");
    let mut t = AttachTarget::start(&prog);
    // Blocks of at least the rate are always recorded: the estimate is
    // exact. The small ones come and go unseen (1 in 1,000 is sampled).
    let (views, last) = interval_views(&mut t, &["--sample-rate", "64K", "-o", "/dev/null"], |t| {
        for _ in 0..5 {
            t.ask("leak 100000");
            for _ in 0..20 {
                t.ask("tmp 64");
            }
        }
    });
    assert!(
        last.ends_with(
            "live for more than 0.2 s: 500,000 bytes in 5 blocks, 1 backtrace (estimated, sampled at 64 KiB)"
        ),
        "{views}"
    );
    let at = format!("keep ({}:{})", ctests_dir().join("attach_target.c").display(), m["window"]);
    assert!(views.contains("#1: 500,000 bytes in 5 blocks") && views.contains(&at), "{views}");
    t.ask("quit");
    t.child.wait().unwrap();
}

#[test]
fn interval_views_under_ptrace_show_what_stays_live() {
    for hooks in ptrace_hooks() {
        let dir = scratch(&format!("attach-interval-ptrace-{hooks}"));
        let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
        let m = markers("attach_target.c");
        let mut t = AttachTarget::start(&prog);
        let (views, last) = interval_views(&mut t, &["--ptrace", "--hooks", hooks, "-o", "/dev/null"], |t| {
            for _ in 0..5 {
                t.ask("leak 1000");
                t.ask("tmp 64");
            }
        });
        assert!(last.ends_with("live for more than 0.2 s: 5,000 bytes in 5 blocks, 1 backtrace"), "{hooks}: {views}");
        let at = format!("keep ({}:{})", ctests_dir().join("attach_target.c").display(), m["window"]);
        assert!(views.contains("#1: 5,000 bytes in 5 blocks") && views.contains(&at), "{hooks}: {views}");
        // Detached, the program goes on.
        assert_eq!(t.ask("leak 10"), "ok leak 10\n", "{hooks}");
        assert_eq!(t.ask("quit"), "holding 6 blocks\n", "{hooks}");
        assert_eq!(t.child.wait().unwrap().code(), Some(3), "{hooks}");
    }
}

#[test]
fn scan_at_detach_classifies_the_window_with_untracked_blocks_as_roots() {
    let dir = scratch("attach-scan");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let m = markers("attach_target.c");
    let mut t = AttachTarget::start(&prog);
    let report = dir.join("report.json");
    let mut a = attach(t.child.id(), &report, &["--scan"]);
    t.ask("leak 100");
    t.ask("lose 77");
    t.ask("hang 55");
    sigterm(&a);
    wait_ok(&mut a);
    t.ask("quit");
    t.child.wait().unwrap();
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let k = &r["kinds"];
    let kind = |name: &str| (k[name]["bytes"].as_u64().unwrap(), k[name]["blocks"].as_u64().unwrap());
    // The dropped block is lost; the one only the block from before the
    // attach points to is reachable, as the kept one.
    assert_eq!(kind("definite"), (77, 1), "{k}");
    assert_eq!(kind("reachable"), (155, 2), "{k}");
    assert_eq!((kind("indirect"), kind("possible")), ((0, 0), (0, 0)), "{k}");
    assert_eq!(leaks_in(&r, "attach_target.c"), vec![leak(77, 1, "malloc", "lose", m["lost"])]);
}

#[test]
fn console_commands_on_an_attached_process() {
    let dir = scratch("attach-console");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let m = markers("attach_target.c");
    let mut t = AttachTarget::start(&prog);
    let mut a = spawn_until(
        Command::new(mtrace())
            .args(["attach", &t.child.id().to_string(), "-i", "-o"])
            .arg(dir.join("final.txt"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
        "attached to process",
    );
    t.ask("leak 100");
    t.ask("leak 100");
    t.ask("lose 33");
    // The stream reaches mtrace within a writer round or two.
    std::thread::sleep(Duration::from_millis(300));
    let dump = dir.join("dump.txt");
    let mut input = a.stdin.take().unwrap();
    writeln!(input, "st").unwrap();
    writeln!(input, "stat").unwrap();
    writeln!(input, "dump allocations >{}", dump.display()).unwrap();
    writeln!(input, "sc").unwrap();
    writeln!(input, "help marker").unwrap();
    writeln!(input, "detach").unwrap();
    let out = a.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"st\" is ambiguous: status, start, stop"), "{text}");
    assert!(text.contains("in use: 233 bytes in 3 blocks (average 77 bytes)"), "{text}");
    assert!(text.contains("marker NAME — set a named point now"), "{text}");
    // The scan: the dropped block lost, the kept ones reachable.
    assert!(text.contains("definitely lost: 33 bytes in 1 block"), "{text}");
    assert!(text.contains("still reachable: 200 bytes in 2 blocks"), "{text}");
    // dump allocations: the backtrace with two blocks first.
    let d = std::fs::read_to_string(&dump).unwrap();
    let first = d.lines().find(|l| l.starts_with("#1:")).unwrap_or_default();
    assert!(first.starts_with("#1: 200 bytes in 2 blocks"), "{d}");
    assert!(d.contains(&format!("keep ({}:{})", ctests_dir().join("attach_target.c").display(), m["window"])), "{d}");
    t.ask("quit");
    t.child.wait().unwrap();
}
