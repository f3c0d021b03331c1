//! Streams of other machines: a 32-bit big-endian target's stream reads as
//! a native one, and frames in a PowerPC executable symbolize with the
//! host's copy of it (built with Debian's cross compiler when there is one).

mod common;
use common::*;

use mtrace_format::{EndReason, Family, Header, Module, Record, Segment};
use object::{Object, ObjectSegment, ObjectSymbol};
use std::process::Command;

/// A stream of `records` after `header`.
fn stream(header: &Header, records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    mtrace_format::encode_header(&mut out, header);
    let mut enc = mtrace_format::Encoder::new();
    for r in records {
        enc.encode(&mut out, r);
    }
    out
}

#[test]
fn a_32_bit_big_endian_stream_reads_as_the_native_one() {
    let dir = scratch("cross-be");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    let tdir = dir.join("t");
    let (native, _) = run_json(&dir, &["--trace-dir", tdir.to_str().unwrap()], &prog, &[]);
    let (path, _) = traces(&tdir).pop().unwrap();
    // The same records under a PowerPC header.
    let bytes = std::fs::read(&path).unwrap();
    let mut r = mtrace_format::Reader::new(&bytes[..]);
    let mut h = r.header().unwrap();
    let mut recs = vec![];
    while let Some(rec) = r.next_record().unwrap() {
        recs.push(rec);
    }
    (h.pointer_size, h.big_endian, h.arch) = (4, true, "powerpc".into());
    let foreign = dir.join("foreign.mtrace");
    std::fs::write(&foreign, stream(&h, &recs)).unwrap();
    let r = report_json(&foreign);
    assert_eq!(leaks_in(&r, "families.c"), leaks_in(&native, "families.c"));
    assert_eq!(r["summary"]["leaked_bytes"], native["summary"]["leaked_bytes"]);
}

#[test]
fn frames_in_a_powerpc_executable_symbolize() {
    let Ok(out) = Command::new("powerpc-linux-gnu-gcc").arg("--version").output() else {
        cannot_run("no powerpc-linux-gnu-gcc (Debian's gcc-powerpc-linux-gnu)");
        return;
    };
    assert!(out.status.success());
    let dir = scratch("cross-ppc");
    let exe = build_with("powerpc-linux-gnu-gcc", "families.c", &dir.join("families-ppc"), &["-g", "-O0"]);
    let data = std::fs::read(&exe).unwrap();
    let elf = object::File::parse(&*data).unwrap();
    assert!(!elf.is_little_endian() && !elf.is_64());
    let main = elf.symbols().find(|s| s.name() == Ok("main")).unwrap().address();
    let segments =
        elf.segments().map(|s| Segment { vaddr: s.address(), memsz: s.size(), flags: 5 }).collect::<Vec<_>>();
    let bias = 0x1000_0000u64;
    // A return address 16 bytes into main: the oracle is binutils' own
    // addr2line on the instruction before it.
    let ret = main + 16;
    let oracle = Command::new("powerpc-linux-gnu-addr2line")
        .args(["-f", "-e"])
        .arg(&exe)
        .arg(format!("{:#x}", ret - 1))
        .output()
        .unwrap();
    let oracle = String::from_utf8_lossy(&oracle.stdout).into_owned();
    let mut lines = oracle.lines();
    let (func, at) = (lines.next().unwrap().to_owned(), lines.next().unwrap().to_owned());
    let line: u64 = at.rsplit(':').next().unwrap().split(' ').next().unwrap().parse().unwrap();
    let h = Header {
        pointer_size: 4,
        big_endian: true,
        arch: "powerpc".into(),
        pid: 42,
        exe: exe.display().to_string(),
        ..Header::default()
    };
    let module = Module { path: exe.display().to_string(), bias, build_id: vec![], segments };
    let recs = [
        Record::Thread { tid: 42, time_ns: 0 },
        Record::Modules { time_ns: 0, modules: vec![module] },
        Record::Stack { id: 1, frames: vec![bias + ret] },
        Record::Alloc { time_ns: 1, family: Family::Malloc, addr: 0x2000_0000, size: 64, stack: 1, align: 0 },
        Record::End { time_ns: 2, reason: EndReason::Exit(Some(0)) },
    ];
    let trace = dir.join("ppc.mtrace");
    std::fs::write(&trace, stream(&h, &recs)).unwrap();
    let r = report_json(&trace);
    let f = &r["stacks"][0]["frames"][0];
    assert_eq!(f["function"], func.as_str(), "{r}");
    assert_eq!(f["line"].as_u64(), Some(line), "{r}");
    assert!(f["file"].as_str().unwrap().ends_with("families.c"), "{r}");
}

#[test]
fn the_scan_of_a_32_bit_big_endian_target_reads_its_words() {
    // Three 16-byte blocks; the stack holds, as 4-byte big-endian words, a
    // pointer to the first, one 4 bytes inside the third, and garbage.
    let dir = scratch("cross-be-scan");
    let prog = build("families.c", &dir.join("families"), &["-g", "-O0"]);
    let tdir = dir.join("t");
    run_json(&dir, &["--trace-dir", tdir.to_str().unwrap()], &prog, &[]);
    let (path, _) = traces(&tdir).pop().unwrap();
    let mut h = mtrace_format::Reader::new(std::fs::File::open(&path).unwrap()).header().unwrap();
    (h.pointer_size, h.big_endian, h.arch) = (4, true, "powerpc".into());
    let (a, b, c) = (0x2000_0000u64, 0x2000_0100u64, 0x2000_0200u64);
    let mut words = Vec::new();
    for w in [a as u32, c as u32 + 4, 0xdead_beef] {
        words.extend_from_slice(&w.to_be_bytes());
    }
    let alloc = |time_ns, addr| Record::Alloc { time_ns, family: Family::Malloc, addr, size: 16, stack: 1, align: 0 };
    let recs = [
        Record::Thread { tid: 7, time_ns: 1 },
        Record::Stack { id: 1, frames: vec![0x1000_0010] },
        alloc(10, a),
        alloc(20, b),
        alloc(30, c),
        Record::ScanRegion { time_ns: 40, kind: mtrace_format::region_kind::STACK, addr: 0x7ff0_0000, bytes: words },
        Record::ScanEnd { time_ns: 40 },
        Record::End { time_ns: 50, reason: EndReason::Exit(Some(0)) },
    ];
    let foreign = dir.join("scan.mtrace");
    std::fs::write(&foreign, stream(&h, &recs)).unwrap();
    let r = report_json(&foreign);
    let k = &r["kinds"];
    let got: Vec<(u64, u64)> = ["definite", "indirect", "possible", "reachable"]
        .iter()
        .map(|n| (k[n]["bytes"].as_u64().unwrap(), k[n]["blocks"].as_u64().unwrap()))
        .collect();
    assert_eq!(got, [(16, 1), (0, 0), (16, 1), (16, 1)], "{r:#}");
}
