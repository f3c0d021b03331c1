//! Which records of a stream go through the merge, and which skip it:
//! a checkpoint's section ([`Record::Checkpoint`] up to its
//! [`Record::CheckpointEnd`], docs/FORMAT.md) restates the books at a
//! moment. A stream that starts with one (a bounded trace whose older
//! part was dropped) is read from it: its records go straight to the books,
//! ahead of everything (their times are the blocks' allocation times, out
//! of order). Anywhere else the books already hold what it says, and it is
//! skipped.

use mtrace_format::Record;

use crate::order::Merge;

/// What the reader does with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Into the merge, as every record of the stream.
    Merge,
    /// Straight to the books: a checkpoint the stream starts with.
    Restore,
    /// Nowhere: a checkpoint after the stream's start.
    Skip,
}

/// The reader's place with respect to checkpoint sections.
#[derive(Default)]
pub struct Sections {
    /// A record other than a checkpoint's was read.
    started: bool,
    /// Inside a section, and where its records go.
    inside: Option<Route>,
}

impl Sections {
    /// Where record `rec` (the next of the stream) goes. A restored
    /// section's records after its first Thread record of a thread (tid
    /// ≠ 0) are those the writer had read and not yet entered (waiting in
    /// its merge): they go to the merge, as the stream's own.
    #[inline]
    pub fn route(&mut self, rec: &Record) -> Route {
        if let Some(route) = self.inside {
            match rec {
                Record::CheckpointEnd { .. } => {
                    self.inside = None;
                    return if route == Route::Skip { Route::Skip } else { Route::Restore };
                }
                Record::Thread { tid, .. } if *tid != 0 && route == Route::Restore => {
                    self.inside = Some(Route::Merge);
                    return Route::Merge;
                }
                _ => return route,
            }
        }
        match rec {
            Record::Checkpoint { .. } => {
                let route = if self.started { Route::Skip } else { Route::Restore };
                self.inside = Some(route);
                route
            }
            // An end without its start: nothing to restore.
            Record::CheckpointEnd { .. } => Route::Skip,
            _ => {
                self.started = true;
                Route::Merge
            }
        }
    }

    /// Hands record `rec` of thread `tid` on by its [`Route`]: into
    /// `merge` (which passes to `out` what it lets go), straight to `out`,
    /// or nowhere. True when it went into the merge.
    #[inline]
    pub fn pass(&mut self, merge: &mut Merge, tid: u32, rec: Record, out: &mut impl FnMut(u32, Record)) -> bool {
        match self.route(&rec) {
            Route::Merge => {
                merge.push(tid, rec, out);
                true
            }
            Route::Restore => {
                out(tid, rec);
                false
            }
            Route::Skip => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Route, Sections};
    use mtrace_format::Record;

    #[test]
    fn a_checkpoint_restores_at_the_start_and_is_skipped_later() {
        let begin = Record::Checkpoint { time_ns: 5, totals: vec![] };
        let end = Record::CheckpointEnd { time_ns: 5, stacks: vec![] };
        let alloc = Record::Stack { id: 1, frames: vec![] };
        let mut s = Sections::default();
        let routes: Vec<Route> =
            [&begin, &alloc, &end, &alloc, &begin, &alloc, &end, &alloc].into_iter().map(|r| s.route(r)).collect();
        use Route::*;
        assert_eq!(routes, [Restore, Restore, Restore, Merge, Skip, Skip, Skip, Merge]);
        // Records the writer had not entered yet: merged.
        let pending = Record::Thread { tid: 7, time_ns: 5 };
        let mut s = Sections::default();
        let routes: Vec<Route> =
            [&begin, &alloc, &pending, &alloc, &end, &alloc].into_iter().map(|r| s.route(r)).collect();
        assert_eq!(routes, [Restore, Restore, Merge, Merge, Restore, Merge]);
        let mut s = Sections::default();
        s.route(&alloc);
        let routes: Vec<Route> = [&begin, &pending, &alloc, &end, &alloc].into_iter().map(|r| s.route(r)).collect();
        assert_eq!(routes, [Skip, Skip, Skip, Skip, Merge]);
    }
}
