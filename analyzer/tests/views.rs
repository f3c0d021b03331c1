//! Views of traces besides the report: `mtrace report --folded` and
//! `--flamegraph` (the collapsed stacks of each cost, exact on families.c,
//! and the SVG inferno draws from them), and `mtrace diff` of two runs.

mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

fn report(trace: &std::path::Path, args: &[&str]) {
    let out = Command::new(mtrace()).arg("report").arg(trace).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn folded_stacks_and_flamegraphs_of_each_cost() {
    let dir = scratch("flame");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    let tdir = dir.join("t");
    run_json(&dir, &["--trace-dir", tdir.to_str().unwrap()], &prog, &[]);
    let (trace, _) = traces(&tdir).pop().unwrap();
    let folded = dir.join("leaked.folded");
    report(&trace, &["--folded", folded.to_str().unwrap()]);
    let base = "_start;__libc_start_main_impl;__libc_start_call_main;main";
    let want: Vec<String> = [
        ("leak_aligned_alloc", 106),
        ("leak_calloc", 102),
        ("leak_malloc", 101),
        ("leak_memalign", 108),
        ("leak_posix_memalign", 105),
        ("leak_pvalloc", 109),
        ("leak_realloc", 103),
        ("leak_reallocarray", 104),
        ("leak_valloc", 107),
    ]
    .iter()
    .map(|(f, n)| format!("{base};{f} {n}"))
    .collect();
    let got: Vec<String> = std::fs::read_to_string(&folded).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(got, want);
    assert_eq!(std::fs::metadata(&folded).unwrap().permissions().mode() & 0o777, 0o600);
    // Calls: every backtrace that allocated, also main's own (freed) ones.
    let calls = dir.join("calls.folded");
    report(&trace, &["--folded", calls.to_str().unwrap(), "--cost", "calls"]);
    let got = std::fs::read_to_string(&calls).unwrap();
    assert_eq!(got.lines().count(), 10, "{got}");
    assert!(got.lines().any(|l| l == format!("{base};leak_malloc 1")), "{got}");
    assert!(got.lines().any(|l| l == format!("{base} 3")), "{got}");
    let allocated = dir.join("allocated.folded");
    report(&trace, &["--folded", allocated.to_str().unwrap(), "--cost", "allocated"]);
    let got = std::fs::read_to_string(&allocated).unwrap();
    assert!(got.lines().any(|l| l == format!("{base};leak_calloc 102")), "{got}");
    // The SVG: inferno's, with the functions and the cost's title.
    let svg = dir.join("leaked.svg");
    report(&trace, &["--flamegraph", svg.to_str().unwrap(), "--icicle"]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"), "{}", &text[..200.min(text.len())]);
    assert!(text.contains("Memory not freed") && text.contains("leak_pvalloc"), "{text}");
}

#[test]
fn diff_of_two_runs_by_backtrace() {
    let dir = scratch("diff");
    let prog = build("diff_leak.c", &dir.join("diff_leak"), &["-g", "-O0"]);
    let m = markers("diff_leak.c");
    let trace_of = |name: &str, args: &[&str]| kept_trace(&dir, name, &prog, args);
    let (old, new) = (trace_of("old", &[]), trace_of("new", &["5"]));
    let out = Command::new(mtrace()).arg("diff").arg(&old).arg(&new).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((d["leaked_bytes"].as_i64(), d["leaked_blocks"].as_i64()), (Some(160), Some(5)), "{d:#}");
    assert_eq!(d["peak_bytes"], 160);
    assert_eq!(d["calls"], 0);
    // One backtrace changed (the loop's); the always-kept block did not.
    let s = d["stacks"].as_array().unwrap();
    assert_eq!(s.len(), 1, "{d:#}");
    assert_eq!(
        (s[0]["leaked_bytes"].as_i64(), s[0]["leaked_blocks"].as_i64(), s[0]["calls"].as_i64()),
        (Some(160), Some(5), Some(0))
    );
    assert_eq!(s[0]["frames"][0]["line"], m["loop"]);
    // Text, and the other way round.
    let out = Command::new(mtrace()).arg("diff").arg(&new).arg(&old).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("  not freed:        -160 bytes in -5 blocks\n"), "{text}");
    assert!(text.contains("#1: not freed -160 bytes in -5 blocks, peak -160 bytes, 0 allocation calls\n"), "{text}");
    assert!(text.contains(&format!("main ({}:{})", ctests_dir().join("diff_leak.c").display(), m["loop"])), "{text}");
    // A trace cut short (killed, or copied in part) is said, exit 1.
    let bytes = std::fs::read(&new).unwrap();
    let cut = dir.join("cut.mtrace");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let out = Command::new(mtrace()).arg("diff").arg(&old).arg(&cut).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("mtrace: {}: ", cut.display())) && err.contains("compared what was read"),
        "{err}"
    );
}

#[test]
fn a_program_rebuilt_since_its_trace_is_said_and_found_with_binpath() {
    // The trace keeps each module's build ID, not its symbols (issue 42,
    // item 7): another build at the path is not used, and the report and
    // diff say why the frames are module+offset.
    let dir = scratch("rebuilt");
    let prog = dir.join("diff_leak");
    let m = markers("diff_leak.c");
    let trace_of = |name: &str, args: &[&str]| kept_trace(&dir, name, &prog, args);
    build("diff_leak.c", &prog, &["-g", "-O0"]);
    let old = trace_of("old", &[]);
    std::fs::create_dir_all(dir.join("kept")).unwrap();
    std::fs::copy(&prog, dir.join("kept/diff_leak")).unwrap();
    build("diff_leak.c", &prog, &["-g", "-O1"]);
    let new = trace_of("new", &["5"]);
    let warning = format!(
        "  WARNING: {} is not the build that was traced (its build ID differs: rebuilt or updated since?): \
         its frames are left as module+offset; --binpath DIR or --sysroot DIR finds the traced one\n",
        prog.display()
    );
    let out = Command::new(mtrace()).arg("report").arg(&old).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&warning) && text.contains(": ??? (diff_leak+0x"), "{text}");
    let out = Command::new(mtrace()).arg("report").arg(&new).output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("WARNING"));
    let out = Command::new(mtrace()).arg("diff").arg(&old).arg(&new).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("\n  WARNING: old: {}", &warning[11..])), "{text}");
    // With the traced build in --binpath: symbolized, and the backtraces pair.
    let out = Command::new(mtrace())
        .arg("diff")
        .arg(&old)
        .arg(&new)
        .arg("--binpath")
        .arg(dir.join("kept"))
        .arg("--json")
        .output()
        .unwrap();
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["notices"], serde_json::json!([]), "{d:#}");
    let s = d["stacks"].as_array().unwrap();
    assert_eq!(s.len(), 1, "{d:#}");
    assert_eq!(
        (s[0]["leaked_bytes"].as_i64(), s[0]["frames"][0]["line"].as_u64()),
        (Some(160), Some(u64::from(m["loop"])))
    );
}

#[test]
fn manual_pages_and_completions_come_from_the_cli() {
    let dir = scratch("manpages");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(mtrace()).arg("manpage").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let diff = std::fs::read_to_string(dir.join("mtrace-diff.1")).unwrap();
    assert!(diff.contains(".TH mtrace-diff 1") && diff.contains("mtrace diff"), "{diff}");
    // The environment under its man(7) name.
    let run = std::fs::read_to_string(dir.join("mtrace-run.1")).unwrap();
    let env = run.find("\n.SH ENVIRONMENT\n").expect("an ENVIRONMENT section");
    assert!(run[env..].contains("MTRACE_REPORT_SIGNAL") && !run.contains(".SH EXTRA"), "{run}");
    let top = std::fs::read_to_string(dir.join("mtrace.1")).unwrap();
    assert!(top.contains("mtrace\\-report(1)"), "{top}");
    let out = Command::new(mtrace()).args(["completions", "bash"]).output().unwrap();
    let bash = String::from_utf8_lossy(&out.stdout);
    assert!(bash.contains("_mtrace()") && bash.contains("--flamegraph"), "{bash}");
}
