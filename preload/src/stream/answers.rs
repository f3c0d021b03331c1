//! Report points on a socket stream, answered by its reader: the process
//! has no trace file for its own analyzer to read, so a reader that keeps
//! the books (`mtrace run --max-trace-size`, `mtrace keep`) says
//! `answering` as the connection opens, writes each report point's report
//! and answers `reported SEQ ok|failed` (the commands of
//! `mtrace_format::protocol`, read by the writer's rounds). A program's
//! `mtrace_report()` and `mtrace_scan()` wait here for that answer, so
//! that they return 0 with the file written, as on a file stream.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::platform::sys;

/// How long a report point waits for a reader that has not said
/// `answering` (it may not have been read yet: the reader sends it as the
/// connection opens, the rounds read it), ns.
const UNANNOUNCED_NS: u64 = 1_000_000_000;
/// The longest a report point waits for its answer, ns: a reader making
/// a report of a large heap takes seconds; one that hangs must not hold
/// the program for good.
const ANSWER_NS: u64 = 120_000_000_000;

/// What the reader of a socket stream said of report points.
#[derive(Default)]
pub struct Answers {
    /// The reader answers every report point.
    answering: AtomicBool,
    /// A wait ended without the reader saying `answering`: it never will,
    /// the later report points do not wait for it.
    silent: AtomicBool,
    /// Report points answered and not yet taken by their waiter:
    /// (seq, written).
    done: Mutex<Vec<(u64, bool)>>,
}

impl Answers {
    /// The reader said `answering`.
    pub fn answering(&self) {
        self.answering.store(true, Ordering::Release);
    }

    /// The reader said `reported seq`: the report was `written` or not.
    pub fn answered(&self, seq: u64, written: bool) {
        let mut done = self.done.lock();
        // Answers nobody waits for (signal report points) are not kept
        // for ever: a waiter takes its own within the rounds after it.
        if done.len() >= 64 {
            done.remove(0);
        }
        done.push((seq, written));
    }

    fn take(&self, seq: u64) -> Option<bool> {
        let mut done = self.done.lock();
        let i = done.iter().position(|&(s, _)| s == seq)?;
        Some(done.swap_remove(i).1)
    }

    /// Waits for the answer to report point `seq`: true when the reader
    /// wrote its report. `round` runs between two looks (a process with one
    /// thread reads the commands in its own rounds); `gone` says the stream
    /// ended (a detach, the connection lost). False when the reader did
    /// not say `answering` within a second (at once, after the first time),
    /// and after two minutes without an answer.
    pub fn wait(&self, seq: u64, round: &dyn Fn(), gone: &dyn Fn() -> bool) -> bool {
        let start = sys::monotonic_ns();
        loop {
            round();
            if let Some(written) = self.take(seq) {
                return written;
            }
            let waited = sys::monotonic_ns().saturating_sub(start);
            if !self.answering.load(Ordering::Acquire)
                && (self.silent.load(Ordering::Relaxed) || waited > UNANNOUNCED_NS)
            {
                self.silent.store(true, Ordering::Relaxed);
                return false;
            }
            if gone() || waited > ANSWER_NS {
                return false;
            }
            sys::sleep_ms(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Answers;

    #[test]
    fn a_waiter_takes_its_own_answer_and_no_other() {
        let a = Answers::default();
        a.answering();
        a.answered(1, false);
        a.answered(2, true);
        assert!(a.wait(2, &|| {}, &|| false));
        assert!(!a.wait(1, &|| {}, &|| false));
        // Already taken, and the stream ended: no answer.
        assert!(!a.wait(2, &|| {}, &|| true));
    }

    #[test]
    fn an_answer_read_by_a_round_ends_the_wait() {
        let a = Answers::default();
        a.answering();
        assert!(a.wait(7, &|| a.answered(7, true), &|| false));
    }

    #[test]
    fn without_a_reader_that_answers_the_wait_ends_within_a_second_once() {
        let a = Answers::default();
        let t = std::time::Instant::now();
        assert!(!a.wait(1, &|| {}, &|| false));
        assert!(t.elapsed() >= std::time::Duration::from_secs(1), "{:?}", t.elapsed());
        // The second point does not wait again for a reader that never said it answers.
        let rounds = std::cell::Cell::new(0);
        assert!(!a.wait(2, &|| rounds.set(rounds.get() + 1), &|| false));
        assert_eq!(rounds.get(), 1);
    }
}
