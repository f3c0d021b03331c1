//! The frames kept between reports (`analysis/src/symbolize/cache.rs`):
//! a later report of a module's build reads them instead of its debug
//! info; a binary changed in place since (stripped: the same build ID) is
//! never given them; the folder is the environment's.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

/// `mtrace report --json TRACE` with the cache at `cache` (`None`: the
/// default folder under `home`).
fn report(trace: &Path, cache: Option<&Path>, home: &Path) -> Value {
    let mut c = Command::new(mtrace());
    c.args(["report", "--json"]).arg(trace).env("HOME", home).env_remove("XDG_CACHE_HOME");
    match cache {
        Some(p) => c.env("MTRACE_SYMBOL_CACHE", p),
        None => c.env_remove("MTRACE_SYMBOL_CACHE"),
    };
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The 900-byte leak's first two frames: (function, line, inlined).
fn frames(r: &Value) -> Vec<(String, Option<u64>, bool)> {
    let e = r["stacks"].as_array().unwrap().iter().find(|e| e["bytes"] == 900).expect("the 900-byte leak");
    e["frames"].as_array().unwrap()[..2]
        .iter()
        .map(|f| (f["function"].as_str().unwrap_or("?").to_owned(), f["line"].as_u64(), f["inlined"] == true))
        .collect()
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    v.sort();
    v
}

fn mode(p: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions()) & 0o777
}

#[test]
fn cached_frames_are_read_again_and_never_given_to_a_binary_changed_since() {
    let dir = scratch("symbol-cache");
    let prog = build("inlined.c", &dir.join("inlined"), &["-g", "-O2"]);
    let m = markers("inlined.c");
    let trace = kept_trace(&dir, "t", &prog, &[]);
    let cache = dir.join("cache");
    let want = |fill: &str| {
        vec![
            ("make_buffer".to_owned(), Some(m["inlined"] as u64), true),
            (fill.to_owned(), Some(m["caller"] as u64), false),
        ]
    };

    let first = report(&trace, Some(&cache), &dir);
    assert_eq!(frames(&first), want("fill"));
    assert_eq!(mode(&cache), 0o700);
    // One file per module symbolized; the program's holds its functions.
    let ours: Vec<PathBuf> =
        files(&cache).into_iter().filter(|f| std::fs::read_to_string(f).unwrap().contains("\"make_buffer\"")).collect();
    assert_eq!(ours.len(), 1, "{:?}", files(&cache));
    assert_eq!(mode(&ours[0]), 0o600);

    // The next report takes the program's frames from its file: a name
    // changed there shows.
    let text = std::fs::read_to_string(&ours[0]).unwrap();
    std::fs::write(&ours[0], text.replace("\"fill\"", "\"fill_from_the_cache\"")).unwrap();
    assert_eq!(frames(&report(&trace, Some(&cache), &dir)), want("fill_from_the_cache"));
    // Everything else in the report is as it was.
    let again = report(&trace, Some(&cache), &dir);
    assert_eq!(again["summary"], first["summary"]);

    // A damaged file is read as none, and written again.
    std::fs::write(&ours[0], b"{\"strings\": [\"fill").unwrap();
    assert_eq!(frames(&report(&trace, Some(&cache), &dir)), want("fill"));
    assert!(std::fs::read_to_string(&ours[0]).unwrap().contains("\"make_buffer\""));

    // Stripped in place, the binary keeps its build ID (the trace's) and
    // loses its DWARF: no file and line, and not the cached ones.
    let status = Command::new("strip").arg("-g").arg(&prog).status().expect("strip");
    assert!(status.success());
    let stripped = frames(&report(&trace, Some(&cache), &dir));
    assert!(stripped.iter().all(|(_, line, _)| line.is_none()), "{stripped:?}");
    assert_eq!(stripped[0].0, "fill", "{stripped:?}");
}

#[test]
fn the_folder_is_the_environments() {
    let dir = scratch("symbol-cache-folder");
    let prog = build("inlined.c", &dir.join("inlined"), &["-g", "-O0"]);
    let trace = kept_trace(&dir, "t", &prog, &[]);
    // By default under ~/.cache.
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    report(&trace, None, &home);
    assert!(!files(&home.join(".cache/mtrace/symbols")).is_empty());
    // `off`: none.
    let home2 = dir.join("home2");
    std::fs::create_dir_all(&home2).unwrap();
    report(&trace, Some(Path::new("off")), &home2);
    assert!(files(&home2).is_empty());
}
