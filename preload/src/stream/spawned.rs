//! Programs the process started whose own tracing may not follow them:
//! `posix_spawn` (glibc's child execs with the system call, past the exec
//! hooks) and an exec in a `vfork` child (which shares the parent's memory
//! and must not touch its session). Each is kept in a slot here, without a
//! lock or an allocation (a vfork child may write one), and the parent's
//! next round writes it into its stream ([`mtrace_format::Record::Spawned`]):
//! where the program wrote no trace of its own (a static executable), the
//! report's process tree still has it.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Programs kept until the next round; more are left out.
const SLOTS: usize = 16;
/// Bytes of a path kept.
const PATH_KEPT: usize = 256;
/// A slot's pid while it is being written.
const WRITING: u32 = u32::MAX;

struct Slot {
    /// 0: free; [`WRITING`]; else the child's pid, the slot written.
    pid: AtomicU32,
    /// When, CLOCK_MONOTONIC ns.
    at: std::sync::atomic::AtomicU64,
    len: AtomicUsize,
    path: UnsafeCell<[u8; PATH_KEPT]>,
}

// SAFETY: a slot's path is written only by the one writer that moved its
// pid from 0 to WRITING, and read only after it was published (pid set,
// Release) by the one reader that then frees it.
unsafe impl Sync for Slot {}

static KEPT: [Slot; SLOTS] = [const {
    Slot {
        pid: AtomicU32::new(0),
        at: std::sync::atomic::AtomicU64::new(0),
        len: AtomicUsize::new(0),
        path: UnsafeCell::new([0; PATH_KEPT]),
    }
}; SLOTS];

/// Child `pid` was started to run `path`: kept for the next round. No
/// lock, no allocation (from a vfork child too); nothing when every slot
/// is taken.
pub fn note(pid: u32, path: &[u8]) {
    if pid == 0 || pid == WRITING {
        return;
    }
    for s in &KEPT {
        if s.pid.compare_exchange(0, WRITING, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            let n = path.len().min(PATH_KEPT);
            // SAFETY: this writer owns the slot (see the Sync impl).
            unsafe { (&mut *s.path.get())[..n].copy_from_slice(&path[..n]) };
            s.len.store(n, Ordering::Relaxed);
            s.at.store(crate::platform::sys::monotonic_ns(), Ordering::Relaxed);
            s.pid.store(pid, Ordering::Release);
            return;
        }
    }
}

/// Each program kept since the last call, as (when, CLOCK_MONOTONIC ns;
/// pid; path); the slots are freed. One caller at a time.
pub fn take(mut f: impl FnMut(u64, u32, String)) {
    for s in &KEPT {
        let pid = s.pid.load(Ordering::Acquire);
        if pid == 0 || pid == WRITING {
            continue;
        }
        let n = s.len.load(Ordering::Relaxed).min(PATH_KEPT);
        // SAFETY: published by its writer (Acquire above); only this
        // caller reads it, before freeing the slot.
        let path = String::from_utf8_lossy(unsafe { &(&*s.path.get())[..n] }).into_owned();
        let at = s.at.load(Ordering::Relaxed);
        s.pid.store(0, Ordering::Release);
        f(at, pid, path);
    }
}
