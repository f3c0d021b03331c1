//! libgcc's DWARF unwinder through `backtrace::trace_unsynchronized`: no
//! global lock, no allocation, but it parses the CFI again on every call.

/// Writes up to `depth` return addresses into `out`; returns how many.
#[inline(never)]
pub fn capture(out: &mut [u64], depth: usize) -> usize {
    let mut raw = [0u64; crate::platform::config::MAX_DEPTH + 16];
    let mut n = 0;
    // SAFETY: trace_unsynchronized is unsafe only because it must not run
    // concurrently with itself on platforms whose unwinder is not
    // thread-safe; libgcc's is.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            raw[n] = frame.ip() as u64;
            n += 1;
            n < raw.len()
        });
    }
    super::collect(out, depth, raw[..n].iter().copied())
}
