//! Allocators other than glibc's (a program's own in its executable:
//! own_allocators.rs): jemalloc preloaded (seen through the hooks), the
//! allocators' own entry points, jemalloc and tcmalloc linked statically
//! (patched), Rust's global allocators, and a static executable with no
//! allocator symbol under --ptrace.

mod common;
use common::*;

use std::path::Path;
use std::process::Command;

/// Debian's libjemalloc (installed with redis-server; .ci/run makes sure).
const JEMALLOC: &str = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

/// (kind, call, size, family, line of the allocation in `src`) of each
/// wrong free of report `r`.
fn wrong_frees(r: &serde_json::Value, src: &str) -> Vec<(String, String, u64, String, Option<u64>)> {
    let all = r["errors"].as_array().unwrap();
    all.iter()
        .map(|e| {
            let b = &e["block"];
            let line = e["alloc_frames"].as_array().and_then(|f| {
                f.iter().find(|f| f["file"].as_str().is_some_and(|p| p.ends_with(src)))?["line"].as_u64()
            });
            (
                e["kind"].to_string(),
                e["call"].to_string(),
                b["size"].as_u64().unwrap_or(0),
                b["family"].to_string(),
                line,
            )
        })
        .collect()
}

#[test]
fn jemalloc_preloaded_is_seen_through_the_hooks() {
    assert!(Path::new(JEMALLOC).exists(), "{JEMALLOC} is missing (apt-get install libjemalloc2)");
    let dir = scratch("alloc-jemalloc");
    let families = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    let (plain, _) = run_json(&dir, &[], &families, &[]);
    let (r, out) = run_json_env(&dir, &[("LD_PRELOAD", JEMALLOC)], &[], &families, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(r["notices"], serde_json::json!([]));
    let found = r["allocators"].as_array().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0]["name"].as_str(), found[0]["module"].as_str()), (Some("jemalloc"), Some(JEMALLOC)));
    assert_eq!(found[0]["seen"], true);
    // The same leaks as under glibc's malloc, each family's, and no error.
    let leaks = leaks_in(&r, "families.c");
    assert_eq!(leaks, leaks_in(&plain, "families.c"));
    assert!(leaks.len() >= 8, "{leaks:?}");
    assert_eq!(r["errors"], serde_json::json!([]));
    // memcheck's eight mismatched pairs, found with jemalloc as with glibc.
    let wf = build("wrong_frees.cpp", &dir.join("wrong_frees"), &["-g", "-O0"]);
    let (plain, _) = run_json(&dir, &[], &wf, &["mismatched"]);
    let (r, out) = run_json_env(&dir, &[("LD_PRELOAD", JEMALLOC)], &[], &wf, &["mismatched"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(wrong_frees(&r, "wrong_frees.cpp").len(), 8);
    assert_eq!(wrong_frees(&r, "wrong_frees.cpp"), wrong_frees(&plain, "wrong_frees.cpp"));
}

#[test]
fn a_stripped_static_executable_under_ptrace_is_said_to_have_no_allocator() {
    let dir = scratch("alloc-static");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0", "-static"]);
    let stripped = dir.join("families-stripped");
    std::fs::copy(&prog, &stripped).unwrap();
    assert!(Command::new("strip").arg(&stripped).status().unwrap().success());
    // With its symbols: glibc's malloc, linked in, has its breakpoints.
    let (r, _) = run_json(&dir, &["--ptrace"], &prog, &[]);
    assert_eq!(r["notices"], serde_json::json!([]));
    assert!(r["summary"]["allocations"].as_u64().unwrap() > 0);
    let (r, out) = run_json(&dir, &["--ptrace"], &stripped, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(r["summary"]["allocations"], 0);
    assert_eq!(
        r["notices"],
        serde_json::json!([format!(
            "{}: no module of the process defines malloc (a stripped static executable?): \
             mtrace had no allocator to trace",
            stripped.display()
        )])
    );
}

#[test]
fn memory_taken_by_system_call_is_said_to_be_unseen() {
    let dir = scratch("alloc-raw");
    let prog = build("raw_mmap.c", &dir.join("raw_mmap"), &["-g", "-O0"]);
    let (r, out) = run_json(&dir, &[], &prog, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(r["summary"]["allocations"], 0);
    let notices = r["notices"].as_array().unwrap();
    assert_eq!(notices.len(), 1, "{notices:?}");
    let n = notices[0].as_str().unwrap();
    // 200 MiB touched; the RSS samples (every 10 ms) see most of it.
    let grew: u64 = n.strip_prefix("the RSS grew by ").and_then(|t| t.split(' ').next()?.parse().ok()).unwrap();
    assert!((150..=210).contains(&grew), "{n}");
    assert!(n.ends_with(" MiB while the blocks and mappings mtrace saw peaked at 0 MiB: the program takes memory mtrace does not see"), "{n}");
}

/// Builds ctests/allocator_api.c for allocator `define` (JEMALLOC,
/// MIMALLOC, TCMALLOC), linked with `lib`.
fn allocator_api(dir: &Path, define: &str, lib: &str) -> std::path::PathBuf {
    let out = dir.join(format!("api_{lib}"));
    let st = Command::new("cc")
        .args(["-g", "-O0", &format!("-D{define}")])
        .arg(ctests_dir().join("allocator_api.c"))
        .arg("-o")
        .arg(&out)
        .arg(format!("-l{lib}"))
        .status()
        .expect("a C compiler");
    assert!(
        st.success(),
        "building allocator_api.c with -l{lib} (apt-get install lib{lib}-dev or libgoogle-perftools-dev)"
    );
    out
}

/// Runs ctests/allocator_api.c built as `prog` (for allocator `lib`) and
/// checks what every build of it gives: its output, its two blocks kept
/// (`m`: its markers), 4,000 frees or more, no wrong free. The report.
fn api_as_expected(
    dir: &Path,
    prog: &Path,
    m: &std::collections::HashMap<String, u32>,
    lib: &str,
) -> serde_json::Value {
    let (r, out) = run_json(dir, &[], prog, &[]);
    assert!(out.status.success(), "{lib}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "allocator_api: done\n");
    assert_eq!(
        leaks_in(&r, "allocator_api.c"),
        vec![leak(100, 1, "malloc", "main", m["kept"]), leak(500, 1, "malloc", "main", m["grown"])],
        "{lib}"
    );
    assert_eq!(r["errors"], serde_json::json!([]), "{lib}");
    assert!(r["summary"]["frees"].as_u64().unwrap() >= 4000, "{lib}: {}", r["summary"]);
    r
}

#[test]
fn allocators_own_entry_points_are_followed() {
    let dir = scratch("alloc-api");
    let m = markers("allocator_api.c");
    for (define, lib, name) in [
        ("JEMALLOC", "jemalloc", "jemalloc"),
        ("MIMALLOC", "mimalloc", "mimalloc"),
        ("TCMALLOC", "tcmalloc", "tcmalloc"),
    ] {
        let prog = allocator_api(&dir, define, lib);
        // 4,000 blocks freed through sdallocx/dallocx, mi_free_size/mi_free,
        // tc_free_sized/tc_free (and free): none left, none wrong.
        let r = api_as_expected(&dir, &prog, &m, lib);
        assert_eq!(r["allocators"][0]["name"], name, "{lib}");
        assert_eq!(r["notices"], serde_json::json!([]), "{lib}");
    }
}

#[test]
fn under_ptrace_a_free_that_is_also_a_delete_is_no_mismatched_free() {
    // libmimalloc and libtcmalloc define free and operator delete at one
    // address: the breakpoint there stands for both names (1,000 false
    // mismatched frees with mimalloc before).
    let dir = scratch("alloc-api-ptrace");
    let m = markers("allocator_api.c");
    for (define, lib) in [("MIMALLOC", "mimalloc"), ("TCMALLOC", "tcmalloc")] {
        let prog = allocator_api(&dir, define, lib);
        let (r, out) = run_json(&dir, &["--ptrace"], &prog, &[]);
        assert!(out.status.success(), "{lib}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(r["errors"], serde_json::json!([]), "{lib}");
        // Nothing unseen, and every backtrace defined before its use (the
        // merge once put a realloc before its Stack under uprobes).
        assert_eq!(r["notices"], serde_json::json!([]), "{lib}");
        // (stdout's buffer, which glibc's freeres frees under the preload,
        // is not freed under ptrace: left out.)
        let ours: Vec<Leak> = leaks_in(&r, "allocator_api.c").into_iter().filter(|l| l.bytes != 4096).collect();
        assert_eq!(
            ours,
            vec![leak(100, 1, "malloc", "main", m["kept"]), leak(500, 1, "malloc", "main", m["grown"])],
            "{lib}"
        );
    }
}

/// Builds ctests/allocator_api.c for allocator `define` (JEMALLOC,
/// TCMALLOC) linked statically with the archive `lib`: its malloc family
/// and own entry points are the executable's.
fn allocator_api_static(dir: &Path, define: &str, lib: &str) -> std::path::PathBuf {
    linked_with(&dir.join(format!("api_static_{define}")), "allocator_api.c", &[&format!("-D{define}")], lib)
}

/// Builds `ctests/<src>` (-g -O0 and `flags`) into `out`, linked with the
/// allocator archive `lib` (its malloc family the executable's).
fn linked_with(out: &Path, src: &str, flags: &[&str], lib: &str) -> std::path::PathBuf {
    let archive = format!("/usr/lib/x86_64-linux-gnu/{lib}");
    assert!(
        Path::new(&archive).exists(),
        "{archive} is missing (apt-get install libjemalloc-dev libgoogle-perftools-dev)"
    );
    let st = Command::new("cc")
        .args(["-g", "-O0"])
        .args(flags)
        .arg(ctests_dir().join(src))
        .arg("-o")
        .arg(out)
        .arg(&archive)
        .args(["-lstdc++", "-lpthread", "-lm", "-ldl"])
        .status()
        .expect("a C compiler");
    assert!(st.success(), "building {src} with {archive}");
    out.to_owned()
}

#[test]
fn allocators_linked_statically_are_hooked_by_patching() {
    let dir = scratch("alloc-static-lib");
    let m = markers("allocator_api.c");
    for (define, lib, name, functions) in [
        ("JEMALLOC", "libjemalloc.a", "jemalloc", 12),
        // gperftools' free is also its operator delete and tc_free (one
        // function): its frees are never judged mismatched (memcheck, which
        // replaces it, reports one that is not).
        ("TCMALLOC", "libtcmalloc_minimal.a", "tcmalloc", 43),
    ] {
        let prog = allocator_api_static(&dir, define, lib);
        let r = api_as_expected(&dir, &prog, &m, lib);
        let a = &r["allocators"][0];
        assert_eq!((a["name"].as_str(), a["seen"].as_bool()), (Some(name), Some(true)), "{lib}: {a}");
        let how = a["how"].as_str().unwrap();
        assert!(how.starts_with(&format!("hooked by patching its entry points ({functions} functions: ")), "{how}");
        assert_eq!(r["notices"], serde_json::json!([]), "{lib}");
    }
    // Reported where the executable is not (a trace taken on a target):
    // the stream's record of what was patched still names the allocator.
    let kept = dir.join("kept");
    let _ = std::fs::remove_dir_all(&kept);
    std::fs::create_dir_all(&kept).unwrap();
    let gone = dir.join("api_gone");
    std::fs::copy(dir.join("api_static_TCMALLOC"), &gone).unwrap();
    let (_, out) = run_json(&dir, &["--keep-traces", "--trace-dir", kept.to_str().unwrap()], &gone, &[]);
    assert!(out.status.success());
    std::fs::remove_file(&gone).unwrap();
    let (trace, _) = trace_headers(&kept).pop().unwrap();
    let r = report_json(&trace);
    assert_eq!(r["allocators"][0]["name"], "tcmalloc", "{}", r["allocators"]);
    assert_eq!(r["allocators"][0]["seen"], true);
}

#[test]
fn a_program_probing_for_jemalloc_gets_the_same_answer() {
    assert!(Path::new(JEMALLOC).exists(), "{JEMALLOC} is missing (apt-get install libjemalloc2)");
    let dir = scratch("alloc-probe");
    let prog = build("probe_jemalloc.c", &dir.join("probe"), &["-g", "-O0"]);
    let m = markers("probe_jemalloc.c");
    // Natively, and traced: no jemalloc, whatever the preload exports.
    let native = Command::new(&prog).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&native.stdout), "jemalloc: no\n");
    let (r, out) = run_json(&dir, &[], &prog, &[]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "jemalloc: no\n");
    assert_eq!(leaks_in(&r, "probe_jemalloc.c"), vec![]);
    // With jemalloc preloaded: found, and its mallocx followed.
    let native = Command::new(&prog).env("LD_PRELOAD", JEMALLOC).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&native.stdout), "jemalloc: yes\n");
    let (r, out) = run_json_env(&dir, &[("LD_PRELOAD", JEMALLOC)], &[], &prog, &[]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "jemalloc: yes\n");
    assert_eq!(leaks_in(&r, "probe_jemalloc.c"), vec![leak(77, 1, "malloc", "main", m["probe"])]);
    assert_eq!(r["errors"], serde_json::json!([]));
}

/// Builds ctests/rust_allocators (its own Cargo workspace, from crates.io)
/// into the tests' scratch folder: the path of binary `bin`.
fn rust_allocators(bin: &str) -> std::path::PathBuf {
    let target = mtrace().parent().unwrap().parent().unwrap().join("tmp").join("rust-allocators");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "--release", "--locked", "--quiet", "--manifest-path"])
        .arg(ctests_dir().join("rust_allocators").join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .status()
        .expect("cargo");
    assert!(st.success(), "building ctests/rust_allocators (tikv-jemallocator and mimalloc from crates.io)");
    target.join("release").join(bin)
}

#[test]
fn rust_global_allocators_are_hooked_by_patching() {
    let dir = scratch("alloc-rust");
    let m = markers("rust_allocators/src/lib.rs");
    let src = "rust_allocators/src/lib.rs";
    for (bin, name, first) in [("rust_jemalloc", "jemalloc", "_rjem_malloc"), ("rust_mimalloc", "mimalloc", "mi_free")]
    {
        let prog = rust_allocators(bin);
        // Every block not freed: the 10 forgotten ones of 100 bytes, at
        // their line (before the patching, none: only jemalloc's own
        // mappings and libc's blocks were seen).
        let (r, out) = run_json(&dir, &[], &prog, &[]);
        assert!(out.status.success(), "{bin}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{bin}: done\n"));
        assert_eq!(lost_at(&r, src, m["forgotten"]), (1000, 10), "{bin}");
        assert_eq!(r["errors"], serde_json::json!([]), "{bin}");
        assert!(r["summary"]["frees"].as_u64().unwrap() >= 1000, "{bin}: {}", r["summary"]);
        let a = &r["allocators"][0];
        assert_eq!((a["name"].as_str(), a["seen"].as_bool()), (Some(name), Some(true)), "{bin}: {a}");
        let how = a["how"].as_str().unwrap();
        assert!(how.starts_with("hooked by patching its entry points (") && how.contains(first), "{bin}: {how}");
        assert_eq!(r["notices"], serde_json::json!([]), "{bin}");
        // The text's first frame is the program's: the global allocator's
        // crate, the `__rust_` shims and the `alloc` crate are one line
        // (they took the default 12 frames; issue 65, item 3).
        let t = run_text(&dir, &["--no-scan"], &prog, &[]);
        // (Its first entries are jemalloc's own mappings: --no-scan.)
        let first = &t[t.find(" not freed (malloc)").unwrap_or_else(|| panic!("{t}"))..];
        let lines: Vec<&str> = first.lines().skip(1).take_while(|l| l.starts_with("    ")).collect();
        assert!(lines[0].trim().starts_with('(') && lines[0].contains(" allocator frames: "), "{bin}: {t}");
        assert!(lines[1].contains(": rust_allocators::forget_one ("), "{bin}: {t}");
        assert!(lines[1].ends_with(&format!("lib.rs:{}) [{bin}]", m["forgotten"])), "{bin}: {t}");
    }
    // With the leak scan, the 10 blocks are definitely lost, in every run.
    // jemalloc's extent records point to the first block of each slab;
    // the mappings they lie in, which jemalloc made from its constructor,
    // are its own and no roots (issue 65: 9 and 1 still reachable before).
    for bin in ["rust_jemalloc", "rust_mimalloc"] {
        for run in 0..5 {
            let (r, _) = run_json(&dir, &["--scan"], &rust_allocators(bin), &[]);
            let k = &r["kinds"];
            assert_eq!(
                (&k["definite"]["bytes"], &k["definite"]["blocks"]),
                (&1000.into(), &10.into()),
                "{bin} {run}: {k}"
            );
            assert_eq!(k["reachable"]["blocks"], 0, "{bin} {run}: {k}");
            if bin == "rust_jemalloc" {
                // Its base, its radix tree and its first extents.
                assert!(k["allocator_mappings"]["blocks"].as_u64() >= Some(2), "{bin} {run}: {k}");
                assert_eq!(k["mappings"]["blocks"], 0, "{bin} {run}: {k}");
            }
        }
    }
}

#[test]
fn leak_kinds_are_memchecks_whatever_the_allocator() {
    // ctests/scan.c's blocks, one of each kind memcheck tells (scan.rs
    // checks them under glibc's malloc), allocated by jemalloc and
    // tcmalloc as shared libraries and by both linked in: the same kind at
    // each line. (With libjemalloc.a, the blocks at the start of a slab
    // were still reachable before jemalloc's own mappings stopped being
    // roots. mimalloc preloaded makes the possibly lost block still
    // reachable: the block before it holds mimalloc's link to it, left
    // from its free list; docs/ALLOCATORS.md.)
    assert!(Path::new(JEMALLOC).exists(), "{JEMALLOC} is missing (apt-get install libjemalloc2)");
    let dir = scratch("alloc-kinds");
    let m = markers("scan.c");
    let glibc = build("scan.c", &dir.join("scan"), &["-g", "-O0"]);
    let tc_static = linked_with(&dir.join("scan_tcmalloc"), "scan.c", &[], "libtcmalloc_minimal.a");
    let je_static = linked_with(&dir.join("scan_jemalloc"), "scan.c", &[], "libjemalloc.a");
    let tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4";
    let want = [
        ("reachable", "reachable"),
        ("possible", "possible"),
        ("unaligned", "definite"),
        ("tree_root", "definite"),
        ("tree_child", "indirect"),
        ("tree_child2", "indirect"),
        ("self", "definite"),
    ];
    for (what, prog, preload) in [
        ("jemalloc", &glibc, JEMALLOC),
        ("tcmalloc", &glibc, tcmalloc),
        ("tcmalloc linked in", &tc_static, ""),
        ("jemalloc linked in", &je_static, ""),
    ] {
        let env: Vec<(&str, &str)> = if preload.is_empty() { vec![] } else { vec![("LD_PRELOAD", preload)] };
        let (r, out) = run_json_env(&dir, &env, &["--scan", "--show-reachable"], prog, &[]);
        assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
        let kind_at = |line: u32| -> String {
            r["stacks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| line_in(e, "scan.c") == Some(line as u64))
                .map(|e| e["kind"].as_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        for (marker, kind) in want {
            assert_eq!(kind_at(m[marker]), kind, "{what}: {marker}");
        }
        let mut cycle = [kind_at(m["cycle_a"]), kind_at(m["cycle_b"])];
        cycle.sort();
        assert_eq!(cycle, ["definite".to_owned(), "indirect".to_owned()], "{what}");
        if what == "jemalloc linked in" {
            // The mappings its constructor made: its own, not roots.
            let own = &r["kinds"]["allocator_mappings"];
            assert!(own["blocks"].as_u64() >= Some(2) && r["kinds"]["mappings"]["blocks"] == 0, "{}", r["kinds"]);
        }
    }
}
