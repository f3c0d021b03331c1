//! The recording configuration: what a producer records and how, typed
//! once for every producer and for `mtrace`'s commands that start one.
//!
//! One [`Recording`] is read from the `MTRACE_*` variables by the preload
//! (`Recording::from_vars`, its warnings printed once per run), built by
//! `mtrace run`, `server` and `attach` from their options (and the user's
//! variables), handed as it is to the ptrace tracer, and rendered back to
//! variables for a program the preload traces ([`Recording::vars`]) or to
//! the `NAME=value` lines `mtrace attach` gives the library.
//!
//! Adding a setting is one entry of the `recording!` list below: its field
//! and type, its variable (a [`Setting`], with the help line `mtrace run
//! --help` prints and the guide's table (docs/GUIDE.md) must list), its default, and its
//! parser. A test holds the guide's table, the help and the CLI to that entry.

use std::ffi::CStr;

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The variable, NUL-terminated for `getenv`.
    pub var: &'static CStr,
    /// Its values as the help shows them (`on|off`, `N`, `PATH`).
    pub values: &'static str,
    /// The option of `mtrace run` (and `server`, `attach` where they take
    /// it) that sets it, as written there (`-S`, `--sample-rate`); empty
    /// for none.
    pub option: &'static str,
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

/// Signals no setting may name: KILL and STOP cannot be caught, and the
/// faults' and abort's are the program's death (mtrace scans on the way
/// out, docs/SCAN.md), TRAP the breakpoints' of `--ptrace`.
const NOT_SETTABLE: [i32; 8] = [
    libc::SIGKILL,
    libc::SIGSTOP,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
    libc::SIGTRAP,
];

/// A signal setting's value: `Some(Some(n))` for a signal (a name of
/// [`SIGNALS`], or a number from 1 to below SIGRTMAX but those of
/// [`NOT_SETTABLE`]), `Some(None)` for `off`, `None` for anything else.
/// The preload, the ptrace tracer and `mtrace run` (which passes these
/// signals on) read them alike.
pub fn parse_signal(v: &str) -> Option<Option<i32>> {
    let v = v.trim();
    if v.eq_ignore_ascii_case("off") {
        return Some(None);
    }
    if let Ok(n) = v.parse::<i32>() {
        return ((1..libc::SIGRTMAX()).contains(&n) && !NOT_SETTABLE.contains(&n)).then_some(Some(n));
    }
    let name = v.strip_prefix("SIG").unwrap_or(v);
    SIGNALS.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, s)| Some(s))
}

/// Frames recorded per backtrace unless `MTRACE_DEPTH` (`-d`) says otherwise.
pub const DEFAULT_DEPTH: usize = 64;

/// The unwinder that records backtraces (`MTRACE_UNWINDER`); the closed
/// set the preload's `unwind` room matches on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unwinder {
    /// Cached CFI rules and the previous walk (preload/src/unwind/fast.rs).
    #[default]
    Fast,
    /// libgcc's `_Unwind_Backtrace`: slow, independent.
    Libgcc,
    /// Both on every event: records the fast one's backtrace, counts those
    /// where libgcc's differs, prints the first few and the count at exit.
    Check,
}

/// The clock that stamps events (`MTRACE_CLOCK`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Clock {
    /// The time stamp counter where it is invariant (and the kernel's
    /// clocksource), else CLOCK_MONOTONIC.
    #[default]
    Tsc,
    /// CLOCK_MONOTONIC always.
    Monotonic,
}

/// Perturbations of the stream's order for the tests of the analyzer's
/// merge (`MTRACE_TEST_ORDER`; test-only: they slow the program down and
/// change nothing a report shows). `stall=K:US` makes every K-th event of
/// each thread sleep US µs between its stamp and its push; `collect=MODE`
/// makes each collection take the threads' buffers in another order than
/// the threads registered: `reverse`, `exited-last` (the buffers of
/// exited threads after all others) or `shuffle`. Comma-separated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TestOrder {
    /// Every this many events a thread stalls; 0: never.
    pub stall_every: u64,
    /// How long a stall lasts, µs.
    pub stall_us: u64,
    /// The order a collection takes the threads' buffers in.
    pub collect: CollectOrder,
}

/// The order a collection takes the threads' buffers in ([`TestOrder`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CollectOrder {
    /// The order the threads registered in (the only one outside tests).
    #[default]
    Registered,
    /// The reverse of that.
    Reverse,
    /// The buffers of exited threads after all others.
    ExitedLast,
    /// A new random order every collection.
    Shuffle,
}

/// A setting's value as its variable spells it: [`Recording::vars`] writes
/// it, the setting's parser reads it back to the same value.
pub trait Render {
    /// The variable's text; empty for "unset" (the default).
    fn render(&self) -> String;
}

impl Render for bool {
    fn render(&self) -> String {
        if *self { "on" } else { "off" }.to_owned()
    }
}

impl Render for usize {
    fn render(&self) -> String {
        self.to_string()
    }
}

impl Render for u64 {
    fn render(&self) -> String {
        self.to_string()
    }
}

impl Render for Option<u64> {
    fn render(&self) -> String {
        self.map(|n| n.to_string()).unwrap_or_default()
    }
}

impl Render for Option<String> {
    fn render(&self) -> String {
        self.clone().unwrap_or_default()
    }
}

/// A signal setting: its name where [`SIGNALS`] has one, else its number;
/// `off` for none.
impl Render for Option<i32> {
    fn render(&self) -> String {
        match self {
            None => "off".to_owned(),
            Some(n) => {
                SIGNALS.iter().find(|(_, s)| s == n).map_or_else(|| n.to_string(), |(name, _)| (*name).to_owned())
            }
        }
    }
}

impl Render for Unwinder {
    fn render(&self) -> String {
        match self {
            Unwinder::Fast => "fast",
            Unwinder::Libgcc => "libgcc",
            Unwinder::Check => "check",
        }
        .to_owned()
    }
}

impl Render for Clock {
    fn render(&self) -> String {
        match self {
            Clock::Tsc => "tsc",
            Clock::Monotonic => "monotonic",
        }
        .to_owned()
    }
}

impl Render for TestOrder {
    fn render(&self) -> String {
        let mut parts = Vec::new();
        if self.stall_every > 0 {
            parts.push(format!("stall={}:{}", self.stall_every, self.stall_us));
        }
        let collect = match self.collect {
            CollectOrder::Registered => None,
            CollectOrder::Reverse => Some("reverse"),
            CollectOrder::ExitedLast => Some("exited-last"),
            CollectOrder::Shuffle => Some("shuffle"),
        };
        parts.extend(collect.map(|c| format!("collect={c}")));
        parts.join(",")
    }
}

/// The parsers of the list below: `None` for a value that is not one.
mod parse {
    use super::{Clock, CollectOrder, TestOrder, Unwinder};

    pub fn switch(v: &str) -> Option<bool> {
        match v {
            "1" | "on" => Some(true),
            "0" | "off" => Some(false),
            _ => None,
        }
    }

    pub fn depth(v: &str) -> Option<usize> {
        v.parse().ok().filter(|d| (1..=crate::protocol::MAX_DEPTH).contains(d))
    }

    pub fn bytes(v: &str) -> Option<u64> {
        crate::sampling::parse_bytes(v)
    }

    pub fn seed(v: &str) -> Option<Option<u64>> {
        v.parse().ok().map(Some)
    }

    pub fn text(v: &str) -> Option<Option<String>> {
        Some(Some(v.to_owned()))
    }

    pub fn signal(v: &str) -> Option<Option<i32>> {
        super::parse_signal(v)
    }

    pub fn unwinder(v: &str) -> Option<Unwinder> {
        match v {
            "fast" => Some(Unwinder::Fast),
            "libgcc" => Some(Unwinder::Libgcc),
            "check" => Some(Unwinder::Check),
            _ => None,
        }
    }

    pub fn clock(v: &str) -> Option<Clock> {
        match v {
            "tsc" => Some(Clock::Tsc),
            "monotonic" => Some(Clock::Monotonic),
            _ => None,
        }
    }

    pub fn test_order(v: &str) -> Option<TestOrder> {
        let mut t = TestOrder::default();
        for item in v.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.split_once('=')? {
                ("stall", spec) => {
                    let (k, us) = spec.split_once(':')?;
                    t.stall_every = k.parse().ok().filter(|&k| k > 0)?;
                    t.stall_us = us.parse().ok()?;
                }
                ("collect", "reverse") => t.collect = CollectOrder::Reverse,
                ("collect", "exited-last") => t.collect = CollectOrder::ExitedLast,
                ("collect", "shuffle") => t.collect = CollectOrder::Shuffle,
                _ => return None,
            }
        }
        Some(t)
    }
}

/// Defines [`Recording`], one field per entry, each field's [`Setting`]
/// constant, [`Recording::from_vars`] and [`Recording::vars`].
macro_rules! recording {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident: $ty:ty = $default:expr,
            $id:ident $var:literal $values:literal $option:literal, $parse:ident, $expected:literal,
            $help:literal;
    )*) => {
        $(
            #[doc = $help]
            pub const $id: Setting = Setting { var: $var, values: $values, option: $option, help: $help };
        )*

        /// What a producer records and how (see the module's doc).
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct Recording {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for Recording {
            fn default() -> Recording {
                Recording { $( $field: $default, )* }
            }
        }

        impl Recording {
            /// Every setting of the recording, in the order of the list.
            pub const SETTINGS: &'static [Setting] = &[$($id),*];

            /// The recording the variables say: `get` reads a variable
            /// (`None`: unset), an empty or unset one means the default; a
            /// value that is not one of the setting's is passed to `warn`
            /// as one line (`MTRACE_DEPTH="abc" is not a frame count from
            /// 1 to 256; using 64`) and the default is used.
            pub fn from_vars(get: impl Fn(&CStr) -> Option<String>, mut warn: impl FnMut(&str)) -> Recording {
                let mut r = Recording::default();
                $(
                    if let Some(v) = get($var) {
                        let t = v.trim();
                        if !t.is_empty() {
                            match parse::$parse(t) {
                                Some(x) => r.$field = x,
                                None => warn(&format!(
                                    "{}={v:?} is not {}; using {}",
                                    $id.name(),
                                    $expected,
                                    shown(&r.$field.render())
                                )),
                            }
                        }
                    }
                )*
                r.untangle(&mut warn);
                r
            }

            /// Every setting with its value as its variable spells it,
            /// `None` where it is the default (the variable unset).
            pub fn vars(&self) -> Vec<(Setting, Option<String>)> {
                let d = Recording::default();
                vec![$( ($id, (self.$field != d.$field).then(|| self.$field.render())) ),*]
            }

            /// Every setting with its value as its variable spells it
            /// (empty where a value has no spelling: an unset path, a seed
            /// from the clock).
            pub fn rendered(&self) -> Vec<(Setting, String)> {
                vec![$( ($id, self.$field.render()) ),*]
            }
        }
    };
}

/// A default as a warning names it.
fn shown(rendered: &str) -> &str {
    if rendered.is_empty() {
        "the default"
    } else {
        rendered
    }
}

recording! {
    /// Where the stream goes, unexpanded (`%p`, `%e`): a file, `unix:PATH`
    /// or `tcp:HOST:PORT` (`crate::address`); `None`: `<prog>.<pid>.mtrace`
    /// in the working directory.
    output: Option<String> = None,
        OUTPUT c"MTRACE_OUTPUT" "PATH" "", text, "a path",
        "trace file (%p pid, %e program) or unix:PATH / tcp:HOST:PORT; `run` sets it";
    /// Frames per backtrace, 1 to `protocol::MAX_DEPTH`.
    depth: usize = DEFAULT_DEPTH,
        DEPTH c"MTRACE_DEPTH" "N" "-d", depth, "a frame count from 1 to 256",
        "frames per backtrace, 1-256 (default 64)";
    /// Allocations are recorded from the start; off: only after
    /// `mtrace_start()` or glibc's `mtrace()` (frees always are).
    start: bool = true,
        START c"MTRACE_START" "on|off" "", switch, "on (1) or off (0)",
        "off: record no allocations until mtrace_start() or mtrace()";
    /// A memory snapshot for the leak scan at exit.
    scan: bool = false,
        SCAN c"MTRACE_SCAN" "0|1" "--no-scan", switch, "1 (on) or 0 (off)",
        "1: memory snapshot at exit for the leak scan (`run` sets it unless told not to)";
    /// Every free records its backtrace too (`-S`), for the report of
    /// wrong frees.
    check_frees: bool = false,
        CHECK_FREES c"MTRACE_CHECK_FREES" "0|1" "-S", switch, "1 (on) or 0 (off)",
        "1: frees record their backtraces too";
    /// glibc's `__libc_freeres()` is called at exit (valgrind's
    /// `--run-libc-freeres`).
    freeres: bool = true,
        FREERES c"MTRACE_FREERES" "on|off" "--run-libc-freeres", switch, "on (1) or off (0)",
        "off: glibc's __libc_freeres() is not called at exit";
    /// The signal that scans for leaks now and writes a report; `None`: off.
    scan_signal: Option<i32> = None,
        SCAN_SIGNAL c"MTRACE_SCAN_SIGNAL" "SIG" "", signal, "a signal mtrace can take (USR1, USR2, a number but KILL, STOP, SEGV, BUS, ILL, FPE, ABRT and TRAP; or off)",
        "signal that scans for leaks now and writes a .memlog (default off)";
    /// Mean bytes between sampled allocations (docs/SAMPLING.md); 0
    /// records every allocation.
    sample_rate: u64 = 0,
        SAMPLE_RATE c"MTRACE_SAMPLE_RATE" "BYTES" "--sample-rate", bytes, "a byte count (4096, 512K, 2M)",
        "sample one allocation per BYTES allocated on average (512K, 2M; default 0: every one)";
    /// The seed of the sample points; `None` draws one from the clock.
    sample_seed: Option<u64> = None,
        SAMPLE_SEED c"MTRACE_SAMPLE_SEED" "N" "", seed, "a number",
        "seed of the sample points (default: from the clock); for repeatable tests";
    /// Forked children are traced.
    follow_fork: bool = true,
        FOLLOW_FORK c"MTRACE_FOLLOW_FORK" "on|off" "", switch, "on (1) or off (0)",
        "off: forked children run untraced";
    /// Programs this one execs are traced.
    follow_exec: bool = true,
        FOLLOW_EXEC c"MTRACE_FOLLOW_EXEC" "on|off" "", switch, "on (1) or off (0)",
        "off: programs this one execs run untraced";
    /// The signal that writes an incremental report; `None`: off.
    report_signal: Option<i32> = Some(libc::SIGUSR1),
        REPORT_SIGNAL c"MTRACE_REPORT_SIGNAL" "SIG" "", signal, "a signal mtrace can take (USR1, USR2, a number but KILL, STOP, SEGV, BUS, ILL, FPE, ABRT and TRAP; or off)",
        "signal that writes an incremental report (default USR1; off)";
    /// Where the .memlog reports go; `None`: the working directory at the
    /// time of the report.
    report_dir: Option<String> = None,
        REPORT_DIR c"MTRACE_REPORT_DIR" "DIR" "", text, "a folder",
        "where <program>-<pid>-<n>.memlog reports go (default: cwd)";
    /// The unwinder that records backtraces.
    unwinder: Unwinder = Unwinder::Fast,
        UNWINDER c"MTRACE_UNWINDER" "U" "", unwinder, "\"fast\", \"libgcc\" or \"check\"",
        "fast, libgcc, or check (both, differences on stderr); default fast";
    /// The clock that stamps events.
    clock: Clock = Clock::Tsc,
        CLOCK c"MTRACE_CLOCK" "tsc|monotonic" "", clock, "\"tsc\" or \"monotonic\"",
        "event clock (default tsc where the TSC is invariant)";
    /// Test-only perturbations of the stream's order.
    test_order: TestOrder = TestOrder::default(),
        TEST_ORDER c"MTRACE_TEST_ORDER" "SPEC" "", test_order,
        "stall=K:US and/or collect=reverse|exited-last|shuffle",
        "tests only: stall=K:US and/or collect=reverse|exited-last|shuffle perturb the writer's order";
}

impl Recording {
    /// Settings that are each valid but not together, the later one
    /// warned about and set to its default: a scan signal that is the
    /// report signal too (one signal cannot ask for both) is off.
    fn untangle(&mut self, warn: &mut impl FnMut(&str)) {
        if self.scan_signal.is_some() && self.scan_signal == self.report_signal {
            warn(&format!(
                "{}={} is {}'s signal too; using off",
                SCAN_SIGNAL.name(),
                self.scan_signal.render(),
                REPORT_SIGNAL.name()
            ));
            self.scan_signal = None;
        }
    }

    /// The recording this process's environment says, each invalid value
    /// warned about on stderr (`mtrace: ...`).
    pub fn from_env() -> Recording {
        Recording::from_vars(|var| std::env::var(var.to_str().ok()?).ok(), |w| eprintln!("mtrace: {w}"))
    }

    /// A `NAME=value` line per setting, as `mtrace attach` hands them to
    /// the library (read before the process's own environment, which they
    /// thus shadow whole): an empty value for a default.
    pub fn lines(&self) -> String {
        self.vars().into_iter().map(|(s, v)| format!("{}={}\n", s.name(), v.unwrap_or_default())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(vars: &[(&str, &str)]) -> (Recording, Vec<String>) {
        let mut warnings = Vec::new();
        let r = Recording::from_vars(
            |var| vars.iter().find(|(k, _)| *k == var.to_str().unwrap()).map(|(_, v)| (*v).to_owned()),
            |w| warnings.push(w.to_owned()),
        );
        (r, warnings)
    }

    #[test]
    fn unset_and_empty_are_the_default() {
        assert_eq!(from(&[]).0, Recording::default());
        assert_eq!(from(&[("MTRACE_DEPTH", ""), ("MTRACE_OUTPUT", " ")]), (Recording::default(), vec![]));
    }

    #[test]
    fn a_bad_value_warns_once_and_keeps_the_default() {
        let (r, w) = from(&[("MTRACE_DEPTH", "lots"), ("MTRACE_START", "maybe"), ("MTRACE_REPORT_SIGNAL", "SIGNOPE")]);
        assert_eq!(r, Recording::default());
        assert_eq!(
            w,
            [
                "MTRACE_DEPTH=\"lots\" is not a frame count from 1 to 256; using 64",
                "MTRACE_START=\"maybe\" is not on (1) or off (0); using on",
                "MTRACE_REPORT_SIGNAL=\"SIGNOPE\" is not a signal mtrace can take (USR1, USR2, a number but KILL, STOP, SEGV, BUS, ILL, FPE, ABRT and TRAP; or off); using USR1",
            ]
        );
        // KILL cannot be caught; SEGV is the program's death.
        for v in ["9", "11", "19"] {
            let (r, w) = from(&[("MTRACE_REPORT_SIGNAL", v)]);
            assert_eq!((r.report_signal, w.len()), (Some(libc::SIGUSR1), 1), "{v}");
        }
        // One signal cannot both report and scan.
        let (r, w) = from(&[("MTRACE_SCAN_SIGNAL", "USR1")]);
        assert_eq!((r.scan_signal, r.report_signal), (None, Some(libc::SIGUSR1)));
        assert_eq!(w, ["MTRACE_SCAN_SIGNAL=USR1 is MTRACE_REPORT_SIGNAL's signal too; using off"]);
        let (r, w) = from(&[("MTRACE_SCAN_SIGNAL", "USR1"), ("MTRACE_REPORT_SIGNAL", "USR2")]);
        assert_eq!((r.scan_signal, r.report_signal, w.len()), (Some(libc::SIGUSR1), Some(libc::SIGUSR2), 0));
        assert_eq!(from(&[("MTRACE_DEPTH", "0")]).1.len(), 1);
        assert_eq!(from(&[("MTRACE_DEPTH", "257")]).1.len(), 1);
    }

    #[test]
    fn rendering_reads_back_to_the_same_recording() {
        let r = Recording {
            output: Some("unix:/tmp/s".into()),
            depth: 12,
            start: false,
            scan: true,
            check_frees: true,
            freeres: false,
            scan_signal: Some(libc::SIGUSR2),
            sample_rate: 512 << 10,
            sample_seed: Some(7),
            follow_fork: false,
            follow_exec: false,
            report_signal: None,
            report_dir: Some("/tmp".into()),
            unwinder: Unwinder::Check,
            clock: Clock::Monotonic,
            test_order: TestOrder { stall_every: 7, stall_us: 300, collect: CollectOrder::ExitedLast },
        };
        let vars: Vec<(String, String)> =
            r.vars().into_iter().map(|(s, v)| (s.name().to_owned(), v.unwrap_or_default())).collect();
        let pairs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(from(&pairs), (r.clone(), vec![]));
        assert!(r.vars().iter().all(|(_, v)| v.is_some()), "every field differs from its default here");
        assert!(Recording::default().vars().iter().all(|(_, v)| v.is_none()));
        let lines = Recording { depth: 8, ..Default::default() }.lines();
        assert_eq!(lines.lines().count(), Recording::SETTINGS.len());
        assert!(lines.starts_with("MTRACE_OUTPUT=\nMTRACE_DEPTH=8\nMTRACE_START=\n"), "{lines}");
    }

    #[test]
    fn test_order() {
        let (r, w) = from(&[("MTRACE_TEST_ORDER", "stall=7:300, collect=exited-last")]);
        assert!(w.is_empty());
        assert_eq!(r.test_order, TestOrder { stall_every: 7, stall_us: 300, collect: CollectOrder::ExitedLast });
        assert_eq!(from(&[("MTRACE_TEST_ORDER", "stall=0:5")]).1.len(), 1);
        assert_eq!(from(&[("MTRACE_TEST_ORDER", "collect=sideways")]).1.len(), 1);
    }
}
