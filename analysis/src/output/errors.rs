//! The wrong frees as text (memcheck's wording: "Invalid free() / delete /
//! delete[] / realloc()", "Mismatched free() / delete / delete []").

use std::io::{self, Write};

use super::words::{frames, plural, thousands};
use crate::books::wrong::WrongKind;
use crate::report::errors::{counts, ErrorEntry};

/// What the entry's free did wrong, in a few words.
fn what(e: &ErrorEntry) -> String {
    let call = e.call;
    match (e.kind, &e.block) {
        (WrongKind::Mismatched, Some(b)) => format!("{call} of a block from {}", b.family),
        (WrongKind::Mismatched, None) => format!("{call} of a block from another family"),
        (WrongKind::DoubleFree, _) => format!("{call} of a block already freed (double free)"),
        (WrongKind::InvalidFree, _) => format!("{call} of an address that is no block's start (invalid free)"),
        (WrongKind::SizeMismatch, b) => {
            let told = thousands(e.told_size.unwrap_or(0));
            match b {
                Some(b) => format!("{call} told {told} bytes of a block of {}", thousands(b.size)),
                None => format!("{call} told {told} bytes"),
            }
        }
        (WrongKind::AlignMismatch, b) => {
            let told = alignment(e.told_align.unwrap_or(0));
            match b {
                Some(b) => format!("{call} told {told} of a block allocated with {}", alignment(b.align)),
                None => format!("{call} told {told}"),
            }
        }
    }
}

/// An alignment as the text says it (bytes; 0: none asked for).
fn alignment(a: u64) -> String {
    match a {
        0 => "the default alignment".to_owned(),
        u64::MAX => "an alignment that is no power of two".to_owned(),
        a => format!("alignment {}", thousands(a)),
    }
}

/// The section "Wrong frees" of the text report (nothing without any).
/// Writes the wrong frees, at most `callers` frames of each backtrace (see
/// [`super::words::shown`]).
pub fn write_text(errors: &[ErrorEntry], s: &super::Style, w: &mut dyn Write) -> io::Result<()> {
    if errors.is_empty() {
        return Ok(());
    }
    let (bad, mis) = counts(errors);
    writeln!(w, "\nWrong frees: {} double or invalid, {} mismatched:", thousands(bad), thousands(mis))?;
    for (i, e) in errors.iter().enumerate() {
        let times = plural(e.count, "time", "times");
        writeln!(w, "\n#{}: {}: {}, {times}", i + 1, e.kind.heading(), what(e))?;
        if e.free_frames.is_empty() {
            writeln!(w, "    (where it was freed: mtrace run -S records the backtraces of frees)")?;
        }
        frames(&e.free_frames, s, w)?;
        let Some(b) = &e.block else {
            writeln!(w, "  Address {:#x} is not inside any block the trace knows", e.address)?;
            continue;
        };
        let size = thousands(b.size);
        let offset = plural(b.offset, "byte", "bytes");
        if b.freed {
            writeln!(w, "  Address {:#x} is {offset} inside a block of size {size} free'd", e.address)?;
            if e.first_free_frames.is_empty() && b.offset == 0 {
                writeln!(w, "    (where: mtrace run -S records the backtraces of frees)")?;
            }
            frames(&e.first_free_frames, s, w)?;
            writeln!(w, "  Block was alloc'd at")?;
        } else {
            writeln!(w, "  Address {:#x} is {offset} inside a block of size {size} alloc'd", e.address)?;
        }
        frames(&e.alloc_frames, s, w)?;
    }
    Ok(())
}
