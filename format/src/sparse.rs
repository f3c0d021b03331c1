//! The payload of a sparse ScanRegion ([`region_kind::SPARSE`], version 8
//! on): the region's length, a bitmap of the words the snapshot holds, and
//! those words' values. The snapshot leaves out words that are neither an
//! address inside one of the process's readable mappings nor a number as
//! small (in magnitude) as the writable mappings' total size: no such word
//! points to a heap block or a vtable, and none equals a block's size or
//! count, which is all the leak scan reads (docs/SCAN.md). Most non-pointer
//! data (text, floating point, hashes) goes, and neither the producer's
//! compression nor the analyzer's marking spends time on it.
//!
//! Bytes: `len` varint (bytes of the region, a multiple of the word size,
//! at most [`MAX_LEN`]), then `ceil(len / word / 8)` bytes of bitmap (bit
//! `i % 8` of byte `i / 8` set: word `i` is held), then each held word in
//! order as a zigzag varint of the word read as a signed number (so small
//! numbers of either sign and 47-bit addresses take at most 7 bytes).
//!
//! [`region_kind::SPARSE`]: crate::region_kind::SPARSE

use crate::varint::{put_varint, unzigzag, varint_from, zigzag};

/// The most bytes a sparse region may stand for (1 MiB, as a plain one).
pub const MAX_LEN: u64 = 1 << 20;

/// A sparse payload's parts.
#[derive(Debug, PartialEq, Eq)]
pub struct Sparse<'a> {
    /// Bytes of the region.
    pub len: u64,
    /// Bit `i` (LSB first in each byte): word `i` is held.
    pub bits: &'a [u8],
    /// The held words' varints.
    pub words: &'a [u8],
    /// The word size, bytes (4 or 8).
    pub word: usize,
}

/// Bytes of bitmap for a region of `len` bytes of `word`-byte words.
pub fn bitmap_len(len: u64, word: usize) -> usize {
    (len as usize / word).div_ceil(8)
}

/// The varint of a held word `v` (`word` bytes, as the target reads it).
#[inline]
pub fn encode_word(v: u64, word: usize) -> u64 {
    if word == 4 {
        zigzag(i64::from(v as u32 as i32))
    } else {
        zigzag(v as i64)
    }
}

/// Appends the start of a sparse payload (its length); the caller appends
/// the bitmap and the held words' varints ([`encode_word`]).
pub fn put_len(out: &mut Vec<u8>, len: u64) {
    put_varint(out, len);
}

/// Bytes of a sparse payload: `len` bytes of region of `word`-byte words,
/// `varints` bytes of held words.
pub fn payload_len(len: u64, word: usize, varints: usize) -> usize {
    let mut v = Vec::with_capacity(10);
    put_varint(&mut v, len);
    v.len() + bitmap_len(len, word) + varints
}

/// Splits a sparse payload of `word`-byte words (4 or 8); an error says
/// what does not fit (a length past [`MAX_LEN`] or not a whole number of
/// words, a bitmap cut short, bits set past the region's end, varints
/// that are not one per held word).
pub fn parse(payload: &[u8], word: usize) -> Result<Sparse<'_>, String> {
    let (len, at) = varint_from(payload).ok_or("sparse region cut short in its length")?;
    if at > 4 {
        return Err("sparse region length too long".into());
    }
    if len > MAX_LEN || !len.is_multiple_of(word as u64) {
        return Err(format!("sparse region of {len} bytes ({word}-byte words, at most {MAX_LEN})"));
    }
    let nbits = bitmap_len(len, word);
    let bits = payload.get(at..at + nbits).ok_or("sparse region bitmap cut short")?;
    let count = len as usize / word;
    if !count.is_multiple_of(8) && bits.last().is_some_and(|&b| b >> (count % 8) != 0) {
        return Err("sparse region bitmap marks words past its end".into());
    }
    let held: usize = bits.iter().map(|b| b.count_ones() as usize).sum();
    let words = &payload[at + nbits..];
    // A varint ends at each byte with its top bit clear.
    let ends = words.iter().filter(|&&b| b & 0x80 == 0).count();
    if ends != held || words.last().is_some_and(|&b| b & 0x80 != 0) {
        return Err(format!("sparse region has {ends} varints for the {held} words its bitmap marks"));
    }
    Ok(Sparse { len, bits, words, word })
}

impl Sparse<'_> {
    /// The held words, in order (as the target reads them: a 4-byte word
    /// in the low 32 bits). A varint longer than 10 bytes reads as garbage
    /// (a corrupt payload does not panic).
    pub fn values(&self) -> impl Iterator<Item = u64> + '_ {
        let mut rest = self.words;
        std::iter::from_fn(move || {
            let (v, n) = varint_from(rest)?;
            rest = &rest[n..];
            let s = unzigzag(v);
            Some(if self.word == 4 { u64::from(s as u32) } else { s as u64 })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        // 10 words, words 1 and 9 held: 7 and an address.
        let mut p = Vec::new();
        put_len(&mut p, 80);
        p.extend([0b10, 0b10]);
        put_varint(&mut p, encode_word(7, 8));
        put_varint(&mut p, encode_word(0x7fff_1234_5678, 8));
        assert_eq!(payload_len(80, 8, 1 + 7), p.len());
        let s = parse(&p, 8).unwrap();
        assert_eq!((s.len, s.bits), (80, &[0b10u8, 0b10][..]));
        assert_eq!(s.values().collect::<Vec<_>>(), [7, 0x7fff_1234_5678]);
        assert!(parse(&p[..p.len() - 1], 8).unwrap_err().contains("1 varints for the 2 words"));
        let mut past = p.clone();
        past[2] = 0b110; // word 10 of 10
        assert!(parse(&past, 8).unwrap_err().contains("past its end"));
        assert!(parse(&[0x81], 8).unwrap_err().contains("cut short"));
        assert!(parse(&[12], 8).unwrap_err().contains("12 bytes"));
    }

    #[test]
    fn negative_and_32_bit_words() {
        for (v, word) in [(u64::MAX, 8), (1u64 << 63, 8), (0xffff_fff0, 4), (0x7fff_ffff, 4)] {
            let mut p = Vec::new();
            put_len(&mut p, word as u64);
            p.push(1);
            put_varint(&mut p, encode_word(v, word));
            assert_eq!(parse(&p, word).unwrap().values().collect::<Vec<_>>(), [v], "{v:#x}");
        }
        // -1 takes one byte.
        assert_eq!(encode_word(u64::MAX, 8), 1);
    }
}
