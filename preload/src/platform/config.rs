//! Settings read from the environment once per session. A bad value prints
//! one warning naming the variable and falls back to the default.

use crate::platform::sys;
use mtrace_format::settings;

/// The unwinder that records backtraces (`MTRACE_UNWINDER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwinder {
    /// Cached CFI rules and the previous walk (unwind/fast.rs); the default.
    Fast,
    /// libgcc's `_Unwind_Backtrace`: slow, independent.
    Libgcc,
    /// Both on every event: records the fast one's backtrace, counts those
    /// where libgcc's differs, prints the first few and the count at exit.
    Check,
}

/// Frames recorded per backtrace unless `MTRACE_DEPTH` says otherwise.
pub const DEFAULT_DEPTH: usize = 64;
/// Upper bound for `MTRACE_DEPTH` (the protocol's, for `depth N` too).
pub const MAX_DEPTH: usize = mtrace_format::protocol::MAX_DEPTH;

pub struct Config {
    /// Frames per backtrace, 1..=MAX_DEPTH.
    pub depth: usize,
    /// `MTRACE_OUTPUT`, unexpanded; `None` for the default name.
    pub output: Option<String>,
    /// `MTRACE_UNWINDER`: which unwinder records backtraces.
    pub unwinder: Unwinder,
    /// `MTRACE_CLOCK` is not `monotonic`: events may read the TSC.
    pub tsc_clock: bool,
    /// `MTRACE_REPORT_SIGNAL`: the signal that asks for an incremental
    /// report (default SIGUSR1); `None` when set to `off`.
    pub report_signal: Option<i32>,
    /// `MTRACE_START=off`: record no allocations until `mtrace_start()` or
    /// glibc's `mtrace()`.
    pub start: bool,
    /// `MTRACE_SCAN=1`: a memory snapshot for the leak scan at exit.
    pub scan: bool,
    /// `MTRACE_CHECK_FREES=1` (`mtrace run -S`): every free records its
    /// backtrace too, for the report of wrong frees.
    pub check_frees: bool,
    /// `MTRACE_SCAN_SIGNAL`: the signal that asks for a leak scan and its
    /// report while the program runs (default off).
    pub scan_signal: Option<i32>,
    /// `MTRACE_FOLLOW_FORK=off`: a forked child runs untraced.
    pub follow_fork: bool,
    /// `MTRACE_FOLLOW_EXEC=off`: programs this one execs run untraced.
    pub follow_exec: bool,
    /// `MTRACE_REPORT_DIR`: where .memlog reports go (default: the
    /// program's working directory at the time of the report).
    pub report_dir: Option<String>,
    /// `MTRACE_TEST_ORDER`: test-only perturbations of the order.
    pub test: TestOrder,
    /// `MTRACE_FREERES=off` (`mtrace run --run-libc-freeres=no`): glibc's
    /// `__libc_freeres()` is not called at exit.
    pub freeres: bool,
    /// `MTRACE_SAMPLE_RATE`: mean bytes between sampled allocations
    /// (record/sample.rs); 0 records every allocation.
    pub sample_rate: u64,
    /// `MTRACE_SAMPLE_SEED`: the seed of the sample points; `None` draws
    /// one from the clock.
    pub sample_seed: Option<u64>,
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
    /// 0: no stall.
    pub stall_every: u64,
    /// µs.
    pub stall_us: u64,
    pub collect: CollectOrder,
}

/// The order a collection takes the threads' buffers in ([`TestOrder`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CollectOrder {
    /// The order the threads registered in (the only one outside tests).
    #[default]
    Registered,
    Reverse,
    ExitedLast,
    Shuffle,
}

impl CollectOrder {
    /// Puts `v` in this order; `exited` tells an exited thread's buffer.
    pub fn arrange<T>(self, v: &mut [T], exited: impl Fn(&T) -> bool) {
        match self {
            CollectOrder::Registered => {}
            CollectOrder::Reverse => v.reverse(),
            CollectOrder::ExitedLast => {
                // The flags read once: a thread may exit meanwhile, and a
                // key that changes during the sort breaks it (Rust's sort
                // panics on an inconsistent order).
                let flags: Vec<bool> = v.iter().map(&exited).collect();
                let mut i = 0;
                for k in 0..v.len() {
                    if !flags[k] {
                        v[i..=k].rotate_right(1);
                        i += 1;
                    }
                }
            }
            CollectOrder::Shuffle => {
                // xorshift, seeded by the clock: a new order every round.
                let mut x = sys::monotonic_ns() | 1;
                for i in (1..v.len()).rev() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    v.swap(i, (x % (i as u64 + 1)) as usize);
                }
            }
        }
    }
}

/// Parses `MTRACE_TEST_ORDER`'s value (see [`TestOrder`]).
fn parse_test_order(v: &str) -> Option<TestOrder> {
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

/// Settings given by `mtrace attach` (`NAME=value` lines), read before the
/// environment.
static OVERRIDES: parking_lot::Mutex<String> = parking_lot::Mutex::new(String::new());

/// Replaces the settings [`var`] reads before the environment.
pub fn set_overrides(text: &str) {
    *OVERRIDES.lock() = text.to_owned();
}

/// Setting `name`: from [`set_overrides`]' lines, else the environment.
fn var(name: &std::ffi::CStr) -> Option<String> {
    let key = name.to_str().ok()?;
    let o = OVERRIDES.lock();
    let given = o.lines().find_map(|l| l.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v.to_owned()));
    drop(o);
    given.or_else(|| sys::getenv(name))
}

pub fn load() -> Config {
    let depth = match var(settings::DEPTH.var) {
        None => DEFAULT_DEPTH,
        Some(v) => match v.trim().parse::<usize>() {
            Ok(d) if (1..=MAX_DEPTH).contains(&d) => d,
            _ => {
                sys::warn_once_per_run(&format!(
                    "MTRACE_DEPTH={v:?} is not a frame count from 1 to {MAX_DEPTH}; using {DEFAULT_DEPTH}"
                ));
                DEFAULT_DEPTH
            }
        },
    };
    let output = var(settings::OUTPUT.var).filter(|s| !s.is_empty());
    let unwinder = match var(settings::UNWINDER.var).as_deref() {
        None | Some("fast") => Unwinder::Fast,
        Some("libgcc") => Unwinder::Libgcc,
        Some("check") => Unwinder::Check,
        Some(v) => {
            sys::warn_once_per_run(&format!(
                "MTRACE_UNWINDER={v:?} is not \"fast\", \"libgcc\" or \"check\"; using fast"
            ));
            Unwinder::Fast
        }
    };
    let tsc_clock = match var(settings::CLOCK.var).as_deref() {
        None | Some("tsc") => true,
        Some("monotonic") => false,
        Some(v) => {
            sys::warn_once_per_run(&format!("MTRACE_CLOCK={v:?} is neither \"tsc\" nor \"monotonic\"; using tsc"));
            true
        }
    };
    let report_signal = match var(settings::REPORT_SIGNAL.var) {
        None => Some(libc::SIGUSR1),
        Some(v) => settings::parse_signal(&v).unwrap_or_else(|| {
            sys::warn_once_per_run(&format!(
                "MTRACE_REPORT_SIGNAL={v:?} is not a signal (USR1, USR2, a number, or off); using USR1"
            ));
            Some(libc::SIGUSR1)
        }),
    };
    let report_dir = var(settings::REPORT_DIR.var).filter(|s| !s.is_empty()).filter(|d| {
        // Checked once here: otherwise every report would fail on its own.
        let ok = std::ffi::CString::new(d.as_str())
            // SAFETY: access with a NUL-terminated path.
            .is_ok_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0)
            && std::path::Path::new(d).is_dir();
        if !ok {
            sys::warn_once_per_run(&format!(
                "MTRACE_REPORT_DIR={d:?} is not a folder this process can write to; reports go to the working directory"
            ));
        }
        ok
    });
    let start = on_off(settings::START.var);
    let scan = zero_one(settings::SCAN.var);
    let check_frees = zero_one(settings::CHECK_FREES.var);
    let scan_signal = match var(settings::SCAN_SIGNAL.var) {
        None => None,
        Some(v) => settings::parse_signal(&v).unwrap_or_else(|| {
            sys::warn_once_per_run(&format!(
                "MTRACE_SCAN_SIGNAL={v:?} is not a signal (USR1, USR2, a number, or off); using off"
            ));
            None
        }),
    };
    let follow_fork = on_off(settings::FOLLOW_FORK.var);
    let follow_exec = on_off(settings::FOLLOW_EXEC.var);
    let freeres = on_off(settings::FREERES.var);
    let test = match var(settings::TEST_ORDER.var) {
        None => TestOrder::default(),
        Some(v) => parse_test_order(&v).unwrap_or_else(|| {
            sys::warn_once_per_run(&format!(
                "MTRACE_TEST_ORDER={v:?} is not stall=K:US and/or collect=reverse|exited-last|shuffle; ignored"
            ));
            TestOrder::default()
        }),
    };
    let sample_rate = match var(settings::SAMPLE_RATE.var) {
        None => 0,
        Some(v) => mtrace_format::sampling::parse_bytes(&v).unwrap_or_else(|| {
            sys::warn_once_per_run(&format!(
                "MTRACE_SAMPLE_RATE={v:?} is not a byte count (4096, 512K, 2M); recording every allocation"
            ));
            0
        }),
    };
    let sample_seed = var(settings::SAMPLE_SEED.var).and_then(|v| {
        let n = v.trim().parse::<u64>().ok();
        if n.is_none() {
            sys::warn_once_per_run(&format!("MTRACE_SAMPLE_SEED={v:?} is not a number; seeding from the clock"));
        }
        n
    });
    Config {
        depth,
        output,
        unwinder,
        tsc_clock,
        report_signal,
        start,
        scan,
        check_frees,
        scan_signal,
        follow_fork,
        follow_exec,
        report_dir,
        test,
        freeres,
        sample_rate,
        sample_seed,
    }
}

/// A 0/1 variable whose default is 0 (`on` and `off` are accepted too).
fn zero_one(name: &std::ffi::CStr) -> bool {
    switch(name, false, ("1", "0"))
}

/// An on/off variable whose default is on (`1` and `0` are accepted too).
fn on_off(name: &std::ffi::CStr) -> bool {
    switch(name, true, ("\"on\"", "\"off\""))
}

/// A variable that is on (`on`, `1`) or off (`off`, `0`), `default` when
/// unset; `words` name the two values in the warning about any other.
fn switch(name: &std::ffi::CStr, default: bool, words: (&str, &str)) -> bool {
    match var(name).as_deref().map(str::trim) {
        None => default,
        Some("1") | Some("on") => true,
        Some("0") | Some("off") => false,
        Some(v) => {
            let name = name.to_string_lossy();
            let (on, off) = words;
            let using = if default { on } else { off };
            sys::warn_once_per_run(&format!(
                "{name}={v:?} is neither {on} nor {off}; using {}",
                using.trim_matches('"')
            ));
            default
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn signal_names() {
        assert_eq!(mtrace_format::settings::parse_signal("USR2"), Some(Some(libc::SIGUSR2)));
        assert_eq!(mtrace_format::settings::parse_signal("SIGUSR1"), Some(Some(libc::SIGUSR1)));
        assert_eq!(mtrace_format::settings::parse_signal("12"), Some(Some(12)));
        assert_eq!(mtrace_format::settings::parse_signal("off"), Some(None));
        assert_eq!(mtrace_format::settings::parse_signal("KILLME"), None);
        assert_eq!(mtrace_format::settings::parse_signal("0"), None);
    }

    #[test]
    fn test_order() {
        use super::{parse_test_order, CollectOrder, TestOrder};
        let t = parse_test_order("stall=7:300, collect=exited-last").unwrap();
        assert_eq!(t, TestOrder { stall_every: 7, stall_us: 300, collect: CollectOrder::ExitedLast });
        assert_eq!(parse_test_order(""), Some(TestOrder::default()));
        assert_eq!(parse_test_order("stall=0:5"), None);
        assert_eq!(parse_test_order("collect=sideways"), None);
        let mut v = [(1, false), (2, true), (3, false)];
        CollectOrder::ExitedLast.arrange(&mut v, |t| t.1);
        assert_eq!(v.map(|t| t.0), [1, 3, 2]);
        CollectOrder::Reverse.arrange(&mut v, |t| t.1);
        assert_eq!(v.map(|t| t.0), [2, 3, 1]);
        let mut w: Vec<u32> = (0..50).collect();
        CollectOrder::Shuffle.arrange(&mut w, |_| false);
        w.sort();
        assert_eq!(w, (0..50).collect::<Vec<_>>());
    }
}
