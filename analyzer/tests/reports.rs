//! Incremental reports while the program runs: SIGUSR1 and mtrace_report()
//! write .memlog files; the marker-delta command reproduces them offline.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn setup(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    let prog = build("steady.c", &dir.join("steady"), &["-g", "-O0"]);
    (dir, prog)
}

fn traced(dir: &Path, prog: &Path) -> Command {
    let mut c = Command::new(prog);
    c.current_dir(dir)
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", dir.join("steady.mtrace"))
        .env("MTRACE_BIN", mtrace());
    c
}

#[test]
fn signal_reports_show_growth_and_frees() {
    let (dir, prog) = setup("memlog-signal");
    let m = markers("steady.c");
    let mut child = traced(&dir, &prog).stdout(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let logs = steady_memlogs(&mut out, &dir, || pid as i32);
    assert!(child.wait().unwrap().success());
    // The first report lists everything live.
    assert_eq!(memlog_entries(&logs[0]), vec![(320, 5, m["kept"]), (1000, 10, m["steady"])]);
    // The second: exactly the growth at the leak, the freed blocks negative,
    // nothing positive elsewhere.
    assert_eq!(memlog_entries(&logs[1]), vec![(-320, -5, m["kept"]), (1000, 10, m["steady"])]);
    assert!(
        logs[1].contains("+1,000 bytes in +10 blocks") && logs[1].contains("-320 bytes in -5 blocks"),
        "{}",
        logs[1]
    );
    assert_eq!(memlog_entries(&logs[2]), vec![(1000, 10, m["steady"])]);
    // The same delta offline, from the markers in the trace.
    let trace = dir.join("steady.mtrace");
    let out = Command::new(mtrace())
        .args(["report", "--since-marker", "1", "--until-marker", "2"])
        .arg(&trace)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(memlog_entries(&text), memlog_entries(&logs[1]));
    // And by time (--from/--to, issue 43): from report point 1's time to
    // report point 2's, the same change.
    let listed = Command::new(mtrace()).args(["report", "--markers", "--json"]).arg(&trace).output().unwrap();
    let points: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let at =
        |seq: u64| points.as_array().unwrap().iter().find(|p| p["seq"] == seq).unwrap()["time_ns"].as_u64().unwrap();
    let (from, to) = (format!("{}ns", at(1)), format!("{}ns", at(2)));
    let out = Command::new(mtrace()).args(["report", "--from", &from, "--to", &to]).arg(&trace).output().unwrap();
    let by_time = String::from_utf8(out.stdout).unwrap();
    assert_eq!(memlog_entries(&by_time), memlog_entries(&logs[1]), "{by_time}");
    assert!(by_time.contains("\n  live change:      +680 bytes in +5 blocks\n"), "{by_time}");
    // The same on the wall clock: the header's start plus the markers' times.
    let mut r = mtrace_format::Reader::new(std::fs::File::open(&trace).unwrap());
    let start = r.header().unwrap().start_realtime_ns;
    let wall = |ns: u64| format!("@{}.{:09}", (start + ns) / 1_000_000_000, (start + ns) % 1_000_000_000);
    let out = Command::new(mtrace())
        .args(["report", "--from", &wall(at(1)), "--to", &wall(at(2))])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), by_time);
    let out = Command::new(mtrace()).args(["report", "--from", "2020-01-01 00:00:00"]).arg(&trace).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--from 2020-01-01 00:00:00.000 ") && err.contains("before the trace's start ("), "{err}");
    // A --from after the last event is refused, naming both times.
    let out = Command::new(mtrace()).args(["report", "--from", "1h"]).arg(&trace).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--from 3600.000 s is after the trace's last event ("), "{err}");
    let listed = Command::new(mtrace()).args(["report", "--markers"]).arg(&trace).output().unwrap();
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert_eq!(listed.lines().filter(|l| l.ends_with("signal")).count(), 3, "{listed}");
}

/// The same report points under `mtrace run --ptrace` (each hooks): the
/// tracer takes the report signal (SIGUSR1, or SIGUSR2 by
/// MTRACE_REPORT_SIGNAL; steady.c has no handler for either) and the
/// memlogs say what the preload's say.
#[test]
fn signal_reports_under_ptrace_are_the_preloads() {
    for (i, h) in ptrace_hooks().iter().enumerate() {
        let (dir, prog) = setup(&format!("memlog-ptrace-{h}"));
        let m = markers("steady.c");
        // The first hooks with another report signal: the tracer reads the
        // recording's MTRACE_REPORT_SIGNAL as the preload does (SIGUSR2 it
        // would otherwise deliver, and the program would die of it).
        let (sig, name) = if i == 0 { (libc::SIGUSR2, "USR2") } else { (libc::SIGUSR1, "USR1") };
        let mut run = Command::new(mtrace())
            .current_dir(&dir)
            .env("MTRACE_REPORT_SIGNAL", name)
            .args(["run", "--ptrace", "--hooks", h, "--no-scan", "-o", "report.txt", "--"])
            .arg(&prog)
            .arg("sleep")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(run.stdout.take().unwrap());
        let mut logs = vec![];
        let mut pid = 0;
        for seq in 1..=3 {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            assert_eq!(line, "ready\n", "{h}");
            // The program is mtrace's child.
            if pid == 0 {
                let task = format!("/proc/{}/task/{}/children", run.id(), run.id());
                pid = std::fs::read_to_string(task).unwrap().split_whitespace().next().unwrap().parse().unwrap();
            }
            // SAFETY: kill on our own grandchild, which sleeps half a second.
            unsafe { libc::kill(pid, sig) };
            logs.push(wait_for_file(&dir.join(format!("steady-{pid}-{seq}.memlog"))));
        }
        assert!(run.wait().unwrap().success(), "{h}: the program was not killed by the signal");
        assert_eq!(memlog_entries(&logs[0]), vec![(320, 5, m["kept"]), (1000, 10, m["steady"])], "{h}");
        assert_eq!(memlog_entries(&logs[1]), vec![(-320, -5, m["kept"]), (1000, 10, m["steady"])], "{h}");
        assert_eq!(memlog_entries(&logs[2]), vec![(1000, 10, m["steady"])], "{h}");
    }
}

/// The C API under `mtrace run --ptrace` (each hooks): the tracer points
/// the program's weak references at stubs of its own, so `mtrace_report()`
/// writes the same memlogs before it returns, and `mtrace_marker()` names
/// a point of the trace.
#[test]
fn api_reports_under_ptrace_are_the_preloads() {
    for h in ptrace_hooks() {
        let (dir, prog) = setup(&format!("memlog-api-ptrace-{h}"));
        let m = markers("steady.c");
        let out = Command::new(mtrace())
            .current_dir(&dir)
            .args(["run", "--ptrace", "--hooks", h, "--no-scan", "--keep-traces", "-o", "report.txt"])
            .arg("--trace-dir")
            .arg(&dir)
            .arg("--")
            .arg(&prog)
            .arg("api")
            .output()
            .unwrap();
        assert!(out.status.success(), "{h}: {}", String::from_utf8_lossy(&out.stderr));
        let mut memlogs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "memlog"))
            .collect();
        memlogs.sort();
        assert_eq!(memlogs.len(), 3, "{h}: mtrace_report() is synchronous: {memlogs:?}");
        let second = std::fs::read_to_string(&memlogs[1]).unwrap();
        assert_eq!(memlog_entries(&second), vec![(-320, -5, m["kept"]), (1000, 10, m["steady"])], "{h}");
        let traced: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".mtrace"))
            .collect();
        let listed = Command::new(mtrace()).args(["report", "--markers"]).arg(&traced[0]).output().unwrap();
        let listed = String::from_utf8(listed.stdout).unwrap();
        assert!(listed.lines().any(|l| l.ends_with("first")), "{h}: {listed}");
    }
}

#[test]
fn api_reports_and_named_markers() {
    let (dir, prog) = setup("memlog-api");
    let m = markers("steady.c");
    let child = traced(&dir, &prog).arg("api").output().unwrap();
    assert!(child.status.success(), "{}", String::from_utf8_lossy(&child.stderr));
    let memlogs: Vec<PathBuf> = {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "memlog"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(memlogs.len(), 3, "mtrace_report() is synchronous: {memlogs:?}");
    let second = std::fs::read_to_string(&memlogs[1]).unwrap();
    assert_eq!(memlog_entries(&second), vec![(-320, -5, m["kept"]), (1000, 10, m["steady"])]);
    // Named markers select a window too: from "first" to the end.
    let r = Command::new(mtrace())
        .args(["report", "--json", "--since-marker", "first"])
        .arg(dir.join("steady.mtrace"))
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let mut got = leaks_in(&r, "steady.c");
    got.sort();
    assert_eq!(got[0].bytes, -320);
    assert_eq!((got[1].bytes, got[1].blocks), (2000, 20));
    // An unknown marker is an error, not an empty report.
    let bad = Command::new(mtrace())
        .args(["report", "--since-marker", "nope"])
        .arg(dir.join("steady.mtrace"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no marker \"nope\""));
}

#[test]
fn start_stop_and_glibc_mtrace_calls() {
    let dir = scratch("startstop");
    let prog = build("startstop.c", &dir.join("startstop"), &["-g", "-O0"]);
    let m = markers("startstop.c");
    let out = Command::new(&prog)
        .current_dir(&dir)
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", dir.join("t.mtrace"))
        .env("MTRACE_BIN", mtrace())
        .env("MTRACE_START", "off")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = report_json(&dir.join("t.mtrace"));
    let mut want =
        vec![leak(902, 1, "malloc", "main", m["after_start"]), leak(904, 1, "malloc", "main", m["after_restart"])];
    want.sort();
    assert_eq!(leaks_in(&r, "startstop.c"), want);
    assert_eq!(r["summary"]["unmatched_frees"], 1);
    let pid = r["pid"].as_u64().unwrap();
    let line = |name: &str| m[name];
    let first = std::fs::read_to_string(dir.join(format!("startstop-{pid}-1.memlog"))).unwrap();
    let second = std::fs::read_to_string(dir.join(format!("startstop-{pid}-2.memlog"))).unwrap();
    let entries_in = |text: &str| {
        let mut v: Vec<(i64, i64, u32)> = text
            .split("\n#")
            .skip(1)
            .map(|e| {
                let words: Vec<&str> = e.split_whitespace().collect();
                let num = |t: &str| t.replace([',', '+'], "").parse::<i64>().unwrap();
                let at = e.find("startstop.c:").unwrap() + 12;
                let ln = e[at..].split(')').next().unwrap().parse().unwrap();
                (num(words[1]), num(words[4]), ln)
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(entries_in(&first), vec![(50, 1, line("temporary")), (902, 1, line("after_start"))]);
    assert_eq!(entries_in(&second), vec![(-50, -1, line("temporary")), (904, 1, line("after_restart"))]);
}

#[test]
fn timeline_samples_rss_and_heap() {
    let dir = scratch("timeline");
    let prog = build("timeline.c", &dir.join("timeline"), &["-g", "-O0", "-pthread"]);
    let (r, _) = run_json(&dir, &["--timeline"], &prog, &["thread"]);
    let points = r["timeline"].as_array().expect("a timeline");
    // Sampled every 10 ms while anything changes, at 20, 40, 80 ms … while
    // the program sleeps (bounds loose for a busy machine).
    assert!(points.len() >= 4, "{points:?}");
    // Besides the 30 MiB: the TLS block the loader allocated for the thread
    // (288 bytes; glibc keeps it for the next thread, freeres at exit).
    let big = 30u64 << 20;
    let heap = |p: &serde_json::Value| p["heap_bytes"].as_u64().unwrap();
    let is_big = |p: &serde_json::Value| (big..big + 4096).contains(&heap(p));
    assert!(points.iter().all(|p| heap(p) < 4096 || is_big(p)), "{points:?}");
    assert!(points.iter().filter(|p| is_big(p)).count() >= 2, "{points:?}");
    assert!(points.iter().any(|p| is_big(p) && p["rss_bytes"].as_u64().unwrap() >= big), "{points:?}");
    let last = points.last().unwrap();
    assert_eq!(last["heap_bytes"], 0);
    assert!(last["rss_bytes"].as_u64().unwrap() < big, "freed memory left the RSS: {last}");
}

#[test]
fn a_process_with_one_thread_is_sampled_at_its_events_and_its_ends() {
    // No writer thread (docs/PROCESSES.md): the RSS at the start, at the
    // malloc's round, at the round before the free (the first event 5 ms
    // after the malloc's), and at the end; nothing while it sleeps.
    let dir = scratch("timeline-solo");
    let prog = build("timeline.c", &dir.join("timeline"), &["-g", "-O0"]);
    let (r, _) = run_json(&dir, &["--timeline"], &prog, &[]);
    let points = r["timeline"].as_array().expect("a timeline");
    let big = 30u64 << 20;
    let with_big: Vec<&serde_json::Value> = points.iter().filter(|p| p["heap_bytes"] == big).collect();
    let time = |p: &serde_json::Value| p["time_ns"].as_u64().unwrap();
    let rss = |p: &serde_json::Value| p["rss_bytes"].as_u64().unwrap();
    // The free's round, after the 100 ms sleep, with the block touched;
    // and the malloc's round if the malloc was stamped before it (the
    // hook's stamp is taken again after the round when the round
    // collected: then the block came after the sample), not touched yet.
    let (free_round, malloc_round) = with_big.split_last().expect("a sample while the block lived");
    assert!(time(free_round) >= 100_000_000 && rss(free_round) >= big, "{points:?}");
    assert!(malloc_round.len() <= 1, "{points:?}");
    assert!(malloc_round.iter().all(|p| time(p) < 100_000_000 && rss(p) < big), "{points:?}");
    // The start's, and the end's.
    let (first, last) = (&points[0], points.last().unwrap());
    assert_eq!((first["time_ns"].as_u64(), first["heap_bytes"].as_u64()), (Some(0), Some(0)), "{points:?}");
    assert_eq!(last["heap_bytes"], 0, "{points:?}");
    assert!(last["rss_bytes"].as_u64().unwrap() < big, "freed memory left the RSS: {last}");
    assert!(points.len() <= 4, "{points:?}");
}

/// The line in steady.c of a section entry.
fn steady_line(e: &serde_json::Value) -> u64 {
    line_in(e, "steady.c").unwrap()
}

#[test]
fn heaptrack_sections_and_older_than() {
    let (dir, prog) = setup("sections");
    let m = markers("steady.c");
    let (r, _) =
        run_json_env(&dir, &[("MTRACE_BIN", mtrace().to_str().unwrap())], &["--older-than", "0s"], &prog, &["api"]);
    let x = &r["sections"];
    let calls: Vec<(u64, u64)> =
        x["most_calls"].as_array().unwrap().iter().map(|e| (e["count"].as_u64().unwrap(), steady_line(e))).collect();
    assert_eq!(calls, vec![(3000, m["balanced"] as u64), (30, m["steady"] as u64), (5, m["kept"] as u64)]);
    // Every balanced block is freed before the next allocation.
    assert_eq!(x["temporary_total"], 3000);
    assert_eq!(
        (x["temporary"][0]["count"].as_u64(), steady_line(&x["temporary"][0])),
        (Some(3000), m["balanced"] as u64)
    );
    // At the peak the 30 leaked blocks are the largest holder.
    let peak = &x["peak_consumers"][0];
    assert_eq!(
        (peak["bytes"].as_u64(), peak["count"].as_u64(), steady_line(peak)),
        (Some(3000), Some(30), m["steady"] as u64)
    );
    // The histogram accounts for every call and byte.
    let hist = x["histogram"].as_array().unwrap();
    let sum = |k: &str| hist.iter().map(|b| b[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("calls"), r["summary"]["allocations"].as_u64().unwrap());
    assert_eq!(sum("bytes"), r["summary"]["bytes_allocated"].as_u64().unwrap());
    // --older-than 0s: every live block.
    let old = x["older_than"].as_array().unwrap();
    assert_eq!(old.len(), 1);
    assert_eq!((old[0]["bytes"].as_u64(), old[0]["count"].as_u64()), (Some(3000), Some(30)));
}

#[test]
fn intervals_rank_steady_growth_first() {
    let dir = scratch("intervals");
    let prog = build("grow.c", &dir.join("grow"), &["-g", "-O0"]);
    let m = markers("grow.c");
    let (r, _) = run_json(&dir, &["--intervals", "50ms"], &prog, &[]);
    let x = &r["intervals"];
    let windows = x["windows"].as_u64().unwrap();
    // About 240 ms of run: 5 or more windows of 50 ms.
    assert!(windows >= 5, "{x}");
    let stacks = x["stacks"].as_array().unwrap();
    let line = |e: &serde_json::Value| line_in(e, "grow.c").unwrap();
    // The 100-byte leak, in (nearly) every window, comes before the larger
    // one-time block.
    assert_eq!(line(&stacks[0]), m["grow"] as u64);
    // (Loose: a busy machine can stretch a 20 ms sleep past a window.)
    assert!(stacks[0]["windows_with_growth"].as_u64().unwrap() >= windows / 2, "{x}");
    let per: u64 = stacks[0]["per_window"].as_array().unwrap().iter().map(|w| w["bytes"].as_u64().unwrap()).sum();
    assert_eq!(per, 1200);
    assert_eq!(line(&stacks[1]), m["once"] as u64);
    assert_eq!(stacks[1]["windows_with_growth"], 1);
}

#[test]
fn report_dir_holds_the_memlogs() {
    let (dir, prog) = setup("memlog-dir");
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let out = traced(&dir, &prog).env("MTRACE_REPORT_DIR", &logs).arg("api").output().unwrap();
    assert!(out.status.success());
    let names: Vec<String> =
        std::fs::read_dir(&logs).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(names.iter().filter(|n| n.ends_with(".memlog")).count(), 3, "{names:?}");
    assert!(!std::fs::read_dir(&dir).unwrap().any(|e| e.unwrap().path().extension().is_some_and(|x| x == "memlog")));
}

#[test]
fn an_idle_program_is_sampled_rarely() {
    let dir = scratch("idle");
    let trace = dir.join("idle.mtrace");
    let st = std::process::Command::new("sleep")
        .arg("2")
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", &trace)
        .status()
        .unwrap();
    assert!(st.success());
    let out =
        std::process::Command::new(mtrace()).args(["report", "--json", "--timeline"]).arg(&trace).output().unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 10, 20, 40 … ms, then once a second: a sample every 10 ms made 200.
    let n = r["timeline"].as_array().unwrap().len();
    assert!((2..=12).contains(&n), "{n} samples");
}

/// `mtrace run` reads the program's trace while the program writes it
/// (pipeline/following.rs) and reports those books when it ends: the
/// report is the one `mtrace report` gives of the same file, for a leak
/// scan's kinds, threads, and an exec (whose first image was read while
/// the second one ran: the report reads the second's file then).
#[test]
fn run_reports_the_books_it_read_while_the_program_ran() {
    let dir = scratch("run-followed");
    for (src, extra) in [("scan.c", &["--scan"][..]), ("threads.c", &[][..]), ("exec.c", &[][..])] {
        let stem = src.trim_end_matches(".c");
        let prog = build(src, &dir.join(stem), &["-g", "-O0", "-pthread"]);
        let tdir = dir.join(format!("{stem}.traces"));
        let _ = std::fs::remove_dir_all(&tdir);
        let mut args = vec!["--sections", "--trace-dir", tdir.to_str().unwrap()];
        args.extend(extra);
        let (run, _) = run_json(&dir, &args, &prog, &[]);
        // The program's last image: its pid's newest trace.
        let mut images: Vec<_> = trace_headers(&tdir).into_iter().filter(|(_, h)| h.pid == run["pid"]).collect();
        images.sort_by_key(|(_, h)| h.start_monotonic_ns);
        assert_eq!(images.len(), if src == "exec.c" { 2 } else { 1 }, "{src}: images");
        let trace = &images.last().unwrap().0;
        assert_eq!(run["trace"].as_str(), trace.to_str(), "{src}");
        let out = Command::new(mtrace()).args(["report", "--json", "--sections"]).arg(trace).output().unwrap();
        let after: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(after["summary"]["allocations"].as_u64() > Some(0), "{src}: {after}");
        assert_eq!(untimed(run), untimed(after), "{src}");
    }
}
