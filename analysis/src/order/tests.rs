//! The merge and the books' ties together: every way a producer could
//! write the true history of one address (each thread's events in its
//! order, the threads' chunks in any order, watermarks wherever they are
//! true) gives the books of the true history.

use super::*;
use crate::books::{Block, Books};
use mtrace_format::Family;

/// One event of a true history: thread, alloc or free, stamp (ns).
#[derive(Clone, Copy, Debug)]
struct Ev {
    tid: u32,
    alloc: bool,
    time: u64,
}

fn record(i: usize, e: &Ev) -> Record {
    if e.alloc {
        // The size names the event, so that the live block says which.
        Record::Alloc { time_ns: e.time, family: Family::Malloc, addr: 0x10, size: i as u64 + 1, stack: 0, align: 0 }
    } else {
        Record::Free { time_ns: e.time, family: Family::Malloc, addr: 0x10, stack: 0, align: 0, size: 0 }
    }
}

/// Books of `stream` (thread, record) read through the merge: the live
/// block's event index, and the frees of no live block (double frees, and
/// frees of blocks from before tracing).
fn replay(stream: &[(u32, Record)], version: u64) -> (Option<usize>, u64) {
    let mut books = Books::default();
    books.whole = false;
    let mut enter = |tid: u32, r: Record| match r {
        Record::Alloc { time_ns, addr, size, .. } => {
            books.alloc(tid, addr, Block { size, stack: 0, family: Family::Malloc, time: time_ns, align: 0 })
        }
        Record::Free { time_ns, addr, .. } => books.free(tid, addr, time_ns),
        Record::Watermark { time_ns } => books.advance(time_ns),
        _ => {}
    };
    let mut m = Merge::new(version);
    for (tid, r) in stream {
        m.push(*tid, r.clone(), &mut enter);
    }
    m.finish(&mut enter);
    books.settle();
    let live: Vec<_> = books.live_blocks().map(|(_, b)| b.size as usize - 1).collect();
    assert!(live.len() <= 1);
    (live.first().copied(), books.unmatched_frees() + books.wrong_free_counts().0)
}

/// The books of the true order: the last event's block if it is an
/// allocation; frees after a free or nothing are unmatched.
fn truth(h: &[Ev]) -> (Option<usize>, u64) {
    let live = h.last().filter(|e| e.alloc).map(|_| h.len() - 1);
    let unmatched = (0..h.len()).filter(|&i| !h[i].alloc && (i == 0 || !h[i - 1].alloc)).count() as u64;
    (live, unmatched)
}

/// Every merge of the per-thread subsequences of `h` into one read order
/// (each thread's events keep their order: a chunk never reorders its own
/// thread).
fn merges(h: &[Ev], threads: u32, f: &mut dyn FnMut(&[usize])) {
    let chains: Vec<Vec<usize>> = (0..threads).map(|t| (0..h.len()).filter(|&i| h[i].tid == t).collect()).collect();
    let mut pos = vec![0; chains.len()];
    let mut out = Vec::with_capacity(h.len());
    fn go(chains: &[Vec<usize>], pos: &mut [usize], out: &mut Vec<usize>, n: usize, f: &mut dyn FnMut(&[usize])) {
        if out.len() == n {
            return f(out);
        }
        for c in 0..chains.len() {
            if pos[c] < chains[c].len() {
                out.push(chains[c][pos[c]]);
                pos[c] += 1;
                go(chains, pos, out, n, f);
                pos[c] -= 1;
                out.pop();
            }
        }
    }
    go(&chains, &mut pos, &mut out, h.len(), f);
}

/// The stream of read order `order`, with a watermark after the events at
/// the positions `marks` has a bit for: the highest one that is true
/// there (the earliest stamp of the events after it).
fn stream(h: &[Ev], order: &[usize], marks: u32) -> Vec<(u32, Record)> {
    let mut s = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        s.push((h[i].tid, Record::Thread { tid: h[i].tid, time_ns: h[i].time }));
        s.push((h[i].tid, record(i, &h[i])));
        if marks >> k & 1 == 1 {
            let w = order[k + 1..].iter().map(|&j| h[j].time).min().unwrap_or(u64::MAX - 1);
            s.push((0, Record::Watermark { time_ns: w }));
        }
    }
    s
}

/// Every history of `len` events on one address with no two allocations
/// in a row (the allocator's contract), over `threads` threads, stamped
/// `time(i, thread)`, read in every order with watermarks at every set of
/// positions `marks` allows: the cases where the books differ from the
/// truth (at most five), and how many there were.
fn check(
    len: usize,
    threads: u32,
    time: &dyn Fn(usize, u32) -> u64,
    marks: &[u32],
    matched_only: bool,
) -> (u64, Vec<String>) {
    let mut runs = 0;
    let mut wrong = Vec::new();
    for kinds in 0u32..1 << len {
        let alloc = |i: usize| kinds >> i & 1 == 1;
        if (1..len).any(|i| alloc(i) && alloc(i - 1)) {
            continue;
        }
        for assign in 0..threads.pow(len as u32) {
            let h: Vec<Ev> = (0..len)
                .map(|i| {
                    let tid = assign / threads.pow(i as u32) % threads;
                    Ev { tid, alloc: alloc(i), time: time(i, tid) }
                })
                .collect();
            if matched_only && truth(&h).1 != 0 {
                continue;
            }
            // A thread's own stamps never go back.
            let back = (0..len).any(|i| (i + 1..len).any(|j| h[j].tid == h[i].tid && h[j].time < h[i].time));
            if back {
                continue;
            }
            merges(&h, threads, &mut |order| {
                for &m in marks {
                    runs += 1;
                    let got = replay(&stream(&h, order, m), VERSION_NOW);
                    if got != truth(&h) && wrong.len() < 5 {
                        wrong.push(format!("{h:?} read as {order:?}, marks {m:b}: {got:?}, truly {:?}", truth(&h)));
                    }
                }
            });
        }
    }
    (runs, wrong)
}

const VERSION_NOW: u64 = mtrace_format::VERSION;

/// Watermarks: none, after every record, and after every other.
const MARKS: [u32; 4] = [0, u32::MAX, 0x5555_5555, 0xAAAA_AAAA];

#[test]
fn far_apart_stamps_any_read_order() {
    for (len, threads) in [(6, 2), (6, 3), (7, 2)] {
        let (runs, wrong) = check(len, threads, &|i, _| 10_000 * (i as u64 + 1), &MARKS, false);
        assert!(runs > 1000);
        assert!(wrong.is_empty(), "{len} events, {threads} threads: {wrong:#?}");
    }
}

/// Stamps of different threads less than EPS apart and out of their true
/// order (each thread's clock off by its own amount): the allocator's
/// contract orders them. Histories where every free is matched, since a
/// free of a block from before tracing and an allocation within EPS cannot
/// be told apart from the reverse. (With threads 200 ns off each other,
/// three events stamped alike can have happened in two orders that both
/// fit: no rule can tell; the skew measured between threads is 11 ns.)
#[test]
fn skewed_stamps_any_read_order() {
    // Events 100 ns apart, each thread's stamps up to 90 ns off.
    let off = [0i64, 90, -90];
    let time = |i: usize, t: u32| (10_000 + 100 * i as i64 + off[t as usize]) as u64;
    for (len, threads) in [(5, 2), (5, 3), (6, 2)] {
        let (runs, wrong) = check(len, threads, &time, &MARKS, true);
        assert!(runs > 100);
        assert!(wrong.is_empty(), "{len} events, {threads} threads: {wrong:#?}");
    }
}

/// The same with each stamp off by its own amount (a thread that moved to
/// another CPU), each thread's stamps still in its order.
#[test]
fn jittered_stamps_any_read_order() {
    let jitter = [0i64, 80, -80, 70, -30, 75];
    let time = |i: usize, _| (10_000 + 100 * i as i64 + jitter[i]) as u64;
    for (len, threads) in [(5, 2), (5, 3), (6, 2)] {
        let (runs, wrong) = check(len, threads, &time, &MARKS, true);
        assert!(runs > 100);
        assert!(wrong.is_empty(), "{len} events, {threads} threads: {wrong:#?}");
    }
}

/// Watermark by watermark: a thread's chunk read long after later events
/// of another thread on the same address (the case that made the old
/// books see double frees: an exited thread's buffer written last).
#[test]
fn a_late_chunk_is_put_in_its_place() {
    // Thread 1 allocates at 100 and 300; thread 0 frees at 200 and 400;
    // thread 1's chunk comes last, after a watermark that only covers 50.
    let s = vec![
        (0, Record::Free { time_ns: 200, family: Family::Malloc, addr: 0x10, stack: 0, align: 0, size: 0 }),
        (0, Record::Free { time_ns: 400, family: Family::Malloc, addr: 0x10, stack: 0, align: 0, size: 0 }),
        (0, Record::Watermark { time_ns: 50 }),
        (1, Record::Alloc { time_ns: 100, family: Family::Malloc, addr: 0x10, size: 1, stack: 0, align: 0 }),
        (1, Record::Alloc { time_ns: 300, family: Family::Malloc, addr: 0x10, size: 2, stack: 0, align: 0 }),
        (0, Record::Watermark { time_ns: 1000 }),
    ];
    assert_eq!(replay(&s, VERSION_NOW), (None, 0));
}

#[test]
fn a_realloc_is_two_events() {
    // Thread 0 reallocs 0x10 → 0x20 (free at 100, allocation at 500);
    // thread 1 allocates 0x10 at 200 (glibc gave it back inside the
    // realloc) and frees 0x20 at 300 (it was free before the realloc got it).
    let mut m = Merge::new(VERSION_NOW);
    let mut out = Vec::new();
    let mut keep = |tid, r| out.push((tid, r));
    m.push(
        1,
        Record::Alloc { time_ns: 50, family: Family::Malloc, addr: 0x20, size: 8, stack: 0, align: 0 },
        &mut keep,
    );
    m.push(
        0,
        Record::Alloc { time_ns: 60, family: Family::Malloc, addr: 0x10, size: 8, stack: 0, align: 0 },
        &mut keep,
    );
    let realloc = Record::Realloc { time_ns: 500, free_time_ns: 100, old: 0x10, new: 0x20, size: 16, stack: 3 };
    m.push(0, realloc, &mut keep);
    m.push(
        1,
        Record::Alloc { time_ns: 200, family: Family::Malloc, addr: 0x10, size: 4, stack: 0, align: 0 },
        &mut keep,
    );
    m.push(
        1,
        Record::Free { time_ns: 300, family: Family::Malloc, addr: 0x20, stack: 0, align: 0, size: 0 },
        &mut keep,
    );
    assert_eq!(m.queued(), 6);
    m.push(0, Record::Watermark { time_ns: 1000 }, &mut keep);
    let times: Vec<u64> = out.iter().filter_map(|(_, r)| r.time_ns()).collect();
    // Then the watermark itself.
    assert_eq!(times, [50, 60, 100, 200, 300, 500, 1000]);
    assert!(matches!(out[2].1, Record::Realloc { old: 0x10, new: 0, stack: 3, .. }));
    assert!(matches!(out[5].1, Record::Realloc { old: 0, new: 0x20, size: 16, .. }));
    assert_eq!(m.queued(), 0);
}

#[test]
fn definitions_go_right_before_their_threads_next_record() {
    let mut m = Merge::new(VERSION_NOW);
    let mut out = Vec::new();
    let mut keep = |tid, r| out.push((tid, r));
    m.push(
        2,
        Record::Free { time_ns: 700, family: Family::Malloc, addr: 0x50, stack: 0, align: 0, size: 0 },
        &mut keep,
    );
    m.push(2, Record::Stack { id: 9, frames: vec![1, 2] }, &mut keep);
    // Stamped before the thread's latest record: it goes first, with the
    // Stack defined for it.
    m.push(
        2,
        Record::Alloc { time_ns: 600, family: Family::Malloc, addr: 0x10, size: 1, stack: 9, align: 0 },
        &mut keep,
    );
    m.push(1, Record::Thread { tid: 1, time_ns: 650 }, &mut keep);
    m.push(
        1,
        Record::Free { time_ns: 650, family: Family::Malloc, addr: 0x30, stack: 0, align: 0, size: 0 },
        &mut keep,
    );
    m.push(0, Record::PoolName { id: 1, name: "p".into() }, &mut keep);
    // Thread and PoolName records at once.
    assert_eq!(m.queued(), 4);
    m.finish(&mut keep);
    let kinds: Vec<String> = out.iter().skip(2).map(|(t, r)| format!("{t}:{:?}", r.time_ns())).collect();
    assert_eq!(kinds, ["2:None", "2:Some(600)", "1:Some(650)", "2:Some(700)"]);
}

#[test]
fn a_record_that_goes_before_a_later_one_takes_the_stack_it_uses_along() {
    // The ptrace tracer under uprobes (a failed CI run): a realloc's
    // backtrace defined at its entry, an RSS Sample on the tracer's clock,
    // then the realloc's record, stamped by the kernel before the Sample.
    let mut m = Merge::new(VERSION_NOW);
    let mut out = Vec::new();
    let mut keep = |tid, r| out.push((tid, r));
    m.push(2, Record::Stack { id: 7, frames: vec![1, 2] }, &mut keep);
    m.push(2, Record::Sample { time_ns: 900, rss: 4096 }, &mut keep);
    let realloc = Record::Realloc { time_ns: 700, free_time_ns: 600, old: 0x10, new: 0x20, size: 500, stack: 7 };
    m.push(2, realloc, &mut keep);
    m.finish(&mut keep);
    let got: Vec<String> = out
        .iter()
        .map(|(_, r)| match r {
            Record::Stack { id, .. } => format!("stack {id}"),
            Record::Realloc { old: 0, stack, .. } => format!("alloc of realloc, stack {stack}"),
            Record::Realloc { new: 0, .. } => "free of realloc".into(),
            Record::Sample { .. } => "sample".into(),
            r => format!("{r:?}"),
        })
        .collect();
    assert_eq!(got, ["stack 7", "free of realloc", "alloc of realloc, stack 7", "sample"]);
}

#[test]
fn streams_without_watermarks_trail_the_latest_time() {
    let mut m = Merge::new(8);
    let mut n = 0;
    let mut count = |_, _| n += 1;
    for k in 0..100u64 {
        let t = k * 1_000_000;
        m.push(
            1,
            Record::Free { time_ns: t, family: Family::Malloc, addr: k, stack: 0, align: 0, size: 0 },
            &mut count,
        );
    }
    // 99 ms read: what is older than 99 − 50 ms is handed on.
    let left = m.queued();
    assert!((50..=55).contains(&left), "{left}");
    m.finish(&mut count);
    assert_eq!(n, 100);
}

#[test]
fn snapshot_regions_go_at_once_when_asked_and_in_order_otherwise() {
    let region =
        Record::ScanRegion { time_ns: 200, kind: mtrace_format::region_kind::MAPPING, addr: 0x1000, bytes: vec![0; 8] };
    let alloc = Record::Alloc { time_ns: 100, family: Family::Malloc, addr: 0x10, size: 8, stack: 0, align: 0 };
    for at_once in [false, true] {
        let mut m = Merge::new(VERSION_NOW);
        if at_once {
            m = m.snapshots_at_once();
        }
        let mut out = Vec::new();
        m.push(1, alloc.clone(), &mut |_, r| out.push(r));
        m.push(1, region.clone(), &mut |_, r| out.push(r));
        // Before the watermark: the region only, and only when asked.
        let kinds = |out: &[Record]| out.iter().map(|r| matches!(r, Record::ScanRegion { .. })).collect::<Vec<_>>();
        assert_eq!(kinds(&out), if at_once { vec![true] } else { vec![] });
        m.push(1, Record::Watermark { time_ns: 300 }, &mut |_, r| out.push(r));
        let n = out.len();
        assert_eq!(kinds(&out[..n - 1]), if at_once { vec![true, false] } else { vec![false, true] });
    }
}

#[test]
fn a_queue_given_back_keeps_its_room_unless_a_backlog_made_it_large() {
    let alloc = |t: u64| Record::Alloc { time_ns: t, family: Family::Malloc, addr: 0x10, size: 8, stack: 0, align: 0 };
    let mut m = Merge::new(WATERMARKS_SINCE);
    let mut out = 0;
    let mut round = |m: &mut Merge, tid: u32, from: u64, n: u64| {
        for t in from..from + n {
            m.push(tid, alloc(t), &mut |_, _| out += 1);
        }
        m.push(tid, Record::Watermark { time_ns: from + n }, &mut |_, _| out += 1);
    };
    round(&mut m, 1, 0, 1000);
    let room = m.queues[0].items.capacity();
    assert!(room >= 1000 && m.spare == [0], "the emptied queue is given back");
    // Its thread's next round takes it again, room and all.
    round(&mut m, 1, 1000, 10);
    assert_eq!((m.queues.len(), m.queues[0].items.capacity()), (1, room));
    // A backlog past KEEP_ROOM is not kept for the next thread.
    round(&mut m, 2, 2000, KEEP_ROOM as u64 + 1);
    round(&mut m, 3, 200_000, 1);
    assert!(m.queues.len() == 1 && m.queues[0].items.capacity() < KEEP_ROOM);
    assert_eq!(out, 1000 + 10 + KEEP_ROOM + 1 + 1 + 4);
}
