//! Thin wrappers over the system calls the recorder makes, so that the rest
//! of the preload needs no `unsafe` for them.

use std::ffi::CStr;

/// CLOCK_MONOTONIC, ns.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME, ns since the Unix epoch.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The calling thread's kernel thread id.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Whether thread `tid` of process `pid` still exists (`tgkill` with
/// signal 0: only ESRCH says it is gone; a thread id the kernel gave a new
/// thread since looks alive, and is asked again later).
pub fn thread_alive(pid: u32, tid: u32) -> bool {
    // SAFETY: signal 0 sends nothing; it only checks that the thread exists.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, pid as i64, tid as i64, 0i64) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

pub fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

pub fn getppid() -> u32 {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() as u32 }
}

/// Writes all of `buf` to `fd`, retrying on EINTR and short writes.
/// Returns false on any other error (the trace is then incomplete).
pub fn write_all(fd: i32, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        // SAFETY: buf is a valid readable slice.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        buf = &buf[n as usize..];
    }
    true
}

pub fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

pub fn set_errno(v: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = v }
}

/// `getenv` straight from libc: Rust's `std::env` takes a lock that the
/// traced program (if it is a Rust program) may hold while it allocates.
pub fn getenv(name: &CStr) -> Option<String> {
    // SAFETY: name is NUL-terminated; the result is null or a C string that
    // we copy at once.
    unsafe {
        let p = libc::getenv(name.as_ptr());
        (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
    }
}

/// Prints one line to the program's stderr, prefixed with `mtrace: `.
pub fn warn(msg: &str) {
    let mut line = Vec::with_capacity(msg.len() + 10);
    line.extend_from_slice(b"mtrace: ");
    line.extend_from_slice(msg.as_bytes());
    line.push(b'\n');
    write_all(2, &line);
}

/// [`warn`], but once per `mtrace run` (or any run that sets
/// `MTRACE_WARN_DIR`): the same message from every process the program
/// starts (`make -j2` started 31) is printed by the first only. Which one
/// was first is settled by creating `DIR/warned-HASH` exclusively.
pub fn warn_once_per_run(msg: &str) {
    if let Some(dir) = getenv(mtrace_format::settings::WARN_DIR.var) {
        // FNV-1a of the message names its file.
        let h = msg.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        if let Ok(path) = std::ffi::CString::new(format!("{dir}/warned-{h:016x}")) {
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
            // SAFETY: a NUL-terminated path; the descriptor is closed at once.
            let fd = unsafe { libc::open(path.as_ptr(), flags, 0o600) };
            if fd < 0 {
                return;
            }
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
        }
    }
    warn(msg);
}

/// The names of the entries of folder `path` that are numbers (the thread
/// ids under /proc/self/task), read with getdents64 rather than opendir:
/// glibc's opendir allocates with its malloc, which a leak scan at exit
/// must not call (a heap the program damaged, by a double free glibc did
/// not notice, made that malloc abort a program that exits normally).
pub fn numbered_entries(path: &CStr) -> Vec<i32> {
    // SAFETY: path is NUL-terminated; fd is checked and closed.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: buf is a valid writable buffer of its length.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
        if n <= 0 {
            break;
        }
        // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
        let mut at = 0;
        while at + 19 <= n as usize {
            let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
            if reclen < 19 || at + reclen > n as usize {
                break;
            }
            let name = &buf[at + 19..at + reclen];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(id) = std::str::from_utf8(name).ok().and_then(|s| s.parse().ok()) {
                out.push(id);
            }
            at += reclen;
        }
    }
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    out
}

/// Reads a whole small file such as `/proc/self/cmdline`.
pub fn read_file(path: &CStr) -> Option<Vec<u8>> {
    // SAFETY: path is NUL-terminated; fd is checked and closed.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        // SAFETY: chunk is a valid writable buffer.
        let n = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n as usize]);
    }
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    Some(out)
}

/// `readlink` of a /proc path into a String.
pub fn readlink(path: &CStr) -> Option<String> {
    let mut buf = [0u8; 4096];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::readlink(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n > 0).then(|| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
}

/// `membarrier(2)` commands (linux/membarrier.h).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: i64 = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: i64 = 1 << 4;

/// Registers the process for [`membarrier`]; false where the kernel (or a
/// seccomp filter) refuses.
pub fn membarrier_register() -> bool {
    // SAFETY: membarrier takes no pointers; an unknown command fails.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0 }
}

/// A full memory barrier on every CPU that runs a thread of this process
/// (after [`membarrier_register`]); false if it failed.
pub fn membarrier() -> bool {
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0 }
}

/// Sleeps for `ms` milliseconds (the writer thread's poll interval).
pub fn sleep_ms(ms: u64) {
    sleep_us(ms * 1000);
}

/// Sleeps for `us` microseconds (less than a second). By `ppoll` on no
/// descriptors, not `nanosleep`: nanosleep writes the thread's restart
/// block on entry (kernel/time/hrtimer.c), which the system call the
/// program waits in (a poll or a sleep a ptrace stop interrupted) is
/// restarted from. The tracer's code that a round made in an idle
/// process runs (docs/PROCESSES.md) then leaves that wait to go on for
/// its own time; ppoll keeps its time left in its own argument.
pub fn sleep_us(us: u64) {
    let ts = libc::timespec { tv_sec: 0, tv_nsec: (us * 1000) as i64 };
    // SAFETY: ts is valid; no descriptors and no signal mask are given;
    // an early wake-up is harmless.
    unsafe { libc::ppoll(std::ptr::null_mut(), 0, &ts, std::ptr::null()) };
}

/// Waits while `word` holds `value` (a futex wait without a timeout; it
/// may return early: the caller checks again).
pub fn futex_wait_forever(word: &std::sync::atomic::AtomicU32, value: u32) {
    // SAFETY: a futex wait on a live atomic word, no timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            value,
            0usize,
            0usize,
            0usize,
        )
    };
}

/// Runs `f` with every signal blocked in the calling thread but glibc's
/// SIGCANCEL and SIGSETXID (which glibc never blocks for the program: a
/// `setuid` waits for every thread to take SIGSETXID), then puts the
/// thread's mask back exactly as it was. By the `rt_sigprocmask` system
/// call: glibc's `pthread_sigmask` leaves those two out of what it sets,
/// so a thread that had SIGCANCEL blocked came back with it unblocked.
/// glibc's SIGEV_THREAD timer helper blocks it (it is also SIGTIMER) and
/// waits for it with `sigwaitinfo`; unblocked there, the next expiry killed
/// the process (ctests/unseen_thread.c, glibc 2.36).
pub fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // Signal n is bit n - 1; SIGCANCEL is the kernel's first real-time
    // signal (32), SIGSETXID the next (glibc's nptl/pthreadP.h).
    const KEEP: u64 = (1 << 31) | (1 << 32);
    let block: u64 = !KEEP;
    let mut old: u64 = 0;
    // SAFETY: rt_sigprocmask with valid pointers to 8-byte kernel sigsets.
    let saved = unsafe {
        libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_BLOCK, &block as *const u64, &mut old as *mut u64, 8usize)
    } == 0;
    let r = f();
    if saved {
        let errno = errno();
        // SAFETY: as above; the mask saved before `f`.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &old as *const u64,
                std::ptr::null_mut::<u64>(),
                8usize,
            )
        };
        set_errno(errno);
    }
    r
}

/// Starts `f` on a new pthread with every signal blocked (but glibc's own:
/// [`with_signals_blocked`]), so that the program's signals keep going to
/// its own threads. Uses pthread_create directly: std's thread start would
/// make calls (sigaltstack setup) before the thread could mark itself as
/// the tracer's.
pub fn spawn_blocked(f: extern "C" fn(*mut libc::c_void) -> *mut libc::c_void) -> bool {
    with_signals_blocked(|| {
        let mut t: libc::pthread_t = 0;
        let rc = super::real::pthread_create(&mut t, f, std::ptr::null_mut());
        if rc == 0 {
            // SAFETY: `t` is the thread just made, never joined.
            unsafe { libc::pthread_detach(t) };
        }
        rc == 0
    })
}

/// The calling thread's stack: [low, high) addresses.
pub fn own_stack() -> Option<(u64, u64)> {
    // SAFETY: pthread_getattr_np fills `attr`, destroyed after use; the
    // out-pointers are valid.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr = std::ptr::null_mut();
        let mut size = 0usize;
        let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (rc == 0).then(|| (addr as u64, addr as u64 + size as u64))
    }
}

/// A private anonymous read-write mapping of `len` bytes, made with the
/// system call (not through the mmap hook), or `None`.
pub fn map_anon(len: usize) -> Option<*mut u8> {
    // SAFETY: a fresh anonymous mapping; no existing memory is touched.
    let p = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            0usize,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1i64,
            0usize,
        )
    };
    (p > 0).then_some(p as *mut u8)
}

/// Unmaps what [`map_anon`] mapped.
///
/// # Safety
/// `p`/`len` are a mapping from `map_anon` that nothing uses any more.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: per the contract.
    unsafe { libc::syscall(libc::SYS_munmap, p, len) };
}

/// `/proc/self/statm`, open for the RSS samples at a high descriptor, and
/// its device and inode. Opened once, when the session starts: opening it
/// for every sample took the lowest free descriptor for a moment, and a
/// program thread's `dup2` onto that number then failed with EBUSY (seen:
/// a shell's `exec 3>file`, 1 run in about 100) or closed our file.
static STATM: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static STATM_ID: [std::sync::atomic::AtomicU64; 2] =
    [std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0)];

/// The size in bytes of the file open at `fd`, if it is open.
pub fn file_size(fd: i32) -> Option<usize> {
    // SAFETY: st is a valid out-pointer; fstat on any number is safe.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer; fstat on any number is safe.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_size as usize)
}

/// Device and inode of what `fd` refers to, if it is open.
pub fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: st is a valid out-pointer; fstat on any number is safe.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer; fstat on any number is safe.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Lowest descriptor number for the tracer's own (below the usual 1024
/// limit): out of the low numbers a program opens, `dup2`s onto and reuses.
const HIGH_FD: i32 = 900;

/// A copy of `fd` (close-on-exec) at a high number that is not `avoid`,
/// the original closed unless it is `avoid`; `None` when no number is free.
pub fn move_high(fd: i32, avoid: i32) -> Option<i32> {
    // SAFETY: rl is a valid out-pointer.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: rl is a valid out-pointer.
    let limit = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } {
        0 => rl.rlim_cur.min(1 << 20) as i32,
        _ => 1024,
    };
    // Below the limit, in its top quarter when the limit is low.
    let base = if limit > HIGH_FD + 64 { HIGH_FD } else { (limit * 3 / 4).max(3) };
    for from in [base, 3] {
        // SAFETY: fcntl on a descriptor we own; `avoid` is open (it is
        // ours or the program's), so F_DUPFD never returns it.
        let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, from) };
        if new >= 0 && new != avoid {
            if fd != avoid {
                // SAFETY: the old number is ours and now duplicated.
                unsafe { libc::close(fd) };
            }
            return Some(new);
        }
    }
    None
}

/// Opens `/proc/self/statm` for [`rss_bytes`] (see [`STATM`]).
pub fn open_statm() {
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c"/proc/self/statm".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return;
    }
    let fd = move_high(fd, -1).unwrap_or(fd);
    if let Some((dev, ino)) = identity(fd) {
        STATM_ID[0].store(dev, std::sync::atomic::Ordering::Relaxed);
        STATM_ID[1].store(ino, std::sync::atomic::Ordering::Relaxed);
        STATM.store(fd, std::sync::atomic::Ordering::Release);
    }
}

/// Closes what [`open_statm`] opened (a detach: the process keeps no
/// descriptor of the tracer's). A later session opens it again.
pub fn close_statm() {
    let fd = STATM.swap(-1, std::sync::atomic::Ordering::AcqRel);
    let id = (
        STATM_ID[0].load(std::sync::atomic::Ordering::Relaxed),
        STATM_ID[1].load(std::sync::atomic::Ordering::Relaxed),
    );
    if fd >= 0 && identity(fd) == Some(id) {
        // SAFETY: our own descriptor (its identity checked), closed once.
        unsafe { libc::close(fd) };
    }
}

/// Resident set size in bytes: the second field of /proc/self/statm, in
/// pages; `None` (for good) once the program closed or replaced the file.
pub fn rss_bytes() -> Option<u64> {
    use std::sync::atomic::Ordering::{Acquire, Relaxed};
    let fd = STATM.load(Acquire);
    let id = (STATM_ID[0].load(Relaxed), STATM_ID[1].load(Relaxed));
    if fd < 0 || identity(fd) != Some(id) {
        STATM.store(-1, Relaxed);
        return None;
    }
    let mut buf = [0u8; 128];
    // SAFETY: buf is a valid writable buffer; pread re-reads a proc file
    // from its start, with fresh values.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    let text = std::str::from_utf8(buf.get(..usize::try_from(n).ok()?)?).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * page.max(1) as u64)
}

/// Removes every `LD_PRELOAD` entry whose file name is `lib`, so that the
/// programs this process execs are not traced (`MTRACE_FOLLOW_EXEC=off`).
/// The program sees the shortened variable.
pub fn drop_from_preload(lib: &str) {
    let Some(v) = getenv(c"LD_PRELOAD") else { return };
    let kept: Vec<&str> = v
        .split([':', ' '])
        .filter(|e| !e.is_empty() && std::path::Path::new(e).file_name().is_none_or(|n| n != lib))
        .collect();
    // SAFETY: NUL-terminated strings; runs in the library constructor.
    unsafe {
        if kept.is_empty() {
            libc::unsetenv(c"LD_PRELOAD".as_ptr());
        } else if let Ok(c) = std::ffi::CString::new(kept.join(":")) {
            libc::setenv(c"LD_PRELOAD".as_ptr(), c.as_ptr(), 1);
        }
    }
}
