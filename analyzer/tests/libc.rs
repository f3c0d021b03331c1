//! What the C library keeps is not the program's leak: glibc frees it at
//! exit (`__libc_freeres`, as valgrind has it do), and the stacks of
//! threads that ended are no roots. Each case against valgrind's memcheck
//! on the same program.

mod common;
use common::*;
use std::process::Command;

/// memcheck's (bytes, blocks) definitely, indirectly, possibly lost.
fn memcheck3(dir: &std::path::Path, prog: &std::path::Path, args: &[&str]) -> [(u64, u64); 3] {
    let [d, i, p, _] = memcheck(dir, &[], prog, args);
    [d, i, p]
}

/// mtrace's (bytes, blocks) of the same kinds.
fn kinds(r: &serde_json::Value) -> [(u64, u64); 3] {
    let k = &r["kinds"];
    ["definite", "indirect", "possible"].map(|n| (k[n]["bytes"].as_u64().unwrap(), k[n]["blocks"].as_u64().unwrap()))
}

#[test]
fn blocks_lost_through_threads_that_ended_are_found() {
    let dir = scratch("libc-threads");
    let prog = build("thread_leaks.c", &dir.join("thread_leaks"), &["-g", "-O0"]);
    let m = markers("thread_leaks.c");
    let runs = std::env::var("MTRACE_TEST_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    for (mode, leak_line, want) in [
        ("arg", "arg", (3200, 100)),
        ("ret", "ret", (4000, 100)),
        ("detached", "detached", (2400, 100)),
        ("tsd", "tsd", (1337, 1)),
        ("none", "", (0, 0)),
    ] {
        let theirs = memcheck3(&dir, &prog, &[mode]);
        assert_eq!(theirs, [want, (0, 0), (0, 0)], "{mode}: valgrind");
        for run in 0..runs {
            let (r, _) = run_json(&dir, &["--scan"], &prog, &[mode]);
            assert_eq!(kinds(&r), theirs, "{mode}, run {run}: {}", r["kinds"]);
            // Block by block: all at the allocation the mode leaks from.
            let lost: Vec<Leak> = leaks_in(&r, "thread_leaks.c");
            if want.1 > 0 {
                assert_eq!(lost.len(), 1, "{mode}: {lost:?}");
                assert_eq!((lost[0].bytes as u64, lost[0].blocks as u64, lost[0].line), (want.0, want.1, m[leak_line]));
            } else {
                assert_eq!(lost, vec![], "{mode}");
            }
        }
    }
}

#[test]
fn without_freeres_glibcs_blocks_stay() {
    // --run-libc-freeres=no: glibc's blocks are still there (the DTV of a
    // thread whose stack glibc caches, pointed into from its descriptor;
    // the loader's tables for the dlopen'd library): possibly lost, as
    // before; the leaks through dead stacks are still found, the stacks
    // being no roots.
    let dir = scratch("libc-no-freeres");
    let prog = build("thread_leaks.c", &dir.join("thread_leaks"), &["-g", "-O0"]);
    let (r, _) = run_json(&dir, &["--scan", "--run-libc-freeres=no"], &prog, &["none"]);
    let [definite, indirect, possible] = kinds(&r);
    assert_eq!((definite, indirect), ((0, 0), (0, 0)), "{}", r["kinds"]);
    assert!(possible.1 >= 1, "{}", r["kinds"]);
    let (r, _) = run_json(&dir, &["--scan", "--run-libc-freeres=no"], &prog, &["detached"]);
    assert_eq!(kinds(&r)[0], (2400, 100), "{}", r["kinds"]);
    // A value that is neither yes nor no: one line, before the program runs.
    let out = Command::new(mtrace()).args(["run", "--run-libc-freeres=maybe", "--"]).arg(&prog).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"maybe\" is neither yes nor no"));
}

#[test]
fn python3_importing_modules_that_dlopen_leaks_nothing() {
    // The loader's tables for dlopen'd modules (_dl_find_object's) were
    // 4,608 bytes in 2 blocks "possibly lost" before glibc freed them.
    // Debian's python3, and the one first on PATH if it is another (pyenv's).
    let mut pythons: Vec<String> = Vec::new();
    for p in ["/usr/bin/python3", "python3"] {
        let exe = Command::new(p).args(["-c", "import sys; print(sys.executable)"]).output();
        if let Some(o) = exe.ok().filter(|o| o.status.success()) {
            let exe = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            if !pythons.contains(&exe) {
                pythons.push(exe);
            }
        }
    }
    assert!(!pythons.is_empty(), "no python3");
    let dir = scratch("libc-python3");
    let runs = std::env::var("MTRACE_TEST_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    for python in &pythons {
        for run in 0..runs {
            let (r, out) =
                run_json(&dir, &["--scan"], python.as_ref(), &["-c", "import ctypes, json, ssl, decimal; print(1)"]);
            assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(kinds(&r), [(0, 0); 3], "{python}, run {run}: {}", r["kinds"]);
        }
    }
}

#[test]
fn the_program_keeps_all_its_pthread_keys() {
    // The preload's thread-exit hook takes no pthread key: a program that
    // takes every key (PTHREAD_KEYS_MAX) in a traced thread gets them all.
    let dir = scratch("libc-keys");
    let prog = build("keys.c", &dir.join("keys"), &["-g", "-O0"]);
    let native = Command::new(&prog).output().unwrap();
    let (r, out) = run_json(&dir, &[], &prog, &[]);
    assert_eq!(String::from_utf8_lossy(&native.stdout), String::from_utf8_lossy(&out.stdout));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1024 of 1024 keys\n");
    // The thread's events reached the books (its state ended by the TLS
    // destructor, not lost): its 16 bytes, the thread's DTV and stdout's
    // buffer, allocated and freed.
    let s = &r["summary"];
    assert_eq!(
        (s["allocations"].as_u64(), s["frees"].as_u64(), s["leaked_bytes"].as_u64()),
        (Some(3), Some(3), Some(0)),
        "{s}"
    );
}

#[test]
fn glibc_frees_after_every_librarys_destructor() {
    // A library the program links has a destructor that runs after the
    // program's (and after libmtrace.so's own): it reads the environment,
    // prints and frees. freeres runs after it, as under valgrind.
    let dir = scratch("libc-exit-order");
    let src = ctests_dir().join("exit_order.c");
    let lib = dir.join("libexit_order.so");
    let cc = |args: &[&std::ffi::OsStr]| {
        let st = Command::new("cc").args(["-g", "-O0"]).args(args).status().unwrap();
        assert!(st.success());
    };
    cc(&["-DLIB".as_ref(), "-shared".as_ref(), "-fPIC".as_ref(), "-o".as_ref(), lib.as_os_str(), src.as_os_str()]);
    let prog = dir.join("exit_order");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let libdir = format!("-L{}", dir.display());
    cc(&["-o".as_ref(), prog.as_os_str(), src.as_os_str(), libdir.as_ref(), "-lexit_order".as_ref(), rpath.as_ref()]);
    let native = Command::new(&prog).env("EXIT_ORDER", "set").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&native.stdout), "main returns\nlibrary destructor: EXIT_ORDER=set\n");
    let (r, out) = run_json_env(&dir, &[("EXIT_ORDER", "set")], &["--scan"], &prog, &[]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&native.stdout));
    // The destructor's free is in the books, before the end.
    assert_eq!(r["summary"]["leaked_blocks"], 0, "{}", r["summary"]);
    assert_eq!(kinds(&r), [(0, 0); 3], "{}", r["kinds"]);
}

#[test]
fn a_cxx_program_keeps_only_libstdcxxs_exception_pool() {
    // glibc's blocks are freed; libstdc++'s emergency exception pool stays
    // (72,704 bytes, still reachable: its __freeres is not called, see
    // preload/src/platform/real.rs). The lost blocks are memcheck's.
    let dir = scratch("libc-cxx");
    let prog = build("cxx.cpp", &dir.join("cxx"), &["-g", "-O0"]);
    let (r, _) = run_json(&dir, &["--scan"], &prog, &[]);
    assert_eq!(r["kinds"]["reachable"]["bytes"], 72_704, "{}", r["kinds"]);
    assert_eq!(r["kinds"]["reachable"]["blocks"], 1, "{}", r["kinds"]);
    assert_eq!(kinds(&r), memcheck3(&dir, &prog, &[]), "{}", r["kinds"]);
}
