//! The task that holds the program's threads for a leak scan from outside
//! them (docs/SCAN.md, "Stopping the threads"). LeakSanitizer's
//! StopTheWorld works the same way on Linux: a task made by `clone` that
//! shares the process's memory (`CLONE_VM`) but is not in its thread group
//! (ptrace refuses a tracer inside it) seizes every thread
//! (`PTRACE_SEIZE`), stops it (`PTRACE_INTERRUPT`), reads its registers
//! (`PTRACE_GETREGSET`) and lets it go (`PTRACE_DETACH`) once the scan is
//! written. A thread stopped so runs no code of ours, and the system call
//! it waits in goes on when it is let go: the kernel restarts most, and
//! one that the stop made fail with EINTR (epoll_wait, sigtimedwait …) is
//! set to be made again (`mtrace_format::interrupted`).
//!
//! The task has no thread-local storage of its own (`%fs` still points at
//! the thread that made it): it calls no libc function, which could set
//! that thread's `errno` or take a lock a held thread owns, allocates
//! nothing and must not panic (no indexing that can fail, no arithmetic
//! that can overflow: the library's debug build checks both). Raw system
//! calls, the fixed [`TABLE`] in this library's bss, and the stack the
//! starting thread mapped for it. ptrace.rs is the other side.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use super::REGS;

/// Threads one stop can hold; the rest are counted as not stopped.
pub const MAX: usize = 4096;

/// [`Entry::state`]: what became of a thread.
pub mod state {
    /// Seized and asked to stop; not stopped yet.
    pub const SEIZED: u8 = 1;
    /// Stopped: its registers are in the entry.
    pub const HELD: u8 = 2;
    /// Ended (or a zombie) before it could be held.
    pub const GONE: u8 = 3;
    /// ptrace refused it (its errno in [`super::REFUSED_ERRNO`]).
    pub const REFUSED: u8 = 4;
    /// Seized, but it did not stop within [`super::STOP_WAIT_NS`] (an
    /// uninterruptible sleep, a vfork's parent).
    pub const LATE: u8 = 5;
}

/// [`PHASE`]: the stop's progress, a futex word both sides wait on.
pub mod phase {
    /// The helper waits for the go (the starting thread may first name it
    /// the process's ptracer for Yama).
    pub const READY: u32 = 1;
    pub const GO: u32 = 2;
    /// The threads are held (the helper waits for [`RELEASE`]).
    pub const HELD: u32 = 3;
    pub const RELEASE: u32 = 4;
    /// The helper let every thread go, or held none.
    pub const DONE: u32 = 5;
    /// ptrace was refused for every thread: nothing is held.
    pub const REFUSED: u32 = 6;
}

/// How long the helper waits for seized threads to stop, ns.
pub const STOP_WAIT_NS: u64 = 1_000_000_000;
/// The longest the helper holds threads, ns: should the thread that
/// started it never release them, the program goes on.
const HOLD_MAX_NS: u64 = 600_000_000_000;

/// One thread of a stop.
pub struct Entry {
    pub tid: AtomicI32,
    pub state: AtomicU8,
    /// A signal that arrived while the thread was being stopped: delivered
    /// at the detach.
    sig: AtomicI32,
    /// Its registers in the order of a signal's ucontext (x86-64: R8 …
    /// R15, RDI, RSI, RBP, RBX, RDX, RAX, RCX, RSP, RIP), where HELD.
    pub regs: [AtomicU64; REGS],
}

impl Entry {
    const fn new() -> Entry {
        Entry {
            tid: AtomicI32::new(0),
            state: AtomicU8::new(0),
            sig: AtomicI32::new(0),
            regs: [const { AtomicU64::new(0) }; REGS],
        }
    }
}

/// The threads of the current stop, [`COUNT`] of them. Static: the helper
/// needs no allocation, and it lies in this library's bss, which the
/// snapshot leaves out (registers hold pointers to the program's blocks).
pub static TABLE: [Entry; MAX] = [const { Entry::new() }; MAX];
pub static COUNT: AtomicUsize = AtomicUsize::new(0);
/// The process had more threads than [`MAX`].
pub static FULL: AtomicBool = AtomicBool::new(false);
pub static PHASE: AtomicU32 = AtomicU32::new(0);
/// The process whose threads to hold, and the two threads to leave alone
/// (the one taking the snapshot and the writer).
pub static PID: AtomicI32 = AtomicI32::new(0);
pub static SKIP: [AtomicI32; 2] = [AtomicI32::new(0), AtomicI32::new(0)];
/// The error of the last seize ptrace refused.
pub static REFUSED_ERRNO: AtomicI32 = AtomicI32::new(0);

const PTRACE_SEIZE: usize = 0x4206;
const PTRACE_INTERRUPT: usize = 0x4207;
const PTRACE_GETREGSET: usize = 0x4204;
const PTRACE_SETREGSET: usize = 0x4205;
const PTRACE_DETACH: usize = 17;
const PTRACE_EVENT_STOP: i32 = 128;
const NT_PRSTATUS: usize = 1;
const WALL: usize = 0x4000_0000;
const WNOHANG: usize = 1;
const FUTEX_WAIT_PRIVATE: usize = 128;
const FUTEX_WAKE_PRIVATE: usize = 129;
const NO_SUCH_THREAD: isize = -3;

/// A system call's result as the kernel gives it (-errno on failure).
///
/// # Safety
/// As the call `nr` requires of `a` (pointers to live memory of the
/// right size where it takes them).
#[cfg(target_arch = "x86_64")]
unsafe fn sys(nr: i64, a: [usize; 6]) -> isize {
    let ret: isize;
    // SAFETY: the `syscall` instruction, with the kernel's argument
    // registers; it clobbers rcx and r11 only. The caller vouches for the
    // arguments.
    unsafe {
        std::arch::asm!("syscall",
            inlateout("rax") nr as isize => ret,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2], in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack));
    }
    ret
}

/// Elsewhere the helper is never started (ptrace.rs); this keeps the
/// module compiling.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn sys(_: i64, _: [usize; 6]) -> isize {
    -38
}

fn monotonic_ns() -> u64 {
    let mut ts = [0i64; 2];
    // SAFETY: clock_gettime writes a struct timespec (two i64) into `ts`.
    unsafe { sys(libc::SYS_clock_gettime, [libc::CLOCK_MONOTONIC as usize, ts.as_mut_ptr() as usize, 0, 0, 0, 0]) };
    (ts[0] as u64).wrapping_mul(1_000_000_000).wrapping_add(ts[1] as u64)
}

fn sleep_us(us: i64) {
    let ts = [0i64, us.wrapping_mul(1000)];
    // SAFETY: nanosleep reads a struct timespec from `ts`.
    unsafe { sys(libc::SYS_nanosleep, [ts.as_ptr() as usize, 0, 0, 0, 0, 0]) };
}

/// Waits while [`PHASE`] is `v`, at most `ms` milliseconds.
pub fn futex_wait(v: u32, ms: i64) {
    let ts = [ms / 1000, (ms % 1000).wrapping_mul(1_000_000)];
    // SAFETY: a futex wait on a static word, with a timespec on the stack.
    unsafe {
        sys(libc::SYS_futex, [PHASE.as_ptr() as usize, FUTEX_WAIT_PRIVATE, v as usize, ts.as_ptr() as usize, 0, 0])
    };
}

/// Sets [`PHASE`] and wakes whoever waits on it.
pub fn set_phase(v: u32) {
    PHASE.store(v, Ordering::Release);
    // SAFETY: a futex wake on a static word.
    unsafe { sys(libc::SYS_futex, [PHASE.as_ptr() as usize, FUTEX_WAKE_PRIVATE, i32::MAX as usize, 0, 0, 0]) };
}

/// The helper task: `clone`'s function (ptrace.rs starts it).
pub extern "C" fn run(_: *mut libc::c_void) -> libc::c_int {
    // Dies with the thread that started it (it would otherwise hold the
    // process's memory, and perhaps its threads, for ever).
    // SAFETY: prctl with numbers only; getppid takes nothing.
    let parent = unsafe {
        sys(libc::SYS_prctl, [libc::PR_SET_PDEATHSIG as usize, libc::SIGKILL as usize, 0, 0, 0, 0]);
        sys(libc::SYS_getppid, [0; 6])
    };
    let pid = PID.load(Ordering::Acquire);
    if parent != pid as isize {
        set_phase(phase::DONE);
        return 1;
    }
    while PHASE.load(Ordering::Acquire) == phase::READY {
        futex_wait(phase::READY, 100);
    }
    if PHASE.load(Ordering::Acquire) != phase::GO {
        return 1;
    }
    let n = seize_all(pid);
    settle(n);
    let held = entries(n).filter(|e| e.state.load(Ordering::Relaxed) == state::HELD).count();
    let refused = entries(n).filter(|e| e.state.load(Ordering::Relaxed) == state::REFUSED).count();
    if held == 0 && refused > 0 {
        // Threads still seized (none here) would be let go by our exit.
        set_phase(phase::REFUSED);
        return 0;
    }
    set_phase(phase::HELD);
    let since = monotonic_ns();
    while PHASE.load(Ordering::Acquire) == phase::HELD && monotonic_ns().wrapping_sub(since) < HOLD_MAX_NS {
        futex_wait(phase::HELD, 1000);
    }
    for e in entries(n).filter(|e| e.state.load(Ordering::Relaxed) == state::HELD) {
        let (tid, sig) = (e.tid.load(Ordering::Relaxed), e.sig.load(Ordering::Relaxed));
        // SAFETY: ptrace on a thread this task holds. A LATE thread is
        // let go by the kernel when this task exits.
        unsafe { sys(libc::SYS_ptrace, [PTRACE_DETACH, tid as usize, 0, sig as usize, 0, 0]) };
    }
    set_phase(phase::DONE);
    0
}

/// The first `n` entries of the table.
fn entries(n: usize) -> impl Iterator<Item = &'static Entry> {
    TABLE.iter().take(n)
}

/// Seizes every thread of `pid` but the two to skip, listing its threads
/// again until a listing finds none new (a thread not yet held may have
/// started one); the number of entries.
fn seize_all(pid: i32) -> usize {
    let skip = [SKIP[0].load(Ordering::Relaxed), SKIP[1].load(Ordering::Relaxed)];
    let mut n = 0usize;
    for _ in 0..30 {
        let before = n;
        let listed = each_thread(pid, |tid| {
            if skip.contains(&tid) || entries(n).any(|e| e.tid.load(Ordering::Relaxed) == tid) {
                return;
            }
            let Some(e) = TABLE.get(n) else {
                FULL.store(true, Ordering::Relaxed);
                return;
            };
            let state = match ptrace(PTRACE_SEIZE, tid) {
                0 => {
                    ptrace(PTRACE_INTERRUPT, tid);
                    state::SEIZED
                }
                NO_SUCH_THREAD => return,
                _ if zombie(pid, tid) => return,
                err => {
                    REFUSED_ERRNO.store(err.wrapping_neg() as i32, Ordering::Relaxed);
                    state::REFUSED
                }
            };
            e.tid.store(tid, Ordering::Relaxed);
            e.sig.store(0, Ordering::Relaxed);
            e.state.store(state, Ordering::Relaxed);
            n = n.wrapping_add(1);
            COUNT.store(n, Ordering::Release);
        });
        if !listed || n == before {
            break;
        }
    }
    n
}

fn ptrace(request: usize, tid: i32) -> isize {
    // SAFETY: a ptrace request that takes no pointer.
    unsafe { sys(libc::SYS_ptrace, [request, tid as usize, 0, 0, 0, 0]) }
}

/// Waits (at most [`STOP_WAIT_NS`]) for the seized threads to stop, and
/// reads the registers of each that did.
fn settle(n: usize) {
    let start = monotonic_ns();
    loop {
        let mut waiting = false;
        for e in entries(n).filter(|e| e.state.load(Ordering::Relaxed) == state::SEIZED) {
            let tid = e.tid.load(Ordering::Relaxed);
            let mut status = 0i32;
            // SAFETY: wait4 writes the status into `status`.
            let r = unsafe {
                sys(libc::SYS_wait4, [tid as usize, &mut status as *mut i32 as usize, WALL | WNOHANG, 0, 0, 0])
            };
            if r == 0 {
                waiting = true;
                continue;
            }
            let stopped = r == tid as isize && status & 0xff == 0x7f;
            // The interrupt's own stop (SIGTRAP), not a signal's or a group
            // stop's.
            let ours = (status >> 16) & 0xff == PTRACE_EVENT_STOP && (status >> 8) & 0xff == libc::SIGTRAP;
            if stopped && (status >> 16) & 0xff != PTRACE_EVENT_STOP {
                // Stopped to take a signal: it takes it when let go.
                e.sig.store((status >> 8) & 0xff, Ordering::Relaxed);
            }
            let held = stopped && registers(tid, e, ours);
            e.state.store(if held { state::HELD } else { state::GONE }, Ordering::Relaxed);
        }
        if !waiting {
            return;
        }
        if monotonic_ns().wrapping_sub(start) > STOP_WAIT_NS {
            for e in entries(n).filter(|e| e.state.load(Ordering::Relaxed) == state::SEIZED) {
                e.state.store(state::LATE, Ordering::Relaxed);
            }
            return;
        }
        sleep_us(50);
    }
}

/// Reads stopped thread `tid`'s registers into `e`; false if it cannot.
/// At the interrupt's own stop (`ours`), a system call the stop made fail
/// with EINTR is set to be made again when the thread goes on
/// (`mtrace_format::interrupted`: a program in epoll_wait saw EINTR at
/// every scan).
fn registers(tid: i32, e: &Entry, ours: bool) -> bool {
    // x86-64's struct user_regs_struct: r15 r14 r13 r12 rbp rbx r11 r10 r9
    // r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base
    // ds es fs gs.
    let mut r = [0u64; 27];
    let mut iov = [r.as_mut_ptr() as usize, std::mem::size_of_val(&r)];
    // SAFETY: PTRACE_GETREGSET writes at most iov[1] bytes at iov[0], and
    // updates iov[1].
    let rc = unsafe {
        sys(libc::SYS_ptrace, [PTRACE_GETREGSET, tid as usize, NT_PRSTATUS, iov.as_mut_ptr() as usize, 0, 0])
    };
    if rc != 0 {
        return false;
    }
    // rax is r[10], orig_rax r[15].
    let again = if ours { mtrace_format::interrupted::after_stop(r[15] as i64, r[10] as i64) } else { None };
    if let Some(rax) = again {
        r[10] = rax as u64;
        // SAFETY: PTRACE_SETREGSET reads iov[1] bytes at iov[0]: the
        // registers just read, with rax changed.
        unsafe {
            sys(libc::SYS_ptrace, [PTRACE_SETREGSET, tid as usize, NT_PRSTATUS, iov.as_mut_ptr() as usize, 0, 0])
        };
    }
    // To a ucontext's order: R8 … R15, RDI, RSI, RBP, RBX, RDX, RAX, RCX,
    // RSP, RIP.
    const FROM: [usize; REGS] = [9, 8, 7, 6, 3, 2, 1, 0, 14, 13, 4, 5, 12, 10, 11, 19, 16];
    for (slot, &i) in e.regs.iter().zip(FROM.iter()) {
        slot.store(r.get(i).copied().unwrap_or(0), Ordering::Relaxed);
    }
    true
}

/// Whether thread `tid` of `pid` has ended (its /proc state Z or X): a
/// main thread that called pthread_exit stays listed while others run.
fn zombie(pid: i32, tid: i32) -> bool {
    let mut path = Path::new();
    path.push(b"/proc/");
    path.number(pid);
    path.push(b"/task/");
    path.number(tid);
    path.push(b"/stat\0");
    let mut buf = [0u8; 512];
    let n = read_file(&path, &mut buf);
    // "tid (comm) S …": the state follows the last ')'.
    let text = buf.get(..n).unwrap_or(&[]);
    let Some(close) = text.iter().rposition(|&b| b == b')') else { return false };
    matches!(text.get(close.wrapping_add(2)), Some(&(b'Z' | b'X')))
}

/// A path built without allocating (NUL-terminated by the caller).
struct Path {
    bytes: [u8; 64],
    len: usize,
}

impl Path {
    fn new() -> Path {
        Path { bytes: [0; 64], len: 0 }
    }

    fn push(&mut self, s: &[u8]) {
        for &b in s {
            if let Some(slot) = self.bytes.get_mut(self.len) {
                *slot = b;
                self.len = self.len.wrapping_add(1);
            }
        }
    }

    fn number(&mut self, v: i32) {
        let mut digits = [0u8; 12];
        let mut v = v.unsigned_abs();
        let mut i = digits.len();
        loop {
            i = i.wrapping_sub(1);
            if let Some(d) = digits.get_mut(i) {
                *d = b'0'.wrapping_add((v % 10) as u8);
            }
            v /= 10;
            if v == 0 || i == 0 {
                break;
            }
        }
        self.push(digits.get(i..).unwrap_or(&[]));
    }

    fn ptr(&self) -> usize {
        self.bytes.as_ptr() as usize
    }
}

fn open(path: &Path, flags: i32) -> isize {
    // SAFETY: openat with a NUL-terminated path in `path`.
    unsafe { sys(libc::SYS_openat, [libc::AT_FDCWD as usize, path.ptr(), flags as usize, 0, 0, 0]) }
}

fn close(fd: isize) {
    // SAFETY: closes a descriptor this task opened.
    unsafe { sys(libc::SYS_close, [fd as usize, 0, 0, 0, 0, 0]) };
}

/// Reads up to `buf.len()` bytes of the file at `path`; how many.
fn read_file(path: &Path, buf: &mut [u8]) -> usize {
    let fd = open(path, libc::O_RDONLY | libc::O_CLOEXEC);
    if fd < 0 {
        return 0;
    }
    // SAFETY: read writes at most buf.len() bytes into `buf`.
    let n = unsafe { sys(libc::SYS_read, [fd as usize, buf.as_mut_ptr() as usize, buf.len(), 0, 0, 0]) };
    close(fd);
    n.max(0) as usize
}

/// Calls `f` with each thread id of `pid` (its /proc task folder); false
/// if the folder could not be read.
fn each_thread(pid: i32, mut f: impl FnMut(i32)) -> bool {
    let mut path = Path::new();
    path.push(b"/proc/");
    path.number(pid);
    path.push(b"/task\0");
    let fd = open(&path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC);
    if fd < 0 {
        return false;
    }
    // 8-aligned, as struct linux_dirent64 is.
    let mut buf = [0u64; 1024];
    loop {
        // SAFETY: getdents64 writes at most the buffer's size into it.
        let got = unsafe {
            sys(libc::SYS_getdents64, [fd as usize, buf.as_mut_ptr() as usize, std::mem::size_of_val(&buf), 0, 0, 0])
        };
        if got <= 0 {
            break;
        }
        // SAFETY: the bytes of `buf`, of which getdents64 filled `got`.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), got as usize) };
        let mut at = 0usize;
        // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2),
        // d_type (1), d_name (NUL-terminated).
        while let Some(rec) = bytes.get(at..) {
            let (Some(&lo), Some(&hi)) = (rec.get(16), rec.get(17)) else { break };
            let reclen = u16::from_le_bytes([lo, hi]) as usize;
            if reclen < 19 {
                break;
            }
            let name = rec.get(19..reclen.min(rec.len())).unwrap_or(&[]);
            if let Some(tid) = number(name) {
                f(tid);
            }
            at = at.wrapping_add(reclen);
        }
    }
    close(fd);
    true
}

/// The decimal number a NUL-terminated name spells, if it is one.
fn number(name: &[u8]) -> Option<i32> {
    let mut v: i32 = 0;
    let mut any = false;
    for &b in name.iter().take_while(|&&b| b != 0) {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((b - b'0') as i32)?;
        any = true;
    }
    any.then_some(v)
}
