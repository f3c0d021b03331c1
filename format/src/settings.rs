//! The environment variables the producers read (`MTRACE_*`): name,
//! values, default and a line of help, defined once. Those of the
//! recording configuration are defined with its fields in
//! [`crate::recording`] and re-exported here; the rest are the plumbing of
//! `mtrace run` (`MTRACE_BIN`, `MTRACE_LIB`, `MTRACE_WARN_DIR`), the
//! analyzer's symbol cache (`MTRACE_SYMBOL_CACHE`) and the ptrace tracer's
//! own knobs. `mtrace` prints [`help`] in `mtrace run
//! --help`; a test checks the guide's table (docs/GUIDE.md) against [`documented`].

pub use crate::recording::{
    parse_signal, Setting, CHECK_FREES, CLOCK, DEPTH, FOLLOW_EXEC, FOLLOW_FORK, FREERES, OUTPUT, REPORT_DIR,
    REPORT_SIGNAL, SAMPLE_RATE, SAMPLE_SEED, SCAN, SCAN_SIGNAL, SIGNALS, START, TEST_ORDER, UNWINDER,
};

macro_rules! setting {
    ($id:ident, $var:literal, $values:literal, $help:literal) => {
        #[doc = $help]
        pub const $id: Setting = Setting { var: $var, values: $values, option: "", help: $help };
    };
}

setting!(BIN, c"MTRACE_BIN", "PATH", "the mtrace binary that writes .memlog reports (`run` sets it)");
setting!(LIB, c"MTRACE_LIB", "PATH", "the libmtrace.so that `run` preloads (default: next to mtrace)");
setting!(
    SYMBOL_CACHE,
    c"MTRACE_SYMBOL_CACHE",
    "DIR|off",
    "the folder where mtrace keeps symbolized frames between reports (default ~/.cache/mtrace/symbols)"
);
setting!(WARN_DIR, c"MTRACE_WARN_DIR", "DIR", "`run` sets it: a warning every process would print is printed once");
setting!(
    PTRACE_STACK,
    c"MTRACE_PTRACE_STACK",
    "BYTES",
    "--ptrace with uprobes: stack bytes copied per call (docs/PTRACE.md)"
);
setting!(PTRACE_STATS, c"MTRACE_PTRACE_STATS", "1", "--ptrace: the tracer's counters on stderr at the end");

/// The settings a user sets, in the order of the help (the guide's table
/// lists the same): every setting of the recording but the tests' own,
/// then where `mtrace run` finds its parts.
pub fn documented() -> Vec<Setting> {
    let recording = crate::recording::Recording::SETTINGS.iter().filter(|s| s.name() != TEST_ORDER.name());
    recording.copied().chain([BIN, LIB]).collect()
}

/// The lines of `mtrace run --help`'s environment section.
pub fn help() -> String {
    let mut out =
        String::from("Environment (read by libmtrace.so; an invalid value warns once and the default is used):\n");
    for s in documented() {
        let left = format!("{}={}", s.name(), s.values);
        let option = if s.option.is_empty() { String::new() } else { format!(" (run: {})", s.option) };
        out.push_str(&format!("  {left:<28}{}{option}\n", s.help));
    }
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::documented;
    use crate::recording::Recording;

    /// The guide's table of variables (docs/GUIDE.md): (name without `MTRACE_`, default
    /// cell, meaning cell).
    fn guide_rows() -> Vec<(String, String, String)> {
        let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/GUIDE.md")).unwrap();
        guide
            .lines()
            .filter_map(|l| l.strip_prefix("| `MTRACE_"))
            .map(|l| {
                let cells: Vec<&str> = l.split(" | ").collect();
                let name = cells[0].trim_end_matches('`').to_owned();
                (name, cells[1].trim().to_owned(), cells.get(2).unwrap_or(&"").to_string())
            })
            .collect()
    }

    #[test]
    fn the_guides_table_lists_exactly_the_documented_settings() {
        let mut in_guide: Vec<String> = guide_rows().into_iter().map(|r| r.0).collect();
        in_guide.sort_unstable();
        let mut ours: Vec<&str> = documented().iter().map(|s| &s.name()["MTRACE_".len()..]).collect();
        ours.sort_unstable();
        assert_eq!(in_guide, ours);
    }

    /// Each row of the guide's table says the recording's default (read back by the
    /// setting's own parser, where the default has a spelling) and names
    /// the option of `mtrace run` that sets it.
    #[test]
    fn the_guides_defaults_and_options_are_the_recordings() {
        let rows = guide_rows();
        let defaults = Recording::default().rendered();
        for (s, rendered) in defaults {
            let Some((_, default, meaning)) = rows.iter().find(|r| s.name()["MTRACE_".len()..] == r.0) else {
                continue;
            };
            if !rendered.is_empty() {
                let cell = default.trim_matches('`');
                let mut warnings = Vec::new();
                let read =
                    Recording::from_vars(|v| (v == s.var).then(|| cell.to_owned()), |w| warnings.push(w.to_owned()));
                assert_eq!(
                    (read, warnings),
                    (Recording::default(), vec![]),
                    "{}: the guide's default {default}",
                    s.name()
                );
            }
            if !s.option.is_empty() {
                assert!(meaning.contains(&format!("`mtrace run {}", s.option)), "{}: {meaning}", s.name());
            }
        }
    }

    #[test]
    fn the_help_has_a_line_each() {
        let h = super::help();
        assert_eq!(h.lines().count(), documented().len() + 1);
        assert!(
            h.contains("\n  MTRACE_DEPTH=N              frames per backtrace, 1-256 (default 64) (run: -d)"),
            "{h}"
        );
        for s in documented() {
            assert!(h.lines().any(|l| l.contains(s.name()) && l.contains(s.help)), "{}", s.name());
        }
    }
}
