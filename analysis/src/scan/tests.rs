//! The marking's unit tests: memcheck's kinds on hand-made snapshots.
use super::*;

fn region(addr: u64, words: &[u64], kind: u8) -> Region {
    Region::dense(kind, false, addr, words.iter().flat_map(|w| w.to_le_bytes()).collect())
}

fn run(blocks: &[(u64, u64)], regions: Vec<Region>) -> Vec<Kind> {
    let mut t = crate::trace::Trace::new(std::path::Path::new("x"), Default::default());
    for &(a, size) in blocks {
        t.books.alloc(0, a, crate::books::Block { size, stack: 0, family: Family::Malloc, time: 0, align: 0 });
    }
    t.books.settle();
    t.snapshot = Some(regions);
    let c = classify(&t, Heuristics::ALL, &[]).unwrap();
    c.iter().map(|c| c.kind).collect()
}

const HEAP: u64 = 0x10000;

#[test]
fn memcheck_kinds() {
    // Blocks at HEAP + 0x100 * i, 32 bytes each. The heap mapping holds
    // their contents; a data mapping holds the roots.
    let b = |i: u64| HEAP + 0x100 * i;
    let mut heap = vec![0u64; 10 * 0x100 / 8];
    let mut put = |blk: u64, word: u64, v: u64| heap[((blk - HEAP) / 8 + word) as usize] = v;
    put(b(0), 0, b(1)); // 0 reachable -> 1 reachable (start)
    put(b(1), 1, b(2) + 8); // 1 -> interior of 2: possible
    put(b(3), 0, b(4)); // lost tree: 3 definite, 4 and 5 indirect
    put(b(3), 1, b(5));
    put(b(6), 0, b(7)); // lost cycle 6 <-> 7: one definite, one indirect
    put(b(7), 0, b(6));
    put(b(8), 0, b(8)); // self-pointer: definite
    let roots = region(0x1000, &[b(0), 0, 7, b(9) + 4], region_kind::MAPPING);
    let kinds =
        run(&(0..10).map(|i| (b(i), 32)).collect::<Vec<_>>(), vec![roots, region(HEAP, &heap, region_kind::MAPPING)]);
    use Kind::*;
    assert_eq!(
        kinds,
        vec![Reachable, Reachable, Possible, Definite, Indirect, Indirect, Definite, Indirect, Definite, Possible]
    );
}

#[test]
fn unaligned_words_do_not_count() {
    let mut bytes = vec![0u8; 24];
    bytes[3..11].copy_from_slice(&(HEAP).to_le_bytes());
    let kinds = run(&[(HEAP, 16)], vec![Region::dense(region_kind::MAPPING, false, 0x1000, bytes)]);
    assert_eq!(kinds, vec![Kind::Definite]);
}

#[test]
fn registers_are_roots_and_a_later_group_absorbs_an_earlier_leader() {
    let b = |i: u64| HEAP + 0x100 * i;
    // Block 1 points to block 0: 0 is found first as a leader, then 1's
    // group reaches it: 1 definite, 0 indirect. Block 2 is in a register.
    let mut heap = vec![0u64; 0x300 / 8];
    heap[(0x100 / 8) as usize] = b(0);
    let regs = region(0, &[b(2)], region_kind::REGISTERS);
    let kinds = run(&[(b(0), 16), (b(1), 16), (b(2), 16)], vec![regs, region(HEAP, &heap, region_kind::MAPPING)]);
    assert_eq!(kinds, vec![Kind::Indirect, Kind::Definite, Kind::Reachable]);
}

#[test]
fn pieces_of_a_heap_mapping_are_not_roots_even_without_a_block() {
    // A mapping of two pieces: the first holds blocks 0 and 1, the
    // second none, but a stale pointer to block 1. Decided together,
    // the second piece is heap, not a root: block 1 stays lost.
    let heap = region(HEAP, &[0; 8], region_kind::MAPPING);
    let tail =
        |continues| Region::dense(region_kind::MAPPING, continues, HEAP + 64, (HEAP + 32).to_le_bytes().to_vec());
    let roots = region(0x1000, &[HEAP], region_kind::MAPPING);
    let blocks = [(HEAP, 16), (HEAP + 32, 16)];
    let kinds = run(&blocks, vec![roots, heap, tail(true)]);
    assert_eq!(kinds, vec![Kind::Reachable, Kind::Definite]);
    // A separate mapping with the same word is a root.
    let roots = region(0x1000, &[HEAP], region_kind::MAPPING);
    let kinds = run(&blocks, vec![roots, region(HEAP, &[0; 8], region_kind::MAPPING), tail(false)]);
    assert_eq!(kinds, vec![Kind::Reachable, Kind::Reachable]);
}

#[test]
fn mallocs_pointer_to_the_next_chunk_is_not_a_reference() {
    // A 24-byte block: the next chunk's header is at start + 16, inside
    // the block; glibc's top-chunk pointer holds that address.
    let roots = region(0x1000, &[HEAP + 16, HEAP + 0x108], region_kind::MAPPING);
    let kinds = run(&[(HEAP, 24), (HEAP + 0x100, 24)], vec![roots]);
    assert_eq!(kinds, vec![Kind::Definite, Kind::Possible]);
}

#[test]
fn a_lost_list_is_one_definite_block_and_the_rest_indirect() {
    // Block i points to block i-1; block 0 to nothing. Leaders are
    // found from the lowest address: each joins the next group.
    let n = 2000u64;
    let b = |i: u64| HEAP + 0x20 * i;
    let mut words = vec![0u64; (0x20 * n / 8) as usize];
    for i in 1..n {
        words[(0x20 * i / 8) as usize] = b(i - 1);
    }
    let blocks: Vec<(u64, u64)> = (0..n).map(|i| (b(i), 16)).collect();
    let mut t = crate::trace::Trace::new(std::path::Path::new("x"), Default::default());
    for &(a, size) in &blocks {
        t.books.alloc(0, a, crate::books::Block { size, stack: 0, family: Family::Malloc, time: 0, align: 0 });
    }
    t.books.settle();
    t.snapshot = Some(vec![region(HEAP, &words, region_kind::MAPPING)]);
    let c = classify(&t, Heuristics::ALL, &[]).unwrap();
    let definite: Vec<u64> = c.iter().filter(|c| c.kind == Kind::Definite).map(|c| c.addr).collect();
    assert_eq!(definite, vec![b(n - 1)]);
    assert!(c.iter().filter(|c| c.kind == Kind::Indirect).all(|c| c.owner == Some(b(n - 1))));
}

#[test]
fn heuristics_need_their_exact_layout() {
    // Each block is pointed to 1 word (newarray, length64 with 8-byte
    // words) or 3 words (stdstring) in, from a root.
    let b = |i: u64| HEAP + 0x100 * i;
    let mut heap = vec![0u64; 6 * 0x100 / 8];
    let mut put = |blk: u64, word: u64, v: u64| heap[((blk - HEAP) / 8 + word) as usize] = v;
    put(b(0), 0, 5); // 48 bytes: 5 divides 40 -> newarray (length64 wants 40)
    put(b(1), 0, 7); // 48 bytes: 7 does not divide 40 -> possible
    put(b(2), 0, 40); // 48 bytes: the size of the rest -> length64
    put(b(3), 0, 3); // stdstring: length 3 <= capacity 20, 24 + 20 + 1 = 45
    put(b(3), 1, 20);
    put(b(4), 0, 30); // length 30 > capacity 20 -> possible
    put(b(4), 1, 20);
    let roots = region(0x1000, &[b(0) + 8, b(1) + 8, b(2) + 8, b(3) + 24, b(4) + 24], region_kind::MAPPING);
    let blocks = [(b(0), 48), (b(1), 48), (b(2), 48), (b(3), 45), (b(4), 45)];
    let mut t = crate::trace::Trace::new(std::path::Path::new("x"), Default::default());
    for &(a, size) in &blocks {
        t.books.alloc(0, a, crate::books::Block { size, stack: 0, family: Family::Malloc, time: 0, align: 0 });
    }
    t.books.settle();
    t.snapshot = Some(vec![roots, region(HEAP, &heap, region_kind::MAPPING)]);
    let c = classify(&t, Heuristics::ALL, &[]).unwrap();
    let got: Vec<(Kind, Option<Heuristic>)> = c.iter().map(|c| (c.kind, c.via)).collect();
    use Kind::*;
    assert_eq!(
        got,
        [
            (Reachable, Some(Heuristic::NewArray)),
            (Possible, None),
            (Reachable, Some(Heuristic::Length64)),
            (Reachable, Some(Heuristic::StdString)),
            (Possible, None),
        ]
    );
    // None of them without heuristics.
    let c = classify(&t, Heuristics::NONE, &[]).unwrap();
    assert!(c.iter().all(|c| c.kind == Possible && c.via.is_none()));
}

#[test]
fn memory_merged_with_mmapped_chunks_is_a_root() {
    // One mapping: the loader's page (a pointer to block S, in the arena
    // elsewhere) and then a 128 KiB block malloc mapped on its own, which
    // the kernel merged into one mapping. The loader's page is a root.
    const MAP: u64 = 0x100_0000;
    let big = (MAP + 0x1000 + 16, 128 * 1024);
    let small = (HEAP, 32);
    let mut words = vec![0u64; (0x1000 + 0x21000) / 8];
    words[0] = small.0;
    let kinds = run(&[small, big], vec![region(MAP, &words, region_kind::MAPPING)]);
    assert_eq!(kinds, vec![Kind::Reachable, Kind::Definite]);
    // With a small block in the same mapping it is an arena, all malloc's:
    // the word is a stale one, not a root.
    let arena_block = (MAP + 0x800, 32);
    let kinds = run(&[small, arena_block, big], vec![region(MAP, &words, region_kind::MAPPING)]);
    assert_eq!(kinds, vec![Kind::Definite, Kind::Definite, Kind::Definite]);
    // A large block that is not 16 bytes into a page is an arena's too.
    let kinds = run(&[small, (big.0 + 16, big.1)], vec![region(MAP, &words, region_kind::MAPPING)]);
    assert_eq!(kinds, vec![Kind::Definite, Kind::Definite]);
}

#[test]
fn an_allocators_own_mapping_is_no_root() {
    // jemalloc's metadata: a mapping of no heap block, whose extent
    // record points to the first block of a slab (S). The program's
    // data beside it points to nothing. As a mapping nobody is known to
    // have made, it is a root: S still reachable.
    const META: u64 = 0x200_0000;
    let slab_start = (HEAP, 32);
    let other = (HEAP + 0x20, 32);
    let with = |allocators: &[(u64, u64)], sampled: bool| {
        let mut t = crate::trace::Trace::new(std::path::Path::new("x"), Default::default());
        for (a, size) in [slab_start, other] {
            t.books.alloc(0, a, crate::books::Block { size, stack: 0, family: Family::Malloc, time: 0, align: 0 });
        }
        t.books.settle();
        if sampled {
            t.books.sample_rate = 4096;
        }
        let meta = region(META, &[0, slab_start.0, 0, 0], region_kind::MAPPING);
        let data = region(META + 0x20, &[other.0], region_kind::MAPPING);
        t.snapshot = Some(vec![meta, data, region(HEAP, &[0; 8], region_kind::MAPPING)]);
        let c = classify(&t, Heuristics::ALL, allocators).unwrap();
        (c.iter().map(|c| c.kind).collect::<Vec<_>>(), c.allocators_mapping(META))
    };
    assert_eq!(with(&[], false), (vec![Kind::Reachable, Kind::Reachable], false));
    // Made by the allocator for its own use: not a root; the program's
    // data after it, in the same region group, still is.
    assert_eq!(with(&[(META, META + 0x20)], false), (vec![Kind::Definite, Kind::Reachable], true));
    // Sampled (blocks not known may point anywhere): a root as before.
    assert_eq!(with(&[(META, META + 0x20)], true), (vec![Kind::Reachable, Kind::Reachable], false));
}

#[test]
fn outside_leaves_the_holes_out() {
    assert_eq!(outside(0, 100, &[]), [(0, 100)]);
    assert_eq!(outside(10, 100, &[(0, 20), (15, 30), (50, 60), (90, 200)]), [(30, 50), (60, 90)]);
    assert_eq!(outside(10, 100, &[(0, 200)]), []);
}
