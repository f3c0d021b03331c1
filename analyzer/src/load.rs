//! Reading a trace file into the books: one pass over the stream, one
//! record at a time.

use std::fs::File;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use mtrace_format::{EndReason, Header, Module, ReadError, Reader, Record};

use crate::books::Books;
use hashbrown::hash_table::Entry;
// FxHash as in books.rs.
use rustc_hash::{FxBuildHasher, FxHashMap as HashMap};

mod keeper;
pub use keeper::{Flow, Keeper};

/// Backtraces, deduplicated by content: producers may define the same frames
/// under several ids (one per thread); reports group by content.
#[derive(Default)]
pub struct Stacks {
    /// Canonical index → frames (return addresses, innermost first).
    pub frames: Vec<Vec<u64>>,
    /// Canonical index → time (ns) of the first definition, to pick the
    /// module that was mapped at an address then.
    pub def_time: Vec<u64>,
    /// Canonical indices by their frames, which stay in `frames` only (a
    /// map keyed by a copy of them held each backtrace twice: 24 MB on
    /// cc1plus's trace).
    by_frames: hashbrown::HashTable<u32>,
    /// Stream id → canonical index + 1 (0: not defined), for ids below
    /// [`DENSE_IDS`]: producers number backtraces from 1 up, and this is
    /// looked up once an event (a hash lookup was 1.3% of a report).
    by_id: Vec<u32>,
    /// The same for larger ids.
    by_far_id: HashMap<u32, u32>,
    /// (canonical backtrace, pool) → the canonical index used for that
    /// pool's blocks, so that pools never share an entry with the heap.
    by_pool: HashMap<(u32, u32), u32>,
    /// Canonical index → pool id, for the indices made by [`Stacks::for_pool`].
    pub pool_of: HashMap<u32, u32>,
}

impl Stacks {
    pub fn define(&mut self, id: u32, frames: Vec<u64>, time: u64) {
        let hash = |f: &[u64]| FxBuildHasher.hash_one(f);
        let all = &mut self.frames;
        let found = self.by_frames.entry(hash(&frames), |&c| all[c as usize] == frames, |&c| hash(&all[c as usize]));
        let canon = match found {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                let c = all.len() as u32;
                e.insert(c);
                all.push(frames);
                self.def_time.push(time);
                c
            }
        };
        match self.by_id.get_mut(id as usize) {
            Some(c) => *c = canon + 1,
            None if id < DENSE_IDS => {
                self.by_id.resize((id as usize + 1).next_power_of_two(), 0);
                self.by_id[id as usize] = canon + 1;
            }
            None => {
                self.by_far_id.insert(id, canon);
            }
        }
    }

    /// The canonical index for blocks of `pool` allocated at backtrace `canon`.
    pub fn for_pool(&mut self, canon: u32, pool: u32) -> u32 {
        if let Some(&c) = self.by_pool.get(&(canon, pool)) {
            return c;
        }
        let c = self.frames.len() as u32;
        self.frames.push(self.frames[canon as usize].clone());
        self.def_time.push(self.def_time[canon as usize]);
        self.by_pool.insert((canon, pool), c);
        self.pool_of.insert(c, pool);
        c
    }

    /// Canonical index of stream id `id`; an id never defined (its
    /// definition was lost) maps to an empty backtrace.
    #[inline]
    pub fn canon(&mut self, id: u32) -> u32 {
        match self.by_id.get(id as usize) {
            Some(&c) if c != 0 => c - 1,
            _ => self.canon_slow(id),
        }
    }

    fn canon_slow(&mut self, id: u32) -> u32 {
        if let Some(&c) = self.by_far_id.get(&id) {
            return c;
        }
        self.define(id, Vec::new(), 0);
        self.canon(id)
    }
}

/// Stream ids of backtraces below this are kept in [`Stacks`]'s vector
/// (4 bytes each); a corrupt stream's huge ids go to a map.
const DENSE_IDS: u32 = 1 << 24;

/// A module as first seen in the stream.
pub struct ModuleSeen {
    pub module: Module,
    /// ns since the start when the module list containing it was recorded.
    pub time: u64,
}

/// Which marker `--since-marker`/`--until-marker` mean: a number selects
/// incremental report `seq`, `NAME#K` the K-th marker named NAME (from 1),
/// anything else the first marker named so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MarkerSel(pub String);

impl MarkerSel {
    /// Whether the marker `seq`/`name`, the `nth` of that name (from 1), is selected.
    fn matches(&self, seq: u64, name: &str, nth: usize) -> bool {
        if let Ok(n) = self.0.parse::<u64>() {
            return n != 0 && n == seq;
        }
        match self.0.rsplit_once('#').and_then(|(n, k)| Some((n, k.parse::<usize>().ok()?))) {
            Some((n, k)) => n == name && k == nth,
            None => self.0 == name,
        }
    }
}

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

/// Where reading starts counting and stops.
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// Report the change since this marker (live blocks there are the baseline).
    pub since: Option<MarkerSel>,
    /// Stop reading at this marker.
    pub until: Option<MarkerSel>,
    /// Also keep when each backtrace's blocks lived ([`crate::books::lifetimes`]).
    pub lifetimes: bool,
}

/// A marker as read: report number (0 for a named point), name, time (ns).
#[derive(Clone, Debug, serde::Serialize)]
pub struct MarkerSeen {
    pub seq: u64,
    pub name: String,
    pub time_ns: u64,
}

/// Memory at one moment: the process's RSS sample and the books' live heap.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct TimePoint {
    pub time_ns: u64,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Bytes and blocks live in the books (heap blocks and mappings).
    pub heap_bytes: u64,
    pub heap_blocks: u64,
}

/// Everything read from one trace.
pub struct Trace {
    pub path: PathBuf,
    pub header: Header,
    pub books: Books,
    pub stacks: Stacks,
    pub modules: Vec<ModuleSeen>,
    /// The End record, if the producer wrote one.
    pub end: Option<EndReason>,
    /// Latest time seen, ns since the start.
    pub last_time: u64,
    /// Why reading stopped early (truncated or corrupt), if it did.
    pub error: Option<ReadError>,
    pub records: u64,
    /// Every marker read, in stream order.
    pub markers: Vec<MarkerSeen>,
    /// Live bytes and blocks per canonical backtrace at the `since` marker.
    pub baseline: Option<HashMap<u32, crate::books::LiveTotals>>,
    /// The `until` marker was reached (reading stopped there).
    pub reached_until: bool,
    /// One point per RSS sample, in stream order.
    pub timeline: Vec<TimePoint>,
    pub stats: crate::stats::RunStats,
    /// Pool names (`mtrace_alloc`), by id.
    pub pools: HashMap<u32, String>,
    /// The memory snapshot for the leak scan (`MTRACE_SCAN=1`), if complete.
    pub snapshot: Option<Vec<crate::scan::Region>>,
    /// When the snapshot was taken, ns: later blocks are not in it.
    pub snapshot_time: u64,
    /// The last snapshot was an on-demand scan (a "scan" marker follows it).
    pub snapshot_on_demand: bool,
    /// Traced from an attach (`mtrace attach`; an [`ATTACH_MARKER`] marker):
    /// the blocks allocated before it are unknown.
    pub attached: bool,
}

/// Name of the marker the preload writes after an on-demand leak scan.
pub const SCAN_MARKER: &str = mtrace_format::protocol::marker::SCAN;

/// Name of the marker that starts a stream made by `mtrace attach`.
pub const ATTACH_MARKER: &str = mtrace_format::protocol::marker::ATTACH;

impl Trace {
    /// An empty trace of the process `header` describes.
    pub fn new(path: &Path, header: Header) -> Trace {
        Trace {
            path: path.to_owned(),
            header,
            books: Books::default(),
            stacks: Stacks::default(),
            modules: Vec::new(),
            end: None,
            last_time: 0,
            error: None,
            records: 0,
            markers: Vec::new(),
            baseline: None,
            reached_until: false,
            timeline: Vec::new(),
            stats: Default::default(),
            pools: HashMap::default(),
            snapshot: None,
            snapshot_time: u64::MAX,
            snapshot_on_demand: false,
            attached: false,
        }
    }
}

/// A record and its thread, or where the stream broke.
type Decoded = Result<(u32, Record), ReadError>;

/// Records per batch handed from the decoding thread.
const BATCH: usize = 4096;

/// Decodes `r` (a stream of format `version`) to its end (or first error),
/// merges its records into one order ([`crate::order`]), and sends them in
/// batches into `tx`; stops when the receiver is gone (a report that ends
/// at a marker). A stream that breaks off sends everything read before
/// the error, then the error.
fn decode_batches<R: std::io::Read>(mut r: Reader<R>, version: u64, tx: std::sync::mpsc::SyncSender<Vec<Decoded>>) {
    let mut merge = crate::order::Merge::new(version);
    let mut batch = Vec::with_capacity(BATCH);
    // Full batches go at once, also in the middle of a watermark's
    // release; `gone`: the receiver is (a report that ended at a marker).
    let gone = std::cell::Cell::new(false);
    let mut out = |item: Decoded| {
        batch.push(item);
        if batch.len() >= BATCH && !gone.get() {
            gone.set(tx.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH))).is_err());
        }
    };
    loop {
        match r.next_record() {
            Ok(Some(rec)) => merge.push(r.tid(), rec, &mut |tid, rec| out(Ok((tid, rec)))),
            Ok(None) => break,
            Err(e) => {
                merge.finish(&mut |tid, rec| out(Ok((tid, rec))));
                out(Err(e));
                break;
            }
        }
        if gone.get() {
            return;
        }
    }
    merge.finish(&mut |tid, rec| out(Ok((tid, rec))));
    if !gone.get() {
        let _ = tx.send(batch);
    }
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
    if crate::malloc_trace::is_log(path) {
        return crate::malloc_trace::load(path, None);
    }
    let len = f.metadata().map_or(0, |m| m.len());
    let bar = crate::progress::Bar::for_file(len);
    let t = load_from(bar.reader(f), path, w);
    bar.finish();
    t
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
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Decoded>>(4);
        sc.spawn(move || decode_batches(r, version, tx));
        let mut addrs = Vec::with_capacity(BATCH);
        'outer: for mut batch in rx {
            // The heap's lines for a record's address are asked for
            // AHEAD_INDEX and AHEAD_SLOT records before it is entered
            // (books/heap/table.rs): with a million blocks live, each
            // event's lookup is otherwise a wait for memory.
            addrs.clear();
            addrs.extend(batch.iter().map(|d| d.as_ref().map_or(0, |(_, r)| heap_addr(r))));
            addrs.extend([0; AHEAD_INDEX]);
            for (i, item) in batch.iter_mut().enumerate() {
                t.books.prefetch(addrs[i + AHEAD_INDEX], false);
                t.books.prefetch(addrs[i + AHEAD_SLOT], true);
                // The hot records' fields read where they are: moving the
                // record out first copies it with 16-byte loads across the
                // stores that wrote the copy, which the CPU cannot forward
                // (a fifth of this loop's time on python3's trace).
                let flow = match item {
                    Ok((tid, Record::Alloc { time_ns, family, addr, size, stack })) => {
                        keeper.alloc(&mut t, *tid, *time_ns, *family, *addr, *size, *stack);
                        Flow::Go
                    }
                    Ok((tid, Record::Free { time_ns, family, addr, stack })) => {
                        keeper.free(&mut t, *tid, *time_ns, *family, *addr, *stack);
                        Flow::Go
                    }
                    Ok((tid, rec)) => keeper.apply(&mut t, *tid, std::mem::replace(rec, PLACEHOLDER)),
                    Err(_) => {
                        t.error = std::mem::replace(item, Ok((0, PLACEHOLDER))).err();
                        break 'outer;
                    }
                };
                if flow == Flow::Until {
                    break 'outer;
                }
            }
        }
    });
    keeper.finish(&mut t)?;
    Ok(t)
}

/// What a record taken out of its batch leaves there: one that owns no memory.
const PLACEHOLDER: Record = Record::PoolFree { time_ns: 0, pool: 0, addr: 0 };

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
    use super::Stacks;

    #[test]
    fn stacks_share_an_index_by_content() {
        let mut s = Stacks::default();
        s.define(1, vec![0x10, 0x20], 5);
        s.define(2, vec![0x10, 0x30], 6);
        // Another thread's id for the first backtrace.
        s.define(7, vec![0x10, 0x20], 9);
        assert_eq!((s.canon(1), s.canon(2), s.canon(7)), (0, 1, 0));
        assert_eq!(s.def_time, [5, 6]);
        // A pool's copy is an index of its own, never found by content.
        let p = s.for_pool(0, 3);
        assert_eq!((p, &s.frames[2][..]), (2, &[0x10, 0x20][..]));
        s.define(8, vec![0x10, 0x20], 10);
        assert_eq!(s.canon(8), 0);
        // Many more, so that the table grows and rehashes from `frames`.
        for i in 0..10_000u64 {
            s.define(100 + i as u32, vec![i, i + 1], 0);
        }
        for i in 0..10_000u64 {
            s.define(20_000 + i as u32, vec![i, i + 1], 0);
            assert_eq!(s.canon(20_000 + i as u32), s.canon(100 + i as u32));
        }
        assert_eq!(s.frames.len(), 3 + 10_000);
        // An id never defined: an empty backtrace.
        let none = s.canon(99);
        assert!(s.frames[none as usize].is_empty());
    }
}
