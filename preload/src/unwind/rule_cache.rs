//! A thread's cache of unwind rules by code address: direct-mapped, so a
//! hit is one multiply-free index, one compare and a copy.
//!
//! Rules depend only on the code at an address, so entries stay right
//! until the module set changes; the owner clears the cache then.

use super::cfi::Rule;

/// Entries; a power of two. 2,048 × 24 bytes = 48 KiB per thread, enough
/// for the call sites a program allocates from most often.
const SLOTS: usize = 2048;

#[derive(Clone, Copy)]
struct Entry {
    /// The lookup address (0: empty; no code lives at address 0).
    addr: u64,
    rule: Rule,
}

pub struct RuleCache {
    entries: Box<[Entry]>,
}

impl RuleCache {
    pub fn new() -> RuleCache {
        RuleCache { entries: vec![Entry { addr: 0, rule: Rule::Other }; SLOTS].into_boxed_slice() }
    }

    #[inline(always)]
    fn slot(addr: u64) -> usize {
        ((addr ^ (addr >> 11)) as usize) & (SLOTS - 1)
    }

    /// The cached rule for `addr`, if any.
    #[inline(always)]
    pub fn get(&self, addr: u64) -> Option<Rule> {
        let e = &self.entries[Self::slot(addr)];
        (e.addr == addr).then_some(e.rule)
    }

    pub fn insert(&mut self, addr: u64, rule: Rule) {
        self.entries[Self::slot(addr)] = Entry { addr, rule };
    }

    /// Forgets every rule (the module set changed).
    pub fn clear(&mut self) {
        self.entries.fill(Entry { addr: 0, rule: Rule::Other });
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
        let other = (1..).map(|k| 0x401234 + k).find(|&a| RuleCache::slot(a) == RuleCache::slot(0x401234)).unwrap();
        c.insert(other, Rule::End);
        assert_eq!(c.get(0x401234), None);
        assert_eq!(c.get(other), Some(Rule::End));
        c.clear();
        assert_eq!(c.get(other), None);
    }
}
