//! The report of a run that traced several processes (a shell script, a
//! build): one trace per image in a folder. The report starts with the
//! process tree (report/processes.rs: each process once, under its parent,
//! with how it ended and what it left), then the program's process in
//! full, then, with `--children`, each other process in full.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::{Followed, ReportOpts, Reported};
use crate::report::processes::{self, ImageFacts, ProcessNode};
use crate::report::{allocators, Report};
use crate::symbolize::Symbolizer;
use crate::trace::Trace;

/// How [`report_processes`] reports.
#[derive(Clone, Default)]
pub struct Reporting {
    /// What the program's report names as its trace instead of the file
    /// read (`client`: the received stream's temporary file is deleted,
    /// so the file it was saved to, or that it was not kept).
    pub main_trace: Option<String>,
    /// Said after the program's trace's path in its report, in
    /// parentheses (`run`: the file is temporary, removed at the end).
    pub trace_note: Option<String>,
    /// The traces are kept (their folder is named at the end), so no hint
    /// is given about keeping them.
    pub kept: bool,
    /// After the program's report, each other process's in full
    /// (`--children`; text only).
    pub children: bool,
}

/// Writes the report of process `pid`'s trace in `dir` (its last image,
/// after any exec), preceded by the tree of every process traced there
/// when there was more than one. Returns the report, if `pid` wrote a
/// trace, and the files asked for that could not be written. `kept`: a
/// trace already read ([`super::Following`]), reported instead of reading
/// its file again when it is that last image.
pub fn report_processes(
    dir: &Path,
    pid: u32,
    opts: &ReportOpts,
    how: Reporting,
    kept: Option<Followed>,
    out: &mut dyn Write,
) -> Result<Reported> {
    let traces = traces_in(dir)?;
    let main = traces.iter().filter(|i| i.pid == pid).max_by_key(|i| i.start).map(|i| i.path.clone());
    // The program's trace as read while it ran, unless it went on in
    // another image (an exec) after the one read.
    let load = |path: &Path| match kept.filter(|k| k.path == path) {
        Some(k) => k.into_loaded(),
        None => opts.load(path),
    };
    let name = |r: &mut Report| {
        if let Some(n) = &how.main_trace {
            r.trace = n.clone();
        } else if let Some(note) = &how.trace_note {
            r.trace = format!("{} ({note})", r.trace);
        }
    };
    if traces.iter().all(|i| i.pid == pid) {
        return match main {
            Some(path) => opts.report_loaded(load(&path)?, Some(out), |_, _, r| name(r)),
            None => no_trace(pid, out).map(|()| Reported::default()),
        };
    }
    // The other images' facts (each trace read whole), the program's
    // last image's from its report's reading below.
    let sym = opts.symbolizer();
    let others: Vec<ImageFacts> = traces
        .iter()
        .filter(|i| Some(&i.path) != main.as_ref())
        .take(FACTS_READ)
        .filter_map(|i| crate::input::load(&i.path).ok().map(|t| facts(&t, &i.path, &sym)))
        .collect();
    let mut reported = match &main {
        Some(path) => opts.report_loaded(load(path)?, Some(&mut *out), |t, sym, r| {
            let mut all = others.clone();
            all.push(facts(t, path, sym));
            r.processes = Some(processes::tree(all, pid));
            name(r);
        })?,
        None => {
            let tree = processes::tree(others.clone(), pid);
            if opts.json {
                serde_json::to_writer_pretty(&mut *out, &serde_json::json!({ "processes": tree }))?;
                writeln!(out)?;
            } else {
                crate::output::processes::write_tree(&tree, out)?;
            }
            no_trace(pid, out)?;
            Reported::default()
        }
    };
    if opts.json {
        return Ok(reported);
    }
    let tree = reported.report.as_ref().and_then(|r| r.processes.clone()).unwrap_or_default();
    let mut rest = Vec::new();
    flatten(&tree, &mut rest);
    if how.children {
        for p in rest.iter().filter(|p| !p.reported) {
            let Some(last) = p.images.last() else { continue };
            writeln!(out, "\n{}", "=".repeat(72))?;
            let child = opts.report(&last.trace, Some(&mut *out))?;
            reported.unwritten.extend(child.unwritten);
        }
    } else if !how.kept && rest.iter().any(|p| !p.reported && p.not_freed_blocks > 0) {
        writeln!(
            out,
            "\nOther processes left blocks not freed: --children reports each in full, \
             --keep-traces keeps their traces for mtrace report"
        )?;
    }
    Ok(reported)
}

/// Says that process `pid` wrote no trace, and the likely causes.
fn no_trace(pid: u32, out: &mut dyn Write) -> Result<()> {
    Ok(writeln!(out, "mtrace: no trace was written for pid {pid} (static executable, or preloading failed)")?)
}

/// Every node of `tree`, depth first.
fn flatten<'a>(tree: &'a [ProcessNode], out: &mut Vec<&'a ProcessNode>) {
    for p in tree {
        out.push(p);
        flatten(&p.children, out);
    }
}

/// Traces read whole for the tree at the most (pyenv's python3 is 78
/// shell processes before the interpreter): the rest are left out of it.
const FACTS_READ: usize = 500;

/// What trace `t` (at `path`) says of its image, for the tree.
fn facts(t: &Trace, path: &Path, sym: &Symbolizer) -> ImageFacts {
    let not_freed = t.books.live().fold((0, 0), |acc, l| (acc.0 + l.bytes, acc.1 + l.blocks));
    ImageFacts {
        header: t.header.clone(),
        path: path.to_owned(),
        end: t.end,
        exec: t.exec.clone(),
        spawned: t.spawned.clone(),
        allocations: t.books.allocations,
        not_freed,
        // Not the whole answer where mtrace was blind to an allocator.
        blind: !allocators::notices(t, &allocators::survey(t, sym)).is_empty(),
        running: t.end.is_none() && crate::report::processes::holds_open(t.header.pid, path),
    }
}

/// One trace in the folder: a process's image from a start or an exec,
/// as its header says.
pub(super) struct Image {
    pub(super) pid: u32,
    /// `start_monotonic_ns` of the header.
    pub(super) start: u64,
    pub(super) path: PathBuf,
}

/// The traces in `dir`, oldest first.
pub(super) fn traces_in(dir: &Path) -> Result<Vec<Image>> {
    traces_named(dir, "")
}

/// [`traces_in`], of the files whose name contains `part` only (the
/// others are not opened).
pub(super) fn traces_named(dir: &Path, part: &str) -> Result<Vec<Image>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if !path.file_name().is_some_and(|n| n.to_string_lossy().contains(part)) {
            continue;
        }
        let Ok(f) = std::fs::File::open(&path) else { continue };
        let mut r = mtrace_format::Reader::new(f);
        if let Ok(h) = r.header() {
            v.push(Image { pid: h.pid, start: h.start_monotonic_ns, path });
        }
    }
    v.sort_by_key(|i| i.start);
    Ok(v)
}
