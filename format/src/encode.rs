//! Encoding of the header and of records into byte buffers.

use crate::record::{tag, Family, Header, Module, Record};
use crate::varint::{put_varint, put_varint_at, zigzag};
use crate::{MAGIC, TIME_SHIFT, VERSION};

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Appends the stream header (magic, then varint fields) to `out`.
/// `h.version` is ignored: the current [`VERSION`] is written.
pub fn encode_header(out: &mut Vec<u8>, h: &Header) {
    out.extend_from_slice(&MAGIC);
    put_varint(out, VERSION);
    out.push(h.pointer_size);
    out.push(h.big_endian as u8);
    put_bytes(out, h.arch.as_bytes());
    put_varint(out, h.pid as u64);
    put_varint(out, h.ppid as u64);
    put_bytes(out, h.exe.as_bytes());
    put_varint(out, h.cmdline.len() as u64);
    for a in &h.cmdline {
        put_bytes(out, a.as_bytes());
    }
    put_varint(out, h.start_realtime_ns);
    put_varint(out, h.start_monotonic_ns);
    out.push(TIME_SHIFT);
}

/// Encodes records of one thread's buffer. Times (in units of
/// [`TIME_SHIFT`]) and heap addresses are stored as zigzag deltas from the
/// previous record's, so an encoder belongs to one buffer and starts each
/// buffer with [`Record::Thread`], which resets both bases.
#[derive(Default, Debug, Clone)]
pub struct Encoder {
    /// Time units.
    last_time: u64,
    last_addr: u64,
}

/// Appends the first `n` bytes of `b` to `out`: the whole array (a copy
/// of a size known here, a few vector stores), then the rest cut off. A
/// copy of `n` bytes is a call to libc's memmove, which was 5% of the
/// preload's samples on cxx_work.
#[inline(always)]
fn append<const N: usize>(out: &mut Vec<u8>, b: &[u8; N], n: usize) {
    let start = out.len();
    out.extend_from_slice(b);
    out.truncate(start + n);
}

impl Encoder {
    /// An encoder at the start of a stream (no thread, time 0).
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Time `t` (ns) as a delta in time units.
    #[inline]
    fn time(&mut self, out: &mut Vec<u8>, t: u64) {
        let t = t >> TIME_SHIFT;
        put_varint(out, zigzag(t.wrapping_sub(self.last_time) as i64));
        self.last_time = t;
    }

    /// A heap address as a delta from the previous one: the allocator
    /// hands out neighbours, so the delta is short and repeats (jq's trace:
    /// 3.48 → 1.14 bytes per event).
    #[inline]
    fn addr(&mut self, out: &mut Vec<u8>, a: u64) {
        put_varint(out, zigzag(a.wrapping_sub(self.last_addr) as i64));
        self.last_addr = a;
    }

    /// Appends a [`Record::ScanRegion`] of `len` bytes without its bytes,
    /// which the caller appends next (the snapshot reads memory straight
    /// into place, with no copy in between).
    pub fn scan_region_header(&mut self, out: &mut Vec<u8>, time_ns: u64, kind: u8, addr: u64, len: usize) {
        out.push(tag::SCAN_REGION);
        self.time(out, time_ns);
        out.push(kind);
        put_varint(out, addr);
        put_varint(out, len as u64);
    }

    /// Appends a [`Record::Stack`] without building a `Vec` of frames: the
    /// first frame as a varint, each further one as a zigzag delta from the
    /// one before (frames of one stack are usually near each other).
    pub fn stack(&mut self, out: &mut Vec<u8>, id: u32, frames: &[u64]) {
        out.push(tag::STACK);
        put_varint(out, id as u64);
        put_varint(out, frames.len() as u64);
        let mut prev = 0u64;
        for &f in frames {
            put_varint(out, zigzag(f.wrapping_sub(prev) as i64));
            prev = f;
        }
    }

    /// Appends a [`Record::Alloc`]: the same bytes as [`Encoder::encode`]
    /// of it, written without building the record (the preload's hot path:
    /// one capacity check for the whole record instead of one per byte).
    #[inline]
    pub fn alloc(&mut self, out: &mut Vec<u8>, time_ns: u64, family: Family, addr: u64, size: u64, stack: u32) {
        let mut b = [0u8; 1 + 10 + 1 + 10 + 10 + 5 + 8];
        b[0] = tag::ALLOC;
        let mut n = 1 + self.time_at(&mut b, 1, time_ns);
        b[n] = family as u8;
        n += 1;
        n += self.addr_at(&mut b, n, addr);
        n += put_varint_at(&mut b, n, size);
        n += put_varint_at(&mut b, n, stack as u64);
        append(out, &b, n);
    }

    /// Appends a [`Record::Alloc`] of an aligned C++ `operator new`: tag 24,
    /// the Alloc's fields and `align` (bytes).
    #[allow(clippy::too_many_arguments)]
    pub fn alloc_aligned(
        &mut self,
        out: &mut Vec<u8>,
        time_ns: u64,
        family: Family,
        addr: u64,
        size: u64,
        stack: u32,
        align: u64,
    ) {
        out.push(tag::ALLOC_ALIGNED);
        self.time(out, time_ns);
        out.push(family as u8);
        self.addr(out, addr);
        put_varint(out, size);
        put_varint(out, stack as u64);
        put_varint(out, align);
    }

    /// Appends a [`Record::Free`] of a sized or aligned deallocation: tag
    /// 25, the Free's fields, its backtrace (0: none), `size` and `align`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn free_sized(
        &mut self,
        out: &mut Vec<u8>,
        time_ns: u64,
        family: Family,
        addr: u64,
        stack: u32,
        size: u64,
        align: u64,
    ) {
        let mut b = [0u8; 1 + 10 + 1 + 10 + 5 + 10 + 10 + 1];
        b[0] = tag::FREE_SIZED;
        let mut n = 1 + self.time_at(&mut b, 1, time_ns);
        b[n] = family as u8;
        n += 1;
        n += self.addr_at(&mut b, n, addr);
        n += put_varint_at(&mut b, n, stack as u64);
        n += put_varint_at(&mut b, n, size);
        n += put_varint_at(&mut b, n, align);
        append(out, &b, n);
    }

    /// Appends a [`Record::Free`], as [`Encoder::alloc`] does an Alloc.
    #[inline]
    pub fn free(&mut self, out: &mut Vec<u8>, time_ns: u64, family: Family, addr: u64, stack: u32) {
        let mut b = [0u8; 1 + 10 + 1 + 10 + 5 + 8];
        b[0] = if stack == 0 { tag::FREE } else { tag::FREE_STACK };
        let mut n = 1 + self.time_at(&mut b, 1, time_ns);
        b[n] = family as u8;
        n += 1;
        n += self.addr_at(&mut b, n, addr);
        if stack != 0 {
            n += put_varint_at(&mut b, n, stack as u64);
        }
        append(out, &b, n);
    }

    /// [`Encoder::time`] into `b` at `at`; its length.
    #[inline]
    fn time_at(&mut self, b: &mut [u8], at: usize, t: u64) -> usize {
        let t = t >> TIME_SHIFT;
        let n = put_varint_at(b, at, zigzag(t.wrapping_sub(self.last_time) as i64));
        self.last_time = t;
        n
    }

    /// [`Encoder::addr`] into `b` at `at`; its length.
    #[inline]
    fn addr_at(&mut self, b: &mut [u8], at: usize, a: u64) -> usize {
        let n = put_varint_at(b, at, zigzag(a.wrapping_sub(self.last_addr) as i64));
        self.last_addr = a;
        n
    }

    /// Appends `rec` to `out`.
    pub fn encode(&mut self, out: &mut Vec<u8>, rec: &Record) {
        match *rec {
            Record::Thread { tid, time_ns } => {
                out.push(tag::THREAD);
                put_varint(out, tid as u64);
                self.last_time = time_ns >> TIME_SHIFT;
                self.last_addr = 0;
                put_varint(out, self.last_time);
            }
            Record::Stack { id, ref frames } => self.stack(out, id, frames),
            Record::Alloc { time_ns, family, addr, size, stack, align: 0 } => {
                self.alloc(out, time_ns, family, addr, size, stack)
            }
            Record::Alloc { time_ns, family, addr, size, stack, align } => {
                self.alloc_aligned(out, time_ns, family, addr, size, stack, align)
            }
            Record::Free { time_ns, family, addr, stack, size: 0, align: 0 } => {
                self.free(out, time_ns, family, addr, stack)
            }
            Record::Free { time_ns, family, addr, stack, size, align } => {
                self.free_sized(out, time_ns, family, addr, stack, size, align)
            }
            Record::Realloc { time_ns, free_time_ns, old, new, size, stack } => {
                out.push(tag::REALLOC);
                self.time(out, time_ns);
                let free_time = free_time_ns >> TIME_SHIFT;
                put_varint(out, zigzag(self.last_time.wrapping_sub(free_time) as i64));
                self.addr(out, old);
                self.addr(out, new);
                put_varint(out, size);
                put_varint(out, stack as u64);
            }
            Record::Mmap { time_ns, addr, len, prot, flags, fd, stack } => {
                out.push(tag::MMAP);
                self.time(out, time_ns);
                put_varint(out, addr);
                put_varint(out, len);
                put_varint(out, prot as u64);
                put_varint(out, flags as u64);
                put_varint(out, zigzag(fd as i64));
                put_varint(out, stack as u64);
            }
            Record::Munmap { time_ns, addr, len } => {
                out.push(tag::MUNMAP);
                self.time(out, time_ns);
                put_varint(out, addr);
                put_varint(out, len);
            }
            Record::Mremap { time_ns, old, old_len, new, new_len, stack } => {
                out.push(tag::MREMAP);
                self.time(out, time_ns);
                put_varint(out, old);
                put_varint(out, old_len);
                put_varint(out, new);
                put_varint(out, new_len);
                put_varint(out, stack as u64);
            }
            Record::Modules { time_ns, ref modules } => {
                out.push(tag::MODULES);
                self.time(out, time_ns);
                put_varint(out, modules.len() as u64);
                for m in modules {
                    encode_module(out, m);
                }
            }
            Record::Marker { time_ns, seq, ref name } => {
                out.push(tag::MARKER);
                self.time(out, time_ns);
                put_varint(out, seq);
                put_bytes(out, name.as_bytes());
            }
            Record::Sample { time_ns, rss } => {
                out.push(tag::SAMPLE);
                self.time(out, time_ns);
                put_varint(out, rss);
            }
            Record::PoolName { id, ref name } => {
                out.push(tag::POOL_NAME);
                put_varint(out, id as u64);
                put_bytes(out, name.as_bytes());
            }
            Record::PoolAlloc { time_ns, pool, addr, size, stack } => {
                out.push(tag::POOL_ALLOC);
                self.time(out, time_ns);
                put_varint(out, pool as u64);
                put_varint(out, addr);
                put_varint(out, size);
                put_varint(out, stack as u64);
            }
            Record::PoolFree { time_ns, pool, addr } => {
                out.push(tag::POOL_FREE);
                self.time(out, time_ns);
                put_varint(out, pool as u64);
                put_varint(out, addr);
            }
            Record::ScanRegion { time_ns, kind, addr, ref bytes } => {
                self.scan_region_header(out, time_ns, kind, addr, bytes.len());
                out.extend_from_slice(bytes);
            }
            Record::ScanEnd { time_ns } => {
                out.push(tag::SCAN_END);
                self.time(out, time_ns);
            }
            Record::Coverage { time_ns, collecting, whole } => {
                out.push(tag::COVERAGE);
                self.time(out, time_ns);
                out.push(u8::from(collecting) | u8::from(whole) << 1);
            }
            Record::Sampling { time_ns, rate } => {
                out.push(tag::SAMPLING);
                self.time(out, time_ns);
                put_varint(out, rate);
            }
            Record::Patched { time_ns, ref patch } => {
                out.push(tag::PATCHED);
                self.time(out, time_ns);
                put_bytes(out, patch.path.as_bytes());
                put_varint(out, patch.hooked.len() as u64);
                for name in &patch.hooked {
                    put_bytes(out, name.as_bytes());
                }
                put_varint(out, patch.refused.len() as u64);
                for (name, why) in &patch.refused {
                    put_bytes(out, name.as_bytes());
                    put_bytes(out, why.as_bytes());
                }
            }
            Record::ReportTo { time_ns, seq, ref path } => {
                out.push(tag::REPORT_TO);
                self.time(out, time_ns);
                put_varint(out, seq);
                put_bytes(out, path.as_bytes());
            }
            Record::Exec { time_ns, ref path } => {
                out.push(tag::EXEC);
                self.time(out, time_ns);
                put_bytes(out, path.as_bytes());
            }
            Record::Spawned { time_ns, pid, ref path } => {
                out.push(tag::SPAWNED);
                self.time(out, time_ns);
                put_varint(out, pid as u64);
                put_bytes(out, path.as_bytes());
            }
            Record::Checkpoint { time_ns, ref totals } => {
                out.push(tag::CHECKPOINT);
                put_varint(out, time_ns >> TIME_SHIFT);
                put_varint(out, totals.len() as u64);
                for (name, v) in totals {
                    put_bytes(out, name.as_bytes());
                    put_varint(out, *v);
                }
            }
            Record::CheckpointEnd { time_ns, ref stacks } => {
                out.push(tag::CHECKPOINT_END);
                put_varint(out, time_ns >> TIME_SHIFT);
                put_varint(out, stacks.len() as u64);
                for s in stacks {
                    for v in [s.id as u64, s.allocations, s.bytes, s.peak_bytes, s.peak_blocks] {
                        put_varint(out, v);
                    }
                }
            }
            Record::Watermark { time_ns } => {
                out.push(tag::WATERMARK);
                put_varint(out, time_ns >> TIME_SHIFT);
            }
            Record::End { time_ns, reason } => {
                out.push(tag::END);
                self.time(out, time_ns);
                let (code, arg) = reason.to_pair();
                put_varint(out, code);
                put_varint(out, arg);
            }
        }
    }
}

/// Appends a compressed block: `raw` (whole records, each chunk starting
/// with a Thread record) compressed with zstd at `level`. The reader expands
/// it in place, so it may stand anywhere a record may.
pub fn encode_compressed(out: &mut Vec<u8>, raw: &[u8], level: i32) -> std::io::Result<()> {
    let comp = zstd::bulk::compress(raw, level)?;
    compressed_header(out, raw.len(), comp.len());
    out.extend_from_slice(&comp);
    Ok(())
}

/// Appends the header of a compressed block whose zstd frame of
/// `comp_len` bytes (decompressing to `raw_len` bytes) follows; for writers
/// that compress elsewhere.
pub fn compressed_header(out: &mut Vec<u8>, raw_len: usize, comp_len: usize) {
    out.push(tag::COMPRESSED);
    put_varint(out, raw_len as u64);
    put_varint(out, comp_len as u64);
}

fn encode_module(out: &mut Vec<u8>, m: &Module) {
    put_bytes(out, m.path.as_bytes());
    put_varint(out, m.bias);
    put_bytes(out, &m.build_id);
    put_varint(out, m.segments.len() as u64);
    for s in &m.segments {
        put_varint(out, s.vaddr);
        put_varint(out, s.memsz);
        put_varint(out, s.flags as u64);
    }
}
