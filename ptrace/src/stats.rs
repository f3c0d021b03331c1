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
/// Time opening uprobe events, and how many.
pub static OPEN_NS: AtomicU64 = AtomicU64::new(0);
pub static OPENS: AtomicU64 = AtomicU64::new(0);
/// The fullest a ring was found, bytes; the longest between two reads of
/// the rings, ns.
pub static FILL: AtomicU64 = AtomicU64::new(0);
pub static GAP_NS: AtomicU64 = AtomicU64::new(0);
/// The longest between two rounds of the ring reader, ns.
pub static READER_GAP_NS: AtomicU64 = AtomicU64::new(0);
/// Threads stopped because their samples piled up (tracer/samples.rs).
pub static THROTTLES: AtomicU64 = AtomicU64::new(0);
/// Uprobe samples handled.
pub static SAMPLES: AtomicU64 = AtomicU64::new(0);

/// Leak scans' snapshots: memory read (bytes) and the time taken (ns).
pub static SCAN_BYTES: AtomicU64 = AtomicU64::new(0);
pub static SCAN_NS: AtomicU64 = AtomicU64::new(0);

/// Counts a snapshot of `bytes` started at `t`.
pub fn scanned(bytes: u64, t: Instant) {
    SCAN_BYTES.fetch_add(bytes, Ordering::Relaxed);
    add(&SCAN_NS, t);
}

/// Adds the time since `t` to `to`.
pub fn add(to: &AtomicU64, t: Instant) {
    to.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// The counters on stderr, if asked for.
pub fn print() {
    if std::env::var_os(mtrace_format::settings::PTRACE_STATS.name()).is_none() {
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
    if get(&SCAN_BYTES) > 0 {
        let ns = get(&SCAN_NS).max(1);
        eprintln!(
            "mtrace --ptrace: leak scan snapshots: {} KiB read in {:.1} ms ({:.2} GB/s)",
            get(&SCAN_BYTES) >> 10,
            ns as f64 / 1e6,
            get(&SCAN_BYTES) as f64 / ns as f64,
        );
    }
    if get(&OPENS) > 0 {
        eprintln!(
            "mtrace --ptrace: {} uprobe events opened in {:.1} ms; {} samples; rings at most {} KiB full, read at most {:.1} ms apart (handled {:.1} ms); {} threads stopped for their samples",
            get(&OPENS),
            us(get(&OPEN_NS)) / 1e3,
            get(&SAMPLES),
            get(&FILL) >> 10,
            us(get(&READER_GAP_NS)) / 1e3,
            us(get(&GAP_NS)) / 1e3,
            get(&THROTTLES),
        );
    }
}
