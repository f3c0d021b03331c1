//! Hints to the CPU and the kernel about the table's memory: they change
//! nothing the program reads or writes. The only `unsafe` of the table.

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

/// Below this many bytes a vector is left to the kernel's default pages.
const HUGE_FROM: usize = 2 << 20;

/// Asks the kernel to back `v`'s whole capacity with transparent huge
/// pages (`madvise(MADV_HUGEPAGE)`, Linux's
/// Documentation/admin-guide/mm/transhuge.rst) when it spans at least one
/// (2 MiB): the table's lookups land on random pages, and with 4 KiB pages
/// each is a TLB miss, and each page touched first a fault. Where the
/// system's THP setting is `never`, or the call fails, nothing changes.
pub fn huge_pages<T>(v: &Vec<T>) {
    let bytes = v.capacity() * std::mem::size_of::<T>();
    if bytes < HUGE_FROM {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        let start = v.as_ptr() as usize;
        // The pages the vector touches, whole: a range that left out the
        // partial first page (a large block's, which glibc maps with a
        // 16-byte header before it) split its mapping in two, and
        // glibc's realloc, which moves a mapping whole (mremap), then
        // copied it instead.
        let first = start & !(PAGE - 1);
        let end = (start + bytes).next_multiple_of(PAGE);
        // SAFETY: [first, end) are the pages holding `v`'s allocation
        // (the ends may be shared with a neighbouring block);
        // MADV_HUGEPAGE only changes how the kernel backs pages, never
        // their contents, and an error is only a refusal.
        unsafe {
            libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
        }
    }
}
