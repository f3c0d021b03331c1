//! Sampled recording (`--sample-rate`, `MTRACE_SAMPLE_RATE`): the rule the
//! producers sample by and the weight readers give each sampled block,
//! defined once.
//!
//! The rule is tcmalloc's and Go's runtime's: each thread counts the bytes
//! it allocates down to its next sample point, drawn from an exponential
//! distribution with mean `rate` bytes; the allocation that reaches the
//! point is recorded and a new point is drawn. Because the distribution is
//! memoryless, an allocation of `size` bytes is recorded with probability
//! `1 − e^(−size/rate)`, whatever came before it on the thread. We add one
//! rule: an allocation of at least `rate` bytes is always recorded (and
//! leaves the count alone), so the large blocks a leak hunt cares about
//! most are exact.

/// The probability that an allocation of `size` bytes is recorded under
/// sampling with mean `rate` bytes (see the module's rule): 1 for `rate`
/// 0 (every allocation) and for `size ≥ rate`, else `1 − e^(−size/rate)`.
pub fn probability(size: u64, rate: u64) -> f64 {
    if rate == 0 || size >= rate {
        1.0
    } else {
        // exp_m1 keeps the precision for small sizes (1 byte at 2 MiB).
        -(-(size.max(1) as f64) / rate as f64).exp_m1()
    }
}

/// How many allocations one recorded allocation of `size` bytes stands
/// for: the inverse of its [`probability`], so that a sum of weights (of
/// blocks, or of bytes times weights) is an unbiased estimate of the true
/// count (or bytes). This is Go's `scaleHeapSample` (runtime/pprof,
/// protomem.go) and tcmalloc's sampled-allocation weight,
/// `size / (1 − e^(−size/rate))` bytes per sample, with the exception that
/// blocks of at least `rate` bytes weigh 1 (they are always recorded).
pub fn weight(size: u64, rate: u64) -> f64 {
    1.0 / probability(size, rate)
}

/// Whether an allocation of `size` bytes is recorded under sampling with
/// mean `rate` > 0 bytes, by the module's rule, for a thread whose bytes
/// to its next sample point are `left` (0: none drawn yet) and whose
/// random state is `rng`; `seed` seeds `rng` at the thread's first draw.
/// Both producers decide by it: the preload with the state in its hooks'
/// thread-local, the ptrace tracer in its thread table.
#[inline(always)]
pub fn pick(left: &mut u64, rng: &mut u64, size: u64, rate: u64, seed: impl FnOnce() -> u64) -> bool {
    // The count-down is the common case: the rest is marked cold, so that
    // a hook's instructions for it lie together.
    if size >= rate {
        std::hint::cold_path();
        return true;
    }
    if *left == 0 {
        std::hint::cold_path();
        *rng = seed();
        *left = next_point(splitmix(rng), rate);
    }
    if size < *left {
        *left -= size;
        return false;
    }
    std::hint::cold_path();
    *left = next_point(splitmix(rng), rate);
    true
}

/// What one recorded allocation of `size` bytes stands for, sampled at
/// `rate` (0: not sampled): (bytes, allocations), the bytes `size ·`
/// [`weight`] rounded, the allocations the weight rounded up or down by
/// `key` (any number that identifies the allocation, hashed here), in
/// proportion to the fraction: a sum over many allocations stays
/// unbiased, and the same allocation always counts the same (its
/// allocation and its free cancel).
///
/// Inlined where it is called (another crate's, the analyzer's books, for
/// every block of an unsampled trace too): apart, the call was 2% of the
/// samples of the books' thread reporting 20 M live blocks.
#[inline]
pub fn estimate(size: u64, rate: u64, key: u64) -> (u64, u64) {
    if rate == 0 {
        return (size, 1);
    }
    estimate_sampled(size, rate, key)
}

/// [`estimate`] at a rate that is not 0.
fn estimate_sampled(size: u64, rate: u64, key: u64) -> (u64, u64) {
    let w = weight(size, rate);
    let whole = w.floor();
    // A uniform number in [0, 1) from the key.
    let h = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let u = (h >> 11) as f64 / (1u64 << 53) as f64;
    let blocks = whole as u64 + u64::from(u < w - whole);
    ((size as f64 * w).round() as u64, blocks)
}

/// The variance one recorded allocation of `size` bytes adds to the
/// estimates [`estimate`] sums, sampled at `rate` (0: not sampled, 0):
/// (bytes², blocks²). With `p` its [`probability`] and `w = 1/p`, these
/// are `(size·w)²·(1 − p)` and `w²·(1 − p)`: Horvitz–Thompson's unbiased
/// estimate of the variance of a sum under independent (Poisson)
/// sampling, which a sum's terms add to; the square root of the sum is
/// the estimate's standard error. An allocation of at least `rate` bytes
/// (always recorded) adds 0.
pub fn variance(size: u64, rate: u64) -> (f64, f64) {
    let p = probability(size, rate);
    let w = 1.0 / p;
    let bytes = size as f64 * w;
    (bytes * bytes * (1.0 - p), w * w * (1.0 - p))
}

/// A byte count with an optional unit: `4096`, `512K`, `2M`, `1G` (also
/// `KiB`, `MiB`, `GiB`, any case; powers of 1024). `None` for anything
/// else or a value beyond 2^62 bytes.
pub fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (digits, unit) = v.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return None,
    };
    n.checked_shl(shift).filter(|&b| b >> shift == n && b <= 1 << 62)
}

/// The next sample point, bytes: an exponential variate with mean `rate`
/// made from `u`, 64 random bits (inverse transform: −ln(U)·rate, with U
/// in (0, 1]). At least 1.
pub fn next_point(u: u64, rate: u64) -> u64 {
    // 53 bits of U, never 0: ln stays finite.
    let unit = ((u >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let x = -libm::log(unit) * rate as f64;
    (x as u64).max(1)
}

/// One step of SplitMix64 (Steele, Lea and Flood, 2014): the next state and
/// its 64 random bits. Small, no tables, good enough to draw sample points.
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_units() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("512K"), Some(512 << 10));
        assert_eq!(parse_bytes("2M"), Some(2 << 20));
        assert_eq!(parse_bytes("1gib"), Some(1 << 30));
        assert_eq!(parse_bytes(" 64 KiB "), Some(64 << 10));
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("2T"), None);
        assert_eq!(parse_bytes("-1"), None);
        assert_eq!(parse_bytes("K"), None);
        assert_eq!(parse_bytes("99999999999G"), None);
    }

    #[test]
    fn weights() {
        assert_eq!(weight(100, 0), 1.0);
        assert_eq!(weight(1 << 20, 512 << 10), 1.0);
        assert_eq!(weight(512 << 10, 512 << 10), 1.0);
        // 1 − e^(−1/2) = 0.3935: a 256 KiB block at 512K stands for 2.54.
        assert!((weight(256 << 10, 512 << 10) - 2.5415).abs() < 1e-3);
        // Small blocks: about rate/size.
        assert!((weight(16, 512 << 10) - 32768.5).abs() < 1.0);
    }

    #[test]
    fn variances() {
        // Recorded always: exact.
        assert_eq!(variance(1 << 20, 512 << 10), (0.0, 0.0));
        assert_eq!(variance(100, 0), (0.0, 0.0));
        // 1 KiB at 64K: p = 1 − e^(−1/64), w = 64.5; a site of n such
        // samples has a relative standard error of about sqrt(1/n).
        let (b, n) = variance(1024, 65536);
        let p = probability(1024, 65536);
        assert!((n - (1.0 - p) / (p * p)).abs() < 1e-6);
        assert!((b - n * 1024.0 * 1024.0).abs() < 1e-3);
        let samples = 192.0;
        let rel = (samples * b).sqrt() / (samples * 1024.0 * weight(1024, 65536));
        assert!((rel - (1.0f64 / samples).sqrt()).abs() < 0.001, "{rel}");
    }

    #[test]
    fn picks_follow_the_probability() {
        // 4 KiB allocations at a 64 KiB mean: each is picked with
        // probability 1 − e^(−1/16) = 6.06%.
        let (mut left, mut rng) = (0, 0);
        let n = 100_000;
        let picked = (0..n).filter(|_| pick(&mut left, &mut rng, 4096, 65536, || 7)).count();
        let expect = probability(4096, 65536) * n as f64;
        assert!((picked as f64 / expect - 1.0).abs() < 0.03, "{picked} of {n}, expected {expect}");
        // At least the rate: always, and the count-down is left alone.
        let before = left;
        assert!(pick(&mut left, &mut rng, 65536, 65536, || 7));
        assert_eq!(left, before);
    }

    #[test]
    fn points_have_the_mean() {
        let mut s = 42;
        let n = 200_000;
        let sum: f64 = (0..n).map(|_| next_point(splitmix(&mut s), 1 << 20) as f64).sum();
        let mean = sum / n as f64;
        assert!((mean / (1 << 20) as f64 - 1.0).abs() < 0.01, "mean {mean}");
    }
}
