//! Unit tests of the books: live blocks, peak, mappings, wrong frees.

use super::*;

fn blk(size: u64, time: u64) -> Block {
    Block { size, stack: 1, family: Family::Malloc, time, align: 0 }
}

#[test]
fn a_reuse_stamped_before_the_free_it_follows() {
    // Thread 1 frees 0x10, thread 2 reuses it, but thread 2's clock is
    // 60 ns behind: its allocation comes first in time order.
    let mut b = Books::default();
    b.alloc(0, 0x10, blk(8, 1000));
    b.alloc(2, 0x10, blk(16, 1940));
    b.free(1, 0x10, 2000);
    b.settle();
    let live: Vec<_> = b.live_blocks().map(|(_, b)| b.size).collect();
    assert_eq!(live, vec![16]);
    assert_eq!((b.cur_bytes, b.unmatched_frees()), (16, 0));
}

#[test]
fn a_block_swapped_with_another_thread_is_freed() {
    // main allocates 0x10 (t=1000) and hands it to a thread, which frees
    // it and returns a block at the same address, which main frees; the
    // thread's stamps run 100 ns ahead of main's.
    let mut b = Books::default();
    b.alloc(0, 0x10, blk(8, 1000));
    b.free(0, 0x10, 1150);
    b.free(1, 0x10, 1160);
    b.alloc(1, 0x10, blk(16, 1200));
    b.settle();
    assert_eq!((b.live_blocks().count(), b.unmatched_frees(), b.cur_bytes), (0, 0, 0));
    assert_eq!((b.allocations, b.frees), (2, 2));
}

#[test]
fn events_wait_for_the_skew_and_no_longer() {
    let mut b = Books::default();
    b.alloc(0, 0x10, blk(8, 1000));
    // Not in yet: an event of another thread within EPS could precede it.
    assert_eq!(b.cur_bytes, 0);
    b.alloc(0, 0x20, blk(8, 1000 + heap::EPS + 1));
    assert_eq!(b.cur_bytes, 8);
    b.settle();
    assert_eq!(b.cur_bytes, 16);
}

#[test]
fn a_promised_event_enters_at_once_with_its_threads_waiting_before_it() {
    let mut b = Books::default();
    b.alloc(0, 0x10, blk(8, 1000));
    assert_eq!(b.cur_bytes, 0);
    // No other thread's event before 5000 is to come.
    b.promise(0, 5000);
    b.alloc(0, 0x20, blk(8, 1100));
    assert_eq!((b.cur_bytes, b.cur_blocks), (16, 2));
    // Too close to the promise's edge: waits.
    b.alloc(0, 0x30, blk(8, 5000 - heap::EPS));
    assert_eq!(b.cur_bytes, 16);
    // Another thread's promise does not let thread 0's events in (the
    // stream's passing EPS beyond 0x30's lets that one in).
    b.promise(1, 1_000_000);
    b.alloc(0, 0x40, blk(8, 6000));
    assert_eq!((b.cur_bytes, b.cur_blocks), (24, 3));
}

#[test]
fn a_promise_leaves_another_threads_waiting_event_to_the_ties() {
    // As a_reuse_stamped_before_the_free_it_follows, with the free's
    // thread promised no other thread's event after it: thread 2's
    // allocation is still waiting, so the free is tied with it.
    let mut b = Books::default();
    b.alloc(0, 0x10, blk(8, 1000));
    b.alloc(2, 0x10, blk(16, 1940));
    b.promise(1, 1_000_000);
    b.free(1, 0x10, 2000);
    b.settle();
    let live: Vec<_> = b.live_blocks().map(|(_, b)| b.size).collect();
    assert_eq!(live, vec![16]);
    assert_eq!((b.cur_bytes, b.unmatched_frees()), (16, 0));
}

#[test]
fn live_at_peak_is_the_state_when_the_total_last_rose() {
    let at = |stack: u32, size: u64, time: u64| Block { size, stack, family: Family::Malloc, time, align: 0 };
    let mut b = Books::default();
    b.alloc(0, 0x10, at(0, 100, 1));
    b.alloc(0, 0x20, at(1, 50, 2));
    b.free(0, 0x10, 3);
    b.alloc(0, 0x30, at(2, 30, 4));
    // Peak: 150 bytes at t=2 (stacks 0 and 1); stack 1 grows past it
    // later while the total stays lower, stack 2 came after it.
    b.alloc(0, 0x40, at(1, 60, 5));
    b.free(0, 0x20, 6);
    b.settle();
    let peak = b.live_at_peak();
    let mut got: Vec<_> = peak.iter().map(|(&s, l)| (s, l.bytes, l.blocks)).collect();
    got.sort();
    assert_eq!(got, vec![(0, 100, 1), (1, 50, 1)]);
    assert_eq!((b.peak_bytes, b.peak_time), (150, 2));
    // A new peak: everything live now.
    b.alloc(0, 0x50, at(2, 200, 7));
    b.settle();
    let mut got: Vec<_> = b.live_at_peak().iter().map(|(&s, l)| (s, l.bytes, l.blocks)).collect();
    got.sort();
    assert_eq!(got, vec![(1, 60, 1), (2, 230, 2)]);
    assert_eq!(b.totals_of(2).allocations, 2);
    assert_eq!(b.totals().count(), 3);
}

#[test]
fn internal_blocks_are_freed_but_neither_counted_nor_live() {
    let internal = |size: u64, time: u64| Block { size, stack: 0, family: Family::Internal, time, align: 0 };
    let mut b = Books::default();
    // The program frees a block, glibc reuses its address inside a hook
    // (a thread's DTV), then the program frees that (pthread_join).
    b.alloc(0, 0x10, blk(8, 1));
    b.free(0, 0x10, 2);
    b.alloc(0, 0x10, internal(288, 3));
    b.settle();
    assert_eq!((b.live_blocks().count(), b.internal_blocks().count()), (0, 1));
    b.free(0, 0x10, 4);
    b.settle();
    assert_eq!((b.unmatched_frees(), b.internal_blocks().count()), (0, 0));
    // Nor its free: the counts are of the program's own blocks.
    assert_eq!((b.allocations, b.frees, b.cur_bytes, b.peak_bytes), (1, 1, 0, 8));
    // A free stamped before its internal block also finds it.
    b.free(1, 0x20, 8);
    b.alloc(0, 0x20, internal(16, 9));
    b.settle();
    assert_eq!((b.unmatched_frees(), b.internal_blocks().count()), (0, 0));
    // A program block at the address of an internal one: the internal
    // block was freed untraced (an address is not handed out twice).
    b.alloc(0, 0x30, internal(16, 10));
    b.alloc(0, 0x30, blk(24, 11));
    b.settle();
    assert_eq!((b.internal_blocks().count(), b.live_blocks().count()), (0, 1));
    b.free(0, 0x30, 12);
    b.settle();
    assert_eq!((b.internal_blocks().count(), b.live_blocks().count(), b.unmatched_frees()), (0, 0, 0));
}

#[test]
fn a_free_stamped_before_its_allocation_follows_it() {
    // Thread 1 frees what thread 0 allocated; its stamp is 50 ns early.
    let mut b = Books::default();
    b.free(1, 0x20, 100);
    b.alloc(0, 0x20, blk(8, 150));
    b.settle();
    assert_eq!(b.live_blocks().count(), 0);
    assert_eq!(b.unmatched_frees(), 0);
    assert_eq!((b.allocations, b.frees), (1, 1));
}

#[test]
fn partial_munmap_splits_a_mapping() {
    let mut b = Books::default();
    b.mmap(0x10000, blk(4 * 4096, 1));
    b.munmap(0x11000, 4096, 0);
    let mut live: Vec<_> = b.live_blocks().map(|(a, b)| (a, b.size)).collect();
    live.sort();
    assert_eq!(live, vec![(0x10000, 4096), (0x12000, 2 * 4096)]);
    assert_eq!(b.cur_bytes, 3 * 4096);
    b.munmap(0x10000, 4 * 4096, 0);
    assert_eq!(b.live_blocks().count(), 0);
    assert_eq!(b.cur_bytes, 0);
}

#[test]
fn peak_is_tracked() {
    let mut b = Books::default();
    b.alloc(0, 1, blk(100, 1));
    b.alloc(0, 2, blk(50, 2));
    b.free(0, 1, 3);
    b.alloc(0, 3, blk(10, 4));
    b.settle();
    assert_eq!((b.peak_bytes, b.peak_blocks, b.peak_time), (150, 2, 2));
}

/// The books of a stream that holds every block (as `mtrace run`'s).
fn whole() -> Books {
    Books { whole: true, ..Books::default() }
}

fn of(family: Family, size: u64, stack: u32, time: u64) -> Block {
    Block { size, stack, family, time, align: 0 }
}

fn dealloc(family: Family, stack: u32) -> Dealloc {
    Dealloc { family, stack: Some(stack), realloc: false, align: 0, size: 0 }
}

/// (kind, address, block start, count) of each group, the events entered.
fn kinds(b: &mut Books) -> Vec<(WrongKind, u64, Option<u64>, u64)> {
    b.settle();
    b.wrong_frees().iter().map(|(w, n)| (w.kind, w.addr, w.block.as_ref().map(|c| c.addr), *n)).collect()
}

#[test]
fn a_mismatched_free_names_both_backtraces() {
    let mut b = whole();
    b.alloc(0, 0x10, of(Family::NewArray, 40, 7, 1));
    b.dealloc(0, 0x10, 2, dealloc(Family::New, 9));
    b.settle();
    let w = b.wrong_frees();
    assert_eq!(w.len(), 1);
    let (w, n) = &w[0];
    assert_eq!((w.kind, *n, w.call.stack, w.call.call_name()), (WrongKind::Mismatched, 1, Some(9), "delete"));
    let c = w.block.as_ref().unwrap();
    assert_eq!((c.addr, c.block.size, c.block.stack, c.block.family, c.freed), (0x10, 40, 7, Family::NewArray, false));
    // Right pairs are not wrong, and the mismatched block is gone all the same.
    b.alloc(0, 0x20, of(Family::Aligned, 8, 7, 3));
    b.dealloc(0, 0x20, 4, dealloc(Family::Malloc, 9));
    b.settle();
    assert_eq!((b.wrong_free_counts(), b.live_blocks().count(), b.cur_bytes), ((0, 1), 0, 0));
}

#[test]
fn where_not_every_path_is_seen_no_free_is_judged_by_a_block_that_may_be_gone() {
    // An allocator of the program's own may free a block and hand its
    // address out again through functions no producer follows: the block
    // the books hold there says nothing of the one freed.
    let mut b = whole();
    b.every_path_seen = false;
    b.alloc(0, 0x10, of(Family::New, 40, 7, 1));
    b.dealloc(0, 0x10, 2, dealloc(Family::Malloc, 9));
    b.alloc(0, 0x20, of(Family::New, 40, 7, 3));
    b.dealloc(0, 0x20, 4, Dealloc { size: 24, ..dealloc(Family::New, 9) });
    b.dealloc(0, 0x20, 5, dealloc(Family::New, 9));
    b.settle();
    assert_eq!((b.wrong_free_counts(), b.frees_unjudged, b.frees_again), ((0, 0), 2, 1));
    assert_eq!((b.live_blocks().count(), b.cur_bytes), (0, 0));
    // A checkpoint carries the count.
    let n = b.counters().into_iter().find(|(name, _)| *name == "frees_unjudged");
    assert_eq!(n, Some(("frees_unjudged", 2)));
}

#[test]
fn a_double_free_names_the_first_free() {
    let mut b = whole();
    b.alloc(0, 0x10, of(Family::Malloc, 24, 1, 1));
    b.dealloc(0, 0x10, 2, dealloc(Family::Malloc, 2));
    b.dealloc(0, 0x10, 3, dealloc(Family::Malloc, 3));
    b.settle();
    let w = b.wrong_frees();
    let (w, n) = &w[0];
    assert_eq!((w.kind, *n, w.call.stack, w.first_free), (WrongKind::DoubleFree, 1, Some(3), Some(2)));
    let c = w.block.as_ref().unwrap();
    assert_eq!((c.block.size, c.block.stack, c.freed), (24, 1, true));
    assert_eq!(b.unmatched_frees(), 0);
}

#[test]
fn an_invalid_free_says_which_block_it_points_into() {
    let mut b = whole();
    b.alloc(0, 0x100, of(Family::Malloc, 32, 1, 1));
    b.dealloc(0, 0x110, 2, dealloc(Family::Malloc, 2));
    b.dealloc(0, 0x7fff_0000, 3, dealloc(Family::Malloc, 3));
    assert_eq!(
        kinds(&mut b),
        vec![(WrongKind::InvalidFree, 0x110, Some(0x100), 1), (WrongKind::InvalidFree, 0x7fff_0000, None, 1)]
    );
    // The block pointed into is still live.
    assert_eq!(b.cur_bytes, 32);
}

#[test]
fn unknown_blocks_are_not_wrong_unless_the_stream_is_whole() {
    // An attach, a forked child: blocks from before are freed.
    let mut b = Books::default();
    b.dealloc(0, 0x10, 1, dealloc(Family::Malloc, 1));
    b.settle();
    assert_eq!((b.wrong_free_counts(), b.unmatched_frees()), ((0, 0), 1));
    // But a second free of it is a double free.
    b.dealloc(0, 0x10, 2, dealloc(Family::Malloc, 2));
    assert_eq!(kinds(&mut b), vec![(WrongKind::DoubleFree, 0x10, None, 1)]);
    assert_eq!(b.unmatched_frees(), 1);
}

#[test]
fn a_second_free_after_a_stop_is_not_judged() {
    let mut b = whole();
    b.alloc(0, 0x10, of(Family::Malloc, 24, 1, 1));
    b.dealloc(0, 0x10, 2, dealloc(Family::Malloc, 2));
    // Collection stops: the allocation at 0x10 in between is not recorded.
    // (The keeper settles the books at every Coverage record.)
    b.settle();
    b.whole = false;
    b.collecting_since = None;
    b.dealloc(0, 0x10, 4, dealloc(Family::Malloc, 3));
    b.settle();
    b.collecting_since = Some(5);
    b.dealloc(0, 0x20, 6, dealloc(Family::Malloc, 3));
    b.settle();
    assert_eq!((b.wrong_free_counts(), b.unmatched_frees()), ((0, 0), 2));
    // Once collecting again, a free twice after the restart is.
    b.alloc(0, 0x30, of(Family::Malloc, 8, 1, 7));
    b.dealloc(0, 0x30, 8, dealloc(Family::Malloc, 2));
    b.dealloc(0, 0x30, 9, dealloc(Family::Malloc, 2));
    assert_eq!(kinds(&mut b), vec![(WrongKind::DoubleFree, 0x30, Some(0x30), 1)]);
}

#[test]
fn a_free_stamped_before_another_threads_allocation_is_not_wrong() {
    // Thread 1 frees the block thread 0 allocated just before; thread 1's
    // stamp is 20 ns early.
    let mut b = whole();
    b.dealloc(1, 0x10, 480, dealloc(Family::Malloc, 2));
    b.alloc(0, 0x10, of(Family::Malloc, 24, 1, 500));
    b.settle();
    assert_eq!((b.wrong_free_counts(), b.unmatched_frees(), b.live_blocks().count()), ((0, 0), 0, 0));
    // A real double free across threads within the skew: exactly one.
    b.alloc(0, 0x20, of(Family::Malloc, 8, 1, 1000));
    b.dealloc(1, 0x20, 1100, dealloc(Family::Malloc, 3));
    b.dealloc(0, 0x20, 1120, dealloc(Family::Malloc, 4));
    assert_eq!(kinds(&mut b), vec![(WrongKind::DoubleFree, 0x20, Some(0x20), 1)]);
}

#[test]
fn many_mismatches_of_one_backtrace_are_one_entry() {
    let mut b = whole();
    for i in 0..1000u64 {
        b.alloc(0, 0x10 + i * 16, of(Family::New, 8, 1, 2 * i + 1));
        b.dealloc(0, 0x10 + i * 16, 2 * i + 2, dealloc(Family::Malloc, 2));
    }
    assert_eq!(kinds(&mut b), vec![(WrongKind::Mismatched, 0x10, Some(0x10), 1000)]);
}

#[test]
fn pool_frees_and_munmaps_are_never_wrong() {
    let mut b = whole();
    b.dealloc(0, 0x10, 1, Dealloc { family: Family::Pool, stack: None, realloc: false, align: 0, size: 0 });
    b.munmap(0x7000_0000, 4096, 0);
    b.settle();
    assert_eq!((b.wrong_free_counts(), b.unmatched_frees(), b.unknown_munmaps), ((0, 0), 1, 1));
    b.mmap(0x7000_0000, of(Family::Mmap, 8192, 1, 2));
    b.munmap(0x7000_1000, 4096, 0);
    assert_eq!(b.unknown_munmaps, 1);
}

#[test]
fn live_runs_sum_the_live_blocks_in_order() {
    // Backtraces 1 1 2 1 (the second 1 freed), a block glibc made inside
    // a hook (left out, as from every walk), one of `new` at backtrace 2,
    // and a mapping: runs break where the backtrace or the family changes.
    let mut b = Books::default();
    let at = |stack, family, size, time| Block { size, stack, family, time, align: 0 };
    b.alloc(0, 0x10, at(1, Family::Malloc, 8, 100));
    b.alloc(0, 0x20, at(1, Family::Malloc, 16, 300));
    b.alloc(0, 0x30, at(1, Family::Malloc, 32, 200));
    b.alloc(0, 0x40, at(2, Family::Malloc, 64, 400));
    b.alloc(0, 0x50, at(1, Family::Malloc, 128, 500));
    b.alloc(0, 0x60, at(1, Family::Malloc, 256, 600));
    b.alloc(0, 0x70, at(1, Family::Internal, 32, 650));
    b.alloc(0, 0x80, at(1, Family::Malloc, 512, 700));
    b.alloc(0, 0x90, at(2, Family::New, 1024, 800));
    b.free(0, 0x50, 900);
    b.mmap(0x7000_0000, at(3, Family::Mmap, 4096, 1000));
    b.settle();
    let mut runs = Vec::new();
    b.live_runs(|r| runs.push((r.stack, r.family, r.bytes, r.blocks, r.latest)));
    // The freed block splits no run; the hook's block ends one (a run of
    // its family, left out).
    assert_eq!(
        runs,
        vec![
            (1, Family::Malloc, 56, 3, 300),
            (2, Family::Malloc, 64, 1, 400),
            (1, Family::Malloc, 256, 1, 600),
            (1, Family::Malloc, 512, 1, 700),
            (2, Family::New, 1024, 1, 800),
            (3, Family::Mmap, 4096, 1, 1000),
        ]
    );
    // The same sums as the blocks one at a time, by backtrace.
    let by_stack = b.live_by_stack();
    let mut one_at_a_time: HashMap<u32, (u64, u64)> = HashMap::default();
    for (_, blk) in b.live_blocks() {
        let e = one_at_a_time.entry(blk.stack).or_default();
        *e = (e.0 + blk.size, e.1 + 1);
    }
    assert_eq!(by_stack.len(), 3);
    for (s, l) in &by_stack {
        assert_eq!((l.bytes, l.blocks), one_at_a_time[s]);
    }
    assert_eq!((by_stack[&1].bytes, by_stack[&2].family), (824, Family::Malloc));
}
