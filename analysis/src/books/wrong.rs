//! Wrong frees: mismatched, double and invalid frees, as valgrind
//! memcheck reports them ("Mismatched free() / delete / delete []",
//! "Invalid free() / delete / delete[] / realloc()"), found while the
//! frees are entered into the books.
//!
//! - **Mismatched**: the free's family is not the allocation's. The pairs
//!   follow memcheck's allocation kinds: malloc, calloc, realloc,
//!   reallocarray and the aligned family (posix_memalign, aligned_alloc,
//!   memalign, valloc, pvalloc) go with free and realloc; `new` with
//!   `delete`; `new[]` with `delete[]`. The aligned and nothrow variants of
//!   `new` and `delete` are one family each.
//! - **Size and alignment mismatches** (memcheck 3.22's "Mismatched
//!   new/delete size value" and "… alignment", ASan's
//!   new-delete-type-mismatch): of the right family, a sized deallocation
//!   told a size that is not the block's (C++'s sized `delete`, C23's
//!   `free_sized`), or an `operator delete` told another alignment than
//!   its `new` was asked for (an aligned delete of a plain new's block, a
//!   plain one of an aligned new's). Counted with the mismatched frees.
//! - **Double free**: a free that follows a free of the same address with
//!   no allocation in between (also the free half of a realloc).
//! - **Invalid free**: a free of an address the stream never saw
//!   allocated, while the stream holds every block of the process
//!   ([`mtrace_format::Record::Coverage`]); otherwise such a free is of a
//!   block allocated before tracing (attach, `MTRACE_START=off`, a forked
//!   child's inherited blocks) and only counted.
//!
//! Each is final when its free is entered: the books see the events of an
//! address in the order they happened (`super::ties`).

use mtrace_format::Family;
use rustc_hash::FxHashMap as HashMap;
use serde::Serialize;

use super::Block;

/// How a deallocation went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WrongKind {
    /// Freed through another family than the one that allocated it.
    Mismatched,
    /// Freed again with no allocation at its address since.
    DoubleFree,
    /// Not the start of a block the stream knows, while it knows them all.
    InvalidFree,
    /// A sized deallocation (C++'s sized `operator delete`, C23's
    /// `free_sized`) told a size that is not the block's (valgrind 3.22's
    /// "Mismatched new/delete size value"; ASan's new-delete-type-mismatch).
    SizeMismatch,
    /// An aligned `operator delete` of a block from a plain `new`, a plain
    /// one of an aligned `new`'s block, or one told another alignment
    /// (valgrind 3.22's "Mismatched new/delete alignment").
    AlignMismatch,
}

impl WrongKind {
    /// memcheck's heading of the error.
    pub fn heading(self) -> &'static str {
        match self {
            WrongKind::Mismatched => "Mismatched free() / delete / delete []",
            WrongKind::DoubleFree | WrongKind::InvalidFree => "Invalid free() / delete / delete[] / realloc()",
            WrongKind::SizeMismatch => "Mismatched new/delete size value",
            WrongKind::AlignMismatch => "Mismatched new/delete alignment",
        }
    }

    /// A mismatch of some kind (family, size or alignment), counted with
    /// the mismatched frees; the others are double and invalid frees.
    pub fn is_mismatch(self) -> bool {
        matches!(self, WrongKind::Mismatched | WrongKind::SizeMismatch | WrongKind::AlignMismatch)
    }

    /// Short name, as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            WrongKind::Mismatched => "mismatched",
            WrongKind::DoubleFree => "double free",
            WrongKind::InvalidFree => "invalid free",
            WrongKind::SizeMismatch => "size mismatch",
            WrongKind::AlignMismatch => "alignment mismatch",
        }
    }
}

/// A deallocation as the books receive it.
#[derive(Clone, Copy, Debug)]
pub struct Dealloc {
    /// The deallocating family: `Malloc` (free, cfree, realloc), `New`
    /// (delete), `NewArray` (delete[]), `Pool` (never judged).
    pub family: Family,
    /// The free's canonical backtrace, when frees record theirs.
    pub stack: Option<u32>,
    /// The free half of a realloc.
    pub realloc: bool,
    /// What a sized deallocation was told of the block's size, bytes (0:
    /// not a sized one).
    pub size: u64,
    /// What an aligned `operator delete` was told of the block's alignment,
    /// bytes (0: not an aligned one).
    pub align: u64,
}

impl Dealloc {
    /// A `free()` without backtrace.
    pub fn free() -> Dealloc {
        Dealloc { family: Family::Malloc, stack: None, realloc: false, size: 0, align: 0 }
    }

    /// A deallocation of `family` with backtrace `stack`, told nothing.
    pub fn of(family: Family, stack: Option<u32>) -> Dealloc {
        Dealloc { family, stack, realloc: false, size: 0, align: 0 }
    }

    /// The function called, as memcheck names it (C23's sized free as
    /// `free_sized`).
    pub fn call_name(&self) -> &'static str {
        match (self.realloc, self.family) {
            (true, _) => "realloc",
            (false, Family::New) => "delete",
            (false, Family::NewArray) => "delete[]",
            (false, Family::Malloc | Family::Aligned) if self.size != 0 => "free_sized",
            _ => "free",
        }
    }
}

/// An alignment (bytes, 0 for none) as a block keeps it: 0 for none, 1 +
/// its base-2 logarithm for a power of two, 255 for any other value.
pub fn align_code(align: u64) -> u8 {
    match align {
        0 => 0,
        a if a.is_power_of_two() => 1 + a.trailing_zeros() as u8,
        _ => 255,
    }
}

/// An alignment kept by [`align_code`], in bytes (0: none; `u64::MAX`:
/// not a power of two).
pub fn align_of_code(code: u8) -> u64 {
    match code {
        0 => 0,
        255 => u64::MAX,
        c => 1 << (c - 1),
    }
}

/// What is wrong with freeing block `b` by `d`, of the right family, in
/// what `d` was told of it: a size that is not the block's (C++'s sized
/// delete, C23's `free_sized`), or an alignment that is not the one its
/// `operator new` was asked for (an aligned delete of a plain new's block
/// or the reverse); `None` when nothing is (or `d` was told nothing).
pub fn misdescribed(b: &Block, d: &Dealloc) -> Option<WrongKind> {
    let judged = matches!(b.family, Family::Malloc | Family::Aligned | Family::New | Family::NewArray);
    if !judged || d.realloc {
        return None;
    }
    if d.size != 0 && d.size != b.size {
        return Some(WrongKind::SizeMismatch);
    }
    let cxx = |f: Family| matches!(f, Family::New | Family::NewArray);
    (cxx(b.family) && cxx(d.family) && align_code(d.align) != b.align).then_some(WrongKind::AlignMismatch)
}

/// Whether freeing a block of family `alloc` with `free` is a mismatch.
pub fn mismatched(alloc: Family, free: Family) -> bool {
    match alloc {
        Family::Malloc | Family::Aligned => matches!(free, Family::New | Family::NewArray),
        Family::New => matches!(free, Family::Malloc | Family::NewArray),
        Family::NewArray => matches!(free, Family::Malloc | Family::New),
        // Blocks glibc made inside a hook, pools, mappings: not judged.
        Family::Internal | Family::Pool | Family::Mmap => false,
        // Only a free's family, never a block's.
        Family::Shared => false,
    }
}

/// The block a wrong free concerns: the one allocated at its address
/// (mismatched, double free), or the one its address points into (invalid
/// free).
#[derive(Clone, Debug)]
pub struct Concerned {
    /// The block's start.
    pub addr: u64,
    /// The block as it was allocated.
    pub block: Block,
    /// It had been freed already.
    pub freed: bool,
}

/// One wrong free.
#[derive(Clone, Debug)]
pub struct WrongFree {
    /// Double, invalid or mismatched.
    pub kind: WrongKind,
    /// The call that freed.
    pub call: Dealloc,
    /// The address freed.
    pub addr: u64,
    /// When, ns since the start.
    pub time: u64,
    /// The block the address falls in, if the trace knows one.
    pub block: Option<Concerned>,
    /// Double free: the backtrace of the free before it, when recorded.
    pub first_free: Option<u32>,
}

/// What groups wrong frees into one report entry: kind, call, the
/// allocating backtrace, the freeing one, the first free's.
pub type GroupKey = (WrongKind, &'static str, Option<u32>, Option<u32>, Option<u32>);

/// The key of `w`.
pub fn key(w: &WrongFree) -> GroupKey {
    (w.kind, w.call.call_name(), w.block.as_ref().map(|c| c.block.stack), w.call.stack, w.first_free)
}

/// Mismatched frees, grouped as they are found (they are final at once; a
/// program may make millions): the first of each group and the count.
#[derive(Default)]
pub struct Mismatches {
    groups: HashMap<GroupKey, (WrongFree, u64)>,
}

impl Mismatches {
    /// Adds one mismatched free: counted in the group of the first one
    /// with the same [`key`] (kind, call, the backtraces involved).
    pub fn add(&mut self, w: WrongFree) {
        self.groups.entry(key(&w)).or_insert_with(|| (w, 0)).1 += 1;
    }

    /// Each group's first wrong free and count.
    pub fn groups(&self) -> impl Iterator<Item = (&WrongFree, u64)> {
        self.groups.values().map(|(w, n)| (w, *n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_that_go_together() {
        use Family::*;
        for (alloc, ok) in [(Malloc, Malloc), (Aligned, Malloc), (New, New), (NewArray, NewArray)] {
            assert!(!mismatched(alloc, ok), "{alloc:?} freed by {ok:?}");
        }
        for (alloc, bad) in [
            (Malloc, New),
            (Malloc, NewArray),
            (Aligned, New),
            (Aligned, NewArray),
            (New, Malloc),
            (New, NewArray),
            (NewArray, Malloc),
            (NewArray, New),
        ] {
            assert!(mismatched(alloc, bad), "{alloc:?} freed by {bad:?}");
        }
        assert!(!mismatched(Internal, New) && !mismatched(Pool, Malloc));
    }

    #[test]
    fn what_a_sized_or_aligned_delete_is_told_must_be_the_blocks() {
        let b = |family, size, align| Block { size, stack: 0, family, time: 0, align: align_code(align) };
        let d = |family, size, align| Dealloc { family, stack: None, realloc: false, size, align };
        use Family::*;
        assert_eq!(misdescribed(&b(New, 32, 0), &d(New, 32, 0)), None);
        assert_eq!(misdescribed(&b(New, 32, 0), &d(New, 0, 0)), None);
        assert_eq!(misdescribed(&b(New, 32, 0), &d(New, 33, 0)), Some(WrongKind::SizeMismatch));
        assert_eq!(misdescribed(&b(NewArray, 64, 64), &d(NewArray, 64, 64)), None);
        assert_eq!(misdescribed(&b(New, 64, 64), &d(New, 0, 0)), Some(WrongKind::AlignMismatch));
        assert_eq!(misdescribed(&b(New, 64, 0), &d(New, 0, 16)), Some(WrongKind::AlignMismatch));
        assert_eq!(misdescribed(&b(New, 64, 64), &d(New, 0, 128)), Some(WrongKind::AlignMismatch));
        // C23's free_sized: the size only; realloc's free is told nothing.
        assert_eq!(misdescribed(&b(Malloc, 10, 0), &d(Malloc, 11, 0)), Some(WrongKind::SizeMismatch));
        assert_eq!(misdescribed(&b(Aligned, 10, 0), &d(Malloc, 10, 0)), None);
        // Mappings, pools, internal blocks: never.
        assert_eq!(misdescribed(&b(Mmap, 10, 0), &d(Malloc, 11, 0)), None);
        assert_eq!((align_code(0), align_code(1), align_code(64), align_code(3)), (0, 1, 7, 255));
        assert_eq!((align_of_code(7), align_of_code(0)), (64, 0));
    }
}
