//! What `mtrace run` prints by default: as valgrind and LeakSanitizer, the
//! leaks the scan at exit found (not every block still reachable), then
//! the heaptrack-style sections only when asked for.

mod common;
use common::*;

use std::process::Command;

/// `mtrace run extra -- prog args`: its text report.
fn text(extra: &[&str], prog: &str, args: &[&str]) -> String {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = scratch(&format!("text-view-{n}"));
    let report = dir.join("report.txt");
    let out = Command::new(mtrace())
        .current_dir(&dir)
        .args(["run", "-o"])
        .arg(&report)
        .args(extra)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(&report).unwrap()
}

/// The entries' headlines ("#N: …").
fn entries(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with('#')).collect()
}

#[test]
fn python_prints_the_summary_and_no_leak() {
    let t = text(&[], "/usr/bin/python3", &["-c", "print(1)"]);
    assert!(t.starts_with("mtrace report for /usr/bin/python3"), "{t}");
    for line in [
        "\nLeak summary (memcheck's kinds, from the scan at exit; 1 thread stopped, ",
        "\n  definitely lost: 0 bytes in 0 blocks\n  indirectly lost: 0 bytes in 0 blocks\n  possibly lost: 0 bytes in 0 blocks\n",
        "\nNo leaks: ",
    ] {
        assert!(t.contains(line), "{line:?} not in:\n{t}");
    }
    assert_eq!(entries(&t), Vec::<&str>::new(), "{t}");
    assert!(!t.contains("Most allocation calls"), "{t}");
    // Without the scan: every block not freed, by backtrace, as before.
    let t = text(&["--no-scan"], "/usr/bin/python3", &["-c", "print(1)"]);
    assert!(t.contains("\nNot freed at exit, by backtrace ("), "{t}");
    assert!(!t.contains("Leak summary"), "{t}");
    assert!(entries(&t).len() > 5, "{t}");
}

#[test]
fn the_leaks_first_the_reachable_and_the_sections_when_asked() {
    let dir = scratch("text-view-build");
    let prog = build("scan.c", &dir.join("scan"), &["-g", "-O0"]);
    let prog = prog.to_str().unwrap();
    let m = markers("scan.c");
    let at = |name: &str| format!("scan.c:{})", m[name]);
    // Definitely, indirectly and possibly lost: 8 backtraces, definite first.
    let t = text(&[], prog, &[]);
    let e = entries(&t);
    assert_eq!(e.len(), 8, "{t}");
    assert!(e.iter().take(4).all(|l| l.contains("is definitely lost")), "{t}");
    assert!(
        t.contains("\nLeaks, by backtrace (8 backtraces; --show-reachable adds the still reachable blocks):\n"),
        "{t}"
    );
    assert!(!t.contains(&at("reachable")), "{t}");
    assert!(t.find("Leak summary").unwrap() < t.find("Leaks, by backtrace").unwrap(), "{t}");
    // --show-reachable: the reachable one too.
    let t = text(&["--show-reachable"], prog, &[]);
    assert_eq!(entries(&t).len(), 9, "{t}");
    assert!(t.contains(&at("reachable")) && t.contains("still reachable (malloc)"), "{t}");
    // --sections: heaptrack's sections after the leaks.
    let t = text(&["--sections"], prog, &[]);
    for s in
        ["\nMost allocation calls:\n", "\nTemporary allocations", "\nPeak memory consumers", "\nAllocation sizes:\n"]
    {
        assert!(t.contains(s), "{s:?} not in:\n{t}");
    }
}
