//! The attached process's stream saved as it arrives: copied whole into
//! the window's trace file, or kept within `--max-trace-size` /
//! `--max-trace-age` by a keeper of its own (`crate::bounded`), as `mtrace
//! run` keeps a long run's.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use super::AttachArgs;
use mtrace_analysis::bounded::{self, Bound, Dest};

/// Starts saving `stream` into the window's trace file (0600: `--save
/// FILE`, else `PID.mtrace` in `dir`) on a thread of its own. Returns the
/// file's path and the thread, which ends with the stream and returns the
/// bytes it received (0: none came). Fails when the file cannot be made.
pub fn start(a: &AttachArgs, dir: &Path, stream: UnixStream) -> Result<(PathBuf, JoinHandle<Result<u64>>)> {
    let trace = match &a.save.save {
        Some(p) => p.clone(),
        None => dir.join(format!("{}.mtrace", a.pid)),
    };
    if let Some(bound) = a.bound.bound()? {
        // A keeper makes its file anew (never over another): a --save
        // FILE is replaced, as the plain copy truncates it.
        match std::fs::remove_file(&trace) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("{}: cannot replace", trace.display()))
            }
            _ => {}
        }
        let path = trace.clone();
        return Ok((trace, std::thread::spawn(move || keep(stream, &path, bound))));
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&trace)
        .with_context(|| format!("{}: cannot create", trace.display()))?;
    Ok((trace, std::thread::spawn(move || copy(stream, file))))
}

/// Copies the stream to `file` until the process closes it; bytes copied.
fn copy(mut s: UnixStream, mut file: std::fs::File) -> Result<u64> {
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                file.write_all(&buf[..k])?;
                n += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if n > 0 => {
                eprintln!("mtrace: the stream broke off: {e}");
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    file.flush()?;
    Ok(n)
}

/// Keeps the stream in a trace file at `path` within `bound` until the
/// process closes it; bytes received.
fn keep(s: UnixStream, path: &Path, bound: Bound) -> Result<u64> {
    let mut src = Counted { inner: s, n: 0 };
    let kept = bounded::keep(&mut src, Dest::File(path), bound, None)?;
    if let Some(e) = kept.error.filter(|_| src.n > 0) {
        eprintln!("mtrace: the stream broke off: {e}");
    }
    for p in kept.problems {
        eprintln!("mtrace: {p}");
    }
    Ok(src.n)
}

/// A reader that counts the bytes read through it.
struct Counted<R> {
    inner: R,
    n: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n += k as u64;
        Ok(k)
    }
}
