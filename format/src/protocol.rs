//! The protocol between the analyzer and a producer beyond the records:
//! the commands a reader sends back on a socket stream, one per line
//! ([`Command`]), and the names of the markers that mean something to the
//! analyzer ([`marker`]). Both sides use these; no literal elsewhere.

use std::fmt;

/// Marker names the producers write and the analyzer reads.
pub mod marker {
    /// Follows an on-demand leak scan's snapshot (the console's `scan`,
    /// `MTRACE_SCAN_SIGNAL`, `mtrace_scan()`): its report covers everything
    /// live, classified.
    pub const SCAN: &str = "scan";
    /// Starts a stream made by `mtrace attach`: the blocks allocated
    /// before it are unknown.
    pub const ATTACH: &str = "attach";
    /// A report point the report signal (SIGUSR1) asked for.
    pub const SIGNAL: &str = "signal";
    /// The console's `report`: a report point.
    pub const REPORT: &str = "report";
    /// The console's `reset`: its reports count from here.
    pub const RESET: &str = "reset";
    /// The console's question before a view (`top`, `dump`, `status`…):
    /// the process writes what it buffered, then this marker, and the
    /// console's books that took it hold every event made before the
    /// process read the command. An answer, not a point of the program's:
    /// the books list none.
    pub const SYNC: &str = "mtrace:sync";
}

/// The largest backtrace depth a producer records (frames): the bound of
/// `MTRACE_DEPTH` and of [`Command::Depth`].
pub const MAX_DEPTH: usize = 256;

/// A command to a producer, the closed set every producer matches
/// exhaustively (preload/src/session/commands.rs,
/// ptrace/src/tracer/commands.rs); as a line, its [`fmt::Display`] form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Record allocations again.
    Start,
    /// Stop recording allocations (frees are still recorded).
    Stop,
    /// Frames per backtrace from now on, 1 to [`MAX_DEPTH`].
    Depth(usize),
    /// Write a marker of this name.
    Marker(String),
    /// Take a leak scan's snapshot, then a [`marker::SCAN`] marker.
    Scan,
    /// Stop tracing for good; the process goes on.
    Detach,
    /// The reader writes the report of every report point of the stream
    /// and answers each with [`Command::Reported`]: a program's
    /// `mtrace_report()` and `mtrace_scan()` wait for that answer (without
    /// it they return -1 at once). Sent first, as the connection opens.
    Answering,
    /// The reader is done with the report of report point `seq`.
    Reported {
        /// The report point's number (its Marker's `seq`).
        seq: u64,
        /// The report was written; false: it could not be.
        written: bool,
    },
}

impl Command {
    /// The command on `line` (without its newline); `Ok(None)` for an empty
    /// line, `Err(line)` for one that is no command.
    pub fn parse(line: &str) -> Result<Option<Command>, String> {
        let line = line.trim();
        let (verb, arg) = line.split_once(' ').map_or((line, ""), |(v, a)| (v, a.trim()));
        Ok(Some(match (verb, arg) {
            ("", _) => return Ok(None),
            ("start", "") => Command::Start,
            ("stop", "") => Command::Stop,
            ("depth", n) => match n.parse::<usize>() {
                Ok(d) if (1..=MAX_DEPTH).contains(&d) => Command::Depth(d),
                _ => return Err(line.to_owned()),
            },
            ("marker", name) if !name.is_empty() => Command::Marker(name.to_owned()),
            ("scan", "") => Command::Scan,
            ("detach", "") => Command::Detach,
            ("answering", "") => Command::Answering,
            ("reported", a) => match a.split_once(' ').map(|(n, w)| (n.parse::<u64>(), w.trim())) {
                Some((Ok(seq), "ok")) => Command::Reported { seq, written: true },
                Some((Ok(seq), "failed")) => Command::Reported { seq, written: false },
                _ => return Err(line.to_owned()),
            },
            _ => return Err(line.to_owned()),
        }))
    }

    /// The line to send: the command and its newline.
    pub fn line(&self) -> String {
        format!("{self}\n")
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Start => write!(f, "start"),
            Command::Stop => write!(f, "stop"),
            Command::Depth(d) => write!(f, "depth {d}"),
            Command::Marker(name) => write!(f, "marker {name}"),
            Command::Scan => write!(f, "scan"),
            Command::Detach => write!(f, "detach"),
            Command::Answering => write!(f, "answering"),
            Command::Reported { seq, written } => {
                write!(f, "reported {seq} {}", if *written { "ok" } else { "failed" })
            }
        }
    }
}

/// The command line (`argv`, from `mtrace`) a producer runs to write the
/// report of report point `seq` of the trace at `trace` to `out`: what was
/// live at the point (`--until-marker`), or with `since_previous` the
/// change since report point `seq - 1` (`--since-marker`; report point 1
/// has none before it). The analyzer's test parses it with its own
/// command line, so the two cannot drift apart.
pub fn report_point_argv(trace: &str, seq: u64, out: &str, since_previous: bool) -> Vec<String> {
    let mut args = vec!["mtrace".to_owned(), "report".to_owned(), trace.to_owned()];
    args.extend(["--until-marker".to_owned(), seq.to_string(), "-o".to_owned(), out.to_owned()]);
    if seq > 1 && since_previous {
        args.extend(["--since-marker".to_owned(), (seq - 1).to_string()]);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::{Command, MAX_DEPTH};

    #[test]
    fn every_command_reads_back_as_written() {
        for c in [
            Command::Start,
            Command::Stop,
            Command::Depth(1),
            Command::Depth(MAX_DEPTH),
            Command::Marker("before load".into()),
            Command::Scan,
            Command::Detach,
            Command::Answering,
            Command::Reported { seq: 1, written: true },
            Command::Reported { seq: u64::MAX, written: false },
        ] {
            assert_eq!(Command::parse(&c.line()), Ok(Some(c.clone())), "{c}");
        }
        assert_eq!(Command::parse("  "), Ok(None));
        for bad in [
            "depth 0",
            "depth 257",
            "depth x",
            "marker",
            "scan now",
            "jump",
            "reported 1",
            "reported x ok",
            "reported 2 yes",
        ] {
            assert_eq!(Command::parse(bad), Err(bad.to_owned()));
        }
    }
}
