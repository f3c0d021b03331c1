//! Reading a trace into the books: an mtrace stream (one pass, one record
//! at a time, decoded on a second thread), glibc's `MALLOC_TRACE` log, or a
//! stream still arriving (`live`).

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use mtrace_format::{Module, ReadError, Reader, Record};

use crate::trace::{Trace, Window};

mod ahead;
pub mod glibc_log;
pub mod growing;
mod keeper;
pub mod live;
mod release;
mod sections;
pub use keeper::{pool_key, Flow, Keeper};
pub use sections::{Route, Sections};

/// The module list a trace starts with (empty when it cannot be read).
pub fn first_modules(path: &Path) -> Vec<Module> {
    let Ok(f) = File::open(path) else { return Vec::new() };
    let mut r = Reader::new(f);
    if r.header().is_err() {
        return Vec::new();
    }
    while let Ok(Some(rec)) = r.next_record() {
        if let Record::Modules { modules, .. } = rec {
            return modules;
        }
    }
    Vec::new()
}
/// When the trace at `path` started (its header's CLOCK_REALTIME, ns since
/// the Unix epoch). Fails when its header cannot be read (a glibc
/// `MALLOC_TRACE` log has none).
pub fn start_realtime_ns(path: &Path) -> Result<u64> {
    let f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let h = Reader::new(std::io::BufReader::new(f))
        .header()
        .map_err(|e| anyhow::anyhow!("{}: {e}: no start time to place a wall-clock --from or --to", path.display()))?;
    Ok(h.start_realtime_ns)
}

/// Records per batch handed from the decoding thread.
const BATCH: usize = 4096;

/// Batches the decoding thread may send ahead of the books (at most 8 MB).
/// The merge hands records on in bursts, a writer round's at each
/// watermark (python3's trace: 20 K records every 5 ms); with 4 batches
/// ahead the decoder stopped in the middle of each burst, and the books
/// then waited for the next round's decoding: 60-70 ms of a 0.25-s report
/// of python3's trace, 0.25 -> 0.22 s with 32.
const BATCHES_AHEAD: usize = 32;

/// A batch goes once its snapshot regions hold this many bytes (the
/// stream's payloads, as decoded), whatever its count of records: the
/// regions of a leak scan come in one burst, and 20 M small blocks' 2,800
/// regions, all in one batch, kept the whole raw snapshot alive beside the
/// books while they were entered (the report's RSS 1,932 MiB at the end
/// of the reading, 1,236 MiB once the freed payloads were trimmed; 1,245
/// MiB at the end with this).
/// [`BATCHES_AHEAD`] batches of at most this much: 32 MB in flight.
const BATCH_BYTES: usize = 1 << 20;

/// A batch of records in the merge's order: each record's thread, the
/// record, and the books' promise for it ([`ahead::promises`]), in three
/// vectors of one length; then, in the last batch of a stream that broke
/// off, where it broke. Records and threads apart: a (thread, record)
/// pair built as the merge hands a record on was then copied into the
/// batch with loads across the stores that had just written it, which the
/// CPU cannot forward (see `Reader::next_into`): a stall on every record,
/// a sixth of the samples of a report of python3's trace.
struct Batch {
    tids: Vec<u32>,
    recs: Vec<Record>,
    until: Vec<u64>,
    error: Option<ReadError>,
}

/// A batch's vectors, emptied by the books and handed back to be filled
/// again: a new batch's were fresh memory, written page by page (the
/// merge's hand-on was a fifth of the page faults of a report of cxx's
/// trace).
type EmptyBatch = (Vec<u32>, Vec<Record>, Vec<u64>);

/// Records gathered into batches for the books' thread, each batch with
/// its promises ([`ahead::promises`], worked out here, off the books'
/// thread).
struct Batcher {
    tids: Vec<u32>,
    recs: Vec<Record>,
    /// Bytes of the snapshot regions in `recs` ([`BATCH_BYTES`]).
    bytes: usize,
    tx: std::sync::mpsc::SyncSender<Batch>,
    /// The books' emptied batches.
    back: std::sync::mpsc::Receiver<EmptyBatch>,
    /// Only a merge by watermarks hands records on in time order.
    in_order: bool,
    /// The stamp the previous batch's promises ended at, ns.
    last: u64,
    /// The receiver is gone (a report that ended at a marker).
    gone: bool,
}

impl Batcher {
    /// Adds a record; a full batch goes at once, also in the middle of a
    /// watermark's release.
    #[inline]
    fn push(&mut self, tid: u32, rec: Record) {
        if let Record::ScanRegion { bytes, .. } = &rec {
            self.bytes += bytes.len();
        }
        self.tids.push(tid);
        self.recs.push(rec);
        if self.recs.len() >= BATCH || self.bytes >= BATCH_BYTES {
            self.send(None);
        }
    }

    /// Sends the batch so far, and `error` after it (nothing once the
    /// receiver is gone).
    #[cold]
    #[inline(never)]
    fn send(&mut self, error: Option<ReadError>) {
        let (tids, recs, mut until) = self
            .back
            .try_recv()
            .unwrap_or_else(|_| (Vec::with_capacity(BATCH), Vec::with_capacity(BATCH), Vec::with_capacity(BATCH)));
        let tids = std::mem::replace(&mut self.tids, tids);
        let recs = std::mem::replace(&mut self.recs, recs);
        self.bytes = 0;
        if self.gone {
            return;
        }
        ahead::promises(&tids, &recs, self.in_order, &mut self.last, &mut until);
        self.gone = self.tx.send(Batch { tids, recs, until, error }).is_err();
    }
}

/// Decodes `r` (a stream of format `version`) to its end (or first error),
/// merges its records into one order ([`crate::order`]), and sends them in
/// batches into `tx`; stops when the receiver is gone (a report that ends
/// at a marker). A stream that breaks off sends everything read before
/// the error, then the error.
fn decode_batches<R: std::io::Read>(
    mut r: Reader<R>,
    version: u64,
    tx: std::sync::mpsc::SyncSender<Batch>,
    back: std::sync::mpsc::Receiver<EmptyBatch>,
) {
    let mut merge = crate::order::Merge::new(version).snapshots_at_once();
    let mut sections = Sections::default();
    let in_order = version >= crate::order::WATERMARKS_SINCE;
    let (tids, recs) = (Vec::with_capacity(BATCH), Vec::with_capacity(BATCH));
    let mut out = Batcher { tids, recs, bytes: 0, tx, back, in_order, last: 0, gone: false };
    // Records are decoded RING at a time into slots that are read only
    // after the RING are written ([`Reader::next_into`]).
    const RING: usize = 64;
    let mut ring: Vec<(u32, Record)> = (0..RING).map(|_| (0, Record::EMPTY)).collect();
    loop {
        let mut n = 0;
        let mut end = Ok(true);
        while n < RING {
            end = r.next_into(&mut ring[n].1);
            if !matches!(end, Ok(true)) {
                break;
            }
            ring[n].0 = r.tid();
            n += 1;
        }
        for (tid, rec) in &mut ring[..n] {
            let rec = std::mem::replace(rec, Record::EMPTY);
            sections.pass(&mut merge, *tid, rec, &mut |tid, rec| out.push(tid, rec));
        }
        if out.gone {
            return;
        }
        match end {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                merge.finish(&mut |tid, rec| out.push(tid, rec));
                return out.send(Some(e));
            }
        }
    }
    merge.finish(&mut |tid, rec| out.push(tid, rec));
    out.send(None);
}

/// Reads the trace at `path`. Fails only when the file cannot be opened or
/// its header cannot be read; a stream that breaks off later is returned
/// with [`Trace::error`] set and everything before the break in the books.
pub fn load(path: &Path) -> Result<Trace> {
    load_window(path, &Window::default())
}

/// [`load`], counting from marker `w.since` and stopping at `w.until`.
/// Fails when a named marker is not in the trace.
pub fn load_window(path: &Path, w: &Window) -> Result<Trace> {
    let f = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    if glibc_log::is_log(path) {
        return glibc_log::load(path, None);
    }
    let len = f.metadata().map_or(0, |m| m.len());
    // From a time: from the latest checkpoint before it, where the trace
    // has one (a bounded trace's), after the header; else from the start.
    let (head, at) = w.from_ns.and_then(|from| checkpoint_before(path, from)).unwrap_or_default();
    let mut f = f;
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(at))?;
    let bar = crate::progress::Bar::for_file(len - at);
    let t = load_from(std::io::Read::chain(&head[..], bar.reader(f)), path, w);
    bar.finish();
    t
}

/// The header's bytes and the offset of the latest checkpoint of the
/// trace at `path` at or before `time_ns` (docs/FORMAT.md, record 28), if
/// it has one after its first records: found at the stream's own level,
/// its compressed blocks passed over unread.
pub fn checkpoint_before(path: &Path, time_ns: u64) -> Option<(Vec<u8>, u64)> {
    let mut r = Reader::new(std::io::BufReader::new(File::open(path).ok()?));
    r.header().ok()?;
    let head_len = r.offset();
    r.skip_blocks(true);
    let mut best = None;
    loop {
        match r.next_record() {
            Ok(Some(Record::Checkpoint { time_ns: t, .. })) if t <= time_ns => best = Some(r.record_offset()),
            Ok(Some(Record::Checkpoint { .. })) | Ok(None) | Err(_) => break,
            Ok(Some(_)) => {}
        }
    }
    let at = best.filter(|&at| at > head_len)?;
    let mut head = vec![0; head_len as usize];
    std::io::Read::read_exact(&mut File::open(path).ok()?, &mut head).ok()?;
    Some((head, at))
}

/// [`load_window`] of a stream read from `src` (`path` names it in
/// messages): a file, a socket, bytes in memory.
pub fn load_from<R: std::io::Read + Send>(src: R, path: &Path, w: &Window) -> Result<Trace> {
    let mut r = Reader::new(src);
    let header = r.header().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let version = header.version;
    let mut t = Trace::new(path, header);
    if w.lifetimes {
        t.books.lifetimes = Some(Box::default());
    }
    let mut keeper = Keeper::new(w);
    // Decoding (decompression included) on a second thread, a batch of
    // records at a time, while this one keeps the books.
    std::thread::scope(|sc| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(BATCHES_AHEAD);
        let (back_tx, back) = std::sync::mpsc::channel::<EmptyBatch>();
        sc.spawn(move || decode_batches(r, version, tx, back));
        let mut addrs = Vec::with_capacity(BATCH);
        'outer: for Batch { mut tids, mut recs, mut until, error } in rx {
            // The heap's lines for a record's address are asked for
            // AHEAD_INDEX and AHEAD_SLOT records before it is entered
            // (`addr_table/`): with a million blocks live, each
            // event's lookup is otherwise a wait for memory.
            addrs.clear();
            addrs.extend(recs.iter().map(heap_addr));
            addrs.extend([0; AHEAD_INDEX]);
            for (i, rec) in recs.iter_mut().enumerate() {
                t.books.prefetch(addrs[i + AHEAD_INDEX], false);
                t.books.prefetch(addrs[i + AHEAD_SLOT], true);
                let tid = tids[i];
                t.books.promise(tid, until[i]);
                // The hot records' fields read where they are: moving the
                // record out first copies it with 16-byte loads across the
                // stores that wrote the copy, which the CPU cannot forward
                // (a fifth of this loop's time on python3's trace).
                let flow = match rec {
                    Record::Alloc { time_ns, family, addr, size, stack, align } => {
                        keeper.alloc(&mut t, tid, *time_ns, *family, *addr, *size, *stack, *align)
                    }
                    Record::Free { time_ns, family, addr, stack, size, align } => {
                        keeper.free(&mut t, tid, *time_ns, *family, *addr, *stack, (*size, *align))
                    }
                    rec => keeper.apply(&mut t, tid, std::mem::replace(rec, Record::EMPTY)),
                };
                if flow == Flow::Until {
                    break 'outer;
                }
            }
            if error.is_some() {
                t.error = error;
                break;
            }
            tids.clear();
            recs.clear();
            until.clear();
            // (The decoder may have ended: then nothing is taken back.)
            let _ = back_tx.send((tids, recs, until));
        }
    });
    keeper.finish(&mut t)?;
    t.books.done_entering();
    // What the reading freed (the records waiting in the merge, the
    // snapshot's payloads) stays in glibc's arenas, counted in the RSS,
    // while the scan allocates anew: 20 M blocks with a leak scan peaked
    // at 3.49 GB without this, 2.50 GB with it. (Since batches are
    // bounded in bytes, [`BATCH_BYTES`], only some 8 MB are left to give
    // back there.)
    release::free_memory_to_the_system();
    Ok(t)
}

/// How many records ahead the heap's index line, and then the slot, of a
/// record's address are fetched (measured on jq's trace, 1.6 M live blocks).
const AHEAD_INDEX: usize = 16;
const AHEAD_SLOT: usize = 8;

/// The heap address record `r` looks up (0: none).
fn heap_addr(r: &Record) -> u64 {
    match *r {
        Record::Alloc { addr, .. } | Record::Free { addr, .. } => addr,
        Record::Realloc { old, .. } => old,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtrace_format::{region_kind, Encoder, Family, Header};

    #[test]
    fn a_burst_of_snapshot_regions_goes_in_batches_bounded_in_bytes() {
        let mut out = Vec::new();
        let h = Header { pointer_size: 8, arch: "x86_64".into(), pid: 1, ..Default::default() };
        mtrace_format::encode_header(&mut out, &h);
        let mut enc = Encoder::new();
        enc.encode(&mut out, &Record::Thread { tid: 1, time_ns: 0 });
        let alloc = Record::Alloc { time_ns: 64, family: Family::Malloc, addr: 0x1000, size: 8, stack: 0, align: 0 };
        enc.encode(&mut out, &alloc);
        // 10 regions of 300 KiB: a batch goes at the fourth (past 1 MiB);
        // by count (4,096 records) all would go in one.
        for k in 0..10u64 {
            let bytes = vec![1; 300 << 10];
            let region = Record::ScanRegion { time_ns: 128, kind: region_kind::MAPPING, addr: k << 20, bytes };
            enc.encode(&mut out, &region);
        }
        let mut r = Reader::new(&out[..]);
        let version = r.header().unwrap().version;
        let (tx, rx) = std::sync::mpsc::sync_channel(100);
        decode_batches(r, version, tx, std::sync::mpsc::channel().1);
        let regions = |b: &Batch| b.recs.iter().filter(|r| matches!(r, Record::ScanRegion { .. })).count();
        let batches: Vec<usize> = rx.iter().map(|b| regions(&b)).collect();
        // The first batch holds the Thread and Alloc records too.
        assert_eq!(batches, [4, 4, 2], "regions per batch");
    }
}
