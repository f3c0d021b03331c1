//! README's commands, run as written (issue 42), and the user guide's
//! they lead to (docs/GUIDE.md): every fenced block of either is run
//! here — its commands through bash, with the `mtrace` under test first on
//! PATH and a fresh HOME, and the output shown beside it checked line by
//! line — or named in [`NOT_RUN`] with the reason. A block either gains
//! that is neither fails the test. README stays a five-minute read:
//! [`README_LINES`] at most.
//!
//! A shown output's lines must appear in the run's output in order
//! ("..." lines stand for any lines); what differs from run to run is
//! masked on both sides and nothing else: addresses, pids, the checkout's
//! path, the bytes a scan read, call counts and what a process of the
//! tree left.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The blocks not run, by a phrase of their first line, and why.
const NOT_RUN: &[(&str, &str)] = &[
    ("scripts/test", "the test command itself: CI runs it"),
    ("install -D", "installs a release build into the user's home (the tests run the debug build)"),
    ("$(pidof myserver)", "needs the reader's server; attach's own tests (attach.rs) run it on ctests"),
    ("target$ mtrace server", "two machines; relay.rs runs server and client on one"),
    ("docker run -v", "the user's image and installed files; docker.rs runs the same mounts with the test's build"),
];

/// README's length at most, lines (issue 64: what it is, the two
/// commands, examples, how it compares, where to read on); the rest is
/// the guide's.
const README_LINES: usize = 250;

/// The documents whose blocks are run: README, then the guide.
const DOCS: [&str; 2] = ["README.md", "docs/GUIDE.md"];

/// One fenced block: its document, the line its fence is on, and its text.
struct Block {
    doc: &'static str,
    line: usize,
    text: String,
}

fn repo() -> PathBuf {
    ctests_dir().parent().unwrap().to_owned()
}

/// README and the guide, one after the other.
fn readme() -> String {
    DOCS.iter().map(|d| std::fs::read_to_string(repo().join(d)).unwrap()).collect::<Vec<_>>().join("\n")
}

/// The fenced blocks of README, then of the guide.
fn blocks_of_docs() -> Vec<Block> {
    let mut out = Vec::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        let mut open: Option<Block> = None;
        for (i, l) in text.lines().enumerate() {
            if l.starts_with("```") {
                match open.take() {
                    Some(b) => out.push(b),
                    None => open = Some(Block { doc, line: i + 1, text: String::new() }),
                }
            } else if let Some(b) = open.as_mut() {
                b.text.push_str(l);
                b.text.push('\n');
            }
        }
    }
    out
}

/// `cmd` through bash in `dir`: mtrace's folder first on PATH, HOME
/// `dir/home` (in the checkout, a folder of the tests': mtrace keeps its
/// symbolized frames under HOME). Its standard output and error
/// together, and its status.
fn sh(dir: &Path, cmd: &str) -> (String, Option<i32>) {
    let bin = mtrace().parent().unwrap().to_owned();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let home = match dir == repo() {
        true => Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme-home"),
        false => dir.join("home"),
    };
    std::fs::create_dir_all(&home).unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("{cmd} 2>&1"))
        .current_dir(dir)
        .env("PATH", path)
        .env("HOME", &home)
        .env("PPROF_TMPDIR", dir)
        .output()
        .unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), out.status.code())
}

/// `line` with what differs from run to run masked: addresses (`0x…`),
/// pids, the checkout's path (README's `/home/you/mtrace`, `/work/main`),
/// the bytes a scan read, call counts, the tree's branches.
fn mask(line: &str) -> String {
    let root = repo().display().to_string();
    let mut s =
        line.trim_end().replace(&root, "REPO").replace("/home/you/mtrace", "REPO").replace("/work/main", "REPO");
    s = s.replace("├─ ", "─ ").replace("└─ ", "─ ");
    // Numbers after these words, or before "calls" and "bytes read".
    let mut out = String::new();
    let mut rest = s.as_str();
    while let Some(i) = rest.find(|c: char| c.is_ascii_digit()) {
        let (head, tail) = rest.split_at(i);
        let len = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == ',')).unwrap_or(tail.len());
        let (word, after) = tail.split_at(len);
        let hex = word.starts_with("0x");
        let pid =
            head.ends_with("pid ") || head.trim_start_matches(' ').trim_start_matches("─ ").is_empty() || head == "* ";
        // A process's leftovers in the tree vary with the shell's timing.
        let left =
            line.contains(" calls, ") && (after.starts_with(" bytes in ") || after.starts_with(" blocks not freed"));
        let counted = after.starts_with(" calls") || after.starts_with(" bytes read") || left;
        out.push_str(head);
        out.push_str(if hex || pid || counted { "…" } else { word });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Each line README shows (other than "...") is in `out`, in order, masked.
fn shows(out: &str, shown: &str, what: &str) {
    let got: Vec<String> = out.lines().map(mask).collect();
    let mut at = 0;
    for want in shown.lines().filter(|l| l.trim() != "...").map(mask) {
        match got[at..].iter().position(|g| *g == want) {
            Some(i) => at += i + 1,
            None => {
                panic!("{what}: README shows\n  {want}\nnot found (in order) in the run's output:\n{}", got.join("\n"))
            }
        }
    }
}

/// The block whose text starts with (or, for output, contains) `phrase`.
fn block<'a>(all: &'a [Block], phrase: &str) -> &'a Block {
    all.iter()
        .find(|b| b.text.contains(phrase))
        .unwrap_or_else(|| panic!("README and the guide have no block with {phrase:?}"))
}

#[test]
fn every_block_is_run_or_said_why_not() {
    let covered = [
        "cc -g ctests/families.c",
        "mtrace report for /tmp/families",
        "mtrace manpage",
        "Processes traced (",
        "$ mtrace run -S -- ./wrong_frees double",
        "LD_PRELOAD=/path/to/libmtrace.so",
        "--flamegraph leaks.svg",
        "mtrace run --pprof heap.pb.gz",
        "mtrace report --markers TRACE",
    ];
    for b in blocks_of_docs() {
        let known = covered.iter().any(|c| b.text.contains(c)) || NOT_RUN.iter().any(|(c, _)| b.text.contains(c));
        assert!(known, "{}:{}: a block this test neither runs nor excuses:\n{}", b.doc, b.line, b.text);
    }
}

#[test]
fn readme_is_a_five_minute_read_and_leads_to_the_guide() {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(text.lines().count() <= README_LINES, "README.md: {} lines", text.lines().count());
    assert!(text.contains("(docs/GUIDE.md)"), "README.md names no guide");
    // Each of the guide's sections it links to exists.
    let guide = std::fs::read_to_string(repo().join("docs/GUIDE.md")).unwrap();
    for s in ["Sampling", "Environment", "Wrong frees"] {
        assert!(guide.lines().any(|l| l.starts_with("## ") && l.contains(s)), "docs/GUIDE.md has no section {s:?}");
    }
}

#[test]
fn quick_start_and_the_python_line_count() {
    let dir = scratch("readme-quick");
    let all = blocks_of_docs();
    // The build is the test harness's; target/release/mtrace is the one under test.
    let cmd = block(&all, "cc -g ctests/families.c").text.trim().to_owned();
    let cmd =
        cmd.trim_start_matches("cargo build --release --workspace && ").replace("target/release/mtrace", "mtrace");
    let (out, code) = sh(&repo(), &cmd);
    assert_eq!(code, Some(0), "{out}");
    shows(&out, &block(&all, "mtrace report for /tmp/families").text, "quick start");
    // "`mtrace run -- /usr/bin/python3 -c 'print(1)' 2>&1 | wc -l` says 18".
    let text = readme().replace('\n', " ");
    let (cmd, rest) = text.split_once("` says ").map(|(a, b)| (a.rsplit_once('`').unwrap().1, b)).unwrap();
    assert!(cmd.ends_with("| wc -l"), "{cmd}");
    let said: u32 = rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap();
    let (out, _) = sh(&dir, cmd);
    assert_eq!(out.trim().parse::<u32>().unwrap(), said, "README: `{cmd}` says {said}");
}

#[test]
fn manual_pages_and_completions_on_a_fresh_home() {
    let dir = scratch("readme-man");
    let _ = std::fs::remove_dir_all(dir.join("home"));
    let all = blocks_of_docs();
    for cmd in block(&all, "mtrace manpage").text.lines() {
        let (out, code) = sh(&dir, cmd);
        assert_eq!(code, Some(0), "{cmd}: {out}");
    }
    let home = dir.join("home/.local/share");
    assert!(home.join("man/man1/mtrace-report.1").is_file());
    let bash = std::fs::read_to_string(home.join("bash-completion/completions/mtrace")).unwrap();
    assert!(bash.contains("complete") && bash.contains("mtrace"), "{bash}");
}

#[test]
fn the_process_tree_of_a_shell_pipeline() {
    let dir = scratch("readme-tree");
    build("families.c", &dir.join("static_prog"), &["-g", "-O0", "-static"]);
    let all = blocks_of_docs();
    let shown = &block(&all, "Processes traced (").text;
    // The program is the first node's command line.
    let script = shown.lines().nth(1).unwrap().split_once(" sh -c '").unwrap().1.split_once("': ").unwrap().0;
    let (out, code) = sh(&dir, &format!("mtrace run -- sh -c '{script}'"));
    assert_eq!(code, Some(3), "{out}");
    // The pipeline's processes start in either order: the tree's lines
    // compared as a set, the first (the program's) first.
    let mut want: Vec<String> = shown.lines().map(mask).collect();
    // (The pipeline's own output comes first.)
    let tree = &out[out.find("Processes traced (").unwrap_or_else(|| panic!("{out}"))..];
    let mut got: Vec<String> = tree.lines().take(want.len()).map(mask).collect();
    assert_eq!(got[..2], want[..2], "{out}");
    want.sort();
    got.sort();
    assert_eq!(got, want, "README's tree (right) against the run's (left):\n{out}");
}

#[test]
fn a_double_free_with_where_it_was_freed() {
    let dir = scratch("readme-wrong");
    build("wrong_frees.cpp", &dir.join("wrong_frees"), &["-g", "-O0"]);
    let all = blocks_of_docs();
    let shown = &block(&all, "$ mtrace run -S -- ./wrong_frees double").text;
    let (cmd, shown) = shown.split_once('\n').unwrap();
    let (out, _) = sh(&dir, cmd.trim_start_matches("$ "));
    shows(&out, shown, "wrong frees");
}

#[test]
fn a_plain_preload_then_report() {
    let dir = scratch("readme-preload");
    build("families.c", &dir.join("prog"), &["-g", "-O0"]);
    let all = blocks_of_docs();
    let text = &block(&all, "LD_PRELOAD=/path/to/libmtrace.so").text;
    let mut lines = text.lines();
    let run = lines.next().unwrap().replace("/path/to/libmtrace.so", lib().to_str().unwrap());
    let (out, code) = sh(&dir, &run);
    assert_eq!(code, Some(0), "{run}: {out}");
    // "writes ./prog.<pid>.mtrace": the one trace there.
    let traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name().unwrap().to_string_lossy().starts_with("prog.")
                && p.extension().is_some_and(|e| e == "mtrace")
        })
        .collect();
    assert_eq!(traces.len(), 1, "{traces:?}");
    let pid = traces[0].file_name().unwrap().to_string_lossy().split('.').nth(1).unwrap().to_owned();
    let report = lines.next().unwrap().replace("<pid>", &pid);
    let (out, code) = sh(&dir, &report);
    assert_eq!(code, Some(0), "{report}: {out}");
    assert!(out.starts_with(&format!("mtrace report for {} (pid {pid})", dir.join("prog").display())), "{out}");
    assert!(out.contains("\n  not freed:        945 bytes in 9 blocks\n"), "{out}");
}

/// A kept trace of phases.c (markers one, two, three, end) in `dir`.
fn phases_trace(dir: &Path) -> PathBuf {
    let prog = build("phases.c", &dir.join("phases"), &["-g", "-O0"]);
    kept_trace(dir, "t", &prog, &[])
}

#[test]
fn flamegraphs_pprof_and_markers() {
    let dir = scratch("readme-views");
    let trace = phases_trace(&dir);
    let all = blocks_of_docs();
    let with_trace = |l: &str| l.replace("TRACE", trace.to_str().unwrap());
    // Flamegraphs and folded stacks. The third line's inferno-flamegraph
    // is another project's tool (cargo install inferno): only mtrace's
    // half of its pipe runs here, the folded stacks on standard output.
    let text = &block(&all, "--flamegraph leaks.svg").text;
    for l in text.lines() {
        let cmd = match l.split_once(" | inferno-flamegraph") {
            Some((ours, _)) => with_trace(ours),
            None => with_trace(l),
        };
        let (out, code) = sh(&dir, &cmd);
        assert_eq!(code, Some(0), "{cmd}: {out}");
        if cmd.ends_with("--folded -") {
            assert!(out.lines().any(|l| l.contains("phase_two") && l.ends_with(" 15000")), "{out}");
        }
    }
    assert!(std::fs::read_to_string(dir.join("leaks.svg")).unwrap().contains("<svg"));
    assert!(std::fs::read_to_string(dir.join("calls.folded")).unwrap().contains("main;"));
    // pprof, read by go tool pprof (Debian's golang-go, in scripts/deps).
    if Command::new("go").arg("version").output().map_or(true, |o| !o.status.success()) {
        cannot_run("go is not installed (golang-go)");
    } else {
        build("phases.c", &dir.join("prog"), &["-g", "-O0"]);
        let text = &block(&all, "mtrace run --pprof heap.pb.gz").text;
        let mut outs = Vec::new();
        for l in text.lines() {
            let (out, code) = sh(&dir, l);
            assert_eq!(code, Some(0), "{l}: {out}");
            outs.push(out);
        }
        assert!(outs[1].contains("phase_two"), "{}", outs[1]);
        assert!(outs[2].contains("phase_two") && outs[2].contains("phase_one"), "{}", outs[2]);
    }
    // Markers: listed, and the change between two report points, of
    // steady.c's api mode (report points 1, 2 and 3, markers "first" and
    // "later"). The third line names a marker of the reader's program
    // ("warm"): steady.c's "first".
    let prog = build("steady.c", &dir.join("steady"), &["-g", "-O0"]);
    let trace = kept_trace(&dir, "steady-t", &prog, &["api"]);
    let with_trace = |l: &str| l.replace("TRACE", trace.to_str().unwrap());
    let text = &block(&all, "mtrace report --markers TRACE").text;
    let lines: Vec<&str> = text.lines().collect();
    let (out, code) = sh(&dir, &with_trace(lines[0]));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("     1       ") && out.contains("  first\n"), "{out}");
    let (out, code) = sh(&dir, &with_trace(lines[1]));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("\n  live change:      +680 bytes in +5 blocks\n"), "{out}");
    let (out, code) = sh(&dir, &with_trace(lines[2]).replace(" warm ", " first "));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("  change:           since marker first until the end\n"), "{out}");
}
