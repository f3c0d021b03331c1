//! Process lifetime: fork, exec, dlopen/dlclose, and every way a process
//! ends. The trace must be complete and the program's exit status unchanged.

mod common;
use common::*;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

#[test]
fn fork_child_gets_its_own_trace() {
    let dir = scratch("fork");
    let prog = build("fork.c", &dir.join("fork"), &["-g", "-O0"]);
    let m = markers("fork.c");
    let tdir = dir.join("traces");
    let (r, out) = run_json(&dir, &["--trace-dir", tdir.to_str().unwrap()], &prog, &[]);
    assert!(out.status.success());
    let mut want =
        vec![leak(401, 1, "malloc", "main", m["before_fork"]), leak(403, 1, "malloc", "main", m["after_fork"])];
    want.sort();
    assert_eq!(leaks_in(&r, "fork.c"), want);
    let traces = traces(&tdir);
    assert_eq!(traces.len(), 2, "{traces:?}");
    let child = traces.iter().map(|(_, r)| r).find(|t| t["pid"] != r["pid"]).unwrap();
    assert_eq!(child["ppid"], r["pid"]);
    assert_eq!(leaks_in(child, "fork.c"), vec![leak(402, 1, "malloc", "main", m["in_child"])]);
    // The child freed a block its parent allocated before the fork.
    assert_eq!(child["summary"]["unmatched_frees"], 1);
    // Not an invalid free: the child's trace begins with the parent's heap.
    assert_eq!(child["errors"], serde_json::json!([]));
    assert_eq!(child["summary"]["ended_by"], "exit");
}

#[test]
fn exec_writes_one_trace_per_image() {
    let dir = scratch("exec");
    let prog = build("exec.c", &dir.join("exec"), &["-g", "-O0"]);
    let m = markers("exec.c");
    let tdir = dir.join("traces");
    let (r, out) = run_json(&dir, &["--trace-dir", tdir.to_str().unwrap()], &prog, &[]);
    assert_eq!(out.status.code(), Some(7), "exit status is the program's");
    // The report is of the last image of the main process.
    assert_eq!(leaks_in(&r, "exec.c"), vec![leak(502, 1, "malloc", "main", m["after_exec"])]);
    let traces = traces(&tdir);
    assert_eq!(traces.len(), 2);
    assert_eq!(traces[0].1["pid"], traces[1].1["pid"], "exec keeps the pid");
    let first = traces
        .iter()
        .map(|(_, r)| r)
        .find(|t| t["summary"]["ended_by"] == "exec")
        .expect("the first image ends with exec");
    assert_eq!(leaks_in(first, "exec.c"), vec![leak(501, 1, "malloc", "main", m["before_exec"])]);
    assert_eq!(first["summary"]["truncated"], false);
}

#[test]
fn dlclosed_library_still_symbolizes() {
    let dir = scratch("dlopen");
    let so = build_lib("dlleak.c", &dir.join("libdlleak.so"));
    let prog = build("dlopen.c", &dir.join("dlopen"), &["-g", "-O0"]);
    let (r, out) = run_json(&dir, &[], &prog, &[so.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lib_marks = markers("dlleak.c");
    assert_eq!(leaks_in(&r, "dlleak.c"), vec![leak(601, 1, "malloc", "dl_leak", lib_marks["in_library"])]);
    let e = r["stacks"].as_array().unwrap().iter().find(|e| e["bytes"] == 601).unwrap();
    assert_eq!(e["frames"][0]["module"], "libdlleak.so");
    assert_eq!(e["frames"][1]["function"], "main");
    assert_eq!(e["frames"][1]["line"], markers("dlopen.c")["dl_caller"]);
}

/// Runs `exits HOW` natively and under mtrace; returns (native status,
/// traced status, report).
fn ending(how: &str) -> (std::process::ExitStatus, std::process::ExitStatus, serde_json::Value) {
    let dir = scratch(&format!("exits-{how}"));
    let prog = build("exits.c", &dir.join("exits"), &["-g", "-O0"]);
    let native = Command::new(&prog).arg(how).status().unwrap();
    let (r, out) = run_json(&dir, &[], &prog, &[how]);
    assert_eq!(
        leaks_in(&r, "exits.c"),
        vec![leak(701, 1, "malloc", "main", markers("exits.c")["before_end"])],
        "{how}"
    );
    (native, out.status, r)
}

fn shell_status(s: std::process::ExitStatus) -> i32 {
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap())
}

#[test]
fn every_way_to_end_leaves_a_complete_trace() {
    // (how, ended by, exit status, allocations: 10,000 malloc/free pairs,
    // the leak, and for "thread" the loader's TLS block of the new thread)
    for (how, ended_by, status, allocations) in [
        ("return", "exit", 0, 10_001),
        ("_exit", "_exit", 3, 10_001),
        ("thread", "exit", 5, 10_002),
        ("abort", "signal 6", 128 + 6, 10_001),
        ("segv", "signal 11", 128 + 11, 10_001),
    ] {
        let (native, traced, r) = ending(how);
        assert_eq!(shell_status(native), status, "{how} natively");
        assert_eq!(shell_status(traced), status, "{how} under mtrace");
        assert_eq!(traced.signal(), native.signal(), "{how}: mtrace dies of the program's signal");
        let s = &r["summary"];
        assert_eq!(s["truncated"], false, "{how}");
        // abort() called through the PLT flushes first ("abort"); when the
        // call is internal to libc only the signal handler sees it.
        let got = s["ended_by"].as_str().unwrap();
        assert!(got == ended_by || (how == "abort" && got == "abort"), "{how}: ended by {got}");
        // None lost in a buffer.
        assert_eq!(s["allocations"], allocations, "{how}");
        assert_eq!(s["frees"], 10_000, "{how}");
    }
}

#[test]
fn sigkill_leaves_a_readable_trace_marked_truncated() {
    let dir = scratch("exits-kill");
    let prog = build("exits.c", &dir.join("exits"), &["-g", "-O0"]);
    let (r, out) = run_json(&dir, &[], &prog, &["kill"]);
    assert_eq!(out.status.signal(), Some(9), "mtrace dies of the program's signal");
    assert_eq!(r["summary"]["truncated"], true);
    assert!(r["summary"]["ended_by"].is_null());
}

#[test]
fn plain_ld_preload_writes_the_default_file() {
    let dir = scratch("preload");
    let prog = build("realloc.c", &dir.join("realloc"), &["-g", "-O0"]);
    let child =
        Command::new(&prog).current_dir(&dir).env("LD_PRELOAD", lib()).env_remove("MTRACE_OUTPUT").spawn().unwrap();
    let pid = child.id();
    assert!(child.wait_with_output().unwrap().status.success());
    let trace = dir.join(format!("realloc.{pid}.mtrace"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&trace).expect("default trace name").permissions().mode() & 0o777, 0o600);
    let r = report_json(&trace);
    assert_eq!(r["summary"]["leaked_bytes"], 70);
}

#[test]
fn bad_environment_values_warn_once_and_fall_back() {
    let dir = scratch("badenv");
    let prog = build("nofp.c", &dir.join("nofp"), &["-g", "-O0"]);
    let out = Command::new(&prog)
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", dir.join("t.%p.mtrace"))
        .env("MTRACE_DEPTH", "lots")
        .env("MTRACE_START", "maybe")
        .env("MTRACE_REPORT_SIGNAL", "SIGNOPE")
        .env("MTRACE_UNWINDER", "guess")
        .env("MTRACE_CLOCK", "sundial")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // One warning per variable, each naming it and the default used.
    assert_eq!(err.lines().count(), 5, "{err}");
    assert!(err.contains("MTRACE_DEPTH=\"lots\"") && err.contains("using 64"), "{err}");
    assert!(err.contains("MTRACE_START=\"maybe\"") && err.contains("using on"), "{err}");
    assert!(err.contains("MTRACE_REPORT_SIGNAL=\"SIGNOPE\"") && err.contains("using USR1"), "{err}");
    assert!(err.contains("MTRACE_UNWINDER=\"guess\"") && err.contains("using fast"), "{err}");
    assert!(err.contains("MTRACE_CLOCK=\"sundial\"") && err.contains("using tsc"), "{err}");
    let t = traces(&dir);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].1["summary"]["leaked_bytes"], 803);
}

#[test]
fn follow_fork_and_follow_exec_off() {
    let dir = scratch("nofollow");
    let fork = build("fork.c", &dir.join("fork"), &["-g", "-O0"]);
    let exec = build("exec.c", &dir.join("exec"), &["-g", "-O0"]);
    let m = markers("fork.c");
    let t1 = dir.join("t1");
    let (r, out) =
        run_json_env(&dir, &[("MTRACE_FOLLOW_FORK", "off")], &["--trace-dir", t1.to_str().unwrap()], &fork, &[]);
    assert!(out.status.success());
    assert_eq!(traces(&t1).len(), 1, "the child is not traced");
    let mut want =
        vec![leak(401, 1, "malloc", "main", m["before_fork"]), leak(403, 1, "malloc", "main", m["after_fork"])];
    want.sort();
    assert_eq!(leaks_in(&r, "fork.c"), want);

    let t2 = dir.join("t2");
    let (r, out) =
        run_json_env(&dir, &[("MTRACE_FOLLOW_EXEC", "off")], &["--trace-dir", t2.to_str().unwrap()], &exec, &[]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(traces(&t2).len(), 1, "the new image is not traced");
    assert_eq!(r["summary"]["ended_by"], "exec");
    assert_eq!(leaks_in(&r, "exec.c"), vec![leak(501, 1, "malloc", "main", markers("exec.c")["before_exec"])]);
}

#[test]
fn signals_sent_to_mtrace_run_go_to_the_program() {
    let dir = scratch("run-signals");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP"), (libc::SIGINT, "SIGINT")] {
        let report = dir.join(format!("{name}.json"));
        let mut c = std::process::Command::new(mtrace())
            .args(["run", "--no-scan", "--json", "-o"])
            .arg(&report)
            .arg("--")
            .arg(&prog)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Held open until the end (Child::wait would close it: end of input).
        let _stdin = c.stdin.take();
        let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line, "ready\n");
        // SAFETY: kill with our child's pid.
        unsafe { libc::kill(c.id() as i32, sig) };
        let st = c.wait().unwrap();
        // The program died of the signal; mtrace reported and died of it too.
        assert_eq!((st.code(), st.signal()), (None, Some(sig)), "{name}");
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        // `run -o` makes its report as `report -o` does: private.
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&report).unwrap().permissions()) & 0o777,
            0o600,
            "{name}"
        );
        let m = markers("attach_target.c");
        assert_eq!(leaks_in(&r, "attach_target.c"), vec![leak(1000, 1, "malloc", "main", m["before"])], "{name}");
    }
}

#[test]
fn outputs_that_are_not_regular_files() {
    let dir = scratch("outputs");
    let run = |out: &std::path::Path| {
        Command::new("/bin/true").env("LD_PRELOAD", lib()).env("MTRACE_OUTPUT", out).output().unwrap()
    };
    // A folder: one warning, no trace, the program unchanged.
    let o = run(&dir);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("it is a folder; not tracing"), "{err}");
    assert!(!dir.with_extension("1").exists());
    // The null device: written to, silently; no /dev/null.1.
    let o = run(std::path::Path::new("/dev/null"));
    assert!(o.status.success() && o.stderr.is_empty(), "{o:?}");
    assert!(!std::path::Path::new("/dev/null.1").exists());
    // Another device: refused.
    let o = run(std::path::Path::new("/dev/zero"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("neither a regular file"), "{o:?}");
    // A name and all its numbered variants taken: said so (the warning
    // said "Success" before).
    let taken = dir.join("t.mtrace");
    std::fs::write(&taken, "").unwrap();
    for i in 1..1000 {
        std::fs::write(taken.with_extension(format!("mtrace.{i}")), "").unwrap();
    }
    let o = run(&taken);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success());
    assert!(
        err.contains(".mtrace.1 to ") && err.contains(".mtrace.999 exist (name each process's trace with %p)"),
        "{err}"
    );
}

#[test]
fn a_bad_setting_is_warned_about_once_per_run() {
    let dir = scratch("warn-once");
    let out = Command::new(mtrace())
        .current_dir(&dir)
        .env("MTRACE_DEPTH", "abc")
        .args(["run", "-o", "/dev/null", "--", "sh", "-c", "ls / >/dev/null; cat /dev/null; sh -c true"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("MTRACE_DEPTH=\"abc\"").count(), 1, "{err}");
    // The run's own option is checked before the program starts.
    let out = Command::new(mtrace()).args(["run", "-d", "0", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("-d 0: the depth must be 1 to 256"));
}

#[test]
fn the_preload_interposes_on_every_function_of_the_shared_table() {
    // mtrace_format::functions::INTERPOSED is what both producers follow:
    // libmtrace.so exports a hook for each (the ptrace tracer looks them
    // up by the same names).
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(lib()).output().expect("nm (binutils)");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let exported: std::collections::HashSet<&str> =
        text.lines().filter_map(|l| l.split_whitespace().nth(2)).map(|n| n.split('@').next().unwrap_or(n)).collect();
    let missing: Vec<&str> =
        mtrace_format::functions::INTERPOSED.iter().map(|&(n, _)| n).filter(|n| !exported.contains(n)).collect();
    assert_eq!(missing, Vec::<&str>::new());
    assert!(mtrace_format::functions::INTERPOSED.len() >= 35);
    // Allocators' own entry points: a hook each, under a name of its own,
    // and never the entry point's name (a program probing for `mallocx`
    // must find only the real allocator's).
    let entry = mtrace_format::functions::ENTRY_POINTS.iter().map(|&(n, _)| n);
    let missing: Vec<&str> = entry.clone().filter(|n| !exported.contains(format!("mtrace_ep_{n}").as_str())).collect();
    assert_eq!(missing, Vec::<&str>::new());
    let taken: Vec<&str> = entry.clone().filter(|n| exported.contains(n)).collect();
    assert_eq!(taken, Vec::<&str>::new());
    // And no hook without its row (a hook written beside the table would
    // never be redirected to).
    let rows: std::collections::HashSet<&str> = entry.collect();
    let mut stray: Vec<&str> =
        exported.iter().filter_map(|n| n.strip_prefix("mtrace_ep_")).filter(|n| !rows.contains(n)).collect();
    stray.sort_unstable();
    assert_eq!(stray, Vec::<&str>::new());
    assert!(rows.len() >= 50, "{}", rows.len());
}

/// (steps done when main returned, last step written) of a run of
/// ctests/exit_busy.c's output.
fn exit_steps(out: &[u8]) -> (u32, u32) {
    let text = String::from_utf8_lossy(out);
    let at = text.lines().find_map(|l| l.strip_prefix("exit at step ")).expect("its exit line").parse().unwrap();
    let last = text.lines().filter_map(|l| l.strip_prefix("step ")).filter_map(|n| n.parse().ok()).max().unwrap_or(0);
    (at, last)
}

#[test]
fn threads_make_no_progress_while_the_exit_is_traced() {
    let dir = scratch("process-exit-busy");
    let prog = build("exit_busy.c", &dir.join("exit_busy"), &["-g", "-O0", "-pthread"]);
    // Natively the process ends within the step its thread was in, or
    // a step or two later on a loaded machine (under CI: "exit at step 0",
    // then "step 2"): SLACK steps. Before the end of exit held the
    // threads, a traced run made all 50.
    const SLACK: u32 = 3;
    let native = Command::new(&prog).output().unwrap();
    let (at, last) = exit_steps(&native.stdout);
    assert!(last <= at + SLACK, "natively: {}", String::from_utf8_lossy(&native.stdout));
    for (extra, runs) in [(&["--scan"][..], 5), (&["--no-scan"][..], 3)] {
        for _ in 0..runs {
            let out = Command::new(mtrace())
                .current_dir(&dir)
                .args(["run"])
                .args(extra)
                .arg("--")
                .arg(&prog)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
            // The thread held from the end of exit on: before, it made all
            // its 50 steps while mtrace scanned and wrote the trace's end.
            let (at, last) = exit_steps(&out.stdout);
            assert!(last <= at + SLACK, "{extra:?}: exit at step {at}, then step {last}");
            let report = String::from_utf8_lossy(&out.stderr);
            assert!(report.contains("ended by:         exit, status 0"), "{report}");
        }
    }
}
