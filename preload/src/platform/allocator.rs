//! The tracer's own heap: every Rust allocation of the tracer comes from a
//! dlmalloc heap inside one address range reserved for it, never from the
//! program's malloc. Why not the real malloc:
//! - Freed tracer memory would be reused for the program's blocks with the
//!   tracer's stale pointers still in them, and the leak scan would take
//!   those for references (seen: a freed event buffer list made 96,000
//!   lost blocks look reachable).
//! - The snapshot leaves the whole range out ([`range`]): the tracer's
//!   memory is never a root.
//! - The hooks are never entered: pages come from the mmap and mprotect
//!   system calls, not through the exported `mmap`.
//!
//! If the range cannot be reserved (a tight RLIMIT_AS), allocations fall
//! back to the real malloc, and [`range`] is empty.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::platform::real;
use crate::platform::spin::SpinLock;

/// Address space to reserve, tried in order (only what dlmalloc asks for
/// is made accessible; the rest costs no memory).
const RESERVE: [usize; 3] = [64 << 30, 8 << 30, 1 << 30];
const PAGE: usize = 4096;

/// The reserved range: [BASE, END); BASE is 0 until reserved, 1 if that failed.
static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// The next unused address in the range.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// The tracer's heap, [start, end), or `None` (the fallback is in use).
pub fn range() -> Option<(u64, u64)> {
    let b = BASE.load(Ordering::Acquire);
    (b > 1).then(|| (b as u64, END.load(Ordering::Acquire) as u64))
}

/// Reserves the range once; false if that failed.
fn reserved() -> bool {
    match BASE.load(Ordering::Acquire) {
        0 => {}
        1 => return false,
        _ => return true,
    }
    for len in RESERVE {
        // SAFETY: a fresh PROT_NONE reservation; no existing memory is touched.
        let p = unsafe {
            libc::syscall(
                libc::SYS_mmap,
                0usize,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1i64,
                0usize,
            )
        };
        if p <= 0 {
            continue;
        }
        let p = p as usize;
        if BASE.compare_exchange(0, p, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            NEXT.store(p, Ordering::Release);
            END.store(p + len, Ordering::Release);
            return true;
        }
        // Another thread reserved first.
        // SAFETY: our own reservation, unused.
        unsafe { libc::syscall(libc::SYS_munmap, p, len) };
        while END.load(Ordering::Acquire) == 0 {
            std::hint::spin_loop();
        }
        return true;
    }
    BASE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire).is_err()
}

/// dlmalloc's source of pages: the reserved range, handed out in order and
/// never given back (dlmalloc reuses what it frees).
struct Pages;

// SAFETY: `alloc` returns fresh, readable, writable, zeroed pages of at
// least `size` bytes that nothing else uses; nothing is ever released.
unsafe impl dlmalloc::Allocator for Pages {
    fn alloc(&self, size: usize) -> (*mut u8, usize, u32) {
        let size = size.next_multiple_of(PAGE);
        let at = NEXT.fetch_add(size, Ordering::AcqRel);
        if at + size > END.load(Ordering::Acquire) {
            return (std::ptr::null_mut(), 0, 0);
        }
        // SAFETY: inside our reservation, not handed out before.
        let rc = unsafe { libc::syscall(libc::SYS_mprotect, at, size, libc::PROT_READ | libc::PROT_WRITE) };
        if rc != 0 {
            return (std::ptr::null_mut(), 0, 0);
        }
        (at as *mut u8, size, 0)
    }

    fn remap(&self, _: *mut u8, _: usize, _: usize, _: bool) -> *mut u8 {
        std::ptr::null_mut()
    }

    fn free_part(&self, _: *mut u8, _: usize, _: usize) -> bool {
        false
    }

    fn free(&self, _: *mut u8, _: usize) -> bool {
        false
    }

    fn can_release_part(&self, _: u32) -> bool {
        false
    }

    fn allocates_zeros(&self) -> bool {
        true
    }

    fn page_size(&self) -> usize {
        PAGE
    }
}

/// dlmalloc behind a spin lock (see [`SpinLock`] for why not a mutex).
/// On cache lines of its own: the lock and dlmalloc's state are written
/// on every allocation of the tracer, and a static the hooks read on every
/// event (the stream's order epoch, measured) must not share a line with
/// them; otherwise where the linker puts the two decides how much a
/// multi-threaded program slows down (churn with 2 threads: 6.4x or 6.9x
/// native for the same code).
#[repr(align(64))]
struct Heap {
    lock: SpinLock,
    heap: UnsafeCell<dlmalloc::Dlmalloc<Pages>>,
}

// SAFETY: `heap` is only touched by the thread holding `lock`.
unsafe impl Sync for Heap {}

impl Heap {
    fn lock(&self) {
        self.lock.lock();
    }

    fn unlock(&self) {
        self.lock.unlock();
    }

    /// Runs `f` on the heap under the lock (dlmalloc does not panic); in
    /// the thread that [`hold`]s it, without taking the lock again.
    fn with<R>(&self, f: impl FnOnce(&mut dlmalloc::Dlmalloc<Pages>) -> R) -> R {
        let holder = HOLDER.load(Ordering::Relaxed);
        let held = holder != 0 && holder == thread_id();
        if !held {
            self.lock();
        }
        // SAFETY: the lock is held, by this call or by this thread's Hold
        // (which is never inside dlmalloc when this runs): no other
        // reference to the heap exists.
        let r = f(unsafe { &mut *self.heap.get() });
        if !held {
            self.unlock();
        }
        r
    }
}

/// The thread that holds the heap for a snapshot ([`hold`]), by
/// [`thread_id`]; 0 for none.
static HOLDER: AtomicUsize = AtomicUsize::new(0);

/// The calling thread, as a number no other live thread has: its thread
/// pointer on x86-64 (one read of `%fs:0`), else its kernel thread id.
fn thread_id() -> usize {
    if cfg!(target_arch = "x86_64") {
        crate::platform::static_tls::thread_pointer()
    } else {
        crate::platform::sys::gettid() as usize
    }
}

/// The tracer's heap, held by one thread ([`hold`]) until dropped.
pub struct Hold(());

/// Takes the tracer's heap for the calling thread until the [`Hold`] is
/// dropped: no other thread is inside it meanwhile, so a thread the leak
/// scan then stops from outside (snapshot/stop) holds no lock of it, and
/// the calling thread goes on allocating from it. `None` when the heap is
/// the real malloc (the range could not be reserved), or, not `patient`
/// (a fatal signal's handler, which may have interrupted the holder),
/// when it stays locked for a second.
pub fn hold(patient: bool) -> Option<Hold> {
    if !reserved() {
        return None;
    }
    if patient {
        HEAP.lock();
    } else {
        let mut waited_ms = 0;
        while !HEAP.lock.try_lock() {
            if waited_ms == 1000 {
                return None;
            }
            crate::platform::sys::sleep_ms(1);
            waited_ms += 1;
        }
    }
    HOLDER.store(thread_id(), Ordering::Relaxed);
    Some(Hold(()))
}

impl Drop for Hold {
    fn drop(&mut self) {
        HOLDER.store(0, Ordering::Relaxed);
        HEAP.unlock();
    }
}

/// Waits up to `ms` milliseconds for the tracer's heap to be free; false
/// if it stays locked (in a fatal signal's handler: the interrupted code
/// may be the holder, and allocating would never return).
pub fn free_within(ms: u32) -> bool {
    for _ in 0..ms {
        if !HEAP.lock.is_locked() {
            return true;
        }
        crate::platform::sys::sleep_ms(1);
    }
    !HEAP.lock.is_locked()
}

static HEAP: Heap =
    Heap { lock: SpinLock::new(), heap: UnsafeCell::new(dlmalloc::Dlmalloc::new_with_allocator(Pages)) };

fn ours(p: *mut u8) -> bool {
    let p = p as usize;
    let b = BASE.load(Ordering::Acquire);
    b > 1 && p >= b && p < END.load(Ordering::Acquire)
}

/// malloc's own alignment on 64-bit glibc (for the fallback).
const MALLOC_ALIGN: usize = 16;

pub struct TracerHeap;

// SAFETY: blocks come from dlmalloc (which honours size and alignment) or,
// without the reservation, from the real malloc/memalign; each goes back to
// the allocator its address says it came from.
unsafe impl GlobalAlloc for TracerHeap {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if reserved() {
            // SAFETY: dlmalloc's contract: a non-zero size, a power-of-two align.
            return HEAP.with(|h| unsafe { h.malloc(l.size().max(1), l.align()) });
        }
        if l.align() <= MALLOC_ALIGN {
            real::malloc(l.size()).cast()
        } else {
            real::memalign(l.align(), l.size()).cast()
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if ours(p) {
            // SAFETY: p came from HEAP with this layout.
            HEAP.with(|h| unsafe { h.free(p, l.size().max(1), l.align()) })
        } else {
            // SAFETY: p came from the real malloc.
            unsafe { real::free(p.cast()) }
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if ours(p) {
            // SAFETY: p came from HEAP with this layout.
            return HEAP.with(|h| unsafe { h.realloc(p, l.size().max(1), l.align(), new_size.max(1)) });
        }
        if l.align() <= MALLOC_ALIGN {
            // SAFETY: p came from the real malloc.
            return unsafe { real::realloc(p.cast(), new_size) }.cast();
        }
        // SAFETY: the default: allocate, copy the smaller size, free.
        unsafe {
            let n = self.alloc(Layout::from_size_align_unchecked(new_size, l.align()));
            if !n.is_null() {
                std::ptr::copy_nonoverlapping(p, n, l.size().min(new_size));
                self.dealloc(p, l);
            }
            n
        }
    }
}

/// pthread_atfork prepare: no other thread may hold the heap's lock while
/// the process is copied (taken last: holders of the tracer's other locks
/// allocate).
pub fn hold_for_fork() {
    HEAP.lock();
}

/// Releases what [`hold_for_fork`] took.
///
/// # Safety
/// The calling thread called `hold_for_fork` and nothing released it since.
pub unsafe fn release_after_fork() {
    // (Unsafe by contract: releasing a lock another thread holds would let
    // two threads into dlmalloc.)
    HEAP.unlock();
}
