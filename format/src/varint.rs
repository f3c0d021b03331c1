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
