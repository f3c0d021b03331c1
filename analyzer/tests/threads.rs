//! Books across threads: blocks that change hands between threads are
//! matched exactly, whatever order the threads' events reach the trace in.

mod common;
use common::*;

/// Runs `prog args` under `mtrace run extra` `runs` times; the reports.
fn reports(name: &str, extra: &[&str], prog: &std::path::Path, args: &[&str], runs: usize) -> Vec<serde_json::Value> {
    let dir = scratch(name);
    (0..runs).map(|_| run_json(&dir, extra, prog, args).0).collect()
}

#[test]
fn blocks_swapped_with_a_thousand_threads_are_all_freed() {
    let dir = scratch("handoff-build");
    let prog = build("handoff.c", &dir.join("handoff"), &["-g", "-O0"]);
    for (run, r) in reports("handoff", &[], &prog, &[], 20).iter().enumerate() {
        let s = &r["summary"];
        assert_eq!(leaks_in(r, "handoff.c"), vec![], "run {run}: {s}");
        assert_eq!(s["unmatched_frees"], 0, "run {run}: {s}");
        assert_eq!(r["errors"], serde_json::json!([]), "run {run}: no wrong frees");
        // 2,000 blocks of the program, and the DTVs of the threads (glibc
        // keeps the last few with their cached stacks).
        let program = r["stacks"].as_array().unwrap().iter().filter(|e| line_in(e, "handoff.c").is_some());
        let dtvs: u64 = program
            .filter(|e| e["frames"][0]["module"].as_str().unwrap().starts_with("ld-linux"))
            .map(|e| e["blocks"].as_u64().unwrap())
            .sum();
        assert_eq!(s["leaked_blocks"].as_u64().unwrap(), dtvs, "run {run}: {s}");
        assert!(dtvs <= 8, "run {run}: {s}");
    }
}

#[test]
fn a_million_queue_operations_balance() {
    let dir = scratch("queue-build");
    let prog = build("queue.c", &dir.join("queue"), &["-g", "-O0"]);
    // With the frees' backtraces (-S): the consumers free what the
    // producers allocated, a million times, and none is a wrong free.
    for (run, r) in reports("queue", &["-S"], &prog, &[], 20).iter().enumerate() {
        let s = &r["summary"];
        assert_eq!(leaks_in(r, "queue.c"), vec![], "run {run}: {s}");
        assert_eq!(s["unmatched_frees"], 0, "run {run}: {s}");
        assert_eq!(r["errors"], serde_json::json!([]), "run {run}: no wrong frees");
        assert!(s["allocations"].as_u64().unwrap() >= 500_000, "run {run}: {s}");
    }
}

#[test]
fn blocks_kept_by_other_threads_are_the_leaks() {
    let dir = scratch("queue-leak-build");
    let prog = build("queue.c", &dir.join("queue"), &["-g", "-O0"]);
    let m = markers("queue.c");
    for (run, r) in reports("queue-leak", &[], &prog, &["leak"], 10).iter().enumerate() {
        assert_eq!(
            leaks_in(r, "queue.c"),
            vec![leak(1090, 10, "malloc", "producer", m["kept"]), leak(1554, 2, "malloc", "producer", m["producer"])],
            "run {run}"
        );
        assert_eq!(r["summary"]["unmatched_frees"], 0, "run {run}");
    }
}

#[test]
fn threads_nobody_saw_created_are_recorded_and_their_timer_goes_on() {
    // ctests/unseen_thread.c: a SIGEV_THREAD timer's notifications run on
    // threads glibc starts itself, while the process has no writer thread
    // yet. The program ends as natively (status 0: it died of the
    // timer's SIGRTMIN when the writer's start, made on glibc's timer
    // thread, put back that thread's signal mask with SIGRTMIN unblocked),
    // and its blocks are exact (valgrind: 512 bytes in 8 blocks
    // definitely lost).
    let dir = scratch("unseen-thread");
    let prog = build("unseen_thread.c", &dir.join("unseen_thread"), &["-g", "-O0"]);
    let m = markers("unseen_thread.c");
    for run in 0..10 {
        let (r, out) = run_json(&dir, &[], &prog, &[]);
        assert_eq!(out.status.code(), Some(0), "run {run}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(leaks_in(&r, "unseen_thread.c"), vec![leak(512, 8, "malloc", "notify", m["kept"])], "run {run}");
        assert_eq!(r["summary"]["unmatched_frees"], 0, "run {run}");
        assert_eq!(r["errors"], serde_json::json!([]), "run {run}");
    }
}
