//! Programs that die of a signal: the leak scan still runs (from the
//! fatal-signal handler, or the program's own abort()), the trace is
//! complete even when two threads die at once, and `mtrace run` dies of
//! the program's signal. Against valgrind's memcheck on the same program.

mod common;
use common::*;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

/// memcheck's blocks of each kind for `prog args`: definitely,
/// indirectly, possibly lost, still reachable.
fn memcheck_blocks(dir: &std::path::Path, prog: &std::path::Path, args: &[&str]) -> [u64; 4] {
    memcheck(dir, &[], prog, args).map(|(_, blocks)| blocks)
}

fn kinds(r: &serde_json::Value) -> [(u64, u64); 4] {
    let k = &r["kinds"];
    ["definite", "indirect", "possible", "reachable"]
        .map(|n| (k[n]["bytes"].as_u64().unwrap_or(u64::MAX), k[n]["blocks"].as_u64().unwrap_or(u64::MAX)))
}

#[test]
fn a_program_that_dies_of_a_signal_gets_memchecks_kinds() {
    let dir = scratch("fatal-one");
    let prog = build("fatal.c", &dir.join("fatal"), &["-g", "-O0"]);
    let m = markers("fatal.c");
    // (mode, signal, ended by: the program's abort() flushes in its hook)
    for (mode, sig, ended_by) in
        [("assert", 6, "signal 6"), ("abort", 6, "abort"), ("segv", 11, "signal 11"), ("term", 15, "signal 15")]
    {
        let native = Command::new(&prog).arg(mode).output().unwrap();
        assert_eq!(native.status.signal(), Some(sig), "{mode} natively");
        assert_eq!(memcheck_blocks(&dir, &prog, &[mode]), [1, 0, 0, 1], "{mode}: valgrind");
        let (r, out) = run_json(&dir, &["--scan"], &prog, &[mode]);
        assert_eq!((out.status.code(), out.status.signal()), (None, Some(sig)), "{mode}: mtrace dies of it too");
        assert_eq!(out.stderr, native.stderr, "{mode}: the program's error output, nothing of ours");
        assert_eq!(r["summary"]["ended_by"], ended_by, "{mode}");
        assert_eq!(kinds(&r), [(200, 1), (0, 0), (0, 0), (100, 1)], "{mode}: {}", r["kinds"]);
        assert_eq!(leaks_in(&r, "fatal.c"), vec![leak(200, 1, "malloc", "leak", m["lost"])], "{mode}");
    }
    // The text says where the scan was taken.
    let out = Command::new(mtrace())
        .current_dir(&dir)
        .args(["run", "--scan", "-o", "r.txt", "--"])
        .arg(&prog)
        .arg("segv")
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(11));
    let text = std::fs::read_to_string(dir.join("r.txt")).unwrap();
    assert!(
        text.contains("\nLeak summary (memcheck's kinds, from the scan at the end (signal 11); 1 thread stopped, "),
        "{text}"
    );
}

#[test]
fn two_threads_that_die_at_once_leave_one_complete_trace() {
    // With the handler reset on its first call (SA_RESETHAND), the second
    // thread's signal ended the process in the middle of the first one's
    // flush: 3 traces of 8 had no end and some no events at all.
    let dir = scratch("fatal-two");
    let prog = build("fatal.c", &dir.join("fatal"), &["-g", "-O0", "-pthread"]);
    let m = markers("fatal.c");
    let runs = std::env::var("MTRACE_TEST_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    // valgrind sees the live threads' DTVs possibly lost, as we do.
    assert_eq!(memcheck_blocks(&dir, &prog, &["segvabort"]), [1, 0, 2, 1], "valgrind");
    // (mode, allocations: the two blocks of main, the threads' DTVs and
    // for double2 their 32-byte blocks)
    for (mode, allocations) in [("double2", 6), ("segvabort", 4)] {
        for run in 0..runs {
            let (r, out) = run_json(&dir, &["--scan"], &prog, &[mode]);
            let s = &r["summary"];
            let what = format!("{mode}, run {run}: {s}");
            let died = out.status.signal();
            assert!(died == Some(6) || (mode == "segvabort" && died == Some(11)), "{what}: {:?}", out.status);
            assert_eq!(s["truncated"], false, "{what}");
            let ended = s["ended_by"].as_str().unwrap();
            assert!(["signal 6", "signal 11", "abort"].contains(&ended), "{what}");
            assert_eq!(s["allocations"], allocations, "{what}");
            let [definite, indirect, possible, reachable] = kinds(&r);
            assert_eq!((definite, indirect), ((200, 1), (0, 0)), "{what}");
            // The two threads' DTVs are possibly lost (pointed into by
            // their TCBs), or reachable when a stopped thread's register
            // or stack held one's start at the scan's moment (1 run in
            // ~10 on a loaded machine): the kept block and two DTVs.
            let dtv = possible.0 / possible.1.max(1);
            assert_eq!(possible.1 + reachable.1, 3, "{what}");
            assert_eq!(reachable.0, 100 + dtv * (reachable.1 - 1), "{what}");
            assert!(possible.1 >= 1, "{what}");
            assert!(leaks_in(&r, "fatal.c").contains(&leak(200, 1, "malloc", "leak", m["lost"])), "{what}");
            if mode == "double2" {
                let e = &r["errors"][0];
                assert_eq!(e["kind"], "double_free", "{what}");
                assert!((1..=2).contains(&e["count"].as_u64().unwrap()), "{what}");
            }
        }
    }
}
