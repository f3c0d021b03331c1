//! The one place mtrace listens: a stream's producer (the preload, the
//! ptrace tracer) or a client connects to an [`Address`] mtrace listens
//! on. UNIX sockets are 0600 (the project's rule), a stale one is
//! replaced, a live one refused; TCP is refused off loopback without a
//! shared secret.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use mtrace_format::address::{Address, Socket};

/// A bound listener. A UNIX socket's file goes with it, and so does the
/// private folder it was made in ([`Listener::private`]).
pub struct Listener {
    kind: Kind,
    /// The private folder (0700) holding the socket, removed last.
    folder: Option<tempfile::TempDir>,
}

enum Kind {
    /// The listener and its socket's path, removed when dropped.
    Unix(UnixListener, PathBuf),
    Tcp(std::net::TcpListener),
}

impl Drop for Listener {
    /// The socket goes with the listener, whichever way the command ends.
    fn drop(&mut self) {
        if let Kind::Unix(_, p) = &self.kind {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Listener {
    /// Listens at `addr`. `secret`: whether clients must present a token
    /// (a TCP address off loopback is refused without one). Errors, in
    /// one line naming the address: a file that is not a socket, a socket
    /// another process listens on, a bind that fails.
    pub fn bind(addr: &Address, secret: bool) -> Result<Listener> {
        let kind = match addr {
            Address::Unix(p) => {
                let p = Path::new(p);
                replace_stale(p)?;
                // Made under another name, then renamed into place: a
                // socket at the path is listening already, and 0600 (a
                // client that waits for the file, as `run -i` does, was
                // refused between the bind and the listen).
                let name = p.file_name().map_or_else(Default::default, |n| n.to_string_lossy().into_owned());
                let making = p.with_file_name(format!(".{name}.{}", std::process::id()));
                let _ = std::fs::remove_file(&making);
                let l = UnixListener::bind(&making).with_context(|| format!("cannot listen on {addr}"))?;
                let placed = std::fs::set_permissions(&making, std::fs::Permissions::from_mode(0o600))
                    .and_then(|()| std::fs::rename(&making, p));
                if let Err(e) = placed {
                    let _ = std::fs::remove_file(&making);
                    return Err(e).with_context(|| format!("cannot listen on {addr}"));
                }
                Kind::Unix(l, p.to_owned())
            }
            Address::Tcp { host, port } => {
                let l = std::net::TcpListener::bind(format!("{host}:{port}"))
                    .with_context(|| format!("cannot listen on {addr}"))?;
                if !l.local_addr()?.ip().is_loopback() && !secret {
                    bail!("{addr} is not a loopback address: give --token-file (clients must present its secret)");
                }
                Kind::Tcp(l)
            }
        };
        Ok(Listener { kind, folder: None })
    }

    /// Listens on a socket of its own: `name` in a new 0700 folder named
    /// `prefix` and a random suffix under the temporary folder, both
    /// removed with the listener.
    pub fn private(prefix: &str, name: &str) -> Result<Listener> {
        let folder = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let path = folder.path().join(name);
        let mut l = Listener::bind(&Address::Unix(path.display().to_string()), false)?;
        l.folder = Some(folder);
        Ok(l)
    }

    /// The address a producer is given (`MTRACE_OUTPUT`): `unix:PATH` or
    /// `tcp:HOST:PORT`.
    pub fn address(&self) -> String {
        match &self.kind {
            Kind::Unix(_, p) => format!("unix:{}", p.display()),
            Kind::Tcp(l) => l.local_addr().map_or_else(|_| "tcp:".to_owned(), |a| format!("tcp:{a}")),
        }
    }

    /// The socket's file and its private folder, if any (to give them to
    /// another user: `mtrace attach` of another user's process).
    pub fn files(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = self.folder.iter().map(|d| d.path()).collect();
        if let Kind::Unix(_, p) = &self.kind {
            out.push(p);
        }
        out
    }

    /// Makes [`Listener::accept`] return `WouldBlock` rather than wait.
    pub fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match &self.kind {
            Kind::Unix(l, _) => l.set_nonblocking(on),
            Kind::Tcp(l) => l.set_nonblocking(on),
        }
    }

    /// The next connection on a UNIX socket (the producers' streams).
    /// Errors: `Unsupported` on a TCP listener.
    pub fn accept_unix(&self) -> std::io::Result<std::os::unix::net::UnixStream> {
        match &self.kind {
            Kind::Unix(l, _) => Ok(l.accept()?.0),
            Kind::Tcp(_) => Err(std::io::ErrorKind::Unsupported.into()),
        }
    }

    /// The connections on a UNIX socket, for a thread of their own: the
    /// listener stays here (its socket goes when it is dropped) while the
    /// thread waits on a second handle. Errors: a TCP listener, or no
    /// descriptor left.
    pub fn incoming_unix(&self) -> std::io::Result<impl Iterator<Item = std::os::unix::net::UnixStream>> {
        match &self.kind {
            Kind::Unix(l, _) => {
                let l = l.try_clone()?;
                Ok(std::iter::from_fn(move || l.accept().ok().map(|(s, _)| s)))
            }
            Kind::Tcp(_) => Err(std::io::ErrorKind::Unsupported.into()),
        }
    }

    /// The next connection, and who made it ("a local client" or the
    /// peer's address), for messages.
    pub fn accept(&self) -> std::io::Result<(Socket, String)> {
        Ok(match &self.kind {
            Kind::Unix(l, _) => (Socket::Unix(l.accept()?.0), "a local client".to_owned()),
            Kind::Tcp(l) => {
                let (s, from) = l.accept()?;
                (Socket::Tcp(s), from.to_string())
            }
        })
    }
}

/// Makes way for a UNIX socket at `sock` (`mtrace server --listen
/// unix:PATH`, `mtrace keep --listen`): removes a socket nobody listens on
/// any more (a server or keeper that died); refuses, naming why, a socket
/// another process listens on and any other file, which is the user's and
/// stays (a mistyped `--listen unix:report.txt` removed the report).
fn replace_stale(sock: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(sock) else { return Ok(()) };
    if !meta.file_type().is_socket() {
        bail!("{}: exists and is not a socket", sock.display());
    }
    if std::os::unix::net::UnixStream::connect(sock).is_ok() {
        bail!("{}: another process listens there", sock.display());
    }
    std::fs::remove_file(sock).with_context(|| format!("{}: cannot replace the stale socket", sock.display()))
}
