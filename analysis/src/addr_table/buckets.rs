//! The index's buckets: a vector while small; a large index's in memory
//! reserved for its growth, where it doubles in place, where a new index
//! was the old one's size twice over in new pages, which the kernel (and
//! on a VM the host) must zero.
//!
//! `mtrace report` of 20 M live blocks zeroed 192 MiB of earlier indexes
//! beside the final 256 MiB, a fifth of the pages it faults in; the
//! zeroing (`clear_page_erms`) was 27% of its samples, 11% of them on the
//! books' thread. The only `unsafe` of the index's memory: a mapping made,
//! either owner read through a slice, and the mapping unmapped here.

use std::ops::{Deref, DerefMut};

/// Room reserved beyond a new index: room for this many times its buckets,
/// so that it doubles in place three times (2^23 buckets, 64 MiB, grows
/// to 2^26, 50 M addresses, in its 512 MiB) before it is moved once more.
/// Address space only: untouched, none of it is memory, and a mapping
/// made with `MAP_NORESERVE` is not counted against the commit limit
/// unless overcommit is strict (`Documentation/mm/overcommit-accounting.rst`).
/// Where either is limited, no room is taken ([`affordable_room`]).
pub const ROOM: usize = 8;

/// The room a new index of `len` buckets may reserve: `room`, unless the
/// address space is limited (`ulimit -v`: RLIMIT_AS, getrlimit(2)) or
/// overcommit is strict (`vm.overcommit_memory` 2), where room reserved
/// counts as used and could make the report's later allocations fail (a
/// report of 5 M blocks under `ulimit -v 900000` aborted with the room);
/// then `len`, and the index is moved at each growth, as on the heap.
pub fn affordable_room(len: usize, room: usize) -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the limit into `limit`, a valid rlimit.
    let limited = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0 || limit.rlim_cur != libc::RLIM_INFINITY;
    let strict = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|s| s.trim() == "2");
    if limited || strict {
        len
    } else {
        room
    }
}

/// Huge pages' size and alignment on x86-64 and arm64 with 4 KiB pages.
const HUGE: usize = 2 << 20;

/// The index's buckets, read and written as a slice (`Deref`): a vector
/// on the heap, or a mapping with room to grow in place
/// ([`Buckets::mapped`]). A slice's pointer and length kept apart from
/// their owner, so that a lookup reads them as it would a vector's, with
/// no test of which owner it is.
pub struct Buckets {
    /// The first bucket (a mapping's rounded up to [`HUGE`]).
    first: *mut u64,
    len: usize,
    /// Buckets there is room for without moving: `len` on the heap.
    room: usize,
    owner: Owner,
}

enum Owner {
    /// Kept for its buffer, read and written through `first`.
    Heap { _buffer: Vec<u64> },
    /// The mapping's start, as `mmap` returned it, and its bytes.
    Map(*mut libc::c_void, usize),
}

// SAFETY: a `Buckets` owns its memory alone, as a `Vec<u64>` does (the
// pointer is into its own vector or mapping): it hands out references
// only through `&self` and `&mut self`.
unsafe impl Send for Buckets {}
// SAFETY: as above: shared, it is only read.
unsafe impl Sync for Buckets {}

impl Default for Buckets {
    fn default() -> Buckets {
        Buckets::on_heap(Vec::new())
    }
}

impl Buckets {
    /// The buckets of vector `v`.
    pub fn on_heap(mut v: Vec<u64>) -> Buckets {
        // A vector's buffer does not move when the vector does.
        Buckets { first: v.as_mut_ptr(), len: v.len(), room: v.len(), owner: Owner::Heap { _buffer: v } }
    }

    /// `len` zeroed buckets in a mapping with room for `room` (≥ `len`),
    /// backed by huge pages where the system allows; `None` where the
    /// mapping is refused (the caller then keeps its index on the heap).
    pub fn mapped(len: usize, room: usize) -> Option<Buckets> {
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
        Some(Buckets { first, len, room, owner: Owner::Map(map, map_bytes) })
    }

    /// Makes the first `len` buckets the ones in use, more than before
    /// (the new ones zero), where they are; false if there is not the
    /// room (always on the heap).
    pub fn grow_in_place(&mut self, len: usize) -> bool {
        if len > self.room {
            return false;
        }
        self.len = self.len.max(len);
        true
    }

    /// Whether they are in a mapping.
    #[cfg(test)]
    pub fn is_mapped(&self) -> bool {
        matches!(self.owner, Owner::Map(..))
    }
}

impl Deref for Buckets {
    type Target = [u64];
    #[inline]
    fn deref(&self) -> &[u64] {
        // SAFETY: `first` is aligned for u64 and non-null (a vector's
        // pointer, dangling only when empty), and its first `len ≤ room`
        // buckets lie inside the vector's initialized part or the mapping,
        // which live as long as `self`; a mapping reads as zeros until
        // written.
        unsafe { std::slice::from_raw_parts(self.first, self.len) }
    }
}

impl DerefMut for Buckets {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u64] {
        // SAFETY: as for `deref`, and `&mut self` makes it the only
        // reference.
        unsafe { std::slice::from_raw_parts_mut(self.first, self.len) }
    }
}

impl Drop for Buckets {
    fn drop(&mut self) {
        if let Owner::Map(map, bytes) = self.owner {
            // SAFETY: the mapping `mapped` made, whole, unmapped once; no
            // slice of it outlives `self`.
            unsafe {
                libc::munmap(map, bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_in_place_up_to_its_room_and_keeps_what_was_written() {
        let mut r = Buckets::mapped(4, 16).expect("a 16-bucket mapping");
        assert_eq!((&*r, r.first as usize % HUGE, r.is_mapped()), (&[0u64; 4][..], 0, true));
        r.iter_mut().enumerate().for_each(|(i, b)| *b = i as u64 + 1);
        let at = r.as_ptr();
        assert!(r.grow_in_place(16));
        assert_eq!((&r[..4], &r[4..], r.as_ptr()), (&[1, 2, 3, 4][..], &[0u64; 12][..], at));
        assert!(!r.grow_in_place(17));
        assert_eq!(r.len(), 16);
    }

    #[test]
    fn on_the_heap_they_are_the_vector_and_never_grow_in_place() {
        let mut h = Buckets::on_heap(vec![7; 8]);
        h[3] = 9;
        assert_eq!((&h[..], h.is_mapped()), (&[7, 7, 7, 9, 7, 7, 7, 7][..], false));
        assert!(!h.grow_in_place(9) && h.grow_in_place(8));
        assert!(Buckets::default().is_empty());
    }
}
