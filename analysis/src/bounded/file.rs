//! The bounded trace file: appended to, and cut at its oldest checkpoint
//! that leaves it within its bound (the bytes from there copied after the
//! header into a new file, which takes the old one's name), so that it
//! always starts with its header and, once cut, with a checkpoint.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A trace file being written, with the offsets of its checkpoints.
pub struct TraceFile {
    path: PathBuf,
    file: File,
    /// The header's bytes (a cut file starts with them again).
    header: Vec<u8>,
    /// Bytes written.
    len: u64,
    /// Offsets of the checkpoints in the file and their times (ns since
    /// the trace's start), oldest first.
    checkpoints: Vec<(u64, u64)>,
    /// Bytes cut from the trace so far.
    pub dropped: u64,
}

impl TraceFile {
    /// Creates the first free name of `candidates` (0600; an existing file
    /// is never overwritten) and writes `header` into it.
    pub fn create(candidates: impl Iterator<Item = String>, header: Vec<u8>) -> Result<TraceFile> {
        let mut last = None;
        for name in candidates {
            match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&name) {
                Ok(file) => {
                    let mut t = TraceFile {
                        path: name.into(),
                        file,
                        len: 0,
                        header: Vec::new(),
                        checkpoints: Vec::new(),
                        dropped: 0,
                    };
                    t.append(&header)?;
                    t.header = header;
                    return Ok(t);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(name),
                Err(e) => return Err(e).with_context(|| format!("{name}: cannot create")),
            }
        }
        anyhow::bail!("{}: exists (a trace is never overwritten)", last.unwrap_or_default())
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes in the file.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Appends `bytes`.
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.file.write_all(bytes).with_context(|| format!("{}: cannot write", self.path.display()))?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// A checkpoint of the books at `time` (ns) starts at the current end.
    pub fn mark_checkpoint(&mut self, time: u64) {
        self.checkpoints.push((self.len, time));
    }

    /// The offset of the oldest checkpoint after which at most `keep`
    /// bytes follow (the newest if none: a checkpoint larger than `keep`).
    pub fn within(&self, keep: u64) -> Option<u64> {
        let c = self.checkpoints.iter().find(|&&(o, _)| self.len - o <= keep).or(self.checkpoints.last());
        c.map(|&(o, _)| o)
    }

    /// The offset of the newest checkpoint at or before `time` (ns).
    pub fn newest_by(&self, time: u64) -> Option<u64> {
        self.checkpoints.iter().rev().find(|&&(_, t)| t <= time).map(|&(o, _)| o)
    }

    /// Cuts the file at the checkpoint at offset `at` (the header stays,
    /// the checkpoint follows it), if that drops anything. Returns the
    /// bytes dropped.
    pub fn cut_at(&mut self, at: u64) -> Result<u64> {
        let head = self.header.len() as u64;
        if at <= head {
            return Ok(0);
        }
        let tmp = PathBuf::from(format!("{}.cut", self.path.display()));
        let mut new = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("{}: cannot create", tmp.display()))?;
        new.write_all(&self.header)?;
        let mut old = File::open(&self.path)?;
        old.seek(SeekFrom::Start(at))?;
        let copied = std::io::copy(&mut old, &mut new)?;
        std::fs::rename(&tmp, &self.path).with_context(|| format!("{}: cannot replace", self.path.display()))?;
        self.file = new;
        self.len = head + copied;
        let shift = at - head;
        self.checkpoints.retain(|&(o, _)| o >= at);
        for (o, _) in &mut self.checkpoints {
            *o -= shift;
        }
        self.dropped += shift;
        Ok(shift)
    }
}
