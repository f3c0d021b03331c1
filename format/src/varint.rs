//! LEB128 varints and zigzag mapping, the only integer encoding of the stream.

/// Appends `v` as an unsigned LEB128 varint (1–10 bytes) to `out`.
#[inline]
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Decodes a varint of at most 8 bytes from the 8 bytes `w` (little endian,
/// the varint first): `Some((value, length in bytes))`, or `None` when no
/// byte of `w` ends it (9- or 10-byte varints: the caller reads those byte
/// by byte). Branch-free: the records mix 1-byte times with 7-byte
/// addresses, so a byte loop's exit is mispredicted on most varints.
#[inline]
pub fn varint_in_word(w: u64) -> Option<(u64, usize)> {
    let stops = !w & 0x8080_8080_8080_8080;
    if stops == 0 {
        return None;
    }
    // The last byte of the varint is the first with its top bit clear;
    // keep the bytes up to it (a mask of ones through that top bit).
    let w = w & (stops ^ (stops - 1));
    let len = (stops.trailing_zeros() / 8 + 1) as usize;
    // Gather the 7-bit groups.
    let v = (w & 0x7f)
        | ((w >> 1) & (0x7f << 7))
        | ((w >> 2) & (0x7f << 14))
        | ((w >> 3) & (0x7f << 21))
        | ((w >> 4) & (0x7f << 28))
        | ((w >> 5) & (0x7f << 35))
        | ((w >> 6) & (0x7f << 42))
        | ((w >> 7) & (0x7f << 49));
    Some((v, len))
}

/// Writes `v` as a varint at `out[at..]` and returns its length (1–10
/// bytes); `out` must have 10 bytes from `at` (8 of them may be written
/// past the varint's end). Branch-free for values below 2^56 (1–8 bytes):
/// the snapshot writes millions of them, of unpredictable lengths.
#[inline(always)]
pub fn put_varint_at(out: &mut [u8], at: usize, v: u64) -> usize {
    if v >= 1 << 56 {
        return put_long_varint_at(out, at, v);
    }
    // 7 bits a byte; 0 takes one byte.
    let len = ((64 - (v | 1).leading_zeros()) as usize).div_ceil(7);
    let spread = (v & 0x7f)
        | ((v << 1) & (0x7f << 8))
        | ((v << 2) & (0x7f << 16))
        | ((v << 3) & (0x7f << 24))
        | ((v << 4) & (0x7f << 32))
        | ((v << 5) & (0x7f << 40))
        | ((v << 6) & (0x7f << 48))
        | ((v << 7) & (0x7f << 56));
    // A continuation bit on every byte but the last.
    let more = 0x8080_8080_8080_8080u64 & ((1u64 << (8 * (len - 1))) - 1);
    out[at..at + 8].copy_from_slice(&(spread | more).to_le_bytes());
    len
}

/// `put_varint_at` of 9 or 10 bytes: out of the way of the common case.
#[cold]
#[inline(never)]
fn put_long_varint_at(out: &mut [u8], at: usize, mut v: u64) -> usize {
    let mut n = 0;
    while v >= 0x80 {
        out[at + n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    out[at + n] = v as u8;
    n + 1
}

/// The varint at the start of `b` and its length in bytes, or `None` when
/// `b` ends before it does. Groups past the 64th bit are ignored (a
/// damaged varint longer than 10 bytes reads as garbage, never panics).
pub fn varint_from(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate() {
        if i < 10 {
            v |= u64::from(byte & 0x7f) << (7 * i);
        }
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// Maps a signed delta to an unsigned one so that small magnitudes of either
/// sign encode in few bytes (0→0, -1→1, 1→2, …).
#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Inverse of [`zigzag`].
#[inline]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_round_trips_extremes() {
        for v in [0i64, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
    }

    #[test]
    fn put_varint_at_equals_put_varint() {
        let mut values = vec![0u64, 1, 127, 128, (1 << 56) - 1, 1 << 56, u64::MAX];
        values.extend((0..64).map(|b| 1u64 << b));
        values.extend((0..64).map(|b| (1u64 << b) - 1));
        for v in values {
            let mut want = Vec::new();
            put_varint(&mut want, v);
            let mut out = [0xaau8; 13];
            let n = put_varint_at(&mut out, 3, v);
            assert_eq!(&out[3..3 + n], &want[..], "{v:#x}");
            assert_eq!(varint_from(&want), Some((v, n)), "{v:#x}");
            assert_eq!(varint_from(&want[..n - 1]), None, "{v:#x}");
        }
    }

    #[test]
    fn word_decoding_matches_the_encoding() {
        let mut values = vec![0u64, 1, 127, 128, 300, 16_383, 16_384, (1 << 56) - 1, 1 << 56, u64::MAX];
        values.extend((0..64).map(|b| 1u64 << b));
        values.extend((0..64).map(|b| (1u64 << b) - 1));
        for v in values {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let len = out.len();
            // Whatever follows the varint must not matter.
            out.resize(len.max(8), 0xff);
            let w = u64::from_le_bytes(out[..8].try_into().unwrap());
            if len <= 8 {
                assert_eq!(varint_in_word(w), Some((v, len)), "{v:#x}");
            } else {
                assert_eq!(varint_in_word(w), None, "{v:#x}");
            }
        }
    }

    #[test]
    fn varint_lengths() {
        let mut out = Vec::new();
        put_varint(&mut out, 127);
        assert_eq!(out, [127]);
        out.clear();
        put_varint(&mut out, 128);
        assert_eq!(out, [0x80, 1]);
        out.clear();
        put_varint(&mut out, u64::MAX);
        assert_eq!(out.len(), 10);
    }
}
