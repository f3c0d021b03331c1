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

/// Memory populated ahead by a helper ([`populate_soon`]) is at least this
/// many bytes: below it the faults are few, and the helper's thread (and
/// RSS ahead of need) not worth it.
pub const POPULATE_FROM: usize = 8 << 20;

/// Asks a helper thread to fault in the pages of `[start, start + len)`
/// for writing (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14): memory the
/// caller is about to fill, whose first-touch faults (the kernel zeroing
/// each page, and on a VM the host's own fault) would otherwise stall the
/// books' thread while the decoding thread's core idles. It changes no
/// byte: a range already populated, freed meanwhile (`ENOMEM`) or where
/// the call is unknown (`EINVAL`) is left as it is. The helper starts at
/// the first call; if it cannot, nothing is populated.
pub fn populate_soon(start: *const u8, len: usize) {
    use std::sync::mpsc::{channel, Sender};
    use std::sync::OnceLock;
    static HELPER: OnceLock<Option<Sender<(usize, usize)>>> = OnceLock::new();
    let helper = HELPER.get_or_init(|| {
        let (tx, rx) = channel::<(usize, usize)>();
        let spawned = std::thread::Builder::new().name("mtrace-populate".into()).spawn(move || {
            for (start, len) in rx {
                populate(start, len);
            }
        });
        spawned.ok().map(|_| tx)
    });
    if let Some(tx) = helper {
        let _ = tx.send((start as usize, len));
    }
}

/// Faults in the whole pages inside `[start, start + len)` for writing.
fn populate(start: usize, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const PAGE: usize = 4096;
        // Whole pages only: the partial ones at the ends may be another
        // block's (populating them would be harmless, but needless).
        let first = start.next_multiple_of(PAGE);
        let end = (start + len) & !(PAGE - 1);
        if end > first {
            // SAFETY: MADV_POPULATE_WRITE only faults pages in, as a write
            // of their own contents would, without writing: no byte of
            // any mapping changes, and a range not (or no longer) mapped
            // is refused with ENOMEM, not faulted.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_POPULATE_WRITE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    /// The whole pages in `v`: (first, end) addresses.
    fn whole_pages(v: &[u8]) -> (usize, usize) {
        let first = (v.as_ptr() as usize).next_multiple_of(PAGE);
        (first, (v.as_ptr() as usize + v.len()) & !(PAGE - 1))
    }

    /// How many of `v`'s whole pages are resident (mincore).
    fn resident_pages(v: &[u8]) -> usize {
        let (first, end) = whole_pages(v);
        let mut vec = vec![0u8; (end - first) / PAGE];
        // SAFETY: [first, end) lies inside `v`'s allocation, and `vec` has
        // a byte for each of its pages, as mincore writes.
        let rc = unsafe { libc::mincore(first as *mut libc::c_void, end - first, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn populating_faults_pages_in_and_changes_no_byte() {
        // Fresh from the kernel (calloc maps it), untouched: no page in.
        let mut fresh = vec![0u8; 16 << 20];
        assert!(resident_pages(&fresh) < 16, "calloc touched its pages: the test tests nothing");
        populate(fresh.as_ptr() as usize + (4 << 20), 8 << 20);
        let part = &fresh[4 << 20..12 << 20];
        assert_eq!(resident_pages(part), (whole_pages(part).1 - whole_pages(part).0) / PAGE);
        assert!(resident_pages(&fresh[12 << 20..]) < 16);
        assert!(fresh.iter().all(|&b| b == 0));
        // Written memory keeps its bytes.
        fresh.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        populate(fresh.as_ptr() as usize, fresh.len());
        assert!(fresh.iter().enumerate().all(|(i, &b)| b == i as u8));
        // The helper's way: it faults the range in soon.
        let later = vec![0u8; 8 << 20];
        populate_soon(later.as_ptr(), later.len());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let all = (whole_pages(&later).1 - whole_pages(&later).0) / PAGE;
        while resident_pages(&later) < all && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(resident_pages(&later), all);
    }
}
