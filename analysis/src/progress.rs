//! The progress bar on stderr while a large trace is read (indicatif):
//! only on a terminal, so that logs, pipes and tests see nothing of it.

use std::io::{IsTerminal, Read};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Traces smaller than this (bytes) are read too fast to need a bar.
const FROM_BYTES: u64 = 32 << 20;

/// A bar over the bytes of a trace file, or nothing.
pub struct Bar(Option<ProgressBar>);

impl Bar {
    /// A bar for a file of `len` bytes, when stderr is a terminal and the
    /// file is large.
    pub fn for_file(len: u64) -> Bar {
        if len < FROM_BYTES || !std::io::stderr().is_terminal() {
            return Bar(None);
        }
        let style =
            ProgressStyle::with_template("reading {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left) {wide_bar}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
        let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr()).with_style(style);
        Bar(Some(b))
    }

    /// `r`, counting what is read from it on the bar.
    pub fn reader<R: Read>(&self, r: R) -> Counting<R> {
        Counting { inner: r, bar: self.0.clone() }
    }

    /// Removes the bar.
    pub fn finish(self) {
        if let Some(b) = self.0 {
            b.finish_and_clear();
        }
    }
}

/// A reader that moves a bar by the bytes read.
pub struct Counting<R> {
    inner: R,
    bar: Option<ProgressBar>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(b) = &self.bar {
            b.inc(n as u64);
        }
        Ok(n)
    }
}
