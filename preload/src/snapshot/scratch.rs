//! The snapshot's working memory: one anonymous mapping of the tracer's
//! own, made with the system call and left out of the snapshot. Memory is
//! read straight into the record being built there, compressed there by a
//! static zstd context whose workspace is there too (zstd then allocates
//! nothing), and written to the trace. So no copy of the program's memory
//! (which holds pointers to its blocks) lands anywhere the snapshot reads:
//! the tracer's memory is never a root.

use mtrace_format::{compressed_header, region_kind, sparse, Encoder, Record};

use super::filter::Filter;
use crate::platform::sys;
use crate::stream::FileHold;

/// Bytes per ScanRegion record (the format allows up to 1 MiB).
pub const PIECE: usize = 512 * 1024;
/// Records are compressed and written once this many bytes are built.
const FLUSH_AT: usize = 8 << 20;
/// zstd's level for the snapshot: a fast negative level. Memory is mostly
/// zeros and pointers; level 1 spent 70% of the snapshot's time in zstd
/// (`perf record` on scripts/bench_scan.c) and slowed the analyzer too.
const LEVEL: i32 = -3;
/// The most bytes of a sparse piece's held words (varints of at most 10
/// bytes; the encoder may write 8 past the last).
const VARINTS: usize = PIECE / 8 * 10 + 8;
/// A piece is sparse when the filter keeps at most 1/DENSE_FROM of its
/// words.
const DENSE_FROM: usize = 2;
/// The bitmap of a sparse piece: a bit per 8-byte word.
const BITS: usize = PIECE / 64;
/// Room for records: a flush leaves at most one piece (with its bitmap, if
/// sparse) and a header over.
const RAW_CAP: usize = FLUSH_AT + VARINTS + BITS + 4096;
/// Where a piece is read before its words are filtered (sparse pieces),
/// then its bitmap and its held words' varints.
const STAGING: usize = RAW_CAP;
const BITS_AT: usize = STAGING + PIECE;
const VARINTS_AT: usize = BITS_AT + BITS;
/// The compressed area's start.
const COMP_AT: usize = VARINTS_AT + VARINTS;

pub struct Scratch {
    base: *mut u8,
    len: usize,
    comp_cap: usize,
    /// zstd's static context inside the mapping, or null (records are then
    /// written uncompressed).
    cctx: *mut zstd_sys::ZSTD_CCtx,
    /// Bytes of records built in the mapping's first RAW_CAP bytes.
    pos: usize,
    enc: Encoder,
    tid: u32,
    now: u64,
    /// Set: stacks and mappings are written as sparse regions of the words
    /// the filter keeps.
    filter: Option<Filter>,
}

impl Scratch {
    /// Maps the working memory for a snapshot taken by thread `tid` at
    /// `now` (ns), or `None` when there is no memory for it.
    pub fn new(tid: u32, now: u64) -> Option<Scratch> {
        // SAFETY: pure size computations.
        let (comp_cap, ws) = unsafe { (zstd_sys::ZSTD_compressBound(RAW_CAP), zstd_sys::ZSTD_estimateCCtxSize(1)) };
        // (The estimate for level 1 covers every level up to 1, the
        // negative ones included.)
        let comp_cap = comp_cap.next_multiple_of(64);
        let len = (COMP_AT + comp_cap + ws).next_multiple_of(4096);
        let base = sys::map_anon(len)?;
        // SAFETY: the workspace lies inside the fresh mapping, 64-aligned
        // (zstd asks for 8), and is used by nothing else.
        let cctx = unsafe { zstd_sys::ZSTD_initStaticCCtx(base.add(COMP_AT + comp_cap).cast(), ws) };
        let mut s = Scratch { base, len, comp_cap, cctx, pos: 0, enc: Encoder::new(), tid, now, filter: None };
        s.begin_chunk();
        Some(s)
    }

    /// From now on, stacks and mappings keep only the words `f` keeps
    /// (64-bit targets: the filter reads 8-byte words).
    pub fn keep_only(&mut self, f: Filter) {
        self.filter = Some(f);
    }

    /// The mapping, [start, end).
    pub fn range(&self) -> (u64, u64) {
        (self.base as u64, self.base as u64 + self.len as u64)
    }

    fn raw(&mut self) -> &mut [u8] {
        // SAFETY: the first RAW_CAP bytes of the mapping, used only here.
        unsafe { std::slice::from_raw_parts_mut(self.base, RAW_CAP) }
    }

    /// Appends small bytes (a record's header) to the records being built.
    fn put(&mut self, b: &[u8]) {
        let at = self.pos;
        self.raw()[at..at + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }

    /// Each chunk starts with a Thread record: it sets the time that the
    /// next records' times are deltas from.
    fn begin_chunk(&mut self) {
        self.enc = Encoder::new();
        let mut h = Vec::with_capacity(24);
        self.enc.encode(&mut h, &Record::Thread { tid: self.tid, time_ns: self.now });
        self.put(&h);
    }

    /// A thread's registers (empty: unknown, the thread was not stopped).
    pub fn registers(&mut self, out: &FileHold, tid: u32, regs: &[u64]) {
        let mut words = [0u8; 8 * 32];
        let n = regs.len().min(32);
        for (w, r) in words.chunks_exact_mut(8).zip(&regs[..n]) {
            w.copy_from_slice(&r.to_le_bytes());
        }
        let mut h = Vec::with_capacity(24);
        self.enc.scan_region_header(&mut h, self.now, region_kind::REGISTERS, tid as u64, n * 8);
        self.put(&h);
        self.put(&words[..n * 8]);
        self.flush_if_full(out);
    }

    /// A region that is not memory: `bytes` as they are, of `kind` (a
    /// note such as [`region_kind::STOPPED_BY_SIGNAL`]'s).
    pub fn note(&mut self, out: &FileHold, kind: u8, bytes: &[u8]) {
        let mut h = Vec::with_capacity(24);
        self.enc.scan_region_header(&mut h, self.now, kind, 0, bytes.len());
        self.put(&h);
        self.put(bytes);
        self.flush_if_full(out);
    }

    /// Reads `[lo, hi)` of this process (one mapping, or a stack) into
    /// ScanRegion records of `kind`, the pieces after the first marked as
    /// the same mapping; pieces that cannot be read (guard pages) are left
    /// out. Sparse (the words the filter keeps) where a filter is set and
    /// the kind is a stack or a mapping.
    pub fn memory(&mut self, out: &FileHold, kind: u8, lo: u64, hi: u64) {
        let mut at = lo;
        let mut first = true;
        while at < hi {
            let len = ((hi - at) as usize).min(PIECE);
            let k = if first { kind } else { kind | region_kind::SAME_MAPPING };
            let sparse = matches!(kind, region_kind::STACK | region_kind::MAPPING)
                && at.is_multiple_of(8)
                && len.is_multiple_of(8)
                && self.filter.is_some();
            let kept = if sparse { self.sparse_piece(out, k, at, len) } else { self.piece(out, k, at, len) };
            first &= !kept;
            at += len as u64;
        }
    }

    /// One piece of `memory`, as it is; whether it was kept.
    fn piece(&mut self, out: &FileHold, k: u8, at: u64, len: usize) -> bool {
        let kind = k & !region_kind::SAME_MAPPING;
        let mut h = Vec::with_capacity(24);
        self.enc.scan_region_header(&mut h, self.now, k, at, len);
        let start = self.pos + h.len();
        let read = read_own(&mut self.raw()[start..start + len], at);
        // A piece of zeros holds no pointer: left out (untouched bss,
        // fresh heap). A stack piece is kept, so a stack's region
        // starts where its live part does.
        if read && (kind == region_kind::STACK || !self.zeros(start, len)) {
            self.put(&h);
            self.pos += len;
            self.flush_if_full(out);
            return true;
        }
        false
    }

    /// One piece of `memory`, sparse; whether it was kept.
    fn sparse_piece(&mut self, out: &FileHold, k: u8, at: u64, len: usize) -> bool {
        let Some(filter) = &self.filter else { return false };
        // SAFETY: the staging area lies inside the mapping, used only here.
        if !read_own(unsafe { std::slice::from_raw_parts_mut(self.base.add(STAGING), len) }, at) {
            return false;
        }
        // SAFETY: the staging area (just read), the bitmap and the varints
        // after it lie inside the mapping, disjoint, the staging 8-aligned
        // (the mapping is page-aligned, STAGING a multiple of 8), used only
        // here.
        let (words, bits, varints) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.base.add(STAGING).cast::<u64>(), len / 8),
                std::slice::from_raw_parts_mut(self.base.add(BITS_AT), BITS),
                std::slice::from_raw_parts_mut(self.base.add(VARINTS_AT), VARINTS),
            )
        };
        let (kept, any) = filter.mask(words, bits);
        // A piece of zeros holds no pointer: left out (as `piece` does).
        if !any && k & !region_kind::SAME_MAPPING != region_kind::STACK {
            return false;
        }
        let mut h = Vec::with_capacity(32);
        if kept > words.len() / DENSE_FROM {
            // Mostly words that count: as it is (zstd does well on them).
            self.enc.scan_region_header(&mut h, self.now, k, at, len);
            self.put(&h);
            // SAFETY: the staging area's bytes just read.
            self.put(unsafe { std::slice::from_raw_parts(self.base.add(STAGING), len) });
        } else {
            let n = super::filter::encode(words, bits, varints);
            let payload = sparse::payload_len(len as u64, 8, n);
            self.enc.scan_region_header(&mut h, self.now, k | region_kind::SPARSE, at, payload);
            sparse::put_len(&mut h, len as u64);
            self.put(&h);
            self.put(&bits[..sparse::bitmap_len(len as u64, 8)]);
            self.put(&varints[..n]);
        }
        self.flush_if_full(out);
        true
    }

    fn zeros(&mut self, start: usize, len: usize) -> bool {
        self.raw()[start..start + len].chunks_exact(8).all(|w| w == [0u8; 8])
    }

    /// Ends the snapshot: a ScanEnd, and everything written.
    pub fn finish(mut self, out: &FileHold) {
        let mut h = Vec::with_capacity(8);
        self.enc.encode(&mut h, &Record::ScanEnd { time_ns: self.now });
        self.put(&h);
        self.flush(out);
    }

    fn flush_if_full(&mut self, out: &FileHold) {
        if self.pos >= FLUSH_AT {
            self.flush(out);
            self.begin_chunk();
        }
    }

    /// Compresses the records built so far into one block and writes it;
    /// uncompressed if zstd fails or a sample shows the memory does not
    /// compress (random data would cost zstd time and save nothing).
    fn flush(&mut self, out: &FileHold) {
        // The sample goes first: it uses the same compressed area.
        let compressed = if self.worth_compressing() { self.compress(self.pos) } else { None };
        match compressed {
            Some(n) => {
                let mut h = Vec::with_capacity(24);
                compressed_header(&mut h, self.pos, n);
                out.write(&h);
                // SAFETY: the compressed bytes just written by zstd.
                out.write(unsafe { std::slice::from_raw_parts(self.base.add(COMP_AT), n) });
            }
            None => {
                let pos = self.pos;
                out.write(&self.raw()[..pos]);
            }
        }
        self.pos = 0;
    }

    /// Whether the first SAMPLE bytes compress to under 80%.
    fn worth_compressing(&mut self) -> bool {
        const SAMPLE: usize = 128 * 1024;
        self.pos <= SAMPLE || self.compress(SAMPLE).is_some_and(|n| n < SAMPLE * 4 / 5)
    }

    /// Compresses the first `len` bytes of records into the compressed
    /// area; its size, or `None` without a context or on a zstd error.
    fn compress(&mut self, len: usize) -> Option<usize> {
        if self.cctx.is_null() {
            return None;
        }
        // SAFETY: source and destination are disjoint parts of the
        // mapping; the context was initialised in it.
        unsafe {
            let n = zstd_sys::ZSTD_compressCCtx(
                self.cctx,
                self.base.add(COMP_AT).cast(),
                self.comp_cap,
                self.base.cast(),
                len,
                LEVEL,
            );
            (zstd_sys::ZSTD_isError(n) == 0).then_some(n)
        }
    }
}

/// Reads `dst.len()` bytes of this process at `at` into `dst`; false when
/// any of them cannot be read (a guard page, a mapping whose file shrank):
/// `process_vm_readv` fails there instead of faulting.
fn read_own(dst: &mut [u8], at: u64) -> bool {
    let local = libc::iovec { iov_base: dst.as_mut_ptr().cast(), iov_len: dst.len() };
    let remote = libc::iovec { iov_base: at as *mut libc::c_void, iov_len: dst.len() };
    // SAFETY: `local` is `dst`; the kernel checks `remote`.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == dst.len() as isize
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: the mapping from `new`, no longer used.
        unsafe { sys::unmap(self.base, self.len) };
    }
}
