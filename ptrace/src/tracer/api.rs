//! A call of mtrace's C API stopped at its stub (crate::api): the tracer
//! does what libmtrace.so's function does (preload/src/hooks/api.rs), then
//! returns to the caller with the function's result.

use mtrace_format::protocol::marker;
use mtrace_format::Record;
use nix::unistd::Pid;

use super::{resume, resume_interrupted, snapshot_now, Tracer};
use crate::api::read_string;
use crate::arch::Regs;
use crate::calls;
use crate::funcs::Api;
use crate::reports;
use crate::snapshot;
use crate::target;

impl Tracer {
    /// Thread `tid` (registers `r`) called `api`; it returns from it here.
    pub(super) fn api_call(&mut self, tid: Pid, api: Api, mut r: Regs) {
        let Some(&(pid, _)) = self.threads.get(&tid) else { return resume(tid, None) };
        let Some(ret) = target::read_u64(pid, r.sp()) else { return resume(tid, None) };
        let t = tid.as_raw() as u32;
        let (a0, a1, a2) = (r.arg(0), r.arg(1), r.arg(2));
        let result = match api {
            Api::Start | Api::Stop => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.set_collecting(t, api == Api::Start);
                }
                0
            }
            Api::Marker => {
                let name = read_string(pid, a0).unwrap_or_default();
                if let Some(p) = self.procs.get_mut(&pid) {
                    let time_ns = p.stream.now();
                    p.stream.record(t, &Record::Marker { time_ns, seq: 0, name });
                }
                0
            }
            Api::Report => self.api_report(tid, pid, read_string(pid, a0), false, &r),
            Api::Scan => self.api_report(tid, pid, read_string(pid, a0), true, &r),
            Api::PoolAlloc | Api::PoolFree => {
                let name = read_string(pid, a0).unwrap_or_default();
                if let Some(p) = self.procs.get_mut(&pid) {
                    let pool = p.pool_id(t, &name);
                    let time_ns = p.stream.now();
                    let rec = if api == Api::PoolAlloc {
                        if !p.collecting {
                            None
                        } else {
                            let at = calls::Entry { regs: &r, stack: target::Stack::Live, time: time_ns };
                            let depth = self.opts.recording.depth;
                            let stack = calls::backtrace(p, t, &at, ret, depth, &mut self.frames);
                            Some(Record::PoolAlloc { time_ns, pool, addr: a1, size: a2, stack })
                        }
                    } else {
                        Some(Record::PoolFree { time_ns, pool, addr: a1 })
                    };
                    if let Some(rec) = rec {
                        p.stream.record(t, &rec);
                    }
                }
                0
            }
        };
        r.return_with(ret, result);
        let _ = target::set_regs(tid, &r);
        self.hold_or_resume(tid, None);
    }

    /// `mtrace_report(path)` (`scan`: `mtrace_scan(path)`, after a leak
    /// scan's snapshot with the calling thread's registers at the call and
    /// the others stopped): a report point whose memlog is written before
    /// the call returns. 0, or -1 (as an int) when it could not be.
    fn api_report(&mut self, tid: Pid, pid: Pid, out: Option<String>, scan: bool, r: &Regs) -> u64 {
        const FAILED: u64 = u32::MAX as u64;
        if self.procs.get(&pid).is_none_or(|p| p.stream.is_live()) {
            // No file for a report to read.
            return FAILED;
        }
        let mut stopped = Vec::new();
        if scan {
            let others: Vec<Pid> = self.threads_of(pid).into_iter().filter(|&t| t != tid).collect();
            stopped = self.interrupt_all(&others);
        }
        let report_dir = self.opts.recording.report_dir.as_deref();
        let child = self.procs.get_mut(&pid).and_then(|p| {
            if scan {
                let mut threads = vec![snapshot::calling_exit(tid, *r)];
                threads.extend(stopped.iter().map(|&(t, r, _)| snapshot::interrupted(t, r)));
                if !snapshot_now(p, pid, &threads) {
                    return None;
                }
            }
            p.reports += 1;
            let name = if scan { marker::SCAN } else { "mtrace_report" };
            let at = reports::Point { tid, pid, seq: p.reports, dir: report_dir };
            reports::point_to(&mut p.stream, at, name, !scan, out.as_deref())
        });
        resume_interrupted(stopped);
        match child.map(|mut c| c.wait()) {
            Some(Ok(status)) if status.success() => 0,
            _ => FAILED,
        }
    }
}
