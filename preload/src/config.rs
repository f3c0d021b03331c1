//! Settings read from the environment once per session. A bad value prints
//! one warning naming the variable and falls back to the default.

use crate::sys;

/// Frames recorded per backtrace unless `MTRACE_DEPTH` says otherwise.
pub const DEFAULT_DEPTH: usize = 64;
/// Upper bound for `MTRACE_DEPTH`.
pub const MAX_DEPTH: usize = 256;

pub struct Config {
    /// Frames per backtrace, 1..=MAX_DEPTH.
    pub depth: usize,
    /// `MTRACE_OUTPUT`, unexpanded; `None` for the default name.
    pub output: Option<String>,
    /// `MTRACE_UNWINDER=libgcc`: use libgcc's unwinder instead of the fast one.
    pub libgcc_unwinder: bool,
}

pub fn load() -> Config {
    let depth = match sys::getenv(c"MTRACE_DEPTH") {
        None => DEFAULT_DEPTH,
        Some(v) => match v.trim().parse::<usize>() {
            Ok(d) if (1..=MAX_DEPTH).contains(&d) => d,
            _ => {
                sys::warn(&format!(
                    "MTRACE_DEPTH={v:?} is not a frame count from 1 to {MAX_DEPTH}; using {DEFAULT_DEPTH}"
                ));
                DEFAULT_DEPTH
            }
        },
    };
    let output = sys::getenv(c"MTRACE_OUTPUT").filter(|s| !s.is_empty());
    let libgcc_unwinder = match sys::getenv(c"MTRACE_UNWINDER").as_deref() {
        None | Some("fast") => false,
        Some("libgcc") => true,
        Some(v) => {
            sys::warn(&format!("MTRACE_UNWINDER={v:?} is neither \"fast\" nor \"libgcc\"; using fast"));
            false
        }
    };
    Config { depth, output, libgcc_unwinder }
}

/// Expands `%p` (pid), `%e` (program name) and `%%` in an output pattern.
pub fn expand(pattern: &str, pid: u32, prog: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('p') => out.push_str(&pid.to_string()),
            Some('e') => out.push_str(prog),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o)
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn expands_pid_and_name() {
        assert_eq!(super::expand("/t/%e.%p.mtrace", 42, "ls"), "/t/ls.42.mtrace");
        assert_eq!(super::expand("a%%b%x%", 1, "p"), "a%b%x%");
    }
}
