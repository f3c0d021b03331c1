//! The command line as a newcomer types it (issue 42): valgrind's and
//! glibc's habits, mistakes and bad input are answered at once, before a
//! program runs, with what mtrace calls the thing.

mod common;
use common::*;

use std::process::{Command, Output};

fn mtrace_with(args: &[&str]) -> Output {
    Command::new(mtrace()).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A file that says it ran, to check a refused command ran nothing.
fn witness(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let f = dir.join("ran");
    let _ = std::fs::remove_file(&f);
    let script = format!("echo > {}", f.display());
    (f, script)
}

/// The trace of `prog` run in `dir` (kept there), and its JSON report.
fn trace_of(dir: &std::path::Path, prog: &std::path::Path) -> (std::path::PathBuf, serde_json::Value) {
    let out = Command::new(mtrace())
        .args(["run", "--no-scan", "--keep-traces", "--trace-dir"])
        .arg(dir)
        .args(["-o", "/dev/null", "--"])
        .arg(prog)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    traces(dir).pop().unwrap()
}

#[test]
fn unknown_options_are_refused_not_run() {
    let dir = scratch("cli-options");
    let (ran, script) = witness(&dir);
    for (args, hint) in [
        (vec!["--bogus"], None),
        (vec!["--jsn"], Some("a similar argument exists: '--json'")),
        (vec!["--leak-check=full"], Some("mtrace: --leak-check: mtrace checks for leaks by default")),
        (vec!["--leak-check=no"], Some("--no-scan")),
        (vec!["--show-leak-kinds=all"], Some("--show-reachable adds the still reachable ones")),
        (vec!["--track-origins=yes"], Some("not applicable")),
        (vec!["-s"], None),
    ] {
        let mut all = vec!["run"];
        all.extend(&args);
        all.extend(["--", "sh", "-c", &script]);
        let o = mtrace_with(&all);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("error: unexpected argument '{}'", args[0].split('=').next().unwrap())),
            "{err}"
        );
        if let Some(h) = hint {
            assert!(err.contains(h), "{args:?}: {err}");
        }
        // mtrace's own answer to valgrind's spellings, not clap's guess
        // (it offered --leak-check-heuristics for --leak-check=full).
        if hint.is_some_and(|h| h.starts_with("mtrace: ")) || args[0].starts_with("--leak-check=") {
            assert!(!err.contains("similar argument") && !err.contains("tip:"), "{args:?}: {err}");
        }
        assert!(!ran.exists(), "{args:?} ran the program");
    }
    // The program's own options after its name are its own.
    let o = Command::new(mtrace())
        .args(["run", "--no-scan", "-o", "/dev/null", "/bin/echo", "-n", "--json"])
        .output()
        .unwrap();
    assert_eq!((o.status.code(), String::from_utf8_lossy(&o.stdout).as_ref()), (Some(0), "--json"));
}

#[test]
fn the_glibc_form_is_taken_only_for_a_glibc_log() {
    let dir = scratch("cli-glibc");
    let prog = build("grow.c", &dir.join("grow"), &["-g", "-O0"]);
    let p = prog.to_str().unwrap();
    // `mtrace ./leaks`: a program, to be traced.
    let o = mtrace_with(&[p]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), format!("mtrace: {p} is a program: to trace it, mtrace run -- {p}\n"));
    let o = mtrace_with(&[p, "an arg"]);
    assert_eq!(
        stderr(&o),
        format!(
            "mtrace: an arg: no such file (glibc's form: mtrace PROG LOG)\n\
             mtrace: {p} is a program: to trace it, mtrace run -- {p} 'an arg'\n"
        )
    );
    // A trace of mtrace's, to be reported.
    let (trace, _) = trace_of(&dir, &prog);
    let t = trace.to_str().unwrap();
    let o = mtrace_with(&[t]);
    assert_eq!(
        (o.status.code(), stderr(&o)),
        (Some(2), format!("mtrace: {t} is an mtrace trace: to read it, mtrace report {t}\n"))
    );
    // A mistyped subcommand: clap's suggestion.
    let o = mtrace_with(&["repot", t]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unrecognized subcommand 'repot'") && stderr(&o).contains("'report'"),
        "{}",
        stderr(&o)
    );
    // Any other file: both ways out.
    let other = dir.join("notes.txt");
    std::fs::write(&other, "hello\n").unwrap();
    let o = mtrace_with(&[other.to_str().unwrap()]);
    assert!(
        stderr(&o).contains("neither glibc's malloc trace log") && stderr(&o).contains("mtrace run -- PROG"),
        "{}",
        stderr(&o)
    );
    // Every subcommand is a subcommand, also beside a program of its name
    // (said "keep: no such file (glibc's form...)" when the list of
    // names was typed again and lacked `keep` and `cut`).
    for sub in ["keep", "cut", "report"] {
        std::fs::copy(&prog, dir.join(sub)).unwrap();
        let o = std::process::Command::new(mtrace()).current_dir(&dir).args([sub, "--help"]).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{sub}: {}", stderr(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("Usage: mtrace {sub} ")), "{sub}");
    }
    // A real log is still read (input.rs checks the table).
    let log = dir.join("trace.log");
    std::fs::write(&log, "= Start\n= End\n").unwrap();
    let o = mtrace_with(&[log.to_str().unwrap()]);
    assert_eq!((o.status.code(), String::from_utf8_lossy(&o.stdout).as_ref()), (Some(0), "No memory leaks.\n"));
}

#[test]
fn intervals_are_bounded() {
    let dir = scratch("cli-intervals");
    let prog = build("grow.c", &dir.join("grow"), &["-g", "-O0"]);
    let (trace, r) = trace_of(&dir, &prog);
    let t = trace.to_str().unwrap();
    let o = mtrace_with(&["report", "--intervals", "0s", t]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("a window must be longer than 0"), "{}", stderr(&o));
    // 1 ns on a run of milliseconds: 1,000 windows, said so.
    let o = mtrace_with(&["report", "--json", "--intervals", "1ns", t]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let x = &j["intervals"];
    let run_ns = r["summary"]["duration_ns"].as_u64().unwrap();
    assert!(run_ns > 1000, "{run_ns}");
    assert_eq!(x["asked_ns"], 1);
    assert!(x["windows"].as_u64().unwrap() <= 1000 && x["windows"].as_u64().unwrap() >= 500, "{x}");
    let o = mtrace_with(&["report", "--intervals", "1ns", t]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("(intervals of 0.000 s would be more than 1,000: widened to "), "{text}");
    // Rates with thousands separators (issue 42, item 10).
    let bps = x["stacks"][0]["bytes_per_s"].as_f64().unwrap().round() as u64;
    assert!(bps >= 1000, "{x}");
    let digits = bps.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    assert!(text.contains(&format!(" intervals, {grouped} bytes/s, ")), "{grouped}: {text}");
    // A window the run allows is kept.
    let o = mtrace_with(&["report", "--json", "--intervals", "10s", t]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (j["intervals"]["asked_ns"].clone(), j["intervals"]["windows"].clone()),
        (serde_json::Value::Null, 1.into())
    );
}

#[test]
fn bad_suppressions_are_refused_before_the_program_runs() {
    let dir = scratch("cli-suppressions");
    let (ran, script) = witness(&dir);
    let valgrinds = dir.join("vg.supp");
    std::fs::write(&valgrinds, "{\n   mine\n   Memcheck:Leak\n   fun:malloc\n}\n").unwrap();
    let missing = dir.join("missing.supp");
    for (file, says) in [
        (&valgrinds, format!("{}:1: valgrind's suppression format; mtrace reads LeakSanitizer's", valgrinds.display())),
        (&missing, format!("{}: cannot read", missing.display())),
    ] {
        for sub in [&["run"][..], &["run", "-i"]] {
            let o = Command::new(mtrace())
                .args(sub)
                .arg("--suppressions")
                .arg(file)
                .args(["--", "sh", "-c", &script])
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
            assert!(stderr(&o).starts_with(&format!("mtrace: {says}")), "{}", stderr(&o));
            assert!(!ran.exists(), "{sub:?} ran the program");
        }
    }
}

#[test]
fn json_of_a_run_needs_a_file_of_its_own() {
    let dir = scratch("cli-json");
    let (ran, script) = witness(&dir);
    let o = mtrace_with(&["run", "--json", "--", "sh", "-c", &script]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).starts_with("mtrace: --json needs -o FILE"), "{}", stderr(&o));
    assert!(!ran.exists());
    // The way the message gives: the JSON alone in the pipe, whatever the
    // program writes to both streams.
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} run --no-scan --json -o /dev/fd/3 -- sh -c 'echo out; echo err >&2' 3>&1 >/dev/null 2>/dev/null",
            mtrace().display()
        ))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("only JSON on the pipe");
    assert_eq!((j["summary"]["truncated"].as_bool(), j["summary"]["error"].is_null()), (Some(false), true), "{j}");
}

#[test]
fn signal_settings_refuse_what_cannot_work() {
    let dir = scratch("cli-signals");
    let run = |env: (&str, &str)| {
        Command::new(mtrace())
            .current_dir(&dir)
            .env(env.0, env.1)
            .args(["run", "--no-scan", "-o", "/dev/null", "--", "/bin/true"])
            .output()
            .unwrap()
    };
    let o = run(("MTRACE_REPORT_SIGNAL", "9"));
    assert!(o.status.success());
    assert_eq!(
        stderr(&o),
        "mtrace: MTRACE_REPORT_SIGNAL=\"9\" is not a signal mtrace can take (USR1, USR2, a number but KILL, STOP, \
         SEGV, BUS, ILL, FPE, ABRT and TRAP; or off); using USR1\n"
    );
    let o = run(("MTRACE_SCAN_SIGNAL", "USR1"));
    assert!(o.status.success());
    assert_eq!(stderr(&o), "mtrace: MTRACE_SCAN_SIGNAL=USR1 is MTRACE_REPORT_SIGNAL's signal too; using off\n");
}

#[test]
fn a_temporary_trace_is_said_to_be_removed() {
    // run's report named a trace file it then removed (issue 65, item 6).
    let out = Command::new(mtrace()).args(["run", "--no-scan", "--", "/bin/true"]).output().unwrap();
    let err = stderr(&out);
    let line = err.lines().find(|l| l.starts_with("  trace:")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.ends_with(" (removed at the end; --keep-traces keeps it)"), "{line}");
    let path = line.trim_start_matches("  trace:").trim().split(" (").next().unwrap();
    assert!(!std::path::Path::new(path).exists(), "{path}");
}

#[test]
fn kept_traces_are_named_on_the_terminal_not_in_the_report() {
    // --keep-traces without --trace-dir keeps the temporary folder: its
    // name goes to the terminal (stderr), the -o report is the report
    // alone (issue 42, item 10).
    let dir = scratch("cli-kept");
    let report = dir.join("r.txt");
    let out = Command::new(mtrace())
        .args(["run", "--no-scan", "--keep-traces", "-o"])
        .arg(&report)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let kept = err.lines().find_map(|l| l.strip_prefix("mtrace: traces kept in ")).unwrap_or_else(|| panic!("{err}"));
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(!text.contains("kept in"), "{text}");
    assert!(text.contains(&format!("\n  trace:            {kept}/true.")), "{text}");
    std::fs::remove_dir_all(kept).unwrap();
}

#[test]
fn a_program_that_cannot_be_started_exits_as_a_shell_would() {
    // 127 for a program not found, 126 for one that cannot run (a shell's,
    // env(1)'s and valgrind's codes), with one line that says why; the
    // same under --ptrace, where it was 127 and "no trace was written",
    // and -i, where the client said the connection ended.
    let dir = scratch("cli-cannot-run");
    let plain = dir.join("plain.txt");
    std::fs::write(&plain, "not a program\n").unwrap();
    let (dir_s, plain_s) = (dir.to_str().unwrap(), plain.to_str().unwrap());
    for mode in [&[][..], &["--ptrace"][..], &["-i"][..]] {
        for (prog, code, why) in [
            ("/nonexistent/prog", 127, "No such file or directory"),
            ("no-such-program-of-mtrace", 127, "No such file or directory"),
            (dir_s, 126, "Permission denied"),
            (plain_s, 126, "Permission denied"),
        ] {
            let mut args = vec!["run", "--no-scan", "-o", "/dev/null"];
            args.extend(mode);
            args.extend(["--", prog]);
            let o = mtrace_with(&args);
            assert_eq!(
                (o.status.code(), stderr(&o)),
                (Some(code), format!("mtrace: cannot run {prog}: {why}\n")),
                "{args:?}"
            );
        }
    }
}

/// The folder of `mtrace: traces kept in DIR` in `err`, and its traces.
fn kept_traces(err: &str) -> Vec<std::path::PathBuf> {
    let kept = err.lines().find_map(|l| l.strip_prefix("mtrace: traces kept in ")).unwrap_or_else(|| panic!("{err}"));
    // Kept for want of the report ("after all": it said they would go).
    let kept = kept.strip_suffix(" after all").unwrap_or_else(|| panic!("{err}"));
    let found: Vec<_> = std::fs::read_dir(kept)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "mtrace"))
        .collect();
    std::fs::remove_dir_all(kept).unwrap();
    found
}

/// A report file that cannot be written never costs the run (issue 65,
/// item 1): refused before the program starts where that can be known;
/// otherwise the text report is printed, the traces are kept and named,
/// and the status is the program's.
#[test]
fn a_report_file_that_cannot_be_written_never_costs_the_run() {
    let dir = scratch("cli-unwritable");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    let (ran, script) = witness(&dir);
    // A folder that is not there: said at once, nothing run.
    for form in ["--html", "--pprof", "--flamegraph", "--folded"] {
        let o = mtrace_with(&["run", "--keep-traces", form, "/nonexistent/x", "--", "sh", "-c", &script]);
        assert_eq!(o.status.code(), Some(2), "{form}");
        assert!(stderr(&o).starts_with("mtrace: /nonexistent/x: the "), "{form}: {}", stderr(&o));
        assert!(stderr(&o).ends_with(" cannot be written there: No such file or directory\n"), "{}", stderr(&o));
        assert!(!ran.exists(), "{form}: the program ran");
    }
    // The folder goes while the program runs: the other forms and the
    // text are written, the traces kept, the program's status returned.
    let gone = dir.join("gone");
    std::fs::create_dir_all(&gone).unwrap();
    let page = gone.join("x.html");
    let profile = dir.join("p.pb.gz");
    let _ = std::fs::remove_file(&profile);
    let o = Command::new(mtrace())
        .current_dir(&dir)
        .args(["run", "--html"])
        .arg(&page)
        .arg("--pprof")
        .arg(&profile)
        .args(["--", "sh", "-c", "rmdir gone && ./families; exit 3"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let err = stderr(&o);
    let said = format!("mtrace: could not write the HTML page: {}: No such file or directory\n", page.display());
    assert!(err.contains(&said), "{err}");
    assert!(profile.is_file(), "{err}");
    let line = err.lines().find(|l| l.contains(" ./families: exit 0; ")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.ends_with(" calls, 945 bytes in 9 blocks not freed"), "{err}");
    assert!(err.contains("\nmtrace report for sh (/usr/bin/dash, pid "), "{err}");
    // sh's, rmdir's and families's.
    assert_eq!(kept_traces(&err).len(), 3, "{err}");
    // The report's own file fails at its end (-o into /proc): the traces
    // are kept, the status is the program's.
    let o = mtrace_with(&["run", "-o", "/proc/version", "--", prog.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("mtrace: /proc/version: the report could not be written: "), "{err}");
    assert_eq!(kept_traces(&err).len(), 1, "{err}");
}
