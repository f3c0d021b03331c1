//! Bad input: a missing, empty, foreign, truncated or corrupt trace gives a
//! one-line error naming the file (and offset), and whatever could be read
//! is still reported.

mod common;
use common::*;
use std::process::Command;

fn report(trace: &std::path::Path, json: bool) -> std::process::Output {
    let mut c = Command::new(mtrace());
    c.arg("report").arg(trace);
    if json {
        c.arg("--json");
    }
    c.output().unwrap()
}

/// A real trace of realloc.c, and the offsets where its records start.
fn sample(dir: &std::path::Path) -> (Vec<u8>, Vec<u64>) {
    let prog = build("realloc.c", &dir.join("realloc"), &["-g", "-O0"]);
    let tdir = dir.join("t");
    run_json(dir, &["--trace-dir", tdir.to_str().unwrap()], &prog, &[]);
    let (path, _) = traces(&tdir).pop().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut r = mtrace_format::Reader::new(&bytes[..]);
    r.header().unwrap();
    let mut starts = vec![];
    loop {
        let at = r.offset();
        if r.next_record().unwrap().is_none() {
            break;
        }
        starts.push(at);
    }
    (bytes, starts)
}

#[test]
fn missing_empty_and_foreign_files() {
    let dir = scratch("badinput");
    let missing = dir.join("nope.mtrace");
    let out = report(&missing, false);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1);
    assert!(err.contains("nope.mtrace: cannot open"), "{err}");

    let empty = dir.join("empty.mtrace");
    std::fs::write(&empty, b"").unwrap();
    let err = String::from_utf8_lossy(&report(&empty, false).stderr).into_owned();
    assert!(err.contains("empty.mtrace") && err.contains("empty file"), "{err}");

    let foreign = dir.join("foreign.mtrace");
    std::fs::write(&foreign, b"@ ./prog:[0x401136] + 0x4052a0 0x64\n").unwrap();
    let out = report(&foreign, false);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an mtrace trace"));
}

#[test]
fn truncated_trace_reports_what_was_read() {
    let dir = scratch("truncated");
    let (bytes, starts) = sample(&dir);
    // Cut inside the last-but-two record: everything before it is reported.
    let cut_record = starts[starts.len() - 3];
    let cut = dir.join("cut.mtrace");
    std::fs::write(&cut, &bytes[..cut_record as usize + 1]).unwrap();
    let out = report(&cut, true);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cut.mtrace") && err.contains(&format!("ends at byte {cut_record}")), "{err}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["summary"]["truncated"], true);
    assert!(r["summary"]["allocations"].as_u64().unwrap() >= 3);
    // Text mode says so too.
    let text = String::from_utf8_lossy(&report(&cut, false).stdout).into_owned();
    assert!(text.contains("WARNING") && text.contains("truncated"), "{text}");
}

#[test]
fn every_prefix_of_a_trace_reads_without_panic() {
    let dir = scratch("prefixes");
    let (bytes, _) = sample(&dir);
    let p = dir.join("prefix.mtrace");
    for len in (0..bytes.len()).step_by(7) {
        std::fs::write(&p, &bytes[..len]).unwrap();
        let out = report(&p, false);
        let code = out.status.code();
        let stdout = String::from_utf8_lossy(&out.stdout);
        match code {
            // Ends on a record boundary: readable, but says it is incomplete.
            Some(0) => assert!(stdout.contains("no end record"), "len {len}: {stdout}"),
            Some(1) | Some(2) => {}
            _ => panic!("len {len}: {code:?} {}", String::from_utf8_lossy(&out.stderr)),
        }
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"), "len {len}");
    }
}

#[test]
fn corrupt_record_names_its_offset() {
    let dir = scratch("corrupt");
    let (mut bytes, starts) = sample(&dir);
    let at = starts[starts.len() / 2];
    bytes[at as usize] = 0xee;
    let p = dir.join("corrupt.mtrace");
    std::fs::write(&p, &bytes).unwrap();
    let out = report(&p, false);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("corrupt record at byte {at}")) && err.contains("unknown record tag 238"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("mtrace report for"));
}
