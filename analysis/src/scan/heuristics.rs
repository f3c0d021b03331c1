//! memcheck's leak-check heuristics: an interior pointer that matches one
//! of these patterns makes its block still reachable, not possibly lost
//! (valgrind manual, "Leak detection", `--leak-check-heuristics`; valgrind
//! runs with all four since 3.11). W is the target's pointer size.
//!
//! - **stdstring**: the pointer is 3 W into the block, the block's second
//!   word (capacity) is its size − 3 W − 1, and its first (length) is at
//!   most the capacity: the character data of libstdc++'s pre-C++11
//!   (copy-on-write) `std::string`.
//! - **length64**: the pointer is 8 bytes in, and the block's first 8 bytes
//!   hold its size − 8, not 0 (sqlite's allocator keeps sizes so).
//! - **newarray**: the pointer is W in, and the first word is a count n > 0
//!   that divides the size − W (`new T[n]` for a T with a destructor).
//! - **multipleinheritance**: the pointer is aligned, and both the word it
//!   points to and the block's first word point to vtables (a secondary
//!   base's part of an object): an address in a module's readable data
//!   where, among the next 20 words, at least 2 are not 0, and every word
//!   before the second such is a pointer into a module's executable code.
//!
//! The first that matches, in this order, is the one counted.

use serde::Serialize;

use super::{Memory, Total};

/// One heuristic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heuristic {
    /// `stdstring`: a pointer to the characters of a `std::string`.
    StdString,
    /// `length64`: a pointer 8 bytes into a block that starts with its length.
    Length64,
    /// `newarray`: a pointer 8 bytes into a `new[]` block that starts with its element count.
    NewArray,
    /// `multipleinheritance`: a pointer to a second base class's vtable pointer.
    MultipleInheritance,
}

impl Heuristic {
    /// The four, in memcheck's order.
    pub const ALL: [Heuristic; 4] =
        [Heuristic::StdString, Heuristic::Length64, Heuristic::NewArray, Heuristic::MultipleInheritance];

    /// memcheck's name.
    pub fn name(self) -> &'static str {
        match self {
            Heuristic::StdString => "stdstring",
            Heuristic::Length64 => "length64",
            Heuristic::NewArray => "newarray",
            Heuristic::MultipleInheritance => "multipleinheritance",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of heuristics: `--leak-check-heuristics=all|none|NAME,…` (all by
/// default, as memcheck's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heuristics(u8);

impl Default for Heuristics {
    fn default() -> Heuristics {
        Heuristics::ALL
    }
}

impl Heuristics {
    /// Every heuristic (memcheck's default for `--leak-check-heuristics`).
    pub const ALL: Heuristics = Heuristics(0b1111);
    /// None.
    pub const NONE: Heuristics = Heuristics(0);

    /// Whether `h` is in the set.
    pub fn has(self, h: Heuristic) -> bool {
        self.0 & h.bit() != 0
    }

    /// Parses `all`, `none` or a comma-separated list of names.
    pub fn parse(s: &str) -> Result<Heuristics, String> {
        match s.trim() {
            "all" => return Ok(Heuristics::ALL),
            "none" => return Ok(Heuristics::NONE),
            _ => {}
        }
        let mut set = 0;
        for w in s.split(',').map(str::trim) {
            let h = Heuristic::ALL.into_iter().find(|h| h.name() == w).ok_or_else(|| {
                format!("unknown heuristic {w:?} (stdstring, length64, newarray, multipleinheritance, all, none)")
            })?;
            set |= h.bit();
        }
        Ok(Heuristics(set))
    }
}

/// Bytes and blocks each heuristic made still reachable (memcheck's "of
/// which reachable via heuristic").
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ViaHeuristic {
    /// Blocks reached through `stdstring`.
    pub stdstring: Total,
    /// Through `length64`.
    pub length64: Total,
    /// Through `newarray`.
    pub newarray: Total,
    /// Through `multipleinheritance`.
    pub multipleinheritance: Total,
}

impl ViaHeuristic {
    /// The total of `h`, to add to.
    pub fn get_mut(&mut self, h: Heuristic) -> &mut Total {
        match h {
            Heuristic::StdString => &mut self.stdstring,
            Heuristic::Length64 => &mut self.length64,
            Heuristic::NewArray => &mut self.newarray,
            Heuristic::MultipleInheritance => &mut self.multipleinheritance,
        }
    }

    /// The total of `h`.
    pub fn get(&self, h: Heuristic) -> Total {
        match h {
            Heuristic::StdString => self.stdstring,
            Heuristic::Length64 => self.length64,
            Heuristic::NewArray => self.newarray,
            Heuristic::MultipleInheritance => self.multipleinheritance,
        }
    }
}

/// The modules' segments: what is code and what is a module's data.
pub(super) struct Segments {
    /// (start, end, ELF flags: 1 executable, 4 readable), sorted.
    spans: Vec<(u64, u64, u32)>,
}

impl Segments {
    pub(super) fn of(modules: &[crate::trace::ModuleSeen]) -> Segments {
        let mut spans: Vec<(u64, u64, u32)> = modules
            .iter()
            .flat_map(|m| {
                let bias = m.module.bias;
                m.module.segments.iter().map(move |s| (bias + s.vaddr, bias + s.vaddr + s.memsz, s.flags))
            })
            .collect();
        spans.sort_unstable();
        Segments { spans }
    }

    fn flags(&self, a: u64) -> u32 {
        let i = self.spans.partition_point(|s| s.0 <= a);
        match i.checked_sub(1).map(|i| self.spans[i]) {
            Some((_, hi, f)) if a < hi => f,
            _ => 0,
        }
    }

    /// Whether `a` looks like a vtable's address (module doc).
    fn is_vtable(&self, mem: &Memory, a: u64) -> bool {
        let w = mem.word.size as u64;
        if !a.is_multiple_of(w) || a < 4096 || self.flags(a) & 4 == 0 {
            return false;
        }
        let mut functions = 0;
        for i in 0..20 {
            match mem.word_at(a + i * w) {
                Some(0) => {}
                Some(f) if self.flags(f) & 1 != 0 => {
                    functions += 1;
                    if functions == 2 {
                        return true;
                    }
                }
                _ => return false,
            }
        }
        false
    }
}

/// The heuristic in `set` that makes interior pointer `p` into the block
/// `[start, start + size)` count as a pointer to its start, if any.
pub(super) fn matching(
    set: Heuristics,
    p: u64,
    start: u64,
    size: u64,
    mem: &Memory,
    seg: &Segments,
) -> Option<Heuristic> {
    let w = mem.word.size as u64;
    let word = |a: u64| mem.word_at(a);
    if set.has(Heuristic::StdString) && p == start + 3 * w {
        if let (Some(len), Some(cap)) = (word(start), word(start + w)) {
            if 3 * w + cap.wrapping_add(1) == size && len <= cap {
                return Some(Heuristic::StdString);
            }
        }
    }
    if set.has(Heuristic::Length64) && p == start + 8 {
        if let Some(n) = mem.u64_at(start) {
            if n > 0 && size.checked_sub(8) == Some(n) {
                return Some(Heuristic::Length64);
            }
        }
    }
    if set.has(Heuristic::NewArray) && p == start + w {
        if let Some(n) = word(start) {
            if n > 0 && size >= w && (size - w).is_multiple_of(n) {
                return Some(Heuristic::NewArray);
            }
        }
    }
    if set.has(Heuristic::MultipleInheritance) && p.is_multiple_of(w) {
        if let (Some(inner), Some(first)) = (word(p), word(start)) {
            if seg.is_vtable(mem, inner) && seg.is_vtable(mem, first) {
                return Some(Heuristic::MultipleInheritance);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_memchecks_names() {
        assert_eq!(Heuristics::parse("all"), Ok(Heuristics::ALL));
        assert_eq!(Heuristics::parse("none"), Ok(Heuristics::NONE));
        let s = Heuristics::parse("stdstring,newarray").unwrap();
        assert!(s.has(Heuristic::StdString) && s.has(Heuristic::NewArray));
        assert!(!s.has(Heuristic::Length64) && !s.has(Heuristic::MultipleInheritance));
        assert!(Heuristics::parse("stdstring,cow").unwrap_err().contains("\"cow\""));
    }
}
