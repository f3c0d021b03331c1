//! The hooks' addresses, for the rooms below the hooks that install them
//! (`mtrace attach`'s GOT redirection, the executable's patched
//! allocator): the hooks' tables of [`HookAddress`]es, registered once by
//! the crate root's constructor (lib.rs), before anything installs a hook.
//! And the slots of the shared frees' originals, which a patch claims and
//! the hooks of hooks/shared_free.rs call.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

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

/// The hooks' tables ([`register`]ed once).
pub struct Tables {
    /// The hook of each allocator's own entry point, by its index in
    /// `mtrace_format::functions::ENTRY_POINTS` (`hooks::entry_points::HOOKS`).
    pub entry_points: &'static [HookAddress],
    /// The hooks of a free that several families share (tcmalloc's `free`
    /// is its `operator delete`), patched into the executable: by count
    /// of arguments (1 to 3, at 0 to 2), then by slot
    /// ([`claim_shared_free`]; `hooks::shared_free::HOOKS`).
    pub shared_frees: &'static [[HookAddress; SHARED_FREE_SLOTS]],
}

static TABLES: OnceLock<Tables> = OnceLock::new();

/// Registers the hooks' tables: by the library's constructor, first (a
/// later call changes nothing).
pub fn register(tables: Tables) {
    let _ = TABLES.set(tables);
}

/// The hook of entry point `i` (its index in `ENTRY_POINTS`); `None`
/// before [`register`] or for an index of no entry point.
pub fn entry_point(i: usize) -> Option<usize> {
    Some(TABLES.get()?.entry_points.get(i)?.get())
}

/// The hook of a shared free of `args` arguments (1 to 3) in slot `slot`
/// (from [`claim_shared_free`]); `None` before [`register`] or for an
/// argument count out of range.
pub fn shared_free(args: usize, slot: usize) -> Option<usize> {
    Some(TABLES.get()?.shared_frees.get(args.checked_sub(1)?)?.get(slot)?.get())
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
