//! Which functions of the executable a patch hooks (lifecycle/patch): the
//! allocation functions it defines, by its symbol tables, grouped by
//! address (aliases), each group's hook and where its originals go.

use std::collections::BTreeMap;
use std::ffi::CString;

use mtrace_format::functions::{Call, ENTRY_POINTS, INTERPOSED};
use mtrace_format::Family;

use crate::platform::{modules, real, symbols};

/// The calls of `INTERPOSED` a patch may hook: the malloc family and the
/// C++ operators (not the mappings: the executable's `mmap` is not an
/// allocator of its own).
pub fn patchable(call: Call) -> bool {
    !call.mapping() && !matches!(call, Call::LoaderState | Call::Exit)
}

/// A function the executable defines that a hook follows: its names (one
/// address may have several) and where it is.
pub struct Target {
    /// Its names, the tables' order first ([`order`]).
    pub names: Vec<String>,
    /// Its address.
    pub entry: u64,
    /// Its size, bytes (its symbol's).
    pub size: u64,
}

/// The allocation functions the executable (at `bias`) defines, one per
/// address, in address order; none when it defines none, or only the C++
/// operators (a program's replacements of them, which forward to malloc,
/// seen by name: patched only beside an allocator the executable defines,
/// as Chromium's or a static tcmalloc's).
pub fn in_executable(bias: u64) -> Option<Vec<Target>> {
    // Looked up for every symbol of the executable (a large C++ one has
    // hundreds of thousands): a set, not the tables' lists.
    let names: std::collections::HashSet<&str> =
        INTERPOSED.iter().filter(|(_, c)| patchable(*c)).chain(ENTRY_POINTS).map(|(n, _)| *n).collect();
    let longest = names.iter().map(|n| n.len()).max().unwrap_or(0);
    let found = symbols::defined(c"/proc/self/exe", longest, |n| names.contains(n))?;
    if found.iter().all(|f| cxx_operator(&f.name)) {
        return Some(Vec::new());
    }
    let mut by_addr: BTreeMap<u64, Target> = BTreeMap::new();
    for f in found {
        let t = by_addr.entry(bias + f.vaddr).or_insert(Target { names: Vec::new(), entry: bias + f.vaddr, size: 0 });
        t.size = t.size.max(f.size);
        t.names.push(f.name);
    }
    Some(
        by_addr
            .into_values()
            .map(|mut t| {
                t.names.sort_by_key(|n| order(n));
                t
            })
            .collect(),
    )
}

/// For a function whose names are frees of different families (`free`
/// and `operator delete`): the most arguments any of its names takes (an
/// alias ignores what its other names pass beyond its own: Chromium's
/// `free` is also its `operator delete(void*, const std::nothrow_t&)`);
/// `None` otherwise.
pub fn shared_free(names: &[String]) -> Option<usize> {
    let families: Vec<Family> = names
        .iter()
        .filter_map(|n| match call_of(n)? {
            Call::Free { family, .. } => Some(family),
            _ => None,
        })
        .collect();
    let mixed = families.len() == names.len() && families.windows(2).any(|w| w[0] != w[1]);
    let args: Vec<usize> = names.iter().filter_map(|n| free_args(n)).collect();
    (mixed && args.len() == names.len()).then(|| args.into_iter().max().unwrap_or(1))
}

/// How many arguments the free `name` takes (its C or C++ signature,
/// from the tables: `mtrace_format::functions`).
pub fn free_args(name: &str) -> Option<usize> {
    match call_of(name)? {
        Call::Free { args, .. } => Some(usize::from(args)),
        _ => None,
    }
}

/// Whether `name` is one of the C++ operators new and delete.
pub fn cxx_operator(name: &str) -> bool {
    matches!(call_of(name), Some(Call::New { .. })) || name.starts_with("_Zd")
}

/// The call `name` stands for, when a patch may hook it.
pub fn call_of(name: &str) -> Option<Call> {
    INTERPOSED.iter().filter(|(_, c)| patchable(*c)).chain(ENTRY_POINTS).find(|(n, _)| *n == name).map(|&(_, c)| c)
}

/// Where `name` stands in the tables (INTERPOSED first): the name whose
/// hook an address with several names gets.
pub fn order(name: &str) -> usize {
    INTERPOSED.iter().chain(ENTRY_POINTS).position(|(n, _)| *n == name).unwrap_or(usize::MAX)
}

/// The hook of `name`: this library's export of that name (`own`), or an
/// allocator entry point's hook.
pub fn hook_of(name: &str, own: &BTreeMap<String, u64>) -> Option<u64> {
    let entry_hook = || {
        let i = ENTRY_POINTS.iter().position(|(n, _)| *n == name)?;
        crate::platform::hook_addresses::entry_point(i).map(|a| a as u64)
    };
    own.get(name).copied().or_else(entry_hook)
}

/// `name`'s hook calls `original` from now on.
pub fn set_original(name: &str, original: usize) {
    if INTERPOSED.iter().any(|(n, _)| *n == name) {
        real::set_patched(name, original);
    } else if let Some(i) = ENTRY_POINTS.iter().position(|(n, _)| *n == name) {
        real::set_entry_point(i, original);
    }
}

/// This library's hooks of `INTERPOSED`'s allocation functions, by name:
/// from its own `.dynsym` (read from its file, not asked of the loader,
/// whose `dlopen` and `dlsym` may call the allocator this runs beside).
pub fn own_hooks() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let here = own_hooks as fn() -> BTreeMap<String, u64> as usize as u64;
    modules::each(|path, bias, phdrs| {
        let (lo, hi) = span(bias, phdrs);
        if !(lo..hi).contains(&here) {
            return;
        }
        let Ok(path) = CString::new(path) else { return };
        let wanted = |n: &str| INTERPOSED.iter().any(|(m, c)| *m == n && patchable(*c));
        for f in symbols::defined(&path, usize::MAX, wanted).unwrap_or_default() {
            out.insert(f.name, bias + f.vaddr);
        }
    });
    out
}

/// The executable's load bias and program headers.
pub fn executable_module() -> Option<(u64, Vec<libc::Elf64_Phdr>)> {
    let mut out = None;
    modules::each(|path, bias, phdrs| {
        if out.is_none() && path.is_empty() {
            out = Some((bias, phdrs.to_vec()));
        }
    });
    out
}

/// The addresses a module's segments span, [low, high).
pub fn span(bias: u64, phdrs: &[libc::Elf64_Phdr]) -> (u64, u64) {
    let loads = phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
    let lo = loads.clone().map(|p| bias.wrapping_add(p.p_vaddr)).min().unwrap_or(0);
    let hi = loads.map(|p| bias.wrapping_add(p.p_vaddr + p.p_memsz)).max().unwrap_or(0);
    (lo, hi)
}

/// The protection of the module's page at `page` (from its PT_LOAD).
pub fn prot_of(page: u64, phdrs: &[libc::Elf64_Phdr], bias: u64) -> Option<i32> {
    let seg = phdrs.iter().find(|p| {
        p.p_type == libc::PT_LOAD && {
            let lo = bias.wrapping_add(p.p_vaddr) & !4095;
            let hi = bias.wrapping_add(p.p_vaddr + p.p_memsz);
            (lo..hi).contains(&page)
        }
    })?;
    let f = seg.p_flags;
    Some(
        (if f & libc::PF_R != 0 { libc::PROT_READ } else { 0 })
            | (if f & libc::PF_W != 0 { libc::PROT_WRITE } else { 0 })
            | (if f & libc::PF_X != 0 { libc::PROT_EXEC } else { 0 }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_free_that_is_also_a_delete_is_shared_and_its_arguments_are_counted() {
        // gperftools: free, cfree, tc_free, tc_delete and operator delete at one address.
        assert_eq!(shared_free(&names(&["free", "cfree", "_ZdlPv", "tc_free", "tc_delete"])), Some(1));
        assert_eq!(shared_free(&names(&["_ZdlPvm", "tc_free_sized", "tc_delete_sized"])), Some(2));
        // Chromium: free is also the nothrow delete, of two arguments.
        assert_eq!(shared_free(&names(&["free", "cfree", "_ZdlPv", "_ZdlPvRKSt9nothrow_t"])), Some(2));
        // One family: the name's own hook.
        assert_eq!(shared_free(&names(&["free", "cfree", "tc_free"])), None);
        assert_eq!(shared_free(&names(&["malloc", "tc_malloc"])), None);
        assert_eq!(free_args("_ZdaPvmSt11align_val_t"), Some(3));
        assert_eq!(free_args("_ZdlPvRKSt9nothrow_t"), Some(2));
        assert_eq!(free_args("_rjem_sdallocx"), Some(3));
        assert_eq!(free_args("malloc"), None);
    }

    #[test]
    fn the_first_name_in_the_tables_order_gets_the_hook() {
        let mut n = names(&["tc_malloc", "malloc"]);
        n.sort_by_key(|n| order(n));
        assert_eq!(n, ["malloc", "tc_malloc"]);
        assert!(call_of("mmap").is_none());
        // The C++ operators alone are no allocator of the executable's.
        assert!(cxx_operator("_Znwm") && cxx_operator("_ZdlPvm") && cxx_operator("_ZnamSt11align_val_t"));
        assert!(!cxx_operator("malloc") && !cxx_operator("tc_new") && !cxx_operator("_rjem_malloc"));
        assert!(call_of("_rjem_sdallocx").is_some());
    }
}
