//! `mtrace server` and `mtrace client`: a program traced on one machine
//! (the target), its streams kept, symbolized and reported on another (the
//! host), in mtrace-ng's manner — and safely: UNIX sockets are 0600, TCP
//! listens on loopback unless told otherwise, and then only with a shared
//! secret (`--token-file`).
//!
//! The wire, after the handshake (the client sends `mtrace 1 TOKEN\n`, the
//! server answers `ok\n`, or `denied: REASON\n` and closes), is frames:
//! kind (1 byte), stream (u32, little-endian), length (u32), payload.
//!
//! | kind | direction | payload |
//! |---|---|---|
//! | 1 data | server → client | bytes of one process's stream (docs/FORMAT.md) |
//! | 2 end | server → client | none: that process closed its stream |
//! | 3 exit | server → client | the program's exit status (i32; 128+N for signal N) |
//! | 4 command | client → server | one command line for that stream's process (preload/src/session/commands.rs); stream `u32::MAX`: every process |
//!
//! Each process the program starts (fork, exec) connects to the server
//! with a stream of its own: a stream id, in the order they connected.

pub mod client;
pub mod server;

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use mtrace_format::address::{Address, Socket};

pub const DATA: u8 = 1;
pub const END: u8 = 2;
pub const EXIT: u8 = 3;
pub const COMMAND: u8 = 4;
/// Stream id of a command for every process.
pub const ALL: u32 = u32::MAX;
/// Largest payload of a frame, bytes.
pub const MAX_FRAME: u32 = 1 << 20;

/// Writes one frame.
pub fn write_frame(w: &mut dyn Write, kind: u8, id: u32, payload: &[u8]) -> std::io::Result<()> {
    let mut head = [0u8; 9];
    head[0] = kind;
    head[1..5].copy_from_slice(&id.to_le_bytes());
    head[5..9].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    w.write_all(&head)?;
    w.write_all(payload)
}

/// Reads one frame: `None` at a clean end of the connection.
pub fn read_frame(r: &mut dyn Read) -> Result<Option<(u8, u32, Vec<u8>)>> {
    let mut head = [0u8; 9];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let (kind, id, len) =
        (head[0], u32::from_le_bytes(head[1..5].try_into()?), u32::from_le_bytes(head[5..9].try_into()?));
    if !(DATA..=COMMAND).contains(&kind) || len > MAX_FRAME {
        bail!("not an mtrace frame (kind {kind}, {len} bytes)");
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(Some((kind, id, payload)))
}

/// Where a server listens or a client connects: `s` in the stream's
/// address syntax (`mtrace_format::address`: `unix:PATH`, `tcp:HOST:PORT`,
/// `tcp:HOST` on port 4576, `tcp:` alone 127.0.0.1:4576); none:
/// `$XDG_RUNTIME_DIR/mtrace.sock`, else `/tmp/mtrace-UID.sock`. Errors: a
/// file name or a malformed address, in one line.
pub fn address(s: Option<&str>) -> Result<Address> {
    let Some(s) = s else {
        let path = match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) => PathBuf::from(d).join("mtrace.sock"),
            // SAFETY: getuid has no preconditions.
            None => PathBuf::from(format!("/tmp/mtrace-{}.sock", unsafe { libc::getuid() })),
        };
        return Ok(Address::Unix(path.display().to_string()));
    };
    match Address::parse(s) {
        None => bail!("{s:?}: an address is unix:PATH or tcp:HOST:PORT"),
        Some(Err(why)) => bail!("{s}: {why}"),
        Some(Ok(a)) => Ok(a),
    }
}

/// The secret in `token_file` (its first line), if given.
pub fn token(token_file: &Option<PathBuf>) -> Result<String> {
    match token_file {
        None => Ok(String::new()),
        Some(p) => {
            let t = std::fs::read_to_string(p).with_context(|| format!("{}: cannot read", p.display()))?;
            let t = t.lines().next().unwrap_or("").trim().to_owned();
            if t.is_empty() || t.contains(char::is_whitespace) {
                bail!("{}: the token is one word on the first line", p.display());
            }
            Ok(t)
        }
    }
}

/// A connection to the server at `a`; errors say where and why in one line.
pub fn connect(a: &Address) -> Result<Socket> {
    a.connect().map_err(|e| anyhow!("cannot connect to {a}: {e}"))
}

/// Reads one line (up to 256 bytes) without reading past it.
pub fn read_line(r: &mut dyn Read) -> Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.len() < 256 {
        if r.read(&mut b)? == 0 {
            break;
        }
        if b[0] == b'\n' {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
        line.push(b[0]);
    }
    bail!("no handshake line")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let shown = |s: &str| address(Some(s)).unwrap().to_string();
        assert_eq!(shown("unix:/x/s"), "unix:/x/s");
        assert_eq!(shown("tcp:"), "tcp:127.0.0.1:4576");
        assert_eq!(shown("tcp:10.0.0.1"), "tcp:10.0.0.1:4576");
        assert_eq!(shown("tcp:[::1]"), "tcp:[::1]:4576");
        assert_eq!(shown("tcp:h:99"), "tcp:h:99");
        assert!(address(Some("h:99")).is_err());
        assert!(address(Some("unix:")).is_err());
        assert!(address(Some("tcp:h:x")).is_err());
        assert!(address(None).unwrap().to_string().ends_with(".sock"));
    }

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        let mut buf = Vec::new();
        write_frame(&mut buf, DATA, 7, b"abc").unwrap();
        write_frame(&mut buf, EXIT, 0, &3i32.to_le_bytes()).unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).unwrap(), Some((DATA, 7, b"abc".to_vec())));
        assert_eq!(read_frame(&mut r).unwrap(), Some((EXIT, 0, 3i32.to_le_bytes().to_vec())));
        assert_eq!(read_frame(&mut r).unwrap(), None);
        assert!(read_frame(&mut &b"GET / HTTP/1.1\r\n\r\n"[..]).is_err());
    }
}
