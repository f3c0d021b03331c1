//! The table's slots, each with its address, numbered in the order they
//! were put, in chunks that never move.
//!
//! Why chunks and not one vector: the slots are read at random (a lookup
//! per event), so the table asks for huge pages ([`huge_pages`]), which
//! made reports of jq's and python3's traces 10% faster; but a vector
//! grows by `realloc`, which moves a large block with `mremap`, and
//! moving huge pages made 20 M live blocks 2.3 -> 4.1 s (system time 0.4
//! -> 2.1 s). A full chunk stays where it is, and the next is a new one,
//! as large as all before it.

use super::hint::{huge_pages, populate_soon, POPULATE_FROM};

/// Slots in the first chunk, as a power of two (4,096: 128 KiB of the
/// heap's 32-byte slots). Each chunk after it holds as many as all before
/// it, so that a table holds at most twice its slots, a small one is small
/// (a report makes a table per process, and tests thousands), and a slot's
/// chunk is its number's highest bit.
const FIRST_BITS: u32 = 12;

/// Chunks that start below this slot number are put on huge pages; the
/// later ones (past 128 MiB of the heap's 32-byte slots) are not. On this
/// machine (a VM whose free memory the host takes back: `page_reporting`) a
/// fresh huge page costs the host's faults of its 512 small ones, and past
/// some size those outweigh the TLB misses saved: `mtrace report` of 20 M
/// live blocks (runs alternated) 3.0 s without huge pages, 3.05-3.5 s with
/// every chunk on them (system time 0.6 -> 1.0-1.5 s), 2.4-2.9 s with only
/// the index; of python3's trace (1.4 M slots) 0.29 s without, 0.25 with
/// only the index, 0.23 with both.
const HUGE_UNTIL: usize = 1 << 22;

/// Chunks of at least [`POPULATE_FROM`] bytes have their pages faulted in
/// ahead of the slots put in them, by a helper thread ([`populate_soon`]), in
/// steps of [`POPULATE_STEP`] bytes, [`POPULATE_AHEAD`] steps ahead: the
/// first touch of each new page was 8% of the samples of `mtrace report` of
/// 20 M live blocks, on the books' thread (the other core half idle).
/// Ahead by a few steps only: a chunk's second half may never be used,
/// and populated it would count in the report's RSS.
const POPULATE_STEP: usize = 1 << 20;
const POPULATE_AHEAD: usize = 4;

/// The chunk of slot `id`, and the slot's place in it.
#[inline]
fn place(id: usize) -> (usize, usize) {
    let k = (usize::BITS - (id >> FIRST_BITS).leading_zeros()) as usize;
    let start = if k == 0 { 0 } else { 1 << (FIRST_BITS as usize + k - 1) };
    (k, id - start)
}

/// Slots chunk `k` holds.
fn chunk_len(k: usize) -> usize {
    1 << (FIRST_BITS as usize + k.max(1) - 1)
}

/// Slots (an address and its value), numbered from 0, so that a walk over
/// all of them ([`Slab::iter`]) reads memory in order. Addresses are never
/// forgotten (a freed block's slot says what a second free of it frees).
pub struct Slab<V> {
    chunks: Vec<Vec<(u64, V)>>,
    len: usize,
}

impl<V> Default for Slab<V> {
    fn default() -> Slab<V> {
        Slab { chunks: Vec::new(), len: 0 }
    }
}

impl<V> Slab<V> {
    /// Adds a slot; its number.
    pub fn put(&mut self, key: u64, v: V) -> u32 {
        let (k, _) = place(self.len);
        if k == self.chunks.len() {
            let chunk = Vec::with_capacity(chunk_len(k));
            if self.len < HUGE_UNTIL {
                huge_pages(&chunk);
            }
            self.chunks.push(chunk);
        }
        let chunk = &mut self.chunks[k];
        chunk.push((key, v));
        let slot = std::mem::size_of::<(u64, V)>();
        let used = chunk.len() * slot;
        let bytes = chunk.capacity() * slot;
        // At the chunk's first slot, the first steps; then, each time its
        // slots cross into step q, step q + AHEAD - 1.
        if bytes >= POPULATE_FROM {
            let q = used / POPULATE_STEP;
            let range = if chunk.len() == 1 {
                Some((0, POPULATE_STEP * POPULATE_AHEAD))
            } else if q != (used - slot) / POPULATE_STEP {
                let from = (q + POPULATE_AHEAD - 1) * POPULATE_STEP;
                Some((from, from + POPULATE_STEP))
            } else {
                None
            };
            if let Some((from, to)) = range.filter(|&(from, _)| from < bytes) {
                populate_soon(chunk.as_ptr().cast::<u8>().wrapping_add(from), to.min(bytes) - from);
            }
        }
        self.len += 1;
        (self.len - 1) as u32
    }

    /// Slots put so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Slot `id` (one [`Slab::put`] returned).
    #[inline]
    pub fn at(&self, id: u32) -> &(u64, V) {
        let (k, i) = place(id as usize);
        &self.chunks[k][i]
    }

    /// Slot `id`, to change its value.
    #[inline]
    pub fn at_mut(&mut self, id: u32) -> &mut (u64, V) {
        let (k, i) = place(id as usize);
        &mut self.chunks[k][i]
    }

    /// Every slot, in the order they were put.
    pub fn iter(&self) -> impl Iterator<Item = &(u64, V)> {
        self.chunks.iter().flatten()
    }

    /// Every slot, in the order they were put, a chunk's slice at a time.
    pub fn chunks(&self) -> impl Iterator<Item = &[(u64, V)]> {
        self.chunks.iter().map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_chunk_holds_as_many_as_all_before_it() {
        let first = 1 << FIRST_BITS;
        assert_eq!((place(0), place(first - 1)), ((0, 0), (0, first - 1)));
        assert_eq!((place(first), place(2 * first - 1)), ((1, 0), (1, first - 1)));
        assert_eq!((place(2 * first), place(4 * first - 1)), ((2, 0), (2, 2 * first - 1)));
        assert_eq!(place(4 * first + 5), (3, 5));
        assert_eq!((chunk_len(0), chunk_len(1), chunk_len(2), chunk_len(3)), (first, first, 2 * first, 4 * first));
    }

    #[test]
    fn slots_across_chunks_keep_their_numbers_and_order() {
        let mut s: Slab<u32> = Slab::default();
        let n = (1 << FIRST_BITS) * 4 + 3;
        for i in 0..n {
            assert_eq!(s.put(i as u64 * 16, i as u32), i as u32);
        }
        assert_eq!((s.len(), s.chunks.len()), (n, 4));
        assert!(s.chunks.iter().enumerate().all(|(k, c)| c.capacity() == chunk_len(k)));
        assert_eq!(s.at(n as u32 - 1), &((n as u64 - 1) * 16, n as u32 - 1));
        s.at_mut(5).1 = 99;
        assert_eq!(s.at(5).1, 99);
        assert!(s.iter().enumerate().all(|(i, (k, _))| *k == i as u64 * 16));
        assert_eq!(s.iter().count(), n);
    }
}
