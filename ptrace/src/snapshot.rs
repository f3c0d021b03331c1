//! The leak scan's snapshot taken from outside the process (docs/SCAN.md):
//! the same ScanRegion records libmtrace.so writes, read with
//! `process_vm_readv`, so that the analyzer classifies both alike.
//!
//! Taken when the process ends (its first thread's `PTRACE_EVENT_EXIT`
//! stop of an `exit_group`, or of a fatal signal): the memory is all
//! there, the program's exit handlers and destructors have run, as at
//! memcheck's leak check. Written, as the preload writes them:
//! - each thread's general registers (R8 … RIP, the preload's 17 words;
//!   no vector registers, as there) and its stack from the stack pointer,
//!   less the x86-64 red zone, up to the end of its mapping: the thread
//!   that ends the process, and the others at their own exit stops (the
//!   same exit kills them; registers where they were interrupted);
//! - each thread's static TLS: the executable's `PT_TLS` block below the
//!   thread pointer (`fs_base`) and the thread descriptor above it, a root
//!   like a stack: in a static program the main thread's lies inside the
//!   brk heap, where the analyzer would otherwise not look for roots;
//! - not the stacks of threads that ended before (from their mapping's
//!   start up to their descriptor, as the preload leaves them out), unless
//!   a live thread runs on one again;
//! - every other readable, writable mapping but the kernel's (`[vvar]`,
//!   `[vsyscall]`, `[uprobes]`); the analyzer tells heap blocks from roots;
//! - each module's RELRO as READ_ONLY, for the multipleinheritance
//!   heuristic's vtables (`mtrace_format::maps::relro`, as the preload
//!   finds it; until 2026-12-07 all read-only file data was written,
//!   which no scan reads: families.c's snapshot read 815,192 bytes and
//!   its trace took 246,104, now 263,720 and 9,732); but a static
//!   executable's RELRO is a root: glibc's start-up keeps its pointers to
//!   the blocks it allocates there (`_dl_init_paths`,
//!   `_dl_find_object_init`), where a dynamic program's loader keeps them
//!   in memory of its own.
//!
//! A thread whose exit stop did not come in time (a second) has its stack
//! written as a whole mapping: its stack pointer is not known.

use anyhow::Result;
use mtrace_format::maps::Mapping;
use mtrace_format::{region_kind, Record};
use nix::unistd::Pid;

use crate::arch::Regs;
use crate::stream::Stream;
use crate::target;

/// Bytes per ScanRegion record at most (as the preload writes them).
const PIECE: usize = 512 << 10;
/// The x86-64 ABI's red zone below the stack pointer.
const RED_ZONE: u64 = 128;
/// Bytes of the thread descriptor kept above the thread pointer: glibc's
/// `struct pthread` rounded up to a page (2,368 bytes in glibc 2.36 on
/// x86-64: `gdb -batch -ex 'p sizeof(struct pthread)' libc.so.6`).
const DESCRIPTOR: u64 = 4096;
/// A page.
const PAGE: u64 = 4096;

/// What a snapshot wrote.
#[derive(Debug, Default, Clone, Copy)]
pub struct Written {
    /// Bytes of memory read.
    pub bytes: u64,
    /// Regions (records).
    pub regions: u64,
}

/// A range the snapshot writes with a kind of its own, inside a mapping.
struct Special {
    lo: u64,
    hi: u64,
    kind: u8,
}

/// What of the executable the snapshot needs (read from its ELF headers).
#[derive(Debug, Default, Clone, Copy)]
pub struct Image {
    /// Its `PT_TLS` size, bytes (0: none).
    pub tls: u64,
    /// Its RELRO range in the process, when it is a root (a static
    /// executable's).
    pub relro_root: Option<(u64, u64)>,
}

/// Not written: a dead thread's stack.
const DEAD: u8 = 0xff;

/// The stack of a thread that ended, [low, high): its mapping's start up
/// to its thread descriptor (`fs_base`), from its registers at its exit
/// stop and `pid`'s mappings; `None` when its stack pointer is in no
/// mapping below its descriptor (a main thread, or a stack of its own).
pub fn dead_stack(pid: Pid, regs: &Regs) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let (sp, fs) = (regs.sp(), regs.0.fs_base);
    let m = Mapping::all(&text).find(|m| m.start <= sp && sp < m.end)?;
    (m.start < fs && fs <= m.end && sp < fs).then_some((m.start, fs))
}

/// A thread as the snapshot takes it: its id, its registers, and the
/// lowest address of its stack that is live.
pub type Stopped = (Pid, Regs, u64);

/// A thread stopped with `regs` where it was interrupted: its stack is
/// live from its stack pointer less the red zone.
pub fn interrupted(tid: Pid, regs: Regs) -> Stopped {
    (tid, regs, regs.sp().saturating_sub(RED_ZONE))
}

/// A thread stopped with `regs` at the entry of `exit`: the calling
/// frame's registers that live across a call (RBX, RBP, RSP, R12–R15: the
/// others held the caller's dead temporaries and `exit`'s argument), its
/// stack live from the return address up (the exit path's frames below it
/// are not roots, as under the preload).
pub fn calling_exit(tid: Pid, mut regs: Regs) -> Stopped {
    let g = &mut regs.0;
    for r in [&mut g.rax, &mut g.rcx, &mut g.rdx, &mut g.rsi, &mut g.rdi, &mut g.r8, &mut g.r9, &mut g.r10, &mut g.r11]
    {
        *r = 0;
    }
    (tid, regs, regs.sp())
}

/// Writes process `pid`'s snapshot into `stream`: `threads` the stopped
/// threads (the first the one ending the process), `dead` the stacks of
/// threads that ended before ([`dead_stack`]).
pub fn take(stream: &mut Stream, pid: Pid, threads: &[Stopped], dead: &[(u64, u64)], image: Image) -> Result<Written> {
    let tls = image.tls;
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let maps: Vec<Mapping> = Mapping::all(&text).collect();
    let tid = threads.first().map_or(pid, |t| t.0);
    let sp = |r: &Regs| r.sp();
    let mut w = Writer { stream, pid, tid: tid.as_raw() as u32, time: 0, out: Written::default() };
    w.time = w.stream.now();
    let mut specials: Vec<Special> = Vec::new();
    for (tid, regs, live_from) in threads {
        w.registers(tid.as_raw() as u32, regs);
        if let Some(m) = maps.iter().find(|m| m.start <= sp(regs) && sp(regs) < m.end) {
            specials.push(Special { lo: (live_from & !7).max(m.start), hi: m.end, kind: region_kind::STACK });
        }
    }
    for (_, regs, _) in threads {
        let fs = regs.0.fs_base;
        let lo = fs.saturating_sub(tls.next_multiple_of(64)) & !(PAGE - 1);
        let Some(m) = maps.iter().find(|m| fs != 0 && m.start <= fs && fs < m.end && m.write) else { continue };
        let (lo, hi) = (lo.max(m.start), (fs + DESCRIPTOR).min(m.end));
        // Inside a stack's live part already (a thread's descriptor sits at
        // the top of its stack): nothing to add.
        if !specials.iter().any(|s| s.lo <= lo && hi <= s.hi) {
            specials.push(Special { lo, hi, kind: region_kind::STACK });
        }
    }
    for &(lo, hi) in dead {
        // A live thread's stack again: its live part is written already.
        if !threads.iter().any(|(_, r, _)| lo <= sp(r) && sp(r) < hi) {
            specials.push(Special { lo, hi, kind: DEAD });
        }
    }
    specials.sort_by_key(|s| s.lo);
    // Overlaps (a dead stack's top under a live TLS): the earlier wins.
    let mut kept: Vec<Special> = Vec::new();
    for s in specials {
        match kept.last() {
            Some(k) if s.lo < k.hi => {
                if s.hi > k.hi {
                    kept.push(Special { lo: k.hi, hi: s.hi, kind: s.kind });
                }
            }
            _ => kept.push(s),
        }
    }
    let specials = kept;
    let readable: Vec<Mapping> = maps.iter().filter(|m| m.read).cloned().collect();
    let relro = mtrace_format::maps::relro(&readable);
    for m in &maps {
        if !m.read || is_kernels(m) {
            continue;
        }
        if !m.write {
            // A static executable's RELRO, a root; any other RELRO, read
            // for its vtables only.
            let (lo, hi) = image.relro_root.unwrap_or((0, 0));
            let (lo, hi) = (lo.max(m.start), hi.min(m.end));
            if m.is_file() && !m.exec && lo < hi {
                w.memory(region_kind::READ_ONLY, m.start, lo);
                w.memory(region_kind::MAPPING, lo, hi);
                w.memory(region_kind::READ_ONLY, hi, m.end);
            } else if relro.contains(&(m.start, m.end)) {
                w.memory(region_kind::READ_ONLY, m.start, m.end);
            }
            continue;
        }
        // A stack: below its stack pointer it is dead (the preload leaves
        // that out too).
        let stack = m.path == "[stack]" || threads.iter().any(|(_, r, _)| m.start <= sp(r) && sp(r) < m.end);
        let mut at = m.start;
        for s in specials.iter().filter(|s| s.lo < m.end && s.hi > m.start) {
            if at < s.lo && !stack {
                w.memory(region_kind::MAPPING, at, s.lo);
            }
            if s.kind != DEAD {
                w.memory(s.kind, s.lo.max(m.start), s.hi.min(m.end));
            }
            at = s.hi.min(m.end);
        }
        if at < m.end && !(stack && at > m.start) {
            w.memory(region_kind::MAPPING, at, m.end);
        }
    }
    w.stream.record(w.tid, &Record::ScanEnd { time_ns: w.time });
    Ok(w.out)
}

/// The kernel's mappings, which hold no pointer of the program's.
fn is_kernels(m: &Mapping) -> bool {
    matches!(m.path.as_str(), "[vvar]" | "[vvar_vclock]" | "[vsyscall]" | "[vdso]" | "[uprobes]")
}

struct Writer<'a> {
    stream: &'a mut Stream,
    pid: Pid,
    tid: u32,
    time: u64,
    out: Written,
}

impl Writer<'_> {
    /// The thread's general registers as words (the preload's order: R8 …
    /// R15, RDI, RSI, RBP, RBX, RDX, RAX, RCX, RSP, RIP).
    fn registers(&mut self, tid: u32, r: &Regs) {
        let g = &r.0;
        let words = [
            g.r8, g.r9, g.r10, g.r11, g.r12, g.r13, g.r14, g.r15, g.rdi, g.rsi, g.rbp, g.rbx, g.rdx, g.rax, g.rcx,
            g.rsp, g.rip,
        ];
        let bytes = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let rec = Record::ScanRegion { time_ns: self.time, kind: region_kind::REGISTERS, addr: tid as u64, bytes };
        self.stream.record(self.tid, &rec);
        self.out.regions += 1;
    }

    /// `[lo, hi)` of the process in records of `kind`, at most [`PIECE`]
    /// bytes each, the pieces after the first marked as the same mapping;
    /// pages that cannot be read (guard pages) are left out.
    fn memory(&mut self, kind: u8, lo: u64, hi: u64) {
        let mut at = lo;
        let mut first = true;
        let mut buf = Vec::new();
        while at < hi {
            let len = ((hi - at) as usize).min(PIECE);
            buf.resize(len, 0);
            let got = target::read(self.pid, at, &mut buf);
            // A short read stopped at an unreadable page: it is skipped.
            let (keep, next) = match got {
                0 => (0, (at + PAGE) & !(PAGE - 1)),
                n => (n, at + n as u64),
            };
            if keep > 0 {
                let k = if first { kind } else { kind | region_kind::SAME_MAPPING };
                let bytes = buf[..keep].to_vec();
                self.stream.record(self.tid, &Record::ScanRegion { time_ns: self.time, kind: k, addr: at, bytes });
                self.out.bytes += keep as u64;
                self.out.regions += 1;
                first = false;
            }
            at = next.min(hi).max(at + 1);
        }
    }
}

/// The executable of `pid` as the snapshot needs it; `static_exe`: it is
/// statically linked (its RELRO is then a root). Empty when it cannot be
/// read.
pub fn image(pid: Pid, static_exe: bool) -> Image {
    use object::read::elf::{FileHeader, ProgramHeader};
    let Ok(data) = std::fs::read(format!("/proc/{pid}/exe")) else { return Image::default() };
    let Ok(elf) = object::elf::FileHeader64::<object::Endianness>::parse(&*data) else { return Image::default() };
    let Ok(endian) = elf.endian() else { return Image::default() };
    let Ok(headers) = elf.program_headers(endian, &*data) else { return Image::default() };
    let of = |t| headers.iter().find(move |h| h.p_type(endian) == t);
    let tls = of(object::elf::PT_TLS).map_or(0, |h| h.p_memsz(endian));
    // A static PIE is loaded at a bias: where its first segment is mapped.
    let bias = match elf.e_type(endian) {
        object::elf::ET_EXEC => 0,
        _ => first_mapping(pid).unwrap_or(0),
    };
    let relro_root = of(object::elf::PT_GNU_RELRO)
        .filter(|_| static_exe)
        .map(|h| (bias + h.p_vaddr(endian), bias + h.p_vaddr(endian) + h.p_memsz(endian)));
    Image { tls, relro_root }
}

/// The start of the executable's first mapping (its file offset 0).
fn first_mapping(pid: Pid) -> Option<u64> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let exe = exe.to_string_lossy();
    let start = Mapping::all(&text).find(|m| m.offset == 0 && m.path == exe).map(|m| m.start);
    start
}
