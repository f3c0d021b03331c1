//! The interactive console (`mtrace attach -i`, `client -i`, `run -i`): a
//! front end on a live stream, in mtrace-ng's manner. Commands may be
//! abbreviated to their shortest unique prefix; `>FILE` at the end of a
//! line sends its output to FILE; long output on a terminal goes through
//! `$PAGER` (`less -FRX`). Line editing and history come from rustyline
//! (well kept, and it falls back to plain lines when standard input is not
//! a terminal).
//!
//! The books are kept while the stream arrives (`mtrace_analysis::input::live`): a
//! command waits until they hold everything saved so far, and a report
//! point or a scan describes the moment the process wrote its marker.

mod commands;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use mtrace_format::protocol::Command;

use mtrace_analysis::pipeline::ReportOpts;

/// What the console acts on: a process sending its stream.
pub trait Live {
    /// Sends one command to the process (its line: `Command`'s Display;
    /// carried out by preload/src/session/commands.rs or the ptrace
    /// tracer's tracer/commands.rs).
    fn send(&mut self, cmd: &Command) -> Result<()>;
    /// [`Live::send`] to process `pid` of the program (default: the program's).
    fn send_to(&mut self, pid: Option<u32>, cmd: &Command) -> Result<()> {
        match pid {
            None => self.send(cmd),
            Some(p) => bail!("no process {p} to send to: this console reaches the program's process only"),
        }
    }
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

/// The console's commands: the closed set, matched exhaustively where they
/// are carried out (commands.rs). A new command is a variant, its row in
/// [`VERBS`] (name and help line) and its arm there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Dump,
    Report,
    Status,
    Timeline,
    Show,
    Top,
    Scan,
    Pprof,
    Proclist,
    Markers,
    Marker,
    Reset,
    Start,
    Stop,
    Set,
    Detach,
    Quit,
    Wait,
    Help,
}

/// Each command with the word that names it and its help line, in the
/// order `help` lists them.
const VERBS: &[(Verb, &str, &str)] = &[
    (
        Verb::Dump,
        "dump",
        "dump [usage|allocations|average|total|tsc|bytes-leaked|leaks|stacks|badfree|mismatched] [PID] — live blocks by backtrace, in that order (default usage; bytes-leaked and leaks: lost at the last scan; stacks: every backtrace by allocation calls; badfree and mismatched: the wrong frees, those kinds first)",
    ),
    (
        Verb::Report,
        "report",
        "report — a report point: everything live the first time, then what changed since the last one",
    ),
    (
        Verb::Status,
        "status",
        "status [PID] — allocation calls, bytes and blocks in use, average size, whether the process is traced",
    ),
    (Verb::Timeline, "timeline", "timeline — RSS and live heap over time"),
    (Verb::Show, "show", "show info|searchpath — the program and its stream, or where binaries are looked for"),
    (Verb::Top, "top", "top [N] — the N backtraces holding the most live bytes (default 10)"),
    (
        Verb::Scan,
        "scan",
        "scan [all|new|leak] [PID] — stop the process's threads for a snapshot and classify as memcheck does: all live blocks (default), those allocated since the last scan, or those the last scan found lost",
    ),
    (
        Verb::Pprof,
        "pprof",
        "pprof FILE [PID] — write the books so far as a pprof heap profile (go tool pprof, Pyroscope, Parca)",
    ),
    (Verb::Proclist, "proclist", "proclist — the program's processes: pid, state, program"),
    (Verb::Markers, "markers", "markers — the report points and named points so far"),
    (Verb::Marker, "marker", "marker NAME — set a named point now"),
    (Verb::Reset, "reset", "reset — forget the books: from now on reports count from this point"),
    (Verb::Start, "start", "start — record allocations again"),
    (Verb::Stop, "stop", "stop — stop recording allocations (frees are still recorded)"),
    (
        Verb::Set,
        "set",
        "set depth N | set searchpath DIR[:DIR…] — frames per backtrace from now on, or where binaries are looked for",
    ),
    (Verb::Detach, "detach", "detach — stop tracing for good; the process goes on"),
    (
        Verb::Quit,
        "quit",
        "quit — leave now: mtrace client ends and the program goes on under mtrace server (a later client may connect); after mtrace attach, detach",
    ),
    (Verb::Wait, "wait", "wait — leave the console and report when the program ends (as at the end of input)"),
    (Verb::Help, "help", "help [COMMAND] — this list, or one command's line"),
];

impl Verb {
    /// Its help line.
    pub fn help(self) -> &'static str {
        VERBS.iter().find(|(v, _, _)| *v == self).map_or("", |r| r.2)
    }

    /// Every help line, in [`VERBS`]' order.
    pub fn all_help() -> impl Iterator<Item = &'static str> {
        VERBS.iter().map(|r| r.2)
    }

    /// The command `word` abbreviates: exact, or the only one it is a
    /// prefix of.
    pub fn resolve(word: &str) -> Result<Verb> {
        if let Some(&(v, _, _)) = VERBS.iter().find(|(_, w, _)| *w == word) {
            return Ok(v);
        }
        let hits: Vec<&(Verb, &str, &str)> = VERBS.iter().filter(|(_, w, _)| w.starts_with(word)).collect();
        match hits.as_slice() {
            [one] => Ok(one.0),
            [] => bail!("unknown command {word:?} (help lists them)"),
            many => bail!("{word:?} is ambiguous: {}", many.iter().map(|r| r.1).collect::<Vec<_>>().join(", ")),
        }
    }
}

/// A line on standard output; a closed one is not an error worth dying of.
fn say(line: &str) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// How the console was left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leave {
    /// `quit`: leave now; the program goes on (under `mtrace server`, or
    /// detached after `mtrace attach`).
    Quit,
    /// `wait` or the end of input: leave the console, report at the end
    /// (scripts that pipe commands in get the final report).
    Wait,
    /// `detach`: the process was told to stop tracing.
    Detach,
    /// The process's stream ended.
    Ended,
}

/// Runs the console until a command leaves it, the input ends, or the
/// process's stream does; says which.
pub fn run(live: &mut dyn Live, opts: &ReportOpts) -> Result<Leave> {
    let mut c = commands::Console::new(live, opts.clone());
    let mut ed = rustyline::DefaultEditor::new()?;
    say("mtrace console: help lists the commands; quit leaves, detach ends tracing");
    loop {
        if c.live.ended() {
            say("the process's stream ended");
            return Ok(Leave::Ended);
        }
        let line = match ed.readline("mtrace> ") {
            Ok(l) => l,
            Err(rustyline::error::ReadlineError::Interrupted) => continue,
            // End of input: as wait.
            Err(_) => return Ok(Leave::Wait),
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
            Some(f) => c.command(line, f),
            None => c.command(line, &mut collected),
        };
        page(&collected);
        match res {
            Ok(Some(leave)) => return Ok(leave),
            Ok(None) => {}
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
