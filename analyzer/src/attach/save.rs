//! The attached process's stream saved as it arrives by a keeper of its
//! own (`crate::bounded`): whole in the window's trace file, or within
//! `--max-trace-size` / `--max-trace-age` as `mtrace run` keeps a long
//! run's; the keeper writes the report points' .memlog files too.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::{Context, Result};

use super::AttachArgs;
use crate::bounded::{self, Bound, Dest};

/// Starts saving `stream` into the window's trace file (0600: `--save
/// FILE`, else `PID.mtrace` in `dir`) on a thread of its own. Returns the
/// file's path and the thread, which ends with the stream and returns the
/// bytes it received (0: none came). Fails when the file cannot be made.
pub fn start(a: &AttachArgs, dir: &Path, stream: UnixStream) -> Result<(PathBuf, JoinHandle<Result<u64>>)> {
    let trace = match &a.save {
        Some(p) => p.clone(),
        None => dir.join(format!("{}.mtrace", a.pid)),
    };
    // A keeper makes its file anew (never over another): a --save FILE
    // is replaced.
    match std::fs::remove_file(&trace) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("{}: cannot replace", trace.display()))
        }
        _ => {}
    }
    let (path, bound) = (trace.clone(), a.bound.bound()?.unwrap_or_default());
    Ok((trace, std::thread::spawn(move || keep(stream, &path, bound))))
}

/// Keeps the stream in a trace file at `path` (within `bound`, if it has
/// one) until the process closes it, and writes the .memlog of each
/// report point (the report signal, `mtrace_report()`) into the process's
/// working directory, as the library does for a trace file; bytes
/// received.
fn keep(s: UnixStream, path: &Path, bound: Bound) -> Result<u64> {
    let mut src = Counted { inner: s, n: 0 };
    let mut points = bounded::ReportPoints::new(None, None);
    let kept = bounded::keep(&mut src, Dest::File(path), bound, Some(&mut points))?;
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
