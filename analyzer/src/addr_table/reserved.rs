//! A large index's buckets in memory reserved for its growth: the index
//! doubles in place, where a new index was the old one's size twice over
//! in new pages, which the kernel (and on a VM the host) must zero.
//!
//! `mtrace report` of 20 M live blocks zeroed 192 MiB of earlier indexes
//! beside the final 256 MiB, a fifth of the pages it faults in; the
//! zeroing (`clear_page_erms`) was 27% of its samples, 11% of them on the
//! books' thread. The only `unsafe` of the index's memory: one mapping,
//! made, read through a slice, and unmapped here.

use std::ops::{Deref, DerefMut};

/// Room reserved beyond a new index: room for this many times its buckets,
/// so that it doubles in place three times (2^23 buckets, 64 MiB, grows
/// to 2^26, 50 M addresses, in its 512 MiB) before it is moved once more.
/// Address space only: untouched, none of it is memory, and a mapping
/// made with `MAP_NORESERVE` is not counted against the commit limit
/// unless overcommit is strict (`Documentation/mm/overcommit-accounting.rst`),
/// where a mapping refused leaves the index on the heap. Not more: a
/// limit on address space (`ulimit -v`) counts the room.
pub const ROOM: usize = 8;

/// Huge pages' size and alignment on x86-64 and arm64 with 4 KiB pages.
const HUGE: usize = 2 << 20;

/// Up to `room` u64 buckets, of which the first `len` are in use (zero
/// until written): `Deref`s to them as a slice.
pub struct Reserved {
    /// The mapping's start, as `mmap` returned it, and its bytes.
    map: *mut libc::c_void,
    map_bytes: usize,
    /// The first bucket: `map` rounded up to [`HUGE`].
    first: *mut u64,
    len: usize,
    room: usize,
}

// SAFETY: a `Reserved` owns its mapping alone, as a `Box<[u64]>` owns its
// block: it hands out references only through `&self` and `&mut self`.
unsafe impl Send for Reserved {}
// SAFETY: as above: shared, it is only read.
unsafe impl Sync for Reserved {}

impl Reserved {
    /// `len` zeroed buckets in a mapping with room for `room` (≥ `len`),
    /// backed by huge pages where the system allows; `None` where the
    /// mapping is refused (the caller then keeps its index on the heap).
    pub fn new(len: usize, room: usize) -> Option<Reserved> {
        debug_assert!(len <= room);
        let map_bytes = room.checked_mul(8)?.checked_add(HUGE)?;
        // SAFETY: a new private anonymous mapping, at an address the kernel
        // picks: it overlaps nothing of the program's.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return None;
        }
        // The first bucket on a huge page's boundary, so that every huge
        // page of the index is whole (the slack before it stays untouched).
        let first = (map as usize).next_multiple_of(HUGE) as *mut u64;
        #[cfg(target_os = "linux")]
        // SAFETY: the mapping made above, whole; MADV_HUGEPAGE only changes
        // how the kernel backs its pages, and an error is only a refusal.
        unsafe {
            libc::madvise(map, map_bytes, libc::MADV_HUGEPAGE);
        }
        Some(Reserved { map, map_bytes, first, len, room })
    }

    /// Makes the first `len` buckets the ones in use (more than before,
    /// the new ones zero); false if that is more than its room.
    pub fn grow_to(&mut self, len: usize) -> bool {
        if len > self.room {
            return false;
        }
        self.len = self.len.max(len);
        true
    }
}

impl Deref for Reserved {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        // SAFETY: `first` is aligned for u64, and its first `len ≤ room`
        // buckets lie inside the mapping, which lives as long as `self`;
        // anonymous memory reads as zeros until written.
        unsafe { std::slice::from_raw_parts(self.first, self.len) }
    }
}

impl DerefMut for Reserved {
    fn deref_mut(&mut self) -> &mut [u64] {
        // SAFETY: as for `deref`, and `&mut self` makes it the only
        // reference.
        unsafe { std::slice::from_raw_parts_mut(self.first, self.len) }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, whole, unmapped once; no slice
        // of it outlives `self`.
        unsafe {
            libc::munmap(self.map, self.map_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_in_place_up_to_its_room_and_keeps_what_was_written() {
        let mut r = Reserved::new(4, 16).expect("a 16-bucket mapping");
        assert_eq!((&*r, r.first as usize % HUGE), (&[0u64; 4][..], 0));
        r.iter_mut().enumerate().for_each(|(i, b)| *b = i as u64 + 1);
        let at = r.as_ptr();
        assert!(r.grow_to(16));
        assert_eq!((&r[..4], &r[4..], r.as_ptr()), (&[1, 2, 3, 4][..], &[0u64; 12][..], at));
        assert!(!r.grow_to(17));
        assert_eq!(r.len(), 16);
    }
}
