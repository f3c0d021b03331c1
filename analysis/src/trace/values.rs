//! The values of a sparse region's words that are not 0 (`region.rs`),
//! in about four bytes each rather than eight: a word's low half as it is,
//! its high half as the number of that half among the few distinct ones the
//! region holds (pointers into the heap, the libraries and the stacks share
//! a handful; small numbers have 0), in as few bits as that takes.
//!
//! Why: the snapshot of 20 M small blocks holds 40 M such words (each
//! block's chunk header and the program's array of pointers to them), 320
//! MiB at eight bytes, alive beside the books and the marking's tables at
//! the report's peak (issue 43: the report within the program's own peak
//! RSS).

use rustc_hash::FxHashMap as HashMap;

/// Held values, numbered from 0 in the order given.
pub(super) struct Values {
    /// The low 32 bits of each.
    lo: Vec<u32>,
    /// The distinct high halves, by number; empty when there are too many
    /// for a number to be shorter than the half itself: `packed` then holds
    /// the halves.
    highs: Vec<u32>,
    /// Bits per value in `packed`: 0 (one high half for all), 1, 2, 4, 8
    /// or 32 (a divisor of 64: no value straddles two words).
    width: u32,
    /// Value `j`'s number (or high half) in bits `width * j ..` of the
    /// array, least significant first.
    packed: Vec<u64>,
}

/// More distinct high halves than this in one region: they are kept as
/// they are (32 bits a value, as many bytes as the words themselves).
/// Such a region holds data more than pointers, whose high halves change
/// from word to word: numbering them cost `mtrace report` of a python3
/// run (its interpreter's data) 10% of its time with 65,536 allowed.
const MAX_HIGHS: usize = 256;

impl Values {
    /// The values `each()` gives, in their order. `each` is called twice
    /// (the high halves first, then the values): no copy of them all is
    /// made.
    pub fn new<I: Iterator<Item = u64>>(each: impl Fn() -> I) -> Values {
        let mut highs = Vec::new();
        let mut number: HashMap<u32, u32> = HashMap::default();
        let mut count = 0usize;
        // Neighbouring words mostly share their high half: the map is asked
        // only when it changes.
        // (`for_each`: a `for` loop's `next` through a filter of a
        // region's words was 6% of reporting a snapshot of 20 M blocks.)
        let mut last = None;
        each().for_each(|x| {
            count += 1;
            let h = (x >> 32) as u32;
            if last != Some(h) && highs.len() <= MAX_HIGHS {
                number.entry(h).or_insert_with(|| {
                    highs.push(h);
                    highs.len() as u32 - 1
                });
                last = Some(h);
            }
        });
        let width = if highs.len() > MAX_HIGHS {
            highs.clear();
            number.clear();
            32
        } else {
            match usize::BITS - highs.len().saturating_sub(1).leading_zeros() {
                0 => 0,
                bits => bits.next_power_of_two(),
            }
        };
        let mut lo = Vec::with_capacity(count);
        let mut packed = vec![0u64; (count * width as usize).div_ceil(64)];
        let mut last: Option<(u32, u32)> = None;
        each().enumerate().for_each(|(j, x)| {
            lo.push(x as u32);
            if width == 0 {
                return;
            }
            let h = (x >> 32) as u32;
            let n = match last {
                _ if width == 32 => h,
                Some((lh, ln)) if lh == h => ln,
                _ => number.get(&h).copied().unwrap_or(0),
            };
            last = Some((h, n));
            let bit = j * width as usize;
            packed[bit / 64] |= u64::from(n) << (bit % 64);
        });
        Values { lo, highs, width, packed }
    }

    /// Value `j` (below the number of values given).
    #[inline]
    pub fn get(&self, j: usize) -> u64 {
        let high = if self.width == 0 {
            self.highs.first().copied().unwrap_or(0)
        } else {
            let bit = j * self.width as usize;
            let n = (self.packed[bit / 64] >> (bit % 64)) as u32 & (u32::MAX >> (32 - self.width));
            if self.highs.is_empty() {
                n
            } else {
                self.highs[n as usize]
            }
        };
        u64::from(high) << 32 | u64::from(self.lo[j])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(v: &[u64]) -> Values {
        let vals = Values::new(|| v.iter().copied());
        assert_eq!((0..v.len()).map(|j| vals.get(j)).collect::<Vec<_>>(), v);
        vals
    }

    #[test]
    fn values_come_back_as_given_in_as_few_bits_as_their_high_halves_need() {
        // One high half: no bits.
        assert_eq!(round_trip(&[0x21, 0x31, 0x41]).width, 0);
        assert_eq!(round_trip(&[0x5555_0000_1000, 0x5555_0000_2000]).width, 0);
        assert_eq!(round_trip(&[]).width, 0);
        // Two: a bit each; three: two bits; small numbers, heap and stack.
        assert_eq!(round_trip(&[0x21, 0x5555_0000_1000, 0x31, 0x5555_dead_beef]).width, 1);
        assert_eq!(round_trip(&[0x21, 0x5555_0000_1000, 0x7ffc_1234_5678, u64::MAX]).width, 2);
        // 256 distinct high halves: a byte each.
        let many: Vec<u64> = (0..256u64).map(|i| i << 32 | i).collect();
        assert_eq!(round_trip(&many).width, 8);
        // More: the halves themselves.
        let most: Vec<u64> = (0..300u64).map(|i| (i * 7) << 32 | 7).collect();
        let vals = round_trip(&most);
        assert_eq!((vals.width, vals.highs.len()), (32, 0));
    }
}
