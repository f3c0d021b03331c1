//! Streaming decoder: reads one record at a time, so memory stays bounded by
//! what the caller keeps, never by the length of the stream.

use std::fmt;
use std::io::{self, Read};

use crate::record::{tag, EndReason, Family, Header, Module, Record, Segment};
use crate::varint::unzigzag;
use crate::{MAGIC, VERSION};

// Bounds that no real producer reaches; a length beyond them means a corrupt
// stream, and checking them keeps a corrupt length from allocating gigabytes.
const MAX_STRING: u64 = 1 << 20;
const MAX_FRAMES: u64 = 4096;
const MAX_LIST: u64 = 1 << 20;
/// Most backtraces a checkpoint's end may list.
const MAX_STACK_SUMS: u64 = 1 << 26;
/// Longest architecture name of a header (`x86_64`, `powerpc64le`, …).
const MAX_ARCH: usize = 32;
/// Largest compressed block, either size: [`crate::MAX_BLOCK_RAW`] (zstd's
/// compressed bound of that is a little more; an incompressible block is
/// stored as it is, not in a block).
const MAX_BLOCK: u64 = crate::MAX_BLOCK_RAW as u64 + (1 << 20);

/// What went wrong while reading a stream.
#[derive(Debug)]
pub enum ReadErrorKind {
    /// The underlying reader failed.
    Io(io::Error),
    /// The stream ends inside a record (or inside the header): the producer
    /// was cut short. Every record before `offset` was read.
    Truncated,
    /// The first bytes are not [`MAGIC`]: not an mtrace stream.
    BadMagic,
    /// Written by a newer mtrace than this reader.
    UnsupportedVersion(u64),
    /// A value no producer writes (unknown record tag, absurd length, …).
    Corrupt(String),
}

/// A read error and the byte offset of the record (or header) where it happened.
#[derive(Debug)]
pub struct ReadError {
    /// Offset from the start of the stream, bytes.
    pub offset: u64,
    /// What was wrong there.
    pub kind: ReadErrorKind,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ReadErrorKind::Io(e) => write!(f, "read error at byte {}: {e}", self.offset),
            ReadErrorKind::Truncated => {
                write!(f, "truncated: the last complete record ends at byte {}", self.offset)
            }
            ReadErrorKind::BadMagic => write!(f, "not an mtrace trace (bad magic at byte 0)"),
            ReadErrorKind::UnsupportedVersion(v) => {
                write!(f, "trace format version {v} is newer than this mtrace understands ({VERSION})")
            }
            ReadErrorKind::Corrupt(what) => write!(f, "corrupt record at byte {}: {what}", self.offset),
        }
    }
}

impl std::error::Error for ReadError {}

/// Bytes read from the source at a time.
const CHUNK: usize = 1 << 20;

/// Reads a stream: first [`Reader::header`], then [`Reader::next_record`]
/// until it returns `Ok(None)` (clean end) or an error. Buffers the source
/// itself (decoding works on a slice), so pass a plain `File`.
pub struct Reader<R> {
    inner: R,
    buf: Vec<u8>,
    /// `buf[pos..end]` is read but not yet decoded.
    pos: usize,
    end: usize,
    /// `buf[..spliced_end]` is a decompressed block put in place of the
    /// compressed record that held it, which started at `block_offset`.
    spliced_end: usize,
    block_offset: u64,
    /// Stream offset of `buf[spliced_end]`.
    file_base: u64,
    record_start: u64,
    tid: u32,
    /// Time units (see [`Header::time_shift`]).
    last_time: u64,
    time_shift: u32,
    /// Heap addresses are deltas from the previous one (version 7 on).
    addr_deltas: bool,
    last_addr: u64,
    /// The target's pointer size, bytes (sparse scan regions' words).
    word: usize,
    /// The buffer before the last splice, reused for the next one (a fresh
    /// one per block cost page faults and zeroing: a tenth of a report).
    spare: Vec<u8>,
    /// zstd's decompression context, kept between blocks.
    dctx: Option<zstd::bulk::Decompressor<'static>>,
    /// Compressed blocks are passed over ([`Reader::skip_blocks`]).
    skip_blocks: bool,
}

type Res<T> = Result<T, ReadErrorKind>;

impl<R: Read> Reader<R> {
    /// A reader of the stream `inner` holds, from its first byte (the header).
    pub fn new(inner: R) -> Reader<R> {
        Reader {
            inner,
            buf: vec![0; CHUNK],
            pos: 0,
            end: 0,
            spliced_end: 0,
            block_offset: 0,
            file_base: 0,
            record_start: 0,
            tid: 0,
            last_time: 0,
            time_shift: 0,
            addr_deltas: false,
            last_addr: 0,
            word: 8,
            spare: Vec::new(),
            dctx: None,
            skip_blocks: false,
        }
    }

    /// Reads more of the source after the undecoded bytes; false at its end.
    fn refill(&mut self) -> Res<bool> {
        if self.pos >= self.spliced_end {
            self.file_base += (self.pos - self.spliced_end) as u64;
            self.spliced_end = 0;
        } else {
            self.spliced_end -= self.pos;
        }
        self.buf.copy_within(self.pos..self.end, 0);
        self.end -= self.pos;
        self.pos = 0;
        // At most CHUNK at a time, though the buffer may be longer (it
        // only grows, `splice_block`): the bytes read past a compressed
        // block are copied after its contents, and reads as long as the
        // buffer made that tail, and so the buffers, grow block by block
        // (without this bound the random churn's report took 3.8 s and
        // 143 MB, not 2.8 s and 101 MB).
        let to = self.buf.len().min(self.end + CHUNK);
        loop {
            match self.inner.read(&mut self.buf[self.end..to]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ReadErrorKind::Io(e)),
            }
        }
    }

    /// Bytes of the stream consumed so far: after a successful record,
    /// where the next one starts (inside a compressed block: where the
    /// block starts).
    pub fn offset(&self) -> u64 {
        if self.pos < self.spliced_end {
            self.block_offset
        } else {
            self.file_base + (self.pos - self.spliced_end) as u64
        }
    }

    /// Whether the next record starts a record of the stream itself (not
    /// one inside a compressed block): every byte before [`Reader::offset`]
    /// belongs to the records read so far.
    pub fn at_top(&self) -> bool {
        self.pos >= self.spliced_end
    }

    /// Where the record last returned starts in the stream (one inside a
    /// compressed block: where the block starts).
    pub fn record_offset(&self) -> u64 {
        self.record_start
    }

    /// With `skip`, compressed blocks are passed over unread: their records
    /// are not returned, and times and addresses of records after one
    /// (which are deltas from the block's last) are wrong. For a reader
    /// that looks only for records of absolute time at the stream's own
    /// level, as a checkpoint's start (docs/FORMAT.md, record 28).
    pub fn skip_blocks(&mut self, skip: bool) {
        self.skip_blocks = skip;
    }

    /// The source, for a wrapper of it that must be told something (what
    /// a tee of it has copied).
    pub fn source_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Thread of the records returned since the last [`Record::Thread`].
    pub fn tid(&self) -> u32 {
        self.tid
    }

    fn err(&self, kind: ReadErrorKind) -> ReadError {
        ReadError { offset: self.record_start, kind }
    }

    #[inline]
    fn u8(&mut self) -> Res<u8> {
        if self.pos == self.end && !self.refill()? {
            return Err(ReadErrorKind::Truncated);
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn varint(&mut self) -> Res<u64> {
        // Fast path: a varint of up to 8 bytes, all before `end` (bytes
        // after it in the word are stale and do not matter).
        if let Some(w) = self.buf.get(self.pos..self.pos + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
            if let Some((v, len)) = crate::varint::varint_in_word(u64::from_le_bytes(w)) {
                if self.pos + len <= self.end {
                    self.pos += len;
                    return Ok(v);
                }
            }
        }
        self.varint_slow()
    }

    fn varint_slow(&mut self) -> Res<u64> {
        let mut v = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(ReadErrorKind::Corrupt("varint overflows 64 bits".into()));
            }
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ReadErrorKind::Corrupt("varint longer than 10 bytes".into()))
    }

    fn len(&mut self, max: u64, what: &str) -> Res<usize> {
        let n = self.varint()?;
        if n > max {
            return Err(ReadErrorKind::Corrupt(format!("{what} length {n} exceeds {max}")));
        }
        Ok(n as usize)
    }

    fn bytes(&mut self) -> Res<Vec<u8>> {
        let n = self.len(MAX_STRING, "string")?;
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            if self.pos == self.end && !self.refill()? {
                return Err(ReadErrorKind::Truncated);
            }
            let take = (n - v.len()).min(self.end - self.pos);
            v.extend_from_slice(&self.buf[self.pos..self.pos + take]);
            self.pos += take;
        }
        Ok(v)
    }

    fn string(&mut self) -> Res<String> {
        Ok(String::from_utf8_lossy(&self.bytes()?).into_owned())
    }

    #[inline]
    fn u32(&mut self, what: &str) -> Res<u32> {
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| ReadErrorKind::Corrupt(format!("{what} {v} exceeds 32 bits")))
    }

    /// A record's time, ns.
    #[inline]
    fn time(&mut self) -> Res<u64> {
        let d = unzigzag(self.varint()?);
        self.last_time = self.last_time.wrapping_add(d as u64);
        Ok(self.last_time << self.time_shift)
    }

    /// A heap address (Alloc, Free, Realloc).
    #[inline]
    fn addr(&mut self) -> Res<u64> {
        let v = self.varint()?;
        if !self.addr_deltas {
            return Ok(v);
        }
        self.last_addr = self.last_addr.wrapping_add(unzigzag(v) as u64);
        Ok(self.last_addr)
    }

    /// Reads the header. Call once, before any record.
    pub fn header(&mut self) -> Result<Header, ReadError> {
        self.record_start = 0;
        self.header_inner().map_err(|k| self.err(k))
    }

    fn header_inner(&mut self) -> Res<Header> {
        let mut magic = [0u8; 8];
        for b in magic.iter_mut() {
            *b = match self.u8() {
                Ok(b) => b,
                Err(ReadErrorKind::Truncated) if self.offset() == 0 => {
                    return Err(ReadErrorKind::Corrupt("empty file".into()))
                }
                Err(e) => return Err(e),
            };
        }
        if magic != MAGIC {
            return Err(ReadErrorKind::BadMagic);
        }
        let version = self.varint()?;
        // The version, pointer size and byte order stand first in every
        // version: bytes after the magic that are no header (a corrupt
        // file) are called so, not a newer format (issue 65, item 6).
        let pointer_size = self.u8()?;
        let big_endian = self.u8()?;
        if version == 0 || !matches!(pointer_size, 4 | 8) || big_endian > 1 {
            return Err(ReadErrorKind::Corrupt(format!(
                "header of format version {version}, pointer size {pointer_size}, byte order {big_endian}"
            )));
        }
        if version > VERSION {
            return Err(ReadErrorKind::UnsupportedVersion(version));
        }
        self.word = crate::record::word_size(pointer_size);
        let big_endian = big_endian != 0;
        let arch = self.string()?;
        if arch.len() > MAX_ARCH || !arch.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ReadErrorKind::Corrupt(format!("header's architecture {arch:?}")));
        }
        let pid = self.u32("pid")?;
        let ppid = self.u32("ppid")?;
        let exe = self.string()?;
        let argc = self.len(MAX_LIST, "argv")?;
        let mut cmdline = Vec::with_capacity(argc.min(1024));
        for _ in 0..argc {
            cmdline.push(self.string()?);
        }
        let start_realtime_ns = self.varint()?;
        let start_monotonic_ns = self.varint()?;
        let time_shift = if version >= 7 { self.u8()? } else { 0 };
        if time_shift > 32 {
            return Err(ReadErrorKind::Corrupt(format!("time unit of 2^{time_shift} ns")));
        }
        self.time_shift = time_shift.into();
        self.addr_deltas = version >= 7;
        Ok(Header {
            version,
            pointer_size,
            big_endian,
            arch,
            pid,
            ppid,
            exe,
            cmdline,
            start_realtime_ns,
            start_monotonic_ns,
            time_shift,
        })
    }

    /// Reads the next record. `Ok(None)` at the end of a complete stream;
    /// `Err` with [`ReadErrorKind::Truncated`] when it ends inside a record.
    #[inline]
    pub fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        let mut rec = Record::EMPTY;
        Ok(self.next_into(&mut rec)?.then_some(rec))
    }

    /// [`Reader::next_record`] into `out`: true when a record was read,
    /// false at the end of the stream; at the end and on an error `out` is
    /// unchanged.
    ///
    /// For a reader that keeps a ring of records: the heap events' fields
    /// are written one by one, and a copy of the whole record right after
    /// (returning it, wrapping it in a `Result`) loads across those stores,
    /// which the CPU cannot forward to a wider load: a stall per copy, half
    /// of the decoding thread's time on python3's trace. Records read a
    /// while after they were written are copied at full speed.
    #[inline]
    pub fn next_into(&mut self, out: &mut Record) -> Result<bool, ReadError> {
        loop {
            self.record_start = self.offset();
            if self.pos == self.end && !self.refill().map_err(|k| self.err(k))? {
                return Ok(false);
            }
            let t = self.u8().map_err(|k| self.err(k))?;
            if t == tag::COMPRESSED {
                self.splice_block().map_err(|k| self.err(k))?;
                continue;
            }
            return match self.heap_event(t, out) {
                Ok(true) => Ok(true),
                Ok(false) => match self.record(t) {
                    Ok(rec) => {
                        *out = rec;
                        Ok(true)
                    }
                    Err(k) => Err(self.err(k)),
                },
                Err(k) => Err(self.err(k)),
            };
        }
    }

    /// Replaces the compressed block record just started by its contents,
    /// which are then read like any other records.
    fn splice_block(&mut self) -> Res<()> {
        if self.pos <= self.spliced_end {
            return Err(ReadErrorKind::Corrupt("compressed block inside a compressed block".into()));
        }
        let raw_len = self.len(MAX_BLOCK, "block")?;
        let comp_len = self.len(MAX_BLOCK, "compressed block")?;
        while self.end - self.pos < comp_len {
            if self.buf.len() < comp_len + CHUNK {
                self.buf.resize(comp_len + CHUNK, 0);
            }
            if !self.refill()? {
                return Err(ReadErrorKind::Truncated);
            }
        }
        if self.skip_blocks {
            self.pos += comp_len;
            return Ok(());
        }
        let comp = &self.buf[self.pos..self.pos + comp_len];
        let corrupt = |e: std::io::Error| ReadErrorKind::Corrupt(format!("compressed block: {e}"));
        let dctx = match &mut self.dctx {
            Some(d) => d,
            None => self.dctx.insert(zstd::bulk::Decompressor::new().map_err(corrupt)?),
        };
        // The two buffers take turns and only grow: zeroed once, their
        // bytes past `end` are stale, which nothing reads before a refill
        // writes them (each block's 1 MiB of zeros after it was 2.4% of
        // the decoding thread's samples on jq's trace).
        let mut buf = std::mem::take(&mut self.spare);
        let tail = self.end - self.pos - comp_len;
        let end = raw_len + tail;
        if buf.len() < end + CHUNK {
            buf.resize(end + CHUNK, 0);
        }
        // Writes at most the buffer: raw_len fits, a longer block fails.
        let n = dctx.decompress_to_buffer(comp, &mut buf[..]).map_err(corrupt)?;
        if n != raw_len {
            return Err(ReadErrorKind::Corrupt(format!("block of {n} bytes, {raw_len} announced")));
        }
        let after = self.file_base + (self.pos + comp_len - self.spliced_end) as u64;
        buf[raw_len..end].copy_from_slice(&self.buf[self.pos + comp_len..self.end]);
        self.spare = std::mem::replace(&mut self.buf, buf);
        self.block_offset = self.record_start;
        self.file_base = after;
        self.spliced_end = raw_len;
        self.pos = 0;
        self.end = end;
        Ok(())
    }

    #[inline]
    fn family(&mut self) -> Res<Family> {
        let v = self.u8()? as u64;
        Family::from_u64(v).ok_or_else(|| ReadErrorKind::Corrupt(format!("unknown family {v}")))
    }

    /// Record `t` into `out` when it is a heap event (Alloc, Free,
    /// Realloc: nearly every record of a trace), written in place
    /// ([`Reader::next_into`]); false for any other tag.
    #[inline]
    fn heap_event(&mut self, t: u8, out: &mut Record) -> Res<bool> {
        match t {
            // The tags of one kind differ only in the fields they carry
            // last: those not written are 0.
            tag::ALLOC | tag::ALLOC_ALIGNED => {
                *out = Record::Alloc {
                    time_ns: self.time()?,
                    family: self.family()?,
                    addr: self.addr()?,
                    size: self.varint()?,
                    stack: self.u32("stack id")?,
                    align: if t == tag::ALLOC_ALIGNED { self.varint()? } else { 0 },
                }
            }
            tag::FREE | tag::FREE_STACK | tag::FREE_SIZED => {
                *out = Record::Free {
                    time_ns: self.time()?,
                    family: self.family()?,
                    addr: self.addr()?,
                    stack: if t == tag::FREE { 0 } else { self.u32("stack id")? },
                    size: if t == tag::FREE_SIZED { self.varint()? } else { 0 },
                    align: if t == tag::FREE_SIZED { self.varint()? } else { 0 },
                }
            }
            tag::REALLOC => {
                *out = Record::Realloc {
                    time_ns: self.time()?,
                    free_time_ns: self.last_time.wrapping_sub(unzigzag(self.varint()?) as u64) << self.time_shift,
                    old: self.addr()?,
                    new: self.addr()?,
                    size: self.varint()?,
                    stack: self.u32("stack id")?,
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Record `t`, any but a heap event ([`Reader::heap_event`]).
    fn record(&mut self, t: u8) -> Res<Record> {
        Ok(match t {
            tag::THREAD => {
                let tid = self.u32("tid")?;
                self.last_time = self.varint()?;
                self.last_addr = 0;
                self.tid = tid;
                Record::Thread { tid, time_ns: self.last_time << self.time_shift }
            }
            tag::STACK => {
                let id = self.u32("stack id")?;
                let n = self.len(MAX_FRAMES, "backtrace")?;
                let mut frames = Vec::with_capacity(n);
                let mut prev = 0u64;
                for _ in 0..n {
                    prev = prev.wrapping_add(unzigzag(self.varint()?) as u64);
                    frames.push(prev);
                }
                Record::Stack { id, frames }
            }
            tag::MMAP => Record::Mmap {
                time_ns: self.time()?,
                addr: self.varint()?,
                len: self.varint()?,
                prot: self.u32("prot")?,
                flags: self.u32("flags")?,
                fd: unzigzag(self.varint()?) as i32,
                stack: self.u32("stack id")?,
            },
            tag::MUNMAP => Record::Munmap { time_ns: self.time()?, addr: self.varint()?, len: self.varint()? },
            tag::MREMAP => Record::Mremap {
                time_ns: self.time()?,
                old: self.varint()?,
                old_len: self.varint()?,
                new: self.varint()?,
                new_len: self.varint()?,
                stack: self.u32("stack id")?,
            },
            tag::MODULES => {
                let time_ns = self.time()?;
                let n = self.len(MAX_LIST, "module list")?;
                let mut modules = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    modules.push(self.module()?);
                }
                Record::Modules { time_ns, modules }
            }
            tag::END => {
                let time_ns = self.time()?;
                let (code, arg) = (self.varint()?, self.varint()?);
                let reason = EndReason::from_pair(code, arg)
                    .ok_or_else(|| ReadErrorKind::Corrupt(format!("unknown end reason {code}")))?;
                Record::End { time_ns, reason }
            }
            tag::POOL_NAME => Record::PoolName { id: self.u32("pool id")?, name: self.string()? },
            tag::POOL_ALLOC => Record::PoolAlloc {
                time_ns: self.time()?,
                pool: self.u32("pool id")?,
                addr: self.varint()?,
                size: self.varint()?,
                stack: self.u32("stack id")?,
            },
            tag::POOL_FREE => {
                Record::PoolFree { time_ns: self.time()?, pool: self.u32("pool id")?, addr: self.varint()? }
            }
            tag::SCAN_REGION => {
                let (time_ns, kind, addr, bytes) = (self.time()?, self.u8()?, self.varint()?, self.bytes()?);
                if kind & crate::region_kind::SPARSE != 0 {
                    crate::sparse::parse(&bytes, self.word).map_err(ReadErrorKind::Corrupt)?;
                }
                Record::ScanRegion { time_ns, kind, addr, bytes }
            }
            tag::SCAN_END => Record::ScanEnd { time_ns: self.time()? },
            tag::COVERAGE => {
                let time_ns = self.time()?;
                // Bit 0: collecting; bit 1: whole, which needs bit 0.
                let (collecting, whole) = match self.u8()? {
                    0 => (false, false),
                    1 => (true, false),
                    3 => (true, true),
                    v => return Err(ReadErrorKind::Corrupt(format!("coverage {v}"))),
                };
                Record::Coverage { time_ns, collecting, whole }
            }
            tag::PATCHED => {
                let (time_ns, path) = (self.time()?, self.string()?);
                let n = self.len(MAX_LIST, "list of hooked functions")?;
                let mut hooked = Vec::with_capacity(n.min(256));
                for _ in 0..n {
                    hooked.push(self.string()?);
                }
                let n = self.len(MAX_LIST, "list of functions left alone")?;
                let mut refused = Vec::with_capacity(n.min(256));
                for _ in 0..n {
                    refused.push((self.string()?, self.string()?));
                }
                Record::Patched { time_ns, patch: Box::new(crate::Patch { path, hooked, refused }) }
            }
            tag::REPORT_TO => Record::ReportTo { time_ns: self.time()?, seq: self.varint()?, path: self.string()? },
            tag::EXEC => Record::Exec { time_ns: self.time()?, path: self.string()? },
            tag::SPAWNED => Record::Spawned { time_ns: self.time()?, pid: self.u32("pid")?, path: self.string()? },
            tag::SAMPLING => Record::Sampling { time_ns: self.time()?, rate: self.varint()? },
            tag::CHECKPOINT => {
                let time_ns = self.varint()? << self.time_shift;
                let n = self.len(MAX_LIST, "checkpoint totals")?;
                let mut totals = Vec::with_capacity(n.min(256));
                for _ in 0..n {
                    totals.push((self.string()?, self.varint()?));
                }
                Record::Checkpoint { time_ns, totals }
            }
            tag::CHECKPOINT_END => {
                let time_ns = self.varint()? << self.time_shift;
                let n = self.len(MAX_STACK_SUMS, "checkpoint backtrace totals")?;
                let mut stacks = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    stacks.push(crate::StackSum {
                        id: self.u32("stack id")?,
                        allocations: self.varint()?,
                        bytes: self.varint()?,
                        peak_bytes: self.varint()?,
                        peak_blocks: self.varint()?,
                    });
                }
                Record::CheckpointEnd { time_ns, stacks }
            }
            tag::WATERMARK => Record::Watermark { time_ns: self.varint()? << self.time_shift },
            tag::SAMPLE => Record::Sample { time_ns: self.time()?, rss: self.varint()? },
            tag::MARKER => Record::Marker { time_ns: self.time()?, seq: self.varint()?, name: self.string()? },
            other => return Err(ReadErrorKind::Corrupt(format!("unknown record tag {other}"))),
        })
    }

    fn module(&mut self) -> Res<Module> {
        let path = self.string()?;
        let bias = self.varint()?;
        let build_id = self.bytes()?;
        let n = self.len(256, "segment list")?;
        let mut segments = Vec::with_capacity(n);
        for _ in 0..n {
            segments.push(Segment { vaddr: self.varint()?, memsz: self.varint()?, flags: self.u32("segment flags")? });
        }
        Ok(Module { path, bias, build_id, segments })
    }
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
