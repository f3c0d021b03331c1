//! The writer's zstd context: static, in an anonymous mapping of the
//! tracer's own (left out of the leak scan's snapshot), made once.
//!
//! Why not `zstd::bulk::compress`: it creates a context per call, and
//! zstd allocates contexts with the C library's malloc, so 569 KiB of the
//! program's heap (`ZSTD_estimateCCtxSize(1)`: 582,680 bytes with zstd
//! 1.5.7) were allocated and freed every round, holding copies
//! of record bytes (block addresses among them) that program blocks later
//! reused; and those malloc calls, made inside the writer's guard, were
//! the tracer's in the program's heap (nested.rs).

use mtrace_format::compressed_header;

use crate::platform::sys;

/// The writer's level: it must keep up with the program.
const LEVEL: i32 = 1;

pub struct Zstd {
    base: *mut u8,
    len: usize,
    cctx: *mut zstd_sys::ZSTD_CCtx,
}

// SAFETY: the context is plain memory used by one thread at a time (the
// session keeps it behind a mutex).
unsafe impl Send for Zstd {}

impl Zstd {
    /// Maps the context's workspace; `None` without memory.
    pub fn new() -> Option<Zstd> {
        // SAFETY: a pure size computation.
        let ws = unsafe { zstd_sys::ZSTD_estimateCCtxSize(LEVEL) };
        let len = ws.next_multiple_of(4096);
        let base = sys::map_anon(len)?;
        // SAFETY: the workspace is the fresh mapping, page-aligned, used by
        // nothing else.
        let cctx = unsafe { zstd_sys::ZSTD_initStaticCCtx(base.cast(), ws) };
        if cctx.is_null() {
            // SAFETY: the mapping just made, unused.
            unsafe { sys::unmap(base, len) };
            return None;
        }
        Some(Zstd { base, len, cctx })
    }

    /// The mapping, [start, end).
    pub fn range(&self) -> (u64, u64) {
        (self.base as u64, self.base as u64 + self.len as u64)
    }

    /// Appends `raw` (whole records) to `out` as one compressed block;
    /// false (and `out` unchanged) on a zstd error.
    pub fn compress_block(&mut self, raw: &[u8], out: &mut Vec<u8>) -> bool {
        // SAFETY: a pure size computation.
        let bound = unsafe { zstd_sys::ZSTD_compressBound(raw.len()) };
        let mut comp: Vec<u8> = Vec::with_capacity(bound);
        // SAFETY: `comp` has room for `bound` bytes, `raw` is readable, the
        // context was initialised in our mapping.
        let n = unsafe {
            zstd_sys::ZSTD_compressCCtx(
                self.cctx,
                comp.as_mut_ptr().cast(),
                bound,
                raw.as_ptr().cast(),
                raw.len(),
                LEVEL,
            )
        };
        // SAFETY: a pure check of the return code.
        if unsafe { zstd_sys::ZSTD_isError(n) } != 0 {
            return false;
        }
        // SAFETY: zstd wrote `n` <= `bound` bytes.
        unsafe { comp.set_len(n) };
        compressed_header(out, raw.len(), n);
        out.extend_from_slice(&comp);
        true
    }
}

impl Drop for Zstd {
    fn drop(&mut self) {
        // SAFETY: the mapping from `new`; the context in it is not used again.
        unsafe { sys::unmap(self.base, self.len) };
    }
}
