//! Sampled recording (`--sample-rate`, docs/SAMPLING.md): the estimates
//! per call site are unbiased and close, a seed repeats a run exactly, a
//! realloc'd block is weighed by its size, and the leak scan of a sampled
//! trace calls lost only what nothing points to.
//!
//! The runs take fixed seeds (`MTRACE_SAMPLE_SEED` 1…20), so the numbers
//! are the same on every machine: the bounds below are the statistics'
//! (each site holds 192 times the rate: one standard deviation of its
//! estimate is about 7%), and the seeds do not pick a lucky sample.

mod common;
use common::*;

use std::collections::HashMap;

use serde_json::Value;

/// The test's rate: 64 KiB.
const RATE: &str = "64K";
/// Bytes each site of ctests/sampled.c holds at exit.
const HELD: f64 = 12.0 * 1024.0 * 1024.0;
/// Its churn allocates this much (the program prints it) …
const CHURN: u64 = 825_147_697;
/// … and the sites this much more (5 × 12 MiB + 640 KiB).
const SITES: u64 = 5 * 12 * 1024 * 1024 + 640 * 1024;

/// Per function of sampled.c: (bytes, blocks) not freed, from `r`.
fn sites(r: &Value) -> HashMap<String, (f64, f64)> {
    leaks_in(r, "sampled.c").into_iter().map(|l| (l.function, (l.bytes as f64, l.blocks as f64))).collect()
}

/// The standard error of the bytes of the entry whose innermost frame in
/// sampled.c is `function`.
fn stderr_of(r: &Value, function: &str) -> f64 {
    let e = r["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["frames"].as_array().unwrap().iter().any(|f| f["function"] == function));
    e.and_then(|e| e.get("stderr")).map_or(0.0, |s| s[0].as_f64().unwrap())
}

fn sampled_run(dir: &std::path::Path, prog: &std::path::Path, seed: u32, args: &[&str]) -> Value {
    let seed = seed.to_string();
    let (r, out) = run_json_env(dir, &[("MTRACE_SAMPLE_SEED", &seed)], &["--sample-rate", RATE], prog, args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(r["summary"]["sample_rate"], 65536, "the report says it is sampled");
    r
}

#[test]
fn estimates_per_call_site_are_unbiased_and_close() {
    let dir = scratch("sampling_accuracy");
    let prog = build("sampled.c", &dir.join("sampled"), &["-g", "-O0"]);
    // Sampled sites: 1, 4, 16 and 48 KiB blocks, 12 MiB each.
    let names = ["site_small", "site_four", "site_sixteen", "site_fortyeight"];
    let sizes = [1024.0, 4096.0, 16384.0, 49152.0];
    let mut sums: HashMap<&str, (f64, f64)> = HashMap::new();
    let (mut tenfold, mut allocated) = (0.0, 0.0);
    // Estimates within two of their standard errors of the truth.
    let mut within_two = 0;
    let runs = 20;
    for seed in 1..=runs {
        let r = sampled_run(&dir, &prog, seed, &[]);
        let s = sites(&r);
        for (name, size) in names.iter().zip(sizes) {
            let (bytes, blocks) = s[*name];
            // The report's error bar: about sqrt(rate/12 MiB) = 7.2% of
            // the estimate (docs/SAMPLING.md), from the sample itself.
            let se = stderr_of(&r, name);
            assert!((0.05..0.10).contains(&(se / bytes)), "seed {seed}: {name} ± {se} of {bytes}");
            within_two += usize::from((bytes - HELD).abs() <= 2.0 * se);
            let e = bytes / HELD - 1.0;
            assert!(e.abs() < 0.25, "seed {seed}: {name} estimated {bytes} bytes, {:+.1}%", e * 100.0);
            let n = blocks / (HELD / size) - 1.0;
            assert!(n.abs() < 0.25, "seed {seed}: {name} estimated {blocks} blocks, {:+.1}%", n * 100.0);
            let t = sums.entry(name).or_default();
            t.0 += bytes;
            t.1 += blocks;
        }
        // Blocks of at least the rate are always recorded: exact.
        assert_eq!(s["site_big"], (HELD, 12.0), "seed {seed}");
        assert_eq!(stderr_of(&r, "site_big"), 0.0, "seed {seed}");
        let total = r["summary"]["leaked_stderr"][0].as_f64().unwrap();
        assert!(total > 0.0, "seed {seed}: {}", r["summary"]);
        tenfold += s["site_tenfold"].0;
        let all = r["summary"]["bytes_allocated"].as_u64().unwrap() as f64;
        let e = all / (CHURN + SITES) as f64 - 1.0;
        assert!(e.abs() < 0.05, "seed {seed}: {all} bytes allocated, {:+.1}%", e * 100.0);
        allocated += all;
    }
    // A normal estimate is within two standard errors 95% of the time:
    // 76 of 80; at least 70 allows for the error bar's own noise.
    assert!(within_two >= 70, "{within_two} of 80 estimates within two standard errors");
    let n = runs as f64;
    for (name, size) in names.iter().zip(sizes) {
        let (bytes, blocks) = sums[name];
        let e = bytes / n / HELD - 1.0;
        assert!(e.abs() < 0.05, "{name}: mean estimate {:+.2}% off", e * 100.0);
        let b = blocks / n / (HELD / size) - 1.0;
        assert!(b.abs() < 0.05, "{name}: mean block estimate {:+.2}% off", b * 100.0);
    }
    // A site holding 10 times the rate has about 10 samples (a standard
    // deviation of 32% per run): only its mean is close.
    let e = tenfold / n / (640.0 * 1024.0) - 1.0;
    assert!(e.abs() < 0.15, "site_tenfold: mean estimate {:+.2}% off", e * 100.0);
    let e = allocated / n / (CHURN + SITES) as f64 - 1.0;
    assert!(e.abs() < 0.02, "bytes allocated: mean estimate {:+.2}% off", e * 100.0);
}

#[test]
fn a_sampled_pprof_profile_states_its_period_and_the_text_its_rate() {
    use prost::Message;
    use std::io::Read;
    let dir = scratch("sampling_pprof");
    let prog = build("sampled.c", &dir.join("sampled"), &["-g", "-O0"]);
    let file = dir.join("p.pb.gz");
    let text = dir.join("r.txt");
    let out = std::process::Command::new(mtrace())
        .current_dir(&dir)
        .env("MTRACE_SAMPLE_SEED", "3")
        .args(["run", "--no-scan", "--sample-rate", RATE, "--pprof"])
        .arg(&file)
        .arg("-o")
        .arg(&text)
        .arg("--")
        .arg(&prog)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&file).unwrap()).read_to_end(&mut bytes).unwrap();
    let p = proto::Profile::decode(&bytes[..]).unwrap();
    assert_eq!(p.period, 65536);
    let t = p.period_type.as_ref().unwrap();
    assert_eq!((&p.string_table[t.r#type as usize][..], &p.string_table[t.unit as usize][..]), ("space", "bytes"));
    // The values are the estimates the text shows: site_big's 12 MiB exactly.
    let in_use = pprof_in_use(&file);
    let m = markers("sampled.c");
    assert_eq!(in_use.get(&("sampled.c".to_owned(), m["big"])), Some(&(12, 12 << 20)), "{in_use:?}");
    let text = std::fs::read_to_string(&text).unwrap();
    assert!(text.contains("  sampled:          one allocation per 64 KiB allocated, on average"), "{text}");
    assert!(text.contains("by backtrace (6 backtraces; estimated from samples):"), "{text}");
}

#[test]
fn a_seed_repeats_a_run_and_reallocs_are_weighed_by_their_size() {
    let dir = scratch("sampling_seed");
    let prog = build("sampled.c", &dir.join("sampled"), &["-g", "-O0"]);
    // Bytes: the blocks' weights follow from their sizes alone. (An
    // estimated block count is rounded up or down by the block's time,
    // which differs between runs.)
    let bytes = |s: HashMap<String, (f64, f64)>| -> Vec<(String, f64)> {
        let mut v: Vec<_> = s.into_iter().map(|(f, (b, _))| (f, b)).collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let a = bytes(sites(&sampled_run(&dir, &prog, 7, &[])));
    let b = bytes(sites(&sampled_run(&dir, &prog, 7, &[])));
    assert_eq!(a, b, "the same seed samples the same blocks");
    let c = bytes(sites(&sampled_run(&dir, &prog, 8, &[])));
    assert_ne!(a, c, "another seed, other samples");
    // Each 4 KiB block of site_four grown from 1 KiB by realloc: the 1 KiB
    // blocks are all freed, the 4 KiB ones are picked by their own size.
    let mut sum = 0.0;
    for seed in 1..=10 {
        let s = sites(&sampled_run(&dir, &prog, seed, &["realloc"]));
        let (bytes, _) = s["site_four"];
        let e = bytes / HELD - 1.0;
        assert!(e.abs() < 0.25, "seed {seed}: grown blocks estimated {bytes} bytes, {:+.1}%", e * 100.0);
        sum += bytes;
    }
    let e = sum / 10.0 / HELD - 1.0;
    assert!(e.abs() < 0.05, "grown blocks: mean estimate {:+.2}% off", e * 100.0);
}

#[test]
fn the_scan_of_a_sampled_trace_calls_lost_only_what_nothing_points_to() {
    let dir = scratch("sampling_scan");
    let prog = build("sampled_scan.c", &dir.join("sampled_scan"), &["-g", "-O0"]);
    let m = markers("sampled_scan.c");
    let (r, out) = run_json_env(
        &dir,
        &[("MTRACE_SAMPLE_SEED", "1")],
        &["--scan", "--show-reachable", "--sample-rate", RATE],
        &prog,
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let kinds: Vec<(String, u64, u32)> = {
        let mut v: Vec<_> = r["stacks"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| {
                let line = line_in(e, "sampled_scan.c")? as u32;
                Some((e["kind"].as_str()?.to_owned(), e["bytes"].as_u64()?, line))
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        kinds,
        vec![
            ("definite".into(), 200_000, m["lost"]),
            ("indirect".into(), 100_000, m["lost_child"]),
            // Its holder was not sampled and is kept: its memory is a root.
            ("reachable".into(), 120_000, m["kept"]),
            ("reachable".into(), 150_000, m["held"]),
            // Its holder was not sampled and is lost: the scan cannot tell.
            ("reachable".into(), 170_000, m["behind"]),
        ]
    );
    // Recorded exactly, the lost holder makes the block behind it lost.
    let (exact, _) = run_json(&dir, &["--scan", "--show-reachable"], &prog, &[]);
    let behind = exact["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| line_in(e, "sampled_scan.c") == Some(m["behind"] as u64))
        .unwrap();
    assert_eq!(behind["kind"], "indirect");
}

#[test]
fn the_ptrace_tracer_samples_by_the_same_rule() {
    let dir = scratch("sampling_ptrace");
    let prog = build("sampled.c", &dir.join("sampled"), &["-g", "-O0"]);
    let bytes = |extra: &[&str], prog: &std::path::Path| -> Vec<(String, i64)> {
        let mut args = vec!["--sample-rate", RATE];
        args.extend_from_slice(extra);
        let (r, out) = run_json_env(&dir, &[("MTRACE_SAMPLE_SEED", "5")], &args, prog, &["small"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(r["summary"]["sample_rate"], 65536);
        let mut v: Vec<_> = leaks_in(&r, "sampled.c").into_iter().map(|l| (l.function, l.bytes)).collect();
        v.sort();
        v
    };
    // One thread, the same allocations in the same order, the same seed:
    // breakpoints sample exactly the blocks the preload does. (Under
    // uprobes the kernel may drop events, and with them count-down steps.)
    let preload = bytes(&[], &prog);
    assert_eq!(bytes(&["--ptrace", "--hooks", "breakpoints"], &prog), preload);
    assert!(preload.contains(&("site_big".into(), 2 << 20)), "{preload:?}");
    // A static build: glibc's start-up allocates too, so other blocks are
    // picked; the large ones are exact all the same.
    let stat = build("sampled.c", &dir.join("sampled_static"), &["-g", "-O0", "-static"]);
    let s = bytes(&["--ptrace", "--hooks", "breakpoints"], &stat);
    assert!(s.contains(&("site_big".into(), 2 << 20)), "{s:?}");
    let held: i64 = s.iter().filter(|(f, _)| f != "site_big" && f != "site_tenfold").map(|x| x.1).sum();
    // Four sites of 768 KiB each in this mode, estimated from about 48
    // samples (a standard deviation of 14%; the start-up's allocations
    // depend on the environment, so the bound is wide): unweighted, the
    // samples alone would be 2% of it.
    let truth = 4.0 * 786_432.0;
    assert!((held as f64 / truth - 1.0).abs() < 0.5, "{s:?}");
}
