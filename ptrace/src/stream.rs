//! One process's stream, as libmtrace.so writes it (docs/FORMAT.md): the
//! header, then records in the order the tracer saw the events, a Thread
//! record whenever the thread changes, compressed a block at a time.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use anyhow::{Context, Result};
use mtrace_format::{encode_compressed, encode_header, naming, Encoder, Header, Record};
use rustc_hash::FxHashMap as HashMap;

/// Records collected before they are compressed and written, bytes.
const BLOCK: usize = 1 << 20;

pub struct Stream {
    file: File,
    /// Where `file` is: the pattern's expansion, or it with a suffix.
    path: String,
    enc: Encoder,
    buf: Vec<u8>,
    tid: u32,
    /// Backtraces defined so far, and the next id.
    stacks: HashMap<Vec<u64>, u32>,
    next_stack: u32,
    /// CLOCK_MONOTONIC at the start, ns: record times count from it.
    start: u64,
    ended: bool,
}

fn monotonic_ns() -> u64 {
    let t =
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn realtime_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME).unwrap_or(nix::sys::time::TimeSpec::new(0, 0));
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

impl Stream {
    /// A new stream file for process `pid` (a taken name gets `.1`, `.2`,
    /// … as libmtrace.so's), mode 0600.
    pub fn create(pattern: &str, pid: u32, ppid: u32) -> Result<Stream> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default();
        let cmdline = naming::cmdline_args(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default());
        let base = naming::expand(pattern, pid, &naming::program_name(&cmdline));
        let mut last = None;
        for i in 0..1000 {
            let path = if i == 0 { base.clone() } else { format!("{base}.{i}") };
            match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
                Ok(file) => {
                    let start = monotonic_ns();
                    let header = Header {
                        version: mtrace_format::VERSION,
                        pointer_size: 8,
                        big_endian: cfg!(target_endian = "big"),
                        arch: std::env::consts::ARCH.into(),
                        pid,
                        ppid,
                        exe,
                        cmdline,
                        start_realtime_ns: realtime_ns(),
                        start_monotonic_ns: start,
                    };
                    let mut s = Stream {
                        file,
                        path,
                        enc: Encoder::new(),
                        buf: Vec::with_capacity(BLOCK + 4096),
                        tid: 0,
                        stacks: HashMap::default(),
                        next_stack: 1,
                        start,
                        ended: false,
                    };
                    let mut head = Vec::new();
                    encode_header(&mut head, &header);
                    s.file.write_all(&head)?;
                    return Ok(s);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(|| anyhow::anyhow!("no free name"), Into::into))
            .with_context(|| format!("{base}: cannot create"))
    }

    /// The path of the stream file (a taken name's gets a suffix).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// ns since the stream started.
    pub fn now(&self) -> u64 {
        monotonic_ns().saturating_sub(self.start)
    }

    /// The id of backtrace `frames`, defined in the stream if new (0: none).
    pub fn stack(&mut self, tid: u32, frames: &[u64]) -> u32 {
        if frames.is_empty() {
            return 0;
        }
        if let Some(&id) = self.stacks.get(frames) {
            return id;
        }
        let id = self.next_stack;
        self.next_stack += 1;
        self.thread(tid);
        self.enc.stack(&mut self.buf, id, frames);
        self.stacks.insert(frames.to_vec(), id);
        id
    }

    fn thread(&mut self, tid: u32) {
        if tid != self.tid || self.buf.is_empty() {
            let time_ns = self.now();
            self.enc.encode(&mut self.buf, &Record::Thread { tid, time_ns });
            self.tid = tid;
        }
    }

    /// Appends `rec`, an event of thread `tid`.
    pub fn record(&mut self, tid: u32, rec: &Record) {
        if self.ended {
            return;
        }
        self.thread(tid);
        self.enc.encode(&mut self.buf, rec);
        if self.buf.len() >= BLOCK {
            let _ = self.flush();
        }
    }

    /// Writes what was collected.
    pub fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let mut out = Vec::with_capacity(self.buf.len() / 3);
        encode_compressed(&mut out, &self.buf, 1)?;
        self.file.write_all(&out)?;
        self.buf.clear();
        // The next chunk starts with a Thread record (its times are deltas).
        self.tid = 0;
        Ok(())
    }

    /// The End record, then everything out.
    pub fn end(&mut self, tid: u32, reason: mtrace_format::EndReason) {
        if self.ended {
            return;
        }
        let time_ns = self.now();
        self.record(tid, &Record::End { time_ns, reason });
        self.ended = true;
        let _ = self.flush();
    }
}
