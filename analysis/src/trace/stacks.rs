//! Backtraces as the books keep them: deduplicated by content, looked up
//! by the stream's ids.

use std::hash::BuildHasher;

use hashbrown::hash_table::Entry;
// FxHash as in books.rs.
use rustc_hash::{FxBuildHasher, FxHashMap as HashMap};

/// Backtraces, deduplicated by content: producers may define the same frames
/// under several ids (one per thread); reports group by content.
#[derive(Default)]
pub struct Stacks {
    /// Canonical index → frames (return addresses, innermost first).
    pub frames: Vec<Vec<u64>>,
    /// Canonical index → time (ns) of the first definition, to pick the
    /// module that was mapped at an address then.
    pub def_time: Vec<u64>,
    /// Canonical indices by their frames, which stay in `frames` only (a
    /// map keyed by a copy of them held each backtrace twice: 24 MB on
    /// cc1plus's trace), each with its frames' hash ([`frames_hash`]): the
    /// table's growth rehashed every backtrace's frames from `frames`,
    /// 16% of the report of Chromium's browser process.
    by_frames: hashbrown::HashTable<(u32, u32)>,
    /// Stream id → canonical index + 1 (0: not defined), for ids below
    /// [`DENSE_IDS`]: producers number backtraces from 1 up, and this is
    /// looked up once an event (a hash lookup was 1.3% of a report).
    by_id: Vec<u32>,
    /// The same for larger ids.
    by_far_id: HashMap<u32, u32>,
    /// (canonical backtrace, pool) → the canonical index used for that
    /// pool's blocks, so that pools never share an entry with the heap.
    by_pool: HashMap<(u32, u32), u32>,
    /// Canonical index → pool id, for the indices made by [`Stacks::for_pool`].
    pub pool_of: HashMap<u32, u32>,
    /// Stream ids (not 0, "none") used before any definition: the events
    /// that used them got an empty backtrace (a producer's fault).
    pub undefined: u32,
}

impl Stacks {
    /// Defines stream id `id` as backtrace `frames` (return addresses, innermost first), first seen at `time` (ns).
    pub fn define(&mut self, id: u32, frames: Vec<u64>, time: u64) {
        let h = frames_hash(&frames);
        let all = &mut self.frames;
        let found =
            self.by_frames.entry(widen(h), |&(c, ch)| ch == h && all[c as usize] == frames, |&(_, ch)| widen(ch));
        let canon = match found {
            Entry::Occupied(e) => e.get().0,
            Entry::Vacant(e) => {
                let c = all.len() as u32;
                e.insert((c, h));
                all.push(frames);
                self.def_time.push(time);
                c
            }
        };
        match self.by_id.get_mut(id as usize) {
            Some(c) => *c = canon + 1,
            None if id < DENSE_IDS => {
                self.by_id.resize((id as usize + 1).next_power_of_two(), 0);
                self.by_id[id as usize] = canon + 1;
            }
            None => {
                self.by_far_id.insert(id, canon);
            }
        }
    }

    /// The canonical index for blocks of `pool` allocated at backtrace `canon`.
    pub fn for_pool(&mut self, canon: u32, pool: u32) -> u32 {
        if let Some(&c) = self.by_pool.get(&(canon, pool)) {
            return c;
        }
        let c = self.frames.len() as u32;
        self.frames.push(self.frames[canon as usize].clone());
        self.def_time.push(self.def_time[canon as usize]);
        self.by_pool.insert((canon, pool), c);
        self.pool_of.insert(c, pool);
        c
    }

    /// Every stream id defined, with its canonical index (a checkpoint
    /// defines them all again: later records use them).
    pub fn ids(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let dense = self.by_id.iter().enumerate().filter(|(_, &c)| c != 0).map(|(i, &c)| (i as u32, c - 1));
        dense.chain(self.by_far_id.iter().map(|(&i, &c)| (i, c)))
    }

    /// The indices [`Stacks::for_pool`] made: ((canonical backtrace, pool), index).
    pub fn pool_copies(&self) -> impl Iterator<Item = ((u32, u32), u32)> + '_ {
        self.by_pool.iter().map(|(&k, &c)| (k, c))
    }

    /// Canonical index of stream id `id`; an id never defined (its
    /// definition was lost) maps to an empty backtrace.
    #[inline]
    pub fn canon(&mut self, id: u32) -> u32 {
        match self.by_id.get(id as usize) {
            Some(&c) if c != 0 => c - 1,
            _ => self.canon_slow(id),
        }
    }

    fn canon_slow(&mut self, id: u32) -> u32 {
        if let Some(&c) = self.by_far_id.get(&id) {
            return c;
        }
        if id != 0 {
            self.undefined += 1;
        }
        self.define(id, Vec::new(), 0);
        self.canon(id)
    }
}

/// 32 bits of FxHash of `frames`, kept beside each canonical index.
fn frames_hash(frames: &[u64]) -> u32 {
    let h = FxBuildHasher.hash_one(frames);
    (h ^ (h >> 32)) as u32
}

/// A kept 32-bit hash as the table's: its bits both where hashbrown picks
/// the bucket (low) and where it takes the tag (the top 7).
fn widen(h: u32) -> u64 {
    (u64::from(h) << 32) | u64::from(h)
}

/// Stream ids of backtraces below this are kept in [`Stacks`]'s vector
/// (4 bytes each); a corrupt stream's huge ids go to a map.
const DENSE_IDS: u32 = 1 << 24;

#[cfg(test)]
mod tests {
    use super::Stacks;

    #[test]
    fn stacks_share_an_index_by_content() {
        let mut s = Stacks::default();
        s.define(1, vec![0x10, 0x20], 5);
        s.define(2, vec![0x10, 0x30], 6);
        // Another thread's id for the first backtrace.
        s.define(7, vec![0x10, 0x20], 9);
        assert_eq!((s.canon(1), s.canon(2), s.canon(7)), (0, 1, 0));
        assert_eq!(s.def_time, [5, 6]);
        // A pool's copy is an index of its own, never found by content.
        let p = s.for_pool(0, 3);
        assert_eq!((p, &s.frames[2][..]), (2, &[0x10, 0x20][..]));
        s.define(8, vec![0x10, 0x20], 10);
        assert_eq!(s.canon(8), 0);
        // Many more, so that the table grows and rehashes from `frames`.
        for i in 0..10_000u64 {
            s.define(100 + i as u32, vec![i, i + 1], 0);
        }
        for i in 0..10_000u64 {
            s.define(20_000 + i as u32, vec![i, i + 1], 0);
            assert_eq!(s.canon(20_000 + i as u32), s.canon(100 + i as u32));
        }
        assert_eq!(s.frames.len(), 3 + 10_000);
        // An id never defined: an empty backtrace.
        let none = s.canon(99);
        assert!(s.frames[none as usize].is_empty());
        // Counted once (then it is defined, empty); 0 is "no backtrace".
        s.canon(99);
        s.canon(0);
        assert_eq!(s.undefined, 1);
    }
}
