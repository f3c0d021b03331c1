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
//!
//! The stream may go to a socket instead (`MTRACE_OUTPUT=unix:PATH` or
//! `tcp:HOST:PORT`): written with `MSG_NOSIGNAL`, so that a reader that went
//! away stops tracing (one warning) instead of killing the program with
//! SIGPIPE; it carries commands back (stream/control.rs). A socket cannot
//! be opened again: if it was closed or replaced, tracing stops.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::platform::sys::{self, identity, move_high};
use mtrace_format::address::Address;

/// What the stream goes to: the one place a new transport adds a variant
/// (and its arms below); its address syntax is `mtrace_format::address`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sink {
    /// A file (or the null device, or a FIFO with a reader): written with
    /// `write`, opened again by its path if the program closes it.
    File,
    /// A connected UNIX or TCP stream socket: written with `send` (no
    /// SIGPIPE), and read for the reader's commands.
    Socket,
}

impl Sink {
    /// Writes what it can of `buf` to `fd`: `write(2)`'s or `send(2)`'s result.
    fn put(self, fd: i32, buf: &[u8]) -> isize {
        // SAFETY: buf is a valid readable slice.
        unsafe {
            match self {
                Sink::File => libc::write(fd, buf.as_ptr().cast(), buf.len()),
                Sink::Socket => libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL),
            }
        }
    }

    /// What the stream goes to, in a warning.
    fn name(self) -> &'static str {
        match self {
            Sink::File => "the trace file",
            Sink::Socket => "the trace's connection",
        }
    }
}

/// The trace file, or socket.
pub struct Output {
    fd: AtomicI32,
    /// Device and inode, from `fstat` when it was created.
    id: (u64, u64),
    /// Its absolute path, or the socket's address, for messages.
    path: CString,
    /// What it is.
    sink: Sink,
    lost: AtomicBool,
}

impl Output {
    /// Creates `path` exclusively with mode 0600 at a high descriptor;
    /// `Err(errno)` when it cannot (EEXIST: a regular file is there, the
    /// caller tries another name). See [`open_existing`] for what else may
    /// be there. `path` must be absolute to be opened
    /// again after a `chdir`.
    pub fn create(path: &str) -> Result<Output, i32> {
        let c = CString::new(path).map_err(|_| libc::EINVAL)?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC;
        // SAFETY: c is NUL-terminated.
        let mut fd = unsafe { libc::open(c.as_ptr(), flags, 0o600) };
        if fd < 0 && sys::errno() == libc::EEXIST {
            fd = open_existing(&c)?;
        } else if fd < 0 {
            return Err(sys::errno());
        }
        let fd = move_high(fd, -1).unwrap_or(fd);
        let id = identity(fd).ok_or_else(sys::errno)?;
        Ok(Output { fd: AtomicI32::new(fd), id, path: c, sink: Sink::File, lost: AtomicBool::new(false) })
    }

    /// Connects to `addr`, in the syntax of `mtrace_format::address`, with
    /// a TCP host an IPv4 or `[IPv6]` address or `localhost` (no name
    /// lookup inside the program). `None` when `addr` names no socket;
    /// `Some(Err(message))` when it is malformed or the connection failed.
    pub fn connect(addr: &str) -> Option<Result<Output, String>> {
        if let Some(n) = addr.strip_prefix(HELD_PREFIX) {
            return Some(adopt(n).map(|fd| {
                let id = identity(fd).unwrap_or((0, 0));
                let path = CString::new(addr).unwrap_or_default();
                Output { fd: AtomicI32::new(fd), id, path, sink: Sink::Socket, lost: AtomicBool::new(false) }
            }));
        }
        let parsed = Address::parse(addr)?;
        Some(parsed.and_then(|a| connect_socket(&a)).map(|fd| {
            let fd = move_high(fd, -1).unwrap_or(fd);
            let id = identity(fd).unwrap_or((0, 0));
            let path = CString::new(addr).unwrap_or_default();
            Output { fd: AtomicI32::new(fd), id, path, sink: Sink::Socket, lost: AtomicBool::new(false) }
        }))
    }

    /// Reads what the reader sent (without waiting) into `into`; false
    /// when it closed the connection or it broke. Always true for a file.
    pub fn receive(&self, into: &mut Vec<u8>) -> bool {
        if self.sink != Sink::Socket || self.is_lost() {
            return true;
        }
        let mut buf = [0u8; 512];
        loop {
            // SAFETY: buf is a valid writable buffer.
            let n = unsafe { libc::recv(self.fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            match n {
                0 => return false,
                n if n > 0 => into.extend_from_slice(&buf[..n as usize]),
                _ => {
                    let e = sys::errno();
                    return e == libc::EAGAIN || e == libc::EINTR;
                }
            }
        }
    }

    /// The descriptor now.
    pub fn fd(&self) -> i32 {
        self.fd.load(Ordering::Acquire)
    }

    /// Whether the stream goes to a socket.
    pub fn is_socket(&self) -> bool {
        self.sink == Sink::Socket
    }

    /// Closes the stream for good (after the End record of a detach).
    pub fn close(&self) {
        if !self.lost.swap(true, Ordering::AcqRel) {
            // A socket's unread commands (a `detach` a solo process had not
            // read yet) would make the close a reset, and the reader would
            // see its stream break off after the End record: read first.
            let mut rest = [0u8; 512];
            // SAFETY: our own descriptor and a buffer of ours; a file's
            // recv fails (ENOTSOCK) and reads nothing.
            while unsafe { libc::recv(self.fd(), rest.as_mut_ptr().cast(), rest.len(), libc::MSG_DONTWAIT) } > 0 {}
            // SAFETY: our own descriptor; nothing writes to it any more.
            unsafe { libc::close(self.fd()) };
        }
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
            let n = self.sink.put(self.fd(), buf);
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
        if self.sink != Sink::File {
            return false;
        }
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
    pub fn lose(&self, why: &str) -> bool {
        if !self.lost.swap(true, Ordering::AcqRel) {
            let path = self.path.to_string_lossy();
            sys::warn(&format!("{} {path} {why}; tracing stops here", self.sink.name()));
            super::stop_tracing(true);
        }
        false
    }
}

/// `path` exists and is not a regular file: the null device is written
/// to (the trace discarded), a FIFO with a reader is written to; anything
/// else is refused — EISDIR for a folder, ENXIO for a FIFO nobody reads,
/// ENODEV for other devices and sockets (a terminal, `/dev/stdout` would
/// put trace bytes into the program's output).
fn open_existing(path: &std::ffi::CStr) -> Result<i32, i32> {
    // SAFETY: st is a valid out-pointer, path NUL-terminated.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated and st a valid out-pointer.
    if unsafe { libc::stat(path.as_ptr(), &mut st) } != 0 {
        return Err(sys::errno());
    }
    let kind = st.st_mode & libc::S_IFMT;
    let null = kind == libc::S_IFCHR && libc::major(st.st_rdev) == 1 && libc::minor(st.st_rdev) == 3;
    let flags = match kind {
        libc::S_IFREG => return Err(libc::EEXIST),
        libc::S_IFDIR => return Err(libc::EISDIR),
        libc::S_IFIFO => libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
        _ if null => libc::O_WRONLY | libc::O_CLOEXEC,
        _ => return Err(libc::ENODEV),
    };
    // SAFETY: path is NUL-terminated; fcntl on the descriptor just opened.
    unsafe {
        let fd = libc::open(path.as_ptr(), flags);
        if fd < 0 {
            return Err(sys::errno());
        }
        // Writes to a FIFO wait for its reader, as to a slow file.
        libc::fcntl(fd, libc::F_SETFL, libc::O_WRONLY);
        Ok(fd)
    }
}

/// The output setting that names a connected socket the process holds
/// already, `fd:N`: `mtrace attach` made it in the process (a socket
/// pair, whose other end it took with `pidfd_getfd`) when the process
/// cannot reach the attacher's socket by path (another mount namespace).
/// Not an address a reader listens on, so not `mtrace_format::address`'s.
pub const HELD_PREFIX: &str = "fd:";

/// Descriptor `n` (decimal), a stream socket, moved to a high number.
fn adopt(n: &str) -> Result<i32, String> {
    let fd: i32 = n.parse().map_err(|_| format!("{n:?} is no descriptor number"))?;
    // SAFETY: st is a valid out-pointer; fstat on any number is safe.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!("descriptor {fd} is no socket"));
    }
    Ok(move_high(fd, -1).unwrap_or(fd))
}

/// A connected stream socket (close-on-exec) to `addr`.
fn connect_socket(addr: &Address) -> Result<i32, String> {
    // SAFETY: plain socket calls on a descriptor we own; the address
    // structures are fully initialised before use.
    unsafe {
        if let Address::Unix(path) = addr {
            let mut sa: libc::sockaddr_un = std::mem::zeroed();
            sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
            let bytes = path.as_bytes();
            if bytes.len() >= sa.sun_path.len() {
                return Err(format!("UNIX socket path too long: {path:?}"));
            }
            for (d, &b) in sa.sun_path.iter_mut().zip(bytes) {
                *d = b as libc::c_char;
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            return finish_connect(fd, (&raw const sa).cast(), std::mem::size_of::<libc::sockaddr_un>() as u32);
        }
        let ip = addr.ip().ok_or("HOST is an IP address or localhost (no name lookup in the program)")?;
        match ip {
            std::net::SocketAddr::V4(a) => {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = a.port().to_be();
                sa.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                finish_connect(fd, (&raw const sa).cast(), std::mem::size_of::<libc::sockaddr_in>() as u32)
            }
            std::net::SocketAddr::V6(a) => {
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_port = a.port().to_be();
                sa.sin6_addr.s6_addr = a.ip().octets();
                let fd = libc::socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                finish_connect(fd, (&raw const sa).cast(), std::mem::size_of::<libc::sockaddr_in6>() as u32)
            }
        }
    }
}

/// Connects socket `fd` (closing it on failure).
///
/// # Safety
/// `sa` points to a socket address of `len` bytes.
unsafe fn finish_connect(fd: i32, sa: *const libc::sockaddr, len: u32) -> Result<i32, String> {
    if fd < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    loop {
        // SAFETY: per the contract.
        if unsafe { libc::connect(fd, sa, len) } == 0 {
            return Ok(fd);
        }
        if sys::errno() != libc::EINTR {
            let e = std::io::Error::last_os_error().to_string();
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
            return Err(e);
        }
    }
}

impl super::Session {
    /// The program is about to close or replace descriptor `fd` (a hook of
    /// `close`, `dup2`, `dup3`): if it is the trace's, it moves first.
    pub fn make_way(&self, fd: i32) {
        if fd == self.out.fd() {
            // A hook (platform/spin.rs: why not park).
            let _f = self.lock_file();
            self.out.make_way(fd);
        }
    }

    /// Keeps the trace's descriptor where it is while held (the session's
    /// file lock), for a hook that closes a range around it.
    pub fn hold_file_number(&self) -> NumberHold<'_> {
        let g = self.lock_file();
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
