//! Real programs from the distribution: under mtrace their output and exit
//! status equal the untraced run, and the report has sane totals.

mod common;
use common::*;
use std::process::Command;

fn sane(r: &serde_json::Value) {
    let s = &r["summary"];
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    assert_eq!(s["truncated"], false, "{s}");
    assert_eq!(s["ended_by"], "exit", "{s}");
    assert!(n("allocations") >= n("frees"), "{s}");
    assert!(n("peak_bytes") >= n("leaked_bytes") && n("bytes_allocated") >= n("peak_bytes"), "{s}");
    let by_stack: u64 = r["stacks"].as_array().unwrap().iter().map(|e| e["bytes"].as_u64().unwrap()).sum();
    assert_eq!(by_stack, n("leaked_bytes"));
    // Every backtrace has frames, and some resolve to a function (in a
    // stripped program, at least libc's that start it).
    let stacks = r["stacks"].as_array().unwrap();
    assert!(stacks.iter().all(|e| !e["frames"].as_array().unwrap().is_empty()));
    let named = |e: &serde_json::Value| e["frames"].as_array().unwrap().iter().any(|f| f["function"].is_string());
    assert!(stacks.is_empty() || stacks.iter().any(named), "{stacks:?}");
}

#[test]
fn python3_sorting_dicts() {
    let dir = scratch("python3");
    let script = "import json,sys\nd=[{'k': i, 'v': str(i)} for i in range(50000)]\nd.sort(key=lambda x: -x['k'])\nprint(len(json.dumps(d)), d[0]['v'])\nsys.exit(3)";
    // PYTHONMALLOC=malloc: every object through malloc, not pymalloc's arenas.
    let native = Command::new("python3").args(["-c", script]).env("PYTHONMALLOC", "malloc").output().unwrap();
    let (r, traced) = run_json_env(&dir, &[("PYTHONMALLOC", "malloc")], &[], "python3".as_ref(), &["-c", script]);
    assert_eq!(traced.stdout, native.stdout);
    assert_eq!(traced.status.code(), Some(3));
    assert_eq!(native.status.code(), Some(3));
    sane(&r);
    let s = &r["summary"];
    // 50,000 dicts and their strings: more than 100,000 allocation calls.
    assert!(s["allocations"].as_u64().unwrap() > 100_000, "{s}");
}

#[test]
fn gcc_compile_with_child_processes() {
    let dir = scratch("gcc");
    let src = ctests_dir().join("families.c");
    let native_o = dir.join("native.o");
    let traced_o = dir.join("traced.o");
    let native = Command::new("gcc").args(["-O2", "-c"]).arg(&src).arg("-o").arg(&native_o).output().unwrap();
    assert!(native.status.success());
    let tdir = dir.join("traces");
    let (r, traced) = run_json(
        &dir,
        &["--trace-dir", tdir.to_str().unwrap()],
        "gcc".as_ref(),
        &["-O2", "-c", src.to_str().unwrap(), "-o", traced_o.to_str().unwrap()],
    );
    assert!(traced.status.success(), "{}", String::from_utf8_lossy(&traced.stderr));
    assert_eq!(traced.stdout, native.stdout);
    assert_eq!(std::fs::read(&traced_o).unwrap(), std::fs::read(&native_o).unwrap(), "same object file");
    sane(&r);
    // The driver runs cc1 and as, each traced into its own file.
    let all = traces(&tdir);
    let exes: Vec<String> =
        all.iter().map(|(_, t)| t["program"].as_str().unwrap().rsplit('/').next().unwrap().to_owned()).collect();
    assert!(exes.iter().any(|e| e == "cc1") && exes.iter().any(|e| e.ends_with("as")), "{exes:?}");
    for (p, t) in &all {
        assert_eq!(t["summary"]["truncated"], false, "{}", p.display());
    }
}

#[test]
fn nm_of_libstdcxx_has_no_frees_from_before_tracing() {
    // nm is C++: its first `operator new` resolves libstdc++'s with dlsym,
    // which allocates; those blocks must be found by their frees.
    let lib = Command::new("g++").arg("-print-file-name=libstdc++.so.6").output().unwrap();
    let lib = String::from_utf8_lossy(&lib.stdout).trim().to_owned();
    let dir = scratch("nm");
    let native = Command::new("nm").args(["-D", &lib]).output().unwrap();
    let (r, traced) = run_json(&dir, &[], "nm".as_ref(), &["-D", &lib]);
    assert_eq!(traced.stdout, native.stdout);
    sane(&r);
    assert_eq!(r["summary"]["unmatched_frees"], 0, "{}", r["summary"]);
}

/// memcheck's (bytes, blocks) of each leak kind for `prog args`.
fn memcheck3(dir: &std::path::Path, env: &[(&str, &str)], prog: &str, args: &[&str]) -> [(u64, u64); 3] {
    let [d, i, p, _] = memcheck(dir, env, prog.as_ref(), args);
    [d, i, p]
}

/// Threaded programs from the distribution hand blocks between threads:
/// no wrong free, no free of an unknown block, and the blocks lost
/// (definitely and indirectly) are memcheck's, run after run.
#[test]
fn threaded_programs_have_no_wrong_frees() {
    let dir = scratch("threaded");
    let data = dir.join("data.txt");
    let mut text = String::new();
    for i in 0..60_000u64 {
        text.push_str(&format!(
            "{:08} {}\n",
            i.wrapping_mul(2_654_435_761) % 100_000_000,
            "x".repeat((i % 40) as usize)
        ));
    }
    std::fs::write(&data, text).unwrap();
    let data = data.to_str().unwrap();
    let queue = "import threading, queue, json\nq = queue.Queue(64)\nout = []\n\
        def p():\n    for i in range(5000): q.put({'i': i, 's': str(i) * 3})\n    q.put(None)\n\
        def c():\n    while (x := q.get()) is not None: out.append(json.dumps(x))\n\
        ts = [threading.Thread(target=f) for f in (p, c)]\n[t.start() for t in ts]\n[t.join() for t in ts]\nprint(len(out))";
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(&str, Vec<&str>, Env); 3] = [
        // Blocks of 64 KiB: the two threads compress some each.
        ("xz", vec!["-T2", "-1", "--block-size=65536", "-c", data], &[]),
        ("sort", vec!["--parallel=2", "-S", "1M", data], &[]),
        // The distribution's python3: valgrind follows no wrapper script.
        ("/usr/bin/python3", vec!["-c", queue], &[("PYTHONMALLOC", "malloc")]),
    ];
    for (prog, args, env) in &cases {
        let theirs = memcheck3(&dir, env, prog, args);
        for run in 0..2 {
            let (r, out) = run_json_env(&dir, env, &["--scan"], prog.as_ref(), args);
            assert!(out.status.success(), "{prog}: {}", String::from_utf8_lossy(&out.stderr));
            let s = &r["summary"];
            assert_eq!(r["errors"], serde_json::json!([]), "{prog}, run {run}");
            assert_eq!(s["unmatched_frees"], 0, "{prog}, run {run}: {s}");
            let k = &r["kinds"];
            let ours = |kind: &str| (k[kind]["bytes"].as_u64().unwrap(), k[kind]["blocks"].as_u64().unwrap());
            assert_eq!([ours("definite"), ours("indirect")], theirs[..2], "{prog}, run {run}: {k}");
        }
    }
}
