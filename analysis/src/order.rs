//! One order for the books: a stream's records merged by time, up to the
//! producer's watermarks.
//!
//! A stream holds each thread's records in program order, in chunks
//! written in the order the producer collected them, so another thread's
//! chunk may come long after later events on the same addresses (an
//! exited thread's buffer, a thread preempted between its stamp and its
//! push). From version 9 the producer states watermarks
//! ([`Record::Watermark`]): every event stamped before W is in the stream
//! before it (`preload/src/stream/order.rs` says how it knows). So the
//! merge keeps each thread's records in a queue and, at each watermark,
//! hands on every record stamped before it, oldest first across threads
//! (each thread's own order kept). The books then see the events of an
//! address in the order they happened, but for stamps of different threads
//! closer than the clocks' skew, which `books/ties.rs` orders.
//!
//! - A Realloc is two events at two times (its free before the real call,
//!   its allocation after): it is handed on as two records, each at its
//!   own time — the free as `new` 0 (the form the format has for a realloc
//!   the process ended inside), the allocation as `old` 0.
//! - Records without a time go with their thread: a Stack right before the
//!   thread's next record (its first use; a thread's own records may be
//!   stamped on a clock of their own, ahead of its events: the ptrace
//!   tracer's); Thread and PoolName records are handed on at once.
//! - A watermark is handed on after the records it released (the books'
//!   ties wait for the stream to pass a time, and it says it has).
//! - At the end of the stream everything left is handed on, in order.
//! - Streams older than version 9 have no watermarks: the merge trails the
//!   latest time read by [`LEGACY_LAG`], as close as their order allows.
//!
//! Memory: the records between two watermarks, about one writer round;
//! beyond [`MAX_QUEUED`] records the merge trails the latest time as for
//! an old stream.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use mtrace_format::Record;
use rustc_hash::FxHashMap as HashMap;

/// For streams without watermarks, how far behind the latest time read
/// the merge hands records on, ns: ten rounds of the preload's writer.
pub const LEGACY_LAG: u64 = 50_000_000;

/// Records queued beyond which the merge hands on what is more than
/// [`LEGACY_LAG`] older than the latest record, watermark or not: a
/// producer that stopped stating them (a thread stuck inside a hook) must
/// not make the analyzer hold the whole trace (about 100 bytes a record).
pub const MAX_QUEUED: usize = 4 << 20;

/// The most records' room a queue given back keeps (4 MiB: a busy
/// writer round's records of one thread, 20 K in python3's trace).
const KEEP_ROOM: usize = 1 << 16;

/// The first stream version with watermarks.
pub const WATERMARKS_SINCE: u64 = 9;

/// A record waiting in its thread's queue.
struct Item {
    /// ns.
    time: u64,
    /// Arrival number: among equal times, the earlier read goes first.
    seq: u64,
    rec: Record,
}

/// One thread's records not handed on yet.
struct Queue {
    tid: u32,
    items: VecDeque<Item>,
    /// Stacks defined since the thread's last timed record: they go right
    /// before its next one.
    defs: Vec<Record>,
}

/// The merge of one stream (see the module).
pub struct Merge {
    queues: Vec<Queue>,
    by_tid: HashMap<u32, usize>,
    /// Queues with nothing left, to be used again.
    spare: Vec<usize>,
    /// The queue of the latest record's thread (most records follow one
    /// of the same thread).
    last: Option<(u32, usize)>,
    seq: u64,
    /// Records stamped before this were handed on, ns.
    released: u64,
    /// The stream states watermarks; else the merge trails `latest`.
    watermarks: bool,
    /// The latest record time read, ns.
    latest: u64,
    /// Records queued.
    queued: usize,
    /// Snapshot regions go at once ([`Merge::snapshots_at_once`]).
    snapshots_at_once: bool,
}

/// A queue's oldest record: its time (ns), its arrival, the queue.
type Head = (u64, u64, usize);

/// Up to this many threads with records to hand on, the merge finds the
/// oldest by a scan rather than a heap.
const FEW: usize = 8;

impl Merge {
    /// The merge of a stream of format version `version`.
    pub fn new(version: u64) -> Merge {
        Merge {
            queues: Vec::new(),
            by_tid: HashMap::default(),
            spare: Vec::new(),
            last: None,
            seq: 0,
            released: 0,
            watermarks: version >= WATERMARKS_SINCE,
            latest: 0,
            queued: 0,
            snapshots_at_once: false,
        }
    }

    /// Hands snapshot regions (ScanRegion records) on at once instead of
    /// in time order: their bytes are no heap event (the snapshot's
    /// ScanEnd, which goes in order, says when it was taken, and its
    /// regions carry the same time), and a heap's whole snapshot waiting
    /// for the stream's end was a report's peak of memory (1.4 GB of 20 M
    /// blocks' heap). Not for a merge whose waiting records a checkpoint
    /// restates ([`Merge::pending`]): a snapshot cut by a checkpoint keeps
    /// its regions there.
    pub fn snapshots_at_once(mut self) -> Merge {
        self.snapshots_at_once = true;
        self
    }

    /// Records waiting for a watermark.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// The records waiting, per thread in its queue's order (its stack
    /// definitions not yet placed last): what a checkpoint restates for a
    /// reader that starts there to merge again (docs/FORMAT.md, record 28).
    pub fn pending(&self) -> Vec<(u32, Record)> {
        let mut v = Vec::with_capacity(self.queued);
        for q in &self.queues {
            v.extend(q.items.iter().map(|i| (q.tid, i.rec.clone())));
            v.extend(q.defs.iter().map(|d| (q.tid, d.clone())));
        }
        v
    }

    /// Takes record `rec` of thread `tid`, and hands on to `out` every
    /// record it lets go, in order.
    #[inline]
    pub fn push(&mut self, tid: u32, rec: Record, out: &mut impl FnMut(u32, Record)) {
        let time = match rec {
            Record::Watermark { time_ns } => {
                self.release(time_ns, out);
                // After what it released: the books' ties wait on it too.
                return out(tid, rec);
            }
            // A Thread record's time may be a producer's own clock, ahead
            // of its events' (the ptrace tracer's, behind on its samples):
            // it sets no key.
            Record::Thread { .. } | Record::PoolName { .. } => return out(tid, rec),
            Record::ScanRegion { .. } if self.snapshots_at_once => return out(tid, rec),
            Record::Stack { .. } => {
                let q = self.queue(tid);
                self.queued += 1;
                return self.queues[q].defs.push(rec);
            }
            Record::Realloc { time_ns, free_time_ns, old, new, size, stack } if old != 0 && new != 0 => {
                let q = self.queue(tid);
                let free = Record::Realloc { time_ns: free_time_ns, free_time_ns, old, new: 0, size: 0, stack };
                self.enqueue(q, free_time_ns, free);
                let alloc = Record::Realloc { time_ns, free_time_ns: time_ns, old: 0, new, size, stack };
                self.enqueue(q, time_ns, alloc);
                time_ns
            }
            _ => {
                let Some(t) = rec.time_ns() else { return out(tid, rec) };
                let q = self.queue(tid);
                self.enqueue(q, t, rec);
                t
            }
        };
        if time > self.latest {
            self.latest = time;
            // Each millisecond of stream time, not each record.
            let trail = !self.watermarks || self.queued > MAX_QUEUED;
            if trail && time.saturating_sub(LEGACY_LAG) > self.released + 1_000_000 {
                self.release(time - LEGACY_LAG, out);
            }
        }
    }

    /// The queue of thread `tid`, made if it has none.
    #[inline]
    fn queue(&mut self, tid: u32) -> usize {
        if let Some((t, q)) = self.last {
            if t == tid {
                return q;
            }
        }
        let q = match self.by_tid.get(&tid) {
            Some(&q) => q,
            None => {
                let q = match self.spare.pop() {
                    Some(q) => {
                        // Empty, and its room kept: a thread's queue is
                        // given back at each watermark that empties it and
                        // taken again at its next record, and a new deque
                        // grew by doubling every round, its copies and
                        // fresh pages a fifth of the decoding thread's
                        // page faults on cxx's trace. Unless a backlog
                        // made it large.
                        let queue = &mut self.queues[q];
                        queue.tid = tid;
                        if queue.items.capacity() > KEEP_ROOM {
                            queue.items = VecDeque::new();
                        }
                        q
                    }
                    None => {
                        self.queues.push(Queue { tid, items: VecDeque::new(), defs: Vec::new() });
                        self.queues.len() - 1
                    }
                };
                self.by_tid.insert(tid, q);
                q
            }
        };
        self.last = Some((tid, q));
        q
    }

    /// Appends `rec` (at `time`, ns) to queue `q`, after the thread's
    /// Stacks defined since its last record; a record older than those
    /// before it goes before them, and so do the Stacks queued among
    /// them.
    #[inline]
    fn enqueue(&mut self, q: usize, time: u64, rec: Record) {
        self.queued += 1;
        let queue = &mut self.queues[q];
        let items = &mut queue.items;
        if queue.defs.is_empty() && items.back().is_none_or(|b| b.time <= time) {
            // The common case: in order, nothing to put before it. The
            // item's time and number are written in its place: built
            // with them, it went through the stack, where two 8-byte
            // stores were read back as one 16-byte load, which the CPU
            // cannot forward (45% of this function's samples).
            self.seq += 1;
            items.push_back(Item { time: 0, seq: 0, rec });
            if let Some(b) = items.back_mut() {
                (b.time, b.seq) = (time, self.seq);
            }
            return;
        }
        let mut at = items.len();
        while at > 0 && items[at - 1].time > time {
            at -= 1;
        }
        // A Stack went before the record after it, which may be one on the
        // producer's own clock, ahead of this one that uses the Stack: the
        // ptrace tracer's RSS Sample, stamped when it reads the samples,
        // between a realloc's entry (its backtrace defined) and its
        // return's record, stamped by the kernel before. Every definition
        // must come before its uses: those it passes go before it too.
        let mut j = at;
        while j < items.len() {
            if matches!(items[j].rec, Record::Stack { .. }) {
                if let Some(mut def) = items.remove(j) {
                    def.time = time;
                    items.insert(at, def);
                    at += 1;
                }
            }
            j += 1;
        }
        for def in queue.defs.drain(..) {
            self.seq += 1;
            items.insert(at, Item { time, seq: self.seq, rec: def });
            at += 1;
        }
        self.seq += 1;
        items.insert(at, Item { time, seq: self.seq, rec });
    }

    /// Hands on every queued record stamped before `w` (ns), oldest first.
    pub fn release(&mut self, w: u64, out: &mut impl FnMut(u32, Record)) {
        if w <= self.released {
            return;
        }
        self.released = w;
        let mut heads: Vec<Head> = Vec::new();
        for (q, queue) in self.queues.iter().enumerate() {
            if let Some(f) = queue.items.front().filter(|f| f.time < w) {
                heads.push((f.time, f.seq, q));
            }
        }
        // The queue with the oldest head hands on its records up to the
        // next oldest head (most come in runs of one thread's), then gives
        // way. Few threads: the oldest found by a scan; many: a heap.
        if heads.len() <= FEW {
            while let Some(i) = (0..heads.len()).min_by_key(|&i| (heads[i].0, heads[i].1)) {
                let next = heads.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, h)| (h.0, h.1)).min();
                match self.drain(heads[i].2, w, next.unwrap_or((w, 0)), out) {
                    Some(h) => heads[i] = h,
                    None => {
                        heads.swap_remove(i);
                    }
                }
            }
        } else {
            let mut heap: BinaryHeap<Reverse<Head>> = heads.into_iter().map(Reverse).collect();
            while let Some(Reverse((_, _, q))) = heap.pop() {
                let next = heap.peek().map_or((w, 0), |Reverse((t, seq, _))| (*t, *seq));
                if let Some(h) = self.drain(q, w, next, out) {
                    heap.push(Reverse(h));
                }
            }
        }
        self.forget_empty();
    }

    /// Hands on queue `q`'s records older than both `w` and `next` (time,
    /// arrival); its new head if it still has one older than `w`.
    #[inline]
    fn drain(&mut self, q: usize, w: u64, next: (u64, u64), out: &mut impl FnMut(u32, Record)) -> Option<Head> {
        let queue = &mut self.queues[q];
        while let Some(f) = queue.items.front_mut().filter(|f| f.time < w && (f.time, f.seq) <= next) {
            // Taken out whole, then the emptied item dropped: moved out
            // of `pop_front`'s Option, the record was copied to the stack
            // around its tag and read back across those copies, a stalled
            // load (83% of this loop's samples, 15% of the decoding
            // thread's on python3-malloc's trace).
            let rec = std::mem::replace(&mut f.rec, Record::EMPTY);
            queue.items.pop_front();
            self.queued -= 1;
            out(queue.tid, rec);
        }
        queue.items.front().filter(|f| f.time < w).map(|f| (f.time, f.seq, q))
    }

    /// Threads with nothing queued give their queue back (a program with
    /// many short-lived threads would keep a queue for each).
    fn forget_empty(&mut self) {
        for q in 0..self.queues.len() {
            let queue = &self.queues[q];
            if queue.items.is_empty() && queue.defs.is_empty() && self.by_tid.get(&queue.tid) == Some(&q) {
                self.by_tid.remove(&queue.tid);
                self.spare.push(q);
            }
        }
        self.last = None;
    }

    /// The stream ended: hands on everything left, in order.
    pub fn finish(&mut self, out: &mut impl FnMut(u32, Record)) {
        self.release(u64::MAX, out);
        // Records stamped at u64::MAX (a damaged stream), and Stacks no
        // record used, last.
        for q in 0..self.queues.len() {
            let tid = self.queues[q].tid;
            while let Some(item) = self.queues[q].items.pop_front() {
                self.queued -= 1;
                out(tid, item.rec);
            }
            for def in std::mem::take(&mut self.queues[q].defs) {
                self.queued -= 1;
                out(tid, def);
            }
        }
    }
}

#[cfg(test)]
mod tests;
