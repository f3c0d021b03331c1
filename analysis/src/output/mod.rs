//! Every form a report takes, behind one [`Format`]: text, JSON, the HTML
//! page, collapsed stacks, the flamegraph SVG and pprof's heap profile;
//! and the forms of other
//! commands' results (`diff`'s text, glibc's table). Each report output is
//! a row of [`OUTPUTS`] (its name, its option, what it needs, how it is
//! written): a new one is a variant, a row and a module beside this one. The words every text shares are in [`words`].

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
    /// The form's row in [`OUTPUTS`].
    pub fn output(self) -> &'static Output {
        OUTPUTS.iter().find(|o| o.format == self).expect("every format has its row (tested)")
    }

    /// Whether the form shows the report model; the others read the
    /// trace's books only, and a command that writes nothing else need not
    /// build the model (nor run the scan).
    pub fn needs_report(self) -> bool {
        self.output().needs_report
    }

    /// The format's name in messages.
    pub fn name(self) -> &'static str {
        self.output().name
    }
}

/// One output as the registry lists it: its name, the option that writes
/// it to a file of its own, what it needs beside the trace, and how it is
/// written. A new output is a variant of [`Format`], its row in
/// [`OUTPUTS`] and its module; every command that reports (`report`,
/// `run`, `attach`, `client`) has its option then.
pub struct Output {
    /// The form.
    pub format: Format,
    /// Its name in messages.
    pub name: &'static str,
    /// The long option (without `--`) that writes it to FILE, `-` for
    /// standard output; `None` for the command's own output (text, or
    /// JSON with `--json`).
    pub flag: Option<&'static str>,
    /// The option's help (`--help`, the man pages).
    pub help: &'static str,
    /// It shows the report model ([`Format::needs_report`]).
    pub needs_report: bool,
    /// It shows the leak kinds without the model (pprof's `kind` label):
    /// the scan runs for it.
    pub needs_classes: bool,
    /// It shows the blocks' lifetimes, read with the trace (the HTML
    /// page's time ranges).
    pub needs_lifetimes: bool,
    /// Writes the form of `src` to `w`.
    pub render: fn(&mut Sources, &mut Symbolizer, &Style, &mut dyn Write) -> io::Result<()>,
}

/// Every output, the command's own first.
pub const OUTPUTS: [Output; 6] = [
    Output {
        format: Format::Text,
        name: "text",
        flag: None,
        help: "The text report (memcheck's wording)",
        needs_report: true,
        needs_classes: false,
        needs_lifetimes: false,
        render: render_text,
    },
    Output {
        format: Format::Json,
        name: "JSON",
        flag: None,
        help: "The report model as one JSON document",
        needs_report: true,
        needs_classes: false,
        needs_lifetimes: false,
        render: render_json,
    },
    Output {
        format: Format::Html,
        name: "HTML page",
        flag: Some("html"),
        help: "Also write the report as one self-contained HTML page to FILE: memory over time, flamegraphs, \
               what a time range left live, the tables (`mtrace report`: instead of the text)",
        needs_report: true,
        needs_classes: false,
        needs_lifetimes: true,
        render: render_html,
    },
    Output {
        format: Format::Folded,
        name: "collapsed stacks",
        flag: Some("folded"),
        help: "Also write the collapsed stacks of --cost to FILE (flamegraph.pl's, inferno's and speedscope's \
               input; `mtrace report`: instead of the text); `-`: standard output",
        needs_report: false,
        needs_classes: false,
        needs_lifetimes: false,
        render: render_folded,
    },
    Output {
        format: Format::Flamegraph,
        name: "flamegraph",
        flag: Some("flamegraph"),
        help: "Also write an interactive flamegraph SVG of --cost to FILE (`mtrace report`: instead of the \
               text); `-`: standard output",
        needs_report: false,
        needs_classes: false,
        needs_lifetimes: false,
        render: render_flamegraph,
    },
    Output {
        format: Format::Pprof,
        name: "pprof profile",
        flag: Some("pprof"),
        help: "Also write a pprof heap profile to FILE (gzip-compressed profile.proto: alloc and in-use objects \
               and bytes per backtrace, the leak kind as label `kind`; `mtrace report`: instead of the text); \
               `-`: standard output",
        needs_report: false,
        needs_classes: true,
        needs_lifetimes: false,
        render: render_pprof,
    },
];

/// The report of `src`, or `InvalidInput` naming form `f` when none was
/// built.
fn report_of<'s>(src: &'s mut Sources, f: Format) -> io::Result<&'s mut Report> {
    let name = f.name();
    src.report
        .as_deref_mut()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{name}: no report was built")))
}

fn render_text(src: &mut Sources, _: &mut Symbolizer, style: &Style, w: &mut dyn Write) -> io::Result<()> {
    text::write_text(report_of(src, Format::Text)?, style, w)
}

fn render_json(src: &mut Sources, _: &mut Symbolizer, _: &Style, w: &mut dyn Write) -> io::Result<()> {
    json(&*report_of(src, Format::Json)?, w)
}

fn render_html(src: &mut Sources, sym: &mut Symbolizer, style: &Style, w: &mut dyn Write) -> io::Result<()> {
    let t = src.trace;
    html::write(t, report_of(src, Format::Html)?, sym, style.depth, w)
}

fn render_folded(src: &mut Sources, sym: &mut Symbolizer, style: &Style, w: &mut dyn Write) -> io::Result<()> {
    for l in flame::folded(src.trace, sym, style.cost, style.depth) {
        writeln!(w, "{l}")?;
    }
    Ok(())
}

fn render_flamegraph(src: &mut Sources, sym: &mut Symbolizer, style: &Style, w: &mut dyn Write) -> io::Result<()> {
    let t = src.trace;
    let lines = flame::folded(t, sym, style.cost, style.depth);
    flame::flamegraph(&lines, style.cost, &t.header.exe, style.icicle, w)
}

fn render_pprof(src: &mut Sources, sym: &mut Symbolizer, style: &Style, w: &mut dyn Write) -> io::Result<()> {
    pprof::write(src.trace, src.classes, sym, style.depth, w)
}

/// How an output presents the report, which is the same whatever reads
/// it: the recorded frames kept per backtrace, the frames the text shows,
/// whether the text has heaptrack's sections, what a flamegraph measures
/// and which way up it is. [`Default`]: every frame, no sections, bytes
/// not freed, roots at the bottom.
#[derive(Clone, Debug)]
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
    /// The program's own allocation wrappers (`wrapper:` lines of the
    /// suppressions file), folded in the text with the allocator's.
    pub wrappers: Vec<String>,
}

impl Default for Style {
    fn default() -> Style {
        Style {
            depth: None,
            num_callers: 0,
            sections: false,
            cost: flame::Cost::Leaked,
            icicle: false,
            wrappers: Vec::new(),
        }
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

/// Writes form `f` of `src` to `w`, by its row's `render`. Asking for a
/// form that [`Format::needs_report`] without a report is an
/// `InvalidInput` error.
pub fn write(f: Format, src: &mut Sources, sym: &mut Symbolizer, style: &Style, w: &mut dyn Write) -> io::Result<()> {
    (f.output().render)(src, sym, style, w)
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

#[cfg(test)]
mod tests {
    use super::{Format, OUTPUTS};

    /// Each format has one row, and each option one format.
    #[test]
    fn every_format_has_one_row() {
        let all = [Format::Text, Format::Json, Format::Html, Format::Folded, Format::Flamegraph, Format::Pprof];
        for f in all {
            assert_eq!(OUTPUTS.iter().filter(|o| o.format == f).count(), 1, "{f:?}");
        }
        assert_eq!(OUTPUTS.len(), all.len());
        let mut flags: Vec<&str> = OUTPUTS.iter().filter_map(|o| o.flag).collect();
        flags.sort_unstable();
        flags.dedup();
        assert_eq!(flags, ["flamegraph", "folded", "html", "pprof"]);
    }
}
