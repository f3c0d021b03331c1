//! Where a stream goes or comes from, when it is a socket: the address
//! syntax every producer and the analyzer share (`MTRACE_OUTPUT`, `mtrace
//! server --listen`, `mtrace client ADDR`).
//!
//! `unix:PATH`, or `tcp:HOST:PORT`; `tcp:HOST` means port [`DEFAULT_PORT`]
//! and `tcp:` alone `127.0.0.1:4576` (mtrace-ng's port). HOST is a name,
//! an IPv4 address or a bracketed IPv6 address (`[::1]`).

use std::fmt;

/// mtrace-ng's TCP port, the default of `tcp:` addresses.
pub const DEFAULT_PORT: u16 = 4576;

/// A socket address in mtrace's syntax.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// A UNIX stream socket at this path.
    Unix(String),
    /// A TCP connection to `host:port` (`host` as written: a name, an IPv4
    /// address or `[IPv6]`).
    Tcp {
        /// As written.
        host: String,
        /// 0: any free port (a listener's).
        port: u16,
    },
}

impl Address {
    /// Parses `s`. `None` when it is no socket address (no `unix:` or
    /// `tcp:` prefix: a file name); `Some(Err(why))` when it is a malformed
    /// one (an empty path or host, a port that is no number from 0 to
    /// 65535); `why` does not repeat `s`.
    pub fn parse(s: &str) -> Option<Result<Address, String>> {
        if let Some(p) = s.strip_prefix("unix:") {
            return Some(if p.is_empty() { Err("unix: needs a path".into()) } else { Ok(Address::Unix(p.into())) });
        }
        let hp = s.strip_prefix("tcp:")?;
        if hp.is_empty() {
            return Some(Ok(Address::Tcp { host: "127.0.0.1".into(), port: DEFAULT_PORT }));
        }
        // The port follows the last colon outside an IPv6 address's brackets.
        let (host, port) = match hp.rfind(':').filter(|&i| !hp[i..].contains(']')) {
            Some(i) => (&hp[..i], Some(&hp[i + 1..])),
            None => (hp, None),
        };
        let port = match port {
            None => DEFAULT_PORT,
            // 0 stays: a listener's "any free port".
            Some(p) => match p.parse::<u16>() {
                Ok(n) => n,
                _ => return Some(Err("the port is a number from 0 to 65535".into())),
            },
        };
        if host.is_empty() {
            return Some(Err("tcp:HOST:PORT needs a host".into()));
        }
        Some(Ok(Address::Tcp { host: host.into(), port }))
    }

    /// The socket address of a TCP address whose host is an IP address or
    /// `localhost` (127.0.0.1), without a name lookup (the preload must not
    /// make one inside the program); `None` for other names and UNIX paths.
    pub fn ip(&self) -> Option<std::net::SocketAddr> {
        let Address::Tcp { host, port } = self else { return None };
        let ip = match host.as_str() {
            "localhost" => std::net::IpAddr::from([127, 0, 0, 1]),
            h => h.trim_start_matches('[').trim_end_matches(']').parse().ok()?,
        };
        Some(std::net::SocketAddr::new(ip, *port))
    }
}

impl Address {
    /// Connects to this address with std's sockets (a TCP host's name
    /// looked up): for the producers and readers outside the traced
    /// program (the ptrace tracer, `mtrace client`); the preload has its
    /// own, without a lookup.
    pub fn connect(&self) -> std::io::Result<Socket> {
        Ok(match self {
            Address::Unix(p) => Socket::Unix(std::os::unix::net::UnixStream::connect(p)?),
            Address::Tcp { host, port } => {
                let host = host.trim_start_matches('[').trim_end_matches(']');
                Socket::Tcp(std::net::TcpStream::connect((host, *port))?)
            }
        })
    }
}

/// A connected stream socket of either kind an [`Address`] names.
#[derive(Debug)]
pub enum Socket {
    /// `unix:PATH`.
    Unix(std::os::unix::net::UnixStream),
    /// `tcp:HOST:PORT`.
    Tcp(std::net::TcpStream),
}

impl Socket {
    /// A second handle on the same connection (one thread reads, another writes).
    pub fn try_clone(&self) -> std::io::Result<Socket> {
        Ok(match self {
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
        })
    }

    /// Shuts both directions down: a reader blocked on another handle
    /// returns.
    pub fn shutdown(&self) {
        let _ = match self {
            Socket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Socket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl std::io::Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Socket::Unix(s) => s.read(buf),
            Socket::Tcp(s) => s.read(buf),
        }
    }
}

impl std::io::Write for Socket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Socket::Unix(s) => s.write(buf),
            Socket::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Socket::Unix(s) => s.flush(),
            Socket::Tcp(s) => s.flush(),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "unix:{p}"),
            Address::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Address, DEFAULT_PORT};

    fn tcp(host: &str, port: u16) -> Option<Result<Address, String>> {
        Some(Ok(Address::Tcp { host: host.into(), port }))
    }

    #[test]
    fn the_forms_and_their_defaults() {
        assert_eq!(Address::parse("unix:/run/m.sock"), Some(Ok(Address::Unix("/run/m.sock".into()))));
        assert_eq!(Address::parse("tcp:"), tcp("127.0.0.1", DEFAULT_PORT));
        assert_eq!(Address::parse("tcp:box"), tcp("box", DEFAULT_PORT));
        assert_eq!(Address::parse("tcp:10.0.0.2:99"), tcp("10.0.0.2", 99));
        assert_eq!(Address::parse("tcp:[::1]"), tcp("[::1]", DEFAULT_PORT));
        assert_eq!(Address::parse("tcp:[::1]:7"), tcp("[::1]", 7));
        assert_eq!(Address::parse("trace.mtrace"), None);
        assert!(matches!(Address::parse("unix:"), Some(Err(_))));
        assert_eq!(Address::parse("tcp:0.0.0.0:0"), tcp("0.0.0.0", 0));
        assert!(matches!(Address::parse("tcp:box:65536"), Some(Err(_))));
        assert!(matches!(Address::parse("tcp:box:http"), Some(Err(_))));
        assert!(matches!(Address::parse("tcp::80"), Some(Err(_))));
        assert_eq!(Address::parse("tcp:[::1]:7").unwrap().unwrap().to_string(), "tcp:[::1]:7");
    }

    #[test]
    fn both_kinds_connect_and_carry_bytes() {
        use std::io::{Read, Write};
        let dir = std::env::temp_dir().join(format!("mtrace-address-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addrs = [
            Address::Unix(path.display().to_string()),
            Address::Tcp { host: "localhost".into(), port: tcp.local_addr().unwrap().port() },
        ];
        for a in &addrs {
            let mut c = a.connect().unwrap();
            c.write_all(b"scan\n").unwrap();
            c.try_clone().unwrap().shutdown();
        }
        let mut got = String::new();
        unix.accept().unwrap().0.read_to_string(&mut got).unwrap();
        tcp.accept().unwrap().0.read_to_string(&mut got).unwrap();
        assert_eq!(got, "scan\nscan\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn ip_addresses_without_a_lookup() {
        let ip = |s: &str| Address::parse(s).unwrap().unwrap().ip().map(|a| a.to_string());
        assert_eq!(ip("tcp:localhost:5").as_deref(), Some("127.0.0.1:5"));
        assert_eq!(ip("tcp:").as_deref(), Some("127.0.0.1:4576"));
        assert_eq!(ip("tcp:[::1]:7").as_deref(), Some("[::1]:7"));
        assert_eq!(ip("tcp:example.org:7"), None);
        assert_eq!(ip("unix:/x"), None);
    }
}
