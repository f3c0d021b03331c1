//! Every form a report takes, behind one [`Format`]: text, JSON, the HTML
//! page, collapsed stacks, the flamegraph SVG and pprof's heap profile;
//! and the forms of other
//! commands' results (`diff`'s text, glibc's table). A new output is a
//! variant here and a module beside this one; [`write`] is the one place
//! that chooses among them. The words every text shares are in [`words`].

pub mod diff;
pub mod errors;
pub mod flame;
pub mod glibc;
pub mod html;
pub mod pprof;
pub mod processes;
pub mod text;
pub mod words;

use std::io::{self, Write};
use std::path::Path;

use crate::report::Report;
use crate::scan::Classes;
use crate::symbolize::Symbolizer;
use crate::trace::Trace;

/// One form of a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The text report (memcheck's wording; [`text`]).
    Text,
    /// The report model as one pretty-printed JSON document.
    Json,
    /// One self-contained HTML page ([`html`]).
    Html,
    /// Collapsed stacks, one line per backtrace ([`flame::folded`]).
    Folded,
    /// An interactive flamegraph SVG ([`flame::flamegraph`]).
    Flamegraph,
    /// pprof's heap profile, gzip-compressed protobuf ([`pprof`]).
    Pprof,
}

impl Format {
    /// Whether the form shows the report model; the others read the
    /// trace's books only, and a command that writes nothing else need not
    /// build the model (nor run the scan).
    pub fn needs_report(self) -> bool {
        matches!(self, Format::Text | Format::Json | Format::Html)
    }

    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "JSON",
            Format::Html => "HTML",
            Format::Folded => "collapsed stacks",
            Format::Flamegraph => "flamegraph",
            Format::Pprof => "pprof profile",
        }
    }
}

/// How an output presents the report, which is the same whatever reads
/// it: the recorded frames kept per backtrace, the frames the text shows,
/// whether the text has heaptrack's sections, what a flamegraph measures
/// and which way up it is. [`Default`]: every frame, no sections, bytes
/// not freed, roots at the bottom.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    /// At most this many recorded frames per backtrace (`-d`).
    pub depth: Option<usize>,
    /// The text shows at most this many frames of a backtrace (0: all;
    /// `--num-callers`); JSON and HTML have every recorded frame.
    pub num_callers: usize,
    /// The text shows the report's sections (`--sections`; JSON always has
    /// them).
    pub sections: bool,
    /// What the widths of folded stacks and flamegraphs measure.
    pub cost: flame::Cost,
    /// Roots at the top.
    pub icicle: bool,
}

impl Default for Style {
    fn default() -> Style {
        Style { depth: None, num_callers: 0, sections: false, cost: flame::Cost::Leaked, icicle: false }
    }
}

/// What the outputs are made of: the trace, its report (`None` when no
/// form asked for needs it, [`Format::needs_report`]), and the leak scan's
/// classes of its blocks by address, when it has a snapshot.
pub struct Sources<'a> {
    /// The trace as read.
    pub trace: &'a Trace,
    /// Its report model.
    pub report: Option<&'a mut Report>,
    /// The leak scan's classes (`crate::pipeline::classify`).
    pub classes: Option<&'a Classes>,
}

/// Writes form `f` of `src` to `w`. Asking for a form that
/// [`Format::needs_report`] without a report is an `InvalidInput` error.
pub fn write(f: Format, src: &mut Sources, sym: &mut Symbolizer, style: &Style, w: &mut dyn Write) -> io::Result<()> {
    let t = src.trace;
    let r = src.report.as_deref_mut();
    let no_report = || io::Error::new(io::ErrorKind::InvalidInput, format!("{}: no report was built", f.name()));
    match f {
        Format::Text => text::write_text(r.ok_or_else(no_report)?, style, w),
        Format::Json => json(&*r.ok_or_else(no_report)?, w),
        Format::Html => html::write(t, r.ok_or_else(no_report)?, sym, style.depth, w),
        Format::Folded => {
            for l in flame::folded(t, sym, style.cost, style.depth) {
                writeln!(w, "{l}")?;
            }
            Ok(())
        }
        Format::Flamegraph => {
            let lines = flame::folded(t, sym, style.cost, style.depth);
            flame::flamegraph(&lines, style.cost, &t.header.exe, style.icicle, w)
        }
        Format::Pprof => pprof::write(t, src.classes, sym, style.depth, w),
    }
}

/// Any serializable result (a report, a diff, the markers) as one
/// pretty-printed JSON document and a newline.
pub fn json<T: serde::Serialize + ?Sized>(v: &T, w: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *w, v)?;
    writeln!(w)
}

/// Creates (or truncates) the file at `p` for a report, mode 0600 when
/// new; the error names the file.
pub fn create_private(p: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(p)
        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))
}

/// `w` behind a buffer: a file is unbuffered and stdout flushes at every
/// newline, so a report of 700,000 lines (cc1plus's, every backtrace) was
/// as many `write` calls. The caller flushes.
pub fn buffered(w: Box<dyn Write>) -> Box<dyn Write> {
    Box::new(io::BufWriter::with_capacity(1 << 16, w))
}

/// The file `p` (created as [`create_private`] does), or standard output,
/// buffered.
pub fn open(p: Option<&Path>) -> anyhow::Result<Box<dyn Write>> {
    Ok(buffered(match p {
        Some(p) => Box::new(create_private(p)?),
        None => Box::new(io::stdout().lock()),
    }))
}
