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
//!   `new` and `delete` are one family each, so memcheck 3.22's "Mismatched
//!   new/delete size/alignment" (an aligned `new` freed by a plain
//!   `delete`) is not reported.
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
}

impl WrongKind {
    /// memcheck's heading of the error.
    pub fn heading(self) -> &'static str {
        match self {
            WrongKind::Mismatched => "Mismatched free() / delete / delete []",
            WrongKind::DoubleFree | WrongKind::InvalidFree => "Invalid free() / delete / delete[] / realloc()",
        }
    }

    /// Short name, as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            WrongKind::Mismatched => "mismatched",
            WrongKind::DoubleFree => "double free",
            WrongKind::InvalidFree => "invalid free",
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
}

impl Dealloc {
    /// A `free()` without backtrace.
    pub fn free() -> Dealloc {
        Dealloc { family: Family::Malloc, stack: None, realloc: false }
    }

    /// The function called, as memcheck names it.
    pub fn call_name(&self) -> &'static str {
        match (self.realloc, self.family) {
            (true, _) => "realloc",
            (false, Family::New) => "delete",
            (false, Family::NewArray) => "delete[]",
            _ => "free",
        }
    }
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
}
