//! The heap's slots by address: an open-addressing index (address → slot
//! number, linear probing) over two slabs of slots, small and full, whose
//! cache lines for an address can be fetched ahead of time.
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
    /// [`EMPTY`]: a free bucket; else a slot number, with [`FULL`] set
    /// for the full slab's.
    id: u32,
}

const EMPTY: u32 = u32::MAX;
const FULL: u32 = 1 << 31;
const FREE: Entry = Entry { key: 0, id: EMPTY };
/// Buckets of a new or rebuilt index (a power of two).
const MIN_BUCKETS: usize = 1 << 12;

/// Slots of one type, each with its address, so that walks over all of
/// them ([`Table::iter`], [`Table::retain`]) read memory in order.
struct Slab<V> {
    slots: Vec<(u64, V)>,
    /// One bit per position: in use.
    used: Vec<u64>,
    /// Positions no address uses.
    unused: Vec<u32>,
}

impl<V> Default for Slab<V> {
    fn default() -> Slab<V> {
        Slab { slots: Vec::new(), used: Vec::new(), unused: Vec::new() }
    }
}

impl<V> Slab<V> {
    fn put(&mut self, key: u64, v: V) -> u32 {
        let id = match self.unused.pop() {
            Some(id) => {
                self.slots[id as usize] = (key, v);
                id as usize
            }
            None => {
                self.slots.push((key, v));
                if self.used.len() * 64 < self.slots.len() {
                    self.used.push(0);
                }
                self.slots.len() - 1
            }
        };
        self.used[id / 64] |= 1 << (id % 64);
        id as u32
    }

    fn release(&mut self, id: u32) {
        let id = id as usize;
        self.used[id / 64] &= !(1 << (id % 64));
        self.unused.push(id as u32);
    }

    /// The positions in use, in order.
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
}

/// A slot of either kind.
pub enum Either<S, F> {
    Small(S),
    Full(F),
}

/// The slab and position an index entry's slot number `id` names.
#[inline]
fn place(id: u32) -> Either<usize, usize> {
    if id & FULL != 0 {
        Either::Full((id & !FULL) as usize)
    } else {
        Either::Small(id as usize)
    }
}

/// Where [`Table::find`] found an address: its bucket, and what it holds
/// (valid until the next insertion).
#[derive(Clone, Copy)]
pub struct Found {
    bucket: usize,
    id: u32,
}

impl Found {
    /// The address has a slot of neither kind.
    pub fn vacant(&self) -> bool {
        self.id == EMPTY
    }
}

/// Slots by address (u64), each of one of two types: `S`, small, for
/// the common histories, and `F`, full, for the rest; an address's slot
/// goes from small to full ([`Table::full`]), never back. Slot numbers
/// are 31 bits: two billion addresses kept at once would need far more
/// memory than exists.
pub struct Table<S, F> {
    /// A power of two in length, at most half full.
    index: Vec<Entry>,
    /// 64 − log2(index.len()): the hash is the product's top bits.
    shift: u32,
    len: usize,
    small: Slab<S>,
    full: Slab<F>,
}

impl<S, F> Default for Table<S, F> {
    fn default() -> Table<S, F> {
        Table {
            index: vec![FREE; MIN_BUCKETS],
            shift: shift_for(MIN_BUCKETS),
            len: 0,
            small: Slab::default(),
            full: Slab::default(),
        }
    }
}

fn shift_for(buckets: usize) -> u32 {
    64 - buckets.trailing_zeros()
}

impl<S, F> Table<S, F> {
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
    pub fn at(&mut self, f: Found) -> Option<Either<&mut S, &mut F>> {
        (!f.vacant()).then(|| match place(f.id) {
            Either::Small(i) => Either::Small(&mut self.small.slots[i].1),
            Either::Full(i) => Either::Full(&mut self.full.slots[i].1),
        })
    }

    pub fn get(&self, key: u64) -> Option<Either<&S, &F>> {
        let f = self.find(key);
        (!f.vacant()).then(|| match place(f.id) {
            Either::Small(i) => Either::Small(&self.small.slots[i].1),
            Either::Full(i) => Either::Full(&self.full.slots[i].1),
        })
    }

    /// Gives vacant `f`'s address (`key`) the small slot `s`.
    pub fn insert_small(&mut self, f: Found, key: u64, s: S) {
        let bucket = self.claim(f, key);
        let id = self.small.put(key, s);
        self.index[bucket] = Entry { key, id };
    }

    /// The full slot of `key`: as found by `f`, made from its small slot
    /// by `promote`, or made with `make` if there is none.
    pub fn full(&mut self, f: Found, key: u64, make: impl FnOnce() -> F, promote: impl FnOnce(&S) -> F) -> &mut F {
        let (bucket, id) = match (f.vacant(), place(f.id)) {
            (true, _) => {
                let bucket = self.claim(f, key);
                let id = self.full.put(key, make());
                self.index[bucket] = Entry { key, id: id | FULL };
                (bucket, id)
            }
            (false, Either::Full(i)) => (f.bucket, i as u32),
            (false, Either::Small(i)) => {
                let full = promote(&self.small.slots[i].1);
                self.small.release(i as u32);
                let id = self.full.put(key, full);
                self.index[f.bucket].id = id | FULL;
                (f.bucket, id)
            }
        };
        debug_assert_eq!(self.index[bucket].key, key);
        &mut self.full.slots[id as usize].1
    }

    /// A bucket for a new address: `f`'s, unless the index had to grow.
    fn claim(&mut self, f: Found, key: u64) -> usize {
        debug_assert!(f.vacant());
        self.len += 1;
        if self.len * 2 > self.index.len() {
            self.rebuild(self.index.len() * 2);
            return self.bucket(key).0;
        }
        f.bucket
    }

    /// Every address with its slot, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Either<&S, &F>)> {
        let small = self.small.ids().map(|id| {
            let (k, v) = &self.small.slots[id];
            (*k, Either::Small(v))
        });
        let full = self.full.ids().map(|id| {
            let (k, v) = &self.full.slots[id];
            (*k, Either::Full(v))
        });
        small.chain(full)
    }

    /// Keeps the addresses whose slot `keep` accepts; the index is rebuilt
    /// at twice their number (or the minimum), so it shrinks too.
    pub fn retain(&mut self, mut keep: impl FnMut(Either<&S, &F>) -> bool) {
        let small = self.small.ids().filter(|&id| !keep(Either::Small(&self.small.slots[id].1)));
        let mut gone: Vec<(u64, u32)> = small.map(|id| (self.small.slots[id].0, id as u32)).collect();
        let full = self.full.ids().filter(|&id| !keep(Either::Full(&self.full.slots[id].1)));
        gone.extend(full.map(|id| (self.full.slots[id].0, id as u32 | FULL)));
        if gone.is_empty() {
            return;
        }
        // Their buckets, all found before any is freed (a freed bucket
        // ends the probes through it).
        let buckets: Vec<usize> = gone.iter().map(|&(key, _)| self.bucket(key).0).collect();
        for (&(_, id), i) in gone.iter().zip(buckets) {
            match place(id) {
                Either::Small(p) => self.small.release(p as u32),
                Either::Full(p) => self.full.release(p as u32),
            }
            self.index[i].id = EMPTY;
        }
        self.len -= gone.len();
        self.rebuild((self.len * 2).next_power_of_two().max(MIN_BUCKETS));
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
            match place(f.id) {
                Either::Small(i) => prefetch_lines(&self.small.slots[i]),
                Either::Full(i) => prefetch_lines(&self.full.slots[i]),
            }
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
    fn inserts_finds_promotes_and_forgets() {
        let mut t: Table<u64, (u64, u64)> = Table::default();
        for a in (0..100_000u64).map(|k| 0x5555_0000_0000 + k * 16) {
            let f = t.find(a);
            assert!(f.vacant());
            t.insert_small(f, a, a);
        }
        assert_eq!(t.len(), 100_000);
        assert!(matches!(t.get(0x5555_0000_0010), Some(Either::Small(&0x5555_0000_0010))));
        assert!(t.get(0x5555_0000_0018).is_none());
        // Every fourth address becomes full, keeping its value.
        for a in (0..100_000u64).step_by(4).map(|k| 0x5555_0000_0000 + k * 16) {
            let f = t.find(a);
            t.full(f, a, || unreachable!(), |&s| (s, 1)).1 += 1;
        }
        assert!(matches!(t.get(0x5555_0000_0040), Some(Either::Full(&(0x5555_0000_0040, 2)))));
        // A vacant address made full at once.
        t.full(t.find(7), 7, || (7, 0), |_| unreachable!());
        assert_eq!(t.len(), 100_001);
        assert!(matches!(t.at(t.find(7)), Some(Either::Full(&mut (7, 0)))));
        // Forget the odd small ones and the full one at 0x5555_0000_0000.
        t.retain(|s| match s {
            Either::Small(v) => v % 32 == 0,
            Either::Full(&(v, _)) => v != 0x5555_0000_0000,
        });
        assert_eq!(t.len(), 25_000 + 25_000 + 1 - 1);
        assert!(t.get(0x5555_0000_0000).is_none());
        assert!(t.get(0x5555_0000_0010).is_none());
        assert!(matches!(t.get(0x5555_0000_0020), Some(Either::Small(_))));
        // Slots of forgotten addresses are used again.
        t.insert_small(t.find(9), 9, 9);
        assert_eq!(t.small.slots.len(), 100_000);
        assert_eq!(t.iter().filter(|&(a, _)| a == 9).count(), 1);
        assert_eq!(t.iter().count(), 50_001);
    }
}
