//! Bounded traces (`mtrace run --max-trace-size`): a trace cut at its
//! checkpoints reports what the whole trace of the same run reports.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::*;
use mtrace_analysis::{bounded, input, trace::Trace};
use serde_json::Value;

/// Every live block: address → (bytes, family, allocation time in ns, frames).
fn live(t: &Trace) -> BTreeMap<u64, (u64, String, u64, Vec<u64>)> {
    let frames = |s: u32| t.stacks.frames[s as usize].clone();
    t.books.live_blocks().map(|(a, b)| (a, (b.size, format!("{:?}", b.family), b.time, frames(b.stack)))).collect()
}

/// The counters a report's summary shows.
fn counters(t: &Trace) -> [u64; 9] {
    let b = &t.books;
    let (wrong, mismatched) = b.wrong_free_counts();
    [
        b.allocations,
        b.frees,
        b.realloc_frees,
        b.bytes_allocated,
        b.peak_bytes,
        b.peak_blocks,
        b.peak_time,
        wrong,
        mismatched,
    ]
}

/// The trace of `prog args` under the preload, with the scan at exit, in
/// `dir/whole.mtrace`.
fn whole_trace(dir: &std::path::Path, prog: &std::path::Path, args: &[&str]) -> std::path::PathBuf {
    let whole = dir.join("whole.mtrace");
    let st = Command::new(prog)
        .args(args)
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", &whole)
        .env("MTRACE_SCAN", "1")
        .status()
        .unwrap();
    assert!(st.success());
    whole
}

/// The trace `whole` kept within `max` bytes into the folder `into`.
fn cut(whole: &std::path::Path, into: &std::path::Path, max: u64) -> bounded::Kept {
    keep(whole, into, bounded::Bound { bytes: Some(max), age_ns: None })
}

/// The trace `whole` kept within `bound` into the folder `into`.
fn keep(whole: &std::path::Path, into: &std::path::Path, bound: bounded::Bound) -> bounded::Kept {
    std::fs::create_dir_all(into).unwrap();
    bounded::keep(std::fs::File::open(whole).unwrap(), bounded::Dest::Dir(into), bound, None).unwrap()
}

/// `mtrace report --json` of `trace`, without the fields that name the file.
fn report(trace: &std::path::Path) -> Value {
    report_with(trace, &[])
}

/// [`report`] with more options.
fn report_with(trace: &std::path::Path, extra: &[&str]) -> Value {
    let out =
        Command::new(mtrace()).args(["report", "--json", "--show-reachable"]).args(extra).arg(trace).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_object_mut().unwrap().remove("trace");
    v
}

#[test]
fn a_trace_cut_at_its_checkpoints_reports_what_the_whole_trace_does() {
    let dir = scratch("bounded_cut");
    let prog = build("long_run.c", &dir.join("long_run"), &["-g", "-O0"]);
    let whole = whole_trace(&dir, &prog, &["600"]);
    // The same run's stream kept within 1 MiB, as `mtrace run
    // --max-trace-size 1M` keeps it while it arrives.
    let kept = cut(&whole, &dir.join("cut"), 1 << 20);
    let (whole_len, cut_len) = (std::fs::metadata(&whole).unwrap().len(), std::fs::metadata(&kept.path).unwrap().len());
    assert!(kept.error.is_none(), "{kept:?}");
    assert!(kept.checkpoints >= 3 && kept.dropped > 0, "{kept:?}, whole trace {whole_len} bytes");
    assert!(cut_len <= (1 << 20) + (256 << 10), "cut trace {cut_len} bytes, whole {whole_len}");

    eprintln!("{kept:?}: {whole_len} -> {cut_len} bytes");
    let (a, b) = (input::load(&whole).unwrap(), input::load(&kept.path).unwrap());
    assert!(a.kept_from.is_none() && b.kept_from.is_some_and(|t| t > 0));
    assert_eq!(counters(&a), counters(&b));
    // 2 threads × 600 rounds × 10 forgotten blocks, each ring's 500, the mapping.
    assert_eq!(a.books.live_blocks().count(), 12_000 + 1_000 + 1);
    assert_eq!(live(&a), live(&b));
    assert_eq!((a.end, a.last_time), (b.end, b.last_time));

    // The reports: every entry (kinds, bytes, blocks, backtraces, calls) the same.
    let (ra, mut rb) = (report(&whole), report(&kept.path));
    // Beside the traces, for a failure's diagnosis.
    std::fs::write(dir.join("a.json"), ra.to_string()).unwrap();
    std::fs::write(dir.join("b.json"), rb.to_string()).unwrap();
    assert_eq!(ra["kinds"], rb["kinds"]);
    assert_eq!(ra["stacks"], rb["stacks"]);
    let kept_from = rb["summary"].as_object_mut().unwrap().remove("kept_from_ns");
    assert_eq!(kept_from, b.kept_from.map(Value::from));
    assert_eq!(ra["summary"], rb["summary"]);
    assert_eq!(ra["kinds"]["definite"]["blocks"], 12_000, "{}", ra["kinds"]);

    // `--from` starts reading at the latest checkpoint before it, and
    // reports what the whole trace reports from then.
    // (Within 4 MiB: checkpoints 1 MiB apart, the file cut to 2 MiB after
    // the oldest it keeps: two or more in it.)
    let kept = cut(&whole, &dir.join("wide"), 4 << 20);
    let times = checkpoint_times(&kept.path);
    assert!(times.len() >= 2, "{times:?}");
    let from = format!("{}ns", times[1] + 1);
    assert_eq!(input::checkpoint_before(&kept.path, times[1] + 1).map(|(_, at)| at > 0), Some(true));
    let (mut fa, mut fb) = (report_with(&whole, &["--from", &from]), report_with(&kept.path, &["--from", &from]));
    for r in [&mut fa, &mut fb] {
        r["summary"].as_object_mut().unwrap().remove("kept_from_ns");
    }
    // Beside the traces, for a failure's diagnosis.
    std::fs::write(dir.join("fa.json"), fa.to_string()).unwrap();
    std::fs::write(dir.join("fb.json"), fb.to_string()).unwrap();
    assert_eq!(fa, fb);
    assert_eq!(fa["summary"]["from_ns"], times[1] + 1);
}

#[test]
fn a_trace_kept_for_an_age_holds_its_last_part_and_reports_what_the_whole_trace_does() {
    let dir = scratch("bounded_age");
    let prog = build("long_run.c", &dir.join("long_run"), &["-g", "-O0"]);
    // About 1.7 s (a millisecond's sleep in each of 1,500 rounds).
    let whole = whole_trace(&dir, &prog, &["1500"]);
    let age = 400_000_000;
    let kept = keep(&whole, &dir.join("age"), bounded::Bound { bytes: None, age_ns: Some(age) });
    assert!(kept.error.is_none() && kept.problems.is_empty(), "{kept:?}");
    let (a, b) = (input::load(&whole).unwrap(), input::load(&kept.path).unwrap());
    let (from, end) = (b.kept_from.unwrap(), b.last_time);
    eprintln!("{kept:?}: kept from {from} ns of {end}");
    // A checkpoint every 100 ms of the program's time (at the first place
    // for one after it: later when the machine is busy), each cutting the
    // file at the newest checkpoint at least 400 ms older than itself.
    assert!(kept.checkpoints >= 10, "{kept:?}");
    let times = checkpoint_times(&kept.path);
    let latest = *times.last().unwrap();
    assert_eq!(times[0], from);
    assert!(from + age <= latest && times.get(1).is_none_or(|&t| t + age > latest), "{times:?}");
    // So from 400 to 500 ms before the latest, and the latest some 100 ms
    // before the end (twice the age in all leaves room for a slow round:
    // 629 ms were kept once on a loaded machine).
    assert!(from + age <= end && from + age * 2 >= end, "kept from {from} ns of {end}");
    assert_eq!(counters(&a), counters(&b));
    assert_eq!(live(&a), live(&b));
    let (ra, mut rb) = (report(&whole), report(&kept.path));
    assert!(rb["summary"].as_object_mut().unwrap().remove("kept_from_ns").is_some());
    for k in ["summary", "kinds", "stacks", "errors"] {
        assert_eq!(ra[k], rb[k], "{k}");
    }
    assert_eq!(ra["kinds"]["definite"]["blocks"], 30_000, "{}", ra["kinds"]);

    // The option, from the command line: the run's last second or so.
    let (v, out) = run_json(&dir, &["--no-scan", "--max-trace-age", "1s"], &prog, &["2000"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = &v["summary"];
    let (from, end) = (s["kept_from_ns"].as_u64().unwrap(), s["duration_ns"].as_u64().unwrap());
    assert!(from + 1_000_000_000 <= end && from + 1_600_000_000 >= end, "{s}");
    assert_eq!(s["allocations"], 4_040_002, "{s}");
    run_refuses(&prog, "--max-trace-age", "500ms", "--max-trace-age 0.500s: at least 1s");
}

#[test]
fn attach_keeps_the_window_within_max_trace_size() {
    let dir = scratch("bounded_attach");
    let prog = build("long_run.c", &dir.join("long_run"), &["-g", "-O0"]);
    // About 3 s; attached from 0.2 s to its end.
    let mut child = Command::new(&prog).arg("2500").spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (saved, report) = (dir.join("saved.mtrace"), dir.join("report.json"));
    let out = Command::new(mtrace())
        .args(["attach", &child.id().to_string(), "--max-trace-size", "1M", "--json", "-o"])
        .arg(&report)
        .arg("--save")
        .arg(&saved)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(child.wait().unwrap().success());
    let len = std::fs::metadata(&saved).unwrap().len();
    assert!(len <= (1 << 20) + (256 << 10), "{len} bytes");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert!(v["summary"]["kept_from_ns"].as_u64().is_some_and(|t| t > 0), "{}", v["summary"]);
    // Every block `forget` allocated while attached is still live, in
    // each thread's entry: the books restated at each checkpoint.
    let forget: Vec<_> =
        v["stacks"].as_array().unwrap().iter().filter(|e| e["frames"][0]["function"] == "forget").collect();
    assert_eq!(forget.len(), 2, "{}", v["stacks"]);
    for e in forget {
        assert!(e["blocks"].as_u64().unwrap() > 10_000, "{e}");
        assert_eq!(e["blocks"], e["total_allocations"], "{e}");
    }
    let refused = Command::new(mtrace()).args(["attach", "1", "--max-trace-size", "1M", "-i"]).output().unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot be used with"), "{refused:?}");
}

#[test]
fn keep_bounds_the_trace_of_a_program_started_with_ld_preload() {
    let dir = scratch("bounded_keep");
    let prog = build("long_run.c", &dir.join("long_run"), &["-g", "-O0"]);
    let (sock, kd) = (dir.join("k.sock"), dir.join("kept"));
    std::fs::create_dir_all(&kd).unwrap();
    let listen = format!("unix:{}", sock.display());
    let mut keeper = spawn_until(
        Command::new(mtrace()).args(["keep", "--listen", &listen, "--max-trace-size", "1M", "--trace-dir"]).arg(&kd),
        "mtrace keep: listening on",
    );
    // A second keeper on the same socket is refused; the first goes on.
    let second = Command::new(mtrace()).args(["keep", "--listen", &listen, "--max-trace-age", "1m"]).output().unwrap();
    assert!(String::from_utf8_lossy(&second.stderr).contains("another process listens there"), "{second:?}");
    let st = Command::new(&prog)
        .arg("1500")
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", &listen)
        .env("MTRACE_SCAN", "1")
        .status()
        .unwrap();
    assert!(st.success());
    // The program's stream ends with it; SIGTERM stops the keeper.
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(keeper.id() as i32, libc::SIGTERM) };
    assert!(keeper.wait().unwrap().success());
    assert!(!sock.exists());
    let files: Vec<_> = std::fs::read_dir(&kd).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let len = std::fs::metadata(&files[0]).unwrap().len();
    assert!(len <= (1 << 20) + (256 << 10), "{len} bytes");
    let v = report(&files[0]);
    let s = &v["summary"];
    assert!(s["kept_from_ns"].as_u64().is_some_and(|t| t > 0), "{s}");
    assert_eq!(s["allocations"], 3_030_002, "{s}");
    assert_eq!(v["kinds"]["definite"]["blocks"], 30_000, "{}", v["kinds"]);
}

/// `mtrace run OPTION VALUE -- prog 1` fails, saying `message`.
fn run_refuses(prog: &std::path::Path, option: &str, value: &str, message: &str) {
    let bad = Command::new(mtrace()).args(["run", option, value, "--"]).arg(prog).arg("1").output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains(message), "{bad:?}");
}

/// The times of the checkpoints of the trace at `path`, in order.
fn checkpoint_times(path: &std::path::Path) -> Vec<u64> {
    let mut r = mtrace_format::Reader::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    r.header().unwrap();
    let mut times = vec![];
    while let Some(rec) = r.next_record().unwrap() {
        if let mtrace_format::Record::Checkpoint { time_ns, .. } = rec {
            times.push(time_ns);
        }
    }
    times
}

#[test]
fn run_keeps_each_trace_within_max_trace_size_and_reports_the_whole_run() {
    let dir = scratch("bounded_run");
    let prog = build("long_run.c", &dir.join("long_run"), &["-g", "-O0"]);
    let traces = dir.join("traces");
    let extra = ["--scan", "--max-trace-size", "1M", "--trace-dir", traces.to_str().unwrap()];
    let (v, out) = run_json(&dir, &extra, &prog, &["1500"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let files: Vec<_> = std::fs::read_dir(&traces).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let len = std::fs::metadata(&files[0]).unwrap().len();
    assert!(len <= (1 << 20) + (256 << 10), "{len} bytes");
    let s = &v["summary"];
    assert!(s["kept_from_ns"].as_u64().is_some_and(|t| t > 0), "{s}");
    // 2 threads × 1,500 rounds × (1,000 ring allocations + 10 forgotten),
    // the mapping and the second thread's stack.
    assert_eq!(s["allocations"], 3_030_002, "{s}");
    assert_eq!(s["realloc_frees"], 2 * 1_500 * 100 - 2 * 50, "{s}");
    assert_eq!(v["kinds"]["definite"]["blocks"], 30_000, "{}", v["kinds"]);
    assert_eq!(v["kinds"]["reachable"]["blocks"], 1_000, "{}", v["kinds"]);
    let forget = v["stacks"].as_array().unwrap().iter().filter(|e| e["frames"][0]["function"] == "forget");
    assert_eq!(forget.map(|e| e["blocks"].as_u64().unwrap()).sum::<u64>(), 30_000);

    run_refuses(&prog, "--max-trace-size", "60K", "--max-trace-size 61440: at least 64K");
}

#[test]
fn report_points_under_max_trace_size_are_written_by_mtrace() {
    let dir = scratch("bounded_points");
    let prog = build("steady.c", &dir.join("steady"), &["-g", "-O0"]);
    let m = markers("steady.c");
    // The program has no trace file for its own reports: mtrace, which
    // keeps its books, writes each .memlog, where the program would.
    let mut child = Command::new(mtrace())
        .current_dir(&dir)
        .args(["run", "--max-trace-size", "1M", "-o"])
        .arg(dir.join("report.txt"))
        .arg("--")
        .arg(&prog)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    // The program, mtrace's child.
    let parent = child.id().to_string();
    let logs = steady_memlogs(&mut out, &dir, || {
        let pid = Command::new("pgrep").args(["-P", &parent, "-x", "steady"]).output().unwrap();
        String::from_utf8_lossy(&pid.stdout).trim().parse().unwrap()
    });
    assert!(child.wait().unwrap().success());
    // As reports.rs's signal_reports_show_growth_and_frees, from the preload's own.
    assert_eq!(memlog_entries(&logs[0]), vec![(320, 5, m["kept"]), (1000, 10, m["steady"])]);
    assert_eq!(memlog_entries(&logs[1]), vec![(-320, -5, m["kept"]), (1000, 10, m["steady"])]);
    assert!(logs[1].contains("change:           since marker 1 until marker 2"), "{}", logs[1]);
    assert_eq!(memlog_entries(&logs[2]), vec![(1000, 10, m["steady"])]);
}

#[test]
fn a_client_keeps_what_it_receives_within_max_trace_size() {
    let dir = scratch("bounded_client");
    let prog = build("long_run.c", &dir.join("long_run"), &["-g", "-O0"]);
    let sock = format!("unix:{}", dir.join("s.sock").display());
    let mut server = Command::new(mtrace())
        .args(["server", "--quiet", "--wait", "--listen", &sock, "--"])
        .arg(&prog)
        .arg("1500")
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !dir.join("s.sock").exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let saved = dir.join("saved.mtrace");
    let out = Command::new(mtrace())
        .args(["client", &sock, "--max-trace-size", "1M", "--json", "-o"])
        .arg(dir.join("report.json"))
        .arg("--save")
        .arg(&saved)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(server.wait().unwrap().success());
    let len = std::fs::metadata(&saved).unwrap().len();
    assert!(len <= (1 << 20) + (256 << 10), "{len} bytes");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert!(v["summary"]["kept_from_ns"].as_u64().is_some_and(|t| t > 0), "{}", v["summary"]);
    assert_eq!(v["summary"]["allocations"], 3_030_002, "{}", v["summary"]);
    assert_eq!(v["kinds"]["definite"]["blocks"], 30_000, "{}", v["kinds"]);
}

#[test]
fn a_cut_trace_of_blocks_passed_between_threads_reports_what_the_whole_trace_does() {
    // Producers hand blocks to consumers that free them: at a checkpoint
    // the keeper's merge holds records of several threads, which the
    // checkpoint restates for a reader that starts there to merge again
    // (the cut file's own checkpoints held 1 to 153 such records in 4 runs
    // of 5, none in the fifth).
    let dir = scratch("bounded_queue");
    let prog = build("queue.c", &dir.join("queue"), &["-g", "-O0"]);
    let whole = whole_trace(&dir, &prog, &["leak", "400000"]);
    let kept = cut(&whole, &dir.join("cut"), 1 << 20);
    assert!(kept.checkpoints >= 3 && kept.dropped > 0 && kept.problems.is_empty(), "{kept:?}");
    let (ra, mut rb) = (report(&whole), report(&kept.path));
    // Beside the traces, for a failure's diagnosis.
    std::fs::write(dir.join("a.json"), ra.to_string()).unwrap();
    std::fs::write(dir.join("b.json"), rb.to_string()).unwrap();
    assert!(rb["summary"].as_object_mut().unwrap().remove("kept_from_ns").is_some());
    for k in ["summary", "kinds", "stacks", "errors"] {
        assert_eq!(ra[k], rb[k], "{k}");
    }
    assert_eq!(ra["errors"].as_array().map(Vec::len), Some(0));
}
