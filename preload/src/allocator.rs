//! The tracer's own Rust allocations go straight to the real malloc, never
//! through the exported hooks: they are never recorded and cannot recurse.

use std::alloc::{GlobalAlloc, Layout};

use crate::real;

/// malloc's own alignment on 64-bit glibc.
const MALLOC_ALIGN: usize = 16;

pub struct RealMalloc;

// SAFETY: blocks come from the real malloc/posix_memalign with at least the
// requested size and alignment and go back to the real free.
unsafe impl GlobalAlloc for RealMalloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.align() <= MALLOC_ALIGN {
            real::malloc(l.size()).cast()
        } else {
            real::memalign(l.align(), l.size()).cast()
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: p came from alloc above.
        unsafe { real::free(p.cast()) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
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
