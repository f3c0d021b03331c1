//! `--pprof`: the heap profile pprof reads, decoded here from its bytes
//! (gzip, then profile.proto's messages): the leak kinds' bytes per label
//! equal the text report's, and a leak's location names its function and
//! line in the program's mapping.

mod common;
use common::*;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use prost::Message;

#[test]
fn a_heap_profile_with_the_leak_kinds_as_labels() {
    let dir = scratch("pprof");
    let prog = build("scan.c", &dir.join("scan"), &["-g", "-O0"]);
    let m = markers("scan.c");
    let file = dir.join("scan.pb.gz");
    let (r, out) = run_json(&dir, &["--scan", "--pprof", file.to_str().unwrap()], &prog, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&file).unwrap()).read_to_end(&mut bytes).unwrap();
    let p = proto::Profile::decode(&bytes[..]).unwrap();
    let s = |i: i64| p.string_table[i as usize].as_str();
    assert_eq!(s(0), "");
    let types: Vec<String> = p.sample_type.iter().map(|v| format!("{}/{}", s(v.r#type), s(v.unit))).collect();
    assert_eq!(types, ["alloc_objects/count", "alloc_space/bytes", "inuse_objects/count", "inuse_space/bytes"]);
    assert_eq!(s(p.default_sample_type), "inuse_space");
    // In-use objects and bytes per `kind` label: the report's kinds.
    let mut per_kind = std::collections::BTreeMap::<String, (i64, i64)>::new();
    for x in &p.sample {
        for l in &x.label {
            assert_eq!(s(l.key), "kind");
            let e = per_kind.entry(s(l.str).to_owned()).or_default();
            e.0 += x.value[2];
            e.1 += x.value[3];
        }
    }
    for kind in ["definite", "indirect", "possible", "reachable"] {
        let k = &r["kinds"][kind];
        let want = (k["blocks"].as_i64().unwrap(), k["bytes"].as_i64().unwrap());
        assert_eq!(per_kind.get(kind).copied().unwrap_or_default(), want, "{kind}: {per_kind:?}");
    }
    assert_eq!(per_kind["definite"], (4, 113 + 3 * 24));
    // The unaligned leak: one definitely lost block of 113 bytes whose
    // first location's lines name make() at its line, in the program.
    let line = m["unaligned"] as i64;
    let found = p.sample.iter().find(|x| x.value[3] == 113).expect("a sample of the 113-byte block");
    let loc = &p.location[found.location_id[0] as usize - 1];
    let names: Vec<(String, i64)> = loc
        .line
        .iter()
        .map(|l| {
            let f = &p.function[l.function_id as usize - 1];
            (format!("{}:{}", s(f.name), s(f.filename).rsplit('/').next().unwrap()), l.line)
        })
        .collect();
    assert_eq!(names, [("make:scan.c".to_owned(), line)]);
    let map = &p.mapping[loc.mapping_id as usize - 1];
    assert_eq!(std::path::Path::new(s(map.filename)), prog.canonicalize().unwrap());
    assert!(map.memory_start <= loc.address && loc.address < map.memory_limit, "{map:?} {loc:?}");
    assert!(!s(map.build_id).is_empty());
}

/// The profile as pprof itself reads it (`go tool pprof`, Debian's
/// golang-go): the `kind` tag's totals are the report's kinds, and
/// `-list` puts each leak's bytes on its source line.
#[test]
fn go_tool_pprof_reads_the_profile() {
    if Command::new("go").arg("version").output().map_or(true, |o| !o.status.success()) {
        cannot_run("go is not installed (golang-go)");
        return;
    }
    let dir = scratch("pprof-go");
    let prog = build("scan.c", &dir.join("scan"), &["-g", "-O0"]);
    let m = markers("scan.c");
    let file = dir.join("scan.pb.gz");
    let (r, out) = run_json(&dir, &["--scan", "--pprof", file.to_str().unwrap()], &prog, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pprof = |args: &[&str]| {
        let out = Command::new("go")
            .args(["tool", "pprof"])
            .args(args)
            .arg(&prog)
            .arg(&file)
            // Its cache and settings under the test's folder.
            .env("HOME", &dir)
            .env("PPROF_TMPDIR", &dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    // The profile's main mapping is the program (not libc.so.6).
    let top = pprof(&["-top"]);
    assert!(top.starts_with("File: scan\n"), "{top}");
    // "       185.0B (38.54%): definite"
    let tags = pprof(&["-tags"]);
    for kind in ["definite", "indirect", "possible", "reachable"] {
        let bytes = r["kinds"][kind]["bytes"].as_u64().unwrap();
        let line =
            tags.lines().find(|l| l.trim_end().ends_with(&format!(": {kind}"))).unwrap_or_else(|| panic!("{tags}"));
        assert!(line.trim_start().starts_with(&format!("{bytes}.0B ")), "{kind}: {line}");
    }
    // "      113B       113B     22:    void *c = malloc(113); …"
    let list = pprof(&["-list=^make$", "-sample_index=inuse_space"]);
    for (name, bytes) in [("unaligned", 113), ("possible", 112), ("reachable", 111), ("tree_root", 24)] {
        let want = [format!("{bytes}B"), format!("{bytes}B"), format!("{}:", m[name])];
        let found = list.lines().any(|l| l.split_whitespace().take(3).eq(want.iter().map(String::as_str)));
        assert!(found, "{name}: {want:?} in {list}");
    }
}
