//! `mtrace client`: the host's side. Connects to a server, writes each
//! process's stream to a file of its own as it arrives, and when the
//! program ends reports it as `mtrace run` does (symbolized with the
//! host's files: `--sysroot`, `--binpath`); with `-i`, the console on the
//! program's process while it runs.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context, Result};
use mtrace_analysis::bounded::{Bound, ReportPoints};
use mtrace_format::address::Socket;
use mtrace_format::protocol::Command;

use super::{read_frame, read_line, write_frame, COMMAND, DATA, END, EXIT};
use crate::flags::report::ReportFlags;

#[derive(clap::Args)]
pub struct ClientArgs {
    /// The server: unix:PATH or tcp:HOST:PORT (default: as `mtrace server`'s).
    addr: Option<String>,
    #[command(flatten)]
    interactive: crate::flags::Interactive,
    #[command(flatten)]
    save: crate::flags::Save,
    /// Each process's trace kept within a bound as it arrives, as `mtrace
    /// run` keeps it: the report is still of the whole run for every
    /// block not freed, the totals and the peak. Not with -i.
    #[command(flatten)]
    bound: crate::flags::bound::BoundArgs,
    #[command(flatten)]
    token_file: crate::flags::TokenFile,
    #[command(flatten)]
    report_to: crate::flags::ReportFile,
    #[command(flatten)]
    opts: ReportFlags,
    /// Started by `mtrace run -i`: the report goes to standard error as
    /// `run`'s does, and no `--save` is offered (`run` has none).
    #[arg(skip)]
    by_run: bool,
}

/// The streams received so far.
#[derive(Default)]
struct Streams {
    /// Stream id → (file path, ended).
    files: HashMap<u32, (PathBuf, bool)>,
    /// The program's exit status, once it exited.
    exit: Option<i32>,
    /// The connection ended (with or without the exit).
    closed: bool,
}

impl ClientArgs {
    /// A client of a local server with the console (`mtrace run -i`).
    pub fn interactive_on(addr: String, report_to: crate::flags::ReportFile, opts: ReportFlags) -> ClientArgs {
        ClientArgs {
            addr: Some(addr),
            interactive: crate::flags::Interactive { interactive: true },
            save: Default::default(),
            bound: Default::default(),
            token_file: Default::default(),
            report_to,
            opts,
            by_run: true,
        }
    }
}

/// The exit status of a client that left with `quit` while the program
/// runs on: sysexits.h's EX_TEMPFAIL ("try again later"), as no status of
/// the program's is known yet (mtrace's own errors are 2).
pub const LEFT: u8 = 75;

/// Set when the console's `quit` left the program running (`mtrace run
/// -i` then does not wait for its server).
pub static LEFT_RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub fn client(a: ClientArgs) -> Result<ExitCode> {
    a.opts.check_inputs()?;
    a.opts.check_outputs()?;
    // Refused before the server gives this client its one place.
    let bound = a.bound.bound()?;
    let token = super::token(&a.token_file.token_file)?;
    let addr = super::address(a.addr.as_deref())?;
    let mut conn = super::connect(&addr)?;
    conn.write_all(format!("mtrace 1 {token}\n").as_bytes())?;
    let answer = read_line(&mut conn).map_err(|_| anyhow!("{addr}: not an mtrace server"))?;
    if answer != "ok" {
        bail!("{addr}: {answer}");
    }
    let dir = tempfile::Builder::new().prefix("mtrace-client.").tempdir()?;
    let streams = Arc::new(Mutex::new(Streams::default()));
    let reader = conn.try_clone()?;
    let (st, d) = (streams.clone(), dir.path().to_owned());
    let receiver = std::thread::spawn(move || receive(reader, &d, &st, bound));
    // The program's stream (the first) read as it arrives, so that its
    // report is ready when it ends; not a bounded one, which its keeper
    // cuts, nor under the console, which keeps books of its own.
    let following = match bound.is_none() && !a.interactive.interactive {
        true => {
            // The program's process is the first to connect.
            let st = streams.clone();
            a.opts.follow_found(move || st.lock().unwrap_or_else(|e| e.into_inner()).files.get(&1).map(|f| f.0.clone()))
        }
        false => None,
    };
    if a.interactive.interactive {
        let mut live = Live { conn: conn.try_clone()?, streams: streams.clone() };
        if live.wait_first().is_some() && crate::console::run(&mut live, &a.opts)? == crate::console::Leave::Quit {
            // Leave now: the server keeps the program and its spool; the
            // receiver, blocked in a read, ends with the connection.
            conn.shutdown();
            LEFT_RUNNING.store(true, std::sync::atomic::Ordering::Relaxed);
            eprintln!("mtrace: left; the program runs on under mtrace server ({addr}): mtrace client connects again");
            return Ok(ExitCode::from(LEFT));
        }
    }
    let res = receiver.join().map_err(|_| anyhow!("the receiving thread failed"))?;
    let followed = following.and_then(|f| f.finish());
    let s = streams.lock().expect("streams lock");
    let Some(code) = s.exit else {
        res?;
        bail!("{addr}: the connection ended before the program did");
    };
    // Saved before the report, which names the saved file as its trace
    // (the received one is deleted with its temporary folder).
    if let Some(save) = &a.save.save {
        for (id, (path, _)) in &s.files {
            let to = match (id, header_pid(path)) {
                (1, _) => save.clone(),
                (_, Some(p)) => PathBuf::from(format!("{}.{p}", save.display())),
                _ => continue,
            };
            std::fs::copy(path, &to).with_context(|| format!("{}: cannot save", to.display()))?;
        }
    }
    let mut out = match (&a.report_to.output, a.by_run) {
        (None, true) => mtrace_analysis::output::buffered(Box::new(std::io::stderr())),
        (p, _) => mtrace_analysis::output::open(p.as_deref())?,
    };
    // The program's process is the first to connect; its pid is in its header.
    let main = s.files.get(&1).map(|(p, _)| p.clone());
    let pid = main.as_deref().and_then(header_pid);
    match pid {
        Some(pid) => {
            let main_trace = Some(match &a.save.save {
                Some(f) => f.display().to_string(),
                None if a.by_run => "received, not kept".to_owned(),
                None => "received, not kept (--save FILE keeps it)".to_owned(),
            });
            let how = mtrace_analysis::pipeline::Reporting { main_trace, ..Default::default() };
            let reported =
                mtrace_analysis::pipeline::report_processes(dir.path(), pid, &a.opts, how, followed, &mut *out)?;
            if !reported.unwritten.is_empty() && a.save.save.is_none() {
                // Not lost with the files that could not be written.
                eprintln!("mtrace: the received traces are kept in {}", dir.path().display());
                let _ = dir.keep();
                out.flush()?;
                return Ok(ExitCode::from(code as u8));
            }
        }
        None => writeln!(out, "mtrace: the program sent no trace (static executable, or preloading failed)")?,
    }
    out.flush()?;
    Ok(ExitCode::from(code as u8))
}

/// The pid in a stream's header.
fn header_pid(p: &Path) -> Option<u32> {
    let mut r = mtrace_format::Reader::new(std::fs::File::open(p).ok()?);
    r.header().ok().map(|h| h.pid)
}

/// Writes the frames' streams to files in `dir` (each kept within `bound`
/// by a keeper of its own, `mtrace_analysis::bounded`, if given)
/// until the program's exit or the end of the connection.
fn receive(mut c: Socket, dir: &Path, st: &Mutex<Streams>, bound: Option<Bound>) -> Result<()> {
    // A stream's file, or the pipe to the keeper that bounds it.
    let mut open: HashMap<u32, Box<dyn Write>> = HashMap::new();
    let mut keepers = Vec::new();
    // Per stream, its report points' .memlog files (the report signal,
    // `mtrace_report()`), written by its keeper or by a follower of its
    // file, into MTRACE_REPORT_DIR, else the client's working directory
    // (the program's may be on another machine).
    let mut points = Vec::new();
    let reports = std::env::var_os(mtrace_format::settings::REPORT_DIR.name())
        .map(PathBuf::from)
        .or_else(|| std::env::current_dir().ok());
    let res = loop {
        let frame = match read_frame(&mut c) {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        match frame {
            (DATA, id, bytes) => {
                let f = match open.entry(id) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        let path = dir.join(format!("{id}.mtrace"));
                        let sink: Box<dyn Write> = match bound {
                            Some(bound) => {
                                let (r, w) = std::io::pipe()?;
                                let (p, dir) = (path.clone(), reports.clone());
                                keepers.push(std::thread::spawn(move || {
                                    let mut points = ReportPoints::new(dir, None);
                                    mtrace_analysis::bounded::keep(
                                        r,
                                        mtrace_analysis::bounded::Dest::File(&p),
                                        bound,
                                        Some(&mut points),
                                    )
                                }));
                                Box::new(w)
                            }
                            None => {
                                let f =
                                    std::fs::OpenOptions::new().create_new(true).write(true).mode(0o600).open(&path)?;
                                points.push(mtrace_analysis::bounded::follow_report_points(
                                    &path,
                                    reports.clone(),
                                    None,
                                ));
                                Box::new(f)
                            }
                        };
                        st.lock().expect("streams lock").files.insert(id, (path, false));
                        e.insert(sink)
                    }
                };
                f.write_all(&bytes)?;
            }
            (END, id, _) => {
                open.remove(&id);
                if let Some(e) = st.lock().expect("streams lock").files.get_mut(&id) {
                    e.1 = true;
                }
            }
            (EXIT, _, code) => {
                let code = i32::from_le_bytes(code.get(..4).and_then(|c| c.try_into().ok()).unwrap_or([1, 0, 0, 0]));
                st.lock().expect("streams lock").exit = Some(code);
                break Ok(());
            }
            (kind, ..) => break Err(anyhow!("unexpected frame kind {kind} from the server")),
        }
    };
    // The keepers end with their pipes, and have written every file then.
    drop(open);
    for p in &points {
        p.finish_within(std::time::Duration::from_secs(10));
    }
    for k in keepers {
        match k.join() {
            Ok(Ok(kept)) => {
                if let Some(e) = kept.error {
                    eprintln!("mtrace: {}: {e}", kept.path.display());
                }
            }
            Ok(Err(e)) => eprintln!("mtrace: {e:#}"),
            Err(_) => eprintln!("mtrace: a trace's keeper failed"),
        }
    }
    st.lock().expect("streams lock").closed = true;
    res
}

/// The console's view of the program's process on the server.
struct Live {
    conn: Socket,
    streams: Arc<Mutex<Streams>>,
}

impl Live {
    /// Waits (up to 10 s) for the program's first stream.
    fn wait_first(&self) -> Option<PathBuf> {
        for _ in 0..1000 {
            let s = self.streams.lock().expect("streams lock");
            if let Some((p, _)) = s.files.get(&1) {
                return Some(p.clone());
            }
            if s.closed {
                return None;
            }
            drop(s);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        None
    }
}

impl crate::console::Live for Live {
    fn send(&mut self, cmd: &Command) -> Result<()> {
        write_frame(&mut self.conn, COMMAND, 1, cmd.to_string().as_bytes())?;
        Ok(())
    }

    fn send_to(&mut self, pid: Option<u32>, cmd: &Command) -> Result<()> {
        let Some(pid) = pid else { return self.send(cmd) };
        let id = {
            let s = self.streams.lock().expect("streams lock");
            let mut ids: Vec<_> = s.files.iter().filter(|(_, f)| !f.1).map(|(&id, _)| id).collect();
            ids.sort();
            ids.into_iter().rev().find(|id| header_pid(&s.files[id].0) == Some(pid))
        };
        let id = id.ok_or_else(|| anyhow!("no traced process {pid} (proclist lists them)"))?;
        write_frame(&mut self.conn, COMMAND, id, cmd.to_string().as_bytes())?;
        Ok(())
    }

    fn trace(&self) -> PathBuf {
        self.wait_first().unwrap_or_default()
    }

    fn ended(&self) -> bool {
        let s = self.streams.lock().expect("streams lock");
        s.closed || s.files.get(&1).is_some_and(|f| f.1)
    }

    fn trace_of(&self, pid: u32) -> Option<PathBuf> {
        let s = self.streams.lock().expect("streams lock");
        // The latest stream of that pid (an exec keeps it).
        let mut ids: Vec<_> = s.files.keys().copied().collect();
        ids.sort();
        ids.into_iter().rev().map(|id| s.files[&id].0.clone()).find(|p| header_pid(p) == Some(pid))
    }

    fn processes(&self) -> Vec<String> {
        let s = self.streams.lock().expect("streams lock");
        let mut ids: Vec<_> = s.files.keys().copied().collect();
        ids.sort();
        ids.iter()
            .map(|id| {
                let (path, ended) = &s.files[id];
                let h = mtrace_format::Reader::new(std::fs::File::open(path).ok()?).header().ok()?;
                let state = if *ended { "ended" } else { "traced" };
                Some(format!("{:>8}  {state:<7} {}", h.pid, h.exe))
            })
            .map(|l| l.unwrap_or_else(|| "       ?  starting".to_owned()))
            .collect()
    }
}
