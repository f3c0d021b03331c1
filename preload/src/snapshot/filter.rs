//! Which words of the program's memory the snapshot keeps (the format's
//! `sparse` module): an address inside a readable mapping (a pointer to a
//! block, to a vtable or into code), or a number whose magnitude is below
//! the writable mappings' total size (a block's length, capacity or count,
//! which memcheck's heuristics compare with its size, or 0). Any other word
//! can neither reach a block nor satisfy a heuristic (docs/SCAN.md), so the
//! snapshot leaves it out: the 256 MiB of numbers in scripts/bench_scan.c
//! cost zstd 70% of the snapshot's time and the analyzer most of its
//! reading.
//!
//! The test must cost a few instructions a word: the mappings are merged
//! into at most [`RANGES`] ranges that cover them all (closing the smallest
//! gaps first), so a word in a gap between mappings may be kept, never the
//! other way round.

/// Ranges the mappings are merged into.
const RANGES: usize = 4;

pub struct Filter {
    /// (start, length) of each range; unused ones are (0, 0).
    ranges: [(u64, u64); RANGES],
    /// Numbers `v` with `-small <= v < small` are kept.
    small: u64,
}

impl Filter {
    /// The filter for `maps` ((start, end, writable) of the readable
    /// mappings of `/proc/self/maps`, any order).
    pub fn new(maps: &[(u64, u64, bool)]) -> Filter {
        let mut spans: Vec<(u64, u64)> = maps.iter().map(|m| (m.0, m.1)).filter(|m| m.0 < m.1).collect();
        spans.sort_unstable();
        // Merge overlapping or touching spans, then close the smallest gaps
        // until RANGES are left.
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (lo, hi) in spans {
            match merged.last_mut() {
                Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        while merged.len() > RANGES {
            let i = (0..merged.len() - 1).min_by_key(|&i| merged[i + 1].0 - merged[i].1).unwrap_or(0);
            merged[i].1 = merged[i + 1].1;
            merged.remove(i + 1);
        }
        let mut ranges = [(0, 0); RANGES];
        for (r, m) in ranges.iter_mut().zip(&merged) {
            *r = (m.0, m.1 - m.0);
        }
        // A block lies in writable memory, so its size is at most their total.
        let small = maps.iter().filter(|m| m.2).map(|m| m.1.saturating_sub(m.0)).sum::<u64>().saturating_add(1);
        Filter { ranges, small: small.min(1 << 62) }
    }

    /// Whether the snapshot keeps a word holding `v`.
    #[inline(always)]
    pub fn keep(&self, v: u64) -> bool {
        let [a, b, c, d] = self.ranges;
        // Non-short-circuit `|`: no branch per test.
        (v.wrapping_add(self.small) < 2 * self.small)
            | (v.wrapping_sub(a.0) < a.1)
            | (v.wrapping_sub(b.0) < b.1)
            | (v.wrapping_sub(c.0) < c.1)
            | (v.wrapping_sub(d.0) < d.1)
    }

    /// Sets bit `i` of `bits` (LSB first, 8 bytes per 64 words) for each
    /// word `i` of `words` this filter keeps. Returns how many it keeps and
    /// whether any word is not 0. `bits` must hold
    /// `words.len().div_ceil(64) * 8` bytes.
    pub fn mask(&self, words: &[u64], bits: &mut [u8]) -> (usize, bool) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, which is all `mask_avx2` assumes.
            return unsafe { self.mask_avx2(words, bits) };
        }
        self.mask_any(words, bits)
    }

    /// `mask` compiled for AVX2: the compiler then tests four words at a
    /// time (pack of scripts/bench_scan.c's numbers: 1.8 against 4.1 ns a
    /// word).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn mask_avx2(&self, words: &[u64], bits: &mut [u8]) -> (usize, bool) {
        self.mask_any(words, bits)
    }

    #[inline(always)]
    fn mask_any(&self, words: &[u64], bits: &mut [u8]) -> (usize, bool) {
        let (mut kept, mut any) = (0, 0u64);
        for (g, group) in words.chunks(64).enumerate() {
            let mut b = 0u64;
            for (i, &v) in group.iter().enumerate() {
                b |= (self.keep(v) as u64) << i;
                any |= v;
            }
            bits[g * 8..g * 8 + 8].copy_from_slice(&b.to_le_bytes());
            kept += b.count_ones() as usize;
        }
        (kept, any != 0)
    }
}

/// Writes the words of `words` that `bits` marks (as [`Filter::mask`] set
/// them) to `out` as the format's varints (`sparse::encode_word`), in
/// order; returns the bytes written. `out` must have 10 bytes per word
/// marked and 8 more.
pub fn encode(words: &[u64], bits: &[u8], out: &mut [u8]) -> usize {
    let mut n = 0;
    for (group, b) in words.chunks(64).zip(bits.chunks_exact(8)) {
        let mut b = u64::from_le_bytes(b.try_into().unwrap_or_default());
        while b != 0 {
            let v = group[b.trailing_zeros() as usize];
            n += mtrace_format::put_varint_at(out, n, mtrace_format::sparse::encode_word(v, 8));
            b &= b - 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::Filter;

    #[test]
    fn keeps_addresses_and_small_numbers_only() {
        let maps = [
            (0x5555_0000_0000, 0x5555_0001_0000, false),
            (0x5555_0001_0000, 0x5555_0002_0000, true),
            (0x7f00_0000_0000, 0x7f00_0010_0000, true),
            (0x7f00_2000_0000, 0x7f00_2000_1000, false),
            (0x7ffc_0000_0000, 0x7ffc_0002_0000, true),
            (0x7ffc_1000_0000, 0x7ffc_1000_1000, false),
        ];
        let f = Filter::new(&maps);
        // Writable: 0x10000 + 0x100000 + 0x20000 bytes.
        let small: u64 = 0x13_0000 + 1;
        for v in [0, 1, small - 1, (small - 1).wrapping_neg(), u64::MAX, 0x5555_0000_0000, 0x5555_0001_fff8] {
            assert!(f.keep(v), "{v:#x}");
        }
        for v in [0x7f00_0000_0000, 0x7f00_2000_0fff, 0x7ffc_0001_0000, 0x7ffc_1000_0000] {
            assert!(f.keep(v), "{v:#x}");
        }
        for v in [small, (small + 1).wrapping_neg(), 0x5555_0002_0000, 0x4000_0000_0000, 0x3ff0_0000_0000_0000, 1 << 63]
        {
            assert!(!f.keep(v), "{v:#x}");
        }
        // Five spans (the first two touch), four ranges: the smallest gap,
        // between the last two, was closed.
        assert!(f.keep(0x7ffc_0800_0000));
        assert!(!f.keep(0x7f00_1000_0000) && !f.keep(0x7e00_0000_0000));

        let mut words = vec![7, 1 << 63, 0x5555_0000_1000, 1 << 62, 0];
        words.extend((0..70).map(|i| if i % 3 == 0 { u64::MAX } else { 1 << 60 }));
        let mut bits = [0u8; 16];
        let mut out = [0u8; 75 * 10 + 8];
        let (kept, any) = f.mask(&words, &mut bits);
        assert!(any);
        let n = super::encode(&words, &bits, &mut out);
        assert_eq!(&bits[..2], &[0b0011_0101, 0b0100_1001]);
        assert_eq!(bits[9], 1 << 2); // word 74, the last
                                     // Through the format's parser: the kept words, in order.
        let mut p = Vec::new();
        mtrace_format::sparse::put_len(&mut p, 75 * 8);
        p.extend(&bits[..mtrace_format::sparse::bitmap_len(75 * 8, 8)]);
        p.extend(&out[..n]);
        let s = mtrace_format::sparse::parse(&p, 8).unwrap();
        let want: Vec<u64> = words.iter().copied().filter(|&v| f.keep(v)).collect();
        assert_eq!(want[..4], [7, 0x5555_0000_1000, 0, u64::MAX]);
        assert_eq!(s.values().collect::<Vec<_>>(), want);
        assert_eq!(kept, want.len());
        let zeros = [0u64; 3];
        assert_eq!(f.mask(&zeros, &mut bits), (3, false));
    }
}
