//! The report's wrong frees (books/wrong.rs): one entry per kind, call and
//! backtraces, in JSON as `errors` and in text as the section "Wrong
//! frees", worded as valgrind memcheck words its errors.

use serde::Serialize;

use super::{stack_frames, SortKey};
use crate::books::wrong::WrongKind;
use crate::symbolize::{Frame, Symbolizer};
use crate::trace::Trace;

/// Wrong frees of one kind, call and backtraces.
#[derive(Serialize, Debug)]
pub struct ErrorEntry {
    /// `mismatched`, `double_free`, `invalid_free`, `size_mismatch` or
    /// `align_mismatch`.
    pub kind: WrongKind,
    /// The deallocating call: `free`, `delete`, `delete[]`, `realloc`.
    pub call: &'static str,
    /// How many times it happened.
    pub count: u64,
    /// The address freed, the first time.
    pub address: u64,
    /// The block concerned, the first time: the one allocated at `address`
    /// (mismatched, double free) or the one `address` points into (invalid
    /// free); none when the trace knows no such block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block: Option<BlockInfo>,
    /// Where the block was allocated (empty without a block).
    pub alloc_frames: Vec<Frame>,
    /// Where the wrong free was called: recorded with `mtrace run -S`
    /// (always for realloc, whose backtrace is recorded anyway).
    pub free_frames: Vec<Frame>,
    /// Double free: where the block was freed the time before (with `-S`).
    pub first_free_frames: Vec<Frame>,
    /// The size a sized deallocation was told, bytes (`size_mismatch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub told_size: Option<u64>,
    /// The alignment an aligned `operator delete` was told, bytes; 0 for a
    /// plain `delete` (`alignment_mismatch`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub told_align: Option<u64>,
}

/// The block a wrong free concerns.
#[derive(Serialize, Debug)]
pub struct BlockInfo {
    /// The block's start.
    pub address: u64,
    /// Requested size, bytes.
    pub size: u64,
    /// Bytes from the block's start to the address freed.
    pub offset: u64,
    /// The family that allocated it: malloc, new, new[], aligned.
    pub family: &'static str,
    /// It had been freed already.
    pub freed: bool,
    /// The alignment its aligned `operator new` was asked for, bytes (0:
    /// not an aligned one; `u64::MAX`: not a power of two).
    pub align: u64,
}

/// The wrong frees of `t`, most frequent of the sort key's kind first with
/// `--sort badfree` (double and invalid) or `mismatched`, else in the
/// order they first happened; `depth` recorded frames each.
pub fn build(t: &Trace, sym: &mut Symbolizer, sort: SortKey, depth: Option<usize>) -> Vec<ErrorEntry> {
    let mut found = t.books.wrong_frees();
    let first_kind = |k: WrongKind| match sort {
        SortKey::Badfree => k.is_mismatch(),
        SortKey::Mismatched => !k.is_mismatch(),
        _ => false,
    };
    if matches!(sort, SortKey::Badfree | SortKey::Mismatched) {
        // Stable: equal counts stay in time order.
        found.sort_by_key(|(w, n)| (first_kind(w.kind), std::cmp::Reverse(*n)));
    }
    let mut frames = |s: Option<u32>| s.map_or_else(Vec::new, |s| stack_frames(t, sym, s, depth));
    found
        .into_iter()
        .map(|(w, count)| ErrorEntry {
            kind: w.kind,
            call: w.call.call_name(),
            count,
            address: w.addr,
            block: w.block.as_ref().map(|c| BlockInfo {
                address: c.addr,
                size: c.block.size,
                offset: w.addr.wrapping_sub(c.addr),
                family: c.block.family.name(),
                freed: c.freed,
                align: crate::books::wrong::align_of_code(c.block.align),
            }),
            alloc_frames: frames(w.block.as_ref().map(|c| c.block.stack)),
            free_frames: frames(w.call.stack),
            first_free_frames: frames(w.first_free),
            told_size: (w.kind == WrongKind::SizeMismatch).then_some(w.call.size),
            told_align: (w.kind == WrongKind::AlignMismatch).then_some(w.call.align),
        })
        .collect()
}

/// Counts per kind: (double and invalid, mismatched).
pub fn counts(errors: &[ErrorEntry]) -> (u64, u64) {
    errors.iter().fold((0, 0), |(bad, mis), e| match e.kind.is_mismatch() {
        true => (bad, mis + e.count),
        false => (bad + e.count, mis),
    })
}
