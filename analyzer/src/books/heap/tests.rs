//! Every interleaving of the threads' events on one address gives the
//! books of the true order.

use super::*;
use mtrace_format::Family;

/// One event of a true history: thread, alloc or free, time (ns).
#[derive(Clone, Copy, Debug)]
struct Ev {
    tid: u32,
    alloc: bool,
    time: u64,
}

fn blk(i: usize, time: u64) -> Block {
    Block { size: i as u64 + 1, stack: 0, family: Family::Malloc, time }
}

/// Feeds `order` (indices into `h`) to a heap; returns the live block's
/// index and the unmatched frees.
fn replay(h: &[Ev], order: &[usize]) -> (Option<usize>, u64) {
    let mut heap = Heap::default();
    for &i in order {
        let e = h[i];
        if e.alloc {
            heap.alloc(e.tid, 0x10, blk(i, e.time));
        } else {
            heap.free(e.tid, 0x10, e.time, NO_STACK);
        }
    }
    let live: Vec<_> = heap.live().map(|(_, b)| b.size as usize - 1).collect();
    assert!(live.len() <= 1);
    (live.first().copied(), heap.unmatched())
}

/// The books of the true order: the last event's block if it is an
/// allocation; frees after a free or nothing are unmatched.
fn truth(h: &[Ev]) -> (Option<usize>, u64) {
    let live = h.last().filter(|e| e.alloc).map(|_| h.len() - 1);
    let unmatched = (0..h.len()).filter(|&i| !h[i].alloc && (i == 0 || !h[i - 1].alloc)).count() as u64;
    (live, unmatched)
}

/// Every merge of the per-thread subsequences of `h` (each thread's
/// events keep their order: a chunk never reorders its own thread).
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

/// Every history of `len` events on one address with no two allocations in
/// a row (the allocator's contract), over `threads` threads, with times
/// from `time(i)`; calls `check` with each history and read order.
fn each_case(len: usize, threads: u32, time: &dyn Fn(usize) -> u64, check: &mut dyn FnMut(&[Ev], &[usize])) {
    for kinds in 0u32..1 << len {
        let alloc = |i: usize| kinds >> i & 1 == 1;
        if (1..len).any(|i| alloc(i) && alloc(i - 1)) {
            continue;
        }
        for assign in 0..threads.pow(len as u32) {
            let h: Vec<Ev> = (0..len)
                .map(|i| Ev { tid: assign / threads.pow(i as u32) % threads, alloc: alloc(i), time: time(i) })
                .collect();
            merges(&h, threads, &mut |order| check(&h, order));
        }
    }
}

fn exact(len: usize, threads: u32, time: &dyn Fn(usize) -> u64, matched_only: bool) -> (u64, Vec<String>) {
    let mut runs = 0;
    let mut wrong = Vec::new();
    each_case(len, threads, time, &mut |h, order| {
        if matched_only && truth(h).1 != 0 {
            return;
        }
        runs += 1;
        let got = replay(h, order);
        if got != truth(h) && wrong.len() < 5 {
            wrong.push(format!("{h:?} read as {order:?}: {got:?}, truly {:?}", truth(h)));
        }
    });
    (runs, wrong)
}

#[test]
fn far_apart_times_any_read_order() {
    for (len, threads) in [(6, 2), (6, 3), (7, 2)] {
        let (runs, wrong) = exact(len, threads, &|i| 10_000 * (i as u64 + 1), false);
        assert!(runs > 1000);
        assert!(wrong.is_empty(), "{len} events, {threads} threads: {wrong:#?}");
    }
}

#[test]
fn more_threads_and_longer_histories() {
    for (len, threads) in [(7, 3), (9, 2)] {
        let (runs, wrong) = exact(len, threads, &|i| 10_000 * (i as u64 + 1), false);
        assert!(runs > 1000);
        assert!(wrong.is_empty(), "{len} events, {threads} threads: {wrong:#?}");
    }
}

/// Stamps of different threads less than [`EPS`] apart, often in the wrong
/// order: the allocator's contract orders them. Exact while the history of
/// the address fits in its window (longer ones are ordered by time beyond
/// it); histories where every free is matched, since a free of a block
/// from before tracing and an allocation within EPS cannot be told apart
/// from the reverse.
#[test]
fn skewed_times_any_read_order() {
    // Events 100 ns apart, each stamped up to 80 ns off.
    let skew = [0i64, 80, -80, 70, -30, 75];
    let time = |i: usize| (10_000 + 100 * i as i64 + skew[i]) as u64;
    for (len, threads) in [(RING + 1, 2), (RING + 1, 3)] {
        let (runs, wrong) = exact(len, threads, &time, true);
        assert!(runs > 100);
        assert!(wrong.is_empty(), "{len} events, {threads} threads: {wrong:#?}");
    }
}

#[test]
fn a_small_slot_is_a_third_of_a_full_one() {
    assert_eq!(std::mem::size_of::<(u64, Small)>(), 56);
    assert_eq!(std::mem::size_of::<(u64, Slot)>(), 144);
}

#[test]
fn a_small_slot_answers_as_a_full_one() {
    // An allocation and its free in order stay small; what they return,
    // and what the heap says after, are those of the full history.
    let mut h = Heap::default();
    let born = h.alloc(1, 0x10, blk(0, 1000));
    assert_eq!(born.born.map(|b| b.time), Some(1000));
    assert!(h.block(0x10, 1000, false).is_some());
    let freed = h.free(2, 0x10, 1000 + EPS + 1, 5);
    assert_eq!((freed.outcome, freed.ended.map(|b| b.time)), (Outcome::Ended, Some(1000)));
    assert!(matches!(h.slots.get(0x10), Some(Either::Small(_))));
    assert_eq!(h.live().count(), 0);
    assert_eq!(h.containing(0x10).map(|(a, _, freed)| (a, freed)), Some((0x10, true)));
    // A second free: a double free of the first's backtrace, in a full slot now.
    let again = h.free(1, 0x10, 5000, 6);
    assert_eq!(again.outcome, Outcome::Again { after: 1000 + EPS + 1, first_free: 5 });
    assert!(matches!(h.slots.get(0x10), Some(Either::Full(_))));
    // Another thread's free too close to the allocation is not in order:
    // the slot goes full at once.
    h.alloc(1, 0x20, blk(1, 9000));
    h.free(2, 0x20, 9000 + EPS, NO_STACK);
    assert!(matches!(h.slots.get(0x20), Some(Either::Full(_))));
    assert_eq!(h.unmatched(), 1);
}
