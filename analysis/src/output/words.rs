//! The words every text output shares: numbers with thousands separators,
//! plurals, durations, and a backtrace's frames the way memcheck shows them.

use std::io::{self, Write};

use crate::symbolize::Frame;

/// 1234567 → "1,234,567".
pub fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `n` and its noun: "1 block", "1,024 blocks".
pub fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// A count that may be a change: "+1,024 bytes", "-1 block"; plain when
/// `delta` is false.
pub fn count(n: i64, one: &str, many: &str, delta: bool) -> String {
    let sign = match (delta, n.signum()) {
        (true, 1) => "+",
        (_, -1) => "-",
        _ => "",
    };
    format!("{sign}{}", plural(n.unsigned_abs(), one, many))
}

/// ns as seconds with three decimals: "1.250 s".
pub fn secs(ns: u64) -> String {
    format!("{:.3} s", ns as f64 / 1e9)
}

/// One frame as memcheck shows it: `at`/`by`, address, function, file:line or module+offset, module.
pub fn frame_line(f: &Frame, first: bool) -> String {
    let lead = if first { "at" } else { "by" };
    let func = f.function.as_deref().unwrap_or("???");
    let loc = match (&f.file, f.line) {
        (Some(file), Some(line)) => format!(" ({file}:{line})"),
        (Some(file), None) => format!(" ({file})"),
        _ => format!(" ({}+{:#x})", f.module, f.offset),
    };
    let module = if f.file.is_some() { format!(" [{}]", f.module) } else { String::new() };
    let inl = if f.inlined { " (inlined)" } else { "" };
    format!("    {lead} {:#x}: {func}{loc}{module}{inl}", f.address)
}

/// A byte count in the unit it is a whole number of: `512 KiB`, `2 MiB`,
/// `1,000 bytes` (the form `--sample-rate` takes).
pub fn size_unit(b: u64) -> String {
    match b {
        0 => "0 bytes".into(),
        _ if b.is_multiple_of(1 << 30) => format!("{} GiB", thousands(b >> 30)),
        _ if b.is_multiple_of(1 << 20) => format!("{} MiB", thousands(b >> 20)),
        _ if b.is_multiple_of(1 << 10) => format!("{} KiB", thousands(b >> 10)),
        _ => plural(b, "byte", "bytes"),
    }
}

/// Bytes as MiB with one decimal.
pub fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// Frames of a backtrace the text shows by default (`--num-callers`):
/// valgrind's default, so that a report reads like memcheck's; the
/// allocating call and eleven callers reach the program's own code in the
/// programs we tried (python3's deepest leaks are interpreter frames).
pub const NUM_CALLERS: usize = 12;

/// The frames below a program's entry: glibc's below `main` (the
/// process's start) and below a thread's start routine, and Rust's
/// runtime below the program's `main` (std's backtrace marker; its names
/// before and after Rust 1.77). memcheck hides glibc's too
/// (`--show-below-main=no`).
const BELOW_ENTRY: [&str; 9] = [
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "__libc_start_main",
    "_start",
    "start_thread",
    "clone3",
    "clone",
    "std::sys::backtrace::__rust_begin_short_backtrace",
    "std::sys_common::backtrace::__rust_begin_short_backtrace",
];

/// The frames of `f` the text shows: up to the program's entry (`main`, a
/// thread's start routine: the frames of [`BELOW_ENTRY`] after it are
/// left out) and at most `callers` of them (0: all); and how many of the
/// frames up to the entry that leaves out.
pub fn shown(f: &[Frame], callers: usize) -> (&[Frame], usize) {
    let mut entry = f
        .iter()
        .skip(1)
        .position(|fr| fr.function.as_deref().is_some_and(|n| BELOW_ENTRY.contains(&n)))
        .map_or(f.len(), |i| i + 1);
    // Frames inlined into the first below the entry are below it too
    // (Rust's `FnOnce::call_once` into its backtrace marker).
    while entry > 1 && entry < f.len() && f[entry - 1].inlined && f[entry - 1].address == f[entry].address {
        entry -= 1;
    }
    let n = if callers == 0 { entry } else { entry.min(callers) };
    (&f[..n], entry - n)
}

/// Writes backtrace `f` one frame per line, as [`frame_line`] shapes them:
/// its leading allocation wrappers (`report::own_code`) folded into one
/// line, then the frames [`shown`] keeps of the rest, and "… N more
/// frames" where it cut.
/// `s` says how many frames (`num_callers`) and which wrappers are the
/// program's own.
pub fn frames(f: &[Frame], s: &super::Style, w: &mut dyn Write) -> io::Result<()> {
    let callers = s.num_callers;
    let folded = crate::report::own_code::leading_wrappers(f, &s.wrappers);
    if folded > 0 {
        let what = plural(folded as u64, "allocator frame", "allocator frames");
        writeln!(w, "    ({what}: the allocator's and its wrappers'; JSON has them)")?;
    }
    let (f, more) = shown(&f[folded..], callers);
    for (j, fr) in f.iter().enumerate() {
        writeln!(w, "{}", frame_line(fr, j == 0))?;
    }
    if more > 0 {
        writeln!(w, "    … {} (--num-callers)", plural(more as u64, "more frame", "more frames"))?;
    }
    Ok(())
}

/// `s` without Rust's " (os error N)" after each system error's words:
/// the words are the user's ("No such file or directory"), the number
/// is not.
pub fn without_os_error_codes(s: &str) -> String {
    const MARK: &str = " (os error ";
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(MARK) {
        let after = &rest[at + MARK.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        out.push_str(&rest[..at]);
        if digits > 0 && after[digits..].starts_with(')') {
            rest = &after[digits + 1..];
        } else {
            out.push_str(MARK);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn system_errors_lose_their_numbers_only() {
        let f = super::without_os_error_codes;
        assert_eq!(
            f("/x: cannot open: No such file or directory (os error 2)"),
            "/x: cannot open: No such file or directory"
        );
        assert_eq!(f("a (os error 21): b (os error 13)"), "a: b");
        assert_eq!(f("a (os error x) b (os error"), "a (os error x) b (os error");
    }
}
