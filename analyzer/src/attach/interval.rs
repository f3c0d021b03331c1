//! `mtrace attach --interval D`: memleax's and bcc memleak's view while
//! the process runs. Every D, the backtraces whose blocks have stayed live
//! longer than `--older-than` (default D), most bytes first: a leak that
//! grows shows up there interval after interval. The views read books
//! that follow the stream as it comes (`mtrace_analysis::input::live`): an interval
//! costs what came in it, never a reading of the trace from its start.

use std::io::Write;
use std::path::Path;

use anyhow::Result;

use mtrace_analysis::output::words::{frame_line, plural};
use mtrace_analysis::symbolize::Symbolizer;
use mtrace_analysis::trace::Trace;

/// Backtraces listed per interval.
const TOP: usize = 10;
/// Frames shown per backtrace.
const FRAMES: usize = 4;

/// Writes the pprof heap profile of the books `t` so far to `dir`, as
/// `PROG.PID.SEQ.pb.gz`; returns its path.
pub fn pprof(
    t: &Trace,
    sym: &mut Symbolizer,
    depth: Option<usize>,
    dir: &Path,
    seq: u64,
) -> Result<std::path::PathBuf> {
    let prog = Path::new(&t.header.exe).file_name().map_or("program".into(), |n| n.to_string_lossy());
    let path = dir.join(format!("{prog}.{}.{seq}.pb.gz", t.header.pid));
    let mut w = mtrace_analysis::output::open(Some(&path))?;
    mtrace_analysis::output::pprof::write(t, None, sym, depth, &mut w)?;
    w.flush()?;
    Ok(path)
}

/// Writes one interval's view of the books `t` so far to `out`.
pub fn print(t: &Trace, sym: &mut Symbolizer, older_than_ns: u64, out: &mut dyn Write) -> Result<()> {
    let cutoff = t.last_time.saturating_sub(older_than_ns);
    let by_stack = t.books.live_by_backtrace(|b| b.time < cutoff);
    let mut rows: Vec<(u32, u64, u64)> = by_stack.into_iter().map(|(s, (bytes, blocks))| (s, bytes, blocks)).collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let (bytes, blocks) = rows.iter().fold((0, 0), |acc, r| (acc.0 + r.1, acc.1 + r.2));
    let sampled = match t.books.sample_rate {
        0 => String::new(),
        r => format!(" (estimated, sampled at {})", mtrace_analysis::output::words::size_unit(r)),
    };
    writeln!(
        out,
        "[{:.1} s] live for more than {:.1} s: {} in {}, {}{sampled}",
        t.last_time as f64 / 1e9,
        older_than_ns as f64 / 1e9,
        plural(bytes, "byte", "bytes"),
        plural(blocks, "block", "blocks"),
        plural(rows.len() as u64, "backtrace", "backtraces")
    )?;
    for (i, &(s, bytes, blocks)) in rows.iter().take(TOP).enumerate() {
        writeln!(out, "  #{}: {} in {}", i + 1, plural(bytes, "byte", "bytes"), plural(blocks, "block", "blocks"))?;
        let frames = mtrace_analysis::report::stack_frames(t, sym, s, None);
        for (j, f) in frames.iter().take(FRAMES).enumerate() {
            writeln!(out, "  {}", frame_line(f, j == 0))?;
        }
    }
    out.flush()?;
    Ok(())
}
