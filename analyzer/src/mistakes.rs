//! What a user probably meant: the command lines valgrind, heaptrack and
//! glibc users type first, answered with mtrace's own spelling instead of
//! a misleading error (issue 42).

use std::io::Read;
use std::path::Path;

/// For an option clap did not know (`--leak-check=full`, `-s`), the line
/// saying what mtrace calls it, when it is one of valgrind memcheck's
/// (valgrind 3.22 `--help`) or heaptrack's (1.5) habits; None otherwise.
pub fn valgrind_option(arg: &str) -> Option<&'static str> {
    let name = arg.split('=').next().unwrap_or(arg);
    let value = arg.split_once('=').map(|(_, v)| v);
    Some(match (name, value) {
        ("--leak-check", Some("no") | Some("summary")) => {
            "mtrace spells valgrind's --leak-check=no as --no-scan (every block not freed, no leak kinds)"
        }
        ("--leak-check", _) => "mtrace checks for leaks by default (the scan at exit): leave --leak-check out",
        ("--show-leak-kinds", _) => {
            "mtrace lists definitely, indirectly and possibly lost blocks by default; --show-reachable adds the still reachable ones"
        }
        ("--track-origins", _) | ("--undef-value-errors", _) => {
            "not applicable: mtrace traces allocations, not uninitialised values (that is memcheck's)"
        }
        ("--log-file", _) | ("--heaptrack-output", _) => "mtrace writes its report to a file with -o FILE",
        ("--xml", _) | ("--xml-file", _) => "mtrace writes JSON instead: --json (with -o FILE)",
        ("--gen-suppressions", _) => {
            "mtrace reads suppressions with --suppressions FILE (LeakSanitizer's leak:PATTERN lines); it does not write them"
        }
        ("-s" | "--show-error-list" | "-v" | "--verbose", _) => {
            "mtrace's report always lists each wrong free with its backtraces"
        }
        ("--trace-children", _) => {
            "mtrace traces every child by default; --children reports each in full after the program's"
        }
        ("--free-fill" | "--malloc-fill", _) => "not applicable: mtrace does not change the program's memory",
        ("--tool", _) => "mtrace is one tool: `mtrace run -- PROG` (or `mtrace run --help`)",
        ("--pid" | "-p", _) => "to trace a running process: mtrace attach PID",
        _ => return None,
    })
}

/// `mtrace [PROG] LOG` whose LOG is no glibc malloc trace log: what the
/// user probably meant, as one line, for the argument `args[1..]` (the
/// program's path first). None when the arguments name no file (clap then
/// says "unrecognized subcommand" with its suggestion).
pub fn not_a_log(args: &[String]) -> Option<String> {
    let first = args.get(1)?;
    let path = Path::new(first);
    let mut head = [0u8; 8];
    let n = std::fs::File::open(path).and_then(|mut f| f.read(&mut head)).ok()?;
    let head = &head[..n];
    let quoted: Vec<String> = args[1..].iter().map(|a| shell_word(a)).collect();
    let line = quoted.join(" ");
    if head == mtrace_format::MAGIC {
        return Some(format!("{first} is an mtrace trace: to read it, mtrace report {}", shell_word(first)));
    }
    if head.starts_with(b"\x7fELF") || is_executable(path) {
        return Some(format!("{first} is a program: to trace it, mtrace run -- {line}"));
    }
    Some(format!(
        "{first} is neither glibc's malloc trace log (MALLOC_TRACE's, it starts `= Start`) nor a trace of mtrace's; \
         to trace a program: mtrace run -- PROG; to read a trace: mtrace report FILE"
    ))
}

/// Whether `path` is a file anyone may execute (a script).
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// `w` as a POSIX shell reads it back: bare when it holds only safe
/// characters, single-quoted otherwise (empty too).
pub fn shell_word(w: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !w.is_empty() && w.chars().all(safe) {
        return w.to_owned();
    }
    format!("'{}'", w.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valgrinds_spellings_have_ours() {
        assert!(valgrind_option("--leak-check=full").unwrap().contains("by default"));
        assert!(valgrind_option("--leak-check=no").unwrap().contains("--no-scan"));
        assert!(valgrind_option("--show-leak-kinds=all").unwrap().contains("--show-reachable"));
        assert!(valgrind_option("--track-origins=yes").unwrap().starts_with("not applicable"));
        assert!(valgrind_option("-s").is_some());
        assert_eq!(valgrind_option("--bogus"), None);
    }

    #[test]
    fn shell_words_read_back() {
        assert_eq!(shell_word("./leaks"), "./leaks");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
    }
}
