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

/// One bucket of the index: an address and its slot number.
#[derive(Clone, Copy)]
struct Entry {
    key: u64,
    /// [`EMPTY`]: a free bucket.
    id: u32,
}

const EMPTY: u32 = u32::MAX;
const FREE: Entry = Entry { key: 0, id: EMPTY };
/// Buckets of a new or rebuilt index (a power of two).
const MIN_BUCKETS: usize = 1 << 12;

/// Slots of type `V` by address (u64). Slot numbers are u32: four
/// billion addresses kept at once would need far more memory than exists.
pub struct Table<V> {
    /// A power of two in length, at most half full.
    index: Vec<Entry>,
    /// 64 − log2(index.len()): the hash is the product's top bits.
    shift: u32,
    len: usize,
    /// Each slot with its address, so that walks over all of them
    /// ([`Table::iter`], [`Table::retain`]) read memory in order.
    slab: Vec<(u64, V)>,
    /// One bit per slab position: in use.
    used: Vec<u64>,
    /// Slab positions no address uses.
    unused: Vec<u32>,
}

impl<V> Default for Table<V> {
    fn default() -> Table<V> {
        Table {
            index: vec![FREE; MIN_BUCKETS],
            shift: shift_for(MIN_BUCKETS),
            len: 0,
            slab: Vec::new(),
            used: Vec::new(),
            unused: Vec::new(),
        }
    }
}

fn shift_for(buckets: usize) -> u32 {
    64 - buckets.trailing_zeros()
}

impl<V> Table<V> {
    /// Addresses kept.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The home bucket of `key`: Fibonacci hashing (blocks are 16-byte
    /// aligned, so the low bits alone would crowd).
    #[inline]
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The bucket holding `key`, or the free one ending its probe.
    #[inline]
    fn find(&self, key: u64) -> (usize, bool) {
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

    pub fn get(&self, key: u64) -> Option<&V> {
        match self.find(key) {
            (i, true) => Some(&self.slab[self.index[i].id as usize].1),
            _ => None,
        }
    }

    /// The slot of `key`, made with `make` if there is none.
    #[inline]
    pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> V) -> &mut V {
        let (mut i, found) = self.find(key);
        if !found {
            if (self.len + 1) * 2 > self.index.len() {
                self.rebuild(self.index.len() * 2);
                i = self.find(key).0;
            }
            let id = match self.unused.pop() {
                Some(id) => {
                    self.slab[id as usize] = (key, make());
                    id as usize
                }
                None => {
                    self.slab.push((key, make()));
                    if self.used.len() * 64 < self.slab.len() {
                        self.used.push(0);
                    }
                    self.slab.len() - 1
                }
            };
            self.used[id / 64] |= 1 << (id % 64);
            self.index[i] = Entry { key, id: id as u32 };
            self.len += 1;
        }
        let id = self.index[i].id as usize;
        &mut self.slab[id].1
    }

    /// The slab positions in use, in order.
    fn ids(&self) -> impl Iterator<Item = usize> + '_ {
        self.used.iter().enumerate().flat_map(|(w, &bits)| {
            let mut bits = bits;
            std::iter::from_fn(move || {
                let b = bits.trailing_zeros();
                (bits != 0).then(|| {
                    bits &= bits - 1;
                    w * 64 + b as usize
                })
            })
        })
    }

    /// Every address with its slot, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.ids().map(|id| {
            let (k, v) = &self.slab[id];
            (*k, v)
        })
    }

    /// Keeps the addresses whose slot `keep` accepts; the index is rebuilt
    /// at twice their number (or the minimum), so it shrinks too.
    pub fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) {
        let gone: Vec<usize> = self.ids().filter(|&id| !keep(&self.slab[id].1)).collect();
        if gone.is_empty() {
            return;
        }
        // Their buckets, all found before any is freed (a freed bucket
        // ends the probes through it).
        let buckets: Vec<usize> = gone.iter().map(|&id| self.find(self.slab[id].0).0).collect();
        for (&id, i) in gone.iter().zip(buckets) {
            self.used[id / 64] &= !(1 << (id % 64));
            self.unused.push(id as u32);
            self.index[i].id = EMPTY;
        }
        self.len -= gone.len();
        self.rebuild((self.len * 2).next_power_of_two().max(MIN_BUCKETS));
    }

    fn rebuild(&mut self, buckets: usize) {
        let old = std::mem::replace(&mut self.index, vec![FREE; buckets]);
        self.shift = shift_for(buckets);
        for e in old.into_iter().filter(|e| e.id != EMPTY) {
            let (i, _) = self.find(e.key);
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
        if let (i, true) = self.find(key) {
            let slot = &self.slab[self.index[i].id as usize];
            let bytes = std::mem::size_of::<(u64, V)>();
            let start = slot as *const (u64, V) as *const u8;
            // Every line the slot touches (its start need not be aligned).
            for off in (0..bytes).step_by(64) {
                prefetch(start.wrapping_add(off));
            }
            prefetch(start.wrapping_add(bytes - 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserts_finds_and_forgets() {
        let mut t: Table<u64> = Table::default();
        for a in (0..100_000u64).map(|k| 0x5555_0000_0000 + k * 16) {
            *t.get_or_insert_with(a, || a) += 1;
        }
        assert_eq!(t.len(), 100_000);
        assert_eq!(t.get(0x5555_0000_0010), Some(&0x5555_0000_0011));
        assert_eq!(t.get(0x5555_0000_0018), None);
        t.retain(|v| v % 32 == 1);
        assert_eq!(t.len(), 50_000);
        assert_eq!(t.get(0x5555_0000_0010), None);
        assert_eq!(t.get(0x5555_0000_0020), Some(&0x5555_0000_0021));
        // Slots of forgotten addresses are used again.
        *t.get_or_insert_with(7, || 7) += 0;
        assert_eq!(t.slab.len(), 100_000);
        assert_eq!(t.iter().map(|(a, _)| a).filter(|&a| a == 7).count(), 1);
        assert_eq!(t.iter().count(), 50_001);
    }
}
