//! The real allocation functions, found with `dlsym(RTLD_NEXT, …)`, and the
//! static bootstrap arena that serves the allocations made while they are
//! being found (`dlsym` itself calls `calloc`).

use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::static_tls::FastLocal;

/// A function pointer resolved lazily by name from the next object in the
/// lookup order. `0` means not resolved yet, `1` that it does not exist.
/// `b`, a symbol's name ending in NUL, as a C string, in a const context
/// (a compile-time error without the NUL): for the `NextFn` of a hook a
/// macro names (`concat!(stringify!(NAME), "\0")`).
pub const fn cstr(b: &'static [u8]) -> &'static CStr {
    match CStr::from_bytes_with_nul(b) {
        Ok(c) => c,
        Err(_) => panic!("symbol name without NUL"),
    }
}

pub struct NextFn {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl NextFn {
    pub const fn new(name: &'static CStr) -> NextFn {
        NextFn { name, addr: AtomicUsize::new(0) }
    }

    /// The address of the next definition, or `None` when no later object defines it.
    pub fn get(&self) -> Option<usize> {
        let a = self.addr.load(Ordering::Acquire);
        if a > 1 {
            return Some(a);
        }
        if a == 1 {
            return None;
        }
        let p = if let Some(p) = patched(self.name) {
            p
        } else if FROM_DEFAULT.load(Ordering::Acquire) {
            from_default(self.name)
        } else {
            // SAFETY: dlsym with a NUL-terminated name is always safe to
            // call; RTLD_NEXT searches the objects loaded after this one.
            unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) as usize }
        };
        self.addr.store(if p == 0 { 1 } else { p }, Ordering::Release);
        (p != 0).then_some(p)
    }
}

/// Resolve in the global scope: this library was loaded with `dlopen`
/// (`RTLD_LOCAL`) by `mtrace attach`, so it is not in that scope, and no
/// object comes after it for `RTLD_NEXT`; the global scope's first
/// definition is the function the program's calls went to.
static FROM_DEFAULT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `name` in the global scope, as the program's calls resolve it; but not
/// a non-PIE executable's *canonical PLT entry* (an undefined symbol with
/// the address of its PLT stub, which the loader hands out so that the
/// function's address is the same everywhere, System V x86-64 psABI 5.2):
/// that stub jumps through the GOT slot the hooks take over, so calling it
/// would call the hook. libc's own definition is used then.
fn from_default(name: &CStr) -> usize {
    match canonical_plt(name) {
        Ok(p) => p,
        Err((_, real)) => real,
    }
}

/// `name` in the global scope: `Ok(address)`, or `Err((canonical PLT
/// entry, libc's function))` when the global scope's answer is a non-PIE
/// executable's canonical PLT entry (see [`from_default`]).
pub fn canonical_plt(name: &CStr) -> Result<usize, (usize, usize)> {
    /// `RTLD_DL_SYMENT` (dlfcn.h): dladdr1 returns the symbol's entry.
    const RTLD_DL_SYMENT: i32 = 1;
    // SAFETY: dlsym and dladdr1 with valid arguments; the symbol entry
    // dladdr1 returns points into a loaded object's symbol table, whose
    // `st_shndx` (a u16 at offset 6 of Elf64_Sym) is read.
    unsafe {
        let p = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
        let mut info: libc::Dl_info = std::mem::zeroed();
        let mut sym: *mut c_void = std::ptr::null_mut();
        let plt = !p.is_null()
            && libc::dladdr1(p, &mut info, &mut sym, RTLD_DL_SYMENT) != 0
            && !sym.is_null()
            && *(sym as *const u8).add(6).cast::<u16>() == 0;
        if !plt {
            return Ok(p as usize);
        }
        let libc_handle = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        let real = if libc_handle.is_null() { 0 } else { libc::dlsym(libc_handle, name.as_ptr()) as usize };
        Err((p as usize, real))
    }
}

/// See [`FROM_DEFAULT`]. Called before anything is resolved (by
/// `mtrace_attach_init`; a function resolved before would be wrong).
pub fn resolve_from_default() {
    FROM_DEFAULT.store(true, Ordering::Release);
}

thread_local! {
    // Set while this thread resolves the malloc family: allocations made by
    // dlsym meanwhile come from the arena.
    static RESOLVING_KEY: Cell<bool> = const { Cell::new(false) };
}
static RESOLVING: FastLocal<Cell<bool>> = FastLocal::new(&RESOLVING_KEY);

/// Lets the hooks reach this module's thread-local from the thread
/// pointer (static_tls.rs): from the library's constructor.
pub fn find_static_tls() {
    RESOLVING.find();
}

static MALLOC: NextFn = NextFn::new(c"malloc");
static CALLOC: NextFn = NextFn::new(c"calloc");
static REALLOC: NextFn = NextFn::new(c"realloc");
static FREE: NextFn = NextFn::new(c"free");

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;
type ReallocFn = unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void;
type FreeFn = unsafe extern "C" fn(*mut c_void);

/// Resolves one member of the malloc family, or returns `None` while this
/// thread is already resolving (the caller then uses the arena).
fn core_fn(f: &NextFn) -> Option<usize> {
    if let Some(a) = f.addr_if_resolved() {
        return Some(a);
    }
    // Once per function: out of the hooks' short way (guard::quiet).
    std::hint::cold_path();
    if RESOLVING.with(|r| r.replace(true)) {
        return None;
    }
    let a = f.get();
    RESOLVING.with(|r| r.set(false));
    a
}

impl NextFn {
    /// Whether the function is not resolved yet (nor being resolved).
    #[inline]
    pub fn unresolved(&self) -> bool {
        self.addr_if_resolved().is_none() && self.addr.load(Ordering::Acquire) == 0
    }

    #[inline]
    fn addr_if_resolved(&self) -> Option<usize> {
        let a = self.addr.load(Ordering::Acquire);
        (a > 1).then_some(a)
    }
}

// ---- bootstrap arena -------------------------------------------------------

const ARENA_SIZE: usize = 256 * 1024;
const ARENA_ALIGN: usize = 16;

#[repr(C, align(16))]
struct Arena(std::cell::UnsafeCell<[u8; ARENA_SIZE]>);
// SAFETY: each byte range of the arena is handed out once (bump allocation
// through an atomic offset) and then owned by whoever received it.
unsafe impl Sync for Arena {}

static ARENA: Arena = Arena(std::cell::UnsafeCell::new([0; ARENA_SIZE]));
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);

fn arena_base() -> usize {
    ARENA.0.get() as usize
}

static EXIT: NextFn = NextFn::new(c"exit");
static FREERES: NextFn = NextFn::new(c"__libc_freeres");
static THREAD_ATEXIT: NextFn = NextFn::new(c"__cxa_thread_atexit_impl");
static ON_EXIT: NextFn = NextFn::new(c"on_exit");

extern "C" {
    /// This library's handle (crtbegin's), for `__cxa_thread_atexit_impl`.
    static __dso_handle: u8;
}

/// Has `dtor(obj)` called when the calling thread exits, among its TLS
/// destructors (glibc's `__cxa_thread_atexit_impl`, which C++'s
/// `thread_local` uses: no pthread key taken from the program). Nothing
/// where libc has none.
pub fn thread_atexit(dtor: extern "C" fn(*mut c_void), obj: *mut c_void) {
    type F = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, *const u8) -> i32;
    // SAFETY: F is __cxa_thread_atexit_impl's signature; __dso_handle is
    // this library's, which glibc keeps loaded while the destructor waits.
    if let Some(f) = unsafe { next::<F>(&THREAD_ATEXIT) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        unsafe { f(dtor, obj, std::ptr::addr_of!(__dso_handle)) };
    }
}

/// libc's `pthread_create`: this module's and the hook's
/// (hooks/process.rs), resolved once.
pub static PTHREAD_CREATE: NextFn = NextFn::new(c"pthread_create");

/// The function a thread runs (`pthread_create`'s `start_routine`).
pub type ThreadMain = extern "C" fn(*mut c_void) -> *mut c_void;

/// libc's `pthread_create(thread, NULL, main, arg)`, never this library's
/// hook of it (hooks/process.rs): 0 or the error number (EAGAIN where
/// libc has none).
pub fn pthread_create(thread: &mut libc::pthread_t, main: ThreadMain, arg: *mut c_void) -> i32 {
    type F = unsafe extern "C" fn(*mut libc::pthread_t, *const libc::pthread_attr_t, ThreadMain, *mut c_void) -> i32;
    // SAFETY: F is pthread_create's signature.
    match unsafe { next::<F>(&PTHREAD_CREATE) } {
        // SAFETY: the real function; `thread` is valid for writing, a null
        // attribute means the defaults.
        Some(f) => unsafe { f(thread, std::ptr::null(), main, arg) },
        None => libc::EAGAIN,
    }
}

/// Has `f(status, NULL)` called by `exit` after the exit handlers
/// registered before this call ran: registered from the library's
/// constructor, that is after the destructors of every library and the
/// program (glibc registers the loader's `_dl_fini`, which runs them,
/// later, in `__libc_start_main`; exit handlers run in reverse order).
/// With glibc's `on_exit`, which passes the exit status (into one list
/// with `atexit`'s and `__cxa_atexit`'s handlers) and has no
/// `__dso_handle`, so that this library's own destructor
/// (`__cxa_finalize`) does not run it early. False where libc has none.
pub fn at_the_end_of_exit(f: extern "C" fn(i32, *mut c_void)) -> bool {
    type F = unsafe extern "C" fn(extern "C" fn(i32, *mut c_void), *mut c_void) -> i32;
    // SAFETY: F is on_exit's signature.
    match unsafe { next::<F>(&ON_EXIT) } {
        // SAFETY: `f` takes the status and the (null) argument it is
        // registered with.
        Some(g) => unsafe { g(f, std::ptr::null_mut()) == 0 },
        None => false,
    }
}

/// Calls glibc's `__libc_freeres()`, which frees what libc keeps for the
/// process's lifetime (stdio buffers, NSS and locale data, the loader's
/// tables, the stacks of exited threads it caches with their DTVs) for
/// memory debuggers at exit: valgrind calls it (`--run-libc-freeres`), so
/// does glibc's own `mtrace()`. Nothing where libc has none.
///
/// Not libstdc++'s `__gnu_cxx::__freeres()` (valgrind calls it too): the
/// free of its 72,704-byte exception pool makes malloc consolidate its
/// fast bins, and on a heap an undetected double free damaged, glibc then
/// aborts a program that exits 0 without the tracer (wrong_frees.rs's
/// `double-undetected` and `mixed` cases did). The pool stays "still
/// reachable".
pub fn libc_freeres() {
    type F = unsafe extern "C" fn();
    // SAFETY: F is __libc_freeres's signature; glibc allows the call at
    // the end of the process, its documented purpose.
    if let Some(f) = unsafe { next::<F>(&FREERES) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        unsafe { f() }
    }
}

/// The address of libc's `exit` (0 when it cannot be found): the leak scan
/// at exit takes its roots from the frame that called it.
pub fn libc_exit() -> usize {
    EXIT.get().unwrap_or(0)
}

/// Looks up now what the end of `exit` calls ([`libc_exit`],
/// [`libc_freeres`]): a `dlsym` there waits for the loader's lock, which
/// another thread may hold as long as it likes (a `dlopen` loop).
pub fn resolve_the_end() {
    EXIT.get();
    FREERES.get();
}

/// True when `p` was served by the bootstrap arena (free ignores it).
#[inline(always)]
pub fn in_arena(p: *const c_void) -> bool {
    // One compare: below the base wraps to a large offset.
    (p as usize).wrapping_sub(arena_base()) < ARENA_SIZE
}

/// Requested size of an arena block (stored in the 16 bytes before it).
pub fn arena_size(p: *const c_void) -> usize {
    // SAFETY: p came from arena_alloc, which wrote the size 16 bytes before it.
    unsafe { *(p as *const usize).sub(2) }
}

fn arena_alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.max(ARENA_ALIGN);
    loop {
        let used = ARENA_USED.load(Ordering::Relaxed);
        let start = (arena_base() + used + ARENA_ALIGN).next_multiple_of(align);
        let end = start + size;
        if end > arena_base() + ARENA_SIZE {
            return std::ptr::null_mut();
        }
        if ARENA_USED.compare_exchange(used, end - arena_base(), Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // SAFETY: [start-16, end) lies inside the arena and was just
            // reserved for this call alone; start is 16-aligned.
            unsafe { *(start as *mut usize).sub(2) = size };
            return start as *mut c_void;
        }
    }
}

// ---- the real functions ----------------------------------------------------

/// Calls the real `malloc`, or the arena while it is being resolved.
pub fn malloc(size: usize) -> *mut c_void {
    match core_fn(&MALLOC) {
        // SAFETY: the address is libc's malloc, which has this signature.
        Some(f) => unsafe { std::mem::transmute::<usize, MallocFn>(f)(size) },
        None => arena_alloc(size, ARENA_ALIGN),
    }
}

/// Calls the real `calloc` (arena memory is zero: it is never reused).
pub fn calloc(n: usize, size: usize) -> *mut c_void {
    match core_fn(&CALLOC) {
        // SAFETY: the address is libc's calloc.
        Some(f) => unsafe { std::mem::transmute::<usize, CallocFn>(f)(n, size) },
        None => match n.checked_mul(size) {
            Some(total) => arena_alloc(total, ARENA_ALIGN),
            None => std::ptr::null_mut(),
        },
    }
}

/// Calls the real `realloc`. Arena blocks move to real memory.
///
/// # Safety
/// `p` is null or a live block of this allocator.
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if in_arena(p) {
        let n = malloc(size);
        if !n.is_null() {
            // SAFETY: both ranges are valid for the smaller of the two sizes.
            unsafe { std::ptr::copy_nonoverlapping(p as *const u8, n as *mut u8, size.min(arena_size(p))) };
        }
        return n;
    }
    match core_fn(&REALLOC) {
        // SAFETY: libc's realloc; p is one of its blocks or null.
        Some(f) => unsafe { std::mem::transmute::<usize, ReallocFn>(f)(p, size) },
        None => std::ptr::null_mut(),
    }
}

/// Calls the real `free`; arena blocks are never reused and are ignored.
///
/// # Safety
/// `p` is null or a live block of this allocator.
pub unsafe fn free(p: *mut c_void) {
    if p.is_null() || in_arena(p) {
        return;
    }
    if let Some(f) = core_fn(&FREE) {
        // SAFETY: libc's free; p is one of its blocks.
        unsafe { std::mem::transmute::<usize, FreeFn>(f)(p) }
    }
}

/// Calls the next definition of `f` with the signature `F`.
///
/// # Safety
/// `F` must be the function pointer type of the symbol `f` names.
pub unsafe fn next<F: Copy>(f: &NextFn) -> Option<F> {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
    // SAFETY: per the contract, F is the symbol's function pointer type.
    f.get().map(|a| unsafe { std::mem::transmute_copy::<usize, F>(&a) })
}

/// The real functions behind the hooks of allocators' own entry points
/// (`mtrace_format::functions::ENTRY_POINTS`, by index), set by the GOT
/// redirection before it points any slot at a hook; 0 for none found.
static ENTRY_POINTS: [AtomicUsize; mtrace_format::functions::ENTRY_POINTS.len()] =
    [const { AtomicUsize::new(0) }; mtrace_format::functions::ENTRY_POINTS.len()];

/// The real entry point `i` of `ENTRY_POINTS` (its address), when found.
#[inline(always)]
pub fn entry_point(i: usize) -> Option<usize> {
    ENTRY_POINTS.get(i).map(|a| a.load(Ordering::Acquire)).filter(|&a| a != 0)
}

/// Keeps `addr` as the real entry point `i`, unless one is known.
pub fn set_entry_point(i: usize, addr: usize) {
    if let Some(slot) = ENTRY_POINTS.get(i) {
        let _ = slot.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Looks up entry point `name` in the global scope (this library exports
/// no function of that name): its address, or `None`. From the GOT
/// redirection (never from a hook: `dlsym` takes the loader's lock).
pub fn find_entry_point(name: &CStr) -> Option<usize> {
    // SAFETY: dlsym with a NUL-terminated name.
    let a = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) } as usize;
    (a != 0).then_some(a)
}

/// The next `posix_memalign`: the tracer's own aligned blocks' and the
/// hook's (hooks/alloc.rs), resolved once (and told of a patch once).
pub static POSIX_MEMALIGN: NextFn = NextFn::new(c"posix_memalign");

/// The functions of `mtrace_format::functions::INTERPOSED` that the
/// executable defines and lifecycle::patch hooked by patching their entry:
/// each one's original (the moved first instructions, then the rest of
/// it), by index in that table; 0 for none. The executable's definition
/// wins over this library's, so it is the one the hook must call, not
/// the next object's.
static PATCHED: [AtomicUsize; mtrace_format::functions::INTERPOSED.len()] =
    [const { AtomicUsize::new(0) }; mtrace_format::functions::INTERPOSED.len()];

/// The original of `name`, when it was patched.
fn patched(name: &CStr) -> Option<usize> {
    let name = name.to_bytes();
    let i = mtrace_format::functions::INTERPOSED.iter().position(|(n, _)| n.as_bytes() == name)?;
    Some(PATCHED[i].load(Ordering::Acquire)).filter(|&a| a != 0)
}

/// `name` (of `INTERPOSED`) was patched: its hook calls `original` from
/// now on. Before a hook of it can run: the hooks of this module's that
/// resolved it already (the session's start resolves the malloc family)
/// are told here, the others find it when they resolve it.
pub fn set_patched(name: &str, original: usize) {
    let Some(i) = mtrace_format::functions::INTERPOSED.iter().position(|(n, _)| *n == name) else { return };
    PATCHED[i].store(original, Ordering::Release);
    for f in [&MALLOC, &CALLOC, &REALLOC, &FREE, &POSIX_MEMALIGN] {
        if f.name.to_bytes() == name.as_bytes() {
            f.addr.store(original, Ordering::Release);
        }
    }
}

/// Resolves every function the tracer itself allocates with, and the
/// descriptor calls the hooks forward to. Called when the
/// session starts: a lazy `dlsym` later could block on the loader's lock,
/// held by a thread inside `dlopen` that waits for a lock of ours.
pub fn init() {
    for f in [&MALLOC, &CALLOC, &REALLOC, &FREE] {
        core_fn(f);
    }
    POSIX_MEMALIGN.get();
    // Before the trace's file is opened: a `dlsym` in a later `close`
    // could wait for the loader's lock.
    for f in [&CLOSE, &DUP2, &DUP3, &CLOSE_RANGE, &CLOSEFROM] {
        f.get();
    }
}

/// The descriptor calls the hooks of hooks/fds.rs forward to (resolved
/// by [`init`]).
pub static CLOSE: NextFn = NextFn::new(c"close");
pub static DUP2: NextFn = NextFn::new(c"dup2");
pub static DUP3: NextFn = NextFn::new(c"dup3");
pub static CLOSE_RANGE: NextFn = NextFn::new(c"close_range");
pub static CLOSEFROM: NextFn = NextFn::new(c"closefrom");

/// Serves allocations made with an alignment above malloc's own (16 bytes)
/// through the real `posix_memalign`.
pub fn memalign(align: usize, size: usize) -> *mut c_void {
    type F = unsafe extern "C" fn(*mut *mut c_void, usize, usize) -> i32;
    // SAFETY: F is posix_memalign's signature.
    match unsafe { next::<F>(&POSIX_MEMALIGN) } {
        Some(f) => {
            let mut p = std::ptr::null_mut();
            // SAFETY: p is a valid out-pointer.
            if unsafe { f(&mut p, align.max(std::mem::size_of::<usize>()), size) } == 0 {
                p
            } else {
                std::ptr::null_mut()
            }
        }
        None => arena_alloc(size, align),
    }
}
