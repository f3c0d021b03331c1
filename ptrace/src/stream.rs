//! One process's stream, as libmtrace.so writes it (docs/FORMAT.md): the
//! header, then records in the order the tracer saw the events, a Thread
//! record whenever the thread changes, compressed a block at a time.
//! Under breakpoints the tracer sees every event when it happens and
//! stamps it then: records are in time order, and each block ends with a
//! watermark past its latest. Under uprobes the samples of different
//! threads are read a ring at a time: the tracer states the watermarks
//! ([`Stream::watermark`]).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use anyhow::{Context, Result};
use mtrace_format::address::{Address, Socket};
use mtrace_format::{encode_compressed, encode_header, naming, Encoder, Header, Record};
use rustc_hash::FxHashMap as HashMap;

/// Records collected before they are compressed and written, bytes.
const BLOCK: usize = 1 << 20;

/// What the writer thread is handed.
enum Job {
    /// A block of records to compress and write.
    Block(Vec<u8>),
    /// Answer once every block before is in the file.
    Sync(std::sync::mpsc::Sender<()>),
}

/// One process's stream and its writer.
pub struct Stream {
    /// Full blocks go to the writer thread, which compresses and writes
    /// them (compressing a block took milliseconds in the tracer's loop,
    /// long enough for a uprobe ring to overflow).
    writer: Option<(std::sync::mpsc::Sender<Job>, std::thread::JoinHandle<()>)>,
    /// The program's name, as in the trace's name and a report's.
    program: String,
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
    /// The latest record time, ns.
    latest: u64,
    /// Records are written in time order (breakpoints): a flush states a
    /// watermark past the latest.
    ordered: bool,
    /// The latest watermark written, ns.
    watermarked: u64,
    ended: bool,
    /// To a socket (live.rs), not a file.
    live: Option<Live>,
}

/// A live stream's connection, shut down when the stream is done (the
/// commands' reader holds it open too), and the flag that tells that
/// reader so.
type Live = (Socket, std::sync::Arc<std::sync::atomic::AtomicBool>);

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
    /// … as libmtrace.so's), mode 0600; or, for a `pattern` that is a
    /// socket address (`unix:PATH`, `tcp:HOST:PORT`:
    /// `mtrace_format::address`, as `MTRACE_OUTPUT` for the preload), a
    /// connection to it, whose reader sends commands back (live.rs).
    pub fn create(pattern: &str, pid: u32, ppid: u32) -> Result<Stream> {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map(|p| p.display().to_string()).unwrap_or_default();
        let cmdline = naming::cmdline_args(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default());
        let program = naming::program_name(&cmdline, &exe);
        if let Some(addr) = Address::parse(pattern) {
            let addr = addr.map_err(|why| anyhow::anyhow!("{pattern}: {why}"))?;
            let sock = addr.connect().with_context(|| format!("{addr}: cannot connect"))?;
            crate::live::start_ticks()?;
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            crate::live::read_commands(sock.try_clone()?, pid, done.clone());
            let conn = Some((sock.try_clone()?, done));
            return Stream::start(Box::new(sock), pattern.to_owned(), program, (exe, cmdline), (pid, ppid), conn);
        }
        let base = naming::expand(pattern, pid, &program);
        let mut last = None;
        for path in naming::candidates(&base) {
            match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
                Ok(file) => {
                    let (exe, cmdline) = (exe.clone(), cmdline.clone());
                    return Stream::start(Box::new(file), path, program, (exe, cmdline), (pid, ppid), None);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(|| anyhow::anyhow!("no free name"), Into::into))
            .with_context(|| format!("{base}: cannot create"))
    }

    /// The stream on `out` (`path`: where it goes, for messages and
    /// reports) of process `pid` (`ppid` its parent) running `exe` with
    /// `cmdline`; its header written.
    fn start(
        mut out: Box<dyn Write + Send>,
        path: String,
        program: String,
        (exe, cmdline): (String, Vec<String>),
        (pid, ppid): (u32, u32),
        live: Option<Live>,
    ) -> Result<Stream> {
        let start = monotonic_ns();
        let mut header = Header::of_process(pid, ppid, exe, cmdline, (realtime_ns(), start));
        // The target's words (x86_64, the only CPU ported).
        header.pointer_size = 8;
        let mut head = Vec::new();
        encode_header(&mut head, &header);
        out.write_all(&head)?;
        Ok(Stream {
            writer: Some(writer(out, path.clone())?),
            path,
            program,
            enc: Encoder::new(),
            buf: Vec::with_capacity(BLOCK + 4096),
            tid: 0,
            stacks: HashMap::default(),
            next_stack: 1,
            start,
            latest: 0,
            ordered: true,
            watermarked: 0,
            ended: false,
            live,
        })
    }

    /// The stream goes to a socket whose reader sends commands (live.rs):
    /// no report point can read it.
    pub fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// The path of the stream file (a taken name's gets a suffix).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// ns since the stream started.
    pub fn now(&self) -> u64 {
        monotonic_ns().saturating_sub(self.start)
    }

    /// CLOCK_MONOTONIC `ns` (a uprobe sample's time) as a record's time.
    pub fn at(&self, ns: u64) -> u64 {
        ns.saturating_sub(self.start)
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
        self.latest = self.latest.max(rec.time_ns().unwrap_or(0));
        if self.buf.len() >= BLOCK {
            self.flush();
        }
    }

    /// Records are not written in time order (uprobes): watermarks come
    /// from [`Stream::watermark`] only.
    pub fn set_unordered(&mut self) {
        self.ordered = false;
    }

    /// Every event stamped before `time_ns` is in the stream now.
    pub fn watermark(&mut self, time_ns: u64) {
        if !self.ended && time_ns > self.watermarked {
            self.watermarked = time_ns;
            // Absolute: it needs no Thread record.
            self.enc.encode(&mut self.buf, &Record::Watermark { time_ns });
        }
    }

    /// Hands what was collected to the writer.
    pub fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        if self.ordered {
            // Every event stamped up to the latest is in this block or before.
            self.watermark(self.latest + (1 << mtrace_format::TIME_SHIFT));
        }
        let block = std::mem::replace(&mut self.buf, Vec::with_capacity(BLOCK + 4096));
        if let Some((to, _)) = &self.writer {
            let _ = to.send(Job::Block(block));
        }
        // The next chunk starts with a Thread record (its times are deltas).
        self.tid = 0;
    }

    /// Everything collected so far in the file, waiting for the writer
    /// (two seconds at most): a report reading the file then finds it.
    pub fn sync(&mut self) {
        self.flush();
        if let Some((to, _)) = &self.writer {
            let (done, written) = std::sync::mpsc::channel();
            if to.send(Job::Sync(done)).is_ok() {
                let _ = written.recv_timeout(std::time::Duration::from_secs(2));
            }
        }
    }

    /// The program's name (its command line's first word, without folders).
    pub fn program(&self) -> &str {
        &self.program
    }

    /// Everything collected written to the file (the writer done).
    pub fn finish(&mut self) {
        self.flush();
        if let Some((to, done)) = self.writer.take() {
            drop(to);
            let _ = done.join();
        }
        // The reader then reads to the end, and the commands' reader
        // stops: the tracer leaving by itself (a signal) ends the stream.
        if let Some((conn, done)) = &self.live {
            done.store(true, std::sync::atomic::Ordering::Release);
            conn.shutdown();
        }
    }

    /// The End record, then everything out.
    pub fn end(&mut self, tid: u32, reason: mtrace_format::EndReason) {
        if self.ended {
            return;
        }
        let time_ns = self.now();
        self.record(tid, &Record::End { time_ns, reason });
        self.ended = true;
        self.finish();
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The thread that compresses and writes a stream's blocks to `file` (or
/// a socket), in
/// order; it ends when the sender is dropped. The channel has no bound:
/// the tracer must never wait for it (the blocks come at the program's
/// pace, far below what compression takes).
fn writer(
    mut file: Box<dyn Write + Send>,
    path: String,
) -> Result<(std::sync::mpsc::Sender<Job>, std::thread::JoinHandle<()>)> {
    let (to, jobs) = std::sync::mpsc::channel::<Job>();
    let done = std::thread::Builder::new().name("mtrace-writer".into()).spawn(move || {
        let mut failed = false;
        for job in jobs {
            let block = match job {
                Job::Block(b) => b,
                Job::Sync(done) => {
                    let _ = done.send(());
                    continue;
                }
            };
            let mut out = Vec::with_capacity(block.len() / 3);
            let r = encode_compressed(&mut out, &block, 1)
                .map_err(anyhow::Error::from)
                .and_then(|_| Ok(file.write_all(&out)?));
            if let (Err(e), false) = (r, failed) {
                eprintln!("mtrace: {path}: {e:#}");
                failed = true;
            }
        }
    })?;
    Ok((to, done))
}

#[cfg(test)]
mod tests {
    use super::Stream;

    /// Every socket kind of `mtrace_format::address` carries the tracer's
    /// stream whole: header, records, End (the preload's `MTRACE_OUTPUT`
    /// takes the same; the tracer used to take `tcp:` for a file name).
    #[test]
    fn unix_and_tcp_outputs_carry_the_stream() {
        use std::io::Read;
        let dir = std::env::temp_dir().join(format!("mtrace-ptrace-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let outputs = [
            (format!("unix:{}", path.display()), None),
            (format!("tcp:127.0.0.1:{}", tcp.local_addr().unwrap().port()), Some(&tcp)),
        ];
        let me = std::process::id();
        for (output, over_tcp) in outputs {
            let mut s = Stream::create(&output, me, 1).unwrap();
            assert!(s.is_live(), "{output}");
            s.end(me, mtrace_format::EndReason::Detach);
            let mut bytes = Vec::new();
            match over_tcp {
                Some(l) => l.accept().unwrap().0.read_to_end(&mut bytes).unwrap(),
                None => unix.accept().unwrap().0.read_to_end(&mut bytes).unwrap(),
            };
            let mut r = mtrace_format::Reader::new(&bytes[..]);
            assert_eq!(r.header().unwrap().pid, me, "{output}");
            let mut last = None;
            while let Some(rec) = r.next_record().unwrap() {
                last = Some(rec);
            }
            assert!(
                matches!(last, Some(mtrace_format::Record::End { reason: mtrace_format::EndReason::Detach, .. })),
                "{output}: {last:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
