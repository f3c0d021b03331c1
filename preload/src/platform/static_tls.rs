//! Where a thread-local of this library lies from the thread pointer, when
//! the loader put the library's TLS block in the static TLS area: then it
//! is at the same offset in every thread, and a hook finds it with one
//! read of the thread pointer instead of a call to `__tls_get_addr` (1.1%
//! of the samples of `perf record` on sqlite3 sampled at 512K; what it did
//! to the instruction cache is in docs/SAMPLING.md).
//!
//! The rule is the ELF TLS ABI's (Drepper, "ELF Handling For Thread-Local
//! Storage", sections 3.4.1 and 3.4.6; x86-64 uses variant II): a module
//! loaded with the program (`LD_PRELOAD`, a `DT_NEEDED`) gets a block at a
//! fixed offset below the thread pointer, in every thread's static TLS
//! area; one loaded later by `dlopen` (`mtrace attach`) gets a block the
//! loader allocates per thread on first use, unless it goes into the
//! static area's surplus, which glibc then initialises in every thread.
//! So the offset is taken only when the block lies inside the calling
//! thread's static area, whose size glibc's `_dl_get_tls_static_info`
//! (a GLIBC_PRIVATE function of ld.so that LLVM's sanitizers also call)
//! gives; anywhere else, or on another architecture or C library, the
//! hooks keep `__tls_get_addr`. libmtrace.so is DF_STATIC_TLS (one
//! initial-exec thread-local in static_tls.c), so glibc's `dlopen` puts its
//! block in that surplus too: under `mtrace attach` as under the preload,
//! no hook's thread-local access allocates (docs/ALLOCATORS.md).

extern "C" {
    /// static_tls.c: the address of the library's one initial-exec
    /// thread-local, whose access makes the library DF_STATIC_TLS.
    fn mtrace_static_tls_anchor_address() -> *mut u8;
}

/// A thread-local of this library (`key`) that a hook reaches from the
/// thread pointer once [`FastLocal::find`] found it in the static TLS area
/// (always where the library is DF_STATIC_TLS: static_tls.c), and through
/// `key` (`__tls_get_addr`) before. For the thread-locals the hooks touch:
/// `__tls_get_addr` may call `malloc` in a thread that has not touched the
/// library's TLS before, and a hook may run inside the program's allocator.
pub struct FastLocal<T: 'static> {
    key: &'static std::thread::LocalKey<T>,
    /// The offset from the thread pointer (bytes); 0 until found.
    off: std::sync::atomic::AtomicIsize,
}

impl<T: 'static> FastLocal<T> {
    /// `key`, reached through `__tls_get_addr` until [`FastLocal::find`].
    pub const fn new(key: &'static std::thread::LocalKey<T>) -> FastLocal<T> {
        FastLocal { key, off: std::sync::atomic::AtomicIsize::new(0) }
    }

    /// From the library's constructor, on the thread that runs it: the
    /// offset, when the thread-local lies in the static TLS area.
    pub fn find(&self) {
        // SAFETY: a plain C function of static_tls.c, without arguments;
        // called for its side effect of linking the anchor in.
        let _ = unsafe { mtrace_static_tls_anchor_address() };
        let addr = self.key.with(|t| t as *const T as usize);
        if let Some(off) = offset_of(addr) {
            self.off.store(off, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// `f` of this thread's value.
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        let off = self.off.load(std::sync::atomic::Ordering::Relaxed);
        if off != 0 {
            // SAFETY: `find` saw this thread-local at `off` from the
            // thread pointer in the static TLS area, where every thread
            // has its own copy at that offset, alive as long as the thread.
            f(unsafe { &*(thread_pointer().wrapping_add_signed(off) as *const T) })
        } else {
            std::hint::cold_path();
            self.key.with(f)
        }
    }
}

/// The thread pointer: on x86-64 the TCB's first word, which glibc sets
/// to the TCB's own address (`%fs:0`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub fn thread_pointer() -> usize {
    let tp: usize;
    // SAFETY: %fs:0 is the thread's TCB self-pointer, set by glibc before
    // the thread runs any code (clone's CLONE_SETTLS, or the loader for
    // the main thread); reading it has no side effects.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags, pure))
    };
    tp
}

/// The thread pointer (unused where [`offset_of`] finds none).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub fn thread_pointer() -> usize {
    0
}

/// The offset from the thread pointer of the calling thread's thread-local
/// at `addr` (bytes), when it lies in the static TLS area, where every
/// thread has it at that offset; `None` otherwise (a block of a library
/// loaded by `dlopen`, no `_dl_get_tls_static_info`, not x86-64). Never 0.
pub fn offset_of(addr: usize) -> Option<isize> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    // SAFETY: dlsym with a NUL-terminated name; the symbol, when found,
    // is ld.so's `void _dl_get_tls_static_info(size_t *, size_t *)`,
    // which only stores the static area's size and alignment.
    let size = unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, c"_dl_get_tls_static_info".as_ptr());
        if f.is_null() {
            return None;
        }
        let f: unsafe extern "C" fn(*mut usize, *mut usize) = std::mem::transmute(f);
        let (mut size, mut align) = (0usize, 0usize);
        f(&mut size, &mut align);
        size
    };
    let tp = thread_pointer();
    // Variant II: the blocks end at the thread pointer, and the area
    // (less the TCB, which the size includes) lies below it. The bound is
    // generous by the TCB's size, which is still this thread's allocation
    // (its stack's top, or the loader's block for the main thread): no
    // block of a `dlopen`ed library lies there.
    (addr < tp && tp - addr <= size).then(|| addr as isize - tp as isize)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        static WORD: Cell<u64> = const { Cell::new(0) };
    }

    fn addr() -> usize {
        WORD.with(|w| w as *const Cell<u64> as usize)
    }

    #[test]
    fn a_startup_modules_thread_local_is_at_one_offset_in_every_thread() {
        // The test binary is loaded with the program: its block is in the
        // static area, and another thread's copy is at the same offset.
        let off = offset_of(addr()).expect("the executable's TLS block is static");
        assert!(off < 0);
        let main = (addr(), thread_pointer());
        let (theirs, tp) = std::thread::spawn(|| (addr(), thread_pointer())).join().unwrap();
        assert_ne!(theirs, main.0);
        assert_eq!(main.1.wrapping_add_signed(off), main.0);
        assert_eq!(tp.wrapping_add_signed(off), theirs);
    }

    #[test]
    fn memory_outside_the_static_area_has_no_offset() {
        let heap = Box::new(0u64);
        assert_eq!(offset_of(&*heap as *const u64 as usize), None);
        assert_eq!(offset_of(thread_pointer() + 64), None);
    }
}
