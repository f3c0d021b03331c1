//! The recording configuration, read once per session: the typed
//! [`Recording`] of `mtrace_format::recording` from the variables (the
//! lines `mtrace attach` gave first, then the environment), each bad value
//! warned about once per run and replaced by its default; then what only
//! this process can check (that the report folder is writable here).

use crate::platform::sys;
pub use mtrace_format::recording::{CollectOrder, Recording};

/// Upper bound for `MTRACE_DEPTH` (the protocol's, for `depth N` too).
pub const MAX_DEPTH: usize = mtrace_format::protocol::MAX_DEPTH;

/// Puts `v` in the collection order `order` ([`CollectOrder`], a test's
/// perturbation); `exited` tells an exited thread's buffer.
pub fn arrange<T>(order: CollectOrder, v: &mut [T], exited: impl Fn(&T) -> bool) {
    match order {
        CollectOrder::Registered => {}
        CollectOrder::Reverse => v.reverse(),
        CollectOrder::ExitedLast => {
            // The flags read once: a thread may exit meanwhile, and a key
            // that changes during the sort breaks it (Rust's sort panics on
            // an inconsistent order).
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

/// Settings given by `mtrace attach` (`NAME=value` lines,
/// [`Recording::lines`]), read before the environment.
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

/// This session's recording (see the module's doc).
pub fn load() -> Recording {
    let mut r = Recording::from_vars(var, sys::warn_once_per_run);
    r.report_dir = r.report_dir.take().filter(|d| {
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
    r
}

#[cfg(test)]
mod tests {
    use super::{arrange, CollectOrder};

    #[test]
    fn collect_orders() {
        let mut v = [(1, false), (2, true), (3, false)];
        arrange(CollectOrder::ExitedLast, &mut v, |t| t.1);
        assert_eq!(v.map(|t| t.0), [1, 3, 2]);
        arrange(CollectOrder::Reverse, &mut v, |t| t.1);
        assert_eq!(v.map(|t| t.0), [2, 3, 1]);
        let mut w: Vec<u32> = (0..50).collect();
        arrange(CollectOrder::Shuffle, &mut w, |_| false);
        w.sort();
        assert_eq!(w, (0..50).collect::<Vec<_>>());
    }
}
