//! The snapshot's memory as the producers wrote it: regions of bytes as
//! they were, or sparse regions holding only the words that can matter to
//! the scan (the format's `sparse` module). A word a sparse region left out
//! reads as not held, as an unreadable page does: it could neither point to
//! a block nor satisfy a heuristic.

use mtrace_format::{region_kind, sparse};

use super::values::Values;

/// One region of the snapshot.
pub struct Region {
    /// One of [`region_kind`]'s kinds (without the flags).
    pub kind: u8,
    /// The next piece of the same mapping as the region before it.
    pub continues: bool,
    /// Start address in the target.
    pub addr: u64,
    /// Bytes of memory the region stands for.
    pub len: u64,
    /// The bytes as they were (empty for a sparse region).
    bytes: Vec<u8>,
    held: Option<Held>,
}

/// The words a sparse region holds. A held 0 keeps no value: most words
/// a heap's snapshot holds are zeros (memory handed out and not written
/// yet, padding), and a value each made the snapshot of 20 M small blocks
/// as large as the heap itself in the report's memory.
struct Held {
    /// Bit `i % 64` of `bits[i / 64]`: word `i` is held.
    bits: Vec<u64>,
    /// Likewise: word `i` is held and not 0.
    nonzero: Vec<u64>,
    /// `rank[g]`: words held and not 0 before word `64 * g`.
    rank: Vec<u32>,
    /// The values of the words held and not 0, in order (about 4 bytes
    /// each: values.rs).
    values: Values,
}

impl Held {
    /// Word `i`, if held.
    fn value(&self, i: usize) -> Option<u64> {
        let (g, bit) = (i / 64, 1u64 << (i % 64));
        if self.bits.get(g)? & bit == 0 {
            return None;
        }
        if self.nonzero[g] & bit == 0 {
            return Some(0);
        }
        Some(self.values.get(self.index(i)))
    }

    /// Every word of `bytes` (a plain region's, whole words) held, those
    /// not 0 with their values; `None` when the bytes as they are take less
    /// (4-byte words fewer than a quarter of which are 0) or are not whole
    /// words.
    fn of_plain(bytes: &[u8], word: Word) -> Option<Held> {
        if bytes.is_empty() || !bytes.len().is_multiple_of(word.size) {
            return None;
        }
        let n = bytes.len() / word.size;
        // Held values take about 4 bytes and a few bits (values.rs): fewer
        // than 8-byte words as they are, whatever the share of zeros; not
        // fewer than 4-byte words unless a quarter are 0.
        if word.size != 8 {
            let zeros = bytes.chunks_exact(word.size).filter(|w| w.iter().all(|&b| b == 0)).count();
            if zeros * 4 < n {
                return None;
            }
        }
        let groups = n.div_ceil(64);
        let mut bits = vec![!0u64; groups];
        if !n.is_multiple_of(64) {
            bits[groups - 1] = (1u64 << (n % 64)) - 1;
        }
        let (mut nonzero, mut rank) = (vec![0u64; groups], Vec::with_capacity(groups));
        let mut count = 0u32;
        for (g, chunk) in bytes.chunks(64 * word.size).enumerate() {
            rank.push(count);
            for (i, w) in chunk.chunks_exact(word.size).enumerate() {
                if word.read(w) != 0 {
                    nonzero[g] |= 1 << i;
                    count += 1;
                }
            }
        }
        let values = Values::new(|| bytes.chunks_exact(word.size).map(|w| word.read(w)).filter(|&v| v != 0));
        Some(Held { bits, nonzero, rank, values })
    }

    /// How many words before word `i` are held and not 0: where its value
    /// is in `values` when it is.
    fn index(&self, i: usize) -> usize {
        self.rank[i / 64] as usize + (self.nonzero[i / 64] & ((1u64 << (i % 64)) - 1)).count_ones() as usize
    }
}

impl Region {
    /// A region of `bytes` as they were at `addr`.
    pub fn dense(kind: u8, continues: bool, addr: u64, bytes: Vec<u8>) -> Region {
        Region { kind, continues, addr, len: bytes.len() as u64, bytes, held: None }
    }

    /// The region of a ScanRegion record (`kind` with its flags) of a
    /// target with pointers as `word` says; an error for a sparse payload
    /// that does not parse (the reader has already checked it). A plain
    /// region (but the registers) of 8-byte words, or of 4-byte words a
    /// quarter or more of which are 0, is kept as a sparse one holding
    /// every word ([`Held`]): the producer writes memory that is mostly
    /// kept words plain (zeros are kept: docs/SCAN.md), a heap of small
    /// blocks not written yet is mostly zeros, and a held value takes
    /// about half a word (values.rs): the array of 20 M pointers
    /// scripts/bench_scale.c keeps took 152 MiB as it was, 82 held.
    pub fn of_record(kind: u8, addr: u64, bytes: Vec<u8>, word: Word) -> Result<Region, String> {
        let continues = kind & region_kind::SAME_MAPPING != 0;
        let plain = kind & !(region_kind::SAME_MAPPING | region_kind::SPARSE);
        if kind & region_kind::SPARSE == 0 {
            // Held words are counted from the region's start: only a
            // region starting on a word (as mappings and stacks do).
            if plain != region_kind::REGISTERS && addr.is_multiple_of(word.size as u64) {
                if let Some(held) = Held::of_plain(&bytes, word) {
                    let len = bytes.len() as u64;
                    return Ok(Region { kind: plain, continues, addr, len, bytes: Vec::new(), held: Some(held) });
                }
            }
            return Ok(Region::dense(plain, continues, addr, bytes));
        }
        let word = word.size;
        let s = sparse::parse(&bytes, word)?;
        let groups = s.bits.len().div_ceil(8);
        let (mut bits, mut nonzero, mut rank) =
            (Vec::with_capacity(groups), Vec::with_capacity(groups), Vec::with_capacity(groups));
        let mut held = s.values();
        let mut count = 0u32;
        for chunk in s.bits.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            let b = u64::from_le_bytes(w);
            rank.push(count);
            // The held words of this group, in order: those not 0 kept.
            let (mut left, mut nz) = (b, 0u64);
            while left != 0 {
                let bit = left & left.wrapping_neg();
                left &= left - 1;
                // The parse checked one value per held word.
                let v = held.next().unwrap_or(0);
                if v != 0 {
                    nz |= bit;
                    count += 1;
                }
            }
            bits.push(b);
            nonzero.push(nz);
        }
        Ok(Region {
            kind: plain,
            continues,
            addr,
            len: s.len,
            bytes: Vec::new(),
            held: Some(Held { bits, nonzero, rank, values: Values::new(|| s.values().filter(|&v| v != 0)) }),
        })
    }

    /// The address after the region.
    pub fn end(&self) -> u64 {
        self.addr + self.len
    }

    /// The bytes as they were (a dense region's), for the registers.
    pub fn dense_bytes(&self) -> Option<&[u8]> {
        self.held.is_none().then_some(&self.bytes[..])
    }

    /// The word at offset `o`, if the region holds it: `word.size` bytes,
    /// or 8 with `eight` (two held words of a 4-byte target).
    pub(crate) fn word_at(&self, o: u64, word: Word, eight: bool) -> Option<u64> {
        let n = if eight { 8 } else { word.size };
        if o.checked_add(n as u64)? > self.len {
            return None;
        }
        let o = o as usize;
        let Some(h) = &self.held else {
            let b = self.bytes.get(o..o + n)?;
            return Some(if eight { word.read8(b) } else { word.read(b) });
        };
        if !o.is_multiple_of(word.size) {
            return None;
        }
        let i = o / word.size;
        let v = h.value(i)?;
        if n == word.size {
            return Some(v);
        }
        // Two 4-byte words, both held.
        let w = h.value(i + 1)?;
        Some(if word.big { v << 32 | w } else { w << 32 | v })
    }

    /// Calls `f` with each aligned, held word in `[lo, hi)` (absolute
    /// addresses), in order; in a sparse region, each but those that are 0
    /// (no pointer is).
    pub(crate) fn each_word(&self, lo: u64, hi: u64, word: Word, mut f: impl FnMut(u64)) {
        let size = word.size as u64;
        let from = lo.max(self.addr).next_multiple_of(size);
        let to = hi.min(self.end());
        if from + size > to {
            return;
        }
        let Some(h) = &self.held else {
            let mut a = from;
            while a + size <= to {
                let o = (a - self.addr) as usize;
                f(word.read(&self.bytes[o..o + word.size]));
                a += size;
            }
            return;
        };
        // Sparse regions start word-aligned: word indexes from `from`.
        let (first, last) = (((from - self.addr) / size) as usize, ((to - self.addr) / size) as usize);
        for g in first / 64..last.div_ceil(64) {
            let mut b = h.nonzero[g];
            if g == first / 64 {
                b &= !0u64 << (first % 64);
            }
            if g == last / 64 {
                b &= (1u64 << (last % 64)) - 1;
            }
            let mut at = h.index(first.max(g * 64));
            while b != 0 {
                f(h.values.get(at));
                at += 1;
                b &= b - 1;
            }
        }
    }
}

/// A pointer as the target stores it: its size (bytes) and byte order,
/// from the stream's header (a 32-bit big-endian target's words are 4
/// bytes, most significant first).
#[derive(Clone, Copy)]
pub struct Word {
    /// Bytes.
    pub size: usize,
    /// Most significant byte first.
    pub big: bool,
}

impl Word {
    /// The words of the target `h` describes.
    pub fn of(h: &mtrace_format::Header) -> Word {
        Word { size: h.word_size(), big: h.big_endian }
    }

    /// The pointer in `b` (exactly `size` bytes).
    #[inline]
    pub fn read(self, b: &[u8]) -> u64 {
        if self.size == 8 {
            // Without a copy of a length only known at run time (a call to
            // memmove for each word).
            return self.read8(b);
        }
        let mut w = [0u8; 8];
        if self.big {
            w[8 - self.size..].copy_from_slice(b);
            u64::from_be_bytes(w)
        } else {
            w[..self.size].copy_from_slice(b);
            u64::from_le_bytes(w)
        }
    }

    /// The 8-byte number in `b` (exactly 8 bytes), in the target's order.
    #[inline]
    pub fn read8(self, b: &[u8]) -> u64 {
        let w: [u8; 8] = b.try_into().unwrap_or_default();
        if self.big {
            u64::from_be_bytes(w)
        } else {
            u64::from_le_bytes(w)
        }
    }
}
