//! `mtrace run`'s report when the program ends, not after its trace is
//! read again (and `attach`'s at the detach, `client`'s at the program's
//! end): the program's trace is read into the books while the
//! program writes it, on threads of mtrace's own (a second core), and its
//! modules' debug info opened meanwhile; at its end only the last records
//! are left to read before the report is built. The books are the same a
//! report of the file builds ([`crate::input::load_from`], the same code,
//! reading the file as it grows: `input/growing.rs`), so the report is too.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::processes::traces_named;
use super::{ReportOpts, WARM_FROM_BYTES};
use crate::input::{self, growing::Growing};
use crate::report::trace_time::TraceTime;
use crate::symbolize::Symbolizer;
use crate::trace::Trace;

/// How often the follower first looks for the program's trace in its
/// folder, and the warm-up at the trace's size.
const LOOK: Duration = Duration::from_millis(5);

/// The program's trace being read as it is written (see the module's doc).
pub struct Following {
    /// The program ended: the end of its file is the end of its stream.
    done: Arc<AtomicBool>,
    thread: JoinHandle<Option<Followed>>,
}

/// A trace read to its end while it was written, and its symbolizer:
/// what [`super::report_processes`] reports instead of reading the file
/// at [`Followed::path`] again.
pub struct Followed {
    /// The trace file read.
    pub path: PathBuf,
    trace: anyhow::Result<Trace>,
    sym: Symbolizer,
}

impl Followed {
    /// The books and the symbolizer, as [`ReportOpts::load`] gives them;
    /// its errors are those of reading the trace's header.
    pub fn into_loaded(self) -> anyhow::Result<(Trace, Symbolizer)> {
        Ok((self.trace?, self.sym))
    }

    /// The books alone (a symbolizer made after the reading searches
    /// what was kept beside the trace since: `mtrace attach`'s modules of
    /// a container).
    pub fn into_trace(self) -> anyhow::Result<Trace> {
        self.trace
    }
}

impl ReportOpts {
    /// Starts reading the trace that process `pid` writes into `dir`, its
    /// first image started at or after `since_ns` (CLOCK_MONOTONIC, as the
    /// trace's header says its start), into the books of the report these
    /// options ask for. `None` when that report's part of the trace is
    /// placed by wall-clock time (`--from`/`--to` as a time of day, which
    /// the trace's header places): it is read when the program has ended.
    /// The reading gives way to the program (`priority.rs`): nothing of
    /// the program's is left to compete with it at the end.
    pub fn follow(&self, dir: &Path, pid: u32, since_ns: u64) -> Option<Following> {
        let (dir, named) = (dir.to_owned(), format!(".{pid}."));
        self.start_following(move || first_image(&dir, &named, pid, since_ns), true)
    }

    /// [`ReportOpts::follow`] of the trace at `path`, which its writer
    /// (`mtrace attach`'s copy of the stream) has made; at the program's
    /// own priority: the program runs on after the window, and the rest
    /// of the reading, after the detach, at a lower one waited for two
    /// busy threads (`analyzer/tests/attach.rs`'s twenty attaches: 49 s
    /// against 33 s for the whole file before).
    pub fn follow_file(&self, path: &Path) -> Option<Following> {
        let path = path.to_owned();
        self.start_following(move || Some(path.clone()), false)
    }

    /// [`ReportOpts::follow_file`] of the trace `look` finds, asked on the
    /// follower's thread until it finds one ([`wait_for`]): `mtrace
    /// client`'s first stream, once it has a file.
    pub fn follow_found(&self, look: impl FnMut() -> Option<PathBuf> + Send + 'static) -> Option<Following> {
        self.start_following(look, false)
    }

    /// The follower of the trace `look` finds, its threads at a lower
    /// priority when `yields`.
    fn start_following(
        &self,
        look: impl FnMut() -> Option<PathBuf> + Send + 'static,
        yields: bool,
    ) -> Option<Following> {
        if matches!(self.from, Some(TraceTime::At(_))) || matches!(self.to, Some(TraceTime::At(_))) {
            return None;
        }
        let window = self.window(0).ok()?;
        let done = Arc::new(AtomicBool::new(false));
        let (opts, flag) = (self.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            if yields {
                super::priority::yield_to_the_program();
            }
            let path = wait_for(look, &flag)?;
            let file = File::open(&path).ok()?;
            let warm_stop = AtomicBool::new(false);
            let (trace, sym) = std::thread::scope(|sc| {
                let warm = sc.spawn(|| warm(&opts, &path, &warm_stop));
                let t = input::load_from(Growing::new(file, flag.clone()), &path, &window);
                warm_stop.store(true, Ordering::Relaxed);
                (t, warm.join().unwrap_or_else(|_| opts.symbolizer_for(&path)))
            });
            Some(Followed { path, trace, sym })
        });
        Some(Following { done, thread })
    }
}

impl Following {
    /// The program ended: reads what is left of its trace and returns the
    /// books, or `None` when it wrote none (a static executable, a
    /// preload that could not start) or the reading thread failed.
    pub fn finish(self) -> Option<Followed> {
        self.done.store(true, Ordering::Release);
        self.thread.join().ok().flatten()
    }
}

/// Asks `look` for the trace to follow until it finds one: every 5 ms at
/// first, then every 100; `None` when it finds none once `done` is set.
fn wait_for(mut look: impl FnMut() -> Option<PathBuf>, done: &AtomicBool) -> Option<PathBuf> {
    let mut wait = LOOK;
    loop {
        // Read before the look: a trace that came before the end is found
        // by the look after it.
        let last = done.load(Ordering::Acquire);
        if let Some(path) = look() {
            return Some(path);
        }
        if last {
            return None;
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_millis(100));
    }
}

/// The first trace in `dir` of process `pid` started at or after
/// `since_ns` whose header is there. Only files whose name holds `named`
/// (`.PID.`: `run` names each `%e.%p.mtrace`) are opened: a build's
/// thousands of traces are not read again at each look.
fn first_image(dir: &Path, named: &str, pid: u32, since_ns: u64) -> Option<PathBuf> {
    let images = traces_named(dir, named).ok()?;
    images.into_iter().find(|i| i.pid == pid && i.start >= since_ns).map(|i| i.path)
}

/// A symbolizer for the trace at `path`, with the debug info of the
/// modules it starts with opened once the trace has grown past
/// [`WARM_FROM_BYTES`] (a short run's report would wait for a module
/// being opened), until `stop` is set.
fn warm(opts: &ReportOpts, path: &Path, stop: &AtomicBool) -> Symbolizer {
    let mut sym = opts.symbolizer_for(path);
    while !stop.load(Ordering::Relaxed) {
        if std::fs::metadata(path).is_ok_and(|m| m.len() >= WARM_FROM_BYTES) {
            sym.open_modules(&input::first_modules(path), stop);
            break;
        }
        std::thread::sleep(LOOK * 4);
    }
    sym
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtrace_format::{EndReason, Family, Header, Record};
    use std::io::Write;

    /// A stream in three parts: its header and a block kept, 1,000 blocks
    /// made and freed, then the end, with one 24-byte block never freed.
    fn stream(pid: u32) -> [Vec<u8>; 3] {
        let mut enc = mtrace_format::Encoder::new();
        let mut head = Vec::new();
        let h = Header { pointer_size: 8, arch: "x86_64".into(), pid, start_monotonic_ns: 1_000, ..Default::default() };
        mtrace_format::encode_header(&mut head, &h);
        enc.encode(&mut head, &Record::Thread { tid: pid, time_ns: 0 });
        enc.encode(&mut head, &Record::Stack { id: 1, frames: vec![0x1000, 0x2000] });
        let kept = Record::Alloc { time_ns: 10, family: Family::Malloc, addr: 0x9000, size: 24, stack: 1, align: 0 };
        enc.encode(&mut head, &kept);
        let mut churn = Vec::new();
        for i in 0..1_000u64 {
            let addr = 0x10_0000 + i * 64;
            let a = Record::Alloc { time_ns: 100 + i * 10, family: Family::Malloc, addr, size: 48, stack: 1, align: 0 };
            enc.encode(&mut churn, &a);
            let f = Record::Free { time_ns: 105 + i * 10, family: Family::Malloc, addr, stack: 1, size: 0, align: 0 };
            enc.encode(&mut churn, &f);
        }
        let mut end = Vec::new();
        enc.encode(&mut end, &Record::End { time_ns: 20_000, reason: EndReason::Exit(Some(0)) });
        [head, churn, end]
    }

    /// The JSON of a report, without the fields that time the analyzer.
    fn untimed(r: &crate::report::Report) -> serde_json::Value {
        fn drop(v: serde_json::Value) -> serde_json::Value {
            match v {
                serde_json::Value::Object(m) => {
                    m.into_iter().filter(|(k, _)| !k.ends_with("_s")).map(|(k, v)| (k, drop(v))).collect()
                }
                serde_json::Value::Array(a) => a.into_iter().map(drop).collect(),
                v => v,
            }
        }
        drop(serde_json::to_value(r).unwrap())
    }

    #[test]
    fn a_trace_read_while_it_is_written_reports_as_the_file_read_after() {
        let dir = tempfile::tempdir().unwrap();
        let opts = ReportOpts::default();
        let parts = stream(77);
        // Another process's trace, and one of the same pid from before
        // the start: neither is the one followed.
        for (name, pid, start) in [("other.5.mtrace", 5, 2_000), ("old.77.mtrace", 77, 10)] {
            let mut h = Vec::new();
            let hd =
                Header { pointer_size: 8, arch: "x86_64".into(), pid, start_monotonic_ns: start, ..Default::default() };
            mtrace_format::encode_header(&mut h, &hd);
            std::fs::write(dir.path().join(name), h).unwrap();
        }
        let following = opts.follow(dir.path(), 77, 500).unwrap();
        // The process writes its trace part by part while it is read.
        let path = dir.path().join("prog.77.mtrace");
        let mut f = File::create(&path).unwrap();
        for part in &parts {
            std::thread::sleep(Duration::from_millis(40));
            f.write_all(part).unwrap();
        }
        let followed = following.finish().unwrap();
        assert_eq!(followed.path, path);
        let (t, sym) = followed.into_loaded().unwrap();
        assert_eq!((t.books.allocations, t.error.is_none()), (1_001, true));
        let mut out = Vec::new();
        let live = opts.report_loaded((t, sym), Some(&mut out), |_, _, _| {}).unwrap().report.unwrap();
        let after = opts.report(&path, Some(&mut Vec::new())).unwrap().report.unwrap();
        assert_eq!(untimed(&live), untimed(&after));
        assert_eq!((after.summary.leaked_bytes, after.summary.leaked_blocks), (24, 1));
    }

    #[test]
    fn no_trace_of_the_process_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let following = ReportOpts::default().follow(dir.path(), 77, 0).unwrap();
        assert!(following.finish().is_none());
    }
}
