//! What a batch of merged records tells about the events still to come:
//! for each record, the earliest time another thread's next record can
//! have. With it the books enter an event at once, instead of holding it
//! until the stream is [`crate::books::EPS`] past it (`books/ties.rs`),
//! when no other thread's event can come close enough to be tied with it:
//! a single-threaded program's events all go so (a tenth of a report's
//! time on cxx's and python3's traces, which the holding took).
//!
//! The merge hands records on in time order (`crate::order`, streams with
//! watermarks): every record after a batch's last is stamped at or after
//! it. So for a record of thread T, another thread's events still to come
//! are stamped at or after the first timed record of another thread later
//! in the batch, or, if there is none, the batch's last time.

use mtrace_format::Record;

/// For each record of a batch (`recs`, of threads `tids`), in `until`
/// (cleared first): the earliest
/// stamp (ns) another thread's record still to come can have; 0 where
/// nothing is promised. Nothing is promised for a batch out of time order
/// (a stream without watermarks, a merge that had to trail its input:
/// `crate::order::MAX_QUEUED`), nor when `in_order` is false; `last` is the
/// latest stamp of the batches before, updated.
pub fn promises(tids: &[u32], recs: &[Record], in_order: bool, last: &mut u64, until: &mut Vec<u64>) {
    until.clear();
    let mut prev = *last;
    let mut sorted = in_order;
    // Each record's stamp, the one the merge ordered it by.
    for t in recs.iter().filter_map(Record::time_ns) {
        sorted &= t >= prev;
        prev = t;
    }
    *last = prev;
    until.resize(recs.len(), 0);
    if !sorted {
        return;
    }
    // Backwards, by runs of one thread: a run's records are promised the
    // earliest stamp after the run (the time order makes that the next
    // run's first); the last run, the batch's last stamp.
    let mut bound = prev;
    let mut run: Option<u32> = None;
    let mut run_first = u64::MAX;
    for (i, (&tid, rec)) in tids.iter().zip(recs).enumerate().rev() {
        if run != Some(tid) {
            bound = bound.min(run_first);
            run = Some(tid);
            run_first = u64::MAX;
        }
        until[i] = bound;
        if let Some(t) = rec.time_ns() {
            run_first = t;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(tid: u32, time_ns: u64) -> (u32, Record) {
        let family = mtrace_format::Family::Malloc;
        (tid, Record::Alloc { time_ns, family, addr: 0x10, size: 8, stack: 1, align: 0 })
    }

    /// [`promises`] of a batch given as (thread, record) pairs.
    fn promises(batch: &[(u32, Record)], in_order: bool, last: &mut u64, until: &mut Vec<u64>) {
        let (tids, recs): (Vec<u32>, Vec<Record>) = batch.iter().cloned().unzip();
        super::promises(&tids, &recs, in_order, last, until);
    }

    #[test]
    fn each_record_is_promised_the_next_other_thread_stamp() {
        let batch = [alloc(1, 100), alloc(1, 200), alloc(2, 300), alloc(2, 400), alloc(1, 500), alloc(1, 900)];
        let (mut last, mut until) = (0, Vec::new());
        promises(&batch, true, &mut last, &mut until);
        assert_eq!(until, [300, 300, 500, 500, 900, 900]);
        assert_eq!(last, 900);
        // A stamp before the last batch's: nothing promised.
        promises(&[alloc(1, 800), alloc(1, 1000)], true, &mut last, &mut until);
        assert_eq!(until, [0, 0]);
        assert_eq!(last, 1000);
        // Out of order within the batch, or a stream without watermarks.
        promises(&[alloc(1, 2000), alloc(2, 1500)], true, &mut last, &mut until);
        assert_eq!(until, [0, 0]);
        promises(&[alloc(1, 3000), alloc(1, 4000)], false, &mut last, &mut until);
        assert_eq!(until, [0, 0]);
    }

    #[test]
    fn an_untimed_record_of_another_thread_bounds_nothing_itself() {
        // A Stack record goes right before its thread's next record: the
        // stamp that bounds is that record's.
        let stack = (2, Record::Stack { id: 7, frames: vec![1] });
        let batch = [alloc(1, 100), stack, alloc(2, 300), alloc(1, 600)];
        let (mut last, mut until) = (0, Vec::new());
        promises(&batch, true, &mut last, &mut until);
        assert_eq!(until, [300, 600, 600, 600]);
    }
}
