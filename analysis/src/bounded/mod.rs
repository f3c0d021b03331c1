//! Bounded traces (`mtrace run --max-trace-size`, `--max-trace-age`): the
//! program's processes stream to mtrace, which keeps each one's books as
//! the records arrive and writes its trace file with a checkpoint
//! (docs/FORMAT.md, record 28) every quarter of the bound (of its size, or
//! of its age in the program's time); past three quarters of the size,
//! the file is cut at its oldest checkpoint that leaves at most half, and
//! at the newest checkpoint at least the age old; so a run of any length
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

pub use report_points::{follow as follow_report_points, ReportPoints};

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Parses a size (`--max-trace-size`, the server's `--spool-max`): bytes,
/// or a number with K, M or G (powers of 1024;
/// `mtrace_format::sampling::parse_bytes`), not 0.
pub fn parse_size(s: &str) -> Result<u64, String> {
    mtrace_format::sampling::parse_bytes(s)
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?} is not a size (like 4096, 64K, 256M, 1G)"))
}

/// The shortest `--max-trace-age`, ns: a checkpoint every quarter of it.
pub const MIN_AGE_NS: u64 = 1_000_000_000;

/// How much of a stream [`keep`] keeps: at most `bytes` (plus a
/// checkpoint and one of the stream's blocks), and the last `age_ns` of
/// the run (from the newest checkpoint at least `age_ns` old when the
/// latest was written: with a checkpoint every quarter of the age, up to
/// half as much again). Either or both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bound {
    /// Bytes (`--max-trace-size`).
    pub bytes: Option<u64>,
    /// ns of the program's time, as the trace stamps it (`--max-trace-age`).
    pub age_ns: Option<u64>,
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
/// `dest` that stays within `bound` (bytes, plus a checkpoint and a block;
/// age): the stream's own bytes, with checkpoints between them. Decoding
/// and the merge on one thread, the books and the file on another.
/// Returns what it did; errors only when the file cannot be written (a
/// stream that breaks off ends the file where it broke, as the preload's
/// would). With `points`, writes the .memlog of each report point as it
/// passes.
pub fn keep(src: impl Read + Send, dest: Dest, bound: Bound, mut points: Option<&mut ReportPoints>) -> Result<Kept> {
    let mut r = Reader::new(Tee { src: std::io::BufReader::with_capacity(1 << 16, src), copy: Vec::new(), base: 0 });
    let header = match r.header() {
        Ok(h) => h,
        Err(e) => return Ok(Kept { error: Some(e.to_string()), ..Default::default() }),
    };
    let at = r.offset();
    let head = r.source_mut().take(at);
    let mut f = match dest {
        Dest::Dir(dir) => {
            let base = dir.join(naming::expand(
                "%e.%p.mtrace",
                header.pid,
                &naming::program_name(&header.cmdline, &header.exe),
            ));
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
    // A checkpoint every quarter of the size, or of the age, whichever
    // comes first; at least twice the last checkpoint's size between two:
    // a large live set against a small bound would write little but
    // checkpoints.
    let segment = bound.bytes.map(|max| max / 4);
    let period = bound.age_ns.map(|age| age / 4);
    // Where and when the last checkpoint ended (the header, before the
    // first), and its size.
    let (mut last, mut last_time, mut checkpoint_len) = (f.len(), 0, 0);
    let mut overrun = false;
    // Stream bytes between two places offered for a checkpoint (its
    // pending records are copied for each): with only an age, often
    // enough that a slow program's trace is cut near its age.
    let apart = |checkpoint_len: u64| segment.unwrap_or(MIN_BOUND).max(2 * checkpoint_len);
    let gap = AtomicU64::new(apart(0));
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
                        if let Some(max) = bound.bytes.filter(|&max| f.len() - last > max * 2 && !overrun) {
                            overrun = true;
                            kept.problems.push(format!(
                                "the trace grew by twice --max-trace-size ({max} bytes) after its last checkpoint: no place came \
                                 between two of the stream's records where a chunk starts, to put one"
                            ));
                        }
                    }
                    Item::Quiet(pending) => {
                        let by_size = segment.is_some_and(|s| f.len() - last >= s);
                        let by_age = period.is_some_and(|p| t.last_time.saturating_sub(last_time) >= p);
                        if !(by_size || by_age) || f.len() - last < 2 * checkpoint_len {
                            continue;
                        }
                        let at = f.len();
                        write_checkpoint(&mut t, &mut f, &pending)?;
                        checkpoint_len = f.len() - at;
                        gap.store(apart(checkpoint_len), Ordering::Relaxed);
                        kept.checkpoints += 1;
                        // Past three quarters of the size, cut to half; and
                        // what is older than the age (the later of the two).
                        let by_size =
                            bound.bytes.filter(|&max| f.len() > max / 4 * 3).and_then(|max| f.within(max / 2));
                        let by_age = bound.age_ns.and_then(|age| f.newest_by(t.last_time.checked_sub(age)?));
                        if let Some(at) = by_size.max(by_age) {
                            f.cut_at(at)?;
                        }
                        last = f.len();
                        last_time = t.last_time;
                    }
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
    f.mark_checkpoint(time);
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
