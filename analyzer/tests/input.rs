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
    std::fs::write(&foreign, b"hello, not a trace\n").unwrap();
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

#[test]
fn glibc_malloc_trace_logs() {
    let debug_lib = "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0";
    assert!(std::path::Path::new(debug_lib).exists(), "glibc's libc_malloc_debug.so.0 writes MALLOC_TRACE logs");
    let dir = scratch("malloc-trace");
    let prog = build("glibc_mtrace.c", &dir.join("prog"), &["-g", "-O0"]);
    let log = dir.join("trace.log");
    let ok = Command::new(&prog).env("MALLOC_TRACE", &log).env("LD_PRELOAD", debug_lib).status().unwrap();
    assert!(ok.success());
    let m = markers("glibc_mtrace.c");
    // `mtrace PROG LOG`, as with glibc's script: the table, exit status 1.
    let out = Command::new(mtrace()).arg(&prog).arg(&log).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<(u64, String)> = text
        .lines()
        .filter(|l| l.starts_with("0x"))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (
                u64::from_str_radix(w[1].trim_start_matches("0x"), 16).unwrap(),
                w[3].rsplit('/').next().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![(300, format!("glibc_mtrace.c:{}", m["realloc"])), (40, format!("glibc_mtrace.c:{}", m["calloc"]))],
        "{text}"
    );
    assert!(text.contains("(main)"));
    // `mtrace report` reads the log like a trace.
    let r = report_json(&log);
    let mut want = vec![leak(300, 1, "malloc", "main", m["realloc"]), leak(40, 1, "malloc", "main", m["calloc"])];
    want.sort();
    assert_eq!(leaks_in(&r, "glibc_mtrace.c"), want);
    assert_eq!(r["summary"]["allocations"], 4);
    assert_eq!(r["summary"]["frees"], 1);
    // The same addresses and sizes as glibc's own script (libc-devtools).
    if !std::path::Path::new("/usr/bin/mtrace").exists() {
        cannot_run("glibc's mtrace script (libc-devtools) is not installed");
    } else {
        let glibc = Command::new("perl").arg("/usr/bin/mtrace").arg(&prog).arg(&log).output().unwrap();
        let theirs: Vec<String> = String::from_utf8_lossy(&glibc.stdout)
            .lines()
            .filter(|l| l.starts_with("0x"))
            .map(|l| l.split("  at ").next().unwrap().to_owned())
            .collect();
        let ours: Vec<String> =
            text.lines().filter(|l| l.starts_with("0x")).map(|l| l.split("  at ").next().unwrap().to_owned()).collect();
        assert_eq!(ours, theirs);
        assert_eq!(glibc.status.code(), Some(1));
    }
}

/// A trace of `records` after a header, written by the format crate.
fn crafted(dir: &std::path::Path, name: &str, records: &[mtrace_format::Record]) -> std::path::PathBuf {
    let mut out = Vec::new();
    let h = mtrace_format::Header { pointer_size: 8, arch: "x86_64".into(), pid: 1, ..Default::default() };
    mtrace_format::encode_header(&mut out, &h);
    let mut enc = mtrace_format::Encoder::new();
    enc.encode(&mut out, &mtrace_format::Record::Thread { tid: 1, time_ns: 0 });
    for r in records {
        enc.encode(&mut out, r);
    }
    let p = dir.join(name);
    std::fs::write(&p, out).unwrap();
    p
}

#[test]
fn crafted_sizes_and_end_signals_neither_wrap_nor_panic() {
    use mtrace_format::{Family, Record};
    let dir = scratch("crafted");
    let alloc = |addr, size| Record::Alloc { time_ns: 1, family: Family::Malloc, addr, size, stack: 0, align: 0 };
    let end = Record::End { time_ns: 2, reason: mtrace_format::EndReason::Exit(Some(0)) };
    let huge = crafted(&dir, "huge.mtrace", &[alloc(0x10, 1 << 63), alloc(0x20, 1 << 63), alloc(0x30, u64::MAX), end]);
    let out = report(&huge, true);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &r["summary"];
    assert_eq!((s["leaked_bytes"].as_i64(), s["leaked_blocks"].as_i64()), (Some(i64::MAX), Some(3)), "{s}");
    assert_eq!(s["bytes_allocated"].as_u64(), Some(u64::MAX), "{s}");
    let text = String::from_utf8_lossy(&report(&huge, false).stdout).into_owned();
    assert!(!text.contains("-"), "{text}");
    // An End record with signal 2^63: corrupt, reported at its offset.
    let sig = crafted(&dir, "sig.mtrace", &[Record::End { time_ns: 2, reason: mtrace_format::EndReason::Signal(9) }]);
    let mut bytes = std::fs::read(&sig).unwrap();
    // The signal argument is the last varint: 9 becomes 2^63.
    bytes.pop();
    mtrace_format::put_varint(&mut bytes, 1 << 63);
    std::fs::write(&sig, &bytes).unwrap();
    let out = report(&sig, false);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("corrupt"), "{}", String::from_utf8_lossy(&out.stderr));
}
