//! The interactive console (`mtrace attach -i`, `client -i`, `run -i`): a
//! front end on a live stream, in mtrace-ng's manner. Commands may be
//! abbreviated to their shortest unique prefix; `>FILE` at the end of a
//! line sends its output to FILE; long output on a terminal goes through
//! `$PAGER` (`less -FRX`). Line editing and history come from rustyline
//! (well kept, and it falls back to plain lines when standard input is not
//! a terminal).
//!
//! The books are those of the stream saved so far: each command reads it
//! again (a report of a long session costs a read of its trace).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::report::SortKey;
use crate::ReportOpts;

/// What the console acts on: a process sending its stream.
pub trait Live {
    /// Sends one command line to the process (preload/src/session/control.rs).
    fn send(&mut self, cmd: &str) -> Result<()>;
    /// The stream saved so far.
    fn trace(&self) -> PathBuf;
    /// The stream ended (the process exited or detached).
    fn ended(&self) -> bool;
    /// One line per process of the program (pid, state, program), where
    /// there can be several (`mtrace client`).
    fn processes(&self) -> Vec<String> {
        Vec::new()
    }
    /// The stream of process `pid`, where there can be several.
    fn trace_of(&self, _pid: u32) -> Option<PathBuf> {
        None
    }
}

/// The commands, with their help line.
const COMMANDS: &[(&str, &str)] = &[
    (
        "dump",
        "dump [usage|allocations|average|total|tsc] [PID] — live blocks by backtrace, in that order (default usage)",
    ),
    ("report", "report — a report point: everything live the first time, then what changed since the last one"),
    ("status", "status [PID] — allocation calls, bytes and blocks in use, average size, whether the process is traced"),
    ("timeline", "timeline — RSS and live heap over time"),
    ("show", "show info|searchpath — the program and its stream, or where binaries are looked for"),
    ("top", "top [N] — the N backtraces holding the most live bytes (default 10)"),
    ("scan", "scan — stop the process's threads for a snapshot and classify its live blocks as memcheck does"),
    ("proclist", "proclist — the program's processes: pid, state, program"),
    ("markers", "markers — the report points and named points so far"),
    ("marker", "marker NAME — set a named point now"),
    ("reset", "reset — forget the books: from now on reports count from this point"),
    ("start", "start — record allocations again"),
    ("stop", "stop — stop recording allocations (frees are still recorded)"),
    (
        "set",
        "set depth N | set searchpath DIR[:DIR…] — frames per backtrace from now on, or where binaries are looked for",
    ),
    ("detach", "detach — stop tracing for good; the process goes on"),
    ("quit", "quit — leave the console (after mtrace attach: and detach; else tracing goes on to the end)"),
    ("help", "help [COMMAND] — this list, or one command's line"),
];

/// A line on standard output; a closed one is not an error worth dying of.
fn say(line: &str) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// The command `word` abbreviates: exact, or the only one it is a prefix of.
fn resolve(word: &str) -> Result<&'static str> {
    if let Some(&(c, _)) = COMMANDS.iter().find(|(c, _)| *c == word) {
        return Ok(c);
    }
    let hits: Vec<&str> = COMMANDS.iter().map(|(c, _)| *c).filter(|c| c.starts_with(word)).collect();
    match hits.as_slice() {
        [one] => Ok(one),
        [] => bail!("unknown command {word:?} (help lists them)"),
        many => bail!("{word:?} is ambiguous: {}", many.join(", ")),
    }
}

/// Runs the console until `detach` (the process told to stop tracing),
/// `quit` or the end of input (tracing goes on), or the stream's end.
pub fn run(live: &mut dyn Live, opts: &ReportOpts) -> Result<()> {
    let mut opts = opts.clone();
    let mut ed = rustyline::DefaultEditor::new()?;
    say("mtrace console: help lists the commands; detach or quit ends tracing");
    loop {
        if live.ended() {
            say("the process's stream ended");
            return Ok(());
        }
        let line = match ed.readline("mtrace> ") {
            Ok(l) => l,
            Err(rustyline::error::ReadlineError::Interrupted) => continue,
            // End of input: as quit.
            Err(_) => return Ok(()),
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let _ = ed.add_history_entry(line);
        let (line, redirect) = match line.rsplit_once('>') {
            Some((l, f)) if !f.trim().is_empty() => (l.trim(), Some(f.trim().to_owned())),
            _ => (line, None),
        };
        let mut file = None;
        if let Some(f) = &redirect {
            match std::fs::File::create(f) {
                Ok(h) => file = Some(h),
                Err(e) => {
                    say(&format!("{f}: {e}"));
                    continue;
                }
            }
        }
        // Output to the terminal is collected, for the pager if it is long.
        let mut collected = Vec::new();
        let res = match file.as_mut() {
            Some(f) => command(live, &mut opts, line, f),
            None => command(live, &mut opts, line, &mut collected),
        };
        page(&collected);
        match res {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => say(&format!("{e:#}")),
        }
    }
}

/// Writes `text` to standard output, through `$PAGER` (default `less
/// -FRX`) when standard output is a terminal that it would overflow.
fn page(text: &[u8]) {
    use std::io::IsTerminal;
    let lines = text.iter().filter(|&&b| b == b'\n').count();
    let rows = std::env::var("LINES").ok().and_then(|l| l.parse().ok()).unwrap_or(24usize);
    if std::io::stdout().is_terminal() && lines + 1 > rows {
        let pager = std::env::var("PAGER").unwrap_or_else(|_| "less -FRX".to_owned());
        let mut words = pager.split_whitespace();
        if let Some(prog) = words.next() {
            let child = std::process::Command::new(prog).args(words).stdin(std::process::Stdio::piped()).spawn();
            if let Ok(mut c) = child {
                if let Some(mut i) = c.stdin.take() {
                    let _ = i.write_all(text);
                }
                let _ = c.wait();
                return;
            }
        }
    }
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text);
    let _ = o.flush();
}

/// Carries out one command line; true when it ended tracing.
fn command(live: &mut dyn Live, opts: &mut ReportOpts, line: &str, out: &mut dyn Write) -> Result<bool> {
    let mut words = line.split_whitespace();
    let verb = resolve(words.next().unwrap_or_default())?;
    let args: Vec<&str> = words.collect();
    match verb {
        "help" => match args.first() {
            Some(w) => {
                let c = resolve(w)?;
                writeln!(out, "{}", COMMANDS.iter().find(|(n, _)| *n == c).map_or("", |x| x.1))?;
            }
            None => {
                for (_, h) in COMMANDS {
                    writeln!(out, "  {h}")?;
                }
            }
        },
        "report" => {
            let n = wait_for_marker(live, "report", |l| l.send("marker report"))?;
            let mut o = opts.clone();
            o.since_marker = (n > 1).then(|| format!("report#{}", n - 1));
            o.until_marker = Some(format!("report#{n}"));
            o.report(&live.trace(), out)?;
        }
        "timeline" => {
            let t = load(live, opts)?;
            writeln!(out, "{:>12}  {:>12}  {:>14}  {:>8}", "time", "RSS", "heap", "blocks")?;
            for p in crate::report::thin(&t.timeline, crate::report::TIMELINE_ROWS) {
                let mib = |b: u64| format!("{:.1} MiB", b as f64 / 1048576.0);
                writeln!(
                    out,
                    "{:>10.3} s  {:>12}  {:>14}  {:>8}",
                    p.time_ns as f64 / 1e9,
                    mib(p.rss_bytes),
                    mib(p.heap_bytes),
                    p.heap_blocks
                )?;
            }
        }
        "show" => match args.first().copied().filter(|a| !a.is_empty()) {
            Some(a) if "info".starts_with(a) => {
                let t = crate::load::load(&live.trace())?;
                let h = &t.header;
                writeln!(out, "program: {} (pid {}, parent {})", h.exe, h.pid, h.ppid)?;
                writeln!(out, "command: {}", h.cmdline.join(" "))?;
                writeln!(
                    out,
                    "target: {}, {}-bit, {}-endian",
                    h.arch,
                    h.pointer_size * 8,
                    if h.big_endian { "big" } else { "little" }
                )?;
                writeln!(out, "stream: {} ({} records so far)", live.trace().display(), t.records)?;
                if let Some(m) = &opts.since_marker {
                    writeln!(out, "counting from: {m}")?;
                }
            }
            Some(a) if "searchpath".starts_with(a) => {
                let root = opts.sysroot.as_ref().map_or("/".into(), |p| p.display().to_string());
                writeln!(out, "sysroot: {root}")?;
                for b in &opts.binpath {
                    writeln!(out, "binpath: {}", b.display())?;
                }
            }
            _ => bail!("show info|searchpath"),
        },
        "dump" => {
            let (pid, args) = pid_arg(&args);
            let sort = match args.first() {
                None => SortKey::Bytes,
                Some(s) => <SortKey as clap::ValueEnum>::from_str(s, true).map_err(|_| {
                    anyhow::anyhow!("dump: unknown order {s:?} (usage, allocations, average, total, tsc)")
                })?,
            };
            let t = load_pid(live, opts, pid)?;
            let mut sym = opts.symbolizer();
            let mut r = crate::report::build(&t, &mut sym, sort, opts.depth, true);
            r.summary.since_marker = opts.since_marker.clone();
            crate::report::text::write_entries_only(&r, out)?;
        }
        "top" => {
            let n = args.first().map_or(Ok(10), |a| a.parse::<usize>())?;
            let t = load(live, opts)?;
            let mut sym = opts.symbolizer();
            let mut r = crate::report::build(&t, &mut sym, SortKey::Bytes, opts.depth, true);
            r.summary.since_marker = opts.since_marker.clone();
            r.stacks.truncate(n);
            crate::report::text::write_entries_only(&r, out)?;
        }
        "status" => {
            let (pid, _) = pid_arg(&args);
            let t = crate::load::load(&trace_of(live, pid)?)?;
            let b = &t.books;
            let avg = b.cur_bytes.checked_div(b.cur_blocks).unwrap_or(0);
            let state = match t.end {
                Some(e) if live.ended() => format!("ended ({e:?})"),
                _ if live.ended() => "ended".to_owned(),
                _ => "traced".to_owned(),
            };
            writeln!(out, "process {} ({}): {state}", t.header.pid, t.header.exe)?;
            writeln!(out, "  allocation calls: {}, frees: {}", b.allocations, b.frees)?;
            writeln!(out, "  in use: {} bytes in {} blocks (average {} bytes)", b.cur_bytes, b.cur_blocks, avg)?;
            writeln!(out, "  frees of blocks from before tracing: {}", b.unmatched_frees())?;
        }
        "proclist" => {
            for l in live.processes() {
                writeln!(out, "{l}")?;
            }
        }
        "markers" => {
            let t = crate::load::load(&live.trace())?;
            for m in &t.markers {
                writeln!(out, "{:>10.3} s  {}", m.time_ns as f64 / 1e9, m.name)?;
            }
        }
        "marker" => {
            let Some(name) = args.first() else { bail!("marker NAME") };
            live.send(&format!("marker {name}"))?;
        }
        "scan" => scan(live, opts, out)?,
        "reset" => {
            let n = wait_for_marker(live, "reset", |l| l.send("marker reset"))?;
            opts.since_marker = Some(format!("reset#{n}"));
            writeln!(out, "counting from now")?;
        }
        "start" | "stop" => live.send(verb)?,
        "set" => match args.as_slice() {
            ["depth", n] if n.parse::<usize>().is_ok_and(|d| (1..=256).contains(&d)) => {
                live.send(&format!("depth {n}"))?;
            }
            ["searchpath", dirs] => {
                opts.binpath = dirs.split(':').filter(|d| !d.is_empty()).map(PathBuf::from).collect();
            }
            _ => bail!("set depth N (1 to 256) | set searchpath DIR[:DIR…]"),
        },
        "detach" => {
            live.send("detach")?;
            return Ok(true);
        }
        "quit" => return Ok(true),
        _ => unreachable!("every command is handled"),
    }
    Ok(false)
}

/// The stream so far, from the last `reset` on.
fn load(live: &dyn Live, opts: &ReportOpts) -> Result<crate::load::Trace> {
    load_pid(live, opts, None)
}

/// [`load`] of process `pid`'s stream (default: the program's; another
/// process's from its start).
fn load_pid(live: &dyn Live, opts: &ReportOpts, pid: Option<u32>) -> Result<crate::load::Trace> {
    let since = if pid.is_none() { opts.since_marker.clone().map(crate::load::MarkerSel) } else { None };
    crate::load::load_window(&trace_of(live, pid)?, &crate::load::Window { since, until: None })
}

/// The stream of process `pid`, or the program's.
fn trace_of(live: &dyn Live, pid: Option<u32>) -> Result<PathBuf> {
    match pid {
        None => Ok(live.trace()),
        Some(p) => live.trace_of(p).ok_or_else(|| anyhow::anyhow!("no process {p} (proclist lists them)")),
    }
}

/// A trailing PID argument, and the others.
fn pid_arg<'a>(args: &[&'a str]) -> (Option<u32>, Vec<&'a str>) {
    match args.split_last() {
        Some((last, rest)) if last.parse::<u32>().is_ok() => (last.parse().ok(), rest.to_vec()),
        _ => (None, args.to_vec()),
    }
}

/// Runs `ask` and waits (up to 30 s) until one more marker named `name`
/// is in the stream; returns how many there are now.
fn wait_for_marker(live: &mut dyn Live, name: &str, ask: impl FnOnce(&mut dyn Live) -> Result<()>) -> Result<usize> {
    let count = |p: &Path| crate::load::load(p).map(|t| t.markers.iter().filter(|m| m.name == name).count());
    let before = count(&live.trace())?;
    ask(live)?;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let now = count(&live.trace())?;
        if now > before {
            return Ok(now);
        }
        if Instant::now() > until || live.ended() {
            bail!("the process did not answer");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `scan`: asks for a snapshot, waits for its marker in the stream, and
/// writes the report up to it, classified.
fn scan(live: &mut dyn Live, opts: &ReportOpts, out: &mut dyn Write) -> Result<()> {
    let n = wait_for_marker(live, crate::load::SCAN_MARKER, |l| l.send("scan"))?;
    let mut o = opts.clone();
    // Everything live is classified, whatever a reset said.
    o.since_marker = None;
    o.until_marker = Some(format!("{}#{n}", crate::load::SCAN_MARKER));
    o.report(&live.trace(), out)?;
    Ok(())
}
