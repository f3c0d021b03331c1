//! A hint to the CPU about the table's lines: it changes nothing the
//! program reads or writes. The only `unsafe` of the table.

/// Asks the CPU for the cache line holding `p`; it never faults, whatever
/// `p` (a no-op on other architectures).
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of every x86-64 CPU (the baseline the target
    // assumes), and a prefetch only hints: it reads nothing into the
    // program and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
