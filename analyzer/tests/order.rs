//! One order for the books, however the program's threads are scheduled:
//! programs whose blocks change hands between threads, traced with the
//! preload's test-only perturbations (`MTRACE_TEST_ORDER`: a thread stalls
//! between its stamp and its push, the writer collects the threads'
//! buffers in another order), give exactly the blocks, frees and wrong
//! frees that happened. `MTRACE_TEST_RUNS` sets the runs per case (3 in
//! CI; the acceptance of the merge ran 100 and 50).

mod common;
use common::*;
use serde_json::Value;

/// The perturbations each case is traced with: none; stalls with the
/// exited threads' buffers last (the order that made the old books see
/// double frees); longer stalls in a new random order every round.
const PERTURBATIONS: [&str; 3] = ["", "stall=7:100,collect=exited-last", "stall=13:300,collect=shuffle"];

fn runs() -> usize {
    std::env::var("MTRACE_TEST_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3)
}

/// `mtrace run --json [extra] -- prog args` with `MTRACE_TEST_ORDER=order`.
fn run(dir: &std::path::Path, order: &str, extra: &[&str], prog: &std::path::Path, args: &[&str]) -> Value {
    run_json_env(dir, &[("MTRACE_TEST_ORDER", order)], extra, prog, args).0
}

/// A report with no wrong free, no free of an unknown block, and nothing
/// of `src` not freed.
fn assert_exact(r: &Value, src: &str, what: &str) {
    let s = &r["summary"];
    assert_eq!(leaks_in(r, src), vec![], "{what}: {s}");
    assert_eq!(s["unmatched_frees"], 0, "{what}: {s}");
    assert_eq!(r["errors"], serde_json::json!([]), "{what}: no wrong frees");
}

#[test]
fn short_lived_threads_in_batches_are_exact() {
    let dir = scratch("order-batches");
    let prog = build("batches.c", &dir.join("batches"), &["-g", "-O0"]);
    for at_once in ["2", "8", "64"] {
        for order in PERTURBATIONS {
            for i in 0..runs() {
                let r = run(&dir, order, &[], &prog, &[at_once]);
                assert_exact(&r, "batches.c", &format!("{at_once} at once, {order:?}, run {i}"));
                // 1,000 × (300 + 200 + 100 small) blocks, each freed.
                assert!(r["summary"]["allocations"].as_u64().unwrap() >= 102_000);
            }
        }
    }
}

/// Two processes that spin for as long as they live: the program's threads
/// share the machine's cores with them.
struct Hogs(Vec<std::process::Child>);

impl Hogs {
    fn start() -> Hogs {
        Hogs(
            (0..2)
                .map(|_| std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap())
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn exact_beside_two_cpu_hogs() {
    let dir = scratch("order-hogs");
    let batches = build("batches.c", &dir.join("batches"), &["-g", "-O0"]);
    let handoff = build("handoff.c", &dir.join("handoff"), &["-g", "-O0"]);
    let _hogs = Hogs::start();
    for order in PERTURBATIONS {
        for i in 0..runs() {
            let r = run(&dir, order, &[], &batches, &["8"]);
            assert_exact(&r, "batches.c", &format!("batches, {order:?}, run {i}"));
            let r = run(&dir, order, &[], &handoff, &[]);
            assert_exact(&r, "handoff.c", &format!("handoff, {order:?}, run {i}"));
        }
    }
}

#[test]
fn blocks_swapped_and_queued_between_threads_are_exact() {
    let dir = scratch("order-queue");
    let queue = build("queue.c", &dir.join("queue"), &["-g", "-O0"]);
    let handoff = build("handoff.c", &dir.join("handoff"), &["-g", "-O0"]);
    for order in PERTURBATIONS {
        for i in 0..runs() {
            // 50,000 blocks per producer, through a queue of 64.
            let r = run(&dir, order, &["-S"], &queue, &["", "50000"]);
            assert_exact(&r, "queue.c", &format!("queue, {order:?}, run {i}"));
            assert!(r["summary"]["allocations"].as_u64().unwrap() >= 100_000);
            let r = run(&dir, order, &[], &handoff, &[]);
            assert_exact(&r, "handoff.c", &format!("handoff, {order:?}, run {i}"));
        }
    }
}

#[test]
fn a_thread_asleep_with_a_half_full_buffer_holds_nothing_back() {
    let dir = scratch("order-sleeper");
    let prog = build("sleeper.c", &dir.join("sleeper"), &["-g", "-O0"]);
    // How long it sleeps, ms (MTRACE_TEST_SLEEP_MS; the 5 s is
    // too long for CI's runs).
    let ms = std::env::var("MTRACE_TEST_SLEEP_MS").unwrap_or_else(|_| "500".into());
    for order in PERTURBATIONS {
        for i in 0..runs() {
            let r = run(&dir, order, &[], &prog, &[&ms]);
            assert_exact(&r, "sleeper.c", &format!("{order:?}, run {i}"));
        }
    }
}

#[test]
fn blocks_kept_across_threads_are_exactly_the_leaks() {
    let dir = scratch("order-leak");
    let prog = build("batches.c", &dir.join("batches"), &["-g", "-O0"]);
    let m = markers("batches.c");
    for order in PERTURBATIONS {
        for i in 0..runs() {
            let r = run(&dir, order, &[], &prog, &["8", "leak"]);
            assert_eq!(
                leaks_in(&r, "batches.c"),
                vec![leak(2000, 10, "malloc", "work", m["returned"])],
                "{order:?}, run {i}"
            );
            assert_eq!(r["summary"]["unmatched_frees"], 0);
            assert_eq!(r["errors"], serde_json::json!([]));
        }
    }
}

#[test]
fn a_double_free_across_threads_is_exactly_one() {
    let dir = scratch("order-double");
    let prog = build("batches.c", &dir.join("batches"), &["-g", "-O0"]);
    let m = markers("batches.c");
    for order in PERTURBATIONS {
        for i in 0..runs() {
            let r = run(&dir, order, &["-S"], &prog, &["8", "double"]);
            let e = r["errors"].as_array().unwrap();
            assert_eq!(e.len(), 1, "{order:?}, run {i}: {e:?}");
            let e = &e[0];
            assert_eq!((e["kind"].as_str(), e["count"].as_u64()), (Some("double_free"), Some(1)), "{e}");
            // Where it was freed twice, and where it was allocated.
            let line = |frames: &str| line_in(&serde_json::json!({ "frames": e[frames] }), "batches.c");
            assert_eq!(line("free_frames"), Some(m["second_free"] as u64), "{e}");
            assert_eq!(line("first_free_frames"), Some(m["first_free"] as u64), "{e}");
            assert_eq!(line("alloc_frames"), Some(m["once"] as u64), "{e}");
            assert_eq!(r["summary"]["unmatched_frees"], 0);
        }
    }
}
