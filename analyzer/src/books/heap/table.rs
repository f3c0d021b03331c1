//! The heap's slots by address: an open-addressing index (address → slot
//! number, linear probing) over a slab of slots, whose cache lines for an
//! address can be fetched ahead of time.
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
//! the index moves 16-byte entries; the slab grows by `realloc`, which for
//! a large block is `mremap` (no copy).

use super::hint::prefetch;

/// One bucket of the index: an address and where its slot is.
#[derive(Clone, Copy)]
struct Entry {
    key: u64,
    /// [`EMPTY`]: a free bucket; else a slot number.
    id: u32,
}

const EMPTY: u32 = u32::MAX;
const FREE: Entry = Entry { key: 0, id: EMPTY };
/// Buckets of a new or rebuilt index (a power of two).
const MIN_BUCKETS: usize = 1 << 12;

/// Slots, each with its address, so that a walk over all of them
/// ([`Table::iter`]) reads memory in order. Addresses are never
/// forgotten (a freed block's slot says what a second free of it frees).
struct Slab<V> {
    slots: Vec<(u64, V)>,
}

impl<V> Default for Slab<V> {
    fn default() -> Slab<V> {
        Slab { slots: Vec::new() }
    }
}

impl<V> Slab<V> {
    fn put(&mut self, key: u64, v: V) -> u32 {
        self.slots.push((key, v));
        (self.slots.len() - 1) as u32
    }
}

/// Where [`Table::find`] found an address: its bucket, and the slot number
/// it holds (valid until the next insertion).
#[derive(Clone, Copy)]
pub struct Found {
    bucket: usize,
    id: u32,
}

impl Found {
    /// The address has no slot.
    pub fn vacant(&self) -> bool {
        self.id == EMPTY
    }
}

/// Slots of type `V` by address (u64). Slot numbers are 32 bits: four
/// billion addresses kept at once would need far more memory than exists.
pub struct Table<V> {
    /// A power of two in length, at most half full.
    index: Vec<Entry>,
    /// 64 − log2(index.len()): the hash is the product's top bits.
    shift: u32,
    len: usize,
    slab: Slab<V>,
}

impl<V> Default for Table<V> {
    fn default() -> Table<V> {
        Table { index: vec![FREE; MIN_BUCKETS], shift: shift_for(MIN_BUCKETS), len: 0, slab: Slab::default() }
    }
}

fn shift_for(buckets: usize) -> u32 {
    64 - buckets.trailing_zeros()
}

impl<V> Table<V> {
    /// The home bucket of `key`: Fibonacci hashing (blocks are 16-byte
    /// aligned, so the low bits alone would crowd).
    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The bucket holding `key`, or the free one ending its probe.
    #[inline]
    fn bucket(&self, key: u64) -> (usize, bool) {
        let mask = self.index.len() - 1;
        let mut i = self.home(key);
        loop {
            let e = self.index[i];
            if e.id == EMPTY {
                return (i, false);
            }
            if e.key == key {
                return (i, true);
            }
            i = (i + 1) & mask;
        }
    }

    /// Where `key` is.
    #[inline]
    pub fn find(&self, key: u64) -> Found {
        let (bucket, _) = self.bucket(key);
        Found { bucket, id: self.index[bucket].id }
    }

    /// The slot `f` found (none if it is vacant).
    #[inline]
    pub fn at(&mut self, f: Found) -> Option<&mut V> {
        (!f.vacant()).then(|| &mut self.slab.slots[f.id as usize].1)
    }

    pub fn get(&self, key: u64) -> Option<&V> {
        let f = self.find(key);
        (!f.vacant()).then(|| &self.slab.slots[f.id as usize].1)
    }

    /// Gives vacant `f`'s address (`key`) the slot `v`.
    pub fn insert(&mut self, f: Found, key: u64, v: V) {
        debug_assert!(f.vacant());
        self.len += 1;
        let bucket = if self.len * 2 > self.index.len() {
            self.rebuild(self.index.len() * 2);
            self.bucket(key).0
        } else {
            f.bucket
        };
        let id = self.slab.put(key, v);
        self.index[bucket] = Entry { key, id };
    }

    /// Every address with its slot, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.slab.slots.iter().map(|(k, v)| (*k, v))
    }

    fn rebuild(&mut self, buckets: usize) {
        let old = std::mem::replace(&mut self.index, vec![FREE; buckets]);
        self.shift = shift_for(buckets);
        for e in old.into_iter().filter(|e| e.id != EMPTY) {
            let (i, _) = self.bucket(e.key);
            self.index[i] = e;
        }
    }

    /// Asks the CPU for the index's line where `key`'s probe starts.
    #[inline]
    pub fn prefetch_index(&self, key: u64) {
        prefetch(&self.index[self.home(key)]);
    }

    /// Asks the CPU for the lines of `key`'s slot, if it has one (best
    /// after [`Table::prefetch_index`] had time to bring the index's line).
    #[inline]
    pub fn prefetch_slot(&self, key: u64) {
        let f = self.find(key);
        if !f.vacant() {
            prefetch_lines(&self.slab.slots[f.id as usize]);
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
mod tests {
    use super::*;

    #[test]
    fn inserts_and_finds() {
        let mut t: Table<u64> = Table::default();
        for a in (0..100_000u64).map(|k| 0x5555_0000_0000 + k * 16) {
            let f = t.find(a);
            assert!(f.vacant());
            t.insert(f, a, a);
        }
        assert_eq!(t.len, 100_000);
        assert_eq!(t.get(0x5555_0000_0010), Some(&0x5555_0000_0010));
        assert!(t.get(0x5555_0000_0018).is_none());
        *t.at(t.find(0x5555_0000_0040)).unwrap() += 1;
        assert_eq!(t.get(0x5555_0000_0040), Some(&0x5555_0000_0041));
        assert_eq!(t.iter().count(), 100_000);
    }
}
