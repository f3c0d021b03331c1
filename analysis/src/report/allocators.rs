//! Which allocators the traced process had, where, and whether mtrace saw
//! their calls: read from the symbol tables (`.dynsym` and `.symtab`) of
//! the modules the trace names. What no producer could see is said in the
//! report, above the leak summary, so that "All blocks were freed" is never
//! the whole answer for a program whose allocations went past the tracer.
//!
//! How each producer sees an allocator (docs/ALLOCATORS.md):
//! - the preload interposes on the malloc family by name: a shared library
//!   that defines `malloc` (libjemalloc, libtcmalloc, libmimalloc) is seen
//!   through the hooks, which forward to it; an executable that defines
//!   `malloc` wins over any preload (the loader looks in the executable
//!   first), and so do an allocator's own prefixed entry points
//!   (`_rjem_mallocx` of Rust's tikv-jemallocator, `mi_malloc`), which no
//!   hook has the name of — unless the preload hooked them by patching
//!   their entry, which its stream says ([`mtrace_format::Patch`]);
//! - the ptrace tracer puts breakpoints on the malloc family's symbols in
//!   every module, the executable's included, and on allocators' own
//!   entry points (jemalloc's under its prefixes too); a stripped static
//!   executable has none.

use std::collections::HashSet;
use std::path::Path;

use object::{Object, ObjectSymbol};

use mtrace_format::functions::prefixes_of;

use crate::symbolize::{Mapped, Symbolizer};
use crate::trace::Trace;

/// An allocator found in one module.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Allocator {
    /// `jemalloc`, `tcmalloc`, `mimalloc`, or `malloc` (an allocator of
    /// the program's own that defines `malloc`).
    pub name: &'static str,
    /// The module's path, as the trace names it.
    pub module: String,
    /// Its calls reached mtrace (the malloc family's, by the names the
    /// producers follow); false: they did not.
    pub seen: bool,
    /// How, in a few words ("interposed", "defined in the executable, which
    /// wins over the preload", "only prefixed entry points (_rjem_)").
    pub how: String,
}

impl Allocator {
    /// How the report names it: `jemalloc`, or "the program's own malloc".
    pub fn label(&self) -> &str {
        if self.name == "malloc" {
            "the program's own malloc"
        } else {
            self.name
        }
    }
}

/// Marker symbols of the allocators known by name: (name, symbols it
/// defines under its own name, symbols it defines under each prefix of
/// its entry points). The prefixes are the producers' table's
/// (`mtrace_format::functions::prefixes_of`): jemalloc's `mallctl`,
/// `je_mallctl` and `_rjem_malloc` all say jemalloc.
const KNOWN: &[(&str, &[&str], &[&str])] = &[
    ("jemalloc", &["mallctl"], &["mallctl", "malloc"]),
    ("tcmalloc", &[], &["malloc", "free"]),
    ("mimalloc", &[], &["malloc", "free"]),
];

/// [`KNOWN`]'s allocators' prefixes, by their place in it: made once
/// ([`relevant`] asks for every symbol of every module).
fn prefixes(allocator: &str) -> &'static [&'static str] {
    static ALL: std::sync::LazyLock<Vec<Vec<&'static str>>> =
        std::sync::LazyLock::new(|| KNOWN.iter().map(|(a, _, _)| prefixes_of(a)).collect());
    KNOWN.iter().position(|(a, _, _)| *a == allocator).map_or(&[], |i| ALL[i].as_slice())
}

/// The malloc family's names whose definition makes a module the
/// process's allocator.
const MALLOC: &[&str] = &["malloc", "free", "calloc", "realloc"];

/// What [`survey`] found.
#[derive(Clone, Debug, Default)]
pub struct Survey {
    /// The allocators, each module once, in the order first seen.
    pub allocators: Vec<Allocator>,
    /// Some module defines `malloc`: libc, or a module whose file was read.
    pub malloc_defined: bool,
    /// The executable's file was found and read.
    pub exe_read: bool,
}

/// The allocators of `t`'s modules, found through the binaries `sym`
/// locates; modules whose file is not found are left out, but for one the
/// producer patched (its record names the functions: a trace from a
/// target whose binaries this host lacks). libc (glibc's malloc), the
/// loader and mtrace's own library are not listed.
pub fn survey(t: &Trace, sym: &Symbolizer) -> Survey {
    let preloaded = t.modules.iter().any(|m| file_name(&m.module.path).starts_with("libmtrace"));
    let mut done = HashSet::new();
    let mut out = Survey::default();
    for m in &t.modules {
        let path = &m.module.path;
        let name = file_name(path);
        if name.starts_with("libc.so") {
            out.malloc_defined = true;
        }
        if !done.insert(path.clone())
            || name.starts_with("libc.so")
            || name.starts_with("ld-linux")
            || name.starts_with("libmtrace")
            || name.starts_with("linux-vdso")
        {
            continue;
        }
        let patched = t.patched.iter().find(|p| p.path == *path);
        let is_exe = *path == t.header.exe;
        let defined = match sym.binary(path, &m.module.build_id).and_then(|f| defined_names(&f)) {
            Some(d) => {
                out.exe_read |= is_exe;
                d
            }
            None => match patched {
                Some(p) => {
                    p.hooked.iter().chain(p.refused.iter().map(|(n, _)| n)).filter(|n| relevant(n)).cloned().collect()
                }
                None => continue,
            },
        };
        out.malloc_defined |= defined.contains("malloc");
        // The ptrace tracer's Patched record names its breakpoints, which
        // classify words already.
        let patched = patched.filter(|_| preloaded);
        if let Some(a) = classify(&defined, path, is_exe, preloaded).map(|a| with_patch(a, patched)) {
            out.allocators.push(a);
        }
    }
    out
}

/// The allocator a module with the defined function names `defined` is,
/// if any, and whether its calls are seen: by the preload (`preloaded`)
/// or by the ptrace tracer; `is_exe`: the module is the executable.
pub fn classify(defined: &HashSet<String>, path: &str, is_exe: bool, preloaded: bool) -> Option<Allocator> {
    let has = |n: &str| defined.contains(n);
    let defines_malloc = has("malloc") && has("free");
    let marked = |(a, plain, prefixed): &&(&str, &[&str], &[&str])| {
        plain.iter().any(|m| has(m)) || prefixes(a).iter().any(|p| prefixed.iter().any(|m| has(&format!("{p}{m}"))))
    };
    let known = KNOWN.iter().find(marked);
    let name = match known {
        Some((n, _, _)) => *n,
        // glibc's malloc, linked statically with the rest of glibc: the
        // one the tracer expects. (Chromium's shim defines `__libc_malloc`
        // too, but takes `__libc_start_main` from libc.so.)
        None if has("__libc_malloc") && has("__libc_start_main") => return None,
        None if defines_malloc && MALLOC.iter().all(|n| has(n)) => "malloc",
        None => return None,
    };
    let used: Vec<&str> = known
        .map(|(n, _, _)| prefixes(n).iter().copied().filter(|p| defined.iter().any(|d| d.starts_with(p))).collect())
        .unwrap_or_default();
    let (seen, how) = match (defines_malloc, is_exe, preloaded) {
        (true, false, true) => (true, "interposed: the preload's hooks forward to it".to_owned()),
        (true, true, true) => (false, "defined in the executable, which wins over the preload".to_owned()),
        (true, _, false) => (true, "breakpoints on its malloc family".to_owned()),
        (false, _, false) => (true, format!("breakpoints on its own entry points ({})", used.join(", "))),
        (false, _, true) => (false, format!("only its own prefixed entry points ({})", used.join(", "))),
    };
    Some(Allocator { name, module: path.to_owned(), seen, how })
}

/// `a` as the producer's patching of its module (`patched`) left it: seen
/// when the producer hooked its entry points (the functions it had to
/// leave alone are named by [`notices`]).
fn with_patch(a: Allocator, patched: Option<&mtrace_format::Patch>) -> Allocator {
    match patched {
        Some(p) if !p.hooked.is_empty() => {
            let mut names: Vec<&str> = p.hooked.iter().map(String::as_str).take(4).collect();
            if p.hooked.len() > names.len() {
                names.push("…");
            }
            let how = format!(
                "hooked by patching its entry points ({} function{}: {})",
                p.hooked.len(),
                if p.hooked.len() == 1 { "" } else { "s" },
                names.join(", ")
            );
            Allocator { seen: true, how, ..a }
        }
        _ => a,
    }
}

/// A name [`classify`] looks at: the malloc family's, glibc's own, or one
/// of a known allocator's.
fn relevant(n: &str) -> bool {
    MALLOC.contains(&n)
        || n == "__libc_malloc"
        || n == "__libc_start_main"
        || KNOWN.iter().any(|(a, plain, _)| plain.contains(&n) || prefixes(a).iter().any(|p| n.starts_with(p)))
}

/// The names [`classify`] looks at among those of the functions and
/// objects `file` defines, from `.dynsym` and `.symtab`, without symbol
/// versions; `None` for a file that is not an object file.
fn defined_names(file: &Path) -> Option<HashSet<String>> {
    let m = Mapped::open(file)?;
    let o = m.object()?;
    let mut out = HashSet::new();
    for s in o.dynamic_symbols().chain(o.symbols()) {
        if s.is_undefined() || s.address() == 0 {
            continue;
        }
        let Ok(n) = s.name() else { continue };
        let n = n.split('@').next().unwrap_or(n);
        if relevant(n) {
            out.insert(n.to_owned());
        }
    }
    Some(out)
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// What mtrace could not see, one line each, for the report's summary and
/// JSON: the allocators it did not see, and a process in none of whose
/// modules it found `malloc` (a stripped static executable under
/// `--ptrace`); and backtraces a trace used before it defined them.
pub fn notices(t: &Trace, found: &Survey) -> Vec<String> {
    let mut out: Vec<String> = found
        .allocators
        .iter()
        .filter(|a| !a.seen)
        .map(|a| {
            let patched = t.patched.iter().any(|p| p.path == a.module);
            let how = if patched { "its entry points could not be hooked (below)" } else { a.how.as_str() };
            format!("{} in {}: {how}; mtrace does not see the allocations made through it", a.label(), a.module)
        })
        .collect();
    for p in &t.patched {
        // One line per reason: a build with `-pg` refuses every function alike.
        let mut reasons: Vec<(&str, Vec<&str>)> = Vec::new();
        for (name, why) in &p.refused {
            match reasons.iter_mut().find(|(w, _)| w == why) {
                Some((_, names)) => names.push(name),
                None => reasons.push((why, vec![name])),
            }
        }
        for (why, names) in reasons {
            let them = if names.len() == 1 { "it" } else { "them" };
            out.push(format!(
                "{} in {}: not hooked ({why}); mtrace does not see the calls made to {them}",
                names.join(", "),
                p.path
            ));
        }
    }
    let exe = t.patched.first().map_or(t.header.exe.as_str(), |p| p.path.as_str());
    let unseen = format!(
        "the program's own allocator in {exe} may hand out and take back blocks through functions of its own, \
         which mtrace does not see"
    );
    match t.books.frees_again {
        0 => {}
        1 => out
            .push(format!("1 free of an address mtrace had seen freed already is not called a double free: {unseen}")),
        n => out.push(format!(
            "{n} frees of an address mtrace had seen freed already are not called double frees: {unseen}"
        )),
    }
    // The block mtrace holds at the address may be gone, and the address
    // handed out again, unseen.
    match t.books.frees_unjudged {
        0 => {}
        1 => out.push(format!(
            "1 free by another family than the block's allocation (or told another size) is not called \
             mismatched: {unseen}"
        )),
        n => out.push(format!(
            "{n} frees by another family than their blocks' allocations (or told other sizes) are not called \
             mismatched: {unseen}"
        )),
    }
    if t.stacks.undefined > 0 {
        out.push(format!(
            "{} backtraces were used before the trace defined them: the blocks allocated there are shown \
             without a backtrace (a fault of the tracer that wrote the trace; please report it)",
            t.stacks.undefined
        ));
    }
    if out.is_empty() {
        out.extend(unexplained_growth(&t.timeline));
    }
    if found.exe_read && !found.malloc_defined {
        out.push(format!(
            "{}: no module of the process defines malloc (a stripped static executable?): mtrace had no allocator to trace",
            t.header.exe
        ));
    }
    out
}

/// RSS growth (bytes) below which [`unexplained_growth`] says nothing: a
/// program's libraries, stacks and page cache move the RSS by a few MiB
/// without an allocation.
const GROWTH_MIN: u64 = 64 << 20;

/// The line for a process whose RSS grew by [`GROWTH_MIN`] or more while
/// the blocks and mappings mtrace saw stayed under an eighth of that
/// growth (from the RSS samples of `timeline`): memory from somewhere
/// mtrace does not look (an allocator it found no symbol of, a runtime
/// calling `mmap` by system call).
fn unexplained_growth(timeline: &[crate::trace::TimePoint]) -> Option<String> {
    let first = timeline.first()?.rss_bytes;
    let (top, heap) = timeline.iter().fold((first, 0u64), |(r, h), p| (r.max(p.rss_bytes), h.max(p.heap_bytes)));
    let growth = top.saturating_sub(first);
    (growth >= GROWTH_MIN && heap < growth / 8).then(|| {
        format!(
            "the RSS grew by {} MiB while the blocks and mappings mtrace saw peaked at {} MiB: \
             the program takes memory mtrace does not see",
            growth >> 20,
            heap >> 20
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> HashSet<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_preloaded_shared_allocator_is_seen_and_one_in_the_executable_is_not() {
        let je = names(&["malloc", "free", "calloc", "realloc", "mallctl", "mallocx"]);
        let a = classify(&je, "/usr/lib/libjemalloc.so.2", false, true).unwrap();
        assert_eq!((a.name, a.seen), ("jemalloc", true));
        let a = classify(&je, "/usr/bin/redis", true, true).unwrap();
        assert_eq!((a.name, a.seen), ("jemalloc", false));
        // Under ptrace the executable's malloc has its breakpoint.
        assert!(classify(&je, "/usr/bin/redis", true, false).unwrap().seen);
        let own = names(&["malloc", "free", "calloc", "realloc", "main"]);
        let a = classify(&own, "/tmp/own", true, true).unwrap();
        assert_eq!((a.name, a.seen), ("malloc", false));
        assert_eq!(a.how, "defined in the executable, which wins over the preload");
    }

    #[test]
    fn prefixed_entry_points_alone_are_not_seen() {
        let rust = names(&["_rjem_mallocx", "_rjem_sdallocx", "_rjem_malloc", "main"]);
        let a = classify(&rust, "/tmp/svc", true, true).unwrap();
        assert_eq!((a.name, a.seen), ("jemalloc", false));
        assert_eq!(a.how, "only its own prefixed entry points (_rjem_)");
        // The ptrace tracer's breakpoints follow the prefixed names.
        assert!(classify(&rust, "/tmp/svc", true, false).unwrap().seen);
        let mi = names(&["mi_malloc", "mi_free", "mi_malloc_aligned"]);
        assert_eq!(classify(&mi, "/tmp/svc", true, true).unwrap().how, "only its own prefixed entry points (mi_)");
    }

    #[test]
    fn growth_the_books_do_not_explain_is_named() {
        let p = |rss: u64, heap: u64| crate::trace::TimePoint {
            time_ns: 0,
            rss_bytes: rss << 20,
            heap_bytes: heap << 20,
            heap_blocks: 0,
        };
        assert_eq!(
            unexplained_growth(&[p(10, 0), p(200, 3), p(150, 2)]).as_deref(),
            Some(
                "the RSS grew by 190 MiB while the blocks and mappings mtrace saw peaked at 3 MiB: \
                 the program takes memory mtrace does not see"
            )
        );
        // Explained by what was seen, or too small to say.
        assert_eq!(unexplained_growth(&[p(10, 0), p(200, 150)]), None);
        assert_eq!(unexplained_growth(&[p(10, 0), p(60, 0)]), None);
        assert_eq!(unexplained_growth(&[]), None);
    }

    #[test]
    fn a_module_without_an_allocator_is_none() {
        assert_eq!(classify(&names(&["main", "free_list"]), "/tmp/p", true, true), None);
        // Defining malloc alone (a wrapper, not the family) is no allocator.
        assert_eq!(classify(&names(&["malloc"]), "/tmp/p", true, true), None);
        let glibc = names(&["malloc", "free", "calloc", "realloc", "__libc_malloc", "__libc_start_main"]);
        assert_eq!(classify(&glibc, "/tmp/static", true, false), None);
        // Chromium's shim: the family and glibc's aliases, not glibc.
        let shim = names(&["malloc", "free", "calloc", "realloc", "__libc_malloc"]);
        assert_eq!(classify(&shim, "/usr/lib/chromium/chromium", true, true).map(|a| a.seen), Some(false));
    }
}
