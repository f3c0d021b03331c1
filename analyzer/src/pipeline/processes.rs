//! The report of a run that traced several processes (a shell script, a
//! build): one trace per process in a folder, the program's reported in
//! full and the others a line each.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::ReportOpts;
use crate::output::words::{plural, thousands};
use crate::report::{allocators, Report};

/// Writes the report of process `pid`'s trace in `dir` (its last image,
/// after any exec), then one line per other process traced there (with
/// its trace's path when `show_paths`). Returns the report, if `pid` wrote
/// a trace.
pub fn report_processes(
    dir: &Path,
    pid: u32,
    opts: &ReportOpts,
    show_paths: bool,
    out: &mut dyn Write,
) -> Result<Option<Report>> {
    let traces = traces_in(dir)?;
    let main = traces.iter().filter(|i| i.pid == pid).max_by_key(|i| i.start).map(|i| i.path.clone());
    let r = match &main {
        Some(path) => opts.report(path, Some(&mut *out))?,
        None => {
            writeln!(out, "mtrace: no trace was written for pid {pid} (static executable, or preloading failed)")?;
            None
        }
    };
    let others = processes(&traces, main.as_ref());
    if !others.is_empty() && !opts.json {
        let sym = opts.symbolizer();
        writeln!(out, "\nOther processes traced ({}):", others.len())?;
        for (p, images) in others.iter().take(OTHERS_SHOWN) {
            // The process as it ended: its last image's blocks (an exec
            // ends the image before it, and its heap with it).
            let path = &images.last().expect("one image at least").path;
            if *p == pid {
                // The program's process before its last exec (a wrapper
                // script), reported above as what it became.
                writeln!(out, "  pid {p} {} → the program reported above", exec_chain(images))?;
                continue;
            }
            let line = match crate::input::load(path) {
                Ok(t) => {
                    let rate = t.books.sample_rate;
                    let (bytes, blocks) = t.books.live_blocks().fold((0, 0), |acc, (_, b)| {
                        let (size, n) = b.estimate(rate);
                        (acc.0 + size, acc.1 + n)
                    });
                    // Not the whole answer where mtrace was blind to an allocator.
                    let blind = !allocators::notices(&t, &allocators::survey(&t, &sym)).is_empty();
                    format!(
                        "pid {p} {}: {} bytes in {} not freed{}",
                        exec_chain(images),
                        thousands(bytes),
                        plural(blocks, "block", "blocks"),
                        if blind { " (of what mtrace saw; not every allocator: its report says which)" } else { "" }
                    )
                }
                Err(e) => format!("pid {p}: {e:#}"),
            };
            let kept = if show_paths { format!(" ({})", path.display()) } else { String::new() };
            writeln!(out, "  {line}{kept}")?;
        }
        if others.len() > OTHERS_SHOWN {
            let more = others.len() - OTHERS_SHOWN;
            match show_paths {
                true => writeln!(out, "  … {more} more, their traces in {}", dir.display())?,
                false => writeln!(out, "  … {more} more (--keep-traces keeps every trace for mtrace report)")?,
            }
        }
    }
    Ok(r)
}

/// Other processes listed after the report: the rest are counted (python3
/// started through pyenv's shims is 78 shell processes before it).
const OTHERS_SHOWN: usize = 10;

/// The processes of `traces` (oldest first) but the image reported in
/// full (`main`), each with the traces of its images in order: a child
/// that forked and then exec'd is one process, not a stub of 0 bytes and
/// the program it became (`git gc` listed 16 entries for its 8 processes).
fn processes<'a>(traces: &'a [Image], main: Option<&PathBuf>) -> Vec<(u32, Vec<&'a Image>)> {
    let mut v: Vec<(u32, Vec<&Image>)> = Vec::new();
    for i in traces.iter().filter(|i| Some(&i.path) != main) {
        match v.iter_mut().find(|(p, _)| *p == i.pid) {
            Some((_, images)) => images.push(i),
            None => v.push((i.pid, vec![i])),
        }
    }
    v
}

/// The executables a process ran, in order: `/usr/bin/dash → /usr/bin/uname`.
fn exec_chain(images: &[&Image]) -> String {
    let mut names: Vec<&str> = images.iter().map(|i| i.exe.as_str()).collect();
    names.dedup();
    names.join(" → ")
}

/// One trace in the folder: a process's image from a start or an exec,
/// as its header says.
struct Image {
    pid: u32,
    /// `start_monotonic_ns` of the header.
    start: u64,
    path: PathBuf,
    exe: String,
}

/// The traces in `dir`, oldest first.
fn traces_in(dir: &Path) -> Result<Vec<Image>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        let Ok(f) = std::fs::File::open(&path) else { continue };
        let mut r = mtrace_format::Reader::new(f);
        if let Ok(h) = r.header() {
            v.push(Image { pid: h.pid, start: h.start_monotonic_ns, path, exe: h.exe });
        }
    }
    v.sort_by_key(|i| i.start);
    Ok(v)
}
