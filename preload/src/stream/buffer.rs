//! A thread's buffer of encoded records: filled by its own thread with no
//! locked instruction, taken by the writer (and the final flush) by an
//! asymmetric handshake.
//!
//! Why not a mutex: its lock and unlock are two locked instructions per
//! event, each waiting for the store buffer to drain; `perf annotate` put
//! ~80% of `thread::push_as`'s samples on them (about a tenth of churn's
//! time under the preload). The owner now marks itself busy with a plain
//! store, checks whether a collection is under way (plain load) and, if
//! not, appends without any lock. The writer announces a collection
//! ([`Handoff::claim`]), then runs `membarrier(2)`, which executes a full
//! memory barrier on every CPU running a thread of the process: after it,
//! an owner either saw the claim (and takes the buffer's mutex instead) or
//! is seen busy (and the writer waits for it to finish its append). This
//! is the classic Dekker handshake with the fence moved to the rare side.
//! Where `membarrier` cannot be registered, every access takes the mutex,
//! as before.

use std::cell::UnsafeCell;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

use mtrace_format::{Encoder, Record};
use parking_lot::Mutex;

use super::BUF_CAP;
use crate::platform::sys;

/// Encoded records of one thread that the writer has not written yet.
pub struct BufInner {
    /// The buffer being filled; starts with a Thread record once non-empty.
    pub cur: Vec<u8>,
    /// Full buffers, oldest first.
    pub full: Vec<Vec<u8>>,
    /// Bytes in `full`, counted in the session's pending bytes.
    pub full_bytes: usize,
    pub enc: Encoder,
}

/// 1 while events wait to be written: set when a thread's buffer gets
/// its first record since the last collection, cleared by a collection
/// of every buffer. A process with one thread has no writer thread: its
/// reader (`mtrace server`) reads this word from outside, by its name
/// among the library's symbols (`mtrace_ptrace::library_call`), and makes
/// the process do a round when it stays set while the stream stands
/// still (docs/PROCESSES.md).
#[no_mangle]
#[allow(non_upper_case_globals)]
pub static mtrace_unwritten: AtomicU32 = AtomicU32::new(0);

impl BufInner {
    /// Starts `cur` with the Thread record of `tid` if it is empty: every
    /// buffer says whose records it holds. `now` (ns) is asked only then,
    /// so that a caller without the time reads the clock only then.
    #[inline]
    pub fn begin(&mut self, tid: u32, now: impl FnOnce() -> u64) {
        if self.cur.is_empty() {
            mtrace_unwritten.store(1, Ordering::Relaxed);
            self.enc.encode(&mut self.cur, &Record::Thread { tid, time_ns: now() });
        }
    }
}

/// A session's side of the handshake.
pub struct Handoff {
    /// `membarrier` is registered: owners may append without the mutex.
    fast: bool,
    /// Collections under way (the writer's and the final flush's may
    /// overlap): while any is, owners take the mutex.
    claims: AtomicU32,
}

impl Handoff {
    /// Registers the process for expedited `membarrier` (a forked child
    /// inherits the registration, and registers again anyway).
    pub fn new() -> Handoff {
        Handoff { fast: sys::membarrier_register(), claims: AtomicU32::new(0) }
    }

    /// Whether owners append without the mutex (`membarrier` registered).
    pub fn is_fast(&self) -> bool {
        self.fast
    }

    /// Opens a collection: until the returned guard is dropped, no owner
    /// appends without its buffer's mutex, and [`ThreadBuf::take`] waits
    /// for an append already started.
    pub fn claim(&self) -> Claim<'_> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        if self.fast && !sys::membarrier() {
            // The barrier failed after it was registered (not seen): a
            // claim that stays keeps every owner on the mutex from now on;
            // an append that read the claim before it was set is over
            // long before a millisecond has passed.
            sys::sleep_ms(1);
            return Claim { h: self, keep: true };
        }
        Claim { h: self, keep: false }
    }
}

/// An open collection (see [`Handoff::claim`]).
pub struct Claim<'a> {
    h: &'a Handoff,
    keep: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.keep {
            self.h.claims.fetch_sub(1, Ordering::Release);
        }
    }
}

/// A thread's buffer, shared between the thread and the writer.
pub struct ThreadBuf {
    /// Held by the writer (and the final flush) while it takes from the
    /// buffer, and by the owner while a collection is under way.
    lock: Mutex<()>,
    inner: UnsafeCell<BufInner>,
    /// The owner is appending without the mutex.
    busy: AtomicBool,
    /// Set when the thread has exited: the writer may take `cur` as well.
    pub exited: AtomicBool,
    /// The epoch the owner copied on entering the hook it is in, 0 when
    /// it is in none (order.rs).
    pub since: AtomicU64,
}

// SAFETY: `inner` is reached only through `own` (the owning thread, alone
// by the handshake or under `lock`) and `take` (under `lock`, after the
// owner's append is over); see the module's comment.
unsafe impl Sync for ThreadBuf {}

impl ThreadBuf {
    pub fn new() -> ThreadBuf {
        ThreadBuf {
            lock: Mutex::new(()),
            inner: UnsafeCell::new(BufInner {
                cur: Vec::with_capacity(BUF_CAP),
                full: Vec::new(),
                full_bytes: 0,
                enc: Encoder::new(),
            }),
            busy: AtomicBool::new(false),
            exited: AtomicBool::new(false),
            since: AtomicU64::new(0),
        }
    }

    /// Runs `f` on the buffer. Only the thread that owns it may call this,
    /// and never from inside `f`.
    #[inline(always)]
    pub fn own<R>(&self, h: &Handoff, f: impl FnOnce(&mut BufInner) -> R) -> R {
        if h.fast {
            self.busy.store(true, Ordering::Relaxed);
            // The busy store must come before the claim load: the
            // compiler keeps it so here; the collector's membarrier does
            // for the CPU.
            compiler_fence(Ordering::SeqCst);
            // Acquire: a claim seen makes the collection's epoch seen
            // (order.rs; a plain load on x86).
            if h.claims.load(Ordering::Acquire) == 0 {
                // SAFETY: no collection is under way, and none will touch
                // the buffer until `busy` is cleared (module comment).
                let r = f(unsafe { &mut *self.inner.get() });
                self.busy.store(false, Ordering::Release);
                return r;
            }
            self.busy.store(false, Ordering::Release);
        }
        let _g = crate::platform::spin::lock_unparked(&self.lock);
        // SAFETY: under the mutex, and the owner has no append in flight.
        f(unsafe { &mut *self.inner.get() })
    }

    /// Whether the owner is inside an append without the mutex (see the
    /// module's comment).
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    /// Runs `f` on the buffer of another thread, inside a collection
    /// (`_claim`). With `patient` false (a signal handler) it gives up after
    /// about 2 s on a mutex or an append that does not end (the owner was
    /// interrupted in it) and returns `None`.
    pub fn take<R>(&self, _claim: &Claim, patient: bool, f: impl FnOnce(&mut BufInner) -> R) -> Option<R> {
        let _g = super::end::lock(&self.lock, !patient)?;
        let mut spins = 0u32;
        while self.busy.load(Ordering::Acquire) {
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else if !patient && spins > 1000 + 2000 {
                return None;
            } else {
                sys::sleep_ms(1);
            }
        }
        // SAFETY: under the mutex, inside a collection, and the owner's
        // append is over: the owner stays out until the claim ends.
        Some(f(unsafe { &mut *self.inner.get() }))
    }
}
