//! What a `realloc` call did, from its arguments and result, by glibc's
//! rules (malloc/malloc.c, `__libc_realloc`; C17 7.22.3.5 leaves the
//! size-0 case to the implementation): both producers record a realloc by
//! it, the preload from inside the call, the ptrace tracer from outside.

/// The outcome of `realloc(old, size)` that returned `new`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Realloc {
    /// It failed (NULL for a size other than 0) or was `realloc(NULL, n)`
    /// returning NULL: nothing changed, `old` is still live.
    Failed,
    /// `realloc(NULL, n)`: an allocation of `size` bytes at `new`.
    Allocated,
    /// `realloc(p, 0)` returning NULL: glibc freed `old`.
    Freed,
    /// `old` gave way to `new` (the same address or another) of `size`
    /// bytes.
    Resized,
}

impl Realloc {
    /// The outcome of `realloc(old, size)` returning `new` (addresses, 0
    /// for NULL).
    pub fn of(old: u64, new: u64, size: u64) -> Realloc {
        match (old, new) {
            (0, 0) => Realloc::Failed,
            (0, _) => Realloc::Allocated,
            (_, 0) if size == 0 => Realloc::Freed,
            (_, 0) => Realloc::Failed,
            _ => Realloc::Resized,
        }
    }

    /// `old` is no longer a block of its own.
    pub fn frees_old(self) -> bool {
        matches!(self, Realloc::Freed | Realloc::Resized)
    }
}

#[cfg(test)]
mod tests {
    use super::Realloc;

    #[test]
    fn glibcs_rules() {
        assert_eq!(Realloc::of(0, 0, 8), Realloc::Failed);
        assert_eq!(Realloc::of(0, 0x10, 8), Realloc::Allocated);
        assert_eq!(Realloc::of(0x10, 0, 0), Realloc::Freed);
        assert_eq!(Realloc::of(0x10, 0, 8), Realloc::Failed);
        assert_eq!(Realloc::of(0x10, 0x10, 8), Realloc::Resized);
        assert_eq!(Realloc::of(0x10, 0x20, 0), Realloc::Resized);
        assert!(Realloc::Freed.frees_old() && Realloc::Resized.frees_old());
        assert!(!Realloc::Failed.frees_old() && !Realloc::Allocated.frees_old());
    }
}
