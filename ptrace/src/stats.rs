//! Where the tracer's time goes, printed at the end when
//! `MTRACE_PTRACE_STATS` is set: stops, the time waiting for them (the
//! program running and the context switches), handling them, and of that
//! unwinding.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub static STOPS: AtomicU64 = AtomicU64::new(0);
pub static WAIT_NS: AtomicU64 = AtomicU64::new(0);
pub static HANDLE_NS: AtomicU64 = AtomicU64::new(0);
pub static UNWIND_NS: AtomicU64 = AtomicU64::new(0);
pub static UNWINDS: AtomicU64 = AtomicU64::new(0);

/// Adds the time since `t` to `to`.
pub fn add(to: &AtomicU64, t: Instant) {
    to.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// The counters on stderr, if asked for.
pub fn print() {
    if std::env::var_os("MTRACE_PTRACE_STATS").is_none() {
        return;
    }
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let stops = get(&STOPS).max(1);
    let us = |ns: u64| ns as f64 / 1e3;
    eprintln!(
        "mtrace --ptrace: {} stops; per stop {:.1} us waiting (the program and the switches), {:.1} us handling; {} backtraces, {:.1} us each",
        get(&STOPS),
        us(get(&WAIT_NS)) / stops as f64,
        us(get(&HANDLE_NS)) / stops as f64,
        get(&UNWINDS),
        us(get(&UNWIND_NS)) / get(&UNWINDS).max(1) as f64,
    );
}
