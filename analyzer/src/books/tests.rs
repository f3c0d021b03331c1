//! Unit tests of the books: live blocks, peak, mappings, wrong frees.

use super::*;

fn blk(size: u64, time: u64) -> Block {
    Block { size, stack: 1, family: Family::Malloc, time }
}

#[test]
fn free_read_before_reuse_frees_the_older_block() {
    // Thread A frees 0x10 at t=5, thread B reuses it at t=6, but B's
    // buffer is read first.
    let mut b = Books::default();
    b.alloc(0, 0x10, blk(8, 1));
    b.alloc(2, 0x10, blk(16, 6));
    b.free(1, 0x10, 5);
    let live: Vec<_> = b.live_blocks().map(|(_, b)| b.size).collect();
    assert_eq!(live, vec![16]);
    assert_eq!(b.cur_bytes, 16);
}

#[test]
fn a_block_swapped_with_another_thread_is_freed() {
    // main allocates 0x10 (t=1) and hands it to a thread, which frees it
    // (t=2) and returns a block at the same address (t=3), which main
    // frees (t=4). main's chunk is read first.
    let mut b = Books::default();
    b.alloc(0, 0x10, blk(8, 1));
    b.free(0, 0x10, 4);
    b.free(1, 0x10, 2);
    b.alloc(1, 0x10, blk(16, 3));
    assert_eq!((b.live_blocks().count(), b.unmatched_frees(), b.cur_bytes), (0, 0, 0));
    assert_eq!((b.allocations, b.frees), (2, 2));
}

#[test]
fn live_at_peak_is_the_state_when_the_total_last_rose() {
    let at = |stack: u32, size: u64, time: u64| Block { size, stack, family: Family::Malloc, time };
    let mut b = Books::default();
    b.alloc(0, 0x10, at(0, 100, 1));
    b.alloc(0, 0x20, at(1, 50, 2));
    b.free(0, 0x10, 3);
    b.alloc(0, 0x30, at(2, 30, 4));
    // Peak: 150 bytes at t=2 (stacks 0 and 1); stack 1 grows past it
    // later while the total stays lower, stack 2 came after it.
    b.alloc(0, 0x40, at(1, 60, 5));
    b.free(0, 0x20, 6);
    let peak = b.live_at_peak();
    let mut got: Vec<_> = peak.iter().map(|(&s, l)| (s, l.bytes, l.blocks)).collect();
    got.sort();
    assert_eq!(got, vec![(0, 100, 1), (1, 50, 1)]);
    assert_eq!((b.peak_bytes, b.peak_time), (150, 2));
    // A new peak: everything live now.
    b.alloc(0, 0x50, at(2, 200, 7));
    let mut got: Vec<_> = b.live_at_peak().iter().map(|(&s, l)| (s, l.bytes, l.blocks)).collect();
    got.sort();
    assert_eq!(got, vec![(1, 60, 1), (2, 230, 2)]);
    assert_eq!(b.totals_of(2).allocations, 2);
    assert_eq!(b.totals().count(), 3);
}

#[test]
fn internal_blocks_are_freed_but_neither_counted_nor_live() {
    let internal = |size: u64, time: u64| Block { size, stack: 0, family: Family::Internal, time };
    let mut b = Books::default();
    // The program frees a block, glibc reuses its address inside a hook
    // (a thread's DTV), then the program frees that (pthread_join).
    b.alloc(0, 0x10, blk(8, 1));
    b.free(0, 0x10, 2);
    b.alloc(0, 0x10, internal(288, 3));
    assert_eq!((b.live_blocks().count(), b.internal_blocks().count()), (0, 1));
    b.free(0, 0x10, 4);
    assert_eq!((b.unmatched_frees(), b.internal_blocks().count()), (0, 0));
    // Nor its free: the counts are of the program's own blocks.
    assert_eq!((b.allocations, b.frees, b.cur_bytes, b.peak_bytes), (1, 1, 0, 8));
    // A free read before its internal block also finds it.
    b.free(1, 0x20, 9);
    b.alloc(0, 0x20, internal(16, 8));
    assert_eq!((b.unmatched_frees(), b.internal_blocks().count()), (0, 0));
    // A program block at the address of an internal one: the internal
    // block was freed untraced (an address is not handed out twice).
    b.alloc(0, 0x30, internal(16, 10));
    b.alloc(0, 0x30, blk(24, 11));
    assert_eq!((b.internal_blocks().count(), b.live_blocks().count()), (0, 1));
    b.free(0, 0x30, 12);
    assert_eq!((b.internal_blocks().count(), b.live_blocks().count(), b.unmatched_frees()), (0, 0, 0));
}

#[test]
fn free_read_before_its_alloc_cancels_it() {
    let mut b = Books::default();
    b.free(1, 0x20, 9);
    b.alloc(0, 0x20, blk(8, 3));
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
    assert_eq!((b.peak_bytes, b.peak_blocks, b.peak_time), (150, 2, 2));
}

/// The books of a stream that holds every block (as `mtrace run`'s).
fn whole() -> Books {
    Books { whole: true, ..Books::default() }
}

fn of(family: Family, size: u64, stack: u32, time: u64) -> Block {
    Block { size, stack, family, time }
}

fn dealloc(family: Family, stack: u32) -> Dealloc {
    Dealloc { family, stack: Some(stack), realloc: false }
}

/// (kind, address, block start, count) of each group.
fn kinds(b: &Books) -> Vec<(WrongKind, u64, Option<u64>, u64)> {
    b.wrong_frees().iter().map(|(w, n)| (w.kind, w.addr, w.block.as_ref().map(|c| c.addr), *n)).collect()
}

#[test]
fn a_mismatched_free_names_both_backtraces() {
    let mut b = whole();
    b.alloc(0, 0x10, of(Family::NewArray, 40, 7, 1));
    b.dealloc(0, 0x10, 2, dealloc(Family::New, 9));
    let w = b.wrong_frees();
    assert_eq!(w.len(), 1);
    let (w, n) = &w[0];
    assert_eq!((w.kind, *n, w.call.stack, w.call.call_name()), (WrongKind::Mismatched, 1, Some(9), "delete"));
    let c = w.block.as_ref().unwrap();
    assert_eq!((c.addr, c.block.size, c.block.stack, c.block.family, c.freed), (0x10, 40, 7, Family::NewArray, false));
    // Right pairs are not wrong, and the mismatched block is gone all the same.
    b.alloc(0, 0x20, of(Family::Aligned, 8, 7, 3));
    b.dealloc(0, 0x20, 4, dealloc(Family::Malloc, 9));
    assert_eq!((b.wrong_free_counts(), b.live_blocks().count(), b.cur_bytes), ((0, 1), 0, 0));
}

#[test]
fn a_double_free_names_the_first_free() {
    let mut b = whole();
    b.alloc(0, 0x10, of(Family::Malloc, 24, 1, 1));
    b.dealloc(0, 0x10, 2, dealloc(Family::Malloc, 2));
    b.dealloc(0, 0x10, 3, dealloc(Family::Malloc, 3));
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
        kinds(&b),
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
    assert_eq!((b.wrong_free_counts(), b.unmatched_frees()), ((0, 0), 1));
    // But a second free of it is a double free.
    b.dealloc(0, 0x10, 2, dealloc(Family::Malloc, 2));
    assert_eq!(kinds(&b), vec![(WrongKind::DoubleFree, 0x10, None, 1)]);
    assert_eq!(b.unmatched_frees(), 1);
}

#[test]
fn a_second_free_after_a_stop_is_not_judged() {
    let mut b = whole();
    b.alloc(0, 0x10, of(Family::Malloc, 24, 1, 1));
    b.dealloc(0, 0x10, 2, dealloc(Family::Malloc, 2));
    // Collection stops: the allocation at 0x10 in between is not recorded.
    b.whole = false;
    b.collecting_since = None;
    b.dealloc(0, 0x10, 4, dealloc(Family::Malloc, 3));
    b.collecting_since = Some(5);
    b.dealloc(0, 0x20, 6, dealloc(Family::Malloc, 3));
    assert_eq!((b.wrong_free_counts(), b.unmatched_frees()), ((0, 0), 2));
    // Once collecting again, a free twice after the restart is.
    b.alloc(0, 0x30, of(Family::Malloc, 8, 1, 7));
    b.dealloc(0, 0x30, 8, dealloc(Family::Malloc, 2));
    b.dealloc(0, 0x30, 9, dealloc(Family::Malloc, 2));
    assert_eq!(kinds(&b), vec![(WrongKind::DoubleFree, 0x30, Some(0x30), 1)]);
}

#[test]
fn a_free_read_before_another_threads_allocation_is_not_wrong() {
    // Thread 1 frees the block thread 0 allocated just before; thread 1's
    // chunk is read first: the free is unmatched until the allocation comes.
    let mut b = whole();
    b.dealloc(1, 0x10, 5, dealloc(Family::Malloc, 2));
    assert_eq!(b.wrong_free_counts(), (1, 0));
    b.alloc(0, 0x10, of(Family::Malloc, 24, 1, 3));
    assert_eq!((b.wrong_free_counts(), b.unmatched_frees(), b.live_blocks().count()), ((0, 0), 0, 0));
    // Beyond the address's window too: four later events come first.
    let mut b = whole();
    b.dealloc(1, 0x20, 100, dealloc(Family::Malloc, 2));
    for (i, t) in [200u64, 300].into_iter().enumerate() {
        b.alloc(2, 0x20, of(Family::Malloc, 8, 1, t));
        b.dealloc(2, 0x20, t + 50, dealloc(Family::Malloc, 3 + i as u32));
    }
    assert_eq!(b.wrong_free_counts(), (1, 0));
    b.alloc(0, 0x20, of(Family::Malloc, 24, 1, 50));
    assert_eq!((b.wrong_free_counts(), b.unmatched_frees()), ((0, 0), 0));
}

#[test]
fn many_mismatches_of_one_backtrace_are_one_entry() {
    let mut b = whole();
    for i in 0..1000u64 {
        b.alloc(0, 0x10 + i * 16, of(Family::New, 8, 1, 2 * i + 1));
        b.dealloc(0, 0x10 + i * 16, 2 * i + 2, dealloc(Family::Malloc, 2));
    }
    assert_eq!(kinds(&b), vec![(WrongKind::Mismatched, 0x10, Some(0x10), 1000)]);
}

#[test]
fn pool_frees_and_munmaps_are_never_wrong() {
    let mut b = whole();
    b.dealloc(0, 0x10, 1, Dealloc { family: Family::Pool, stack: None, realloc: false });
    b.munmap(0x7000_0000, 4096, 0);
    assert_eq!((b.wrong_free_counts(), b.unmatched_frees(), b.unknown_munmaps), ((0, 0), 1, 1));
    b.mmap(0x7000_0000, of(Family::Mmap, 8192, 1, 2));
    b.munmap(0x7000_1000, 4096, 0);
    assert_eq!(b.unknown_munmaps, 1);
}
