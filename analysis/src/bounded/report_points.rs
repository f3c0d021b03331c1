//! The .memlog of each report point of a stream whose reader keeps the
//! books (`mtrace run --max-trace-size`, `mtrace keep`): the preload
//! writes the point's Marker and no report (it has no trace file to
//! read), and the keeper writes what `mtrace report TRACE --since-marker
//! N-1 --until-marker N` would: the first report everything live, each
//! later one the change since the one before (a scan's, everything live
//! and classified, as `--until-marker N`), in the same file
//! (`<program>-<pid>-<N>.memlog`, docs/FORMAT.md "Files" and docs/GUIDE.md
//! "Reports while the program runs"), or where the program asked (a
//! Report to record before the Marker). On a socket it answers the
//! program, which waits in `mtrace_report()` or `mtrace_scan()`
//! (docs/FORMAT.md "Report points on a socket").

use std::io::Write;
use std::path::PathBuf;

use mtrace_format::protocol::{marker, Command};

use rustc_hash::FxHashMap as HashMap;

use crate::books::LiveTotals;
use crate::report::{SortKey, View};
use crate::symbolize::{SearchPaths, Symbolizer};
use crate::trace::Trace;

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
    /// The way back to the program: each point's answer goes there.
    answer: Option<Box<dyn Write + Send>>,
    /// The program runs as the user this reader runs as: a path it asks
    /// for is written. Another user's (mtrace as root, attached to it)
    /// would have us write where it could not.
    its_paths: bool,
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
            answer: None,
            its_paths: false,
        }
    }

    /// Answers the program on `back` (the socket its stream comes on):
    /// says `answering` now, then `reported SEQ ok|failed` after each
    /// report point. An answer that cannot be sent is dropped (the program
    /// stops waiting when its stream ends). `same_user`: the program runs
    /// as this process's user, and the paths it asks for are written;
    /// otherwise such a report goes to the default name and is answered
    /// `failed`.
    pub fn answer_on(&mut self, mut back: Box<dyn Write + Send>, same_user: bool) {
        self.its_paths = same_user;
        if back.write_all(Command::Answering.line().as_bytes()).is_ok() {
            self.answer = Some(back);
        }
    }

    /// The stream of process `pid` began.
    pub fn started(&mut self, pid: u32) {
        self.cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
    }

    /// After marker `seq`/`name` entered `t`'s books: writes its .memlog if
    /// it is a report point. A report that cannot be written is kept in
    /// [`ReportPoints::problems`]; the books go on.
    /// Every marker with a `seq` is a report point (a signal's,
    /// `mtrace_report()`'s, glibc's `mtrace()`'s, a scan's); 0 is a name.
    pub fn marker(&mut self, t: &mut Trace, seq: u64, name: &str) {
        if seq == 0 {
            return;
        }
        let written = self.write(t, seq, name);
        if let Some(back) = self.answer.as_mut() {
            let line = Command::Reported { seq, written }.line();
            if back.write_all(line.as_bytes()).and_then(|()| back.flush()).is_err() {
                self.answer = None;
            }
        }
    }

    /// Writes report point `seq`'s report; true when it was written.
    fn write(&mut self, t: &mut Trace, seq: u64, name: &str) -> bool {
        let pid = t.header.pid;
        let asked = t.report_to.iter().position(|&(s, _)| s == seq).map(|i| t.report_to.swap_remove(i).1);
        let refused = asked.as_ref().filter(|_| !self.its_paths).map(|p| {
            self.problems.push(format!(
                "report point {seq} of process {pid}: not written to {p}, which it asked for: it runs as another user"
            ));
        });
        let path = match asked.filter(|_| self.its_paths) {
            Some(p) => PathBuf::from(p),
            None => {
                let prog = mtrace_format::naming::program_name(&t.header.cmdline, &t.header.exe);
                let cwd = || std::fs::read_link(format!("/proc/{pid}/cwd")).ok().or_else(|| self.cwd.clone());
                let Some(dir) = self.dir.clone().or_else(cwd) else {
                    self.problems
                        .push(format!("report point {seq} of process {pid}: its working directory is unknown"));
                    return false;
                };
                dir.join(format!("{prog}-{pid}-{seq}.memlog"))
            }
        };
        // As the report of the trace up to the marker reads it: no End
        // record is missing, the change since the previous point; a
        // scan's, everything live, classified by its snapshot.
        let (sym, depth) = (&mut self.sym, self.depth);
        let scan = name == marker::SCAN;
        let since = if scan { None } else { self.last.take() };
        let mut r = crate::pipeline::view(t, since, scan, |t| {
            crate::pipeline::build(t, sym, SortKey::Bytes, depth, false, View::default())
        });
        r.summary.since_marker = (seq > 1 && !scan).then(|| (seq - 1).to_string());
        r.summary.until_marker = Some(seq.to_string());
        self.last = Some(t.books.live_by_stack());
        let written = crate::output::create_private(&path).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            crate::output::text::write_text(&r, &crate::output::Style::default(), &mut w)?;
            Ok(w.flush()?)
        });
        match written {
            Ok(()) => refused.is_none(),
            Err(e) => {
                self.problems.push(format!("report point {seq} of process {pid}: {e:#}"));
                false
            }
        }
    }
}

/// Follows the trace at `path` as another thread writes it (a copy of a
/// live stream: `mtrace attach`, `client`) and writes the .memlog of each
/// report point as it passes, into `dir` (none: the process's working
/// directory), answering the program on `answer` (the stream's socket,
/// and whether it runs as our user: [`ReportPoints::answer_on`]) when
/// given. The copy never waits for it; a report that cannot be written is
/// said on standard error.
pub fn follow(
    path: &std::path::Path,
    dir: Option<PathBuf>,
    answer: Option<(Box<dyn Write + Send>, bool)>,
) -> crate::input::live::LiveBooks {
    let mut points = ReportPoints::new(dir, None);
    if let Some((back, same_user)) = answer {
        points.answer_on(back, same_user);
    }
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use mtrace_format::{EndReason, Family, Header, Record};

    use super::ReportPoints;
    use crate::bounded::{keep, Bound, Dest};

    /// A process's stream with one block of 24 bytes live at report point
    /// 1, which asks for its report at `to`.
    fn stream(to: &str) -> Vec<u8> {
        let mut enc = mtrace_format::Encoder::new();
        let mut s = Vec::new();
        let h = Header { pointer_size: 8, arch: "x86_64".into(), pid: 77, ..Default::default() };
        mtrace_format::encode_header(&mut s, &h);
        for r in [
            Record::Thread { tid: 77, time_ns: 0 },
            Record::Stack { id: 1, frames: vec![0x1000] },
            Record::Alloc { time_ns: 10, family: Family::Malloc, addr: 0x9000, size: 24, stack: 1, align: 0 },
            Record::ReportTo { time_ns: 20, seq: 1, path: to.into() },
            Record::Marker { time_ns: 20, seq: 1, name: "mtrace_report".into() },
            Record::End { time_ns: 30, reason: EndReason::Exit(Some(0)) },
        ] {
            enc.encode(&mut s, &r);
        }
        s
    }

    /// What the reader says back to the program.
    #[derive(Clone, Default)]
    struct Said(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Said {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Keeps `stream(to)` with report points into `dir`, the program of
    /// `same_user`: what was said back, and the problems.
    fn kept(dir: &std::path::Path, to: &std::path::Path, same_user: bool) -> (String, Vec<String>) {
        let said = Said::default();
        let mut points = ReportPoints::new(Some(dir.to_owned()), None);
        points.answer_on(Box::new(said.clone()), same_user);
        let trace = dir.join(format!("{same_user}.mtrace"));
        let k =
            keep(&stream(to.to_str().unwrap())[..], Dest::File(&trace), Bound::default(), Some(&mut points)).unwrap();
        assert_eq!(k.error, None);
        let said = String::from_utf8(said.0.lock().unwrap().clone()).unwrap();
        (said, k.problems)
    }

    #[test]
    fn a_report_point_goes_where_the_program_asked_and_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("asked.memlog");
        let (said, problems) = kept(dir.path(), &to, true);
        assert_eq!(said, "answering\nreported 1 ok\n");
        assert_eq!(problems, Vec::<String>::new());
        let memlog = std::fs::read_to_string(&to).unwrap();
        assert!(memlog.contains("24 bytes in 1 block"), "{memlog}");
    }

    #[test]
    fn another_users_program_gets_its_report_under_the_default_name_and_failed() {
        let dir = tempfile::tempdir().unwrap();
        let to = dir.path().join("asked.memlog");
        let (said, problems) = kept(dir.path(), &to, false);
        assert_eq!(said, "answering\nreported 1 failed\n");
        assert!(!to.exists());
        let name = format!("{}-77-1.memlog", mtrace_format::naming::program_name(&[], ""));
        let memlog = std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert!(memlog.contains("24 bytes in 1 block"), "{memlog}");
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("it runs as another user"), "{problems:?}");
    }
}
