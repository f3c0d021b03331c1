//! A thread's cache of unwind rules by code address: direct-mapped, so a
//! hit is one multiply-free index, one compare and a copy; it grows for
//! programs with many call sites.
//!
//! Rules depend only on the code at an address, so entries stay right
//! until the module set changes; the owner clears the cache then.

use super::cfi::Rule;

/// Entries at first; a power of two. 2,048 × 24 bytes = 48 KiB per
/// thread, enough for the call sites most programs allocate from.
const SLOTS: usize = 2048;
/// Most entries: 65,536 × 24 bytes = 1.5 MiB. cc1plus allocates from tens
/// of thousands of call sites; with 2,048 entries, looking rules up again
/// in the CFI was 6% of its time under the preload, and 32,768 entries
/// took it from 3.77 to 3.52 s (1.6x to 1.5x native).
const MAX_SLOTS: usize = 1 << 16;

#[derive(Clone, Copy)]
struct Entry {
    /// The lookup address (0: empty; no code lives at address 0).
    addr: u64,
    rule: Rule,
}

const EMPTY: Entry = Entry { addr: 0, rule: Rule::Other };

pub struct RuleCache {
    entries: Box<[Entry]>,
    /// Misses since the cache last grew.
    misses: usize,
}

impl RuleCache {
    pub fn new() -> RuleCache {
        RuleCache { entries: vec![EMPTY; SLOTS].into_boxed_slice(), misses: 0 }
    }

    #[inline(always)]
    fn slot(&self, addr: u64) -> usize {
        ((addr ^ (addr >> 11)) as usize) & (self.entries.len() - 1)
    }

    /// The cached rule for `addr`, if any.
    #[inline(always)]
    pub fn get(&self, addr: u64) -> Option<Rule> {
        let e = &self.entries[self.slot(addr)];
        (e.addr == addr).then_some(e.rule)
    }

    /// Keeps `rule` for `addr` (after a miss). A cache that misses more
    /// than four times its size grows fourfold (up to [`MAX_SLOTS`]): the
    /// first misses fill it, more mean the program's call sites do not
    /// fit. It starts empty again.
    pub fn insert(&mut self, addr: u64, rule: Rule) {
        self.misses += 1;
        let len = self.entries.len();
        if self.misses > 4 * len && len < MAX_SLOTS {
            self.entries = vec![EMPTY; len * 4].into_boxed_slice();
            self.misses = 0;
        }
        let i = self.slot(addr);
        self.entries[i] = Entry { addr, rule };
    }

    /// Forgets every rule (the module set changed).
    pub fn clear(&mut self) {
        self.entries.fill(EMPTY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_replaces_and_clears() {
        let mut c = RuleCache::new();
        let r = Rule::Cfa { from_bp: false, cfa_off: 16, bp_off: 0 };
        assert_eq!(c.get(0x401234), None);
        c.insert(0x401234, r);
        assert_eq!(c.get(0x401234), Some(r));
        // Same slot, other address: replaces.
        let other = (1..).map(|k| 0x401234 + k).find(|&a| c.slot(a) == c.slot(0x401234)).unwrap();
        c.insert(other, Rule::End);
        assert_eq!(c.get(0x401234), None);
        assert_eq!(c.get(other), Some(Rule::End));
        c.clear();
        assert_eq!(c.get(other), None);
    }

    #[test]
    fn grows_when_call_sites_do_not_fit() {
        let mut c = RuleCache::new();
        // Twice as many call sites as slots, missed again and again: it grows.
        let sites = |k: u64| 0x40_0000 + k * 8;
        for round in 0..5 {
            for k in 0..2 * SLOTS as u64 {
                if c.get(sites(k)).is_none() {
                    c.insert(sites(k), Rule::End);
                }
            }
            if round == 0 {
                assert_eq!(c.entries.len(), SLOTS);
            }
        }
        assert_eq!(c.entries.len(), SLOTS * 4);
        // A few call sites never make it grow.
        let mut small = RuleCache::new();
        for _ in 0..100 {
            for k in 0..64 {
                if small.get(sites(k)).is_none() {
                    small.insert(sites(k), Rule::End);
                }
            }
        }
        assert_eq!(small.entries.len(), SLOTS);
    }
}
