//! Tracing a process that is already running: `mtrace attach` loads this
//! library into it with `dlopen` (its constructor then stays dormant: the
//! library is not in `LD_PRELOAD`) and calls `mtrace_attach_init` (session/attach.rs), which
//! starts a session with the attacher's settings and redirects the
//! process's calls to the hooks by rewriting GOT entries (got.rs). Modules
//! loaded later are redirected when the writer notices them. [`undo`] puts
//! every entry back (detach): the library stays mapped but inert, and a
//! later attach calls `mtrace_attach_init` (session/attach.rs) again.

mod got;

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};

use mtrace_format::functions::{ENTRY_POINTS, INTERPOSED};
use parking_lot::Mutex;

use crate::{platform::modules, platform::sys};

/// The GOT slots rewritten, and the modules (by load bias) already done.
struct Redirected {
    slots: Vec<got::Slot>,
    done: Vec<u64>,
}

static STATE: Mutex<Redirected> = Mutex::new(Redirected { slots: Vec::new(), done: Vec::new() });
static ATTACHED: AtomicBool = AtomicBool::new(false);
/// Set by the constructor when [`preloaded`] held: the program may rewrite
/// its environment later (a process title, as redis-server's), and the
/// constructor itself drops the library from `LD_PRELOAD`.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Whether this library was loaded by `mtrace attach` (not preloaded).
pub fn attached() -> bool {
    ATTACHED.load(Ordering::Acquire)
}

/// Whether this library is named in `LD_PRELOAD` (else it was loaded by
/// `dlopen`, and waits for `mtrace_attach_init` (session/attach.rs)). Read once, by the
/// constructor, while the environment is the one the process started with.
pub fn preloaded() -> bool {
    let Some(me) = modules::own_path() else { return true };
    let base = me.rsplit('/').next().unwrap_or(&me).to_owned();
    let named =
        sys::getenv(c"LD_PRELOAD").is_some_and(|p| p.split([':', ' ']).any(|e| e.rsplit('/').next() == Some(&base)));
    if named {
        PRELOADED.store(true, Ordering::Release);
    }
    named
}

/// The hooks by name: this library's exported functions that interpose on
/// the program's (`nm -D libmtrace.so`), leaving out its own API
/// (`mtrace_*`), which a program only calls when it was built for it.
fn hooks() -> HashMap<Vec<u8>, u64> {
    let mut out = HashMap::new();
    let Some(path) = modules::own_path().and_then(|p| CString::new(p).ok()) else { return out };
    let Some((lo, hi)) = modules::range_of(hooks as *const () as usize) else { return out };
    // SAFETY: RTLD_NOLOAD returns the handle of this loaded library.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if handle.is_null() {
        return out;
    }
    for name in hooked() {
        let c = CString::new(name).expect("no NUL in a symbol name");
        // SAFETY: a valid handle and name.
        let a = unsafe { libc::dlsym(handle, c.as_ptr()) } as usize;
        if (lo..hi).contains(&a) {
            out.insert(name.as_bytes().to_vec(), a as u64);
        }
    }
    // SAFETY: drops the reference RTLD_NOLOAD took.
    unsafe { libc::dlclose(handle) };
    out
}

/// The functions the hooks interpose on (hooks/): the allocation functions
/// of the shared table (`mtrace_format::functions::INTERPOSED`), and the
/// process's lifetime, descriptors and the C API.
fn hooked() -> impl Iterator<Item = &'static str> {
    INTERPOSED.iter().map(|&(name, _)| name).chain(OTHER_HOOKS.iter().copied())
}

/// The hooks that are not allocation functions.
const OTHER_HOOKS: &[&str] = &[
    "malloc_usable_size",
    "_exit",
    "_Exit",
    "abort",
    "execve",
    "execv",
    "execvp",
    "execvpe",
    "execl",
    "execle",
    "execlp",
    "fexecve",
    "posix_spawn",
    "posix_spawnp",
    "dlclose",
    "close",
    "dup2",
    "dup3",
    "close_range",
    "closefrom",
    "mtrace",
    "muntrace",
];

/// Allocators' own entry points are followed in a preloaded process too
/// (set by the constructor): the malloc family is interposed by name
/// there, these only through the GOT.
static ENTRY_POINTS_ON: AtomicBool = AtomicBool::new(false);

/// From the constructor of a preloaded library: the calls of allocators'
/// own entry points are redirected to their hooks, now and in every module
/// loaded later.
pub fn follow_entry_points() {
    ENTRY_POINTS_ON.store(true, Ordering::Release);
    redirect_new();
}

/// The hooks of allocators' own entry points, by name (registered by the
/// constructor: the hooks are the room above). Found without the loader:
/// a failed `dlsym` (most entry points are nowhere) leaves glibc's
/// per-thread error block allocated, which a fork's child frees as a
/// block its trace never saw.
fn entry_hooks() -> HashMap<Vec<u8>, (usize, u64)> {
    ENTRY_POINTS
        .iter()
        .enumerate()
        .filter_map(|(i, &(name, _))| {
            Some((name.as_bytes().to_vec(), (i, crate::platform::hook_addresses::entry_point(i)? as u64)))
        })
        .collect()
}

/// The function entry point `name` (index `i`) of a GOT slot now holding
/// `value`, in the module spanning `module` (its own PLT stub there: a lazy
/// binding not yet made, which the loader then resolves by name), kept as
/// the real function its hook calls.
fn entry_point_of(i: usize, name: &[u8], value: u64, module: (u64, u64)) -> Option<u64> {
    if let Some(known) = crate::platform::real::entry_point(i) {
        return Some(known as u64);
    }
    let real = if value == 0 {
        // A weak reference nothing defines (a program probing for jemalloc).
        return None;
    } else if !(module.0 <= value && value < module.1) {
        value as usize
    } else {
        // The program calls it, so some module defines it.
        let c = CString::new(name).ok()?;
        crate::platform::real::find_entry_point(&c)?
    };
    crate::platform::real::set_entry_point(i, real);
    Some(real as u64)
}

/// Redirects the modules not redirected yet (all of them on the first
/// call; then those loaded since): every hook when attached, allocators'
/// own entry points in a preloaded process. The vDSO and this library are
/// left alone, and so are the loader's calls (see
/// [`got::loader_allocator`]); a module that defines one of the entry
/// points keeps its own calls of them (its `mi_realloc` may call its
/// `mi_malloc`: one call of the program's, one record).
pub fn redirect_new() {
    let attached = attached();
    if !attached && !ENTRY_POINTS_ON.load(Ordering::Acquire) {
        return;
    }
    let entries = entry_hooks();
    let table = if attached { hooks() } else { HashMap::new() };
    let own = modules::range_of(hooks as *const () as usize).map(|(lo, hi)| lo as u64..hi as u64);
    let mut st = STATE.lock();
    let pairs: Vec<(u64, u64)> = [c"malloc", c"calloc", c"realloc", c"free"]
        .iter()
        .filter(|_| attached)
        .filter_map(|n| crate::platform::real::canonical_plt(n).err())
        .map(|(plt, real)| (plt as u64, real as u64))
        .filter(|&(_, real)| real != 0)
        .collect();
    // The loader first: until its pointers are libc's, a hook could be
    // entered from its TLS allocation.
    for loader_pass in [true, false] {
        modules::each(|path, bias, phdrs| {
            let loader = path.contains("ld-linux");
            let first = phdrs.iter().find(|p| p.p_type == libc::PT_LOAD).map(|p| bias.wrapping_add(p.p_vaddr));
            let is_own = own.as_ref().zip(first).is_some_and(|(r, a)| r.contains(&a));
            if loader != loader_pass || path.contains("linux-vdso") || is_own || st.done.contains(&bias) {
                return;
            }
            st.done.push(bias);
            if loader && !attached {
                return;
            }
            let span = module_span(bias, phdrs);
            // SAFETY: the module is loaded for the duration of the callback.
            let slots = unsafe {
                if loader {
                    got::loader_allocator(bias, phdrs, &pairs)
                } else {
                    got::redirect(bias, phdrs, |name, value| {
                        if let Some(&hook) = table.get(name) {
                            return Some(hook);
                        }
                        let &(i, hook) = entries.get(name)?;
                        let real = entry_point_of(i, name, value, span)?;
                        // The module that defines it keeps its own calls
                        // (its mi_realloc may call its mi_malloc).
                        (!(span.0 <= real && real < span.1)).then_some(hook)
                    })
                }
            };
            st.slots.extend(slots);
        });
    }
}

/// The addresses the module at `bias` with `phdrs` spans, [low, high).
fn module_span(bias: u64, phdrs: &[libc::Elf64_Phdr]) -> (u64, u64) {
    let loads = phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
    let lo = loads.clone().map(|p| bias.wrapping_add(p.p_vaddr)).min().unwrap_or(0);
    let hi = loads.map(|p| bias.wrapping_add(p.p_vaddr + p.p_memsz)).max().unwrap_or(0);
    (lo, hi)
}

/// Puts back every GOT entry [`redirect_new`] changed, in modules still
/// loaded: from now on the program's calls go where they went before.
pub fn undo() {
    if !ATTACHED.swap(false, Ordering::AcqRel) {
        return;
    }
    crate::lifecycle::requests::uninstall();
    crate::lifecycle::patch::undo();
    let mut st = STATE.lock();
    let mut relro: HashMap<u64, Option<Option<(u64, u64)>>> = HashMap::new();
    for s in std::mem::take(&mut st.slots).into_iter().rev() {
        let r = *relro.entry(s.bias).or_insert_with(|| got::relro_of(s.bias));
        if let Some(r) = r {
            // SAFETY: the module is still loaded; the slot is its GOT word.
            unsafe { got::write_slot(s.addr, s.old, r) };
        }
    }
    st.done.clear();
}

/// Whether `mtrace_attach_init` (session/attach.rs) may start: not when another
/// attach traces the process, or it runs with the library preloaded and a
/// session (returned as its -2 and -3).
pub fn may_start() -> Result<(), i32> {
    if attached() {
        return Err(-2);
    }
    if PRELOADED.load(Ordering::Acquire) && crate::stream::current().is_some() {
        return Err(-3);
    }
    Ok(())
}

/// The attach's session started: the process's calls go to the hooks
/// from now on (the modules loaded now; later ones at the writer's
/// rounds).
pub fn started() {
    ATTACHED.store(true, Ordering::Release);
    redirect_new();
}
