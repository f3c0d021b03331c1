//! The orders of the "not freed" entries: mtrace-ng's keys, with their
//! names for `--sort` and the console's `dump`.

/// Order of the "not freed" entries (the keys of mtrace-ng).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Bytes not freed (default; mtrace-ng's `usage`).
    Bytes,
    /// Blocks not freed (mtrace-ng's `allocations`).
    Count,
    /// All allocations made from the backtrace over the run.
    Total,
    /// Average size of the blocks not freed.
    Average,
    /// The backtrace with the most recent allocation first (mtrace-ng's `tsc`).
    Tsc,
    /// Bytes lost (definitely or indirectly) at the leak scan; in the
    /// console, at the last `scan`.
    BytesLeaked,
    /// Blocks lost (definitely or indirectly) at the leak scan, or the last `scan`.
    Leaks,
    /// Every backtrace that allocated, also those with nothing live now,
    /// by allocation calls (mtrace-ng's `stacks`).
    Stacks,
    /// The wrong frees by how many double and invalid frees each entry
    /// counts, then the mismatched ones (mtrace-ng's `badfree`); the
    /// not-freed entries by bytes.
    Badfree,
    /// The wrong frees by how many mismatched frees each entry counts,
    /// then the others (mtrace-ng's `mismatched`); the not-freed entries
    /// by bytes.
    Mismatched,
}

impl SortKey {
    /// Every key, each with its name, the names mtrace-ng gives it, and
    /// what it orders by (for `--sort`'s help and the console's `sort`).
    pub const ALL: [(SortKey, &'static str, &'static [&'static str], &'static str); 10] = [
        (SortKey::Bytes, "bytes", &["usage"], "Bytes not freed (default; mtrace-ng's `usage`)"),
        (SortKey::Count, "count", &["allocations"], "Blocks not freed (mtrace-ng's `allocations`)"),
        (SortKey::Total, "total", &[], "All allocations made from the backtrace over the run"),
        (SortKey::Average, "average", &[], "Average size of the blocks not freed"),
        (SortKey::Tsc, "tsc", &[], "The backtrace with the most recent allocation first (mtrace-ng's `tsc`)"),
        (
            SortKey::BytesLeaked,
            "bytes-leaked",
            &[],
            "Bytes lost (definitely or indirectly) at the leak scan; in the console, at the last `scan`",
        ),
        (SortKey::Leaks, "leaks", &[], "Blocks lost (definitely or indirectly) at the leak scan, or the last `scan`"),
        (
            SortKey::Stacks,
            "stacks",
            &[],
            "Every backtrace that allocated, also those with nothing live now, by allocation calls (mtrace-ng's \
             `stacks`)",
        ),
        (
            SortKey::Badfree,
            "badfree",
            &[],
            "The wrong frees by how many double and invalid frees each entry counts, then the mismatched ones \
             (mtrace-ng's `badfree`); the not-freed entries by bytes",
        ),
        (
            SortKey::Mismatched,
            "mismatched",
            &[],
            "The wrong frees by how many mismatched frees each entry counts, then the others (mtrace-ng's \
             `mismatched`); the not-freed entries by bytes",
        ),
    ];

    /// The key named `s` or one of its aliases, ASCII case ignored.
    pub fn parse(s: &str) -> Option<SortKey> {
        let s = s.to_ascii_lowercase();
        Self::ALL.iter().find(|(_, n, a, _)| *n == s || a.contains(&s.as_str())).map(|e| e.0)
    }
}
