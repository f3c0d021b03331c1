//! The trace never lands in the program's files: programs that close every
//! descriptor, close a range, replace the trace's descriptor with a raw
//! system call, or run with a low descriptor limit.

mod common;
use common::*;
use std::path::Path;
use std::process::Command;

/// Every file `out/fNNNN` (0 ≤ N < 1000) holds exactly its own line.
fn files_exact(out: &Path) {
    for i in 0..1000 {
        let f = out.join(format!("f{i:04}"));
        let text = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(text, format!("file {i}\n").as_bytes(), "{}", f.display());
    }
}

/// The trace ended normally, with exactly the program's one leak (from
/// the line marked `@leak:NAME`).
fn trace_complete(trace: &Path, name: &str) {
    let r = report_json(trace);
    let s = &r["summary"];
    assert_eq!(s["ended_by"], "exit", "{s}");
    assert_eq!(s["truncated"], false, "{s}");
    let m = markers("fds.c");
    assert_eq!(leaks_in(&r, "fds.c"), vec![leak(4242, 1, "malloc", "main", m[name])]);
    assert_eq!(s["unmatched_frees"], 0, "{s}");
}

fn run_mode(mode: &str) {
    let dir = scratch(&format!("fds-{mode}"));
    let prog = build("fds.c", &dir.join("fds"), &["-g", "-O0"]);
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let trace = dir.join("t.mtrace");
    let st =
        Command::new(&prog).arg(mode).arg(&out).env("LD_PRELOAD", lib()).env("MTRACE_OUTPUT", &trace).status().unwrap();
    assert!(st.success(), "{mode}: {st}");
    files_exact(&out);
    trace_complete(&trace, if mode == "raw" { "raw" } else { "fds" });
}

#[test]
fn a_daemon_that_closes_every_descriptor() {
    run_mode("daemon");
}

#[test]
fn close_range_of_everything() {
    run_mode("range");
}

#[test]
fn the_trace_descriptor_replaced_by_a_raw_system_call() {
    run_mode("raw");
}

#[test]
fn a_shell_with_a_low_descriptor_limit_opens_fd_3() {
    let dir = scratch("fds-ulimit");
    let file = dir.join("file");
    let script = format!(
        "ulimit -n 64; exec env LD_PRELOAD={} MTRACE_FOLLOW_FORK=off MTRACE_OUTPUT={} sh -c '\
         exec 3>{}; i=0; while [ $i -lt 2000 ]; do echo \"line $i\" >&3; i=$((i+1)); done; exec 3>&-'",
        lib().display(),
        dir.join("t.mtrace").display(),
        file.display()
    );
    let st = Command::new("sh").arg("-c").arg(&script).status().unwrap();
    assert!(st.success());
    let want: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), want);
    let r = report_json(&dir.join("t.mtrace"));
    // The shell leaves through _exit: the End record says so.
    assert_eq!(r["summary"]["ended_by"], "_exit", "{}", r["summary"]);
}
