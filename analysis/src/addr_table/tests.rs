//! The table's tests: lookups, growth, a dropped index, tags that agree.
use super::*;

#[test]
fn inserts_and_finds() {
    let mut t: Table<u64> = Table::default();
    for a in (0..100_000u64).map(|k| 0x5555_0000_0000 + k * 16) {
        let f = t.find(a);
        assert!(f.vacant());
        t.insert(f, a, a);
    }
    assert_eq!(t.slab.len(), 100_000);
    assert_eq!(t.get(0x5555_0000_0010), Some(&0x5555_0000_0010));
    assert!(t.get(0x5555_0000_0018).is_none());
    let f = t.find(0x5555_0000_0040);
    *t.at(f).unwrap() += 1;
    assert_eq!(t.get(0x5555_0000_0040), Some(&0x5555_0000_0041));
    assert_eq!(t.iter().count(), 100_000);
}

#[test]
fn a_dropped_index_still_finds_every_address() {
    let mut t: Table<u64> = Table::default();
    let keys: Vec<u64> = (0..10_000u64).map(|k| 0x5555_0000_0000 + k * 32).collect();
    for &a in &keys {
        let f = t.find(a);
        t.insert(f, a, a);
    }
    t.drop_index();
    assert!(t.index.is_empty());
    t.prefetch_index(keys[0]);
    t.prefetch_slot(keys[0]);
    // Looked up by walking the slots, the index still dropped.
    assert_eq!((t.get(keys[7]), t.get(0x5555_0000_0008)), (Some(&keys[7]), None));
    assert!(t.index.is_empty());
    // A find builds it again, as small as holds them (half full at most).
    let f = t.find(keys[9]);
    assert_eq!((t.at(f).copied(), t.index.len()), (Some(keys[9]), 32_768));
    let f = t.find(0x6666_0000_0000);
    assert!(f.vacant());
    t.insert(f, 0x6666_0000_0000, 1);
    assert!(keys.iter().all(|a| t.get(*a) == Some(a)) && t.get(0x6666_0000_0000) == Some(&1));
    assert_eq!(t.iter().count(), 10_001);
}

#[test]
fn a_large_index_is_fuller_and_still_finds_every_address() {
    // 5 M addresses: past half of 2^22 buckets the index doubles to
    // 2^23, large, which holds up to three quarters (6.3 M).
    let mut t: Table<u64> = Table::default();
    let keys = (0..5_000_000u64).map(|k| 0x5555_0000_0000 + k * 48);
    for a in keys.clone() {
        let f = t.find(a);
        assert!(f.vacant());
        t.insert(f, a, a);
    }
    assert_eq!(t.index.len(), LARGE);
    assert!(keys.clone().all(|a| t.get(a) == Some(&a)));
    assert!(t.get(0x5555_0000_0010).is_none());
}

#[test]
fn addresses_whose_tags_agree_are_told_apart() {
    // Pairs with one tag but different addresses, found by search:
    // each must find its own slot.
    let mut by_tag = std::collections::HashMap::new();
    let mut pairs = Vec::new();
    // Random addresses (a sequence's multiplicative hashes spread
    // evenly: no two agree): 2 M of them share some 460 tags.
    let mut x = 88172645463325252u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        0x7f00_0000_0000 + (x % (1 << 40)) * 16
    };
    for k in (0..2_000_000).map(|_| next()) {
        if let Some(&other) = by_tag.get(&tag(hash(k))) {
            if other != k {
                pairs.push((other, k));
            }
        } else {
            by_tag.insert(tag(hash(k)), k);
        }
    }
    assert!(!pairs.is_empty(), "no two tags agree: the test tests nothing");
    let mut t: Table<u64> = Table::default();
    for &(a, b) in &pairs {
        for k in [a, b] {
            let f = t.find(k);
            assert!(f.vacant());
            t.insert(f, k, k);
        }
    }
    for &(a, b) in &pairs {
        assert_eq!((t.get(a), t.get(b)), (Some(&a), Some(&b)));
    }
    assert!(t.get(0x7f00_0000_0008).is_none());
}

/// Addresses whose home in an index of `buckets` is one of `homes`,
/// `per` of each, found by search among 16-byte aligned addresses.
fn homing(buckets: usize, homes: &[usize], per: usize) -> Vec<u64> {
    let mut got = Vec::new();
    for &home in homes {
        let mut n = 0;
        let mut k = 0x5555_0000_0000u64;
        while n < per {
            if (hash(k) >> shift_for(buckets)) as usize == home {
                got.push(k);
                n += 1;
            }
            k += 16;
        }
    }
    got
}

/// Grows `t` from its entries to `buckets` and checks every key is found in
/// it, with its slot, and that an address not in it is not.
fn grows_and_finds(t: &mut Table<u64>, keys: &[u64], buckets: usize) {
    let before = t.index.iter().filter(|&&e| e != 0).count();
    t.grow_from_entries(buckets);
    assert_eq!(t.index.len(), buckets);
    assert_eq!(t.index.iter().filter(|&&e| e != 0).count(), before);
    for &k in keys {
        assert_eq!(t.get(k), Some(&k), "{k:#x}");
    }
    assert!(t.get(0x5555_0000_0008).is_none());
}

#[test]
fn an_index_grown_from_its_entries_keeps_walks_that_wrapped_and_long_runs() {
    // Runs that wrap around the end into bucket 0, and a long run
    // from bucket 2 whose last entries lie more than twice their home
    // away.
    let keys = homing(MIN_BUCKETS, &[MIN_BUCKETS - 2, MIN_BUCKETS - 1, 0, 2, 3, 700, 701], 12);
    let mut t: Table<u64> = Table::default();
    for &k in &keys {
        let f = t.find(k);
        assert!(f.vacant());
        t.insert(f, k, k);
    }
    assert_ne!(t.index[0], 0, "nothing wrapped: the test tests nothing");
    grows_and_finds(&mut t, &keys, 4 * MIN_BUCKETS);
    // And again from there, then by the table's own growth.
    grows_and_finds(&mut t, &keys, 16 * MIN_BUCKETS);
    let more: Vec<u64> = (0..300_000u64).map(|k| 0x7777_0000_0000 + k * 48).collect();
    for &k in &more {
        let f = t.find(k);
        t.insert(f, k, k);
    }
    assert!(t.index.len() > 16 * MIN_BUCKETS);
    assert!(keys.iter().chain(&more).all(|k| t.get(*k) == Some(k)));
    // Bucket 0 free, a run from bucket 1: its entries from the fourth
    // on have new homes (4 to 7) at or before their old buckets, so
    // the new walks cross each other.
    let keys = homing(MIN_BUCKETS, &[1, 2], 10);
    let mut t: Table<u64> = Table::default();
    for &k in &keys {
        let f = t.find(k);
        t.insert(f, k, k);
    }
    assert_eq!((t.index[0], t.index[19] != 0), (0, true));
    grows_and_finds(&mut t, &keys, 4 * MIN_BUCKETS);
}

#[test]
fn an_index_grown_in_place_keeps_walks_that_wrapped_and_long_runs() {
    // As above, in a mapping with room: runs that wrap into bucket 0 (their
    // new homes near the end, where a probe may wrap onto buckets not moved
    // yet), a run from bucket 0 whose entries lie far past twice their home
    // (placed last), and addresses spread over the whole index.
    let buckets = MIN_BUCKETS;
    let mut keys = homing(buckets, &[buckets - 2, buckets - 1, 0, 2, 3, 700, 701], 12);
    keys.extend((0..1_000u64).map(|k| 0x7777_0000_0000 + k * 48));
    let index = Buckets::mapped(buckets, 64 * buckets).expect("a mapping of 2 MiB");
    let mut t: Table<u64> = Table { index, ..Table::default() };
    for &k in &keys {
        let f = t.find(k);
        assert!(f.vacant());
        t.insert(f, k, k);
    }
    assert_ne!(t.index[0], 0, "nothing wrapped: the test tests nothing");
    let at = t.index.as_ptr();
    // By two, then by four, then by the table's own growth.
    grows_and_finds(&mut t, &keys, 2 * buckets);
    grows_and_finds(&mut t, &keys, 8 * buckets);
    assert_eq!(t.index.as_ptr(), at, "moved, not grown in place");
    let more: Vec<u64> = (0..50_000u64).map(|k| 0x9999_0000_0000 + k * 16).collect();
    for &k in &more {
        let f = t.find(k);
        t.insert(f, k, k);
    }
    assert_eq!((t.index.len(), t.index.as_ptr()), (32 * buckets, at));
    assert!(keys.iter().chain(&more).all(|k| t.get(*k) == Some(k)));
    // Past its room it is moved (here to the heap: 2^19 buckets are not
    // large).
    grows_and_finds(&mut t, &keys, 128 * buckets);
    assert!(!t.index.is_mapped() || t.index.as_ptr() != at);
    assert!(more.iter().all(|k| t.get(*k) == Some(k)));
}

#[test]
fn a_large_index_grows_from_its_entries() {
    let keys = homing(LARGE, &[LARGE - 1, 0, 1, 5, LARGE / 2], 8);
    let mut t: Table<u64> = Table::default();
    t.rebuild(LARGE);
    for &k in &keys {
        let f = t.find(k);
        t.insert(f, k, k);
    }
    assert_ne!(t.index[0], 0, "nothing wrapped: the test tests nothing");
    grows_and_finds(&mut t, &keys, 2 * LARGE);
}

/// The k-th address of a pattern.
type Pattern = fn(u64) -> u64;

/// Address patterns of real heaps: neighbours 8 to 48 bytes apart (the
/// smallest blocks of jemalloc and of glibc, mixed sizes), pages and pages
/// with a header, 64 KiB and 2 MiB apart (large blocks, arenas), and
/// random addresses: (name, the k-th address).
fn patterns() -> Vec<(&'static str, Pattern)> {
    vec![
        ("8 bytes apart", |k| 0x5555_0000_0000 + k * 8),
        ("16 bytes apart", |k| 0x5555_0000_0000 + k * 16),
        ("32 bytes apart", |k| 0x5555_0000_0000 + k * 32),
        ("48 bytes apart", |k| 0x5555_0000_0000 + k * 48),
        ("pages", |k| 0x7f00_0000_0000 + k * 4096),
        ("pages and a header", |k| 0x7f00_0000_0010 + k * 4112),
        ("64 KiB apart", |k| 0x7f00_0000_0000 + k * 65536),
        ("2 MiB apart", |k| 0x7f00_0000_0000 + k * (2 << 20)),
        ("random", |k| {
            let mut x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1234_5678;
            x ^= x >> 29;
            x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x ^= x >> 32;
            0x7f00_0000_0000 + (x % (1 << 36)) * 16
        }),
    ]
}

#[test]
fn every_pattern_probes_briefly_three_quarters_full() {
    // An index of 2^16 buckets filled to three quarters (a large index's
    // most) without growing, each pattern: the mean and longest distance
    // of an address's bucket from its home. Hashing the addresses in
    // bytes, not 8-byte units, blocks 32 bytes apart lay 6.1 buckets from
    // home on average (16 bytes apart 2.9; now 0.6 and 0.2).
    let buckets = 1 << 16;
    for (name, at) in patterns() {
        let mut t: Table<u64> = Table::default();
        t.rebuild(buckets);
        let n = buckets as u64 * 3 / 4;
        for a in (0..n).map(at) {
            let f = t.find(a);
            assert!(f.vacant(), "{name}: {a:#x}");
            let id = t.slab.put(a, a);
            t.index[f.bucket] = entry(f.tag, id);
        }
        assert_eq!(t.index.len(), buckets);
        let distance = |a: u64| t.bucket(a).0.wrapping_sub(t.home(hash(a))) & (buckets - 1);
        let (sum, longest) = (0..n).map(at).fold((0, 0), |(s, m), a| (s + distance(a), m.max(distance(a))));
        let mean = sum as f64 / n as f64;
        assert!(mean < 3.5 && longest < 256, "{name}: mean {mean:.2}, longest {longest}");
        assert!((0..n).map(at).all(|a| t.get(a) == Some(&a)), "{name}");
    }
}
