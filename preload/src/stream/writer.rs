//! The writer thread: every 5 ms it notices loaded and unloaded libraries,
//! samples the RSS, carries out commands and makes the reports asked for,
//! and collects every thread's buffer, compresses them and writes them:
//! in that round if a buffer is full, else every 50 ms.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mtrace_format::{Encoder, Record};
use parking_lot::MutexGuard;

use super::{
    current, order, Session, ThreadBuf, BUF_CAP, PENDING_MAX, QUIET_COLLECT_MS, REAP_EVERY, SAMPLE_EVERY,
    SIGNAL_REPORT, WRITER_POLL_MS,
};

use crate::{platform::config, platform::modules, platform::sys};

/// While idle, an RSS sample at least every this many sampling rounds (1 s).
const IDLE_SAMPLE_EVERY: u64 = 100;

/// What the writer's rounds carry from one to the next.
pub(super) struct Rounds {
    round: u64,
    /// Bytes of a command line not complete yet.
    commands: Vec<u8>,
    /// RSS samples: every SAMPLE_EVERY rounds while events come or the
    /// RSS changes; while the program is idle, at twice the interval
    /// each time up to once a second (an idle daemon's trace grew 5 MB
    /// an hour with a sample every 10 ms).
    active: bool,
    last_rss: u64,
    idle_rounds: u64,
    idle_every: u64,
    /// When the buffers were last collected, ns.
    last_collect: u64,
    /// The last round wrote records after its collection (a marker, a
    /// scan): no watermark covers them yet.
    pub(super) late: bool,
}

impl Rounds {
    pub(super) const fn new() -> Rounds {
        Rounds {
            round: 0,
            commands: Vec::new(),
            active: false,
            last_rss: 0,
            idle_rounds: 0,
            idle_every: 1,
            last_collect: 0,
            late: false,
        }
    }
}

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
    fn let_waiters_first(&self) {
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
    pub(super) fn collect(&self, exited_only: bool) -> usize {
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

    fn writer_loop(&self) {
        let gen = self.gen;
        let mut rounds = Rounds::new();
        loop {
            // Behind (threads may be waiting): no pause between rounds.
            if self.pending.load(Ordering::Relaxed) <= PENDING_MAX / 4 {
                sys::sleep_ms(WRITER_POLL_MS);
            }
            if current().map(|s| s.gen) != Some(gen) {
                return;
            }
            if !self.round(&mut rounds, QUIET_COLLECT_MS * 1_000_000, SAMPLE_EVERY) {
                return;
            }
        }
    }

    /// One round of the writer's work, by the writer thread or, while
    /// the process has one thread, by that thread at its events
    /// ([`Session::solo_round`]): module changes, the buffers (collected
    /// when one is full, else `quiet_ns` after the last collection), an
    /// RSS sample every `sample_every` rounds, commands, scan and report
    /// requests. False once tracing stopped (a detach).
    pub(super) fn round(&self, r: &mut Rounds, quiet_ns: u64, sample_every: u64) -> bool {
        r.round += 1;
        if self.is_finished() {
            return true;
        }
        self.clock.refit();
        // Asked of the loader before the file is locked: a thread the
        // leak scan holds may hold the loader's lock, and the scan
        // waits for the file.
        let modules = self.modules_if_changed();
        {
            self.let_waiters_first();
            // A program's thread comes here from a hook (platform/spin.rs: why not park).
            let _f = crate::platform::spin::lock_unparked(&self.file);
            if self.is_finished() {
                return true;
            }
            if let Some(m) = modules {
                self.write_unordered(&m);
            }
            let now = self.now();
            if self.pending.load(Ordering::Relaxed) > 0 || now >= r.last_collect + quiet_ns {
                r.active |= self.collect(false) > 0;
                r.last_collect = now;
            }
            if r.round.is_multiple_of(sample_every) {
                let rss = sys::rss_bytes();
                r.idle_rounds += 1;
                let busy = r.active || rss != Some(r.last_rss);
                if busy || r.idle_rounds >= r.idle_every {
                    if let Some(rss) = rss {
                        self.write_sample(rss);
                        r.last_rss = rss;
                    }
                    r.idle_every = if busy { 1 } else { (r.idle_every * 2).min(IDLE_SAMPLE_EVERY) };
                    (r.active, r.idle_rounds) = (false, 0);
                }
            }
        }
        let spawned = self.spawned_records();
        if !spawned.is_empty() {
            self.let_waiters_first();
            let _f = crate::platform::spin::lock_unparked(&self.file);
            self.write_unordered(&spawned);
        }
        let collected_until = self.written_until.load(Ordering::Relaxed);
        if r.round.is_multiple_of(REAP_EVERY) {
            (crate::UP.reap)();
        }
        if !self.poll_commands(&mut r.commands) {
            return false;
        }
        if crate::stream::reports::take_scan_request() {
            (crate::UP.scan)(self);
        }
        if self.reporter.take_request() {
            self.report_point(SIGNAL_REPORT, None, false);
        }
        self.reporter.reap();
        r.late = self.written_until.load(Ordering::Relaxed) > collected_until;
        true
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
    fn write_sample(&self, rss: u64) {
        let now = self.now();
        let mut buf = Vec::with_capacity(32);
        let mut enc = Encoder::new();
        enc.encode(&mut buf, &Record::Thread { tid: sys::gettid(), time_ns: now });
        enc.encode(&mut buf, &Record::Sample { time_ns: now, rss });
        self.write_unordered(&buf);
    }

    /// The module list's records when a library was loaded or unloaded
    /// since it was last written (dlopen is noticed here, not hooked: see
    /// hooks/process.rs), to write with the file lock held. Asks the
    /// loader, so the caller must not hold the file lock: a thread may
    /// wait for it while holding the loader's lock (a hook in a
    /// `dl_iterate_phdr` callback), and a thread the leak scan holds may
    /// hold the loader's lock while the scan waits for the file.
    pub(super) fn modules_if_changed(&self) -> Option<Vec<u8>> {
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
        (crate::UP.modules_changed)();
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

pub(super) extern "C" fn writer_main(_: *mut libc::c_void) -> *mut libc::c_void {
    (crate::UP.hold_guard)();
    if let Some(s) = current() {
        if let Some((lo, hi)) = sys::own_stack() {
            s.writer_stack[0].store(lo, Ordering::Relaxed);
            s.writer_stack[1].store(hi, Ordering::Relaxed);
        }
        s.writer_tid.store(sys::gettid(), Ordering::Release);
        s.writer_loop();
    }
    std::ptr::null_mut()
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
