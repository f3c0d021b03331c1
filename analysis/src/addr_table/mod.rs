//! Values by address: an open-addressing index (address → slot number,
//! linear probing) over a slab of slots, whose cache lines for an address
//! can be fetched ahead of time. It holds the heap's blocks
//! (`crate::books`).
//!
//! Why not a `HashMap<u64, Slot>` (hashbrown): `mtrace report` of jq (1.6 M
//! blocks live at once) spent 55% of its time waiting for the map's three
//! cache misses per event (control bytes, key, slot) and another 18% on
//! the page faults of moving 150-byte slots whenever the map grew. The
//! loader knows the addresses of the next records long before it enters
//! them, but hashbrown's bucket for a key cannot be asked for without the
//! lookup itself. Here the bucket is a computable position
//! ([`Table::prefetch_index`]), and once the index's line is in the cache
//! the slot's lines can be fetched too ([`Table::prefetch_slot`]). Growing
//! the index moves its 8-byte entries, in order (a large index in place,
//! `buckets.rs`); the slab grows by chunks,
//! and its slots never move (`slab.rs`). Both are backed by huge pages
//! where the system allows, and large ones have their new pages faulted
//! in by a helper thread ahead of their use (`hint.rs`).

mod buckets;
mod hint;
mod slab;
use buckets::{affordable_room, Buckets, ROOM};
use hint::{huge_pages, populate_soon, prefetch, POPULATE_FROM};
use slab::Slab;

/// One bucket of the index, a u64: the top 32 bits of the address's hash
/// (its tag, [`tag`]) in the high half, its slot number plus one in the
/// low half (0: a free bucket). 8 bytes, so that the index costs half what it would with
/// the whole address in it (issue 43: the books' bytes per live block;
/// see [`LARGE`]). A tag that matches is confirmed against the address
/// kept in the slot, a line the event reads next anyway.
fn entry(tag: u32, id: u32) -> u64 {
    u64::from(tag) << 32 | u64::from(id + 1)
}

/// The slot number in bucket `e` ([`EMPTY`]: a free bucket).
#[inline]
fn id_of(e: u64) -> u32 {
    (e as u32).wrapping_sub(1)
}

#[inline]
fn tag_of(e: u64) -> u32 {
    (e >> 32) as u32
}

const EMPTY: u32 = u32::MAX;

/// The entry's tag of an address whose hash is `h`: the hash's top 32
/// bits, of which the home bucket is the first `log2(buckets)`
/// ([`Table::home`]). Entries met in a probe that share the address's home
/// also share those bits, and are told apart by the rest (7 of them at 32 M
/// buckets: one entry in 128 of the same home needs its address read to be
/// told apart). So that the index can grow from its own entries, in order
/// ([`Table::grow_from_entries`]): an entry's home in an index of any size up
/// to 2^32 buckets is in its tag.
#[inline]
fn tag(h: u64) -> u32 {
    (h >> 32) as u32
}

/// Buckets of a new index (a power of two).
const MIN_BUCKETS: usize = 1 << 12;

/// From this many buckets (64 MiB of index) on, the index is "large": up
/// to three quarters full, where a smaller one is at most half full.
///
/// At most half full, an index of a power of two costs 16 to 32 bytes an
/// address (16 to 64 as it grows by four, [`grown`]; 27 at 20 M addresses
/// if it were not large: with the heap's 32-byte slot, 68 bytes a block
/// in all); three quarters full, 10.7 to 21 (13.4 at 5 M and 20 M: 44 to
/// 45 bytes a block, issue 43's target 48). Below it memory is not the
/// question, and shorter probes are faster.
const LARGE: usize = 1 << 23;

/// The buckets of the index that replaces a full one of `buckets`: four
/// times as many below [`LARGE`], twice from it on. Growing by four moves
/// a third of the entries that growing by two does (measured when each
/// growth wrote every address again at a random bucket: `mtrace report`,
/// `perf stat -r 8`, three alternated rounds: python3-malloc 0.242-0.262
/// -> 0.219-0.234 s, jq 0.173-0.183 -> 0.168-0.182, cxx the same at
/// 0.13-0.14, sqlite3's 10 ms 1 ms slower: a larger index to zero at its
/// first rebuild). Below `LARGE` an index is then an eighth
/// to a half full, 16 to 64 bytes an address (the report's peak RSS: jq
/// 124 -> 123 MB, cxx 46 -> 51, the random churn over 1 M blocks 84 ->
/// 99); a large one grows as before.
fn grown(buckets: usize) -> usize {
    if buckets * 4 <= LARGE {
        buckets * 4
    } else {
        buckets * 2
    }
}

/// Whether `len` addresses overfill an index of `buckets`.
fn full(len: usize, buckets: usize) -> bool {
    if buckets >= LARGE {
        len * 4 > buckets * 3
    } else {
        len * 2 > buckets
    }
}

/// The index's most buckets: a home is the top bits of an entry's 32-bit
/// tag ([`tag`]). At three quarters full, 3.2 billion addresses: more than
/// a slot's 32-bit number allows in memory that exists.
const MAX_BUCKETS: usize = 1 << 32;

/// The hash of `key`, in an index of any size: Fibonacci hashing of the
/// address in 8-byte units (one multiply; the top bits are the home,
/// [`Table::home`], and the tag, [`tag`]).
///
/// In units of 8 bytes, not of bytes: blocks are 8- or 16-byte aligned,
/// and the multiplier of their numbers then stays (twice) the golden
/// ratio's, which spreads the neighbours a heap hands out evenly over
/// the index; the bytes' multiplier, 8 or 16 times it, does not (jq's 1.6
/// M addresses took 22 probes a lookup at three quarters full; in 8-byte
/// units they lie 1.3 buckets past their home on average, jq's with the
/// leak scan 4.7, uniform hashing's 1.5; `tests.rs` has the patterns).
/// So one hash serves every size, where large indexes had murmur3's finalizer (two
/// multiplies more, and a rebuild from the slots when an index became
/// large): `mtrace report` of 20 M live blocks 2.72-2.86 -> 2.23-2.38 s
/// (the middle three of five runs, alternated), of the random churn over
/// 1 M blocks 3.31-3.46 -> 2.91-3.19 s, 5 M, jq and python3-malloc within
/// noise; the same reports.
#[inline]
fn hash(key: u64) -> u64 {
    (key >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Where [`Table::find`] found an address: its bucket, and the slot number
/// it holds (valid until the next insertion), with the address's tag for
/// the entry an insertion writes there.
#[derive(Clone, Copy)]
pub struct Found {
    bucket: usize,
    id: u32,
    tag: u32,
}

impl Found {
    /// The address has no slot.
    pub fn vacant(&self) -> bool {
        self.id == EMPTY
    }
}

/// Slots of type `V` by address (u64), numbered in the order they were
/// inserted (from 0). Slot numbers are 32 bits (below [`EMPTY`]): four
/// billion addresses kept at once would need far more memory than exists.
pub struct Table<V> {
    /// A power of two in length, at most half full, or three quarters
    /// when large ([`full`]).
    index: Buckets,
    /// 64 − log2(index.len()): the hash is the product's top bits.
    shift: u32,
    slab: Slab<V>,
}

impl<V> Default for Table<V> {
    fn default() -> Table<V> {
        Table { index: Buckets::on_heap(vec![0; MIN_BUCKETS]), shift: shift_for(MIN_BUCKETS), slab: Slab::default() }
    }
}

fn shift_for(buckets: usize) -> u32 {
    64 - buckets.trailing_zeros()
}

impl<V> Table<V> {
    /// The home bucket of an address whose hash is `h`.
    #[inline]
    fn home(&self, h: u64) -> usize {
        (h >> self.shift) as usize
    }

    /// The bucket after `i` in a probe.
    #[inline]
    fn next(&self, i: usize) -> usize {
        (i + 1) & (self.index.len() - 1)
    }

    /// The bucket holding `key`, or the free one ending its probe; and
    /// `key`'s tag.
    #[inline]
    fn bucket(&self, key: u64) -> (usize, u32) {
        let h = hash(key);
        let t = tag(h);
        let mut i = self.home(h);
        loop {
            let e = self.index[i];
            if e == 0 || tag_of(e) == t && self.slab.at(id_of(e)).0 == key {
                return (i, t);
            }
            i = self.next(i);
        }
    }

    /// The slot number of the first entry in `key`'s probe with its tag
    /// (`EMPTY`: none), unconfirmed: for a prefetch, which must not wait
    /// for the slot's line to read the address in it.
    #[inline]
    fn likely(&self, key: u64) -> u32 {
        let h = hash(key);
        let t = tag(h);
        let mut i = self.home(h);
        loop {
            let e = self.index[i];
            if e == 0 || tag_of(e) == t {
                return id_of(e);
            }
            i = self.next(i);
        }
    }

    /// Where `key` is (the index built again first if it was dropped).
    #[inline]
    pub fn find(&mut self, key: u64) -> Found {
        if self.index.is_empty() {
            self.restore_index();
        }
        self.locate(key)
    }

    /// Where `key` is, in an index that is there.
    #[inline]
    fn locate(&self, key: u64) -> Found {
        let (bucket, tag) = self.bucket(key);
        Found { bucket, id: id_of(self.index[bucket]), tag }
    }

    /// Frees the index, for a table that is only walked from now on (the
    /// books of a report once the trace is read, [`Table::iter`]): at 20 M
    /// addresses it is 256 MiB of the books' 900. A lookup after this is
    /// still right: [`Table::find`] builds the index again, [`Table::get`]
    /// walks the slots.
    pub fn drop_index(&mut self) {
        self.index = Buckets::default();
    }

    #[cold]
    #[inline(never)]
    fn restore_index(&mut self) {
        let mut buckets = MIN_BUCKETS;
        while full(self.slab.len() + 1, buckets) {
            buckets *= 2;
        }
        self.rebuild(buckets);
    }

    /// The slot `f` found (none if it is vacant).
    #[inline]
    pub fn at(&mut self, f: Found) -> Option<&mut V> {
        (!f.vacant()).then(|| &mut self.slab.at_mut(f.id).1)
    }

    /// The slot of `key`, if it has one.
    pub fn get(&self, key: u64) -> Option<&V> {
        if self.index.is_empty() {
            // Dropped ([`Table::drop_index`]): rare enough to walk.
            return self.slab.iter().find(|(k, _)| *k == key).map(|(_, v)| v);
        }
        let f = self.locate(key);
        (!f.vacant()).then(|| &self.slab.at(f.id).1)
    }

    /// Gives vacant `f`'s address (`key`) the slot `v`.
    pub fn insert(&mut self, f: Found, key: u64, v: V) {
        debug_assert!(f.vacant());
        let bucket = if full(self.slab.len() + 1, self.index.len()) {
            self.grow_from_entries(grown(self.index.len()));
            self.bucket(key).0
        } else {
            f.bucket
        };
        let id = self.slab.put(key, v);
        self.index[bucket] = entry(f.tag, id);
    }

    /// Every address with its slot, in the order they were inserted.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.slab.iter().map(|(k, v)| (*k, v))
    }

    /// Every (address, slot), in the order they were inserted, as slices:
    /// for a walk whose loop over a slice keeps its sums in registers.
    pub fn slices(&self) -> impl Iterator<Item = &[(u64, V)]> {
        self.slab.chunks()
    }

    /// A new index of `buckets` over every slot (each address has one, and
    /// no two the same address: no key is compared), for an index that
    /// was dropped ([`Table::drop_index`]).
    fn rebuild(&mut self, buckets: usize) {
        // The old index goes first: the new one is built from the slab,
        // and both at once would be the books' peak.
        self.index = Buckets::default();
        // Zeros written in order: zeroed memory from the kernel (`vec![0;
        // n]`, calloc) is faulted in a page at a time by the scattered
        // writes below, which made reporting jq 0.30 -> 0.34 s.
        let mut index = Vec::with_capacity(buckets);
        huge_pages(&index);
        index.resize(buckets, 0);
        self.index = Buckets::on_heap(index);
        self.shift = shift_for(buckets);
        // The homes are random: each is a cache miss unless asked for
        // ahead (rebuilds of an index that grew by half, tried on the way,
        // were a fifth of reporting 20 M live blocks).
        const AHEAD: usize = 64;
        let len = self.slab.len();
        for (id, (key, _)) in self.slab.iter().enumerate() {
            if id + AHEAD < len {
                prefetch(&self.index[self.home(hash(self.slab.at((id + AHEAD) as u32).0))]);
            }
            let h = hash(*key);
            let mut i = self.home(h);
            while self.index[i] != 0 {
                i = self.next(i);
            }
            self.index[i] = entry(tag(h), id as u32);
        }
    }

    /// A new index of `buckets` (2 or 4 times as many, at most
    /// [`MAX_BUCKETS`]) from the entries of the old one, without the
    /// slots: each entry's home in the new index is in its tag ([`tag`]),
    /// and it lands at about twice (four times) its old bucket, so both
    /// indexes are walked in order, where a rebuild from the slots
    /// ([`Table::rebuild`]) reads every slot's address and writes each at
    /// a random bucket (`mtrace report` of 20 M live blocks: the rebuilds
    /// 6% of the samples before, these moves under 1%).
    ///
    /// A large index grows in place, in its mapping's room
    /// ([`Table::spread_in_place`]); a small one, or one whose room is
    /// used up, is moved to a new one. Why not in place on the heap
    /// (`realloc`): glibc moves a large block with `mremap` to an address
    /// the kernel picks, and a huge page moved off a 2 MiB boundary is
    /// split into small ones (370 -> 244 MiB of huge pages in that
    /// report, and no faster).
    fn grow_from_entries(&mut self, buckets: usize) {
        debug_assert!(buckets > self.index.len() && buckets <= MAX_BUCKETS);
        let before = self.index.len();
        if self.index.grow_in_place(buckets) {
            self.populate_after(before);
            self.shift = shift_for(buckets);
            return self.spread_in_place(before);
        }
        let old = std::mem::take(&mut self.index);
        // Zeroed by the kernel (calloc and mmap map new memory), and a
        // large one faulted in by the helper thread ahead of the moves,
        // which write in order: written with zeros here, its first touch
        // was on this thread, and with the slab's (`slab.rs`) 8% of the
        // samples of reporting 20 M live blocks.
        let mapped =
            || Buckets::mapped(buckets, affordable_room(buckets, buckets.saturating_mul(ROOM).min(MAX_BUCKETS)));
        self.index = (buckets >= LARGE).then(mapped).flatten().unwrap_or_else(|| {
            let index = vec![0; buckets];
            huge_pages(&index);
            Buckets::on_heap(index)
        });
        self.populate_after(0);
        self.shift = shift_for(buckets);
        // From the last bucket down, while the helper faults pages in
        // from the first up: the moves outran it, and took most of the
        // index's new pages on this thread.
        for &e in old.iter().rev().filter(|&&e| e != 0) {
            self.place(e);
        }
    }

    /// Puts entry `e` in the first free bucket from its home on.
    fn place(&mut self, e: u64) {
        let mut i = self.home_of_tag(tag_of(e));
        while self.index[i] != 0 {
            i = self.next(i);
        }
        self.index[i] = e;
    }

    /// Has the helper thread fault in the index's buckets from `from` on,
    /// new ones about to be written, if they are many.
    fn populate_after(&self, from: usize) {
        let bytes = (self.index.len() - from) * std::mem::size_of::<u64>();
        if bytes >= POPULATE_FROM {
            populate_soon(self.index[from..].as_ptr().cast::<u8>(), bytes);
        }
    }

    /// Moves the entries of the index's first `old` buckets, an index of
    /// `old` buckets, to their places in the whole (2 or 4 times as many,
    /// the rest zero), in place.
    ///
    /// From the last old bucket down: an entry whose home in the new index
    /// is at or past its old bucket `p` is placed there by the usual probe,
    /// which meets only entries already placed (every bucket from `p` on
    /// holds only those: the old ones there were moved, and none is placed
    /// below `p`), so the new index holds its invariant (no free bucket
    /// between an entry's home and its bucket) at each step. An entry with
    /// a new home below `p` (one far from its old home near the start, as
    /// such probes grow), or whose probe would wrap past the end into
    /// buckets not moved yet, is placed after all the others, by the
    /// usual probe: a few of the millions.
    fn spread_in_place(&mut self, old: usize) {
        let n = self.index.len();
        let mut later = Vec::new();
        for p in (0..old).rev() {
            let e = std::mem::replace(&mut self.index[p], 0);
            if e == 0 {
                continue;
            }
            let mut q = self.home_of_tag(tag_of(e));
            if q >= p {
                while q < n && self.index[q] != 0 {
                    q += 1;
                }
            }
            if q < p || q == n {
                later.push(e);
            } else {
                self.index[q] = e;
            }
        }
        for e in later {
            self.place(e);
        }
    }

    /// The home bucket of an entry whose tag is `t` (the index at most
    /// 2^32 buckets: [`MAX_BUCKETS`]).
    #[inline]
    fn home_of_tag(&self, t: u32) -> usize {
        self.home(u64::from(t) << 32)
    }

    /// Asks the CPU for the index's line where `key`'s probe starts.
    #[inline]
    pub fn prefetch_index(&self, key: u64) {
        if let Some(e) = self.index.get(self.home(hash(key))) {
            prefetch(e);
        }
    }

    /// Asks the CPU for the lines of `key`'s slot, if it has one (best
    /// after [`Table::prefetch_index`] had time to bring the index's line).
    #[inline]
    pub fn prefetch_slot(&self, key: u64) {
        if self.index.is_empty() {
            return;
        }
        let id = self.likely(key);
        if id != EMPTY {
            prefetch_lines(self.slab.at(id));
        }
    }
}

/// Asks the CPU for every line `v` touches (its start need not be aligned).
#[inline]
fn prefetch_lines<V>(v: &V) {
    let bytes = std::mem::size_of::<V>();
    let start = v as *const V as *const u8;
    for off in (0..bytes).step_by(64) {
        prefetch(start.wrapping_add(off));
    }
    prefetch(start.wrapping_add(bytes - 1));
}

#[cfg(test)]
mod tests;
