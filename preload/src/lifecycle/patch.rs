//! An allocator defined in the executable (Chromium's PartitionAlloc shim,
//! a program linked with `libtcmalloc_minimal.a`, Rust's tikv-jemallocator
//! with its `_rjem_` names): the loader looks in the executable before any
//! preload, so the program's calls never reach the hooks by name. From the
//! constructor, each allocation function the executable defines (by its
//! symbol tables) is hooked by patching its entry (platform/patch.rs); its
//! hook then calls the original. What was hooked and what was left alone,
//! with why, goes into every stream of the process
//! ([`mtrace_format::Record::Patched`]); the analyzer's report names the
//! allocator as seen, or says what it could not see.
//!
//! Functions at one address (tcmalloc's `malloc` is its `tc_malloc`) are
//! patched once: with the hook of the first name in
//! `mtrace_format::functions`' order, every name's original set. A free
//! that is also an `operator delete` gets a shared free's hook
//! (hooks/shared_free.rs).

use std::collections::BTreeMap;
use std::ffi::CString;

use mtrace_format::functions::{Call, ENTRY_POINTS, INTERPOSED};
use mtrace_format::{Family, Record};

use crate::platform::patch::{self, Site, Trampolines};
use crate::platform::{modules, real, symbols, sys};
use crate::snapshot::stop;

/// The calls of `INTERPOSED` a patch may hook: the malloc family and the
/// C++ operators (not the mappings: the executable's `mmap` is not an
/// allocator of its own).
fn patchable(call: Call) -> bool {
    !call.mapping() && !matches!(call, Call::LoaderState | Call::Exit)
}

/// A function the executable defines that a hook follows: its names (one
/// address may have several) and where it is.
struct Target {
    names: Vec<String>,
    entry: u64,
    size: u64,
}

/// From the constructor of a preloaded library: hooks the allocation
/// functions the executable defines, and writes what it did into the
/// stream `s`. Nothing when the executable defines none (the common case:
/// glibc's malloc, interposed by name).
pub fn executable(s: &crate::stream::Session) {
    // Blocks its allocator made before the jumps were not seen: their
    // frees are no wrong frees. Said before the first hook can run (another
    // thread may call it the moment its jump is written).
    let not_whole = || {
        let collecting = crate::record::recorder::collecting();
        s.write_now(|time_ns| Record::Coverage { time_ns, collecting, whole: false });
    };
    let Some(rec) = patch_executable(not_whole) else { return };
    let stamped = rec.clone();
    s.write_now(move |time_ns| match stamped {
        Record::Patched { patch, .. } => Record::Patched { time_ns, patch },
        other => other,
    });
    patch::remember(rec);
}

/// Finds and patches (`before_jumps` runs once there are jumps to write);
/// the record of it, or `None` when there was nothing to patch.
fn patch_executable(before_jumps: impl FnOnce()) -> Option<Record> {
    let exe = sys::readlink(c"/proc/self/exe")?;
    let (bias, phdrs) = executable_module()?;
    // Looked up for every symbol of the executable (a large C++ one has
    // hundreds of thousands): a set, not the tables' lists.
    let names: std::collections::HashSet<&str> =
        INTERPOSED.iter().filter(|(_, c)| patchable(*c)).chain(ENTRY_POINTS).map(|(n, _)| *n).collect();
    let longest = names.iter().map(|n| n.len()).max().unwrap_or(0);
    let mut found = symbols::defined(c"/proc/self/exe", longest, |n| names.contains(n))?;
    // The C++ operators alone are a program's replacements of them, which
    // forward to malloc (seen by name): patched only beside an allocator
    // the executable defines (Chromium's, a static tcmalloc's).
    if found.iter().all(|f| cxx_operator(&f.name)) {
        found.clear();
    }
    if found.is_empty() {
        return None;
    }
    let mut by_addr: BTreeMap<u64, Target> = BTreeMap::new();
    for f in found {
        let t = by_addr.entry(bias + f.vaddr).or_insert(Target { names: Vec::new(), entry: bias + f.vaddr, size: 0 });
        t.size = t.size.max(f.size);
        t.names.push(f.name);
    }
    let mut hooked = Vec::new();
    let mut refused = Vec::new();
    let refuse_all = |t: &Target, why: &str, refused: &mut Vec<(String, String)>| {
        refused.extend(t.names.iter().map(|n| (n.clone(), why.to_owned())));
    };
    let targets: Vec<Target> = by_addr
        .into_values()
        .map(|mut t| {
            t.names.sort_by_key(|n| order(n));
            t
        })
        .collect();
    let (lo, hi) = span(bias, &phdrs);
    let Some(mut tramp) = Trampolines::near(lo, hi) else {
        for t in &targets {
            refuse_all(t, "no free memory near the executable for its trampolines", &mut refused);
        }
        return Some(patched(exe, hooked, refused));
    };
    let own = own_hooks();
    let mut sites: Vec<(Site, &Target)> = Vec::new();
    for t in &targets {
        // SAFETY: the symbol's bytes are the executable's mapped code.
        let d = match unsafe { patch::displace(t.entry, t.size) } {
            Ok(d) => d,
            Err(why) => {
                refuse_all(t, &why, &mut refused);
                continue;
            }
        };
        // The hook, from the original: the moved instructions' address is
        // known only once they are written, and a shared free's hook
        // takes it; the thunk then gets the hook.
        match place(&mut tramp, &d, t, &own) {
            Ok(site) => sites.push((site, t)),
            Err(why) => refuse_all(t, &why, &mut refused),
        }
    }
    if !tramp.seal() {
        for (_, t) in &sites {
            refuse_all(t, "its trampolines could not be made executable", &mut refused);
        }
        return Some(patched(exe, hooked, refused));
    }
    // The originals first: a hook may run as soon as its jump is written.
    for (site, t) in &sites {
        for n in &t.names {
            set_original(n, site.original as usize);
        }
    }
    if !sites.is_empty() {
        before_jumps();
    }
    let written = write_all(&sites, &phdrs, bias);
    for ((_, t), r) in sites.iter().zip(written) {
        match r {
            Ok(()) => hooked.extend(t.names.iter().cloned()),
            Err(why) => refuse_all(t, &why, &mut refused),
        }
    }
    hooked.sort_by_key(|n| order(n));
    refused.sort_by_key(|(n, _)| order(n));
    Some(patched(exe, hooked, refused))
}

/// The record of what was patched in the module at `path`, at time 0.
fn patched(path: String, hooked: Vec<String>, refused: Vec<(String, String)>) -> Record {
    Record::Patched { time_ns: 0, patch: Box::new(mtrace_format::Patch { path, hooked, refused }) }
}

/// Writes the jumps of `sites` with no other thread running their code:
/// where the process has other threads (another library's constructor
/// started one), they are held from outside (as for the leak scan) and a
/// site one of them is inside is left alone.
fn write_all(sites: &[(Site, &Target)], phdrs: &[libc::Elf64_Phdr], bias: u64) -> Vec<Result<(), String>> {
    let prot = |page: u64| prot_of(page, phdrs, bias);
    let plain: Vec<Site> = sites.iter().map(|(s, _)| *s).collect();
    let me = sys::gettid() as i32;
    if sys::numbered_entries(c"/proc/self/task").iter().all(|&t| t == me) {
        // SAFETY: this thread is the process's only one; the sites come
        // from a sealed mapping.
        return unsafe { patch::write_jumps(&plain, prot) };
    }
    let held = match stop::from_outside(&[me]) {
        Ok(h) if h.missed.is_empty() => h,
        Ok(_) => return sites.iter().map(|_| Err("another thread could not be held".into())).collect(),
        Err(why) => return sites.iter().map(|_| Err(format!("other threads could not be held: {why}"))).collect(),
    };
    let ips: Vec<u64> = held.parked().iter().filter_map(|p| p.regs().get(16).copied()).collect();
    let busy = |s: &Site| ips.iter().any(|&ip| ip > s.entry && ip < s.entry + s.len as u64);
    let free: Vec<Site> = plain.iter().copied().filter(|s| !busy(s)).collect();
    // SAFETY: every other thread is held, none inside a site written.
    let mut done = unsafe { patch::write_jumps(&free, prot) }.into_iter();
    drop(held);
    plain
        .iter()
        .map(
            |s| if busy(s) { Err("a thread was inside its first bytes".into()) } else { done.next().unwrap_or(Ok(())) },
        )
        .collect()
}

/// The thunk and moved instructions of `t`'s entry, jumping to its hook.
fn place(
    tramp: &mut Trampolines,
    d: &patch::Displaced,
    t: &Target,
    own: &BTreeMap<String, u64>,
) -> Result<Site, String> {
    let first = &t.names[0];
    let shared = shared_free(&t.names);
    // A shared free's hook needs its original's address before the
    // thunk: placed with a stand-in, the hook taken, the thunk rewritten.
    let hook = match shared {
        Some(_) => 0,
        None => hook_of(first, own).ok_or_else(|| format!("no hook for {first}"))?,
    };
    let site = tramp.add(d, hook)?;
    if let Some(args) = shared {
        let hook = (crate::UP.shared_free_hook)(args, site.original as usize)
            .ok_or("no slot left for another shared free")? as u64;
        tramp.set_thunk(&site, hook);
    }
    Ok(site)
}

/// For a function whose names are frees of different families (`free`
/// and `operator delete`): the most arguments any of its names takes (an
/// alias ignores what its other names pass beyond its own: Chromium's
/// `free` is also its `operator delete(void*, const std::nothrow_t&)`);
/// `None` otherwise.
fn shared_free(names: &[String]) -> Option<usize> {
    let families: Vec<Family> = names
        .iter()
        .filter_map(|n| match call_of(n)? {
            Call::Free { family } => Some(family),
            _ => None,
        })
        .collect();
    let mixed = families.len() == names.len() && families.windows(2).any(|w| w[0] != w[1]);
    let args: Vec<usize> = names.iter().filter_map(|n| free_args(n)).collect();
    (mixed && args.len() == names.len()).then(|| args.into_iter().max().unwrap_or(1))
}

/// How many arguments the free `name` takes (its C or C++ signature).
fn free_args(name: &str) -> Option<usize> {
    if let Some(rest) = name.strip_prefix("_ZdlPv").or_else(|| name.strip_prefix("_ZdaPv")) {
        let extra = usize::from(rest.contains('m'))
            + usize::from(rest.contains("St11align_val_t"))
            + usize::from(rest.contains("RKSt9nothrow_t"));
        return Some(1 + extra);
    }
    let base = ["_rjem_", "je_"].iter().find_map(|p| name.strip_prefix(p)).unwrap_or(name);
    Some(match base {
        "free" | "cfree" | "tc_free" | "tc_delete" | "tc_deletearray" | "mi_free" => 1,
        "tc_free_sized" | "tc_delete_sized" | "tc_deletearray_sized" | "mi_free_size" | "mi_free_aligned" => 2,
        "free_sized" | "dallocx" => 2,
        "mi_free_size_aligned" | "free_aligned_sized" | "sdallocx" => 3,
        _ => return None,
    })
}

/// Whether `name` is one of the C++ operators new and delete.
fn cxx_operator(name: &str) -> bool {
    matches!(call_of(name), Some(Call::New { .. })) || name.starts_with("_Zd")
}

/// The call `name` stands for, when a patch may hook it.
fn call_of(name: &str) -> Option<Call> {
    INTERPOSED.iter().filter(|(_, c)| patchable(*c)).chain(ENTRY_POINTS).find(|(n, _)| *n == name).map(|&(_, c)| c)
}

/// Where `name` stands in the tables (INTERPOSED first): the name whose
/// hook an address with several names gets.
fn order(name: &str) -> usize {
    INTERPOSED.iter().chain(ENTRY_POINTS).position(|(n, _)| *n == name).unwrap_or(usize::MAX)
}

/// The hook of `name`: this library's export of that name (`own`), or an
/// allocator entry point's hook.
fn hook_of(name: &str, own: &BTreeMap<String, u64>) -> Option<u64> {
    own.get(name).copied().or_else(|| (crate::UP.entry_hook)(name).map(|a| a as u64))
}

/// `name`'s hook calls `original` from now on.
fn set_original(name: &str, original: usize) {
    if INTERPOSED.iter().any(|(n, _)| *n == name) {
        real::set_patched(name, original);
    } else if let Some(i) = ENTRY_POINTS.iter().position(|(n, _)| *n == name) {
        real::set_entry_point(i, original);
    }
}

/// This library's hooks of `INTERPOSED`'s allocation functions, by name:
/// from its own `.dynsym` (read from its file, not asked of the loader,
/// whose `dlopen` and `dlsym` may call the allocator this runs beside).
fn own_hooks() -> BTreeMap<String, u64> {
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
fn executable_module() -> Option<(u64, Vec<libc::Elf64_Phdr>)> {
    let mut out = None;
    modules::each(|path, bias, phdrs| {
        if out.is_none() && path.is_empty() {
            out = Some((bias, phdrs.to_vec()));
        }
    });
    out
}

/// The addresses a module's segments span, [low, high).
fn span(bias: u64, phdrs: &[libc::Elf64_Phdr]) -> (u64, u64) {
    let loads = phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
    let lo = loads.clone().map(|p| bias.wrapping_add(p.p_vaddr)).min().unwrap_or(0);
    let hi = loads.map(|p| bias.wrapping_add(p.p_vaddr + p.p_memsz)).max().unwrap_or(0);
    (lo, hi)
}

/// The protection of the module's page at `page` (from its PT_LOAD).
fn prot_of(page: u64, phdrs: &[libc::Elf64_Phdr], bias: u64) -> Option<i32> {
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
