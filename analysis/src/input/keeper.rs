//! Keeping the books of a stream one record at a time: what
//! [`super::load_from`] does with each record, and what the console does
//! with a stream that is still arriving.

use anyhow::Result;
use mtrace_format::{region_kind, EndReason, Family, Record};

use crate::books::wrong::Dealloc;
use crate::books::Block;
use mtrace_format::functions::INTERPOSED;
use mtrace_format::protocol::marker::SYNC as SYNC_MARKER;

use crate::trace::{MarkerSeen, ModuleSeen, TimePoint, Trace, Window, ATTACH_MARKER, SCAN_MARKER};

/// A pool block's key in the books: its address in the pool's own space,
/// apart from heap addresses (user space is below 2^47) and other pools.
/// Its own inverse: the key of a key is the address.
pub fn pool_key(pool: u32, addr: u64) -> u64 {
    addr ^ ((pool as u64) << 48)
}

/// What the reader does after a record: go on, or stop (the window's
/// `until` marker was reached).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Go on reading.
    Go,
    /// The window's `until` marker was reached: stop.
    Until,
}

/// Keeps the books of a stream one record at a time: what [`super::load_from`]
/// does with each record, and what `mtrace`'s console does with a stream
/// that is still arriving.
pub struct Keeper<'w> {
    w: &'w Window,
    /// Latest event time, ns.
    now: u64,
    /// The regions of a snapshot being read (until its ScanEnd), each
    /// with its time: the merge may hand them on ahead of the events
    /// before them (`Merge::snapshots_at_once`), and so of an earlier
    /// snapshot's ScanEnd; a snapshot's regions have its ScanEnd's time.
    regions: Vec<(u64, crate::trace::Region)>,
    /// That snapshot's threads were stopped by signal, for this reason
    /// (with its time, as the regions).
    stopped_by_signal: Option<(u64, String)>,
    /// An event at or after this time (ns) crosses an edge of the window's
    /// time range ([`Keeper::cross`]); `u64::MAX`: none left.
    edge: u64,
    /// Inside the checkpoint a bounded trace starts with
    /// ([`super::Route::Restore`]): its blocks are live ones, not
    /// allocation calls, and the window's edges wait for its end.
    restoring: bool,
}

impl<'w> Keeper<'w> {
    /// A keeper of the records inside window `w`.
    pub fn new(w: &'w Window) -> Keeper<'w> {
        Keeper { w, now: 0, regions: Vec::new(), stopped_by_signal: None, edge: Self::first_edge(w), restoring: false }
    }

    /// The first time at which an event crosses an edge of window `w`.
    fn first_edge(w: &Window) -> u64 {
        w.from_ns.or(w.to_ns.map(|t| t.saturating_add(1))).unwrap_or(u64::MAX)
    }

    /// [`Keeper::apply_other`] of a record inside the checkpoint a bounded
    /// trace starts with, where it differs: `None` when it does not.
    #[cold]
    fn restore(&mut self, t: &mut Trace, rec: Record) -> Option<Record> {
        match rec {
            Record::Alloc { time_ns, family, addr, size, stack, align } => {
                let (stack, align) = (t.stacks.canon(stack), crate::books::wrong::align_code(align));
                t.books.restore_block(addr, Block { size, stack, family, time: time_ns, align }, false);
            }
            Record::Mmap { time_ns, addr, len, stack, .. } => {
                let stack = t.stacks.canon(stack);
                t.books.restore_block(
                    addr,
                    Block { size: len, stack, family: Family::Mmap, time: time_ns, align: 0 },
                    true,
                );
            }
            Record::PoolAlloc { time_ns, pool, addr, size, stack } => {
                let canon = t.stacks.canon(stack);
                let stack = t.stacks.for_pool(canon, pool);
                let b = Block { size, stack, family: Family::Pool, time: time_ns, align: 0 };
                t.books.restore_block(pool_key(pool, addr), b, false);
            }
            // History: listed, never a window's edge.
            Record::Marker { time_ns, seq, name } => {
                t.attached |= seq == 0 && name == ATTACH_MARKER;
                t.markers.push(MarkerSeen { seq, name, time_ns });
            }
            Record::CheckpointEnd { time_ns, stacks } => {
                for s in stacks {
                    let c = t.stacks.canon(s.id);
                    let totals = crate::books::StackTotals { allocations: s.allocations, bytes: s.bytes };
                    t.books.restore_stack(c, totals, (s.peak_bytes, s.peak_blocks));
                }
                self.restoring = false;
                self.edge = Self::first_edge(self.w);
                self.now = time_ns;
                t.last_time = t.last_time.max(time_ns);
            }
            rec => return Some(rec),
        }
        None
    }

    /// An event at `time` (ns) reached [`Keeper::edge`]: at `--from`, the
    /// live blocks before it become the baseline (as at a `--since-marker`);
    /// past `--to`, reading stops before it (as at an `--until-marker`).
    #[cold]
    #[inline(never)]
    fn cross(&mut self, t: &mut Trace, time: u64) -> Flow {
        if self.w.from_ns.is_some_and(|f| time >= f) && t.baseline.is_none() {
            t.books.settle();
            t.baseline = Some(t.books.live_by_stack());
        }
        if let Some(to) = self.w.to_ns {
            if time > to {
                t.last_time = t.last_time.max(self.now);
                t.reached_until = true;
                self.edge = u64::MAX;
                return Flow::Until;
            }
        }
        self.edge = self.w.to_ns.map_or(u64::MAX, |t| t.saturating_add(1));
        Flow::Go
    }

    /// Enters record `rec` of thread `tid` into `t`.
    pub fn apply(&mut self, t: &mut Trace, tid: u32, rec: Record) -> Flow {
        match rec {
            Record::Alloc { time_ns, family, addr, size, stack, align } => {
                self.alloc(t, tid, time_ns, family, addr, size, stack, align)
            }
            Record::Free { time_ns, family, addr, stack, size, align } => {
                self.free(t, tid, time_ns, family, addr, stack, (size, align))
            }
            _ => self.apply_other(t, tid, rec),
        }
    }

    /// [`Keeper::apply`] of a record that is neither an Alloc nor a Free.
    fn apply_other(&mut self, t: &mut Trace, tid: u32, rec: Record) -> Flow {
        // (A watermark's time is no event's.)
        if let Some(time) = rec.time_ns().filter(|&at| at >= self.edge && !matches!(rec, Record::Watermark { .. })) {
            if self.cross(t, time) == Flow::Until {
                return Flow::Until;
            }
        }
        // The console's question (protocol::marker::SYNC): no point of the
        // program's, listed nowhere.
        if matches!(&rec, Record::Marker { name, .. } if name == SYNC_MARKER) {
            return Flow::Go;
        }
        t.records += 1;
        let rec = match self.restoring {
            true => match self.restore(t, rec) {
                Some(rec) => rec,
                None => return Flow::Go,
            },
            false => rec,
        };
        let now = &mut self.now;
        match rec {
            Record::Checkpoint { time_ns, totals } => {
                // Only one a stream starts with comes here (super::Sections).
                for (name, v) in totals {
                    if name == "records" {
                        t.records = v;
                    }
                    t.books.restore_counter(&name, v);
                }
                *now = time_ns;
                t.kept_from = Some(time_ns);
                self.restoring = true;
                self.edge = u64::MAX;
            }
            // One without its start (super::Sections skips it).
            Record::CheckpointEnd { .. } => {}
            // Handed on ahead of the queued records (crate::order): its
            // time is not the books' now.
            Record::Thread { .. } => {}
            Record::Stack { id, frames } => t.stacks.define(id, frames, *now),
            // Not here: `apply` gives them to `alloc` and `free`.
            Record::Alloc { .. } | Record::Free { .. } => return Flow::Go,
            Record::Coverage { time_ns, collecting, whole } => {
                // Events before it judged as the stream was then.
                t.books.settle();
                *now = time_ns;
                t.books.whole = whole && !t.attached;
                t.books.collecting_since = collecting.then_some(time_ns);
            }
            Record::Realloc { time_ns, free_time_ns, old, new: 0, stack, .. } => {
                // The free half (the merge hands a realloc on as its two
                // halves, crate::order), or the process ended inside it.
                *now = time_ns;
                let stack = (stack != 0).then(|| t.stacks.canon(stack));
                t.books.realloc_free(tid, old, free_time_ns, stack);
            }
            Record::Realloc { time_ns, old: 0, new, size, stack, .. } => {
                // The allocation half, counted as its record already was.
                t.records -= 1;
                *now = time_ns;
                let stack = t.stacks.canon(stack);
                t.books.alloc(tid, new, Block { size, stack, family: Family::Malloc, time: time_ns, align: 0 });
                t.stats.alloc(tid, new, size, stack);
            }
            Record::Realloc { time_ns, free_time_ns, old, new, size, stack } => {
                *now = time_ns;
                let stack = t.stacks.canon(stack);
                t.books.realloc(
                    tid,
                    old,
                    free_time_ns,
                    new,
                    Block { size, stack, family: Family::Malloc, time: time_ns, align: 0 },
                );
                t.stats.alloc(tid, new, size, stack);
            }
            // An inaccessible mapping reserves address space and takes no
            // memory (Chromium's PartitionAlloc and V8 reserve gigabytes to
            // terabytes so, and commit pages with mprotect): not a block.
            // Its munmap is then one of nothing mapped.
            Record::Mmap { time_ns, prot: 0, .. } => *now = time_ns,
            Record::Mmap { time_ns, addr, len, stack, .. } => {
                *now = time_ns;
                let stack = t.stacks.canon(stack);
                t.books.mmap(addr, Block { size: len, stack, family: Family::Mmap, time: time_ns, align: 0 });
            }
            Record::Munmap { time_ns, addr, len } => {
                *now = time_ns;
                t.books.munmap(addr, len, time_ns);
            }
            Record::Mremap { time_ns, old, old_len, new, new_len, stack } => {
                *now = time_ns;
                let stack = t.stacks.canon(stack);
                t.books.mremap(
                    old,
                    old_len,
                    new,
                    Block { size: new_len, stack, family: Family::Mmap, time: time_ns, align: 0 },
                );
            }
            Record::Modules { time_ns, modules } => {
                *now = time_ns;
                for m in modules {
                    let known = t
                        .modules
                        .iter()
                        .any(|s| s.module.path == m.path && s.module.bias == m.bias && s.module.build_id == m.build_id);
                    if !known {
                        t.modules.push(ModuleSeen { module: m, time: time_ns });
                    }
                }
            }
            Record::End { time_ns, reason } => {
                *now = time_ns;
                t.end = Some(reason);
                t.books.settle();
                // The RSS sample the end writes just before it (in the same
                // block) came before the events the end released: its heap
                // is the books' at the end.
                if let Some(p) = t.timeline.last_mut().filter(|p| p.time_ns == time_ns) {
                    (p.heap_bytes, p.heap_blocks) = (t.books.cur_bytes, t.books.cur_blocks);
                }
            }
            // Written once, before any allocation: the rate applies to
            // the whole trace (a block's estimate must not change between
            // its allocation and its free).
            Record::Sampling { rate, .. } => {
                if t.books.sample_rate == 0 {
                    t.books.sample_rate = rate;
                    t.stats.sample_rate = rate;
                }
            }
            // After the records it released (crate::order): no event
            // before it is still to come.
            Record::Watermark { time_ns } => t.books.advance(time_ns),
            Record::PoolName { id, name } => {
                t.pools.insert(id, name);
            }
            Record::PoolAlloc { time_ns, pool, addr, size, stack } => {
                *now = time_ns;
                let canon = t.stacks.canon(stack);
                let stack = t.stacks.for_pool(canon, pool);
                t.books.alloc(
                    tid,
                    pool_key(pool, addr),
                    Block { size, stack, family: Family::Pool, time: time_ns, align: 0 },
                );
            }
            Record::PoolFree { time_ns, pool, addr } => {
                *now = time_ns;
                let d = Dealloc { family: Family::Pool, stack: None, realloc: false, size: 0, align: 0 };
                t.books.dealloc(tid, pool_key(pool, addr), time_ns, d);
            }
            Record::ScanRegion { time_ns, kind: region_kind::STOPPED_BY_SIGNAL, bytes, .. } => {
                self.stopped_by_signal = Some((time_ns, String::from_utf8_lossy(&bytes).into_owned()));
            }
            Record::ScanRegion { time_ns, kind, addr, bytes } => {
                // The reader has checked a sparse payload: an error cannot
                // happen here, and the region would be left out.
                if let Ok(r) = crate::trace::Region::of_record(kind, addr, bytes, crate::trace::Word::of(&t.header)) {
                    self.regions.push((time_ns, r));
                }
            }
            Record::ScanEnd { time_ns } => {
                let (this, later) = std::mem::take(&mut self.regions).into_iter().partition(|(at, _)| *at <= time_ns);
                self.regions = later;
                t.snapshot = Some(this.into_iter().map(|(_, r)| r).collect());
                t.snapshot_stopped_by_signal =
                    self.stopped_by_signal.take_if(|(at, _)| *at <= time_ns).map(|(_, why)| why);
                t.snapshot_time = time_ns;
                t.snapshot_on_demand = false;
            }
            Record::Sample { time_ns, rss } => {
                *now = time_ns;
                // The heap then: the events stamped before it are in the
                // stream before it (crate::order), those more than EPS
                // before it past the ties' doubt.
                t.books.advance(time_ns);
                t.timeline.push(TimePoint {
                    time_ns,
                    rss_bytes: rss,
                    heap_bytes: t.books.cur_bytes,
                    heap_blocks: t.books.cur_blocks,
                });
            }
            Record::Exec { time_ns, path } => {
                *now = time_ns;
                t.exec = Some(path);
            }
            // For the reader that makes the report point's report
            // (bounded::ReportPoints); nothing for the books.
            Record::ReportTo { time_ns, seq, path } => {
                *now = time_ns;
                t.report_to.push((seq, path));
            }
            Record::Spawned { time_ns, pid, path } => {
                *now = time_ns;
                t.spawned.push((time_ns, pid, path));
            }
            Record::Patched { time_ns, patch } => {
                t.books.settle();
                *now = time_ns;
                // Only the malloc family and the C++ operators: an
                // allocator of the program's own, with functions of its
                // own no producer follows (Chromium's
                // base::UncheckedMalloc); a known allocator's API (tc_*,
                // mallocx) is followed whole.
                let interposed = |n: &String| INTERPOSED.iter().any(|(m, _)| m == n);
                t.books.every_path_seen &= patch.hooked.is_empty() || !patch.hooked.iter().all(interposed);
                t.patched.push(*patch);
            }
            Record::Marker { time_ns, seq, name } => {
                // The books of this moment: every event before it entered.
                t.books.settle();
                *now = time_ns;
                let nth = 1 + t.markers.iter().filter(|m| m.name == name).count();
                let w = self.w;
                let since = w.since.as_ref().is_some_and(|m| m.matches(seq, &name, nth)) && t.baseline.is_none();
                let until = w.until.as_ref().is_some_and(|m| m.matches(seq, &name, nth));
                t.snapshot_on_demand |= t.snapshot.is_some() && name == SCAN_MARKER;
                t.attached |= seq == 0 && name == ATTACH_MARKER;
                t.books.whole &= !t.attached;
                t.markers.push(MarkerSeen { seq, name, time_ns });
                if since {
                    t.baseline = Some(t.books.live_by_stack());
                }
                if until {
                    t.last_time = t.last_time.max(*now);
                    t.reached_until = true;
                    return Flow::Until;
                }
            }
        }
        t.last_time = t.last_time.max(*now);
        Flow::Go
    }

    /// [`Keeper::apply`] of an Alloc record (`align`: an aligned
    /// `operator new`'s alignment, bytes, or 0).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn alloc(
        &mut self,
        t: &mut Trace,
        tid: u32,
        time_ns: u64,
        family: Family,
        addr: u64,
        size: u64,
        stack: u32,
        align: u64,
    ) -> Flow {
        if self.restoring {
            let rec = Record::Alloc { time_ns, family, addr, size, stack, align };
            let _ = self.restore(t, rec);
            return Flow::Go;
        }
        if time_ns >= self.edge && self.cross(t, time_ns) == Flow::Until {
            return Flow::Until;
        }
        t.records += 1;
        self.now = time_ns;
        let stack = t.stacks.canon(stack);
        let align = crate::books::wrong::align_code(align);
        t.books.alloc(tid, addr, Block { size, stack, family, time: time_ns, align });
        if family != Family::Internal {
            t.stats.alloc(tid, addr, size, stack);
        }
        t.last_time = t.last_time.max(time_ns);
        Flow::Go
    }

    /// [`Keeper::apply`] of a Free record (`told`: the size and alignment
    /// a sized or aligned deallocation was told, bytes, or 0).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn free(
        &mut self,
        t: &mut Trace,
        tid: u32,
        time_ns: u64,
        family: Family,
        addr: u64,
        stack: u32,
        told: (u64, u64),
    ) -> Flow {
        if time_ns >= self.edge && self.cross(t, time_ns) == Flow::Until {
            return Flow::Until;
        }
        t.records += 1;
        self.now = time_ns;
        let stack = (stack != 0).then(|| t.stacks.canon(stack));
        let (size, align) = told;
        t.books.dealloc(tid, addr, time_ns, Dealloc { family, stack, realloc: false, size, align });
        t.stats.free(tid, addr);
        t.last_time = t.last_time.max(time_ns);
        Flow::Go
    }

    /// After the last record: drops an on-demand snapshot the window read
    /// past, and fails when a marker of the window was not in the trace.
    pub fn finish(&self, t: &mut Trace) -> Result<()> {
        t.books.settle();
        // An on-demand scan describes its own moment: a report that reads past
        // it (the program went on) does not classify with it. But the scan
        // `mtrace attach --scan` asks for right before its detach is the
        // window's last moment.
        let scan_at_detach = t.end == Some(EndReason::Detach);
        if t.snapshot_on_demand && !t.reached_until && !scan_at_detach {
            t.snapshot = None;
            t.snapshot_time = u64::MAX;
        }
        let path = t.path.display();
        if let Some(m) = &self.w.since {
            anyhow::ensure!(t.baseline.is_some(), "{path}: no marker {:?} in the trace", m.0);
        }
        if let Some(m) = &self.w.until {
            anyhow::ensure!(t.reached_until, "{path}: no marker {:?} in the trace", m.0);
        }
        if let (Some(f), Some(kept)) = (self.w.from_ns, t.kept_from) {
            anyhow::ensure!(
                f >= kept,
                "{path}: --from {:.3} s is before the trace's start: it was kept from {:.3} s on (--max-trace-size or --max-trace-age)",
                f as f64 / 1e9,
                kept as f64 / 1e9
            );
        }
        if let Some(f) = self.w.from_ns {
            anyhow::ensure!(
                t.baseline.is_some(),
                "{path}: --from {:.3} s is after the trace's last event ({:.3} s)",
                f as f64 / 1e9,
                t.last_time as f64 / 1e9
            );
        }
        Ok(())
    }
}
