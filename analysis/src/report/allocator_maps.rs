//! The mappings an allocator made for its own use (its metadata, its
//! arenas), told from the program's own by who called `mmap`: the leak
//! scan does not read them as roots (docs/SCAN.md, "An allocator's own
//! mappings"). Issue 65: jemalloc's extent records, in a mapping of
//! their own, point to the first block of each slab, and a Rust program
//! on tikv-jemallocator that forgot 10 blocks had 1 of them still
//! reachable so; ctests/scan.c linked with `libjemalloc.a`, 3 of 9
//! blocks of the wrong kind.
//!
//! Inside a hook the allocator's calls of `mmap` are not recorded (they
//! are the hooked call's own); those recorded were made outside any hook
//! of the allocator's (a jemalloc in the executable sets itself up from
//! its constructor), each with its backtrace. Those whose first frames
//! are an allocator's code are its own: a function of a known allocator's
//! (named with its internal prefix) or any code in an allocator's
//! library.

use std::collections::HashMap;

use mtrace_format::Family;

use crate::symbolize::{Frame, Symbolizer};
use crate::trace::Trace;

/// Prefixes of the known allocators' internal function names, as their
/// builds give them: jemalloc's private namespace (`je_`, or
/// tikv-jemalloc-sys's `_rjem_je_`), mimalloc's internal functions
/// (`_mi_`), tcmalloc's (the `tcmalloc::` namespace, `TCMalloc_`).
const INTERNAL: [&str; 5] = ["je_", "_rjem_je_", "_mi_", "tcmalloc::", "TCMalloc_"];

/// Return addresses of an `mmap`'s backtrace looked at, from the first:
/// without debug info an allocator's static helper is a frame of its own
/// (`os_pages_map` under `je_pages_map` in `libjemalloc.a`).
const FIRST: usize = 3;

/// Whether `f`, a frame of one of the first return addresses of an
/// `mmap`'s backtrace (with their inlined frames), is an allocator's code.
fn allocators_code(f: &Frame) -> bool {
    super::own_code::in_allocator_library(f)
        || f.function.as_deref().is_some_and(|n| INTERNAL.iter().any(|p| n.starts_with(p)))
}

/// The live mappings of `t` at its snapshot that an allocator made for
/// its own use: (start, end), by the books' order.
pub fn of(t: &Trace, sym: &mut Symbolizer) -> Vec<(u64, u64)> {
    let mut by_stack: HashMap<u32, bool> = HashMap::new();
    let maps: Vec<(u64, u64, u32)> = t
        .books
        .live_blocks()
        .filter(|(_, b)| b.family == Family::Mmap && b.time <= t.snapshot_time)
        .map(|(a, b)| (a, a + b.size, b.stack))
        .collect();
    let mut out = Vec::new();
    for (lo, hi, stack) in maps {
        let own = *by_stack.entry(stack).or_insert_with(|| {
            let first = t.stacks.frames.get(stack as usize).map_or(&[][..], |f| &f[..f.len().min(FIRST)]);
            let time = t.stacks.def_time.get(stack as usize).copied().unwrap_or(0);
            first.iter().any(|&pc| sym.frames(&t.modules, pc, time).iter().any(allocators_code))
        });
        if own {
            out.push((lo, hi));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, module: &str) -> Frame {
        Frame {
            address: 0,
            function: Some(function.into()),
            file: None,
            line: None,
            module: module.into(),
            offset: 0,
            inlined: false,
        }
    }

    #[test]
    fn allocators_code_by_name_or_library() {
        assert!(allocators_code(&frame("_rjem_je_pages_map", "svc")));
        assert!(allocators_code(&frame("je_base_new", "scan")));
        assert!(allocators_code(&frame("_mi_os_alloc", "svc")));
        assert!(allocators_code(&frame("anything", "libjemalloc.so.2")));
        assert!(allocators_code(&frame("TCMalloc_SystemAlloc", "prog")));
        assert!(!allocators_code(&frame("main", "prog")));
        assert!(!allocators_code(&frame("mi_window_new", "prog")));
        assert!(!allocators_code(&frame("make_arena", "libc.so.6")));
    }
}
