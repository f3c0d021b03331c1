//! The trace's descriptor, kept the tracer's own.
//!
//! A program may close any descriptor, `dup2` onto it, or close them all
//! before it execs or becomes a daemon; a descriptor number it freed is
//! handed to the next file it opens. Trace bytes written to that number
//! would land in the program's file. So:
//! - the hooks of `close`, `dup2`, `dup3`, `close_range` and `closefrom`
//!   (hooks/fds.rs) move the trace to another number before the program's
//!   call frees ours, or leave ours out of a range it closes;
//! - before every write the descriptor is checked to still be the trace
//!   file (device and inode, one `fstat`): a raw system call may have
//!   closed or replaced it. If it is not, the file is opened again by its
//!   path (the stream goes on where it stopped: only whole records are
//!   written); if that fails too, the trace is lost: one warning, and
//!   tracing stops.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::sys;

/// Lowest descriptor number for the trace (below the usual 1024 limit):
/// out of the low numbers a program opens, `dup2`s onto and reuses.
const HIGH_FD: i32 = 900;

/// The trace file.
pub struct Output {
    fd: AtomicI32,
    /// Device and inode of the file, from `fstat` when it was created.
    id: (u64, u64),
    /// Its absolute path, to open it again.
    path: CString,
    lost: AtomicBool,
}

/// Device and inode of what `fd` refers to, if it is open.
fn identity(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: st is a valid out-pointer; fstat on any number is safe.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// A copy of `fd` (close-on-exec) at a high number that is not `avoid`,
/// the original closed; `None` when no number is free.
fn move_high(fd: i32, avoid: i32) -> Option<i32> {
    // SAFETY: rl is a valid out-pointer.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
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

impl Output {
    /// Creates `path` exclusively with mode 0600 at a high descriptor;
    /// `Err(errno)` when it cannot. `path` must be absolute to be opened
    /// again after a `chdir`.
    pub fn create(path: &str) -> Result<Output, i32> {
        let c = CString::new(path).map_err(|_| libc::EINVAL)?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
        // SAFETY: c is NUL-terminated.
        let fd = unsafe { libc::open(c.as_ptr(), flags, 0o600) };
        if fd < 0 {
            return Err(sys::errno());
        }
        let fd = move_high(fd, -1).unwrap_or(fd);
        let id = identity(fd).ok_or_else(sys::errno)?;
        Ok(Output { fd: AtomicI32::new(fd), id, path: c, lost: AtomicBool::new(false) })
    }

    /// The descriptor now.
    pub fn fd(&self) -> i32 {
        self.fd.load(Ordering::Acquire)
    }

    /// Whether the trace was lost (and tracing stopped).
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Writes `bytes`, whole records, after checking that the descriptor is
    /// still the trace file (opening the file again if not). The caller
    /// holds the session's file lock. False when the trace is lost.
    pub fn write(&self, bytes: &[u8]) -> bool {
        if bytes.is_empty() || self.is_lost() {
            return !self.is_lost();
        }
        if identity(self.fd()) != Some(self.id) && !self.reopen() {
            return self.lose("was closed or replaced by the program, and the file cannot be opened again");
        }
        let mut buf = bytes;
        while !buf.is_empty() {
            // SAFETY: buf is a valid readable slice.
            let n = unsafe { libc::write(self.fd(), buf.as_ptr().cast(), buf.len()) };
            if n < 0 {
                if sys::errno() == libc::EINTR {
                    continue;
                }
                let err = std::io::Error::last_os_error();
                return self.lose(&format!("cannot be written ({err})"));
            }
            buf = &buf[n as usize..];
        }
        true
    }

    /// Opens the trace file again, appending, if the path still names it.
    fn reopen(&self) -> bool {
        // SAFETY: path is NUL-terminated.
        let fd = unsafe { libc::open(self.path.as_ptr(), libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC) };
        if fd < 0 {
            return false;
        }
        if identity(fd) != Some(self.id) {
            // SAFETY: our own descriptor, just opened.
            unsafe { libc::close(fd) };
            return false;
        }
        self.fd.store(move_high(fd, -1).unwrap_or(fd), Ordering::Release);
        true
    }

    /// The program is about to close or replace descriptor `fd`: if it is
    /// the trace's, the trace moves to another number first. The caller
    /// holds the session's file lock.
    pub fn make_way(&self, fd: i32) {
        if fd != self.fd() || self.is_lost() {
            return;
        }
        match move_high(fd, fd) {
            Some(new) => self.fd.store(new, Ordering::Release),
            None => {
                self.lose("needs a free descriptor and none is left");
            }
        }
    }

    /// Stops writing for good, with one warning; returns false.
    fn lose(&self, why: &str) -> bool {
        if !self.lost.swap(true, Ordering::AcqRel) {
            let path = self.path.to_string_lossy();
            sys::warn(&format!("the trace file {path} {why}; tracing stops here"));
            super::stop_tracing();
        }
        false
    }
}

impl super::Session {
    /// The program is about to close or replace descriptor `fd` (a hook of
    /// `close`, `dup2`, `dup3`): if it is the trace's, it moves first.
    pub fn make_way(&self, fd: i32) {
        if fd == self.out.fd() {
            let _f = self.file.lock();
            self.out.make_way(fd);
        }
    }

    /// Keeps the trace's descriptor where it is while held (the session's
    /// file lock), for a hook that closes a range around it.
    pub fn hold_file_number(&self) -> NumberHold<'_> {
        let g = self.file.lock();
        NumberHold { fd: (!self.out.is_lost()).then(|| self.out.fd()).and_then(|fd| u32::try_from(fd).ok()), _g: g }
    }
}

/// The trace's descriptor, held (see [`super::Session::hold_file_number`]).
pub struct NumberHold<'a> {
    fd: Option<u32>,
    _g: parking_lot::MutexGuard<'a, ()>,
}

impl NumberHold<'_> {
    /// The trace's descriptor, unless the trace was lost.
    pub fn fd(&self) -> Option<u32> {
        self.fd
    }
}
