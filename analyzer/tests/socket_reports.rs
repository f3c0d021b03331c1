//! Report points of a program whose stream goes to a socket (`mtrace run
//! --max-trace-size`, `mtrace keep`): mtrace writes each report where the
//! program asked and answers it, so that `mtrace_report()` and
//! `mtrace_scan()` return 0 with the file written, as they do with a trace
//! file (docs/FORMAT.md "Report points on a socket").

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// The .memlog files named `<prog>-<pid>-<n>.memlog` in `dir`, by n, 1 up.
fn numbered_memlogs(dir: &Path, prog: &str) -> Vec<String> {
    let mut found: Vec<(u64, String)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter_map(|n| {
            let rest = n.strip_prefix(&format!("{prog}-"))?.strip_suffix(".memlog")?;
            let seq = rest.rsplit_once('-')?.1.parse().ok()?;
            Some((seq, std::fs::read_to_string(dir.join(&n)).unwrap()))
        })
        .collect();
    found.sort();
    assert_eq!(found.iter().map(|f| f.0).collect::<Vec<_>>(), (1..=found.len() as u64).collect::<Vec<_>>());
    found.into_iter().map(|f| f.1).collect()
}

#[test]
fn mtrace_report_under_max_trace_size_returns_0_once_mtrace_wrote_it() {
    let dir = scratch("socket_reports_api");
    let prog = build("steady.c", &dir.join("steady"), &["-g", "-O0"]);
    let m = markers("steady.c");
    // steady.c's "api" mode exits 4 when mtrace_report() does not return 0
    // (it returned -1 on a socket: the process has no trace file).
    let out = Command::new(mtrace())
        .current_dir(&dir)
        .args(["run", "--max-trace-size", "1M", "-o"])
        .arg(dir.join("report.txt"))
        .arg("--")
        .arg(&prog)
        .arg("api")
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    let logs = numbered_memlogs(&dir, "steady");
    assert_eq!(logs.len(), 3);
    // What the preload's own reports of a trace file say (reports.rs).
    assert_eq!(memlog_entries(&logs[0]), vec![(320, 5, m["kept"]), (1000, 10, m["steady"])]);
    assert_eq!(memlog_entries(&logs[1]), vec![(-320, -5, m["kept"]), (1000, 10, m["steady"])]);
    assert!(logs[1].contains("change:           since marker 1 until marker 2"), "{}", logs[1]);
    assert_eq!(memlog_entries(&logs[2]), vec![(1000, 10, m["steady"])]);
}

/// The kinds in a scan's memlog of ctests/scan_live.c while it ran:
/// "hidden" (201 bytes) lost, "kept" (202) reachable.
fn assert_scan_live_moment(memlog: &str) {
    assert!(memlog.contains("201 (201 direct, 0 indirect) bytes in 1 block is definitely lost"), "{memlog}");
    assert!(memlog.contains("still reachable: 202 bytes in 1 block"), "{memlog}");
}

#[test]
fn scans_under_max_trace_size_are_written_where_the_program_asked() {
    let dir = scratch("socket_reports_scan");
    let prog = build("scan_live.c", &dir.join("scan_live"), &["-g", "-O0"]);
    // scan_live.c exits 3 when mtrace_scan("api.memlog") does not return 0.
    let out = Command::new(mtrace())
        .current_dir(&dir)
        .env("MTRACE_SCAN_SIGNAL", "USR2")
        .args(["run", "--scan", "--max-trace-size", "1M", "--json", "-o"])
        .arg(dir.join("report.json"))
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    // The signal's scan, report point 1, by its default name; the API's
    // where the program asked (relative to its working directory).
    let signal = numbered_memlogs(&dir, "scan_live");
    assert_eq!(signal.len(), 1);
    assert_scan_live_moment(&signal[0]);
    assert_scan_live_moment(&std::fs::read_to_string(dir.join("api.memlog")).unwrap());
    // At exit the opposite: what the report of the run says.
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["kinds"]["definite"]["bytes"], 202, "{}", r["kinds"]);
    assert_eq!(r["kinds"]["reachable"]["bytes"], 201, "{}", r["kinds"]);
}

#[test]
fn keep_answers_a_program_started_with_ld_preload() {
    let dir = scratch("socket_reports_keep");
    let prog = build("scan_live.c", &dir.join("scan_live"), &["-g", "-O0"]);
    let (sock, kd, work) = (dir.join("k.sock"), dir.join("kept"), dir.join("work"));
    std::fs::create_dir_all(&kd).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    let listen = format!("unix:{}", sock.display());
    let mut keeper = spawn_until(
        Command::new(mtrace()).args(["keep", "--listen", &listen, "--max-trace-size", "1M", "--trace-dir"]).arg(&kd),
        "mtrace keep: listening on",
    );
    let out = Command::new(&prog)
        .current_dir(&work)
        .env("LD_PRELOAD", lib())
        .env("MTRACE_OUTPUT", &listen)
        .env("MTRACE_SCAN_SIGNAL", "USR2")
        .env("MTRACE_SCAN", "1")
        .output()
        .unwrap();
    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(keeper.id() as i32, libc::SIGTERM) };
    assert!(keeper.wait().unwrap().success());
    assert!(out.status.success(), "{:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    let signal = numbered_memlogs(&work, "scan_live");
    assert_eq!(signal.len(), 1);
    assert_scan_live_moment(&signal[0]);
    assert_scan_live_moment(&std::fs::read_to_string(work.join("api.memlog")).unwrap());
}
