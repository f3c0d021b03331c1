//! `mtrace diff` as text.

use std::io::{self, Write};

use super::words::{frames, plural, thousands, NUM_CALLERS};
use crate::report::diff::Diff;

fn change(v: i64, one: &str, many: &str) -> String {
    let sign = if v > 0 {
        "+"
    } else if v < 0 {
        "-"
    } else {
        ""
    };
    let n = v.unsigned_abs();
    format!("{sign}{}", if n == 1 { format!("1 {one}") } else { format!("{} {many}", thousands(n)) })
}

/// The diff as text, at most `limit` backtraces.
pub fn write_text(d: &Diff, limit: usize, w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "mtrace diff")?;
    writeln!(w, "  old:              {}", d.old)?;
    writeln!(w, "  new:              {}", d.new)?;
    writeln!(
        w,
        "  not freed:        {} in {}",
        change(d.leaked_bytes, "byte", "bytes"),
        change(d.leaked_blocks, "block", "blocks")
    )?;
    writeln!(w, "  peak:             {}", change(d.peak_bytes, "byte", "bytes"))?;
    writeln!(w, "  allocation calls: {}", change(d.calls, "call", "calls"))?;
    for n in &d.notices {
        writeln!(w, "  WARNING: {n}")?;
    }
    if d.stacks.is_empty() {
        writeln!(w, "\nNo backtrace changed.")?;
        return Ok(());
    }
    let shown = d.stacks.len().min(limit);
    let n = plural(d.stacks.len() as u64, "backtrace", "backtraces");
    writeln!(w, "\nChanged, largest change in bytes not freed first ({n}; {shown} shown):")?;
    let style = super::Style { num_callers: NUM_CALLERS, ..Default::default() };
    for (i, c) in d.stacks.iter().take(limit).enumerate() {
        writeln!(
            w,
            "\n#{}: not freed {} in {}, peak {}, {}",
            i + 1,
            change(c.leaked_bytes, "byte", "bytes"),
            change(c.leaked_blocks, "block", "blocks"),
            change(c.peak_bytes, "byte", "bytes"),
            change(c.calls, "allocation call", "allocation calls")
        )?;
        frames(&c.frames, &style, w)?;
    }
    Ok(())
}
