//! The functions the producers follow: the same set libmtrace.so
//! interposes on and the ptrace tracer puts breakpoints on, by symbol name
//! (Itanium C++ ABI names for a 64-bit size_t), and what each call means.

use crate::Family;

/// What a call of an interposed function does, with its arguments'
/// positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// Returns a block of `size` (argument `size`; `calloc`: the product
    /// of arguments 0 and 1) from `family`.
    Alloc {
        /// Whose block.
        family: Family,
        /// The argument holding the size.
        size: usize,
    },
    /// `calloc(n, size)`.
    Calloc,
    /// `posix_memalign(out, align, size)`: the block is written to `*out`.
    PosixMemalign,
    /// `realloc(p, size)`; `reallocarray(p, n, size)` when `array`.
    Realloc {
        /// `reallocarray`.
        array: bool,
    },
    /// Frees its argument 0.
    Free {
        /// Whose block.
        family: Family,
    },
    /// C++ `operator new`: the block comes from the allocator it calls
    /// (malloc, aligned_alloc), one event with the family of `new`.
    New {
        /// `new` or `new[]`.
        family: Family,
    },
    /// `mmap(addr, len, prot, flags, fd, off)`.
    Mmap,
    /// `munmap(addr, len)`.
    Munmap,
    /// `mremap(old, old_len, new_len, flags, ...)`.
    Mremap,
    /// The dynamic loader's `_dl_debug_state`: the module list changed.
    LoaderState,
    /// libc's `exit(status)`: where the program leaves, whose frame is the
    /// leak scan's root at the end (as the preload's), not the exit path's.
    Exit,
}

impl Call {
    /// Memory-mapping calls made by the module that defines them (glibc's
    /// own, for large blocks and thread stacks) are not the program's.
    pub fn mapping(self) -> bool {
        matches!(self, Call::Mmap | Call::Munmap | Call::Mremap)
    }
}

/// Every allocation function both producers follow, by symbol: the
/// preload interposes on each (preload/src/hooks/, checked by
/// analyzer/tests/process.rs against `nm -D libmtrace.so`), the ptrace
/// tracer puts a breakpoint or uprobe on each.
pub const INTERPOSED: &[(&str, Call)] = &[
    ("malloc", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("calloc", Call::Calloc),
    ("realloc", Call::Realloc { array: false }),
    ("reallocarray", Call::Realloc { array: true }),
    ("free", Call::Free { family: Family::Malloc }),
    ("cfree", Call::Free { family: Family::Malloc }),
    ("memalign", Call::Alloc { family: Family::Aligned, size: 1 }),
    ("aligned_alloc", Call::Alloc { family: Family::Aligned, size: 1 }),
    ("valloc", Call::Alloc { family: Family::Aligned, size: 0 }),
    ("pvalloc", Call::Alloc { family: Family::Aligned, size: 0 }),
    ("posix_memalign", Call::PosixMemalign),
    ("mmap", Call::Mmap),
    ("mmap64", Call::Mmap),
    ("munmap", Call::Munmap),
    ("mremap", Call::Mremap),
    ("_Znwm", Call::New { family: Family::New }),
    ("_Znam", Call::New { family: Family::NewArray }),
    ("_ZnwmRKSt9nothrow_t", Call::New { family: Family::New }),
    ("_ZnamRKSt9nothrow_t", Call::New { family: Family::NewArray }),
    ("_ZnwmSt11align_val_t", Call::New { family: Family::New }),
    ("_ZnamSt11align_val_t", Call::New { family: Family::NewArray }),
    ("_ZnwmSt11align_val_tRKSt9nothrow_t", Call::New { family: Family::New }),
    ("_ZnamSt11align_val_tRKSt9nothrow_t", Call::New { family: Family::NewArray }),
    ("_ZdlPv", Call::Free { family: Family::New }),
    ("_ZdaPv", Call::Free { family: Family::NewArray }),
    ("_ZdlPvm", Call::Free { family: Family::New }),
    ("_ZdaPvm", Call::Free { family: Family::NewArray }),
    ("_ZdlPvRKSt9nothrow_t", Call::Free { family: Family::New }),
    ("_ZdaPvRKSt9nothrow_t", Call::Free { family: Family::NewArray }),
    ("_ZdlPvSt11align_val_t", Call::Free { family: Family::New }),
    ("_ZdaPvSt11align_val_t", Call::Free { family: Family::NewArray }),
    ("_ZdlPvmSt11align_val_t", Call::Free { family: Family::New }),
    ("_ZdaPvmSt11align_val_t", Call::Free { family: Family::NewArray }),
    ("_ZdlPvSt11align_val_tRKSt9nothrow_t", Call::Free { family: Family::New }),
    ("_ZdaPvSt11align_val_tRKSt9nothrow_t", Call::Free { family: Family::NewArray }),
];

/// Allocators' own entry points, beside the malloc family they also
/// define: followed where a module calls them (the preload rewrites the
/// callers' GOT entries, as `mtrace attach` does, and exports no function
/// of these names, so that a program probing for one, as folly probes
/// for `mallocx`, finds only the real allocator's), where the executable
/// defines them (the preload patches their entry), and by the ptrace
/// tracer wherever a module defines them. Each is recorded in the family
/// its allocator frees it with: a `sdallocx` of a `mallocx` block is
/// right, and so is its `free`.
/// - jemalloc(3)'s non-standard API (`flags`: MALLOCX_* bits, alignment
///   among them);
/// - jemalloc's whole API under the prefixes of [`JEMALLOC_PREFIXES`]
///   (`--with-jemalloc-prefix`: Rust's tikv-jemallocator calls
///   `_rjem_mallocx` and `_rjem_sdallocx`);
/// - gperftools' `tc_*` (gperftools/tcmalloc.h);
/// - mimalloc's `mi_*` (mimalloc.h), its malloc family and aligned forms;
/// - C23's sized frees, `free_sized` and `free_aligned_sized` (glibc 2.41).
pub const ENTRY_POINTS: &[(&str, Call)] = &[
    ("mallocx", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("rallocx", Call::Realloc { array: false }),
    ("sdallocx", Call::Free { family: Family::Malloc }),
    ("dallocx", Call::Free { family: Family::Malloc }),
    ("_rjem_malloc", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("_rjem_calloc", Call::Calloc),
    ("_rjem_realloc", Call::Realloc { array: false }),
    ("_rjem_free", Call::Free { family: Family::Malloc }),
    ("_rjem_posix_memalign", Call::PosixMemalign),
    ("_rjem_aligned_alloc", Call::Alloc { family: Family::Aligned, size: 1 }),
    ("_rjem_mallocx", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("_rjem_rallocx", Call::Realloc { array: false }),
    ("_rjem_sdallocx", Call::Free { family: Family::Malloc }),
    ("_rjem_dallocx", Call::Free { family: Family::Malloc }),
    ("je_malloc", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("je_calloc", Call::Calloc),
    ("je_realloc", Call::Realloc { array: false }),
    ("je_free", Call::Free { family: Family::Malloc }),
    ("je_posix_memalign", Call::PosixMemalign),
    ("je_aligned_alloc", Call::Alloc { family: Family::Aligned, size: 1 }),
    ("je_mallocx", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("je_rallocx", Call::Realloc { array: false }),
    ("je_sdallocx", Call::Free { family: Family::Malloc }),
    ("je_dallocx", Call::Free { family: Family::Malloc }),
    ("tc_malloc", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("tc_calloc", Call::Calloc),
    ("tc_realloc", Call::Realloc { array: false }),
    ("tc_free", Call::Free { family: Family::Malloc }),
    ("tc_free_sized", Call::Free { family: Family::Malloc }),
    ("tc_memalign", Call::Alloc { family: Family::Aligned, size: 1 }),
    ("tc_posix_memalign", Call::PosixMemalign),
    ("tc_new", Call::Alloc { family: Family::New, size: 0 }),
    ("tc_newarray", Call::Alloc { family: Family::NewArray, size: 0 }),
    ("tc_delete", Call::Free { family: Family::New }),
    ("tc_deletearray", Call::Free { family: Family::NewArray }),
    ("tc_delete_sized", Call::Free { family: Family::New }),
    ("tc_deletearray_sized", Call::Free { family: Family::NewArray }),
    ("mi_malloc", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("mi_zalloc", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("mi_calloc", Call::Calloc),
    ("mi_realloc", Call::Realloc { array: false }),
    ("mi_free", Call::Free { family: Family::Malloc }),
    ("mi_free_size", Call::Free { family: Family::Malloc }),
    ("mi_free_aligned", Call::Free { family: Family::Malloc }),
    ("mi_free_size_aligned", Call::Free { family: Family::Malloc }),
    ("mi_malloc_aligned", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("mi_zalloc_aligned", Call::Alloc { family: Family::Malloc, size: 0 }),
    ("mi_realloc_aligned", Call::Realloc { array: false }),
    ("free_sized", Call::Free { family: Family::Malloc }),
    ("free_aligned_sized", Call::Free { family: Family::Malloc }),
];

/// The prefixes a jemalloc build may give its whole API (`--with-jemalloc-prefix`):
/// Rust's tikv-jemalloc-sys uses `_rjem_`, FreeBSD-style and redis's own
/// builds `je_`. [`ENTRY_POINTS`] lists jemalloc's API under each.
pub const JEMALLOC_PREFIXES: &[&str] = &["_rjem_", "je_"];

/// The dynamic loader's hook the ptrace tracer watches for a changed
/// module list (the preload notices new modules by their generation).
pub const LOADER_STATE: (&str, Call) = ("_dl_debug_state", Call::LoaderState);

/// libc's `exit`, which the ptrace tracer watches for the leak scan's
/// roots (the preload registers an exit handler instead).
pub const EXIT: (&str, Call) = ("exit", Call::Exit);

/// A function of mtrace's C API (include/mtrace.h). The preload defines
/// them; the ptrace tracer points the program's references to them (weak,
/// NULL without the preload) at breakpoints of its own and does what the
/// preload's would.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    /// `void mtrace_start(void)`: allocations are recorded again.
    Start,
    /// `void mtrace_stop(void)`: allocations are not recorded (frees are).
    Stop,
    /// `void mtrace_marker(const char *name)`: a named marker.
    Marker,
    /// `int mtrace_report(const char *path)`: a report point, its memlog
    /// written before the call returns (0; -1 when it could not be).
    Report,
    /// `int mtrace_scan(const char *path)`: a leak scan and its memlog.
    Scan,
    /// `void mtrace_alloc(const char *pool, const void *ptr, size_t size)`.
    PoolAlloc,
    /// `void mtrace_free(const char *pool, const void *ptr)`.
    PoolFree,
}

/// The C API's functions by name.
pub const API: &[(&str, Api)] = &[
    ("mtrace_start", Api::Start),
    ("mtrace_stop", Api::Stop),
    ("mtrace_marker", Api::Marker),
    ("mtrace_report", Api::Report),
    ("mtrace_scan", Api::Scan),
    ("mtrace_alloc", Api::PoolAlloc),
    ("mtrace_free", Api::PoolFree),
];

/// The API function a symbol name stands for.
pub fn api(name: &str) -> Option<Api> {
    let base = name.split('@').next().unwrap_or(name);
    API.iter().find(|(n, _)| *n == base).map(|&(_, a)| a)
}

/// The call a symbol name stands for (versioned names like
/// `malloc@@GLIBC_2.2.5` included), the loader's hook and `exit` among
/// them, allocators' own entry points ([`ENTRY_POINTS`], prefixed
/// jemalloc names included) too.
pub fn lookup(name: &str) -> Option<Call> {
    let base = name.split('@').next().unwrap_or(name);
    INTERPOSED.iter().chain(ENTRY_POINTS).chain([&LOADER_STATE, &EXIT]).find(|(m, _)| *m == base).map(|&(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::{lookup, Call, INTERPOSED};
    use crate::Family;

    #[test]
    fn names_and_versions() {
        assert_eq!(lookup("free@@GLIBC_2.2.5"), Some(Call::Free { family: Family::Malloc }));
        assert_eq!(lookup("_dl_debug_state"), Some(Call::LoaderState));
        assert_eq!(lookup("strdup"), None);
        assert_eq!(lookup("_rjem_sdallocx"), Some(Call::Free { family: Family::Malloc }));
        assert_eq!(lookup("je_mallocx"), Some(Call::Alloc { family: Family::Malloc, size: 0 }));
        assert_eq!(lookup("_rjem_malloc_usable_size"), None);
        assert_eq!(lookup("je_mi_malloc"), None);
        for p in super::JEMALLOC_PREFIXES {
            for n in ["malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc"] {
                assert_eq!(lookup(&format!("{p}{n}")), lookup(n), "{p}{n}");
            }
            for n in ["mallocx", "rallocx", "sdallocx", "dallocx"] {
                assert_eq!(lookup(&format!("{p}{n}")), lookup(n), "{p}{n}");
            }
        }
        assert_eq!(lookup("mi_free_size"), Some(Call::Free { family: Family::Malloc }));
        let mut names: Vec<&str> = INTERPOSED.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), INTERPOSED.len(), "a name twice");
        let mut all: Vec<&str> = INTERPOSED.iter().chain(super::ENTRY_POINTS).map(|(n, _)| *n).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), INTERPOSED.len() + super::ENTRY_POINTS.len(), "a name in both tables");
    }
}
