//! Process models that forbid a tracer's thread: a process with one
//! thread has none of mtrace's until it starts its second (a user
//! namespace is refused to a multi-threaded process; Chromium's zygote
//! dies of its own check), and what it asks for is answered by its own
//! thread.

mod common;
use common::*;

use std::path::Path;
use std::process::Command;

/// The program's standard output, run natively.
fn native(prog: &Path) -> String {
    let out = Command::new(prog).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_process_with_one_thread_has_no_thread_of_ours_until_it_starts_one() {
    let dir = scratch("models-one-thread");
    let prog = build("one_thread.c", &dir.join("one_thread"), &["-g", "-O0"]);
    let natively = native(&prog);
    let lines: Vec<&str> = natively.lines().collect();
    assert_eq!((lines[0], lines[2]), ("threads: 1", "threads: 2"), "{natively}");
    let (r, out) = run_json(&dir, &["--scan"], &prog, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // One thread after 100 allocations, the namespace given as natively
    // ("ok" here; with a writer thread: "Invalid argument"), then the
    // writer with the program's second thread.
    let traced = String::from_utf8_lossy(&out.stdout);
    assert_eq!(traced, format!("threads: 1\n{}\nthreads: 3\n", lines[1]), "natively:\n{natively}");
    let m = markers("one_thread.c");
    let kinds = |k: &str| (r["kinds"][k]["bytes"].as_u64().unwrap(), r["kinds"][k]["blocks"].as_u64().unwrap());
    // (Failed once in CI with definite (0, 0), not reproduced in 200
    // runs here: the whole report says where the thread's block went.)
    assert_eq!(kinds("definite"), (16, 1), "{r:#}");
    assert_eq!(kinds("reachable"), ((101..200).sum::<u64>(), 99), "{r:#}");
    assert_eq!(leaks_in(&r, "one_thread.c"), vec![leak(16, 1, "malloc", "run", m["thread"])]);
    assert_eq!(r["summary"]["allocations"], 105, "{}", r["summary"]);
}

#[test]
fn unshare_of_a_user_namespace_succeeds_as_natively() {
    let dir = scratch("models-unshare");
    let natively = Command::new("unshare").args(["-U", "true"]).output().unwrap();
    let (r, out) = run_json(&dir, &[], Path::new("unshare"), &["-U", "true"]);
    assert_eq!(out.status.code(), natively.status.code(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stderr), String::from_utf8_lossy(&natively.stderr));
    // It succeeds natively here (root; CI's machine too): not vacuous.
    assert_eq!(natively.status.code(), Some(0), "{}", String::from_utf8_lossy(&natively.stderr));
    // unshare execs its command only once the namespace is made: the
    // report is of `true`'s image, traced too.
    assert!(r["program"].as_str().is_some_and(|p| p.ends_with("/true")), "{}", r["program"]);
    assert_eq!(r["summary"]["ended_by"], "exit", "{}", r["summary"]);
}

/// The page the browser loads: its script writes the answer into the DOM.
const PAGE: &str = "<html><body><p id=\"x\">waiting</p>\
<script>document.getElementById('x').textContent = 'answer ' + (6 * 7);</script></body></html>";

#[test]
fn chromium_with_its_zygote_dumps_the_dom_as_natively() {
    let dir = scratch("models-chromium");
    let page = dir.join("page.html");
    std::fs::write(&page, PAGE).unwrap();
    let url = format!("file://{}", page.display());
    // .ci/run installs chromium: under CI its absence is a failure.
    let Some(mut c) = chromium(&dir.join("native")) else {
        cannot_run("chromium is not installed");
        return;
    };
    let natively = c.arg("--dump-dom").arg(&url).output().unwrap();
    assert_eq!(natively.status.code(), Some(0), "{}", String::from_utf8_lossy(&natively.stderr));
    let dom = String::from_utf8(natively.stdout).unwrap();
    assert!(dom.contains("<p id=\"x\">answer 42</p>"), "{dom}");
    for run in 0..5 {
        let kept = dir.join(format!("traces-{run}"));
        std::fs::create_dir_all(&kept).unwrap();
        let browser = chromium(&dir.join(format!("profile-{run}"))).unwrap();
        // The zygote is on: no --no-zygote. It forks the renderer and dies
        // of its own check if it has a second thread then (SIGABRT, and
        // an empty DOM).
        let out = Command::new(mtrace())
            .arg("run")
            .arg("--json")
            .arg("-o")
            .arg(dir.join("report.json"))
            .arg("--no-scan")
            .arg("--keep-traces")
            .arg("--trace-dir")
            .arg(&kept)
            .arg("--")
            .arg(browser.get_program())
            .args(browser.get_args())
            .arg("--dump-dom")
            .arg(&url)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "run {run}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), dom, "run {run}");
        // The zygote was traced, and its image was Chromium's.
        let chromium: Vec<_> = trace_headers(&kept).into_iter().filter(|(_, h)| h.exe.ends_with("/chromium")).collect();
        let zygote = chromium.iter().any(|(_, h)| h.cmdline.iter().any(|a| a == "--type=zygote"));
        assert!(zygote, "run {run}: no zygote among the traces");
        // Its allocator is its executable's own (PartitionAlloc's shim),
        // hooked by patching in every process of its image, the zygote's
        // forked children too (147 allocation calls seen in the browser
        // process before: libc's own).
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
        assert!(r["program"].as_str().is_some_and(|p| p.ends_with("/chromium")), "run {run}: {}", r["program"]);
        assert!(r["summary"]["allocations"].as_u64().unwrap() > 100_000, "run {run}: {}", r["summary"]);
        assert_eq!(r["summary"]["mismatched_frees"], 0, "run {run}");
        if run > 0 {
            continue;
        }
        // Reported one by one (seconds each), in the first run only.
        for (path, _) in &chromium {
            let t = report_json(path);
            let a = &t["allocators"][0];
            assert_eq!(a["seen"], true, "{}: {a}", path.display());
            assert!(a["how"].as_str().unwrap().starts_with("hooked by patching"), "{}: {a}", path.display());
        }
    }
}

#[test]
fn the_command_line_keeps_every_argument_quoted_as_a_shell_would() {
    let dir = scratch("models-cmdline");
    let args = ["", "a b", "it's", "plain"];
    let (r, out) = run_json(&dir, &[], Path::new("/bin/echo"), &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(r["cmdline"], serde_json::json!(["/bin/echo", "", "a b", "it's", "plain"]));
    let txt = dir.join("report.txt");
    let out =
        Command::new(mtrace()).arg("run").arg("-o").arg(&txt).arg("--").arg("/bin/echo").args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&txt).unwrap();
    let line = text.lines().find(|l| l.starts_with("  command:")).unwrap_or_else(|| panic!("{text}"));
    assert_eq!(line, r#"  command:          /bin/echo '' 'a b' 'it'\''s' plain"#);
}

/// The lines of the process tree a text report starts with (one per
/// process, the program's first).
fn tree_lines(text: &str) -> Vec<&str> {
    match text.strip_prefix("Processes traced (") {
        Some(s) => s.lines().skip(1).take_while(|l| !l.is_empty()).collect(),
        None => vec![],
    }
}

#[test]
fn a_fork_then_exec_is_one_process_and_a_wrapper_leads_to_the_program() {
    let dir = scratch("models-fork-exec");
    let prog = build("fork_exec.c", &dir.join("fork_exec"), &["-g", "-O0"]);
    let txt = dir.join("report.txt");
    let out = Command::new(mtrace()).arg("run").arg("-o").arg(&txt).arg("--").arg(&prog).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&txt).unwrap();
    // The child: the fork's copy of the program, then true; one line (it
    // was two, the first a stub of 0 bytes), under the program's.
    let tree = tree_lines(&text);
    assert_eq!(tree.len(), 2, "{text}");
    assert!(tree[0].starts_with("* "), "{text}");
    let chain = format!(" ({} → /usr/bin/true): exit 0; ", prog.display());
    assert!(tree[1].starts_with("  └─ ") && tree[1].contains(&chain), "{text}");
    // A wrapper that execs the program: its earlier image leads to the
    // report above; a command it ran is its own line.
    let out = Command::new(mtrace())
        .arg("run")
        .arg("-o")
        .arg(&txt)
        .args(["--", "/bin/sh", "-c", "ls / > /dev/null; exec cat /dev/null"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&txt).unwrap();
    assert!(text.contains("\n\nmtrace report for /usr/bin/cat "), "{text}");
    let tree = tree_lines(&text);
    assert_eq!(tree.len(), 2, "{text}");
    assert!(tree[0].starts_with("* ") && tree[0].contains(" (/usr/bin/dash → /usr/bin/cat): exit 0; "), "{text}");
    assert!(tree[1].starts_with("  └─ ") && tree[1].contains(" ls /: exit 0; "), "{text}");
}
