//! `mtrace server`: the target's side. Runs the program with the preload,
//! every process of it streaming to a private UNIX socket (0600 in a 0700
//! folder of the server's); keeps what arrives in a spool file, as frames,
//! and relays the spool to one client at a time from its start, so that a
//! client that connects late, or a second one after the first left, misses
//! nothing. Commands from the client go back to the process they name.
//! Thin: it never decodes the streams; its memory does not grow with them
//! (the spool is on disk).
//!
//! The spool is bounded (`--spool-max`): when it holds that much, the
//! server stops reading the processes' streams, so their threads wait as
//! they do for a slow writer (nothing is lost); once a client has taken
//! bytes, they are cut out of the file (a hole punched, so its offsets
//! stay) to make room. A client that comes after such a cut cannot get the
//! stream's start, and is refused with the reason.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{read_line, write_frame, ALL, COMMAND, DATA, END, EXIT};
use crate::arriving::listen::Listener;
use crate::recording::{find_lib, hand_to, AtExitArgs, RecordingArgs};
use anyhow::{bail, Context, Result};
use mtrace_format::address::Socket;

#[derive(clap::Args)]
pub struct ServerArgs {
    /// Where clients connect: unix:PATH (default $XDG_RUNTIME_DIR/mtrace.sock,
    /// else /tmp/mtrace-UID.sock) or tcp:HOST:PORT (default 127.0.0.1:4576).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Start the program only when a client has connected.
    #[arg(long)]
    wait: bool,
    /// Keep the spool (every process's stream, as frames) in FILE
    /// (default: a file in a temporary folder, removed at the end).
    #[arg(long, value_name = "FILE")]
    spool: Option<PathBuf>,
    /// Bytes the spool may hold on disk (K, M, G suffixes: powers of 1024);
    /// at the bound the program waits for a client.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = mtrace_analysis::bounded::parse_size)]
    spool_max: u64,
    #[command(flatten)]
    token_file: crate::flags::TokenFile,
    #[command(flatten)]
    frames: crate::flags::Depth,
    #[command(flatten)]
    rec: RecordingArgs,
    #[command(flatten)]
    at_exit: AtExitArgs,
    /// No messages of the server's own (`mtrace run -i` uses a server).
    #[arg(long, hide = true)]
    quiet: bool,
    #[command(flatten)]
    program: crate::flags::Program,
}

/// What the relay threads share.
struct Shared {
    spool: Mutex<std::fs::File>,
    /// Bytes of whole frames in the spool.
    spool_len: AtomicU64,
    /// At most this many bytes on disk (`--spool-max`).
    spool_max: u64,
    /// Bytes at the spool's start cut out after a client took them.
    dropped: AtomicU64,
    /// The spool's file system cannot punch holes: the bound is not kept.
    unbounded: AtomicBool,
    /// The processes' connections, by stream id, for commands.
    procs: Mutex<HashMap<u32, Proc>>,
    /// Makes a process with one thread do its round (none under
    /// `--ptrace`, whose tracer answers for the process).
    waker: Option<Arc<crate::wake::Waker>>,
    next_id: AtomicU32,
    /// The program exited (its EXIT frame is in the spool).
    exited: AtomicBool,
    exit_status: AtomicU32,
}

/// A process's connection.
struct Proc {
    conn: UnixStream,
    /// Its pid (the socket's peer), where the kernel told it.
    pid: Option<i32>,
    /// Bytes read from it so far.
    received: Arc<AtomicU64>,
}

/// The smallest `--spool-max`, bytes: a few of the largest frames (256 KiB).
const MIN_SPOOL: u64 = 1 << 20;

impl Shared {
    /// Bytes the spool holds on disk.
    fn on_disk(&self) -> u64 {
        self.spool_len.load(Ordering::Acquire) - self.dropped.load(Ordering::Acquire)
    }

    /// Appends a frame, first waiting while the spool is at its bound (a
    /// frame into an empty spool always goes in).
    fn append(&self, kind: u8, id: u32, payload: &[u8]) {
        let need = 9 + payload.len() as u64;
        loop {
            let held = self.on_disk();
            if held == 0 || held + need <= self.spool_max || self.unbounded.load(Ordering::Acquire) {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut f = self.spool.lock().expect("spool lock");
        if write_frame(&mut *f, kind, id, payload).is_ok() && f.flush().is_ok() {
            self.spool_len.fetch_add(9 + payload.len() as u64, Ordering::Release);
        }
    }
}

pub fn server(mut a: ServerArgs) -> Result<ExitCode> {
    a.rec.ptrace_if_static(&a.program.command[0]);
    let mut rec = a.rec.recording(a.frames.depth)?;
    // The scan runs in the target and its snapshot travels in the stream:
    // the client's report has the leak kinds as `run`'s has.
    a.at_exit.apply(&mut rec);
    let lib = if a.rec.ptrace { PathBuf::new() } else { find_lib()? };
    if a.spool_max < MIN_SPOOL {
        bail!("--spool-max {}: at least 1M (the bound must hold a few frames)", a.spool_max);
    }
    let token = super::token(&a.token_file.token_file)?;
    let addr = super::address(a.listen.as_deref())?;
    let listener = Listener::bind(&addr, !token.is_empty())?;
    let dir = tempfile::Builder::new().prefix("mtrace-server.").tempdir()?;
    // The program's processes connect here, the client at `listener`.
    let procs = Listener::private("mtrace-server.", "procs.sock")?;
    let incoming = procs.incoming_unix()?;
    let spool_path = a.spool.clone().unwrap_or_else(|| dir.path().join("spool"));
    let spool = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&spool_path)
        .with_context(|| format!("{}: cannot create", spool_path.display()))?;
    let shared = Arc::new(Shared {
        spool: Mutex::new(spool),
        spool_len: AtomicU64::new(0),
        spool_max: a.spool_max,
        dropped: AtomicU64::new(0),
        unbounded: AtomicBool::new(false),
        procs: Mutex::new(HashMap::new()),
        waker: (!a.rec.ptrace).then(|| Arc::new(crate::wake::Waker::new("mtrace server", lib.clone()))),
        next_id: AtomicU32::new(1),
        exited: AtomicBool::new(false),
        exit_status: AtomicU32::new(0),
    });
    let say = |m: String| {
        if !a.quiet {
            eprintln!("mtrace server: {m}");
        }
    };
    say(format!("listening on {addr}"));
    let sh = shared.clone();
    std::thread::spawn(move || accept_processes(incoming, sh));
    if let Some(w) = shared.waker.clone() {
        let sh = shared.clone();
        std::thread::spawn(move || {
            let streams = || {
                let procs = sh.procs.lock().expect("procs lock");
                procs.iter().filter_map(|(&id, p)| Some((id, p.pid?, p.received.load(Ordering::Acquire)))).collect()
            };
            w.watch(streams, || sh.exited.load(Ordering::Acquire));
        });
    }
    let mut first = None;
    if a.wait {
        say(format!("waiting for a client before starting {}", a.program.command[0]));
        first = Some(accept_client(&listener, &token, &shared));
    }
    let ended = move |sh: &Shared, code: i32| {
        // The processes' last bytes before the exit frame.
        std::thread::sleep(Duration::from_millis(100));
        sh.exit_status.store(code as u32, Ordering::Release);
        sh.append(EXIT, 0, &code.to_le_bytes());
        sh.exited.store(true, Ordering::Release);
    };
    let sh = shared.clone();
    rec.output = Some(procs.address());
    if a.rec.ptrace {
        let opts = a.rec.ptrace_options(rec, false);
        let command = a.program.command.clone();
        // One thread does all the ptrace calls (the kernel ties a tracee
        // to the thread that seized it).
        std::thread::spawn(move || {
            let code = match mtrace_ptrace::run(&command, opts) {
                Ok((_, mtrace_ptrace::Outcome::Exited(c))) => c,
                Ok((_, mtrace_ptrace::Outcome::Signaled(s))) => 128 + s,
                Ok((_, mtrace_ptrace::Outcome::Detached(_))) => 0,
                Err(e) => {
                    eprintln!("mtrace server: cannot trace {}: {e:#}", command[0]);
                    1
                }
            };
            ended(&sh, code);
        });
    } else {
        let mut cmd = Command::new(&a.program.command[0]);
        cmd.args(&a.program.command[1..]).env("LD_PRELOAD", &lib);
        hand_to(&mut cmd, &rec);
        let mut child =
            cmd.spawn().map_err(|error| mtrace_ptrace::ExecFailed { program: a.program.command[0].clone(), error })?;
        std::thread::spawn(move || {
            use std::os::unix::process::ExitStatusExt;
            crate::wake::until_it_ends(child.id() as i32);
            let st = child.wait().ok();
            ended(&sh, st.map_or(1, |s| s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))));
        });
    }
    loop {
        let client = match first.take() {
            Some(c) => c,
            None => accept_client(&listener, &token, &shared),
        };
        let Some((conn, who)) = client else { continue };
        say(format!("{who} connected"));
        if serve(conn, &shared) {
            say(format!("{who} has the whole trace; done"));
            return Ok(ExitCode::from(shared.exit_status.load(Ordering::Acquire) as u8));
        }
        say(format!("{who} left; waiting for another client"));
    }
}

/// A client after its handshake; `None` (with one line on stderr) when it
/// was refused or was not an mtrace client.
fn accept_client(l: &Listener, token: &str, sh: &Shared) -> Option<(Socket, String)> {
    let (mut c, who) = match l.accept() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("mtrace server: accept: {e}");
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
    };
    let hello = read_line(&mut c).unwrap_or_default();
    let mut words = hello.split(' ');
    let dropped = sh.dropped.load(Ordering::Acquire);
    let cut = format!(
        "the stream's first {dropped} bytes were cut from the spool after the last client took them \
         (--spool-max {}); a larger --spool-max keeps them",
        sh.spool_max
    );
    let reply = match (words.next(), words.next(), words.next().unwrap_or("")) {
        (Some("mtrace"), Some("1"), t) if t == token && dropped > 0 => Err(cut.as_str()),
        (Some("mtrace"), Some("1"), t) if t == token => Ok(()),
        (Some("mtrace"), Some("1"), _) => Err("wrong token"),
        _ => Err("not an mtrace client"),
    };
    match reply {
        Ok(()) => {
            let _ = c.write_all(b"ok\n");
            Some((c, who))
        }
        Err(why) => {
            eprintln!("mtrace server: {who} refused: {why}");
            let _ = c.write_all(format!("denied: {why}\n").as_bytes());
            c.shutdown();
            None
        }
    }
}

/// Accepts the program's processes: each connection is a stream of its own.
fn accept_processes(incoming: impl Iterator<Item = UnixStream>, sh: Arc<Shared>) {
    for s in incoming {
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        let received = Arc::new(AtomicU64::new(0));
        if let Ok(conn) = s.try_clone() {
            let pid = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials)
                .ok()
                .map(|c| c.pid())
                .filter(|&p| p > 0);
            sh.procs.lock().expect("procs lock").insert(id, Proc { conn, pid, received: received.clone() });
        }
        let sh = sh.clone();
        std::thread::spawn(move || {
            let mut s = s;
            let mut buf = vec![0u8; 256 << 10];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        received.fetch_add(n as u64, Ordering::Release);
                        sh.append(DATA, id, &buf[..n]);
                    }
                }
            }
            sh.procs.lock().expect("procs lock").remove(&id);
            if let Some(w) = &sh.waker {
                w.forget(id);
            }
            sh.append(END, id, &[]);
        });
    }
}

/// Sends the spool from its start to `c`, following it as it grows, and
/// passes `c`'s commands on. True when the client got everything up to the
/// program's exit; false when it left first.
fn serve(c: Socket, sh: &Arc<Shared>) -> bool {
    let Ok(mut reader) = c.try_clone() else { return false };
    let gone = Arc::new(AtomicBool::new(false));
    let (sh2, gone2) = (sh.clone(), gone.clone());
    std::thread::spawn(move || {
        while let Ok(Some((kind, id, line))) = super::read_frame(&mut reader) {
            if kind != COMMAND {
                break;
            }
            let mut procs = sh2.procs.lock().expect("procs lock");
            let mut line = line;
            line.push(b'\n');
            let mut sent = Vec::new();
            for (&stream, p) in procs.iter_mut().filter(|(&stream, _)| id == ALL || stream == id) {
                if p.conn.write_all(&line).is_ok() {
                    sent.extend(p.pid.map(|pid| (stream, pid, p.received.clone(), p.received.load(Ordering::Acquire))));
                }
            }
            drop(procs);
            let Some(w) = &sh2.waker else { continue };
            if !sent.is_empty() {
                std::thread::sleep(crate::wake::ANSWER_GRACE);
            }
            // Not taken within the grace: made to take it now.
            for (stream, pid, received, before) in sent {
                if received.load(Ordering::Acquire) == before {
                    w.wake(stream, pid);
                }
            }
        }
        gone2.store(true, Ordering::Release);
    });
    let mut c = c;
    let Ok(spool) = sh.spool.lock().expect("spool lock").try_clone() else { return false };
    let mut sent = 0u64;
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let exited = sh.exited.load(Ordering::Acquire);
        let len = sh.spool_len.load(Ordering::Acquire);
        if sent == len {
            if exited {
                c.shutdown();
                return true;
            }
            if gone.load(Ordering::Acquire) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let n = ((len - sent) as usize).min(buf.len());
        // pread: the appending threads share the file's offset.
        if spool.read_exact_at(&mut buf[..n], sent).is_err() {
            return false;
        }
        if c.write_all(&buf[..n]).is_err() {
            return false;
        }
        sent += n as u64;
        cut_taken(sh, &spool, sent);
    }
}

/// Near the spool's bound, cuts out (punches a hole over) the bytes
/// before `sent`, which the client has taken, so the program can go on.
fn cut_taken(sh: &Shared, spool: &std::fs::File, sent: u64) {
    use nix::fcntl::{fallocate, FallocateFlags};
    use std::os::fd::AsRawFd;
    let dropped = sh.dropped.load(Ordering::Acquire);
    // Whole pages only: a partial page is zeroed, not freed.
    let upto = sent & !4095;
    // Within two frames (256 KiB each at most) of the bound.
    if sh.on_disk() + (512 << 10) < sh.spool_max || upto <= dropped {
        return;
    }
    let flags = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    match fallocate(spool.as_raw_fd(), flags, dropped as i64, (upto - dropped) as i64) {
        Ok(()) => sh.dropped.store(upto, Ordering::Release),
        Err(e) => {
            if !sh.unbounded.swap(true, Ordering::AcqRel) {
                eprintln!("mtrace server: the spool cannot be cut ({e}): it grows past --spool-max from now on");
            }
        }
    }
}
