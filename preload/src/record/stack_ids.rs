//! A thread's backtraces and the stream ids it defined them under.

use std::hash::BuildHasher;

use rustc_hash::FxBuildHasher;

/// Backtrace (return addresses, innermost first) → id, each with its
/// frames' hash: the table's growth moves entries by the kept hash, where
/// a map keyed by the frames hashed every backtrace's frames again (4% of
/// Chromium's time under the preload, whose backtraces are 37 frames
/// deep on average).
#[derive(Default)]
pub struct StackIds {
    table: hashbrown::HashTable<(Box<[u64]>, u32, u64)>,
}

impl StackIds {
    /// The id of `frames`: the one it was given before, or `new_id()`,
    /// given to it and passed to `define` with the frames (the caller puts
    /// the definition into the stream).
    #[inline]
    pub fn intern(&mut self, frames: &[u64], new_id: impl FnOnce() -> u32, define: impl FnOnce(u32, &[u64])) -> u32 {
        let hash = FxBuildHasher.hash_one(frames);
        // A lookup first: the hit, by far the common case, then makes no
        // room for an insertion.
        if let Some((_, id, _)) = self.table.find(hash, |(f, _, h)| *h == hash && **f == *frames) {
            return *id;
        }
        let id = new_id();
        self.table.insert_unique(hash, (frames.into(), id, hash), |(_, _, h)| *h);
        define(id, frames);
        id
    }

    /// Forgets every backtrace (a forked child's stream starts over).
    pub fn clear(&mut self) {
        self.table.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::StackIds;

    #[test]
    fn ids_by_content_through_growth() {
        let mut s = StackIds::default();
        let mut next = 0;
        let mut defined = Vec::new();
        let mut intern = |s: &mut StackIds, f: &[u64], defined: &mut Vec<u32>| {
            s.intern(
                f,
                || {
                    next += 1;
                    next
                },
                |id, _| defined.push(id),
            )
        };
        for i in 0..10_000u64 {
            assert_eq!(intern(&mut s, &[i, i + 1, 7], &mut defined), i as u32 + 1);
        }
        for i in (0..10_000u64).rev() {
            assert_eq!(intern(&mut s, &[i, i + 1, 7], &mut defined), i as u32 + 1);
        }
        assert_eq!(defined.len(), 10_000);
        s.clear();
        assert_eq!(intern(&mut s, &[0, 1, 7], &mut defined), 10_001);
    }
}
