//! [`super::keep`] of a stream whose books a report wants (`mtrace run`'s
//! program, without a bound): the report's own reading
//! ([`crate::input::load_along`]: one thread decodes and merges, another
//! keeps the books), which hands the stream's bytes, as it reads them, to
//! a third that compresses those that came plain and writes the file.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};

use anyhow::Result;
use mtrace_format::{BlockCompressor, Header, Reader};

use super::file::TraceFile;
use super::{compress, Kept, ReportPoints, Tee, BLOCK};
use crate::input::{load_along, Along, AtTop};
use crate::pipeline::{following, Followed, ReportOpts};
use crate::trace::{Trace, Window};

/// Byte runs in flight to the file's thread (each about [`BLOCK`]).
const IN_FLIGHT: usize = 16;

/// Reads the stream of `r` (its `header` read, the file `f` made with it)
/// into the books of the report `opts` asks for (`w`, its window) and
/// writes its bytes to `f`; answers report points with `points`. Returns
/// `kept` with the books ([`Kept::books`]) and how the stream ended.
/// Errors only when the file cannot be written.
pub(super) fn keep<S: Read + Send>(
    r: Reader<Tee<S>>,
    header: Header,
    f: TraceFile,
    (opts, w): (&ReportOpts, &Window),
    mut points: Option<&mut ReportPoints>,
    mut kept: Kept,
) -> Result<Kept> {
    let path = f.path().to_owned();
    let warm_stop = AtomicBool::new(false);
    let (tx, rx) = sync_channel::<(Vec<u8>, bool)>(IN_FLIGHT);
    let (trace, sym, written) = std::thread::scope(|sc| {
        let writer = sc.spawn(move || write(f, rx));
        let warm = sc.spawn(|| following::warm(opts, &path, &warm_stop));
        // The reader's count of compressed blocks at the last take: the
        // bytes taken since came plain when it is the same.
        let mut taken = 0;
        let at_top: AtTop<Tee<S>> = Box::new(move |r, end| {
            // Drained: the process has sent nothing more yet; what it
            // sent goes to the file (a report of a running process's).
            if !end && r.source_mut().copy.len() < BLOCK && !r.drained() {
                return;
            }
            // At the end (or a break) everything read, as `keep`'s file.
            let at = if end { u64::MAX } else { r.offset() };
            let blocks = r.blocks();
            let bytes = r.source_mut().take(at);
            let plain = std::mem::replace(&mut taken, blocks) == blocks;
            // The file's thread gone: its error is returned below.
            let _ = tx.send((bytes, plain));
        });
        let marker = Box::new(|t: &mut Trace, seq: u64, name: &str| {
            if let Some(p) = points.as_deref_mut() {
                p.marker(t, seq, name);
            }
        });
        let trace = load_along(r, header, &path, w, Some(Along { at_top, marker }));
        warm_stop.store(true, Ordering::Relaxed);
        let sym = warm.join().unwrap_or_else(|_| opts.symbolizer_for(&path));
        let written = writer.join().unwrap_or_else(|_| Err(anyhow::anyhow!("{}: its writer failed", path.display())));
        (trace, sym, written)
    });
    kept.dropped = written?.dropped;
    if let Ok(t) = &trace {
        kept.error = t.error.as_ref().map(|e| e.to_string());
    }
    if let Some(p) = points {
        kept.problems.append(&mut p.problems);
    }
    kept.books = Some(Followed::new(path, trace, sym));
    Ok(kept)
}

/// The file's thread: appends each byte run from `rx` to `f`, those that
/// came plain compressed first. Returns the file once `rx` ends.
fn write(mut f: TraceFile, rx: Receiver<(Vec<u8>, bool)>) -> Result<TraceFile> {
    let mut zstd: Option<Option<BlockCompressor>> = None;
    for (bytes, plain) in rx {
        let bytes = if plain { compress(bytes, &mut zstd) } else { bytes };
        f.append(&bytes)?;
    }
    Ok(f)
}
