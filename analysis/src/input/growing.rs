//! A trace file read while its process still writes it: the reader waits
//! at the file's end for more instead of taking the end as the stream's,
//! until it is told the writer is gone (`mtrace run` keeps the program's
//! books so, `pipeline/following.rs`). The preload only appends to its
//! file, so every byte read stays what it was.

use std::fs::File;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long the reader sleeps at the file's end before it looks again, at
/// first: a program's writer round comes every 5 to 50 ms.
const POLL: Duration = Duration::from_millis(2);
/// The longest sleep, after the file has not grown for a while (an idle
/// server's trace is looked at 30 times a second, not 500).
const POLL_IDLE: Duration = Duration::from_millis(32);

/// A file that grows while it is read (see the module's doc).
pub struct Growing {
    file: File,
    /// Set once nothing more will be written: the end of the file is then
    /// the end of the stream.
    done: Arc<AtomicBool>,
    /// The next sleep at the file's end: doubled while it does not grow.
    wait: Duration,
}

impl Growing {
    /// Reads `file` from its current offset, waiting at its end until
    /// `done` is set.
    pub fn new(file: File, done: Arc<AtomicBool>) -> Growing {
        Growing { file, done, wait: POLL }
    }
}

impl Read for Growing {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let n = self.file.read(buf)?;
            if n > 0 || buf.is_empty() {
                self.wait = POLL;
                return Ok(n);
            }
            if self.done.load(Ordering::Acquire) {
                // What was written between the read above and the flag.
                return self.file.read(buf);
            }
            std::thread::sleep(self.wait);
            self.wait = (self.wait * 2).min(POLL_IDLE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn waits_at_the_end_until_the_writer_is_done() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let mut w = File::create(&path).unwrap();
        w.write_all(b"abc").unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let mut g = Growing::new(File::open(&path).unwrap(), done.clone());
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            g.read_to_end(&mut all).unwrap();
            all
        });
        // The reader has taken "abc" and waits: what comes later is read,
        // and the end comes only with the flag.
        std::thread::sleep(Duration::from_millis(30));
        w.write_all(b"def").unwrap();
        std::thread::sleep(Duration::from_millis(30));
        assert!(!reader.is_finished(), "the reader took the file's end as the stream's");
        w.write_all(b"g").unwrap();
        done.store(true, Ordering::Release);
        assert_eq!(reader.join().unwrap(), b"abcdefg");
    }
}
