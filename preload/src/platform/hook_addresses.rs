//! The hooks' addresses as data, for the rooms below the hooks that
//! install them (`mtrace attach`'s GOT redirection, the executable's
//! patched allocator): the crate root's table (`crate::UP`) holds the
//! hooks' tables of [`HookAddress`]es, set once at compile time. And the
//! slots of the shared frees' originals, which a patch claims and the
//! hooks of hooks/shared_free.rs call.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The address of an exported hook function (`f as *const ()`, which a
/// static's initializer may take where `f as usize` it may not).
#[derive(Clone, Copy)]
pub struct HookAddress(pub *const ());

// SAFETY: a function's address, never written through and never changed:
// reading it from any thread is safe.
unsafe impl Sync for HookAddress {}

impl HookAddress {
    /// The address, for a GOT slot or a jump.
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

/// Shared frees one process may have (tcmalloc has two: the plain and the
/// sized free): the hooks of hooks/shared_free.rs are one per slot and
/// per count of arguments.
pub const SHARED_FREE_SLOTS: usize = 8;

/// Each slot's original function (0: free slot).
static SHARED_FREE_ORIGINALS: [AtomicUsize; SHARED_FREE_SLOTS] = [const { AtomicUsize::new(0) }; SHARED_FREE_SLOTS];

/// A free slot taken for a shared free whose original is `original`: its
/// index, `None` when every slot is taken.
pub fn claim_shared_free(original: usize) -> Option<usize> {
    SHARED_FREE_ORIGINALS
        .iter()
        .position(|s| s.compare_exchange(0, original, Ordering::AcqRel, Ordering::Acquire).is_ok())
}

/// The original of shared-free slot `i` (0: the slot is free).
#[inline(always)]
pub fn shared_free_original(i: usize) -> usize {
    SHARED_FREE_ORIGINALS[i].load(Ordering::Acquire)
}
