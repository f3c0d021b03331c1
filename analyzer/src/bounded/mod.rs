//! Bounded traces (`mtrace run --max-trace-size`): the program's processes
//! stream to mtrace, which keeps each one's books as the records arrive
//! and writes its trace file with a checkpoint (docs/FORMAT.md, record 28)
//! every quarter of the bound; past three quarters, the file is cut at its
//! oldest checkpoint that leaves at most half, so a run of any length
//! keeps a trace within its bound that still reports every block live at
//! its end, with its backtrace and allocation time, and the run's totals.
//!
//! The file holds the stream's own bytes, as they came, with checkpoints
//! between them: a checkpoint goes between two of the stream's own
//! records where the next starts a chunk (a Thread record: a reader that
//! starts there needs no time or address from before), and restates the
//! books of the records the merge handed on before it, then the records
//! still waiting in the merge (which a reader starting there merges again
//! with those after). One thread decodes and
//! merges, another keeps the books and the file: `mtrace cut` of a 2-thread
//! churn's 119 M events took 7.6 s (13.2 s on one thread re-encoding).

mod checkpoint;
mod file;
mod report_points;

pub use report_points::ReportPoints;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use mtrace_format::{encode_compressed, naming, Encoder, Reader, Record};

use crate::input::{Keeper, Sections};
use crate::trace::{Trace, Window};
use file::TraceFile;

/// The smallest bound, bytes: a few compressed blocks and checkpoints.
pub const MIN_BOUND: u64 = 64 << 10;

/// `--max-trace-size`'s value (bytes), refused below [`MIN_BOUND`] in one
/// line that names the option.
pub fn check_bound(max: u64) -> Result<u64> {
    anyhow::ensure!(max >= MIN_BOUND, "--max-trace-size {max}: at least 64K");
    Ok(max)
}

/// Raw bytes of records collected before they are compressed into a block.
const BLOCK: usize = 256 << 10;

/// Every record kept: no window.
static EVERYTHING: Window = Window { since: None, until: None, from_ns: None, to_ns: None, lifetimes: false };

/// What [`keep`] did with one stream.
#[derive(Debug, Default)]
pub struct Kept {
    /// The trace file.
    pub path: PathBuf,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Bytes cut from the file's start.
    pub dropped: u64,
    /// Why the stream ended early, if it did.
    pub error: Option<String>,
    /// Report points whose .memlog could not be written, and why.
    pub problems: Vec<String>,
}

/// What the reading thread hands the keeping one, in stream order.
enum Item {
    /// A record, in the merge's order, for the books.
    Rec(u32, Record),
    /// The stream's bytes, as they came, for the file.
    Bytes(Vec<u8>),
    /// The books will hold every record before the bytes handed so far
    /// but these (waiting in the merge), and the next bytes start a
    /// chunk: a checkpoint may go here.
    Quiet(Vec<(u32, Record)>),
    /// The stream broke off here.
    Broken(String),
}

/// Items per batch between the two threads.
const BATCH: usize = 4096;

/// The source, with a copy of what was read from it that the file has not
/// taken yet.
struct Tee<R> {
    src: R,
    copy: Vec<u8>,
    /// Stream offset of `copy[0]`.
    base: u64,
}

impl<R: Read> Read for Tee<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.src.read(buf)?;
        self.copy.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

impl<R> Tee<R> {
    /// The copied bytes before stream offset `upto`.
    fn take(&mut self, upto: u64) -> Vec<u8> {
        let n = (upto.saturating_sub(self.base) as usize).min(self.copy.len());
        let rest = self.copy.split_off(n);
        self.base += n as u64;
        std::mem::replace(&mut self.copy, rest)
    }
}

/// Where [`keep`] writes.
#[derive(Clone, Copy, Debug)]
pub enum Dest<'a> {
    /// A new file in this folder, named as the preload names its own
    /// (docs/FORMAT.md, "Files").
    Dir(&'a Path),
    /// This file, which must not exist.
    File(&'a Path),
}

/// Reads one process's stream from `src` and writes it to a trace file at
/// `dest` that stays within `max` bytes plus a checkpoint and a block:
/// the stream's own bytes, with checkpoints between them. Decoding and the
/// merge on one thread, the books and the file on another. Returns what
/// it did; errors only when the file cannot be written (a stream that
/// breaks off ends the file where it broke, as the preload's would).
/// With `points`, writes the .memlog of each report point as it passes.
pub fn keep(src: impl Read + Send, dest: Dest, max: u64, mut points: Option<&mut ReportPoints>) -> Result<Kept> {
    let mut r = Reader::new(Tee { src: std::io::BufReader::with_capacity(1 << 16, src), copy: Vec::new(), base: 0 });
    let header = match r.header() {
        Ok(h) => h,
        Err(e) => return Ok(Kept { error: Some(e.to_string()), ..Default::default() }),
    };
    let at = r.offset();
    let head = r.source_mut().take(at);
    let mut f = match dest {
        Dest::Dir(dir) => {
            let base = dir.join(naming::expand("%e.%p.mtrace", header.pid, &naming::program_name(&header.cmdline)));
            TraceFile::create(naming::candidates(&base.display().to_string()), head)?
        }
        Dest::File(p) => TraceFile::create(std::iter::once(p.display().to_string()), head)?,
    };
    let version = header.version;
    if let Some(p) = points.as_deref_mut() {
        p.started(header.pid);
    }
    let mut t = Trace::new(f.path(), header);
    let mut keeper = Keeper::new(&EVERYTHING);
    let mut kept = Kept { path: f.path().to_owned(), ..Default::default() };
    let segment = max / 4;
    // Where the last checkpoint ended (the header, before the first), and its size.
    let (mut last, mut checkpoint_len) = (f.len(), 0);
    let mut overrun = false;
    // Stream bytes between two places offered for a checkpoint (its
    // pending records are copied for each).
    let gap = AtomicU64::new(segment);
    std::thread::scope(|sc| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Item>>(4);
        let gap = &gap;
        sc.spawn(move || read(r, version, tx, gap));
        for batch in rx {
            for item in batch {
                match item {
                    Item::Rec(tid, Record::Marker { time_ns, seq, name }) => {
                        let point = (seq, name.clone());
                        let _ = keeper.apply(&mut t, tid, Record::Marker { time_ns, seq, name });
                        if let Some(p) = points.as_deref_mut() {
                            p.marker(&mut t, point.0, &point.1);
                        }
                    }
                    Item::Rec(tid, rec) => {
                        let _ = keeper.apply(&mut t, tid, rec);
                    }
                    Item::Bytes(b) => {
                        f.append(&b)?;
                        // No place for a checkpoint came (no chunk started
                        // at the stream's own level): said once.
                        if f.len() - last > max * 2 && !overrun {
                            overrun = true;
                            kept.problems.push(format!(
                                "the trace grew by twice --max-trace-size ({max} bytes) after its last checkpoint: no place came \
                                 between two of the stream's records where a chunk starts, to put one"
                            ));
                        }
                    }
                    // At least twice the last checkpoint's size between two:
                    // a large live set against a small bound would write
                    // little but checkpoints.
                    Item::Quiet(pending) if f.len() - last >= segment.max(2 * checkpoint_len) => {
                        let at = f.len();
                        write_checkpoint(&mut t, &mut f, &pending)?;
                        checkpoint_len = f.len() - at;
                        gap.store(segment.max(2 * checkpoint_len), Ordering::Relaxed);
                        kept.checkpoints += 1;
                        if f.len() > max / 4 * 3 {
                            f.cut_to(max / 2)?;
                        }
                        last = f.len();
                    }
                    Item::Quiet(_) => {}
                    Item::Broken(e) => kept.error = Some(e),
                }
            }
        }
        Ok(())
    })?;
    kept.dropped = f.dropped;
    if let Some(p) = points {
        kept.problems.append(&mut p.problems);
    }
    Ok(kept)
}

/// The reading thread of [`keep`]: decodes `r` (a stream of format
/// `version`), merges its records, and sends them with the stream's bytes
/// and the places a checkpoint may go. Reads to the end even when the
/// keeping thread is gone (the program must not wait on a full socket).
fn read<R: Read>(mut r: Reader<Tee<R>>, version: u64, tx: std::sync::mpsc::SyncSender<Vec<Item>>, gap: &AtomicU64) {
    let mut merge = crate::order::Merge::new(version);
    let mut sections = Sections::default();
    let mut batch = Vec::with_capacity(BATCH);
    let mut gone = false;
    let send = |batch: &mut Vec<Item>, gone: &mut bool| {
        let full = std::mem::replace(batch, Vec::with_capacity(BATCH));
        if !*gone {
            *gone = tx.send(full).is_err();
        }
    };
    // A place between two of the stream's own records after a watermark,
    // a gap after the last one offered: its offset, until the next record
    // shows whether a chunk starts there.
    let mut quiet_at = None;
    // Where the last place was offered; a watermark was read since the
    // last place between two of the stream's own records.
    let (mut offered, mut since_watermark) = (0, false);
    loop {
        let rec = match r.next_record() {
            Ok(Some(rec)) => rec,
            Ok(None) => break,
            Err(e) => {
                batch.push(Item::Broken(e.to_string()));
                break;
            }
        };
        if let Some(at) = quiet_at.take() {
            // A chunk starts there: a reader that starts after a
            // checkpoint needs no time or address from before it.
            if matches!(rec, Record::Thread { .. }) {
                batch.push(Item::Bytes(r.source_mut().take(at)));
                batch.push(Item::Quiet(merge.pending()));
                offered = at;
            }
        }
        // A producer writes no checkpoints; a trace cut before (`mtrace
        // cut` of a bounded trace) starts with one: its books are restored.
        let watermark = matches!(rec, Record::Watermark { .. });
        if !sections.pass(&mut merge, r.tid(), rec, &mut |tid, rec| batch.push(Item::Rec(tid, rec))) {
            continue;
        }
        since_watermark |= watermark;
        if r.at_top() {
            // At the end of a block with a watermark, the merge holds
            // little (what was stamped after it).
            if std::mem::take(&mut since_watermark) && r.offset() - offered >= gap.load(Ordering::Relaxed) {
                quiet_at = Some(r.offset());
            } else if r.source_mut().copy.len() >= BLOCK {
                let at = r.offset();
                batch.push(Item::Bytes(r.source_mut().take(at)));
            }
        }
        // A watermark comes every 5 to 50 ms while the program runs: what
        // it released goes on at once (a report point's marker is
        // answered then, not when a batch fills).
        if batch.len() >= BATCH || watermark {
            send(&mut batch, &mut gone);
        }
    }
    merge.finish(&mut |tid, rec| batch.push(Item::Rec(tid, rec)));
    batch.push(Item::Bytes(r.source_mut().take(u64::MAX)));
    send(&mut batch, &mut gone);
}

/// Writes a checkpoint of `t`'s books, and of the records `pending` in
/// the merge, at the end of `f`.
fn write_checkpoint(t: &mut Trace, f: &mut TraceFile, pending: &[(u32, Record)]) -> Result<()> {
    t.books.settle();
    let time = t.last_time;
    f.mark_checkpoint();
    let mut enc = Encoder::new();
    let mut raw = Vec::with_capacity(BLOCK + 4096);
    let mut out = Vec::new();
    let mut result = Ok(());
    checkpoint::write(t, time, pending, &mut |rec| {
        // Its ends at the stream's own level, plain, where a reader finds
        // them without decompressing; what is between, in blocks.
        let plain = matches!(rec, Record::Checkpoint { .. } | Record::CheckpointEnd { .. });
        if plain || raw.len() >= BLOCK {
            if !raw.is_empty() && result.is_ok() {
                result = encode_compressed(&mut out, &raw, 1);
            }
            raw.clear();
        }
        enc.encode(if plain { &mut out } else { &mut raw }, rec);
        if out.len() >= BLOCK && result.is_ok() {
            result = f.append(&out).map_err(std::io::Error::other);
            out.clear();
        }
    });
    result?;
    f.append(&out)
}

/// The streams of a program's processes, each kept by [`keep`] on a
/// thread of its own as its process connects.
pub struct Keepers {
    /// Streams not ended yet.
    open: Arc<AtomicUsize>,
    /// What each ended one did.
    done: Arc<Mutex<Vec<Result<Kept>>>>,
    /// The socket's folder (removed at the end).
    _dir: tempfile::TempDir,
}

impl Keepers {
    /// Listens on a private socket (0600, in a 0700 folder) for streams,
    /// keeping each in `dir` within `max` bytes, and writing the .memlog of
    /// each report point into `reports` (none: the process's working
    /// directory) with at most `depth` frames per backtrace. Returns the keepers and
    /// the socket's address for `MTRACE_OUTPUT` (`unix:PATH`).
    pub fn start(dir: &Path, max: u64, reports: Option<PathBuf>, depth: Option<usize>) -> Result<(Keepers, String)> {
        let sock_dir = tempfile::Builder::new().prefix("mtrace-keep.").tempdir()?;
        let sock = sock_dir.path().join("s.sock");
        let l = UnixListener::bind(&sock)?;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
        let open = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(Mutex::new(Vec::new()));
        let (o, d, dir) = (open.clone(), done.clone(), dir.to_owned());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                o.fetch_add(1, Ordering::AcqRel);
                let (o, d, dir, reports) = (o.clone(), d.clone(), dir.clone(), reports.clone());
                std::thread::spawn(move || {
                    let mut points = ReportPoints::new(reports, depth);
                    let k = keep(s, Dest::Dir(&dir), max, Some(&mut points));
                    d.lock().unwrap_or_else(|e| e.into_inner()).push(k);
                    o.fetch_sub(1, Ordering::AcqRel);
                });
            }
        });
        let addr = format!("unix:{}", sock.display());
        Ok((Keepers { open, done, _dir: sock_dir }, addr))
    }

    /// Waits until every stream has ended, or `grace` has passed since the
    /// call (a process that outlives the program keeps its stream open).
    /// Returns what each ended stream did.
    pub fn finish(self, grace: Duration) -> Vec<Result<Kept>> {
        let until = Instant::now() + grace;
        // A process that just connected is counted once the listening
        // thread has accepted it.
        std::thread::sleep(Duration::from_millis(20));
        while self.open.load(Ordering::Acquire) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
