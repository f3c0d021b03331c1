//! The end of a stream: everything buffered written out, then the End
//! record, also from a fatal signal's handler (no allocation there, and no
//! lock waited on for long).

use mtrace_format::{Encoder, EndReason, Record};
use parking_lot::{Mutex, MutexGuard};

use std::sync::atomic::Ordering;

use super::{Session, SIGNAL_REPORT};
use crate::platform::sys;

impl Session {
    /// Writes everything buffered and an End record; afterwards events are
    /// written synchronously. In a signal handler (`in_signal`) it neither
    /// allocates nor frees and gives up on a lock held for more than ~2 s.
    /// `last_free` (address, time in ns, backtrace id or 0) is the block a
    /// realloc of the calling thread was freeing when the process ended
    /// (glibc aborted in it), written before the End record as a Realloc
    /// that returned nothing.
    pub fn final_flush(&self, reason: EndReason, in_signal: bool, last_free: Option<(u64, u64, u32)>) {
        // A report asked for just before the end still gets made.
        if !in_signal && !self.is_finished() && self.reporter.take_request() {
            self.report_point(SIGNAL_REPORT, None);
        }
        // The loader is asked before the file is locked (see
        // modules_if_changed).
        let modules = if in_signal { None } else { self.modules_if_changed() };
        self.finished.store(true, Ordering::SeqCst);
        let Some(_f) = self.lock_file_in(in_signal) else { return };
        if let Some(m) = modules {
            self.write_unordered(&m);
        }
        if let Some(threads) = lock(&self.threads, in_signal) {
            let claim = self.handoff.claim();
            for t in threads.iter() {
                let _ = t.take(&claim, !in_signal, |b| {
                    let full = std::mem::take(&mut b.full);
                    for buf in &full {
                        self.out.write(buf);
                    }
                    // Freeing here could deadlock in a signal handler that
                    // interrupted malloc; the process is ending anyway.
                    std::mem::forget(full);
                    self.out.write(&b.cur);
                    b.cur.clear();
                });
            }
        }
        if !in_signal {
            let spawned = self.spawned_records();
            if !spawned.is_empty() {
                self.write_unordered(&spawned);
            }
        }
        if !self.ended.swap(true, Ordering::SeqCst) {
            if let Some(mut e) = lock(&self.end_buf, in_signal) {
                e.clear();
                let now = self.now();
                let mut enc = Encoder::new();
                enc.encode(&mut e, &Record::Thread { tid: sys::gettid(), time_ns: now });
                if let Some((old, t, stack)) = last_free {
                    enc.encode(&mut e, &Record::Realloc { time_ns: t, free_time_ns: t, old, new: 0, size: 0, stack });
                }
                // The RSS at the end: a process that made no event since
                // its start (memory taken by system calls alone) had no
                // RSS sample from a solo round (a pread: signal-safe).
                if let Some(rss) = sys::rss_bytes() {
                    enc.encode(&mut e, &Record::Sample { time_ns: now, rss });
                }
                if reason == EndReason::Exec {
                    if let Some(path) = EXEC_PATH.lock().take() {
                        enc.encode(&mut e, &Record::Exec { time_ns: now, path });
                    }
                }
                enc.encode(&mut e, &Record::End { time_ns: now, reason });
                self.out.write(&e);
            }
        }
    }

    /// The program is about to `exec` `path` (as it gave it): the End
    /// record of the exec says so ([`Record::Exec`]).
    pub fn exec_of(&self, path: String) {
        *EXEC_PATH.lock() = Some(path);
    }

    /// Undoes [`Session::final_flush`] after an exec that failed.
    pub fn resume(&self) {
        self.ended.store(false, Ordering::SeqCst);
        self.finished.store(false, Ordering::SeqCst);
    }
}

/// What the program asked `exec` to run, for the End record of the exec.
static EXEC_PATH: parking_lot::Mutex<Option<String>> = parking_lot::Mutex::new(None);

/// `m` locked; in a signal handler (`in_signal`) `None` once it has been
/// held for about 2 s.
pub(crate) fn lock<T>(m: &Mutex<T>, in_signal: bool) -> Option<MutexGuard<'_, T>> {
    if !in_signal {
        // A hook's write_sync comes here (platform/spin.rs: why not park).
        return Some(crate::platform::spin::lock_unparked(m));
    }
    for _ in 0..2000 {
        if let Some(g) = m.try_lock() {
            return Some(g);
        }
        sys::sleep_ms(1);
    }
    None
}
