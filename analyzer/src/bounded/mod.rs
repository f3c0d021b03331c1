//! Bounded traces (`mtrace run --max-trace-size`): the program's processes
//! stream to mtrace, which keeps each one's books as the records arrive
//! and writes its trace file with a checkpoint (docs/FORMAT.md, record 28)
//! every quarter of the bound; past three quarters, the file is cut at its
//! oldest checkpoint that leaves at most half, so a run of any length
//! keeps a trace within its bound that still reports every block live at
//! its end, with its backtrace and allocation time, and the run's totals.
//!
//! The records are written as they came (each thread's in its order, the
//! producer's watermarks kept), encoded again: a checkpoint goes between
//! two of them where the merge has handed everything read to the books
//! (right after a watermark that left nothing waiting), so the books it
//! restates are exactly those of the records before it.

mod checkpoint;
mod file;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use mtrace_format::{encode_compressed, encode_header, naming, Encoder, Reader, Record};

use crate::input::{Keeper, Route, Sections};
use crate::trace::{Trace, Window};
use file::TraceFile;

/// The smallest bound, bytes: a few compressed blocks and checkpoints.
pub const MIN_BOUND: u64 = 64 << 10;

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
}

/// Records encoded and not yet compressed into the file.
struct Pending {
    raw: Vec<u8>,
    enc: Encoder,
    /// The thread of the chunk being written (`None`: a new chunk starts).
    tid: Option<u32>,
    /// Latest record time, ns (a new chunk's base).
    time: u64,
}

impl Pending {
    fn push(&mut self, tid: u32, rec: &Record) {
        if let Some(t) = rec.time_ns().filter(|_| !matches!(rec, Record::Watermark { .. })) {
            self.time = t;
        }
        if self.tid != Some(tid) {
            self.enc.encode(&mut self.raw, &Record::Thread { tid, time_ns: self.time });
            self.tid = Some(tid);
        }
        self.enc.encode(&mut self.raw, rec);
    }

    /// Compresses what is pending into `f`.
    fn flush(&mut self, f: &mut TraceFile) -> Result<()> {
        if self.raw.is_empty() {
            return Ok(());
        }
        let mut out = Vec::with_capacity(self.raw.len() / 4 + 16);
        encode_compressed(&mut out, &self.raw, 1)?;
        self.raw.clear();
        f.append(&out)
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
/// `dest` that stays within `max` bytes plus a checkpoint and a block.
/// Returns what it did; errors only when the file cannot be written (a
/// stream that breaks off ends the file where it broke, as the preload's
/// would).
pub fn keep(src: impl Read, dest: Dest, max: u64) -> Result<Kept> {
    let mut r = Reader::new(std::io::BufReader::with_capacity(1 << 16, src));
    let header = match r.header() {
        Ok(h) => h,
        Err(e) => return Ok(Kept { error: Some(e.to_string()), ..Default::default() }),
    };
    let mut head = Vec::new();
    encode_header(&mut head, &header);
    let mut f = match dest {
        Dest::Dir(dir) => {
            let base = dir.join(naming::expand("%e.%p.mtrace", header.pid, &naming::program_name(&header.cmdline)));
            TraceFile::create(naming::candidates(&base.display().to_string()), head)?
        }
        Dest::File(p) => TraceFile::create(std::iter::once(p.display().to_string()), head)?,
    };
    let version = header.version;
    let mut t = Trace::new(f.path(), header);
    let mut keeper = Keeper::new(&EVERYTHING);
    let mut merge = crate::order::Merge::new(version);
    let mut sections = Sections::default();
    let mut p = Pending { raw: Vec::with_capacity(BLOCK + 4096), enc: Encoder::new(), tid: None, time: 0 };
    let mut kept = Kept { path: f.path().to_owned(), ..Default::default() };
    let segment = max / 4;
    // Where the last checkpoint ended (the header, before the first).
    let mut last = f.len();
    let mut checkpoint_len = 0;
    loop {
        let rec = match r.next_record() {
            Ok(Some(rec)) => rec,
            Ok(None) => break,
            Err(e) => {
                kept.error = Some(e.to_string());
                break;
            }
        };
        // A producer's own chunks: this writer makes its own.
        if matches!(rec, Record::Thread { .. }) || sections.route(&rec) != Route::Merge {
            continue;
        }
        let tid = r.tid();
        let watermark = matches!(rec, Record::Watermark { .. });
        p.push(tid, &rec);
        merge.push(tid, rec, &mut |tid, rec| {
            let _ = keeper.apply(&mut t, tid, rec);
        });
        if p.raw.len() >= BLOCK {
            p.flush(&mut f)?;
        }
        // At least twice the last checkpoint's size between two: a large
        // live set against a small bound would write little but checkpoints.
        if watermark && merge.queued() == 0 && f.len() - last >= segment.max(2 * checkpoint_len) {
            p.flush(&mut f)?;
            let at = f.len();
            write_checkpoint(&mut t, &mut f, &mut p)?;
            checkpoint_len = f.len() - at;
            kept.checkpoints += 1;
            if f.len() > max / 4 * 3 {
                f.cut_to(max / 2)?;
            }
            last = f.len();
        }
    }
    merge.finish(&mut |tid, rec| {
        let _ = keeper.apply(&mut t, tid, rec);
    });
    p.flush(&mut f)?;
    kept.dropped = f.dropped;
    Ok(kept)
}

/// Writes a checkpoint of `t`'s books at the end of `f`; the next record
/// starts a chunk of its own.
fn write_checkpoint(t: &mut Trace, f: &mut TraceFile, p: &mut Pending) -> Result<()> {
    t.books.settle();
    let time = t.last_time;
    f.mark_checkpoint();
    let mut enc = Encoder::new();
    let mut raw = Vec::with_capacity(BLOCK + 4096);
    let mut result = Ok(());
    checkpoint::write(t, time, &mut |rec| {
        match rec {
            // Its ends at the top level, plain, where a reader finds them
            // without decompressing.
            Record::Checkpoint { .. } | Record::CheckpointEnd { .. } => {
                let mut out = Vec::new();
                if !raw.is_empty() {
                    result = result.as_ref().ok().map_or(Ok(()), |_| encode_compressed(&mut out, &raw, 1));
                    raw.clear();
                }
                enc.encode(&mut out, rec);
                if result.is_ok() {
                    result = f.append(&out).map_err(std::io::Error::other);
                }
            }
            _ => {
                enc.encode(&mut raw, rec);
                if raw.len() >= BLOCK {
                    let mut out = Vec::new();
                    if result.is_ok() {
                        result = encode_compressed(&mut out, &raw, 1)
                            .and_then(|_| f.append(&out).map_err(std::io::Error::other));
                    }
                    raw.clear();
                }
            }
        }
    });
    result?;
    p.tid = None;
    Ok(())
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
    /// keeping each in `dir` within `max` bytes. Returns the keepers and
    /// the socket's address for `MTRACE_OUTPUT` (`unix:PATH`).
    pub fn start(dir: &Path, max: u64) -> Result<(Keepers, String)> {
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
                let (o, d, dir) = (o.clone(), d.clone(), dir.clone());
                std::thread::spawn(move || {
                    let k = keep(s, Dest::Dir(&dir), max);
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
        // A process that just connected is counted once its thread runs.
        std::thread::sleep(Duration::from_millis(20));
        while self.open.load(Ordering::Acquire) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
