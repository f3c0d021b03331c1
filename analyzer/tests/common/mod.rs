//! Helpers for the end-to-end tests: build a ctests program, run it under
//! `mtrace run`, and read the JSON report.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn mtrace() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_mtrace"))
}

/// libmtrace.so, built by `cargo build --workspace` next to the binary.
pub fn lib() -> PathBuf {
    let p = mtrace().with_file_name("libmtrace.so");
    assert!(p.is_file(), "{} missing: run `cargo build --workspace` before the tests", p.display());
    p
}

/// A check that cannot run on this machine: under CI (`CI` set, as
/// .ci/run sets it) a failure, since a check must never pass by skipping
/// there; elsewhere a line saying it skipped and what provides it.
pub fn cannot_run(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{why}: under CI every check runs (scripts/deps installs what they need)"
    );
    eprintln!("skipped: {why} (scripts/deps installs it)");
}

/// Whether `tool --version` runs here; [`cannot_run`] when it does not.
pub fn has(tool: &str) -> bool {
    let ok = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        cannot_run(&format!("{tool} is not installed"));
    }
    ok
}

pub fn ctests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ctests").canonicalize().unwrap()
}

/// A fresh folder for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles `ctests/<src>` into `out` (g++ for .cpp) with `flags`.
pub fn build(src: &str, out: &Path, flags: &[&str]) -> PathBuf {
    let path = ctests_dir().join(src);
    let cxx = src.ends_with(".cpp");
    let status = Command::new(if cxx { "g++" } else { "cc" })
        .args(flags)
        .arg("-pthread")
        .arg(&path)
        .arg("-o")
        .arg(out)
        .arg("-ldl")
        .status()
        .expect("a C compiler");
    assert!(status.success(), "compiling {src} failed");
    out.to_owned()
}

/// Compiles `ctests/<src>` with `compiler` (a cross compiler, musl-gcc)
/// and `flags` into `out`, which it returns.
pub fn build_with(compiler: &str, src: &str, out: &Path, flags: &[&str]) -> PathBuf {
    let status = Command::new(compiler)
        .args(flags)
        .arg(ctests_dir().join(src))
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("{compiler}: {e}"));
    assert!(status.success(), "compiling {src} with {compiler} failed");
    out.to_owned()
}

/// Compiles `ctests/<src>` into the shared library `out` (-g -O0).
pub fn build_lib(src: &str, out: &Path) -> PathBuf {
    let status = Command::new("cc")
        .args(["-g", "-O0", "-shared", "-fPIC", "-o"])
        .arg(out)
        .arg(ctests_dir().join(src))
        .status()
        .expect("a C compiler");
    assert!(status.success(), "compiling {src} failed");
    out.to_owned()
}

/// `@leak:NAME` markers of a ctests source: NAME → line number.
pub fn markers(src: &str) -> HashMap<String, u32> {
    let text = std::fs::read_to_string(ctests_dir().join(src)).unwrap();
    let mut m = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(pos) = line.find("@leak:") {
            let name: String = line[pos + 6..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            m.insert(name, i as u32 + 1);
        }
    }
    m
}

/// Runs `mtrace run --json -o REPORT [extra] -- prog args` in `dir`.
pub fn run_json(dir: &Path, extra: &[&str], prog: &Path, args: &[&str]) -> (Value, Output) {
    run_json_env(dir, &[], extra, prog, args)
}

/// The trace of `mtrace run -- prog args` kept in `dir/name` (emptied first).
pub fn kept_trace(dir: &Path, name: &str, prog: &Path, args: &[&str]) -> PathBuf {
    let tdir = dir.join(name);
    let _ = std::fs::remove_dir_all(&tdir);
    run_json(dir, &["--trace-dir", tdir.to_str().unwrap()], prog, args);
    traces(&tdir).pop().unwrap().0
}

/// The text report of `mtrace run extra… -o dir/report.txt -- prog args`
/// run in `dir`, which must succeed.
pub fn run_text(dir: &Path, extra: &[&str], prog: &Path, args: &[&str]) -> String {
    let report = dir.join("report.txt");
    let out = Command::new(mtrace())
        .current_dir(dir)
        .arg("run")
        .args(extra)
        .arg("-o")
        .arg(&report)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(&report).unwrap()
}

/// [`run_json`] with extra environment variables for mtrace and the program.
/// Without `--scan` or `--error-exitcode` in `extra`, the run has no leak
/// scan (`--no-scan`): the report lists every block not freed.
pub fn run_json_env(dir: &Path, env: &[(&str, &str)], extra: &[&str], prog: &Path, args: &[&str]) -> (Value, Output) {
    let report = dir.join("report.json");
    let scan = extra.iter().any(|a| ["--scan", "--error-exitcode", "--no-scan"].contains(a));
    let out = Command::new(mtrace())
        .current_dir(dir)
        .envs(env.iter().copied())
        .arg("run")
        .arg("--json")
        .arg("-o")
        .arg(&report)
        .args(if scan { None } else { Some("--no-scan") })
        .args(extra)
        .arg("--")
        .arg(prog)
        .args(args)
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("no report ({e}); stderr: {}", String::from_utf8_lossy(&out.stderr)));
    (serde_json::from_str(&text).unwrap(), out)
}

/// `mtrace attach PID --duration DURATION --json -o REPORT`: asserts that
/// it succeeded (`what` names the attach in the message) and returns the
/// report.
pub fn attach_for(pid: u32, duration: &str, report: &Path, what: &str) -> Value {
    let out = Command::new(mtrace())
        .args(["attach", &pid.to_string(), "--duration", duration, "--json", "-o"])
        .arg(report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap()
}

/// `mtrace report --json TRACE`.
pub fn report_json(trace: &Path) -> Value {
    let out = Command::new(mtrace()).arg("report").arg("--json").arg(trace).output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// A report's JSON without the fields that time the analyzer (`*_s`).
pub fn untimed(v: Value) -> Value {
    match v {
        Value::Object(m) => m.into_iter().filter(|(k, _)| !k.ends_with("_s")).map(|(k, v)| (k, untimed(v))).collect(),
        Value::Array(a) => a.into_iter().map(untimed).collect(),
        v => v,
    }
}

/// A leak as the tests compare it: bytes, blocks, family, and the first
/// frame inside the given source file (function, line).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone)]
pub struct Leak {
    pub bytes: i64,
    pub blocks: i64,
    pub family: String,
    pub function: String,
    pub line: u32,
}

pub fn leak(bytes: i64, blocks: i64, family: &str, function: &str, line: u32) -> Leak {
    Leak { bytes, blocks, family: family.into(), function: function.into(), line }
}

/// The line of the first frame of a report entry (any object with
/// `frames`) that lies in `src` (a ctests file name).
pub fn line_in(entry: &Value, src: &str) -> Option<u64> {
    entry["frames"].as_array()?.iter().find(|f| f["file"].as_str().is_some_and(|p| p.ends_with(&format!("/{src}"))))?
        ["line"]
        .as_u64()
}

/// The leaks of report `r` allocated at `line` of `src`: (bytes, blocks),
/// whatever their kinds (definitely or possibly lost: a stale pointer may
/// make one of them possible, as under memcheck).
pub fn lost_at(r: &serde_json::Value, src: &str, line: u32) -> (u64, u64) {
    let at = r["stacks"].as_array().unwrap().iter().filter(|e| line_in(e, src) == Some(line as u64));
    at.fold((0, 0), |(b, n), e| (b + e["bytes"].as_u64().unwrap(), n + e["blocks"].as_u64().unwrap()))
}

/// The report's leaks whose backtrace passes through `src` (a file name),
/// sorted. Leaks made wholly inside libraries (libstdc++'s pool) are left
/// out, and so is the block the dynamic loader allocates in pthread_create
/// for a thread's TLS, which glibc keeps for reuse (valgrind reports it too).
pub fn leaks_in(report: &Value, src: &str) -> Vec<Leak> {
    let mut v: Vec<Leak> = report["stacks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| !e["frames"][0]["module"].as_str().unwrap_or("").starts_with("ld-linux"))
        .filter_map(|e| {
            let f = e["frames"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["file"].as_str().is_some_and(|p| p.ends_with(&format!("/{src}"))))?;
            Some(Leak {
                bytes: e["bytes"].as_i64().unwrap(),
                blocks: e["blocks"].as_i64().unwrap(),
                family: e["family"].as_str().unwrap().into(),
                function: f["function"].as_str().unwrap_or("?").into(),
                line: f["line"].as_u64().unwrap() as u32,
            })
        })
        .collect();
    v.sort();
    v
}

/// The trace files in `dir`, by name.
fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".mtrace"))
        .collect();
    v.sort();
    v
}

/// The trace files in `dir`, reported: (pid, report), oldest first by name suffix.
pub fn traces(dir: &Path) -> Vec<(PathBuf, Value)> {
    trace_files(dir)
        .into_iter()
        .map(|p| {
            let r = report_json(&p);
            (p, r)
        })
        .collect()
}

/// The trace files in `dir` with their headers only (no report: a
/// browser's dozens of traces take seconds each to report), by name.
pub fn trace_headers(dir: &Path) -> Vec<(PathBuf, mtrace_format::Header)> {
    trace_files(dir)
        .into_iter()
        .filter_map(|p| {
            let f = std::io::BufReader::new(std::fs::File::open(&p).ok()?);
            let h = mtrace_format::Reader::new(f).header().ok()?;
            Some((p, h))
        })
        .collect()
}

/// Spawns `cmd` with its standard error piped, waits for its first line
/// there, which must contain `expect`, and drains the rest (so that the
/// process never blocks on it).
pub fn spawn_until(cmd: &mut Command, expect: &str) -> std::process::Child {
    use std::io::BufRead;
    let mut c = cmd.stderr(std::process::Stdio::piped()).spawn().unwrap();
    let mut err = std::io::BufReader::new(c.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains(expect), "{line}");
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    c
}

/// valgrind's memcheck on `prog args` in `dir` with `env`: (bytes, blocks)
/// definitely, indirectly, possibly lost and still reachable, from its
/// summary ("==N==    definitely lost: 185 bytes in 4 blocks"; no summary
/// at all when every block was freed).
pub fn memcheck(dir: &Path, env: &[(&str, &str)], prog: &Path, args: &[&str]) -> [(u64, u64); 4] {
    let out = Command::new("valgrind")
        .current_dir(dir)
        .envs(env.iter().copied())
        .arg("--leak-check=full")
        .arg(prog)
        .args(args)
        .output()
        .expect("valgrind");
    memcheck_summary(&out.stderr)
}

/// memcheck's leak summary in valgrind's output `stderr`: (bytes, blocks)
/// definitely, indirectly, possibly lost and still reachable (no summary
/// at all when every block was freed).
pub fn memcheck_summary(stderr: &[u8]) -> [(u64, u64); 4] {
    let text = String::from_utf8_lossy(stderr);
    let num = |s: &str| s.replace(',', "").parse::<u64>().unwrap();
    ["definitely lost", "indirectly lost", "possibly lost", "still reachable"].map(|what| {
        text.lines().find(|l| l.contains(&format!("{what}:"))).map_or((0, 0), |l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let i = w.iter().position(|x| *x == "bytes").unwrap();
            (num(w[i - 1]), num(w[i + 2]))
        })
    })
}

/// profile.proto's types, from the schema pprof reads.
pub use mtrace_analysis::output::pprof::proto;

/// The in-use objects and bytes of a pprof heap profile by the source
/// file name and line of each sample's first location.
pub fn pprof_in_use(f: &Path) -> std::collections::HashMap<(String, u32), (i64, i64)> {
    use prost::Message;
    use std::io::Read;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(f).unwrap()).read_to_end(&mut bytes).unwrap();
    let p = proto::Profile::decode(&bytes[..]).unwrap();
    let mut by = std::collections::HashMap::new();
    for x in p.sample.iter().filter(|x| x.value[2] > 0) {
        let Some(line) = x.location_id.first().and_then(|&id| p.location[id as usize - 1].line.last()) else {
            continue;
        };
        let file = &p.string_table[p.function[line.function_id as usize - 1].filename as usize];
        let key = (file.rsplit('/').next().unwrap().to_owned(), line.line as u32);
        let e: &mut (i64, i64) = by.entry(key).or_default();
        e.0 += x.value[2];
        e.1 += x.value[3];
    }
    by
}

/// The `--hooks` to test: breakpoints, and uprobes if `mtrace run
/// --ptrace --hooks uprobes` works here.
pub fn ptrace_hooks() -> &'static [&'static str] {
    static HOOKS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    HOOKS.get_or_init(|| {
        let out = Command::new(mtrace())
            .args(["run", "--ptrace", "--hooks", "uprobes", "--no-scan", "-o", "/dev/null", "--", "true"])
            .output()
            .unwrap();
        if out.status.success() {
            vec!["breakpoints", "uprobes"]
        } else {
            eprintln!("uprobes not tested here: {}", String::from_utf8_lossy(&out.stderr).trim());
            vec!["breakpoints"]
        }
    })
}

/// ctests/attach_target.c running, driven by its standard input: started
/// when it has said "ready".
pub struct AttachTarget {
    pub child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl AttachTarget {
    pub fn start(prog: &Path) -> AttachTarget {
        AttachTarget::spawn(&mut Command::new(prog))
    }

    /// `cmd` (attach_target.c itself, or a command that runs it) with pipes
    /// to its standard input and output.
    pub fn spawn(cmd: &mut Command) -> AttachTarget {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        AttachTarget { child, stdin, out }
    }

    /// Sends a command and returns the answer line.
    pub fn ask(&mut self, cmd: &str) -> String {
        use std::io::{BufRead, Write};
        writeln!(self.stdin, "{cmd}").unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line
    }
}

/// Headless chromium's flags: no network of its own (this machine has
/// none), a fresh profile.
pub fn chromium(profile: &Path) -> Option<Command> {
    let exe = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))?;
    let mut c = Command::new(exe);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--enable-logging=stderr",
        "--v=0",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    Some(c)
}

/// Waits until `p` exists and its size stopped changing.
pub fn wait_for_file(p: &Path) -> String {
    let start = Instant::now();
    let mut last = None;
    loop {
        let len = std::fs::metadata(p).map(|m| m.len()).ok();
        if len.is_some() && len == last && len != Some(0) {
            return std::fs::read_to_string(p).unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{} never appeared", p.display());
        last = len;
        std::thread::sleep(Duration::from_millis(150));
    }
}

/// (bytes, blocks, line in steady.c) of each entry of a text report
/// (reports.rs and bounded.rs on ctests/steady.c's .memlog files).
pub fn memlog_entries(memlog: &str) -> Vec<(i64, i64, u32)> {
    let num = |t: &str| t.replace([',', '+'], "").parse::<i64>().unwrap();
    let mut out = vec![];
    let mut lines = memlog.lines().peekable();
    while let Some(l) = lines.next() {
        let Some(rest) = l.strip_prefix('#').and_then(|r| r.split_once(": ")).map(|(_, r)| r) else { continue };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let (bytes, blocks) = (num(words[0]), num(words[3]));
        let mut line = 0;
        while let Some(f) = lines.peek().filter(|f| f.starts_with("    ")) {
            if line == 0 {
                if let Some(i) = f.find("steady.c:") {
                    line = f[i + 9..].trim_end_matches(|c: char| !c.is_ascii_digit()).parse().unwrap();
                }
            }
            lines.next();
        }
        out.push((bytes, blocks, line));
    }
    out.sort();
    out
}

/// Three report points of ctests/steady.c (its default mode): at each
/// "ready" it prints on `out`, SIGUSR1 to the process `pid` gives (asked
/// after the first "ready"), then its `steady-PID-N.memlog` in `dir`
/// once written (reports.rs, bounded.rs).
pub fn steady_memlogs(out: &mut impl std::io::BufRead, dir: &Path, pid: impl Fn() -> i32) -> Vec<String> {
    let mut logs = vec![];
    for seq in 1..=3 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        let pid = pid();
        // SAFETY: kill on the program this test runs.
        unsafe { libc::kill(pid, libc::SIGUSR1) };
        logs.push(wait_for_file(&dir.join(format!("steady-{pid}-{seq}.memlog"))));
    }
    logs
}
