//! Wrong frees (mismatched, double, invalid): found with both backtraces,
//! equal in number to valgrind memcheck's, and the program's own status,
//! output and error output unchanged, also when glibc aborts on them.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The first frame of `frames` in ctests/wrong_frees.cpp: (function, line).
fn at(frames: &Value) -> Option<(String, u32)> {
    let f = frames.as_array()?.iter().find(|f| f["file"].as_str().is_some_and(|p| p.ends_with("/wrong_frees.cpp")))?;
    Some((f["function"].as_str()?.to_owned(), f["line"].as_u64()? as u32))
}

/// One error entry as the tests compare it.
#[derive(Debug, PartialEq, Eq)]
struct Found {
    kind: String,
    call: String,
    count: u64,
    /// Size, offset, family, freed.
    block: Option<(u64, u64, String, bool)>,
    alloc: Option<(String, u32)>,
    free: Option<(String, u32)>,
    first_free: Option<(String, u32)>,
}

fn found(r: &Value) -> Vec<Found> {
    r["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| Found {
            kind: e["kind"].as_str().unwrap().into(),
            call: e["call"].as_str().unwrap().into(),
            count: e["count"].as_u64().unwrap(),
            block: e.get("block").map(|b| {
                let s = |k: &str| b[k].as_u64().unwrap();
                (s("size"), s("offset"), b["family"].as_str().unwrap().into(), b["freed"].as_bool().unwrap())
            }),
            alloc: at(&e["alloc_frames"]),
            free: at(&e["free_frames"]),
            first_free: at(&e["first_free_frames"]),
        })
        .collect()
}

fn line(name: &str) -> u32 {
    markers("wrong_frees.cpp")[name]
}

fn f(function: &str, marker: &str) -> Option<(String, u32)> {
    Some((function.into(), line(marker)))
}

fn blk(size: u64, offset: u64, family: &str, freed: bool) -> Option<(u64, u64, String, bool)> {
    Some((size, offset, family.into(), freed))
}

fn build_it(name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(name);
    let prog = build("wrong_frees.cpp", &dir.join("wrong_frees"), &["-g", "-O0"]);
    (dir, prog)
}

/// Runs `case` natively and under `mtrace run` with `extra`: the report,
/// after checking that status, output and error output are the same.
fn run_case(dir: &Path, prog: &Path, extra: &[&str], case: &str) -> Value {
    let native = Command::new(prog).arg(case).current_dir(dir).output().unwrap();
    let (r, traced) = run_json(dir, extra, prog, &[case]);
    // mtrace run dies of the signal that killed the program.
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        (traced.status.code(), traced.status.signal()),
        (native.status.code(), native.status.signal()),
        "{case}: status"
    );
    assert_eq!(traced.stdout, native.stdout, "{case}: output");
    assert_eq!(String::from_utf8_lossy(&traced.stderr), String::from_utf8_lossy(&native.stderr), "{case}: errors");
    r
}

/// The expected findings of each case, with `-S` (every backtrace).
fn expected(case: &str) -> Vec<Found> {
    let mismatch = |call: &str, size, family: &str, func: &str| Found {
        kind: "mismatched".into(),
        call: call.into(),
        count: 1,
        block: blk(size, 0, family, false),
        alloc: f(func, &format!("a_{func}")),
        free: f(func, &format!("f_{func}")),
        first_free: None,
    };
    let double = |call: &str, size, func: &str, tag: &str| Found {
        kind: "double_free".into(),
        call: call.into(),
        count: 1,
        block: blk(size, 0, "malloc", true),
        alloc: f(func, &format!("a_{tag}")),
        free: f(func, &format!("f2_{tag}")),
        first_free: f(func, &format!("f1_{tag}")),
    };
    match case {
        "mismatched" => vec![
            mismatch("delete", 11, "malloc", "malloc_delete"),
            mismatch("delete[]", 12, "malloc", "malloc_delete_array"),
            mismatch("delete", 13, "aligned", "aligned_delete"),
            mismatch("delete[]", 14, "aligned", "aligned_delete_array"),
            mismatch("free", 1, "new", "new_free"),
            mismatch("delete[]", 4, "new", "new_delete_array"),
            mismatch("free", 17, "new[]", "new_array_free"),
            mismatch("delete", 18, "new[]", "new_array_delete"),
        ],
        "double" => vec![double("free", 24, "double_free", "double")],
        "double-undetected" => vec![double("free", 40, "double_undetected", "undetected")],
        "realloc-freed" => vec![double("realloc", 24, "realloc_freed", "realloc_freed")],
        "interior" => vec![Found {
            kind: "invalid_free".into(),
            call: "free".into(),
            count: 1,
            block: blk(32, 16, "malloc", false),
            alloc: f("interior", "a_interior"),
            free: f("interior", "f_interior"),
            first_free: None,
        }],
        "stack" => vec![Found {
            kind: "invalid_free".into(),
            call: "free".into(),
            count: 1,
            block: None,
            alloc: None,
            free: f("stack", "f_stack"),
            first_free: None,
        }],
        "realloc-stack" => vec![Found {
            kind: "invalid_free".into(),
            call: "realloc".into(),
            count: 1,
            block: None,
            alloc: None,
            free: f("realloc_stack", "f_realloc_stack"),
            first_free: None,
        }],
        _ => unreachable!(),
    }
}

const CASES: [&str; 7] =
    ["mismatched", "double", "double-undetected", "interior", "stack", "realloc-freed", "realloc-stack"];

#[test]
fn each_wrong_free_with_its_backtraces() {
    let (dir, prog) = build_it("wrong-frees");
    for case in CASES {
        let r = run_case(&dir, &prog, &["-S"], case);
        assert_eq!(found(&r), expected(case), "{case}");
        let s = &r["summary"];
        let (bad, mismatched) = if case == "mismatched" { (0, 8) } else { (1, 0) };
        assert_eq!((s["bad_frees"].as_u64(), s["mismatched_frees"].as_u64()), (Some(bad), Some(mismatched)), "{case}");
        assert_eq!(s["unmatched_frees"], 0, "{case}");
        // The runs glibc ended report so.
        let aborted = matches!(case, "double" | "interior" | "stack" | "realloc-stack");
        assert_eq!(s["ended_by"] == "signal 6", aborted, "{case}: {s}");
    }
}

#[test]
fn without_dash_s_the_same_findings_without_the_frees_backtraces() {
    let (dir, prog) = build_it("wrong-frees-plain");
    for case in CASES {
        let r = run_case(&dir, &prog, &[], case);
        let mut want = expected(case);
        for w in &mut want {
            // realloc's backtrace is recorded anyway when it returns: it
            // allocates (not when glibc aborted in it).
            if w.call != "realloc" || case == "realloc-stack" {
                w.free = None;
            }
            w.first_free = None;
        }
        assert_eq!(found(&r), want, "{case}");
    }
}

#[test]
fn counts_equal_memchecks() {
    if !has("valgrind") {
        return;
    }
    let (dir, prog) = build_it("wrong-frees-valgrind");
    for case in CASES {
        let vg = Command::new("valgrind").args(["--leak-check=no"]).arg(&prog).arg(case).output().unwrap();
        let text = String::from_utf8_lossy(&vg.stderr);
        let count = |heading: &str| text.lines().filter(|l| l.ends_with(heading)).count() as u64;
        let memcheck =
            (count("Invalid free() / delete / delete[] / realloc()"), count("Mismatched free() / delete / delete []"));
        let (r, _) = run_json(&dir, &["-S"], &prog, &[case]);
        let s = &r["summary"];
        assert_eq!((s["bad_frees"].as_u64().unwrap(), s["mismatched_frees"].as_u64().unwrap()), memcheck, "{case}");
    }
}

#[test]
fn frees_of_blocks_allocated_while_not_collecting_are_not_wrong() {
    let (dir, prog) = build_it("wrong-frees-stopped");
    let (r, out) = run_json_env(&dir, &[("MTRACE_START", "off")], &["-S"], &prog, &["stopped"]);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(6), "glibc aborts on the double free");
    let want = Found {
        kind: "double_free".into(),
        call: "free".into(),
        count: 1,
        block: blk(64, 0, "malloc", true),
        alloc: f("stopped", "a_stopped"),
        free: f("stopped", "f2_stopped"),
        first_free: f("stopped", "f1_stopped"),
    };
    assert_eq!(found(&r), vec![want]);
    // p, q, r and t: their allocations were not recorded.
    assert_eq!(r["summary"]["unmatched_frees"], 4);
}

#[test]
fn text_report_in_memchecks_words() {
    let (dir, prog) = build_it("wrong-frees-text");
    let out = Command::new(mtrace())
        .current_dir(&dir)
        .args(["run", "-S", "-o", "r.txt", "--"])
        .arg(&prog)
        .arg("double")
        .output()
        .unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(6));
    let text = std::fs::read_to_string(dir.join("r.txt")).unwrap();
    let l = |m: &str| line(m).to_string();
    let expect = [
        "  wrong frees:      1 double or invalid, 0 mismatched (below)".to_owned(),
        "Wrong frees: 1 double or invalid, 0 mismatched:".to_owned(),
        "#1: Invalid free() / delete / delete[] / realloc(): free of a block already freed (double free), 1 time"
            .to_owned(),
        format!("double_free ({}/wrong_frees.cpp:{}) [wrong_frees]", ctests_dir().display(), l("f2_double")),
        "is 0 bytes inside a block of size 24 free'd".to_owned(),
        format!("double_free ({}/wrong_frees.cpp:{}) [wrong_frees]", ctests_dir().display(), l("f1_double")),
        "  Block was alloc'd at".to_owned(),
        format!("double_free ({}/wrong_frees.cpp:{}) [wrong_frees]", ctests_dir().display(), l("a_double")),
    ];
    // In this order.
    let mut rest = text.as_str();
    for e in &expect {
        let i = rest.find(e.as_str()).unwrap_or_else(|| panic!("{e:?} not in order in:\n{text}"));
        rest = &rest[i + e.len()..];
    }
}

#[test]
fn error_exitcode_fires_on_wrong_frees_unless_left_out() {
    let (dir, prog) = build_it("wrong-frees-exitcode");
    let run = |extra: &[&str]| {
        let out = Command::new(mtrace())
            .current_dir(&dir)
            .args(["run", "-o", "r.txt", "--error-exitcode", "7"])
            .args(extra)
            .arg("--")
            .arg(&prog)
            .arg("mismatched")
            .output()
            .unwrap();
        out.status.code()
    };
    assert_eq!(run(&[]), Some(7));
    assert_eq!(run(&["--ignore-wrong-frees"]), Some(0));
}

#[test]
fn sort_keys_put_their_kind_first() {
    let (dir, prog) = build_it("wrong-frees-sort");
    // Two mismatched frees (one entry), then a double free.
    run_json(&dir, &["--keep-traces", "--trace-dir", "t"], &prog, &["mixed"]);
    let trace = std::fs::read_dir(dir.join("t")).unwrap().next().unwrap().unwrap().path();
    for (key, order) in [
        ("bytes", ["mismatched", "double_free"]),
        ("badfree", ["double_free", "mismatched"]),
        ("mismatched", ["mismatched", "double_free"]),
    ] {
        let out = Command::new(mtrace()).args(["report", "--json", "--sort", key]).arg(&trace).output().unwrap();
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        let kinds: Vec<_> = r["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["kind"].as_str().unwrap(), e["count"].as_u64().unwrap()))
            .collect();
        let counts = |k: &str| if k == "mismatched" { 2 } else { 1 };
        assert_eq!(kinds, order.map(|k| (k, counts(k))).to_vec(), "--sort {key}");
    }
}

#[test]
fn the_scan_at_exit_leaves_a_damaged_heap_alone() {
    // After a double free glibc did not notice, its heap is damaged: the
    // leak scan at exit must not call its malloc (listing the threads with
    // opendir did, and glibc aborted a program that exits normally).
    let (dir, prog) = build_it("wrong-frees-scan");
    let (r, out) = run_json(&dir, &["--scan", "-S"], &prog, &["mixed"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(r["summary"]["bad_frees"], 1);
    assert!(r["kinds"].is_object(), "the scan ran");
}

#[test]
fn sized_and_aligned_deletes_told_another_size_or_alignment_are_mismatched_frees() {
    let dir = scratch("wrong-delete-told");
    let prog = dir.join("delete_mismatch");
    let st = Command::new("g++")
        .args(["-g", "-O0", "-fsized-deallocation", "-o"])
        .arg(&prog)
        .arg(ctests_dir().join("delete_mismatch.cpp"))
        .status()
        .expect("g++");
    assert!(st.success());
    let m = markers("delete_mismatch.cpp");
    // The preload, and the ptrace tracer under both ways of stopping
    // (which read what each delete is told from the functions' table).
    for how in [&[][..], &["--ptrace"], &["--ptrace", "--hooks", "breakpoints"]] {
        told_mismatches_are_found(&dir, &prog, &m, how);
    }
    // The text, in valgrind 3.22's words.
    let txt = dir.join("report.txt");
    let st = Command::new(mtrace()).args(["run", "-S", "-o"]).arg(&txt).arg("--").arg(&prog).output().unwrap();
    assert!(st.status.success());
    let text = std::fs::read_to_string(&txt).unwrap();
    assert!(
        text.contains("\n#3: Mismatched new/delete size value: delete told 4 bytes of a block of 20, 1 time\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "\n#4: Mismatched new/delete alignment: delete told the default alignment of a block allocated with \
             alignment 64, 1 time\n"
        ),
        "{text}"
    );
}

/// delete_mismatch.cpp's six mismatched frees (and with -S only: the
/// sizes' three need it), traced with the options `how`.
fn told_mismatches_are_found(
    dir: &std::path::Path,
    prog: &std::path::Path,
    m: &std::collections::HashMap<String, u32>,
    how: &[&str],
) {
    let with_s: Vec<&str> = how.iter().copied().chain(["-S"]).collect();
    let (r, out) = run_json(dir, &with_s, prog, &[]);
    assert!(out.status.success(), "{how:?}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "delete_mismatch: done\n");
    // (kind, call, the size or alignment the delete was told, the block's
    // size and alignment, the allocating line), one each, in the order the
    // program made them; the right ones none.
    let got: Vec<(String, String, u64, u64, u64, u64, u64)> = r["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let told = e.get("told_size").or(e.get("told_align")).and_then(Value::as_u64).unwrap_or(u64::MAX);
            let b = &e["block"];
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["call"].as_str().unwrap().to_owned(),
                told,
                b["size"].as_u64().unwrap(),
                b["align"].as_u64().unwrap(),
                e["count"].as_u64().unwrap(),
                line_in(&serde_json::json!({"frames": e["alloc_frames"]}), "delete_mismatch.cpp").unwrap_or(0),
            )
        })
        .collect();
    let want = |kind: &str, call: &str, told: u64, size: u64, align: u64, marker: &str| {
        (kind.to_owned(), call.to_owned(), told, size, align, 1, m[marker] as u64)
    };
    assert_eq!(
        got,
        vec![
            want("size_mismatch", "delete", 33, 32, 0, "size_scalar"),
            want("size_mismatch", "delete[]", 33, 32, 0, "size_array"),
            want("size_mismatch", "delete", 4, 20, 0, "base"),
            want("align_mismatch", "delete", 0, 64, 64, "aligned_new"),
            want("align_mismatch", "delete", 64, 32, 0, "aligned_del"),
            want("align_mismatch", "delete", 128, 64, 64, "other_align"),
        ],
        "{how:?}"
    );
    // With -S, where each was freed: the line after its allocation's but
    // for the Base*, deleted two lines below.
    for e in r["errors"].as_array().unwrap() {
        assert!(line_in(&serde_json::json!({"frames": e["free_frames"]}), "delete_mismatch.cpp").is_some(), "{e}");
    }
    assert_eq!(r["summary"]["mismatched_frees"], 6, "{how:?}");
    assert_eq!(r["summary"]["bad_frees"], 0);
    // Without -S, the sizes are not in the trace: the alignments only.
    let (r, _) = run_json(dir, how, prog, &[]);
    let kinds: Vec<&str> = r["errors"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["align_mismatch"; 3], "{how:?}");
}
