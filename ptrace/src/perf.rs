//! Perf events that count kernel uprobes (defined in tracefs, `tracefs`)
//! in one thread, and the ring buffer the kernel writes their samples to:
//! the system calls and the shared mapping behind one small safe
//! interface. Layouts and rules: include/uapi/linux/perf_event.h and
//! perf_event_open(2).
//!
//! A uprobe is a breakpoint the kernel puts in the file's pages and
//! handles itself: the thread that hits it does not stop for the tracer;
//! the kernel copies its registers and the top of its stack into the ring
//! and lets it go on. A return probe (uretprobe) replaces the return
//! address with the kernel's trampoline (the `[uprobes]` page) and samples
//! the registers when the call returns there.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use perf_event_open_sys as sys;
use sys::bindings as b;

/// What one probe's event samples.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// The probe's tracepoint id (`tracefs`).
    pub id: u64,
    /// Bytes of the stack copied from the stack pointer up (a multiple of 8).
    pub stack: u32,
    /// The user registers sampled (perf's numbering; `arch::PERF_REGS`).
    pub regs: u64,
    /// The thread stops right after each sample, before it runs on: the
    /// kernel sends it a SIGTRAP with `si_code` [`TRAP_PERF`] (perf's
    /// `sigtrap`, Linux 5.13), which the tracer takes and does not
    /// deliver. For what the tracer must read of the thread's memory as
    /// the sample left it (posix_memalign's `*out`, uprobes.rs).
    pub stop: bool,
}

/// `si_code` of the SIGTRAP a [`Spec::stop`] event sends
/// (include/uapi/asm-generic/siginfo.h).
pub const TRAP_PERF: i32 = 6;

/// One open probe event.
pub struct Event {
    fd: OwnedFd,
    /// The kernel's id for it, the first word of each of its samples.
    pub id: u64,
}

/// Opens a probe's event counting in thread `tid` only (not inherited by
/// its threads or children: each gets its own). Errors as
/// perf_event_open(2): EACCES without the right to trace, EINVAL for a
/// probe the kernel cannot place.
pub fn open(tid: i32, s: &Spec) -> io::Result<Event> {
    // SAFETY: perf_event_attr is plain data; all-zero is its documented
    // "nothing asked" state.
    let mut a: b::perf_event_attr = unsafe { std::mem::zeroed() };
    a.type_ = b::PERF_TYPE_TRACEPOINT;
    a.size = std::mem::size_of::<b::perf_event_attr>() as u32;
    a.config = s.id;
    a.__bindgen_anon_1.sample_period = 1;
    a.sample_type =
        (b::PERF_SAMPLE_IDENTIFIER | b::PERF_SAMPLE_TIME | b::PERF_SAMPLE_REGS_USER | b::PERF_SAMPLE_STACK_USER) as u64;
    a.sample_regs_user = s.regs;
    a.sample_stack_user = s.stack;
    a.set_use_clockid(1);
    a.clockid = libc::CLOCK_MONOTONIC;
    // No wakeup per sample (the reader sleeps rather than polls; a wakeup
    // per sample made the program twice as slow in a first try): the
    // kernel wakes pollers only when an eighth of the ring is full.
    a.set_watermark(1);
    a.__bindgen_anon_2.wakeup_watermark = (ring_bytes(RING_PAGES) / 8) as u32;
    if s.stop {
        // The kernel takes a signalling event only if it goes at an exec.
        a.set_sigtrap(1);
        a.set_remove_on_exec(1);
    }
    // SAFETY: `a` is initialised.
    let fd = unsafe { sys::perf_event_open(&mut a, tid, -1, -1, b::PERF_FLAG_FD_CLOEXEC as libc::c_ulong) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if s.stop && e.raw_os_error() == Some(libc::EINVAL) {
            // A kernel before 5.13 has no `sigtrap`: the sample alone, as
            // before (what is read after it may have changed since).
            return open(tid, &Spec { stop: false, ..*s });
        }
        return Err(e);
    }
    // SAFETY: a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut id = 0u64;
    // SAFETY: `fd` is a perf event; ID writes one u64.
    if unsafe { sys::ioctls::ID(fd.as_raw_fd(), &mut id) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Event { fd, id })
}

/// Makes the calling thread a real-time one (SCHED_FIFO, the lowest
/// priority): it runs as soon as it wakes, before any normal thread of
/// the program; a nice value alone left a thread waiting up to a time
/// slice (3–4 ms measured here), long enough for a ring to overflow. For
/// the ring reader, which only copies. Needs CAP_SYS_NICE, which uprobes'
/// root has; failure changes nothing.
pub fn raise_priority() {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler of the calling thread with a valid param.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
}

/// Closes `events` in a child process of their own, so that nobody waits.
/// The last close of a probe's events waits for the kernel's RCU grace
/// periods under a lock all perf trace events share (measured here: ~72
/// ms, one probe after another: some 3 s for libc's and libstdc++'s). The
/// child holds a copy of each descriptor, so this process's closes are
/// not the last and cost nothing; the child closes its copies once this
/// process has closed its own (a pipe's end says when), then exits; the
/// kernel removes the probes as it goes.
///
/// Then it writes `removal.1`'s lines to file `removal.0` (the
/// definitions, which no event counts any more).
pub fn close_detached(events: Vec<Event>, removal: (CString, Vec<Vec<u8>>)) {
    if events.is_empty() && removal.1.is_empty() {
        return;
    }
    let fds: Vec<i32> = events.iter().map(|e| e.fd.as_raw_fd()).collect();
    let mut pipe = [0i32; 2];
    // SAFETY: pipe fills the two-int array on success.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return drop(events);
    }
    // SAFETY: the child only calls sigfillset, pthread_sigmask, read,
    // close, open, write and _exit (async-signal-safe) on memory allocated
    // before the fork; it allocates nothing.
    match unsafe { libc::fork() } {
        0 => {
            // SAFETY: as above; `fds` and `pipe` are this copy's.
            unsafe {
                // No signal ends it while it closes: a probe whose last
                // event closes with a fatal signal pending keeps its
                // breakpoint instruction in the program (the kernel's
                // "leaking uprobe"), and a Ctrl-C reaches this child too.
                let mut all: libc::sigset_t = std::mem::zeroed();
                libc::sigfillset(&mut all);
                libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
                // Nothing else stays open here: a pipe on the other end
                // of this process's output must see its end now.
                let top = fds.iter().copied().max().unwrap_or(0);
                for fd in 0..=top {
                    if fd != pipe[0] && !fds.contains(&fd) {
                        libc::close(fd);
                    }
                }
                libc::syscall(libc::SYS_close_range, top as u32 + 1, u32::MAX, 0u32);
                let mut b = 0u8;
                while libc::read(pipe[0], &mut b as *mut u8 as *mut libc::c_void, 1) > 0 {}
                for &fd in &fds {
                    libc::close(fd);
                }
                let f = libc::open(removal.0.as_ptr(), libc::O_WRONLY | libc::O_APPEND);
                if f >= 0 {
                    for l in &removal.1 {
                        libc::write(f, l.as_ptr() as *const libc::c_void, l.len());
                    }
                }
                libc::_exit(0)
            }
        }
        child => {
            drop(events);
            // SAFETY: this process's copies of the pipe, closed once.
            unsafe {
                libc::close(pipe[0]);
                libc::close(pipe[1]);
            }
            if child > 0 {
                // Reaped by a thread, which waits as long as the closes take.
                let _ = std::thread::Builder::new().name("mtrace-close".into()).spawn(move || {
                    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(child), None);
                });
            }
        }
    }
}

/// Data pages of a thread's ring: 8 MiB, room for some 500 samples with a
/// 16 KiB stack copy.
pub const RING_PAGES: usize = 2048;
/// Data pages of a process's main thread's ring: 64 MiB. cc1plus (one
/// thread) makes some 110,000 samples a second, 1.9 GB/s of stack copies:
/// 8 MiB held 4.4 ms of them, and the reader, sleeping between rounds on
/// an otherwise idle virtual CPU, was once woken 57 ms late (the host's
/// doing: `perf record -a` shows that CPU halted in the guest's idle loop
/// the whole time); 64 MiB holds 35 ms. A program's other threads keep
/// 8 MiB: the kernel allocates every page when the ring is mapped.
pub const MAIN_RING_PAGES: usize = 16384;
/// The bytes of a ring of `pages` data pages.
pub const fn ring_bytes(pages: usize) -> u64 {
    pages as u64 * 4096
}

/// A ring the kernel writes samples into (one per thread; the thread's
/// other events are redirected to it).
pub struct Ring {
    fd: OwnedFd,
    map: *mut u8,
    len: usize,
    data: usize,
    size: u64,
    /// A record that wraps around the end, made whole.
    scratch: Vec<u8>,
}

// SAFETY: the mapping belongs to the Ring alone; the kernel is the only
// other writer, through the head it publishes.
unsafe impl Send for Ring {}

/// Sends `e`'s samples to the ring of event `ring` (of the same thread).
pub fn redirect(e: &Event, ring: std::os::fd::BorrowedFd) -> io::Result<()> {
    // SAFETY: both are perf events of the same thread.
    if unsafe { sys::ioctls::SET_OUTPUT(e.fd.as_raw_fd(), ring.as_raw_fd()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Records copied out of a ring: their bodies one after another, and
/// (kind, start, length) of each — one allocation per round of copying,
/// not one per record (the reader's mallocs and the tracer's frees of them
/// contended for glibc's arena lock).
#[derive(Default)]
pub struct Batch {
    pub data: Vec<u8>,
    pub records: Vec<(u32, usize, usize)>,
}

impl Batch {
    /// Record `i`: (kind, body).
    pub fn get(&self, i: usize) -> Option<(u32, &[u8])> {
        let &(kind, start, len) = self.records.get(i)?;
        Some((kind, self.data.get(start..start + len)?))
    }
}

/// A record of the ring.
pub enum Rec<'a> {
    /// A probe hit: its event's id, CLOCK_MONOTONIC ns, the sampled
    /// registers (empty if none), the stack copy from the stack pointer up.
    Sample { id: u64, time: u64, regs: &'a [u8], stack: &'a [u8] },
    /// The kernel dropped this many samples: the ring was full.
    Lost(u64),
}

impl Ring {
    /// Maps `leader`'s ring of `pages` data pages (a power of two); the
    /// ring owns a duplicate of its descriptor.
    pub fn new(leader: &Event, pages: usize) -> io::Result<Ring> {
        let len = (pages + 1) * 4096;
        let fd = leader.fd.try_clone()?;
        // SAFETY: a fresh shared mapping of a perf event, of the size the
        // kernel requires (1 + 2^n pages); checked for failure.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Ring { fd, map: map as *mut u8, len, data: 4096, size: ring_bytes(pages), scratch: Vec::new() })
    }

    /// Sends `e`'s samples to this ring.
    pub fn redirect(&self, e: &Event) -> io::Result<()> {
        redirect(e, self.fd.as_fd())
    }

    /// The ring's descriptor, to poll.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn page(&self) -> *mut b::perf_event_mmap_page {
        self.map as *mut b::perf_event_mmap_page
    }

    /// Copies every record the kernel wrote so far (samples and losses;
    /// other kinds are skipped) to the end of `out`, their bodies one
    /// after another in `out.data`; gives the space back. The bytes copied.
    pub fn copy_out(&mut self, out: &mut Batch) -> usize {
        let page = self.page();
        // SAFETY: the control page is mapped for the Ring's life; the head
        // is read before the data below it (acquire: the kernel publishes
        // it with release order, so that data is complete).
        let head = unsafe { std::ptr::addr_of!((*page).data_head).read_volatile() };
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        // SAFETY: as above; only this side writes the tail.
        let mut tail = unsafe { std::ptr::addr_of!((*page).data_tail).read_volatile() };
        crate::stats::FILL.fetch_max(head.saturating_sub(tail), std::sync::atomic::Ordering::Relaxed);
        let before = out.data.len();
        while tail < head {
            // A broken header: nothing after it can be trusted.
            let Some((kind, size)) = self.record(tail) else { break };
            if kind == b::PERF_RECORD_SAMPLE || kind == b::PERF_RECORD_LOST {
                let start = out.data.len();
                let body = self.body(tail, size);
                out.data.extend_from_slice(body);
                out.records.push((kind, start, body.len()));
            }
            tail += size as u64;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: as above; the kernel reads the tail to know what it may
        // overwrite (release: after our reads of the data).
        unsafe { std::ptr::addr_of_mut!((*page).data_tail).write_volatile(head) };
        out.data.len() - before
    }

    /// The type and size of the record at `pos`.
    fn record(&mut self, pos: u64) -> Option<(u32, usize)> {
        let h = self.bytes(pos, 8);
        let kind = u32::from_le_bytes(h[0..4].try_into().ok()?);
        let size = u16::from_le_bytes(h[6..8].try_into().ok()?) as usize;
        (size >= 8).then_some((kind, size))
    }

    /// The record at `pos` without its 8-byte header.
    fn body(&mut self, pos: u64, size: usize) -> &[u8] {
        &self.bytes(pos, size)[8..]
    }

    /// `n` bytes of data at ring position `pos`, copied when they wrap.
    fn bytes(&mut self, pos: u64, n: usize) -> &[u8] {
        let off = (pos % self.size) as usize;
        // SAFETY: the data area is `size` bytes after the control page,
        // inside the mapping; reads stay within it.
        let data = unsafe { std::slice::from_raw_parts(self.map.add(self.data), self.size as usize) };
        if off + n <= data.len() {
            return &data[off..off + n];
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&data[off..]);
        self.scratch.extend_from_slice(&data[..n - (data.len() - off)]);
        &self.scratch
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.len) };
    }
}

fn word(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A record's body: a sample laid out as IDENTIFIER, TIME, REGS_USER
/// (abi, then the registers if abi is not 0), STACK_USER (size, the
/// bytes, then the size copied if size is not 0), or a LOST record
/// (id, count).
pub fn parse(kind: u32, body: &[u8]) -> Option<Rec<'_>> {
    if kind == b::PERF_RECORD_LOST {
        return Some(Rec::Lost(word(body, 8)?));
    }
    if kind != b::PERF_RECORD_SAMPLE {
        return None;
    }
    let id = word(body, 0)?;
    let time = word(body, 8)?;
    let abi = word(body, 16)?;
    let mut at = 24;
    let regs = if abi != 0 {
        let n = crate::arch::PERF_REGS.count_ones() as usize * 8;
        let r = body.get(at..at + n)?;
        at += n;
        r
    } else {
        &[]
    };
    let size = word(body, at)? as usize;
    at += 8;
    let stack = if size != 0 {
        let copied = word(body, at + size)? as usize;
        body.get(at..at + copied.min(size))?
    } else {
        &[]
    };
    Some(Rec::Sample { id, time, regs, stack })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_sample_and_a_lost_record() {
        let n = crate::arch::PERF_REGS.count_ones() as u64;
        let mut body: Vec<u64> = vec![7, 1_000, 2];
        body.extend((0..n).map(|i| 100 + i));
        body.extend([16, 0xaa, 0xbb, 8]);
        let bytes: Vec<u8> = body.iter().flat_map(|w| w.to_le_bytes()).collect();
        let Some(Rec::Sample { id, time, regs, stack }) = parse(b::PERF_RECORD_SAMPLE, &bytes) else { panic!() };
        assert_eq!((id, time, regs.len() as u64, stack.len()), (7, 1_000, n * 8, 8));
        assert_eq!(word(regs, 0), Some(100));
        assert_eq!(word(stack, 0), Some(0xaa));
        let lost: Vec<u8> = [7u64, 42].iter().flat_map(|w| w.to_le_bytes()).collect();
        assert!(matches!(parse(b::PERF_RECORD_LOST, &lost), Some(Rec::Lost(42))));
        // A truncated sample is no sample.
        assert!(parse(b::PERF_RECORD_SAMPLE, &bytes[..40]).is_none());
    }
}
