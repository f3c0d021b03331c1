//! Which frames of a backtrace are allocation wrappers (the allocator's
//! and the language runtime's own functions between the program's call
//! and the allocation: Rust's `alloc` crate and `GlobalAlloc` shims,
//! libstdc++'s allocators and containers), and which frame is the
//! program's own code. The text folds a backtrace's leading wrappers into
//! one line and counts `--num-callers` after them; the tables that name
//! one frame per backtrace (the HTML page's) name [`headline`]'s. Issue
//! 65: a Rust program's default 12 frames were all `alloc::` and
//! `RawVec` frames, and redis's leaks table named glibc's
//! `__libc_start_call_main` on every row.

use crate::symbolize::Frame;

/// Functions that only pass an allocation on: Rust's global allocator
/// entry points (the compiler's `__rust_*`, the default's `__rdl_*`, a
/// `#[global_allocator]`'s `__rg_*`).
const NAMES: [&str; 10] = [
    "__rust_alloc",
    "__rust_alloc_zeroed",
    "__rust_realloc",
    "__rust_dealloc",
    "__rdl_alloc",
    "__rdl_alloc_zeroed",
    "__rdl_realloc",
    "__rg_alloc",
    "__rg_alloc_zeroed",
    "__rg_realloc",
];

/// Function names that start so are the runtime's allocation code, where
/// no source file says so (a library without debug info): Rust's `alloc`
/// crate, libstdc++'s allocators and vector base.
const PREFIXES: [&str; 10] = [
    "alloc::",
    "<alloc::",
    "core::alloc::",
    "std::alloc::",
    "<std::alloc::",
    "std::allocator<",
    "std::__new_allocator<",
    "__gnu_cxx::new_allocator<",
    "std::allocator_traits<",
    "std::_Vector_base<",
];

/// Parts of a function name that make it a wrapper: a `GlobalAlloc`
/// implementation (the tikv-jemallocator and mimalloc crates'), and
/// libstdc++'s container growth and node allocation.
const INSIDE: [&str; 9] = [
    " as core::alloc::global::GlobalAlloc>::",
    "::_M_realloc_insert",
    "::_M_realloc_append",
    "::_M_default_append",
    "::_M_create",
    "::_M_allocate",
    "::_M_get_node",
    "::_M_create_node",
    "::_M_allocate_buckets",
];

/// Source files of the runtimes' allocation paths: Rust's standard library
/// (`/rustc/HASH/library/alloc/...`, `core`, `std`) and the C++ standard
/// library's headers (`/usr/include/c++/12/bits/stl_vector.h`).
fn runtime_file(file: &str) -> bool {
    (file.starts_with("/rustc/") && file.contains("/library/")) || file.contains("/include/c++/")
}

/// Modules that are not the program's own code: the C library, the
/// loader, the C++ runtime, mtrace's own library; and the allocators'
/// ([`ALLOCATOR_MODULES`]).
const SYSTEM_MODULES: [&str; 10] = [
    "libc.so",
    "libc-",
    "ld-linux",
    "ld-musl",
    "libstdc++",
    "libc++",
    "libgcc_s",
    "libm.so",
    "libpthread",
    "libmtrace",
];

/// File names of the known allocators' libraries, up to the version.
const ALLOCATOR_MODULES: [&str; 3] = ["libjemalloc", "libtcmalloc", "libmimalloc"];

/// Whether `f` is in a known allocator's library (libjemalloc,
/// libtcmalloc, libmimalloc).
pub fn in_allocator_library(f: &Frame) -> bool {
    ALLOCATOR_MODULES.iter().any(|m| f.module.starts_with(m))
}

/// Whether `f` is an allocation wrapper (by [`NAMES`], [`PREFIXES`],
/// [`INSIDE`] or its source file), or one of the program's own that
/// `extra` names (`wrapper:` lines of a suppressions file, matched as a
/// suppression's pattern).
pub fn is_wrapper(f: &Frame, extra: &[String]) -> bool {
    if f.file.as_deref().is_some_and(runtime_file) {
        return true;
    }
    if extra.iter().any(|p| super::suppress::matches_frame(p, f)) {
        return true;
    }
    let Some(name) = f.function.as_deref() else { return false };
    NAMES.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p)) || INSIDE.iter().any(|p| name.contains(p))
}

/// How many of `f`'s leading frames (innermost first) are wrappers; never
/// all of them (a backtrace of nothing else keeps its frames).
pub fn leading_wrappers(f: &[Frame], extra: &[String]) -> usize {
    let n = f.iter().take_while(|fr| is_wrapper(fr, extra)).count();
    if n == f.len() {
        0
    } else {
        n
    }
}

/// Whether `f` is in a module of the system's rather than the program's
/// ([`SYSTEM_MODULES`], an allocator's, or no module at all).
fn system(f: &Frame) -> bool {
    f.module == "?" || SYSTEM_MODULES.iter().any(|m| f.module.starts_with(m)) || in_allocator_library(f)
}

/// The frame of `f` a table that names one per backtrace names: the first
/// in the program's own code (not a wrapper, `extra`'s included, not in a
/// system module), else the first with a function name, else the first.
/// 0 for no frames.
pub fn headline(f: &[Frame], extra: &[String]) -> usize {
    f.iter()
        .position(|fr| !is_wrapper(fr, extra) && !system(fr) && fr.function.is_some())
        .or_else(|| f.iter().position(|fr| fr.function.is_some()))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{headline, leading_wrappers};
    use crate::symbolize::Frame;

    fn frame(function: &str, file: Option<&str>, module: &str) -> Frame {
        Frame {
            address: 0,
            function: Some(function.to_owned()),
            file: file.map(str::to_owned),
            line: file.map(|_| 1),
            module: module.to_owned(),
            offset: 0,
            inlined: false,
        }
    }

    /// A Rust program on a `#[global_allocator]`: the allocator's crate,
    /// the `__rg_`/`__rust_` shims and the `alloc` crate fold; the user's
    /// function is the first shown and named.
    #[test]
    fn rusts_allocation_path_folds_to_the_users_function() {
        let f = [
            frame(
                "<tikv_jemallocator::Jemalloc as core::alloc::global::GlobalAlloc>::alloc",
                Some("src/lib.rs"),
                "prog",
            ),
            frame("__rg_alloc", None, "prog"),
            frame("__rust_alloc", None, "prog"),
            frame("alloc::alloc::alloc", Some("/rustc/abc/library/alloc/src/alloc.rs"), "prog"),
            frame("alloc::raw_vec::RawVec<T,A>::grow_one", None, "prog"),
            frame("leaky::forget_one", Some("src/main.rs"), "prog"),
            frame("leaky::main", Some("src/main.rs"), "prog"),
        ];
        assert_eq!(leading_wrappers(&f, &[]), 5);
        assert_eq!(headline(&f, &[]), 5);
    }

    /// libstdc++'s vector growth folds; a C program's frames do not.
    #[test]
    fn cxx_growth_folds_and_c_does_not() {
        let f = [
            frame("std::__new_allocator<int>::allocate", Some("/usr/include/c++/12/bits/new_allocator.h"), "p"),
            frame("std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>", None, "p"),
            frame("grow", Some("grow.cpp"), "p"),
        ];
        assert_eq!(leading_wrappers(&f, &[]), 2);
        let c = [frame("leak_pvalloc", Some("families.c"), "families"), frame("main", Some("families.c"), "families")];
        assert_eq!(leading_wrappers(&c, &[]), 0);
        assert_eq!(headline(&c, &[]), 0);
    }

    /// A program without line info: its own frame, not glibc's start
    /// (which had a line); nothing but wrappers folds nothing.
    #[test]
    fn the_headline_is_the_programs_own_frame() {
        let f = [
            frame("zmalloc", None, "redis-server"),
            frame("main", None, "redis-server"),
            frame("__libc_start_call_main", Some("../sysdeps/nptl/libc_start_call_main.h"), "libc.so.6"),
        ];
        assert_eq!(headline(&f, &[]), 0);
        let only = [frame("__rust_alloc", None, "p"), frame("__rdl_alloc", None, "p")];
        assert_eq!(leading_wrappers(&only, &[]), 0);
        let mut sys = [frame("malloc", None, "libc.so.6"), frame("g_malloc", None, "libglib-2.0.so.0")];
        sys[0].function = None;
        assert_eq!(headline(&sys, &[]), 1);
    }

    /// The program's own wrappers, named by `wrapper:` lines: redis's
    /// `zmalloc` folds, and the table names its caller.
    #[test]
    fn the_users_wrappers_fold_too() {
        let f = [
            frame("ztrymalloc_usable_internal", Some("zmalloc.c"), "redis-server"),
            frame("zmalloc", Some("zmalloc.c"), "redis-server"),
            frame("createObject", Some("object.c"), "redis-server"),
        ];
        assert_eq!((leading_wrappers(&f, &[]), headline(&f, &[])), (0, 0));
        let extra = ["zmalloc.c".to_owned()];
        assert_eq!((leading_wrappers(&f, &extra), headline(&f, &extra)), (2, 2));
    }
}
