//! The environment variables the producers read (`MTRACE_*`): name,
//! values, default and a line of help, defined once. The preload's config
//! reads them by these names, `mtrace` sets them by these names and prints
//! [`help`] in `mtrace run --help`; a test checks README's table against
//! [`DOCUMENTED`].

use std::ffi::CStr;

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The variable, NUL-terminated for `getenv`.
    pub var: &'static CStr,
    /// Its values as the help shows them (`on|off`, `N`, `PATH`).
    pub values: &'static str,
    /// One line of help: what it does and its default.
    pub help: &'static str,
}

impl Setting {
    /// The variable's name.
    pub fn name(&self) -> &'static str {
        self.var.to_str().unwrap_or("")
    }
}

/// The signal names the signal settings accept (`MTRACE_REPORT_SIGNAL`,
/// `MTRACE_SCAN_SIGNAL`), with or without `SIG`, and their numbers on this
/// host.
pub const SIGNALS: [(&str, i32); 6] = [
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("HUP", libc::SIGHUP),
    ("PROF", libc::SIGPROF),
    ("URG", libc::SIGURG),
    ("WINCH", libc::SIGWINCH),
];

/// A signal setting's value: `Some(Some(n))` for a signal (a name of
/// [`SIGNALS`], or a number from 1 to below SIGRTMAX), `Some(None)` for
/// `off`, `None` for anything else. The preload, the ptrace tracer and
/// `mtrace run` (which passes these signals on) read them alike.
pub fn parse_signal(v: &str) -> Option<Option<i32>> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("off") {
        return Some(None);
    }
    if let Ok(n) = v.parse::<i32>() {
        return (1..libc::SIGRTMAX()).contains(&n).then_some(Some(n));
    }
    let name = v.strip_prefix("SIG").unwrap_or(v);
    SIGNALS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, s)| Some(s))
}

macro_rules! setting {
    ($id:ident, $var:literal, $values:literal, $help:literal) => {
        #[doc = $help]
        pub const $id: Setting = Setting { var: $var, values: $values, help: $help };
    };
}

setting!(
    OUTPUT,
    c"MTRACE_OUTPUT",
    "PATH",
    "trace file (%p pid, %e program) or unix:PATH / tcp:HOST:PORT; `run` sets it"
);
setting!(DEPTH, c"MTRACE_DEPTH", "N", "frames per backtrace, 1-256 (default 64; `run -d` sets it)");
setting!(START, c"MTRACE_START", "on|off", "off: record no allocations until mtrace_start() or mtrace()");
setting!(SCAN, c"MTRACE_SCAN", "0|1", "1: memory snapshot at exit for the leak scan (`run` sets it unless --no-scan)");
setting!(CHECK_FREES, c"MTRACE_CHECK_FREES", "0|1", "1: frees record their backtraces too (`run -S`)");
setting!(
    FREERES,
    c"MTRACE_FREERES",
    "on|off",
    "off: glibc's __libc_freeres() is not called at exit (`run --run-libc-freeres=no`)"
);
setting!(
    SCAN_SIGNAL,
    c"MTRACE_SCAN_SIGNAL",
    "SIG",
    "signal that scans for leaks now and writes a .memlog (default off)"
);
setting!(
    SAMPLE_RATE,
    c"MTRACE_SAMPLE_RATE",
    "BYTES",
    "sample one allocation per BYTES allocated on average (512K, 2M; default 0: every one; `--sample-rate`)"
);
setting!(
    SAMPLE_SEED,
    c"MTRACE_SAMPLE_SEED",
    "N",
    "seed of the sample points (default: from the clock); for repeatable tests"
);
setting!(FOLLOW_FORK, c"MTRACE_FOLLOW_FORK", "on|off", "off: forked children run untraced");
setting!(FOLLOW_EXEC, c"MTRACE_FOLLOW_EXEC", "on|off", "off: programs this one execs run untraced");
setting!(REPORT_SIGNAL, c"MTRACE_REPORT_SIGNAL", "SIG", "signal that writes an incremental report (default USR1; off)");
setting!(REPORT_DIR, c"MTRACE_REPORT_DIR", "DIR", "where <program>-<pid>-<n>.memlog reports go (default: cwd)");
setting!(UNWINDER, c"MTRACE_UNWINDER", "U", "fast, libgcc, or check (both, differences on stderr); default fast");
setting!(CLOCK, c"MTRACE_CLOCK", "tsc|monotonic", "event clock (default tsc where the TSC is invariant)");
setting!(BIN, c"MTRACE_BIN", "PATH", "the mtrace binary that writes .memlog reports (`run` sets it)");
setting!(LIB, c"MTRACE_LIB", "PATH", "the libmtrace.so that `run` preloads (default: next to mtrace)");
setting!(WARN_DIR, c"MTRACE_WARN_DIR", "DIR", "`run` sets it: a warning every process would print is printed once");
setting!(
    TEST_ORDER,
    c"MTRACE_TEST_ORDER",
    "SPEC",
    "tests only: stall=K:US and/or collect=reverse|exited-last|shuffle perturb the writer's order"
);
setting!(
    PTRACE_STACK,
    c"MTRACE_PTRACE_STACK",
    "BYTES",
    "--ptrace with uprobes: stack bytes copied per call (docs/PTRACE.md)"
);
setting!(PTRACE_STATS, c"MTRACE_PTRACE_STATS", "1", "--ptrace: the tracer's counters on stderr at the end");

/// The settings a user sets, in the order of the help and README's table.
pub const DOCUMENTED: &[Setting] = &[
    OUTPUT,
    DEPTH,
    START,
    SCAN,
    CHECK_FREES,
    FREERES,
    SCAN_SIGNAL,
    SAMPLE_RATE,
    SAMPLE_SEED,
    FOLLOW_FORK,
    FOLLOW_EXEC,
    REPORT_SIGNAL,
    REPORT_DIR,
    UNWINDER,
    CLOCK,
    BIN,
    LIB,
];

/// The lines of `mtrace run --help`'s environment section.
pub fn help() -> String {
    let mut out =
        String::from("Environment (read by libmtrace.so; an invalid value warns once and the default is used):\n");
    for s in DOCUMENTED {
        let left = format!("{}={}", s.name(), s.values);
        out.push_str(&format!("  {left:<28}{}\n", s.help));
    }
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::DOCUMENTED;

    #[test]
    fn readmes_table_lists_exactly_the_documented_settings() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
        let mut in_readme: Vec<&str> =
            readme.lines().filter_map(|l| l.strip_prefix("| `MTRACE_")).filter_map(|l| l.split('`').next()).collect();
        in_readme.sort_unstable();
        let mut ours: Vec<&str> = DOCUMENTED.iter().map(|s| &s.name()["MTRACE_".len()..]).collect();
        ours.sort_unstable();
        assert_eq!(in_readme, ours);
    }

    #[test]
    fn the_help_has_a_line_each() {
        let h = super::help();
        assert_eq!(h.lines().count(), DOCUMENTED.len() + 1);
        assert!(h.contains("\n  MTRACE_DEPTH=N              frames per backtrace, 1-256"), "{h}");
    }
}
