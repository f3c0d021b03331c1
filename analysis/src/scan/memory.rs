//! The snapshot's regions as the scan reads them: sorted by address, a
//! word at a time.

use std::cell::Cell;

use crate::trace::{Region, Word};

/// The snapshot's memory, sorted by address.
pub(super) struct Memory<'a> {
    regions: Vec<&'a Region>,
    /// Each region's [start, end), side by side: the binary search for a
    /// block's region reads these 16 bytes a region (2,726 regions, 43
    /// KiB, for 20 M blocks: in the cache) where reading the regions'
    /// own fields was a cache miss a step (a sixth of the marking's time).
    bounds: Vec<(u64, u64)>,
    /// The region the latest lookup found: the next block the marking
    /// reads mostly lies in it too (the blocks a region or block points
    /// to are pushed, and popped, in address order), and then no search
    /// is made (20 M blocks: the searches were a sixth of the report's time).
    latest: Cell<usize>,
    pub word: Word,
}

impl<'a> Memory<'a> {
    /// The memory of `regions`, sorted by address (none overlapping).
    pub fn new(regions: Vec<&'a Region>, word: Word) -> Memory<'a> {
        let bounds = regions.iter().map(|r| (r.addr, r.end())).collect();
        Memory { regions, bounds, latest: Cell::new(0), word }
    }

    /// The pointer-sized word at `a`, if the snapshot holds it.
    pub fn word_at(&self, a: u64) -> Option<u64> {
        let r = self.region_at(a)?;
        r.word_at(a - r.addr, self.word, false)
    }

    /// The 8-byte number at `a` in the target's byte order, if held.
    pub fn u64_at(&self, a: u64) -> Option<u64> {
        let r = self.region_at(a)?;
        r.word_at(a - r.addr, self.word, true)
    }

    fn region_at(&self, a: u64) -> Option<&Region> {
        let i = match self.in_latest(a) {
            Some(i) => i,
            None => self.bounds.partition_point(|b| b.0 <= a).checked_sub(1)?,
        };
        self.latest.set(i);
        Some(self.regions[i])
    }

    /// The latest region found, if it holds `a`.
    #[inline]
    fn in_latest(&self, a: u64) -> Option<usize> {
        let i = self.latest.get();
        self.bounds.get(i).filter(|b| b.0 <= a && a < b.1).map(|_| i)
    }

    /// Aligned words in `[lo, hi)` that the snapshot holds.
    pub fn words(&self, lo: u64, hi: u64, mut f: impl FnMut(u64)) {
        // The first region ending after `lo`: the latest one if it holds
        // `lo` (regions are sorted and disjoint).
        let i = self.in_latest(lo).unwrap_or_else(|| self.bounds.partition_point(|b| b.1 <= lo));
        self.latest.set(i);
        for r in &self.regions[i..] {
            if r.addr >= hi {
                break;
            }
            r.each_word(lo, hi, self.word, &mut f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtrace_format::{region_kind, sparse};

    /// A sparse region at `addr` of `n` words, holding `held` (index, value).
    fn sparse_region(addr: u64, n: usize, held: &[(usize, u64)]) -> Region {
        let mut p = Vec::new();
        sparse::put_len(&mut p, n as u64 * 8);
        let mut bits = vec![0u8; sparse::bitmap_len(n as u64 * 8, 8)];
        for &(i, _) in held {
            bits[i / 8] |= 1 << (i % 8);
        }
        p.extend(bits);
        for &(_, v) in held {
            mtrace_format::put_varint(&mut p, sparse::encode_word(v, 8));
        }
        Region::of_record(region_kind::MAPPING | region_kind::SPARSE, addr, p, Word { size: 8, big: false }).unwrap()
    }

    #[test]
    fn sparse_regions_read_their_held_words_only() {
        let held = [(0, 10), (63, 11), (64, 12), (70, 13), (199, 14)];
        let r = sparse_region(0x1000, 200, &held);
        assert_eq!((r.kind, r.len, r.end()), (region_kind::MAPPING, 1600, 0x1000 + 1600));
        let mem = Memory::new(vec![&r], Word { size: 8, big: false });
        for &(i, v) in &held {
            assert_eq!(mem.word_at(0x1000 + 8 * i as u64), Some(v));
        }
        assert_eq!(mem.word_at(0x1008), None);
        assert_eq!(mem.word_at(0x1004), None);
        assert_eq!(mem.word_at(0x1000 + 1600), None);
        assert_eq!(mem.u64_at(0x1000 + 8 * 63), Some(11));
        let mut all = Vec::new();
        mem.words(0, u64::MAX, |w| all.push(w));
        assert_eq!(all, [10, 11, 12, 13, 14]);
        // Ranges starting and ending inside groups.
        for (lo, hi, want) in [
            (0x1000 + 8, 0x1000 + 8 * 71, &[11, 12, 13][..]),
            (0x1000 + 8 * 64, 0x1000 + 8 * 70, &[12]),
            (0x1000 + 8 * 65, 0x1000 + 8 * 200, &[13, 14]),
            (0x1000 + 8 * 71, 0x1000 + 8 * 199, &[]),
        ] {
            let mut got = Vec::new();
            mem.words(lo, hi, |w| got.push(w));
            assert_eq!(got, want, "{lo:#x}..{hi:#x}");
        }
    }

    #[test]
    fn a_held_zero_reads_as_zero_and_is_no_pointer_to_walk() {
        // Words 1, 2, 64 and 65 held: 0, 7, 0, 0x5000.
        let r = sparse_region(0x1000, 70, &[(1, 0), (2, 7), (64, 0), (65, 0x5000)]);
        let mem = Memory::new(vec![&r], Word { size: 8, big: false });
        let at = |i: u64| mem.word_at(0x1000 + 8 * i);
        assert_eq!([at(0), at(1), at(2), at(3), at(64), at(65)], [None, Some(0), Some(7), None, Some(0), Some(0x5000)]);
        assert_eq!(mem.u64_at(0x1000 + 8 * 64), Some(0));
        let mut all = Vec::new();
        mem.words(0, u64::MAX, |w| all.push(w));
        assert_eq!(all, [7, 0x5000]);
    }

    #[test]
    fn a_plain_region_mostly_zeros_reads_as_its_bytes() {
        // 130 words (three groups of the bitmap), every third one not 0.
        let words: Vec<u64> = (0..130u64).map(|i| if i % 3 == 0 { 0x7000 + i } else { 0 }).collect();
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let word = Word { size: 8, big: false };
        let plain = Region::dense(region_kind::MAPPING, false, 0x1000, bytes.clone());
        let kept = Region::of_record(region_kind::MAPPING, 0x1000, bytes.clone(), word).unwrap();
        assert!(kept.dense_bytes().is_none(), "kept as held words");
        let (a, b) = (Memory::new(vec![&plain], word), Memory::new(vec![&kept], word));
        for o in (0..130 * 8 + 8).step_by(8) {
            assert_eq!(a.word_at(0x1000 + o), b.word_at(0x1000 + o), "{o}");
            assert_eq!(a.u64_at(0x1000 + o), b.u64_at(0x1000 + o), "{o}");
        }
        let (mut wa, mut wb) = (Vec::new(), Vec::new());
        a.words(0x1000 + 8, 0x1000 + 8 * 129, |w| wa.extend((w != 0).then_some(w)));
        b.words(0x1000 + 8, 0x1000 + 8 * 129, |w| wb.push(w));
        assert_eq!(wa, wb);
        // 8-byte words without zeros: held too (a value takes about half a
        // word), and read back as they were.
        let full: Vec<u8> = (1..=64u64).map(|w| w << 40 | w).flat_map(|w| w.to_le_bytes()).collect();
        let held = Region::of_record(region_kind::MAPPING, 0, full.clone(), word).unwrap();
        assert!(held.dense_bytes().is_none());
        let dense = Region::dense(region_kind::MAPPING, false, 0, full);
        let (a, b) = (Memory::new(vec![&dense], word), Memory::new(vec![&held], word));
        assert!((0..64 * 8 + 8).step_by(8).all(|o| a.word_at(o) == b.word_at(o)));
        // 4-byte words with few zeros, or the registers: as they are.
        let w4 = Word { size: 4, big: false };
        let full: Vec<u8> = (1..=64u32).flat_map(|w| w.to_le_bytes()).collect();
        assert!(Region::of_record(region_kind::MAPPING, 0, full, w4).unwrap().dense_bytes().is_some());
        assert!(Region::of_record(region_kind::REGISTERS, 0, bytes.clone(), word).unwrap().dense_bytes().is_some());
        // Nor a region that does not start on a word.
        assert!(Region::of_record(region_kind::MAPPING, 0x1004, bytes, word).unwrap().dense_bytes().is_some());
    }

    #[test]
    fn sparse_regions_of_a_32_bit_big_endian_target() {
        // 4 words of 4 bytes, all held: 0 and three others.
        let mut p = Vec::new();
        sparse::put_len(&mut p, 16);
        p.push(0b1111);
        for v in [0, 0x8000_0010u64, 0x20, 0xffff_fff0] {
            mtrace_format::put_varint(&mut p, sparse::encode_word(v, 4));
        }
        let r =
            Region::of_record(region_kind::STACK | region_kind::SPARSE, 0x100, p, Word { size: 4, big: true }).unwrap();
        let mem = Memory::new(vec![&r], Word { size: 4, big: true });
        assert_eq!(mem.word_at(0x104), Some(0x8000_0010));
        assert_eq!(mem.word_at(0x10c), Some(0xffff_fff0));
        assert_eq!(mem.u64_at(0x104), Some(0x8000_0010_0000_0020));
        // Word 0 held, and 0.
        assert_eq!(mem.u64_at(0x100), Some(0x8000_0010));
        assert_eq!(mem.word_at(0x100), Some(0));
        let mut all = Vec::new();
        mem.words(0x100, 0x110, |w| all.push(w));
        assert_eq!(all, [0x8000_0010, 0x20, 0xffff_fff0]);
    }

    #[test]
    fn lookups_in_any_order_find_their_regions() {
        // Three regions of 4 words each with gaps between them, every word
        // held (value: its address + 1); looked up in an order that leaves
        // the latest region for another one, a gap and back.
        let all = |addr: u64| sparse_region(addr, 4, &(0..4).map(|i| (i, addr + 8 * i as u64 + 1)).collect::<Vec<_>>());
        let (a, b, c) = (all(0x1000), all(0x2000), all(0x3000));
        let mem = Memory::new(vec![&a, &b, &c], Word { size: 8, big: false });
        for addr in [0x2008, 0x2018, 0x1000, 0x3010, 0x2020, 0x1018, 0x0ff8, 0x3018, 0x2000, 0x4000] {
            let held = [0x1000..0x1020, 0x2000..0x2020, 0x3000..0x3020].iter().any(|r| r.contains(&addr));
            assert_eq!(mem.word_at(addr), held.then_some(addr + 1), "{addr:#x}");
        }
        let words = |lo, hi| {
            let mut got = Vec::new();
            mem.words(lo, hi, |w| got.push(w));
            got
        };
        assert_eq!(words(0x3008, 0x3018), [0x3009, 0x3011]);
        assert_eq!(words(0x1010, 0x2010), [0x1011, 0x1019, 0x2001, 0x2009]);
        assert_eq!(words(0x2018, 0x3008), [0x2019, 0x3001]);
        assert_eq!(words(0x1020, 0x2000), Vec::<u64>::new());
        assert_eq!(words(0x0, 0x1008), [0x1001]);
    }
}
