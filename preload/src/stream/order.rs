//! One order for the stream: watermarks.
//!
//! Each thread buffers its own events in program order, and the writer
//! writes the buffers one after another, so a reader sees the events of
//! different threads in the order the buffers happened to be collected: an
//! exited thread's chunk may come after many later events of another
//! thread on the same addresses. A reader can put every event in its place
//! only if it also learns, from time to time, a time W such that every
//! event stamped before W is already in the stream
//! ([`Record::Watermark`]): it may then order what it read by time up to
//! W, and events of different threads need the allocator's contract only
//! where their stamps are closer than the clocks' skew. This module states
//! W; the analyzer's `order` module merges by it.
//!
//! What holds W back is a thread between its stamp and its push. Most
//! events (allocations, frees, markers) are stamped by their hook just
//! before it unwinds and appends them, without telling anyone: the append
//! compares the stamp with the *epoch* (below) and stamps again if a
//! collection began since, which is then the event's time. That is safe
//! because of `buffer.rs`'s handshake: a collection waits for an append
//! under way, and an append that starts after the collection's claim sees
//! its epoch. The other events are stamped before the real call and
//! buffered after it (realloc's free half, munmap), or kept while the hook
//! runs (nested.rs), where a later time would misplace them: a thread
//! about to take such a stamp marks itself first (record's `slot.rs`,
//! `Slot::mark`), until its hook ends:
//! - Every collection (under the file lock) reads the clock, T, and makes
//!   T the new *epoch*.
//! - A marking thread copies the epoch into its buffer's
//!   [`ThreadBuf::since`](super::ThreadBuf) word with a plain store, and
//!   clears it (release) when its hook ends, after its last push. Its
//!   stamps are at or after the epoch it copied (minus the skew).
//! - A thread whose buffer is not registered yet (its first event) or is
//!   gone (thread exit) counts itself in [`UNMARKED`] (a locked add: rare)
//!   instead.
//! - The collection then opens a claim (`membarrier`, `buffer.rs`): every
//!   store a thread made before it is seen, and every stamp a thread takes
//!   after it is later than T. It reads [`UNMARKED`], then the list of
//!   buffers, then every `since` word, and takes every buffer. A thread
//!   seen unmarked has pushed all it stamped outside an append (the push
//!   precedes the clearing store), or stamps after T from now on. So
//!   W = min(T, every `since` seen) − [`SKEW_NS`] holds, and no watermark
//!   is written while [`UNMARKED`] is not zero.
//! - An idle process still advances W: the writer collects at least
//!   every 50 ms (`QUIET_COLLECT_MS`), and in every 5 ms round where a
//!   buffer is full.
//!
//! A blocked thread with an empty buffer holds nothing back; one preempted
//! after a marked stamp holds W at its epoch until it runs again, one
//! preempted after an unmarked stamp stamps again, and one preempted inside
//! an append makes the collection wait for it. A hook that waits for a
//! report it asked for takes its mark back first (`guard::unmark_now`): the
//! report waits for the watermark. The cost on the hot path: one load of
//! the epoch (a line the writer changes at each collection) per event;
//! for the marked stamps two stores to the thread's own buffer word more,
//! no fence where `membarrier` works.
//!
//! Where `membarrier` cannot be registered, the `since` store is
//! sequentially consistent (a locked instruction, as every append then
//! takes the buffer's mutex anyway) and so is the collection's reading.
//!
//! [`Record::Watermark`]: mtrace_format::Record::Watermark

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// The latest collection's time (ns, at least 1): a hook entering now
/// stamps at or after it. Reset by every new session (a forked child's
/// clock starts again at 0).
static EPOCH: AtomicU64 = AtomicU64::new(1);

/// Hooks under way in threads without a registered buffer (see the module).
static UNMARKED: AtomicU32 = AtomicU32::new(0);

/// The fast handshake is off (`membarrier` not registered): `since` stores
/// are sequentially consistent. Set once per session.
static SLOW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How far behind the collection's clock reading W is put, ns: more than
/// any skew between two threads' stamps (an unfenced `rdtsc` runs at most
/// a reorder window early, invariant TSCs of one machine agree within tens
/// of ns; the analyzer allows 250 ns between threads). W trails the
/// program by a writer round anyway, so a wide margin costs nothing.
pub const SKEW_NS: u64 = 10_000;

/// A new session starts: its clock counts from 0, and `slow` says
/// whether the handshake has no `membarrier`.
pub fn reset(slow: bool) {
    EPOCH.store(1, Ordering::Release);
    SLOW.store(slow, Ordering::Release);
}

/// In a forked child: the only thread left is the forking one, whose
/// hook state was reset (record/slot.rs); no other thread's hook is under way.
pub fn reset_in_child() {
    UNMARKED.store(0, Ordering::Release);
}

/// The latest collection's clock reading, ns: an append whose stamp is
/// older re-stamps (see the module).
#[inline(always)]
pub fn epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

/// How a hook told the writer that it may be stamping events.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mark {
    /// In its thread's buffer word.
    Own,
    /// In [`UNMARKED`].
    Shared,
}

/// Marks the calling thread inside a hook, in `since` (its registered
/// buffer's word) or, with `None`, in [`UNMARKED`]. Before any stamp.
#[inline(always)]
pub fn enter(since: Option<&AtomicU64>) -> Mark {
    match since {
        Some(w) => {
            let epoch = EPOCH.load(Ordering::Relaxed);
            if SLOW.load(Ordering::Relaxed) {
                w.store(epoch, Ordering::SeqCst);
            } else {
                w.store(epoch, Ordering::Relaxed);
                // The store before the stamps that follow, for the
                // compiler; the collector's membarrier does it for the CPU.
                std::sync::atomic::compiler_fence(Ordering::SeqCst);
            }
            Mark::Own
        }
        None => {
            UNMARKED.fetch_add(1, Ordering::SeqCst);
            Mark::Shared
        }
    }
}

/// Leaves what [`enter`] marked, after the hook's last push (`since`: the
/// same word, for [`Mark::Own`]).
#[inline(always)]
pub fn leave(mark: Mark, since: Option<&AtomicU64>) {
    match (mark, since) {
        (Mark::Own, Some(w)) => w.store(0, Ordering::Release),
        (Mark::Own, None) => {}
        (Mark::Shared, _) => {
            UNMARKED.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A thread's mark moves from its buffer word to [`UNMARKED`] (its state
/// is torn down at thread exit while a hook is still under way).
pub fn to_shared(since: &AtomicU64) {
    UNMARKED.fetch_add(1, Ordering::SeqCst);
    since.store(0, Ordering::Release);
}

/// A collection's side, in the order the module describes.
pub struct Reading {
    /// The collection's clock reading, then lowered by every `since` seen;
    /// `None` once no watermark may be written.
    w: Option<u64>,
}

impl Reading {
    /// Step one, before the claim: the clock reading `now`, made the epoch.
    pub fn start(now: u64) -> Reading {
        EPOCH.store(now.max(1), Ordering::Release);
        Reading { w: Some(now) }
    }

    /// Step two, after the claim and before listing the buffers.
    pub fn unmarked(&mut self) {
        if SLOW.load(Ordering::Relaxed) {
            fence(Ordering::SeqCst);
        }
        if UNMARKED.load(Ordering::SeqCst) != 0 {
            self.w = None;
        }
    }

    /// Step three, for each buffer before it is taken: its `since` word.
    pub fn thread(&mut self, since: &AtomicU64) {
        let s = since.load(Ordering::Acquire);
        if s != 0 {
            self.w = self.w.map(|w| w.min(s));
        }
    }

    /// The watermark this collection may state, if any.
    pub fn watermark(&self) -> Option<u64> {
        self.w.map(|w| w.saturating_sub(SKEW_NS))
    }
}
