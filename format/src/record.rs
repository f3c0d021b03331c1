//! The values carried by a stream: its header and its records.

/// The allocator family of an allocation or a free, so that the analyzer can
/// say which API a leaked block came from (and, later, flag mismatches such
/// as `new[]` freed with `free`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// malloc, calloc, realloc, reallocarray, free, cfree.
    Malloc = 0,
    /// C++ `operator new` / `operator delete` (scalar, any variant).
    New = 1,
    /// C++ `operator new[]` / `operator delete[]` (any variant).
    NewArray = 2,
    /// posix_memalign, aligned_alloc, memalign, valloc, pvalloc.
    Aligned = 3,
    /// mmap, mmap64, mremap, munmap.
    Mmap = 4,
    /// Allocations the program records itself with `mtrace_alloc()` (pools,
    /// caches, non-memory resources); see [`Record::PoolAlloc`].
    Pool = 5,
    /// A heap block glibc allocated while the thread was inside a hook: for
    /// the tracer itself (its calls into libc, the TLS set-up its
    /// thread-locals cause), or in a signal handler that interrupted a
    /// hook. Recorded without a backtrace so that its free (the program
    /// may free it, as pthread_join frees a thread's DTV) finds it; not the
    /// program's allocation, so not counted or reported.
    Internal = 6,
    /// Only for a free: made through a function that is both `free` and
    /// `operator delete` (gperftools' tcmalloc and mimalloc define one as
    /// an alias of the other), so the call does not say which the program
    /// meant: never a mismatched free. Since version 12.
    Shared = 7,
}

impl Family {
    /// Decodes the on-disk number; `None` for a value this version does not know.
    pub fn from_u64(v: u64) -> Option<Family> {
        Some(match v {
            0 => Family::Malloc,
            1 => Family::New,
            2 => Family::NewArray,
            3 => Family::Aligned,
            4 => Family::Mmap,
            5 => Family::Pool,
            6 => Family::Internal,
            7 => Family::Shared,
            _ => return None,
        })
    }

    /// The name used in reports: `malloc`, `new`, `new[]`, `aligned`, `mmap`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Malloc => "malloc",
            Family::New => "new",
            Family::NewArray => "new[]",
            Family::Aligned => "aligned",
            Family::Mmap => "mmap",
            Family::Pool => "pool",
            Family::Internal => "internal",
            Family::Shared => "free/delete",
        }
    }
}

/// Why the producer wrote an [`Record::End`]: the point where every event
/// before it is known to be in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// `exit()` or a return from `main` (the library's destructor ran),
    /// with the exit status when the producer knew it (since version 12).
    Exit(Option<u8>),
    /// `_exit()` or `_Exit()` called by the program, with its status (since
    /// version 12).
    UnderscoreExit(Option<u8>),
    /// `abort()`.
    Abort,
    /// A fatal signal with this number.
    Signal(u32),
    /// A successful `exec*()` replaces the image; the new image writes a new stream.
    Exec,
    /// Tracing stopped while the program goes on: `mtrace attach` detached,
    /// or the reader of a socket stream asked for it or went away.
    Detach,
}

impl EndReason {
    pub(crate) fn to_pair(self) -> (u64, u64) {
        match self {
            // The status plus one; 0: not known.
            EndReason::Exit(s) => (0, s.map_or(0, |s| s as u64 + 1)),
            EndReason::UnderscoreExit(s) => (1, s.map_or(0, |s| s as u64 + 1)),
            EndReason::Abort => (2, 0),
            EndReason::Signal(n) => (3, n as u64),
            EndReason::Exec => (4, 0),
            EndReason::Detach => (5, 0),
        }
    }

    pub(crate) fn from_pair(code: u64, arg: u64) -> Option<EndReason> {
        Some(match code {
            0 => EndReason::Exit(status(arg)?),
            1 => EndReason::UnderscoreExit(status(arg)?),
            2 => EndReason::Abort,
            3 => EndReason::Signal(u32::try_from(arg).ok().filter(|&n| n < 128)?),
            4 => EndReason::Exec,
            5 => EndReason::Detach,
            _ => return None,
        })
    }
}

/// An exit status as an End record's argument holds it: 0 for none known,
/// else the status plus one; `None` (corrupt) above 256.
fn status(arg: u64) -> Option<Option<u8>> {
    match arg {
        0 => Some(None),
        1..=256 => Some(Some((arg - 1) as u8)),
        _ => None,
    }
}

/// Everything a host needs to interpret a stream made elsewhere.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Format version (see [`crate::VERSION`]).
    pub version: u64,
    /// Size of a pointer in the target, bytes (8 on x86_64).
    pub pointer_size: u8,
    /// True when the target is big-endian.
    pub big_endian: bool,
    /// Target architecture as Rust names it (`x86_64`, `aarch64`, …).
    pub arch: String,
    /// The traced process's id.
    pub pid: u32,
    /// Its parent's.
    pub ppid: u32,
    /// Path of the traced executable (`/proc/self/exe`).
    pub exe: String,
    /// argv of the traced process.
    pub cmdline: Vec<String>,
    /// CLOCK_REALTIME when the stream started, ns since the Unix epoch.
    pub start_realtime_ns: u64,
    /// CLOCK_MONOTONIC when the stream started, ns. Record times are ns since this.
    pub start_monotonic_ns: u64,
    /// Records store times in units of 2^time_shift ns (0 before version
    /// 7); readers give them back in ns. Written as [`crate::TIME_SHIFT`]
    /// whatever this says.
    pub time_shift: u8,
}

impl Header {
    /// The header of a stream this version writes about process `pid`,
    /// run on this host's architecture, byte order and pointer size,
    /// started at `start_realtime_ns` / `start_monotonic_ns` (ns): the one
    /// rule of both producers.
    pub fn of_process(pid: u32, ppid: u32, exe: String, cmdline: Vec<String>, start: (u64, u64)) -> Header {
        Header {
            version: crate::VERSION,
            pointer_size: std::mem::size_of::<usize>() as u8,
            big_endian: cfg!(target_endian = "big"),
            arch: std::env::consts::ARCH.into(),
            pid,
            ppid,
            exe,
            cmdline,
            start_realtime_ns: start.0,
            start_monotonic_ns: start.1,
            time_shift: crate::TIME_SHIFT,
        }
    }

    /// The size in bytes of the target's words as the leak scan reads
    /// them: 4 on a 32-bit target, else 8.
    pub fn word_size(&self) -> usize {
        word_size(self.pointer_size)
    }
}

/// [`Header::word_size`] of a header whose pointer size is `pointer_size`.
pub(crate) fn word_size(pointer_size: u8) -> usize {
    if pointer_size == 4 {
        4
    } else {
        8
    }
}

/// One PT_LOAD segment of a module, relative to the module's load bias.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// p_vaddr: the segment's address in the file's own numbering.
    pub vaddr: u64,
    /// p_memsz, bytes.
    pub memsz: u64,
    /// p_flags (PF_X = 1, PF_W = 2, PF_R = 4).
    pub flags: u32,
}

/// A loaded ELF object as `dl_iterate_phdr` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Module {
    /// Path as the dynamic loader knows it; the main executable's real path.
    pub path: String,
    /// Load bias (dlpi_addr): runtime address = bias + file virtual address.
    pub bias: u64,
    /// Contents of the NT_GNU_BUILD_ID note, empty when there is none.
    pub build_id: Vec<u8>,
    /// Its PT_LOAD segments.
    pub segments: Vec<Segment>,
}

/// One record of the stream. `time_ns` is nanoseconds since the header's
/// `start_monotonic_ns`; the encoder stores it as a delta. The fields of
/// each variant are named in its description (and in docs/FORMAT.md, with
/// their encoding), not one by one: `addr`, `size`, `len` are bytes,
/// `stack` a backtrace id of a [`Record::Stack`] (0: none).
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Record {
    /// The records up to the next `Thread` come from thread `tid` (a Linux
    /// TID); `time_ns` is the base for their times.
    Thread { tid: u32, time_ns: u64 },
    /// Defines backtrace `id`: return addresses, innermost first, the
    /// tracer's own frames removed. Ids are unique within a stream; the same
    /// frames may be defined under several ids.
    Stack { id: u32, frames: Vec<u64> },
    /// A block of `size` requested bytes at `addr` from `family`. `align`:
    /// the alignment (bytes) an aligned C++ `operator new` was asked for;
    /// 0 for every other allocation (written as tag 3 then, tag 24 with
    /// it; since version 12).
    Alloc { time_ns: u64, family: Family, addr: u64, size: u64, stack: u32, align: u64 },
    /// The block at `addr` was freed (an unknown `addr` was allocated before
    /// tracing, or is a wrong free). The time is taken before the real free,
    /// an `Alloc`'s after the real malloc, so times order the events of one
    /// address; the record is buffered before the real free runs too, so
    /// that a free glibc aborts on (a double free) is in the trace.
    /// `stack` is the free's backtrace (`mtrace run -S`), 0 for none:
    /// written as tag 4 without it, tag 19 with it. `size` and `align`:
    /// what a sized or aligned deallocation was told of the block (C++'s
    /// sized and aligned `operator delete`, C23's `free_sized` and
    /// `free_aligned_sized`), bytes; 0 when it was not told (written as
    /// tag 25 when either is not 0; since version 12).
    Free { time_ns: u64, family: Family, addr: u64, stack: u32, size: u64, align: u64 },
    /// A successful realloc: block `old` is gone and block `new` of `size`
    /// bytes exists (glibc's realloc(NULL, n) is an `Alloc`, realloc(p, 0) a
    /// `Free`; a failed realloc writes nothing because `old` survives).
    /// `free_time_ns` is taken before the call and `time_ns` after it, so
    /// that the analyzer can order them against other threads' events on the
    /// same addresses. `new` 0: the process ended inside the realloc (glibc
    /// aborted on `old`, which is no live block); written by the fatal
    /// signal's flush, only the free is meant.
    Realloc { time_ns: u64, free_time_ns: u64, old: u64, new: u64, size: u64, stack: u32 },
    /// A successful mmap of `len` bytes; `fd` is -1 for anonymous mappings.
    Mmap { time_ns: u64, addr: u64, len: u64, prot: u32, flags: u32, fd: i32, stack: u32 },
    /// A successful munmap of `[addr, addr+len)`, which may cover parts of mappings.
    Munmap { time_ns: u64, addr: u64, len: u64 },
    /// A successful mremap: `[old, old+old_len)` became `[new, new+new_len)`.
    Mremap { time_ns: u64, old: u64, old_len: u64, new: u64, new_len: u64, stack: u32 },
    /// The complete list of loaded modules at this point (start, dlopen, dlclose).
    Modules { time_ns: u64, modules: Vec<Module> },
    /// Everything the process did up to `time_ns` is in the stream.
    End { time_ns: u64, reason: EndReason },
    /// A report point: incremental report `seq` (1, 2, …) was taken here
    /// (signal, `mtrace_report()`), or the program named this moment
    /// (`mtrace_marker()`). Records of other threads written before it may
    /// be up to one writer round (5 ms) older or newer.
    Marker { time_ns: u64, seq: u64, name: String },
    /// The report of the report point `seq` that follows is to be written
    /// to `path` (absolute, on the producer's machine), where the program
    /// asked (`mtrace_report(PATH)`, `mtrace_scan(PATH)`). Written just
    /// before that point's [`Record::Marker`], and only on a socket stream,
    /// whose reader writes the report and answers the program
    /// ([`crate::protocol::Command::Reported`]); a file's report points
    /// are written by the producer's own analyzer. Since version 14.
    ReportTo { time_ns: u64, seq: u64, path: String },
    /// The process's resident set size, bytes (from /proc/self/statm),
    /// sampled by the writer every 10 ms.
    Sample { time_ns: u64, rss: u64 },
    /// Names pool `id` (from `mtrace_alloc(name, …)`). May follow the first
    /// records that use the id (they come from another thread's buffer).
    PoolName { id: u32, name: String },
    /// `mtrace_alloc(pool, ptr, size)`: a block of a user-defined pool. Its
    /// address lives in the pool's own address space, apart from the heap.
    PoolAlloc { time_ns: u64, pool: u32, addr: u64, size: u64, stack: u32 },
    /// `mtrace_free(pool, ptr)`.
    PoolFree { time_ns: u64, pool: u32, addr: u64 },
    /// Part of a memory snapshot for the leak scan (docs/SCAN.md): `bytes`
    /// were at `addr`. `kind` is one of [`region_kind`]. At most 1 MiB per
    /// record; a region is split over several.
    ScanRegion { time_ns: u64, kind: u8, addr: u64, bytes: Vec<u8> },
    /// The snapshot whose regions precede it is complete.
    ScanEnd { time_ns: u64 },
    /// What the stream records of the process's heap from `time_ns` on.
    /// `collecting`: allocations are recorded (else only frees are:
    /// `MTRACE_START=off`, `mtrace_stop()`). `whole` (only with
    /// `collecting`): every heap block the process allocated up to here is
    /// in the stream — the producer traced it from its first allocation
    /// (written after the first module list). A stream starts as
    /// collecting but not whole until a Coverage record says otherwise (a
    /// forked child's or an attach's stream lacks the blocks from before
    /// it). Analyzers call a free of an address never seen an invalid free
    /// only while the stream is whole, and a second free of an address a
    /// double free only if allocations were collected since the first.
    /// Since version 6.
    Coverage { time_ns: u64, collecting: bool, whole: bool },
    /// Every event stamped before `time_ns` is in the stream before this
    /// record (its time rounded down to the stream's unit). A reader may
    /// order the events read so far by their times up to it: events of
    /// different threads then need the allocator's contract only where
    /// their stamps are closer than the clocks' skew. Absolute, not a
    /// delta: it belongs to no thread. Since version 9.
    Watermark { time_ns: u64 },
    /// From `time_ns` on, allocations of the malloc family and the C++
    /// operators are sampled: each thread records one when its count of
    /// bytes allocated crosses a point drawn from an exponential
    /// distribution with mean `rate` bytes, and always records one of at
    /// least `rate` bytes; the others (and their frees) are not in the
    /// stream. A block recorded stays recorded through its reallocs.
    /// `rate` 0: every allocation is recorded again. Mappings and pool
    /// blocks are never sampled. Readers weigh a block of `size` bytes
    /// sampled at `rate` by [`crate::sampling::weight`]. Since version 10.
    Sampling { time_ns: u64, rate: u64 },
    /// Allocation functions of a module that the producer hooked by
    /// patching their entry (an allocator defined in the executable, which
    /// wins over the preload; see [`Patch`]). Their calls are in the stream
    /// from `time_ns` on; blocks they allocated before are not. Boxed: rare,
    /// and every record is as large as the largest. Since version 12.
    Patched { time_ns: u64, patch: Box<Patch> },
    /// The process is about to replace its image: `exec*()` was called
    /// with `path` (a name that `execvp` looks up in `PATH`, as given), just
    /// before the End record of reason exec. A new image of the same pid
    /// writes a stream of its own, unless it cannot be traced (a static or
    /// setuid program, another architecture): then none follows. Since
    /// version 12.
    Exec { time_ns: u64, path: String },
    /// Child process `pid` was started to run `path`, where the producer's
    /// own tracing may not follow it (`posix_spawn`, whose child execs past
    /// the hooks; an exec in a `vfork` child): its own stream follows where
    /// it could be traced, else this is all of it. Since version 12.
    Spawned { time_ns: u64, pid: u32, path: String },
    /// A checkpoint begins: the records up to the next
    /// [`Record::CheckpointEnd`] restate the books at `time_ns` (absolute,
    /// like a watermark's: it belongs to no thread) — every module, backtrace,
    /// pool name and setting seen, then every block live then as an Alloc,
    /// Mmap or PoolAlloc record at its own allocation time. `totals`: the
    /// books' counters then, by name (`allocations`, `frees`, `peak_bytes`
    /// …: docs/FORMAT.md). Written by a consumer that bounds its trace
    /// (`mtrace run --max-trace-size`), so that a trace cut before it still
    /// reads whole from it. A reader that read the stream from its start
    /// skips the section; one that starts at it loads the books from it.
    /// Since version 13.
    Checkpoint { time_ns: u64, totals: Vec<(String, u64)> },
    /// The end of a checkpoint's section: what each backtrace allocated
    /// over the run up to it, and held live at the peak. Since version 13.
    CheckpointEnd { time_ns: u64, stacks: Vec<StackSum> },
}

/// One backtrace's books at a checkpoint ([`Record::CheckpointEnd`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackSum {
    /// Its stream id (one of those defined in the checkpoint).
    pub id: u32,
    /// Allocation calls from it since the start.
    pub allocations: u64,
    /// Bytes they requested.
    pub bytes: u64,
    /// Bytes it held live at the books' peak.
    pub peak_bytes: u64,
    /// Blocks it held live at the peak.
    pub peak_blocks: u64,
}

/// What a producer hooked by patching in one module ([`Record::Patched`]);
/// from the ptrace tracer, the functions of a dynamic executable's own
/// allocator it put breakpoints on (docs/FORMAT.md).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Patch {
    /// The module's path.
    pub path: String,
    /// The functions hooked, by name (one function may have several).
    pub hooked: Vec<String>,
    /// The functions left alone: (name, why, in a few words).
    pub refused: Vec<(String, String)>,
}

impl Record {
    /// A record that owns no memory: the value of a slot that
    /// [`crate::Reader::next_into`] writes, or that a record taken out of a
    /// batch leaves behind.
    pub const EMPTY: Record = Record::PoolFree { time_ns: 0, pool: 0, addr: 0 };

    /// The record's time (ns since the start), for the records that have one.
    pub fn time_ns(&self) -> Option<u64> {
        Some(match *self {
            Record::Alloc { time_ns, .. }
            | Record::Free { time_ns, .. }
            | Record::Realloc { time_ns, .. }
            | Record::Mmap { time_ns, .. }
            | Record::Munmap { time_ns, .. }
            | Record::Mremap { time_ns, .. }
            | Record::Modules { time_ns, .. }
            | Record::End { time_ns, .. }
            | Record::Marker { time_ns, .. }
            | Record::ReportTo { time_ns, .. }
            | Record::Sample { time_ns, .. }
            | Record::PoolAlloc { time_ns, .. }
            | Record::PoolFree { time_ns, .. }
            | Record::ScanRegion { time_ns, .. }
            | Record::ScanEnd { time_ns }
            | Record::Coverage { time_ns, .. }
            | Record::Watermark { time_ns }
            | Record::Sampling { time_ns, .. }
            | Record::Patched { time_ns, .. }
            | Record::Exec { time_ns, .. }
            | Record::Spawned { time_ns, .. } => time_ns,
            Record::Thread { .. }
            | Record::Stack { .. }
            | Record::PoolName { .. }
            | Record::Checkpoint { .. }
            | Record::CheckpointEnd { .. } => return None,
        })
    }
}

/// The kinds of [`Record::ScanRegion`].
pub mod region_kind {
    /// A thread's stack from its stack pointer up.
    pub const STACK: u8 = 0;
    /// A thread's registers, as words; `addr` is its thread id. Empty when
    /// the thread could not be stopped (its registers are unknown).
    pub const REGISTERS: u8 = 1;
    /// A readable, writable mapping (module data and bss, anonymous
    /// mappings, the heap); the analyzer tells heap blocks from roots.
    pub const MAPPING: u8 = 2;
    /// A module's read-only data that was relocated at load (its RELRO:
    /// vtables, the GOT); not a root. Read for memcheck's
    /// multipleinheritance heuristic, which looks at vtables. Since version 5.
    pub const READ_ONLY: u8 = 3;
    /// Not memory: the threads were stopped by a signal handler in the
    /// process (the producer's fallback where ptrace was refused), so a
    /// system call they waited in may have returned EINTR; `bytes` say why
    /// (UTF-8), `addr` is 0. At most one per snapshot. Since version 11.
    pub const STOPPED_BY_SIGNAL: u8 = 4;
    /// Flag added to a kind: this region is the next piece of the same
    /// mapping (or stack) as the ScanRegion before it.
    pub const SAME_MAPPING: u8 = 0x80;
    /// Flag added to a kind: the bytes are a sparse payload (`sparse`
    /// module: the words that can matter to the scan, and a bitmap of
    /// where they were). Since version 8.
    pub const SPARSE: u8 = 0x40;
}

pub(crate) mod tag {
    pub const THREAD: u8 = 1;
    pub const STACK: u8 = 2;
    pub const ALLOC: u8 = 3;
    pub const FREE: u8 = 4;
    pub const REALLOC: u8 = 5;
    pub const MMAP: u8 = 6;
    pub const MUNMAP: u8 = 7;
    pub const MREMAP: u8 = 8;
    pub const MODULES: u8 = 9;
    pub const END: u8 = 10;
    /// A zstd-compressed run of whole records (not a [`super::Record`]:
    /// the reader expands it in place).
    pub const COMPRESSED: u8 = 11;
    pub const MARKER: u8 = 12;
    pub const SAMPLE: u8 = 13;
    pub const POOL_NAME: u8 = 14;
    pub const POOL_ALLOC: u8 = 15;
    pub const POOL_FREE: u8 = 16;
    pub const SCAN_REGION: u8 = 17;
    pub const SCAN_END: u8 = 18;
    /// A [`super::Record::Free`] with its backtrace.
    pub const FREE_STACK: u8 = 19;
    pub const COVERAGE: u8 = 20;
    pub const WATERMARK: u8 = 21;
    pub const SAMPLING: u8 = 22;
    pub const PATCHED: u8 = 23;
    /// A [`super::Record::Alloc`] with its alignment.
    pub const ALLOC_ALIGNED: u8 = 24;
    /// A [`super::Record::Free`] with the size or alignment it was given.
    pub const FREE_SIZED: u8 = 25;
    pub const EXEC: u8 = 26;
    pub const SPAWNED: u8 = 27;
    pub const CHECKPOINT: u8 = 28;
    pub const CHECKPOINT_END: u8 = 29;
    pub const REPORT_TO: u8 = 30;
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_exit_status_round_trips_and_none_is_old_traces_zero() {
        use super::EndReason::*;
        for r in [Exit(None), Exit(Some(0)), Exit(Some(255)), UnderscoreExit(Some(3)), Signal(9), Exec, Detach, Abort] {
            let (c, a) = r.to_pair();
            assert_eq!(super::EndReason::from_pair(c, a), Some(r));
        }
        assert_eq!(super::EndReason::from_pair(0, 0), Some(Exit(None)));
        assert_eq!(super::EndReason::from_pair(0, 258), None);
    }

    #[test]
    fn a_record_stays_small() {
        // The analyzer queues records by the million while it orders
        // threads' chunks: a rare record's lists are boxed.
        assert!(std::mem::size_of::<super::Record>() <= 48, "{}", std::mem::size_of::<super::Record>());
    }
}
