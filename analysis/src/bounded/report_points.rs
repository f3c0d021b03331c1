//! The .memlog of each report point of a stream whose reader keeps the
//! books (`mtrace run --max-trace-size`): the preload writes the point's
//! Marker and no report (it has no trace file to read), and the keeper
//! writes what `mtrace report TRACE --since-marker N-1 --until-marker N`
//! would: the first report everything live, each later one the change
//! since the one before, in the same file (`<program>-<pid>-<N>.memlog`,
//! docs/FORMAT.md "Files" and docs/GUIDE.md "Reports while the program runs").

use std::io::Write;
use std::path::PathBuf;

use rustc_hash::FxHashMap as HashMap;

use crate::books::LiveTotals;
use crate::report::{SortKey, View};
use crate::symbolize::{SearchPaths, Symbolizer};
use crate::trace::Trace;

/// The marker names of report points whose .memlog the keeper writes: a
/// report signal's and `mtrace_report()`'s (protocol.rs). A scan's needs
/// the scan, which the preload does not make on a socket stream.
const POINTS: &[&str] = &[mtrace_format::protocol::marker::SIGNAL, mtrace_format::protocol::marker::REPORT];

/// Where and how the report points' .memlog files are written.
pub struct ReportPoints {
    /// The folder (`MTRACE_REPORT_DIR`); none: the process's working
    /// directory at the report point, as the preload's own reports.
    pub dir: Option<PathBuf>,
    /// Frames per backtrace shown (`-d`; none: all recorded).
    pub depth: Option<usize>,
    /// Live totals per backtrace at the last report point.
    last: Option<HashMap<u32, LiveTotals>>,
    sym: Symbolizer,
    /// The process's working directory when its stream began, for a
    /// point that passes after it ended.
    cwd: Option<PathBuf>,
    /// What could not be written, for the caller to say (a keeper's thread
    /// does not print: its lines would land in the middle of the
    /// program's output and `mtrace run`'s report).
    pub problems: Vec<String>,
}

impl ReportPoints {
    /// Report points written into `dir` (none: the process's working
    /// directory), with at most `depth` frames per backtrace.
    pub fn new(dir: Option<PathBuf>, depth: Option<usize>) -> ReportPoints {
        ReportPoints {
            dir,
            depth,
            last: None,
            sym: Symbolizer::new(SearchPaths::default()),
            cwd: None,
            problems: Vec::new(),
        }
    }

    /// The stream of process `pid` began.
    pub fn started(&mut self, pid: u32) {
        self.cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
    }

    /// After marker `seq`/`name` entered `t`'s books: writes its .memlog if
    /// it is a report point. A report that cannot be written is kept in
    /// [`ReportPoints::problems`]; the books go on.
    pub fn marker(&mut self, t: &mut Trace, seq: u64, name: &str) {
        if seq == 0 || !POINTS.contains(&name) {
            return;
        }
        let pid = t.header.pid;
        let prog = mtrace_format::naming::program_name(&t.header.cmdline, &t.header.exe);
        let cwd = || std::fs::read_link(format!("/proc/{pid}/cwd")).ok().or_else(|| self.cwd.clone());
        let Some(dir) = self.dir.clone().or_else(cwd) else {
            self.problems.push(format!("report point {seq} of process {pid}: its working directory is unknown"));
            return;
        };
        let path = dir.join(format!("{prog}-{pid}-{seq}.memlog"));
        // As the report of the trace up to the marker reads it: no End
        // record is missing, the change since the previous point.
        let (sym, depth) = (&mut self.sym, self.depth);
        let mut r = crate::pipeline::view(t, self.last.take(), false, |t| {
            crate::pipeline::build(t, sym, SortKey::Bytes, depth, false, View::default())
        });
        r.summary.since_marker = (seq > 1).then(|| (seq - 1).to_string());
        r.summary.until_marker = Some(seq.to_string());
        self.last = Some(t.books.live_by_stack());
        let written = crate::output::create_private(&path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            crate::output::text::write_text(&r, &crate::output::Style::default(), &mut w)?;
            Ok(w.flush()?)
        });
        if let Err(e) = written {
            self.problems.push(format!("report point {seq} of process {pid}: {e:#}"));
        }
    }
}

/// Follows the trace at `path` as another thread writes it (a copy of a
/// live stream: `mtrace attach`, `client`) and writes the .memlog of each
/// report point as it passes, into `dir` (none: the process's working
/// directory). The copy never waits for it; a report that cannot be
/// written is said on standard error.
pub fn follow(path: &std::path::Path, dir: Option<PathBuf>) -> crate::input::live::LiveBooks {
    let mut points = ReportPoints::new(dir, None);
    let on_marker = move |t: &mut Trace, seq: u64, name: &str| {
        if points.cwd.is_none() {
            points.started(t.header.pid);
        }
        points.marker(t, seq, name);
        for p in points.problems.drain(..) {
            eprintln!("mtrace: {p}");
        }
    };
    crate::input::live::LiveBooks::follow_marking(path, Some(Box::new(on_marker)))
}
