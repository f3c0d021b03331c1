//! The process tree a multi-process run's report starts with: the same
//! processes, parents, programs and ends as `strace -f` sees (the
//! oracle), for a shell pipeline, `make -j2` of a small project and `git
//! gc`; fork-then-exec one process; an exec of a static executable said
//! so; a child killed by SIGKILL without an end record.

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// How a process ended, as both sides can say it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum End {
    Exit(u8),
    Killed(String),
}

/// A process as compared: its parent, the program it ran last, how it
/// ended.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Proc {
    parent: u32,
    program: PathBuf,
    end: End,
}

/// What `strace -ff -o PREFIX` wrote: every process under `root` (a pid),
/// threads left out.
fn strace_tree(dir: &Path, prefix: &str, root: u32) -> BTreeMap<u32, Proc> {
    let mut files: BTreeMap<u32, String> = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix(&format!("{prefix}.")).and_then(|s| s.parse().ok()) {
            files.insert(pid, std::fs::read_to_string(&p).unwrap());
        }
    }
    let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
    for (&pid, text) in &files {
        for l in text.lines() {
            let forks = ["clone(", "clone3(", "fork(", "vfork("].iter().any(|c| l.starts_with(c));
            if !forks || l.contains("CLONE_THREAD") {
                continue;
            }
            if let Some(child) = l.rsplit("= ").next().and_then(|r| r.trim().parse::<u32>().ok()) {
                parent.insert(child, pid);
            }
        }
    }
    let under = |mut p: u32| loop {
        if p == root {
            return true;
        }
        match parent.get(&p) {
            Some(&q) => p = q,
            None => return false,
        }
    };
    let mut out = BTreeMap::new();
    for (&pid, text) in &files {
        if !under(pid) {
            continue;
        }
        let program = text
            .lines()
            .filter(|l| l.starts_with("execve(") && l.ends_with(") = 0"))
            .filter_map(|l| l.split('"').nth(1))
            .next_back()
            .map(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.into()));
        let end = text.lines().find_map(|l| {
            let rest = l.strip_prefix("+++ ")?.strip_suffix(" +++")?;
            match rest.strip_prefix("exited with ") {
                Some(n) => Some(End::Exit(n.parse().ok()?)),
                None => Some(End::Killed(rest.strip_prefix("killed by ")?.split(' ').next()?.to_owned())),
            }
        });
        // A thread's file (its clone had CLONE_THREAD): no parent entry.
        let (Some(program), Some(end)) = (program, end) else { continue };
        // The root's parent is mtrace (0 on mtrace's side: not traced).
        let parent = if pid == root { 0 } else { parent[&pid] };
        out.insert(pid, Proc { parent, program, end });
    }
    out
}

/// The report's tree as compared: each process with its parent (0 for
/// the root), its last program (the exec'd one where that wrote no
/// trace) and its end.
fn mtrace_tree(r: &Value) -> BTreeMap<u32, Proc> {
    fn walk(n: &Value, parent: u32, out: &mut BTreeMap<u32, Proc>) {
        let pid = n["pid"].as_u64().unwrap() as u32;
        let images = n["images"].as_array().unwrap();
        let program = match n.get("not_traced") {
            Some(nt) => {
                let exec = nt["exec"].as_str().unwrap();
                std::fs::canonicalize(exec).unwrap_or_else(|_| exec.into())
            }
            None => PathBuf::from(images.last().unwrap()["exe"].as_str().unwrap()),
        };
        let end = match (n["ended_by"].as_str(), n["exit_status"].as_u64()) {
            (Some("exit" | "_exit"), Some(s)) => End::Exit(s as u8),
            (Some(s), _) if s.starts_with("signal ") => End::Killed(signal_name(s[7..].parse().unwrap())),
            // An exec that wrote no trace ran to its own end, unseen.
            (Some("exec"), _) => End::Exit(u8::MAX),
            (None, _) => End::Killed("SIGKILL".into()),
            (other, s) => panic!("{pid}: ended by {other:?}, status {s:?}"),
        };
        out.insert(pid, Proc { parent, program, end });
        for c in n["children"].as_array().unwrap() {
            walk(c, pid, out);
        }
    }
    let mut out = BTreeMap::new();
    for root in r["processes"].as_array().unwrap_or_else(|| panic!("no process tree: {r}")) {
        walk(root, 0, &mut out);
    }
    out
}

fn signal_name(n: i32) -> String {
    match n {
        6 => "SIGABRT".into(),
        9 => "SIGKILL".into(),
        11 => "SIGSEGV".into(),
        15 => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// Runs `mtrace run --no-scan --json` on `args` under `strace -ff` (in
/// `cwd`): (the report, strace's tree of the program's processes).
fn run_both(dir: &Path, cwd: &Path, args: &[&str]) -> (Value, BTreeMap<u32, Proc>) {
    let st = dir.join("strace");
    let _ = std::fs::remove_dir_all(&st);
    std::fs::create_dir_all(&st).unwrap();
    let report = dir.join("report.json");
    let out = Command::new("strace")
        .current_dir(cwd)
        .args(["-f", "-q", "-ff", "-e", "trace=process", "-o"])
        .arg(st.join("t"))
        .arg(mtrace())
        .args(["run", "--no-scan", "--json", "-o"])
        .arg(&report)
        .arg("--")
        .args(args)
        .output()
        .expect("strace (apt-get install strace)");
    assert!(out.status.code().is_some(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let root = r["pid"].as_u64().unwrap() as u32;
    (r.clone(), strace_tree(&st, "t", root))
}

/// The text report of `mtrace run --no-scan [extra] -o txt -- sh -c
/// script` in `dir`; the script exits 3.
fn text_report(dir: &Path, txt: &Path, script: &str, extra: &[&str]) -> String {
    let out = Command::new(mtrace())
        .current_dir(dir)
        .args(["run", "--no-scan"])
        .args(extra)
        .arg("-o")
        .arg(txt)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(txt).unwrap()
}

/// The two trees, with what strace cannot know of an exec mtrace could
/// not trace (how it ended: unseen) set from strace's.
fn compare(r: &Value, strace: &BTreeMap<u32, Proc>) {
    let mut ours = mtrace_tree(r);
    for (pid, p) in ours.iter_mut() {
        if p.end == End::Exit(u8::MAX) {
            if let Some(s) = strace.get(pid) {
                p.end = s.end.clone();
            }
        }
    }
    assert_eq!(ours, *strace, "mtrace's tree (left) against strace's (right)");
}

#[test]
fn a_shell_pipeline_a_static_program_and_a_killed_child() {
    let dir = scratch("tree-shell");
    let stat = build("families.c", &dir.join("static_prog"), &["-g", "-O0", "-static"]);
    let script = format!("seq 3 | sort -r | head -n 2; {} > /dev/null; sh -c 'kill -9 $$'; exit 3", stat.display());
    let (r, strace) = run_both(&dir, &dir, &["sh", "-c", &script]);
    compare(&r, &strace);
    // The static program's node says why it has no trace of its own.
    let shell = &r["processes"][0];
    let why = shell["children"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|c| c.get("not_traced"))
        .unwrap_or_else(|| panic!("{shell}"));
    assert!(why["why"].as_str().unwrap().ends_with("a static executable (mtrace run --ptrace traces it)"), "{why}");
    // The text: the tree first, the program's marked, then its report.
    let txt = dir.join("report.txt");
    let text = text_report(&dir, &txt, &script, &[]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("Processes traced ("), "{text}");
    // (dash ends by _exit.)
    assert!(lines[1].starts_with("* ") && lines[1].contains(": _exit 3; "), "{text}");
    assert!(text.contains("  └─ ") && text.contains(": no end record (killed by SIGKILL?); "), "{text}");
    assert!(text.contains("static_prog: not traced: "), "{text}");
    let summary = lines.iter().position(|l| l.starts_with("mtrace report for ")).unwrap();
    assert!(summary > 5, "{text}");
    // What dash left, without the leak kinds no scan gave.
    assert!(text.contains("\nNot freed at _exit (not scanned: no leak kinds), by backtrace ("), "{text}");
    // seq left blocks (its stdout buffer): said, with the way to see them.
    assert!(text.contains("\nOther processes left blocks not freed: --children reports each in full"), "{text}");
    // --children: each other process's report after the program's, in
    // the tree's order; none for the static program (no trace).
    let text = text_report(&dir, &txt, &script, &["--children"]);
    let reports: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("mtrace report for ")).collect();
    // "sh (/usr/bin/dash, pid 7)": the name run, then the executable.
    let (mut programs, pids): (Vec<&str>, Vec<&str>) = reports
        .iter()
        .map(|r| {
            let (head, pid) = r.split_once("pid ").unwrap();
            (head.trim_end_matches(", ").trim_end_matches(" (").rsplit(" (").next().unwrap(), pid.trim_end_matches(')'))
        })
        .unzip();
    // The tree's order (seq and sort of the pipeline start in either order).
    let tree: Vec<&str> = text
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| !l.contains("not traced"))
        .map(|l| l.trim_start_matches(['*', '│', '├', '└', '─', ' ']).split(' ').next().unwrap())
        .collect();
    assert_eq!(pids, tree, "{text}");
    assert!(reports[0].starts_with("sh (/usr/bin/dash, pid "), "{text}");
    programs[1..4].sort();
    assert_eq!(
        programs,
        ["/usr/bin/dash", "/usr/bin/head", "/usr/bin/seq", "/usr/bin/sort", "/usr/bin/dash"],
        "{text}"
    );
    assert!(!text.contains("Other processes left blocks"), "{text}");
}

#[test]
fn a_child_left_running_is_said_to_be_running() {
    // The program ends and leaves a child running (a daemon's way): its
    // trace has no End record, but it is no SIGKILL's doing.
    let dir = scratch("tree-running");
    let txt = dir.join("report.txt");
    // The shell exits only once the child's second image (sleep, after
    // the exec) has written its header: an exit right after `&` left the
    // report to race the exec, and a loaded machine showed the child as
    // the forked shell still running (CI, stop 61).
    let traces = dir.join("traces");
    let traces = traces.to_str().unwrap();
    // (Bounded, so that a preload that never writes it fails the test
    // rather than hanging it.)
    let script = format!(
        "sleep 2 & i=0; until [ -s '{traces}'/sleep.$!.mtrace ] || [ $i = 1000000 ]; do i=$((i+1)); done; exit 3"
    );
    let report = |out: &Path, extra: &[&str]| {
        let _ = std::fs::remove_dir_all(traces);
        let extra: Vec<&str> = ["--trace-dir", traces].iter().chain(extra).copied().collect();
        text_report(&dir, out, &script, &extra)
    };
    let text = report(&txt, &[]);
    let child = text.lines().find(|l| l.contains(" sleep 2 (")).unwrap_or_else(|| panic!("{text}"));
    assert!(child.contains(": still running (its trace so far); "), "{text}");
    assert!(child.starts_with("  └─ "), "{text}");
    assert!(!text.contains("no end record"), "{text}");
    // Its own report (--children) says so too, not that it was killed.
    let text = report(&txt, &["--children"]);
    let own = &text[text.find("mtrace report for /usr/bin/sleep").unwrap_or_else(|| panic!("{text}"))..];
    assert!(
        own.contains("\n  ended by:         nothing yet: still running (the report covers what it wrote so far)\n"),
        "{own}"
    );
    assert!(!text.contains("WARNING: the trace has no end record"), "{text}");
    let json = dir.join("report.json");
    let _ = report(&json, &["--json"]);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["processes"].as_array().map(Vec::len), Some(1), "{r}");
    let sh = &r["processes"][0];
    let sleep = &sh["children"][0];
    assert_eq!(sleep["images"][1]["exe"], "/usr/bin/sleep", "{r}");
    assert_eq!((&sleep["running"], &sleep["ended_by"]), (&Value::Bool(true), &Value::Null), "{sleep}");
    // The shell ended: no "running" there.
    assert_eq!((sh.get("running"), &sh["ended_by"]), (None, &Value::from("_exit")), "{sh}");
    // A shell that exits right after `&`: the child is under it, though
    // the shell may be gone before the child's trace begins (its header
    // names the process it was forked from, not init). Whether the
    // child has exec'd sleep by the report is left to the race.
    let text = text_report(&dir, &txt, "sleep 2 & exit 3", &[]);
    let tree: Vec<&str> = text.lines().skip(1).take_while(|l| !l.is_empty()).collect();
    assert_eq!(tree.len(), 2, "{text}");
    assert!(tree[0].starts_with("* ") && tree[1].starts_with("  └─ "), "{text}");
}

#[test]
fn a_long_tree_shows_what_matters_and_counts_the_rest() {
    // A shell loop (30 processes that leave nothing) and a killed child:
    // the text tree shows the program, what left blocks and the killed
    // one, and counts the rest; JSON has every process.
    let dir = scratch("tree-long");
    let txt = dir.join("report.txt");
    let script = "for i in $(seq 30); do /bin/true; done; sh -c 'kill -9 $$'; exit 3";
    let text = text_report(&dir, &txt, script, &[]);
    let tree: Vec<&str> = text.lines().take_while(|l| !l.is_empty()).collect();
    assert_eq!(tree[0], "Processes traced (33; the program's, marked *, is reported below):", "{text}");
    assert!(tree[1].starts_with("* ") && tree[1].contains(" sh -c 'for i in"), "{text}");
    assert!(tree[2].starts_with("  ├─ ") && tree[2].contains(" seq 30 ("), "{text}");
    assert!(tree[3].starts_with("  └─ ") && tree[3].contains(": no end record (killed by SIGKILL?); "), "{text}");
    assert_eq!(tree[4], "  … 30 more processes (nothing left among them): the JSON report lists every process");
    assert_eq!(tree.len(), 5, "{text}");
    let json = dir.join("report.json");
    let _ = text_report(&dir, &json, script, &["--json"]);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["processes"][0]["children"].as_array().map(Vec::len), Some(32), "{r}");
}

#[test]
fn make_j2_of_a_small_project() {
    let dir = scratch("tree-make");
    let proj = dir.join("proj");
    let _ = std::fs::remove_dir_all(&proj);
    std::fs::create_dir_all(&proj).unwrap();
    for (name, body) in [("a.c", "int a(void) { return 1; }\n"), ("b.c", "int b(void) { return 2; }\n")] {
        std::fs::write(proj.join(name), body).unwrap();
    }
    std::fs::write(proj.join("main.c"), "int a(void); int b(void);\nint main(void) { return a() + b() - 3; }\n")
        .unwrap();
    std::fs::write(proj.join("Makefile"), "prog: a.o b.o main.o\n\tcc -o $@ $^\n%.o: %.c\n\tcc -c -O1 -o $@ $<\n")
        .unwrap();
    let (r, strace) = run_both(&dir, &proj, &["make", "-s", "-j2"]);
    assert_eq!(r["summary"]["exit_status"], 0, "{}", r["summary"]);
    // make, 4 compiler drivers and their cc1, as, collect2, ld.
    assert!(strace.len() >= 12, "{strace:?}");
    compare(&r, &strace);
}

#[test]
fn git_gc_of_a_repository() {
    let dir = scratch("tree-git");
    let repo = dir.join("repo");
    let _ = std::fs::remove_dir_all(&repo);
    let git = |args: &[&str]| {
        let st = Command::new("git")
            .current_dir(&repo)
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
            .args(args)
            .output()
            .unwrap();
        assert!(st.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&st.stderr));
    };
    std::fs::create_dir_all(&repo).unwrap();
    git(&["init", "-q"]);
    for i in 0..5 {
        std::fs::write(repo.join(format!("f{i}")), format!("{i}\n").repeat(100)).unwrap();
        git(&["add", "."]);
        git(&["commit", "-q", "-m", &format!("c{i}")]);
    }
    let (r, strace) = run_both(&dir, &repo, &["git", "gc", "--quiet"]);
    assert!(strace.len() >= 3, "{strace:?}");
    compare(&r, &strace);
}
