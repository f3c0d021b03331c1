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
        /// How many arguments it takes (the block, then what it is told
        /// of it: size, alignment, flags): a hook patched into a function
        /// that several frees share must pass on as many as the one
        /// taking most.
        args: u8,
        /// The argument holding the size it is told the block has (a
        /// sized `operator delete`, `free_sized`): a size that is not the
        /// block's is a mismatched free.
        size: Option<u8>,
        /// The argument holding the alignment it is told (an aligned
        /// `operator delete`).
        align: Option<u8>,
    },
    /// C++ `operator new`: the block comes from the allocator it calls
    /// (malloc, aligned_alloc), one event with the family of `new`.
    New {
        /// `new` or `new[]`.
        family: Family,
        /// The argument holding the alignment asked for (an aligned
        /// `operator new`: `std::align_val_t`).
        align: Option<u8>,
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

    /// The family of the blocks the call allocates or frees: `calloc`'s
    /// and `realloc`'s are malloc's, `posix_memalign`'s the aligned
    /// family's (glibc's manual: each of those blocks is freed by `free`;
    /// memcheck tells them apart the same way). `None` for the calls
    /// that make no block (mappings, the loader, exit). A const, so that
    /// the hooks read it at compile time.
    pub const fn family(self) -> Option<Family> {
        match self {
            Call::Alloc { family, .. } | Call::Free { family, .. } | Call::New { family, .. } => Some(family),
            Call::Calloc | Call::Realloc { .. } => Some(Family::Malloc),
            Call::PosixMemalign => Some(Family::Aligned),
            Call::Mmap | Call::Munmap | Call::Mremap | Call::LoaderState | Call::Exit => None,
        }
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
    ("free", Call::Free { family: Family::Malloc, args: 1, size: None, align: None }),
    ("cfree", Call::Free { family: Family::Malloc, args: 1, size: None, align: None }),
    ("memalign", Call::Alloc { family: Family::Aligned, size: 1 }),
    ("aligned_alloc", Call::Alloc { family: Family::Aligned, size: 1 }),
    ("valloc", Call::Alloc { family: Family::Aligned, size: 0 }),
    ("pvalloc", Call::Alloc { family: Family::Aligned, size: 0 }),
    ("posix_memalign", Call::PosixMemalign),
    ("mmap", Call::Mmap),
    ("mmap64", Call::Mmap),
    ("munmap", Call::Munmap),
    ("mremap", Call::Mremap),
    ("_Znwm", Call::New { family: Family::New, align: None }),
    ("_Znam", Call::New { family: Family::NewArray, align: None }),
    ("_ZnwmRKSt9nothrow_t", Call::New { family: Family::New, align: None }),
    ("_ZnamRKSt9nothrow_t", Call::New { family: Family::NewArray, align: None }),
    ("_ZnwmSt11align_val_t", Call::New { family: Family::New, align: Some(1) }),
    ("_ZnamSt11align_val_t", Call::New { family: Family::NewArray, align: Some(1) }),
    ("_ZnwmSt11align_val_tRKSt9nothrow_t", Call::New { family: Family::New, align: Some(1) }),
    ("_ZnamSt11align_val_tRKSt9nothrow_t", Call::New { family: Family::NewArray, align: Some(1) }),
    ("_ZdlPv", Call::Free { family: Family::New, args: 1, size: None, align: None }),
    ("_ZdaPv", Call::Free { family: Family::NewArray, args: 1, size: None, align: None }),
    ("_ZdlPvm", Call::Free { family: Family::New, args: 2, size: Some(1), align: None }),
    ("_ZdaPvm", Call::Free { family: Family::NewArray, args: 2, size: Some(1), align: None }),
    ("_ZdlPvRKSt9nothrow_t", Call::Free { family: Family::New, args: 2, size: None, align: None }),
    ("_ZdaPvRKSt9nothrow_t", Call::Free { family: Family::NewArray, args: 2, size: None, align: None }),
    ("_ZdlPvSt11align_val_t", Call::Free { family: Family::New, args: 2, size: None, align: Some(1) }),
    ("_ZdaPvSt11align_val_t", Call::Free { family: Family::NewArray, args: 2, size: None, align: Some(1) }),
    ("_ZdlPvmSt11align_val_t", Call::Free { family: Family::New, args: 3, size: Some(1), align: Some(2) }),
    ("_ZdaPvmSt11align_val_t", Call::Free { family: Family::NewArray, args: 3, size: Some(1), align: Some(2) }),
    ("_ZdlPvSt11align_val_tRKSt9nothrow_t", Call::Free { family: Family::New, args: 3, size: None, align: Some(1) }),
    (
        "_ZdaPvSt11align_val_tRKSt9nothrow_t",
        Call::Free { family: Family::NewArray, args: 3, size: None, align: Some(1) },
    ),
];

/// The call of `name` in [`INTERPOSED`], in a const context (a
/// compile-time error when it is not there): the preload's hooks take
/// their family and their arguments' roles from the table.
pub const fn interposed(name: &str) -> Call {
    let mut i = 0;
    while i < INTERPOSED.len() {
        if same(INTERPOSED[i].0, name) {
            return INTERPOSED[i].1;
        }
        i += 1;
    }
    panic!("not in INTERPOSED")
}

/// The family of `name`'s blocks in [`INTERPOSED`] ([`Call::family`]), in a
/// const context (a compile-time error when it is not there or makes no
/// block).
pub const fn interposed_family(name: &str) -> Family {
    match interposed(name).family() {
        Some(f) => f,
        None => panic!("makes no block"),
    }
}

/// The index of `name` in [`ENTRY_POINTS`], in a const context (a
/// compile-time error when it is not there): the slot of the real
/// function behind its hook.
pub const fn entry_point_index(name: &str) -> usize {
    let mut i = 0;
    while i < ENTRY_POINTS.len() {
        if same(ENTRY_POINTS[i].0, name) {
            return i;
        }
        i += 1;
    }
    panic!("not in ENTRY_POINTS")
}

/// The one table of allocators' own entry points: calls `$then!` with
/// one row per function, `(ALLOCATOR "PREFIX" (KIND NAME(ARGS) ...))`,
/// the prefixed variants written out. Both the format's
/// [`ENTRY_POINTS`] and the preload's hooks (preload/src/hooks/
/// entry_points.rs) are made from it, so that an entry point cannot be
/// followed by one and not the other, and a new allocator is one block
/// of rows here.
///
/// A block is `ALLOCATOR ["PREFIX", ...] { ROW ... }`: its rows under
/// each prefix. A row is one of (the arguments with their C types, as
/// the allocator's header declares them):
/// - `(alloc NAME(ARGS) FAMILY SIZE)`: returns a block of the argument
///   `SIZE` bytes, freed by `FAMILY`;
/// - `(calloc NAME(n: usize, size: usize))`: a block of `n * size` bytes
///   of the malloc family;
/// - `(realloc NAME(p: PTR, size: usize, ...))`: resizes block `p` to
///   `size` bytes;
/// - `(free NAME(p: PTR, ...) FAMILY)`, and `(free NAME(p: PTR, ...)
///   FAMILY told SIZE)` for a free told the block's size in the argument
///   `SIZE` (a wrong one is a mismatched free): frees block `p`;
/// - `(posix_memalign NAME(out: OUT, align: usize, size: usize))`: writes
///   a block of `size` bytes to `*out`, returns 0 or an error number.
#[macro_export]
macro_rules! with_entry_points {
    ($then:ident) => {
        $crate::__entry_point_rows! { $then []
            // jemalloc(3)'s non-standard API (`flags`: MALLOCX_* bits,
            // alignment among them), plain and under the prefixes its
            // builds give the whole API (`--with-jemalloc-prefix`: Rust's
            // tikv-jemalloc-sys uses `_rjem_`, redis's own build and
            // FreeBSD-style ones `je_`).
            jemalloc ["", "_rjem_", "je_"] {
                (alloc mallocx(size: usize, flags: i32) Malloc size)
                (realloc rallocx(p: *mut ::core::ffi::c_void, size: usize, flags: i32))
                (free sdallocx(p: *mut ::core::ffi::c_void, size: usize, flags: i32) Malloc)
                (free dallocx(p: *mut ::core::ffi::c_void, flags: i32) Malloc)
            }
            // Its malloc family under those prefixes (the plain names are
            // interposed: INTERPOSED).
            jemalloc ["_rjem_", "je_"] {
                (alloc malloc(size: usize) Malloc size)
                (calloc calloc(n: usize, size: usize))
                (realloc realloc(p: *mut ::core::ffi::c_void, size: usize))
                (free free(p: *mut ::core::ffi::c_void) Malloc)
                (posix_memalign posix_memalign(out: *mut *mut ::core::ffi::c_void, align: usize, size: usize))
                (alloc aligned_alloc(align: usize, size: usize) Aligned size)
            }
            // gperftools' tcmalloc.h.
            tcmalloc ["tc_"] {
                (alloc malloc(size: usize) Malloc size)
                (calloc calloc(n: usize, size: usize))
                (realloc realloc(p: *mut ::core::ffi::c_void, size: usize))
                (free free(p: *mut ::core::ffi::c_void) Malloc)
                (free free_sized(p: *mut ::core::ffi::c_void, size: usize) Malloc)
                (alloc memalign(align: usize, size: usize) Aligned size)
                (posix_memalign posix_memalign(out: *mut *mut ::core::ffi::c_void, align: usize, size: usize))
                (alloc new(size: usize) New size)
                (alloc newarray(size: usize) NewArray size)
                (free delete(p: *mut ::core::ffi::c_void) New)
                (free deletearray(p: *mut ::core::ffi::c_void) NewArray)
                (free delete_sized(p: *mut ::core::ffi::c_void, size: usize) New)
                (free deletearray_sized(p: *mut ::core::ffi::c_void, size: usize) NewArray)
            }
            // mimalloc.h: every block is mi_free's, aligned or not.
            mimalloc ["mi_"] {
                (alloc malloc(size: usize) Malloc size)
                (alloc zalloc(size: usize) Malloc size)
                (calloc calloc(n: usize, size: usize))
                (realloc realloc(p: *mut ::core::ffi::c_void, size: usize))
                (free free(p: *mut ::core::ffi::c_void) Malloc)
                (free free_size(p: *mut ::core::ffi::c_void, size: usize) Malloc)
                (free free_aligned(p: *mut ::core::ffi::c_void, align: usize) Malloc)
                (free free_size_aligned(p: *mut ::core::ffi::c_void, size: usize, align: usize) Malloc)
                (alloc malloc_aligned(size: usize, align: usize) Malloc size)
                (alloc zalloc_aligned(size: usize, align: usize) Malloc size)
                (realloc realloc_aligned(p: *mut ::core::ffi::c_void, size: usize, align: usize))
            }
            // C23's sized frees (glibc 2.41): the size (and alignment) the
            // block was allocated with; a size that is not the block's is
            // a mismatched free.
            c23 [""] {
                (free free_sized(p: *mut ::core::ffi::c_void, size: usize) Malloc told size)
                (free free_aligned_sized(p: *mut ::core::ffi::c_void, align: usize, size: usize) Malloc told size)
            }
        }
    };
}

/// [`with_entry_points!`]'s blocks made one row per (prefix, function):
/// each block's rows once for each of its prefixes, then `$then!` of all.
#[doc(hidden)]
#[macro_export]
macro_rules! __entry_point_rows {
    ($then:ident [$($out:tt)*]) => {
        $then! { $($out)* }
    };
    ($then:ident [$($out:tt)*] $alloc:ident [] { $($row:tt)* } $($rest:tt)*) => {
        $crate::__entry_point_rows! { $then [$($out)*] $($rest)* }
    };
    ($then:ident [$($out:tt)*] $alloc:ident [$p:literal $(, $ps:literal)*] { $($row:tt)* } $($rest:tt)*) => {
        $crate::__entry_point_rows! { $then [$($out)* $(($alloc $p $row))*] $alloc [$($ps),*] { $($row)* } $($rest)* }
    };
}

/// The position of argument `name` in `args` (a compile-time error when
/// it is not there).
pub const fn argument(args: &[&str], name: &str) -> usize {
    let mut i = 0;
    while i < args.len() {
        if same(args[i], name) {
            return i;
        }
        i += 1;
    }
    panic!("no such argument")
}

/// `a == b`, in a const context.
pub const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut j = 0;
    while j < a.len() {
        if a[j] != b[j] {
            return false;
        }
        j += 1;
    }
    true
}

/// [`ENTRY_POINTS`] from the table's rows.
macro_rules! entry_point_calls {
    ($(($alloc:ident $p:literal ($kind:ident $name:ident ($($a:ident: $t:ty),*) $($more:tt)*)))*) => {
        &[$((concat!($p, stringify!($name)), entry_point_call!($kind ($($a),*) $($more)*)),)*]
    };
}

/// The [`Call`] of one row of [`with_entry_points!`].
macro_rules! entry_point_call {
    (alloc ($($a:ident),*) $family:ident $size:ident) => {
        Call::Alloc { family: Family::$family, size: argument(&[$(stringify!($a)),*], stringify!($size)) }
    };
    (calloc ($($a:ident),*)) => {
        Call::Calloc
    };
    (realloc ($($a:ident),*)) => {
        Call::Realloc { array: false }
    };
    (free ($($a:ident),*) $family:ident) => {
        Call::Free { family: Family::$family, args: [$(stringify!($a)),*].len() as u8, size: None, align: None }
    };
    (free ($($a:ident),*) $family:ident told $size:ident) => {
        Call::Free {
            family: Family::$family,
            args: [$(stringify!($a)),*].len() as u8,
            size: Some(argument(&[$(stringify!($a)),*], stringify!($size)) as u8),
            align: None,
        }
    };
    (posix_memalign ($($a:ident),*)) => {
        Call::PosixMemalign
    };
}

/// [`ENTRY_POINT_ALLOCATORS`] from the table's rows.
macro_rules! entry_point_allocators {
    ($(($alloc:ident $p:literal $row:tt))*) => {
        &[$((stringify!($alloc), $p),)*]
    };
}

/// Allocators' own entry points, beside the malloc family they also
/// define: followed where a module calls them (the preload rewrites the
/// callers' GOT entries, as `mtrace attach` does, and exports no function
/// of these names, so that a program probing for one, as folly probes
/// for `mallocx`, finds only the real allocator's), where the executable
/// defines them (the preload patches their entry), and by the ptrace
/// tracer wherever a module defines them. Each is recorded in the family
/// its allocator frees it with: a `sdallocx` of a `mallocx` block is
/// right, and so is its `free`. Made from [`with_entry_points!`]'s rows,
/// as the preload's hooks of them are.
pub const ENTRY_POINTS: &[(&str, Call)] = crate::with_entry_points!(entry_point_calls);

/// Each entry point's allocator and the prefix its name was made with,
/// in [`ENTRY_POINTS`]' order: `("jemalloc", "_rjem_")` for
/// `_rjem_mallocx`.
pub const ENTRY_POINT_ALLOCATORS: &[(&str, &str)] = crate::with_entry_points!(entry_point_allocators);

/// The prefixes `allocator`'s entry points are named with (`_rjem_` and
/// `je_` for jemalloc, `tc_`, `mi_`), each once, in the table's order;
/// the empty prefix (jemalloc's own `mallocx`) left out.
pub fn prefixes_of(allocator: &str) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for &(a, p) in ENTRY_POINT_ALLOCATORS {
        if a == allocator && !p.is_empty() && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

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
#[path = "functions_tests.rs"]
mod tests;
