//! `mtrace [PROG] LOG`: the "Memory not freed" table the way glibc's mtrace
//! script prints it, with callers resolved to file:line and function.

use std::io::Write;

use crate::books::Block;
use crate::input::glibc_log::Complaint;
use crate::symbolize::Symbolizer;
use crate::trace::Trace;

/// `mtrace [PROG] LOG`: glibc's table of the blocks `t` (a log read by
/// `input::glibc_log::load_with_complaints`) did not free, callers
/// resolved, after the log's `complaints`. Returns whether anything was
/// found (leaks or complaints), which is the script's exit status.
pub fn print_compat(t: &Trace, complaints: &[Complaint], out: &mut dyn Write) -> std::io::Result<bool> {
    for c in complaints {
        writeln!(out, "{}", c.text)?;
    }
    let mut sym = Symbolizer::new(Default::default());
    let mut blocks: Vec<(u64, Block)> = t.books.live_blocks().collect();
    blocks.sort_by_key(|(a, _)| *a);
    if !blocks.is_empty() {
        writeln!(out, "\nMemory not freed:\n-----------------\n           Address     Size     Caller")?;
    }
    for (addr, b) in &blocks {
        let frames =
            t.stacks.frames[b.stack as usize].first().map(|&a| sym.frames(&t.modules, a, 0)).unwrap_or_default();
        let caller = match frames.first() {
            Some(f) => match (&f.file, f.line, &f.function) {
                (Some(file), Some(line), Some(func)) => format!("{file}:{line} ({func})"),
                (Some(file), Some(line), None) => format!("{file}:{line}"),
                (_, _, Some(func)) => format!("{func} ({}+{:#x})", f.module, f.offset),
                _ => format!("{}+{:#x}", f.module, f.offset),
            },
            None => "???".to_owned(),
        };
        writeln!(out, "{addr:#018x} {:#8x}  at {caller}", b.size)?;
    }
    let anything = !blocks.is_empty() || !complaints.is_empty();
    if !anything {
        writeln!(out, "No memory leaks.")?;
    }
    Ok(anything)
}
