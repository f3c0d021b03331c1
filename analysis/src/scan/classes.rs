//! The scan's verdicts, kept small and in the order the books list their
//! live blocks ([`crate::books::Books::live_blocks`]), which is the order
//! every reader of them walks: the report, the pprof profile and the
//! console read the verdict of the `j`th block at place `j`, with no
//! lookup. 20 bytes a block (its address, 8; its verdict, 8; its place in
//! address order, 4). A hashbrown map of [`Classified`] and the vector it
//! was built from took 101 bytes a block at 5 M blocks; a table by address
//! (`crate::addr_table`) 29 bytes, and its lookups, a cache miss or two
//! each, were a third of reporting 20 M blocks with the scan (issue 43).
//! Addresses and verdicts apart: the addresses are taken over from the
//! marking's (in address order) before the verdicts are made, so that
//! both are never held beside the marking's tables (the report's RSS as
//! the verdicts are made at 20 M blocks: 1,652 -> 1,499 MiB).

use super::{Classified, Heuristic, Kind};

/// A place that stands for no owner.
const NO_OWNER: u32 = u32::MAX;

/// One block's verdict: 8 bytes.
#[derive(Clone, Copy, Default)]
struct Class {
    /// For an indirectly lost block, the place of the definitely lost
    /// block that owns it ([`NO_OWNER`]: none).
    owner: u32,
    /// None: the block at this place was not classified (a mapping, a
    /// pool block, one allocated after the snapshot).
    kind: Option<Kind>,
    via: Option<Heuristic>,
}

/// Every classified block's kind, by its place among the books' live
/// blocks and by address.
#[derive(Default)]
pub struct Classes {
    /// Per place: the block's address (0 where none was classified).
    addrs: Vec<u64>,
    /// Per place: the block's verdict.
    places: Vec<Class>,
    /// The classified blocks' places, in address order.
    sorted: Vec<u32>,
    /// The mappings the scan read as an allocator's own, not roots:
    /// (start, end), sorted.
    pub(super) allocators: Vec<(u64, u64)>,
}

impl Classes {
    /// Room for the verdicts on `places` live blocks (the books' count,
    /// classified or not) of which the marking classified those at
    /// `sorted` (each one's place, in address order), starting at
    /// `starts` (in the same order); none given yet ([`Classes::set`]).
    pub(super) fn new(places: usize, sorted: Vec<u32>, starts: Vec<u64>) -> Classes {
        // (Every place is below `places`, both counted in one walk; a
        // larger one would only lengthen the table, never index past it.)
        let places = places.max(sorted.iter().map(|&p| p as usize + 1).max().unwrap_or(0));
        let mut addrs = vec![0; places];
        for (&p, &a) in sorted.iter().zip(&starts) {
            addrs[p as usize] = a;
        }
        drop(starts);
        let places = vec![Class { owner: NO_OWNER, kind: None, via: None }; places];
        Classes { addrs, places, sorted, allocators: Vec::new() }
    }

    /// The `i`th classified block in address order is of `kind`, reached
    /// through `via` if a heuristic's.
    pub(super) fn set(&mut self, i: usize, kind: Kind, via: Option<Heuristic>) {
        if let Some(&p) = self.sorted.get(i) {
            let c = &mut self.places[p as usize];
            (c.kind, c.via) = (Some(kind), via);
        }
    }

    /// The `i`th classified block in address order is owned by the
    /// `owner`th (an indirectly lost block by its group's definitely lost
    /// one).
    pub(super) fn set_owner(&mut self, i: usize, owner: usize) {
        if let (Some(&of), Some(&o)) = (self.sorted.get(i), self.sorted.get(owner)) {
            self.places[of as usize].owner = o;
        }
    }

    /// The verdict on the block starting at `addr`, if it was classified
    /// (a binary search: use [`Classes::at`] while walking the books).
    pub fn get(&self, addr: u64) -> Option<Classified> {
        let k = self.sorted.partition_point(|&p| self.addrs[p as usize] < addr);
        let &p = self.sorted.get(k)?;
        (self.addrs[p as usize] == addr).then(|| self.classified(p)).flatten()
    }

    /// The verdict on the books' `place`th live block, at `addr`: read at
    /// its place, or looked up by address when the books changed since.
    #[inline]
    pub fn at(&self, place: usize, addr: u64) -> Option<Classified> {
        match (self.addrs.get(place), self.places.get(place)) {
            (Some(&a), Some(c)) if a == addr && c.kind.is_some() => self.classified(place as u32),
            _ => self.get(addr),
        }
    }

    /// Every verdict, by address.
    pub fn iter(&self) -> impl Iterator<Item = Classified> + '_ {
        self.sorted.iter().filter_map(|&p| self.classified(p))
    }

    /// Whether the mapping at `addr` is one the scan read as an
    /// allocator's own (not a root): `addr` its start.
    pub fn allocators_mapping(&self, addr: u64) -> bool {
        let i = self.allocators.partition_point(|m| m.0 < addr);
        self.allocators.get(i).is_some_and(|m| m.0 == addr)
    }

    /// How many blocks were classified.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    fn classified(&self, place: u32) -> Option<Classified> {
        let (addr, c) = (self.addrs[place as usize], self.places[place as usize]);
        let owner = (c.owner != NO_OWNER).then(|| self.addrs[c.owner as usize]);
        Some(Classified { addr, kind: c.kind?, owner, via: c.via })
    }

    /// Verdicts given by address, each block at a place of its own (for
    /// tests of the readers: every read is then by address).
    #[cfg(test)]
    pub fn from_verdicts(verdicts: &[Classified]) -> Classes {
        let mut sorted: Vec<&Classified> = verdicts.iter().collect();
        sorted.sort_by_key(|c| c.addr);
        let places = (0..sorted.len() as u32).collect();
        let mut c = Classes::new(sorted.len(), places, sorted.iter().map(|v| v.addr).collect());
        for (i, v) in sorted.iter().enumerate() {
            c.set(i, v.kind, v.via);
        }
        for (i, v) in sorted.iter().enumerate() {
            if let Some(o) = v.owner.and_then(|o| sorted.iter().position(|w| w.addr == o)) {
                c.set_owner(i, o);
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_by_place_and_by_address_with_their_owners() {
        // Three live blocks listed by the books in the order 0x30, 0x10,
        // 0x20, and a fourth (a mapping) at place 3, not classified.
        let verdicts = [(0x10, Kind::Definite, None), (0x20, Kind::Indirect, None), (0x30, Kind::Reachable, None)];
        let mut c = Classes::new(4, vec![1, 2, 0], verdicts.iter().map(|v| v.0).collect());
        for (i, &(_, kind, via)) in verdicts.iter().enumerate() {
            c.set(i, kind, via);
        }
        c.set_owner(1, 0);
        let got = c.at(2, 0x20).unwrap();
        assert_eq!((got.addr, got.kind, got.owner), (0x20, Kind::Indirect, Some(0x10)));
        assert_eq!(c.get(0x20).map(|c| c.owner), Some(Some(0x10)));
        // A place that moved: found by address.
        assert_eq!(c.at(0, 0x10).map(|c| c.kind), Some(Kind::Definite));
        assert!(c.at(3, 0x40).is_none() && c.get(0x18).is_none() && c.get(0x40).is_none());
        assert_eq!(c.iter().map(|c| c.addr).collect::<Vec<_>>(), [0x10, 0x20, 0x30]);
        assert_eq!(std::mem::size_of::<Class>(), 8);
        let d = Classes::from_verdicts(&[
            Classified { addr: 0x50, kind: Kind::Indirect, owner: Some(0x40), via: None },
            Classified { addr: 0x40, kind: Kind::Definite, owner: None, via: None },
        ]);
        assert_eq!(d.get(0x50).map(|c| c.owner), Some(Some(0x40)));
    }
}
