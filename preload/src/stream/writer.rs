//! Writing the trace: every thread's buffer collected, compressed and
//! written under the file lock (by the writer's rounds, session/, and by
//! whoever writes out of turn: a marker, the snapshot, the end).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mtrace_format::{Encoder, Record};
use parking_lot::MutexGuard;

use super::{order, Session, ThreadBuf, BUF_CAP};

use crate::{platform::config, platform::modules, platform::sys};

impl Session {
    /// Holds the trace file for one writer of many pieces in a row (the
    /// leak scan's snapshot), after writing everything the threads
    /// buffered so far. Not `patient` (a fatal signal's handler): `None`
    /// when the file stays locked for ~2 s, and a buffer whose owner was
    /// interrupted in an append is left as it is (see [`super::end::lock`]).
    pub fn hold_file(&self, patient: bool) -> Option<FileHold<'_>> {
        let g = self.lock_file_in(!patient)?;
        self.collect_with(false, patient);
        Some(FileHold { s: self, _g: g })
    }

    /// [`Session::hold_file`] without writing what the threads buffered
    /// first: for stopping them before a collection (the end of `exit`
    /// holds them for good, and then collects: `snapshot::hold_for_exit`).
    pub fn hold_file_as_is(&self) -> FileHold<'_> {
        FileHold { s: self, _g: self.lock_file() }
    }

    /// The file lock, for a thread other than the writer (a hook's
    /// `close`, the leak scan's snapshot): the writer lets it go first
    /// ([`Session::let_waiters_first`]).
    pub(crate) fn lock_file(&self) -> MutexGuard<'_, ()> {
        // A hook's call comes here (platform/spin.rs: why not park).
        self.wanting_file(|| crate::platform::spin::lock_unparked(&self.file))
    }

    /// [`Session::lock_file`]; in a signal handler (`in_signal`) `None`
    /// once the file has stayed locked for ~2 s (`end::lock`).
    pub(crate) fn lock_file_in(&self, in_signal: bool) -> Option<MutexGuard<'_, ()>> {
        self.wanting_file(|| super::end::lock(&self.file, in_signal))
    }

    /// `take` (a wait for the file lock), counted in `file_wanted` while
    /// it runs.
    fn wanting_file<T>(&self, take: impl FnOnce() -> T) -> T {
        self.file_wanted.fetch_add(1, Ordering::SeqCst);
        let g = take();
        self.file_wanted.fetch_sub(1, Ordering::SeqCst);
        g
    }

    /// Before the writer takes the file lock: sleeps while another thread
    /// waits for it, 20 ms at most a round (a waiter stopped before it
    /// got the lock must not stop the writer). Behind, the writer took the
    /// lock again microseconds after it let it go, round after round, and
    /// a waiter trying once a millisecond (`lock_unparked`) could wait for
    /// ever: CI saw the scan at exit of ctests/scan_busy.c wait 12 minutes
    /// while its four threads allocated.
    pub(super) fn let_waiters_first(&self) {
        for _ in 0..20 {
            if self.file_wanted.load(Ordering::SeqCst) == 0 {
                return;
            }
            sys::sleep_ms(1);
        }
    }

    /// Writes every thread's buffered records, the buffer being filled
    /// included, so that no event waits in a quiet thread for long (a
    /// SIGKILL loses at most the 50 ms between a quiet program's
    /// collections), then, unless `exited_only` (only exited threads'
    /// buffers), the watermark this collection
    /// establishes (order.rs). The caller holds the file lock. Returns the
    /// bytes of records written.
    pub(crate) fn collect(&self, exited_only: bool) -> usize {
        self.collect_with(exited_only, true)
    }

    /// [`Session::collect`]; not `patient` in a fatal signal's handler.
    fn collect_with(&self, exited_only: bool, patient: bool) -> usize {
        // The steps in order.rs's order: clock, claim, shared count, list,
        // each thread's word before its buffer.
        let mut reading = order::Reading::start(self.now());
        let claim = self.handoff.claim();
        reading.unmarked();
        let Some(list) = super::end::lock(&self.threads, !patient) else { return 0 };
        let mut threads: Vec<Arc<ThreadBuf>> = list.clone();
        drop(list);
        config::arrange(self.test.collect, &mut threads, |t| t.exited.load(Ordering::Acquire));
        let mut batch = Vec::new();
        let (mut counted, mut written) = (0, 0);
        let mut taken = Vec::with_capacity(threads.len());
        // Threads that had exited before their buffer was emptied: done.
        let mut done = Vec::new();
        for t in &threads {
            let exited = t.exited.load(Ordering::Acquire);
            if exited_only && !exited {
                continue;
            }
            reading.thread(&t.since);
            let full = t.take(&claim, patient, |b| {
                if !b.cur.is_empty() {
                    let cur = std::mem::replace(&mut b.cur, Vec::with_capacity(BUF_CAP));
                    b.full.push(cur);
                }
                counted += std::mem::take(&mut b.full_bytes);
                std::mem::take(&mut b.full)
            });
            if exited && full.is_some() {
                done.push(Arc::as_ptr(t));
            }
            taken.push(full.unwrap_or_default());
        }
        drop(claim);
        if !exited_only {
            // Every buffer taken (a process with one thread makes no event
            // meanwhile: its own thread collects).
            super::buffer::mtrace_unwritten.store(0, Ordering::Relaxed);
        }
        for full in taken {
            for buf in &full {
                // Blocks stay below the readers' bound (whole buffers, each
                // of whole records, far below it).
                if batch.len() + buf.len() > mtrace_format::MAX_BLOCK_RAW / 2 {
                    self.write_compressed(&std::mem::take(&mut batch));
                }
                batch.extend_from_slice(buf);
                written += buf.len();
            }
        }
        // A watermark while records written may be stamped after the
        // last one (an idle process gets none): in the block with the
        // records it covers, one write.
        if written > 0 {
            self.written_until.fetch_max(self.now(), Ordering::Relaxed);
        }
        let last = self.last_watermark.load(Ordering::Relaxed);
        if let Some(w) = reading.watermark().filter(|_| !exited_only) {
            if w > last && last < self.written_until.load(Ordering::Relaxed) {
                self.last_watermark.store(w, Ordering::Relaxed);
                Encoder::new().encode(&mut batch, &Record::Watermark { time_ns: w });
            }
        }
        self.write_compressed(&batch);
        self.pending.fetch_sub(counted, Ordering::Relaxed);
        if let Some(mut list) = super::end::lock(&self.threads, !patient) {
            list.retain(|t| !done.contains(&Arc::as_ptr(t)));
        }
        written
    }

    /// Writes records outside a collection (the caller holds the file
    /// lock): the next collection's watermark covers them.
    pub(super) fn write_unordered(&self, bytes: &[u8]) {
        self.written_until.fetch_max(self.now(), Ordering::Relaxed);
        self.out.write(bytes);
    }

    /// Writes whole records as one zstd block (level 1: the writer must keep
    /// up with the program), or as they are if compression fails. Runs in
    /// the writer (or a thread holding the file lock), so compression costs
    /// the program no time on its own threads.
    fn write_compressed(&self, raw: &[u8]) {
        if raw.is_empty() {
            return;
        }
        // A hook's write_sync comes here (platform/spin.rs: why not park).
        let mut zstd = crate::platform::spin::lock_unparked(&self.zstd);
        if zstd.is_none() {
            *zstd = super::zstd::Zstd::new();
            if let Some(z) = zstd.as_ref() {
                let (lo, hi) = z.range();
                self.zstd_range[0].store(lo, Ordering::Release);
                self.zstd_range[1].store(hi, Ordering::Release);
            }
        }
        let mut out = Vec::with_capacity(raw.len() / 2 + 16);
        if zstd.as_mut().is_some_and(|z| z.compress_block(raw, &mut out)) {
            self.out.write(&out);
        } else {
            self.out.write(raw);
        }
    }

    /// The records of the programs started since the last call that the
    /// hooks may not follow (spawned.rs), encoded; empty for none. The
    /// caller writes them under the file lock.
    pub(super) fn spawned_records(&self) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut enc = Encoder::new();
        super::spawned::take(|at, pid, path| {
            if buf.is_empty() {
                enc.encode(&mut buf, &Record::Thread { tid: sys::gettid(), time_ns: self.now() });
            }
            let time_ns = self.clock.of_monotonic(at);
            enc.encode(&mut buf, &Record::Spawned { time_ns, pid, path });
        });
        buf
    }

    /// Writes the resident set size (the heap is known to the analyzer).
    /// The caller holds the file lock.
    pub(super) fn write_sample(&self, rss: u64) {
        let now = self.now();
        let mut buf = Vec::with_capacity(32);
        let mut enc = Encoder::new();
        enc.encode(&mut buf, &Record::Thread { tid: sys::gettid(), time_ns: now });
        enc.encode(&mut buf, &Record::Sample { time_ns: now, rss });
        self.write_unordered(&buf);
    }

    /// The module list's records when a library was loaded or unloaded
    /// since it was last written (the session then redirects the new
    /// modules' calls after `mtrace attach`) (dlopen is noticed here, not hooked: see
    /// hooks/process.rs), to write with the file lock held. Asks the
    /// loader, so the caller must not hold the file lock: a thread may
    /// wait for it while holding the loader's lock (a hook in a
    /// `dl_iterate_phdr` callback), and a thread the leak scan holds may
    /// hold the loader's lock while the scan waits for the file.
    pub fn modules_if_changed(&self) -> Option<Vec<u8>> {
        if self.loader_off.load(Ordering::Acquire) {
            return None;
        }
        let g = modules::generation();
        let mut last = self.modules_gen.lock();
        if *last == g {
            return None;
        }
        *last = g;
        #[cfg(target_arch = "x86_64")]
        crate::unwind::fast::refresh();
        let now = self.now();
        let mut out = Vec::with_capacity(4096);
        let mut enc = Encoder::new();
        enc.encode(&mut out, &Record::Thread { tid: sys::gettid(), time_ns: now });
        enc.encode(&mut out, &Record::Modules { time_ns: now, modules: modules::list() });
        Some(out)
    }
}

/// The trace file, held (see [`Session::hold_file`]).
pub struct FileHold<'a> {
    s: &'a Session,
    _g: parking_lot::MutexGuard<'a, ()>,
}

impl FileHold<'_> {
    /// Writes bytes that are whole records (or the rest of a record begun
    /// by the previous call).
    pub fn write(&self, bytes: &[u8]) {
        self.s.write_unordered(bytes);
    }
}

impl Session {
    /// The writer thread's id, waiting (up to 200 ms) for a writer that was
    /// started but has not run yet; 0 if there is none.
    pub fn writer_tid(&self) -> u32 {
        for _ in 0..200 {
            let tid = self.writer_tid.load(Ordering::Acquire);
            if tid != 0 || !self.writer_started.load(Ordering::Acquire) {
                return tid;
            }
            sys::sleep_ms(1);
        }
        0
    }
}
