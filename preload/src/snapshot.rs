//! `MTRACE_SCAN=1`: at exit, a snapshot of the memory the leak scan reads
//! goes into the trace (docs/SCAN.md), so that `mtrace report` can classify
//! the blocks offline as memcheck does.
//!
//! Taken by the exiting thread in the library destructor: its registers,
//! its stack from the stack pointer up, and every other readable, writable
//! mapping except this library's own and the kernel's ([vvar], [vdso]).
//! Memory is read with process_vm_readv, which fails where a read would
//! fault (guard pages, mappings whose file shrank) instead of crashing.

use mtrace_format::{region_kind, Encoder, Record};

use crate::session::Session;
use crate::sys;

/// Bytes per ScanRegion record (the format allows up to 1 MiB).
const PIECE: usize = 512 * 1024;

/// Elsewhere: no registers, and the address of a local as the stack pointer.
#[cfg(not(target_arch = "x86_64"))]
fn registers() -> [u64; 7] {
    let here = 0u64;
    [0, 0, 0, 0, 0, 0, std::hint::black_box(&here) as *const u64 as u64]
}

/// Callee-saved registers and the stack pointer of the calling thread.
#[cfg(target_arch = "x86_64")]
fn registers() -> [u64; 7] {
    let (rbx, rbp, r12, r13, r14, r15, rsp): (u64, u64, u64, u64, u64, u64, u64);
    // SAFETY: copies registers; no memory access.
    unsafe {
        std::arch::asm!("mov {0}, rbx", "mov {1}, rbp", "mov {2}, r12", "mov {3}, r13", "mov {4}, r14",
            "mov {5}, r15", "mov {6}, rsp",
            out(reg) rbx, out(reg) rbp, out(reg) r12, out(reg) r13, out(reg) r14, out(reg) r15, out(reg) rsp,
            options(nomem, nostack, preserves_flags));
    }
    [rbx, rbp, r12, r13, r14, r15, rsp]
}

/// Reads `len` bytes at `addr` of this process, or `None` where unreadable.
fn read(addr: u64, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
    // SAFETY: both iovecs describe valid ranges; the kernel checks `remote`.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == len as isize).then_some(buf)
}

/// The readable, writable mappings: (start, end, name).
fn writable_mappings() -> Vec<(u64, u64, String)> {
    let Some(maps) = sys::read_file(c"/proc/self/maps") else { return Vec::new() };
    String::from_utf8_lossy(&maps)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (range, perms) = (f.next()?, f.next()?);
            let name = f.nth(3).unwrap_or("").to_owned();
            let (lo, hi) = range.split_once('-')?;
            let (lo, hi) = (u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?);
            perms.starts_with("rw").then_some((lo, hi, name))
        })
        .collect()
}

/// Writes the snapshot and a ScanEnd into the trace.
pub fn take(s: &Session) {
    let regs = registers();
    let sp = regs[6];
    let own = crate::modules::range_of(take as fn(&Session) as usize).map(|(a, b)| (a as u64, b as u64));
    let now = s.now();
    let mut out = Vec::new();
    let mut enc = Encoder::new();
    enc.encode(&mut out, &Record::Thread { tid: sys::gettid(), time_ns: now });
    let words: Vec<u8> = regs.iter().flat_map(|w| w.to_le_bytes()).collect();
    enc.encode(&mut out, &Record::ScanRegion { time_ns: now, kind: region_kind::REGISTERS, addr: 0, bytes: words });
    for (lo, hi, name) in writable_mappings() {
        if name == "[vvar]" || name == "[vdso]" || name == "[vsyscall]" {
            continue;
        }
        if own.is_some_and(|(a, b)| lo < b && hi > a) {
            continue;
        }
        // The exiting thread's stack: only from the stack pointer up.
        let (lo, kind) = if sp >= lo && sp < hi { (sp & !7, region_kind::STACK) } else { (lo, region_kind::MAPPING) };
        let mut at = lo;
        while at < hi {
            let len = ((hi - at) as usize).min(PIECE);
            if let Some(bytes) = read(at, len) {
                enc.encode(&mut out, &Record::ScanRegion { time_ns: now, kind, addr: at, bytes });
            }
            at += len as u64;
            if out.len() >= 8 << 20 {
                s.write_records_compressed(&out);
                out.clear();
                enc = Encoder::new();
                enc.encode(&mut out, &Record::Thread { tid: sys::gettid(), time_ns: now });
            }
        }
    }
    enc.encode(&mut out, &Record::ScanEnd { time_ns: now });
    s.write_records_compressed(&out);
}
