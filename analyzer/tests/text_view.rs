//! What `mtrace run` prints by default: as valgrind and LeakSanitizer, the
//! leaks the scan at exit found (not every block still reachable), then
//! the heaptrack-style sections only when asked for.

mod common;
use common::*;

/// `mtrace run extra -- prog args`: its text report.
fn text(extra: &[&str], prog: &str, args: &[&str]) -> String {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = scratch(&format!("text-view-{n}"));
    run_text(&dir, extra, std::path::Path::new(prog), args)
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
    // glibc's blocks freed (freeres): python3's own (its arenas) remain.
    assert!(!entries(&t).is_empty(), "{t}");
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

/// The frame lines of the `i`th entry of `text`, each as "function line"
/// (the line of deep.c), and the "… N more" line if any.
fn frames_of(text: &str, i: usize) -> (Vec<String>, Option<String>) {
    let start = text.find(&format!("\n#{i}: ")).unwrap_or_else(|| panic!("no entry {i}: {text}"));
    let lines: Vec<&str> = text[start + 1..].lines().skip(1).take_while(|l| l.starts_with("    ")).collect();
    let more = lines.iter().find(|l| l.trim_start().starts_with('…')).map(|l| l.trim().to_owned());
    let frames = lines
        .iter()
        .filter(|l| !l.trim_start().starts_with('…'))
        .map(|l| {
            let func = l.split(": ").nth(1).unwrap().split(' ').next().unwrap();
            let line = l.split("deep.c:").nth(1).map_or("-", |r| r.split(')').next().unwrap());
            format!("{func} {line}")
        })
        .collect();
    (frames, more)
}

#[test]
fn backtraces_stop_at_the_programs_entry_and_at_num_callers() {
    let dir = scratch("text-view-deep");
    let prog = build("deep.c", &dir.join("deep"), &["-g", "-O0"]);
    let prog = prog.to_str().unwrap();
    let m = markers("deep.c");
    let at = |f: &str, k: &str| format!("{f} {}", m[k]);
    // The recursion: leaf, down (its last call), 19 × down, main.
    let mut deep = vec![at("leaf", "leaf"), at("down", "down_last")];
    deep.extend(std::iter::repeat_n(at("down", "down"), 19));
    deep.push(at("main", "main_down"));
    // Entries by bytes: 30 (the recursion), 20 (the thread), 10 (main).
    for (extra, shown) in [(vec![], 12), (vec!["--num-callers", "3"], 3), (vec!["--num-callers", "0"], 22)] {
        let t = text(&extra, prog, &[]);
        let (frames, more) = frames_of(&t, 1);
        assert_eq!(frames, deep[..shown].to_vec(), "{extra:?}: {t}");
        let cut = 22 - shown;
        assert_eq!(more, (cut > 0).then(|| format!("… {cut} more frames (--num-callers)")), "{extra:?}");
        // A thread's backtrace ends at its start routine, main's at main:
        // glibc's frames below them (start_thread, clone3,
        // __libc_start_call_main, _start) are not shown.
        assert_eq!(frames_of(&t, 2), (vec![at("routine", "routine")], None), "{extra:?}: {t}");
        assert_eq!(frames_of(&t, 3), (vec![at("main", "main")], None), "{extra:?}: {t}");
    }
    // JSON has every recorded frame, glibc's below main among them.
    let (r, _) = run_json(&dir, &["--scan"], prog.as_ref(), &[]);
    let e = r["stacks"].as_array().unwrap().iter().find(|e| e["bytes"] == 30).unwrap();
    let names: Vec<&str> = e["frames"].as_array().unwrap().iter().filter_map(|f| f["function"].as_str()).collect();
    assert_eq!(names.len(), 25, "{names:?}");
    assert_eq!(&names[21..], ["main", "__libc_start_call_main", "__libc_start_main_impl", "_start"]);
}

/// The allocator's and the C++ runtime's frames at the top of a
/// backtrace are one line, and `--num-callers` counts from the program's
/// own first frame (issue 65, item 3): a vector's growth shows the
/// push_back's line and main's at the default 12 and at 2 (its 5
/// libstdc++ frames would have taken them); JSON has every frame.
#[test]
fn allocator_frames_fold_and_the_programs_own_come_first() {
    let dir = scratch("text-view-vector");
    let prog = build("vector_growth.cpp", &dir.join("vector_growth"), &["-g", "-O0"]);
    let m = markers("vector_growth.cpp");
    for extra in [vec![], vec!["--num-callers", "2"]] {
        let t = run_text(&dir, &extra, &prog, &[]);
        // The buffer, indirectly lost through the vector.
        let start = t.find("is indirectly lost (new)").unwrap_or_else(|| panic!("{t}"));
        let lines: Vec<&str> = t[start..].lines().skip(1).take_while(|l| l.starts_with("    ")).collect();
        let folded = lines[0].trim();
        assert!(folded.starts_with('(') && folded.contains(" allocator frames: "), "{extra:?}: {t}");
        assert!(lines[1].contains(": fill ("), "{t}");
        assert!(lines[1].ends_with(&format!("vector_growth.cpp:{}) [vector_growth]", m["push"])), "{t}");
        assert!(
            lines[2].contains(": main (") && lines[2].contains(&format!("vector_growth.cpp:{})", m["fill"])),
            "{t}"
        );
        assert_eq!(lines.len(), 3, "{extra:?}: {t}");
    }
    let (r, _) = run_json(&dir, &["--scan"], &prog, &[]);
    let e = r["stacks"].as_array().unwrap().iter().find(|e| e["kind"] == "indirect").unwrap();
    let frames = e["frames"].as_array().unwrap();
    let fill = frames.iter().position(|f| f["function"].as_str().is_some_and(|n| n == "fill")).unwrap();
    assert!(fill >= 3, "{e}");
    assert_eq!(e["at"], fill, "{e}");
}

/// The program's own wrappers, named by `wrapper:` lines of the
/// suppressions file, fold as the allocator's do: the entry starts at
/// their caller, in the text and in the JSON's `at`.
#[test]
fn the_programs_own_wrappers_fold_when_named() {
    let dir = scratch("text-view-wrapper");
    let prog = build("own_wrapper.c", &dir.join("own_wrapper"), &["-g", "-O0"]);
    let m = markers("own_wrapper.c");
    let first_frames = |t: &str| -> Vec<String> {
        let start = t.find("is definitely lost").unwrap_or_else(|| panic!("{t}"));
        t[start..].lines().skip(1).take_while(|l| l.starts_with("    ")).map(|l| l.trim().to_owned()).collect()
    };
    // Without the line: the wrappers are the program's frames.
    let t = run_text(&dir, &[], &prog, &[]);
    let f = first_frames(&t);
    assert!(f[0].contains(": xmalloc_checked ("), "{t}");
    // With it: folded, and the entry starts at make_table.
    let supp = dir.join("wrappers.supp");
    std::fs::write(&supp, "# the program's own\nwrapper:^xmalloc\n").unwrap();
    let t = run_text(&dir, &["--suppressions", supp.to_str().unwrap()], &prog, &[]);
    let f = first_frames(&t);
    assert_eq!(f[0], "(2 allocator frames: the allocator's and its wrappers'; JSON has them)", "{t}");
    assert!(f[1].contains(": make_table (") && f[1].contains(&format!("own_wrapper.c:{})", m["table"])), "{t}");
    assert!(f[2].contains(": main (") && f[2].contains(&format!("own_wrapper.c:{})", m["main"])), "{t}");
    let (r, _) = run_json(&dir, &["--scan", "--suppressions", supp.to_str().unwrap()], &prog, &[]);
    let e = &r["stacks"][0];
    assert_eq!(e["frames"][e["at"].as_u64().unwrap() as usize]["function"], "make_table", "{e}");
}
