//! What each console command does, on books kept while the stream arrives.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use mtrace_format::protocol::{marker, Command, MAX_DEPTH};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::{Live, Verb};
use mtrace_analysis::books::Block;
use mtrace_analysis::input::live::{LiveBooks, State};
use mtrace_analysis::output::words::{plural, thousands};
use mtrace_analysis::pipeline::ReportOpts;
use mtrace_analysis::report::{SortKey, View};
use mtrace_analysis::scan::Kind;
use mtrace_analysis::trace::{Trace, SCAN_MARKER};

/// How long a report point, a reset or a scan may take to answer.
const ANSWER: Duration = Duration::from_secs(30);
/// How long a view waits for the process to send what it buffered
/// (`Console::synced`): an idle process with one thread is made to
/// answer by its reader within milliseconds (docs/PROCESSES.md).
const SYNC_WAIT: Duration = Duration::from_secs(2);

/// What the last `scan` of a process found.
struct LastScan {
    /// When its snapshot was taken, ns.
    snapshot_time: u64,
    /// Its definitely and indirectly lost blocks: (address, allocation time).
    lost: HashSet<(u64, u64)>,
    lost_bytes: u64,
}

/// The console's state: the process, options, and the books per stream.
pub(super) struct Console<'a> {
    pub(super) live: &'a mut dyn Live,
    opts: ReportOpts,
    /// Books per stream file, started when first asked for.
    books: HashMap<PathBuf, LiveBooks>,
    /// The last scan of each stream file.
    scans: HashMap<PathBuf, LastScan>,
    /// Kept between commands: the debug info it opened stays open.
    sym: mtrace_analysis::symbolize::Symbolizer,
}

impl<'a> Console<'a> {
    /// A console on `live`; the program's books start now, so they catch
    /// up with a long stream while the user types.
    pub(super) fn new(live: &'a mut dyn Live, opts: ReportOpts) -> Console<'a> {
        let sym = opts.symbolizer();
        let mut c = Console { live, opts, books: HashMap::default(), scans: HashMap::default(), sym };
        let _ = c.books(None);
        c
    }

    /// The stream file of process `pid`, or the program's.
    fn path_of(&self, pid: Option<u32>) -> Result<PathBuf> {
        match pid {
            None => Ok(self.live.trace()),
            Some(p) => self.live.trace_of(p).ok_or_else(|| anyhow!("no process {p} (proclist lists them)")),
        }
    }

    /// The stream file of process `pid`, its books started if they were not.
    fn books(&mut self, pid: Option<u32>) -> Result<PathBuf> {
        let path = self.path_of(pid)?;
        self.books.entry(path.clone()).or_insert_with(|| LiveBooks::follow(&path));
        Ok(path)
    }

    /// Runs one command line; `Some` when it leaves the console.
    pub(super) fn command(&mut self, line: &str, out: &mut dyn Write) -> Result<Option<super::Leave>> {
        let mut words = line.split_whitespace();
        let verb = Verb::resolve(words.next().unwrap_or_default())?;
        let args: Vec<&str> = words.collect();
        // The views of the books first have them take what the process
        // buffered.
        match verb {
            Verb::Dump | Verb::Status | Verb::Pprof => self.synced(pid_arg(&args).0, out)?,
            Verb::Top | Verb::Timeline | Verb::Markers => self.synced(None, out)?,
            Verb::Show if args.first().is_some_and(|a| "info".starts_with(a)) => self.synced(None, out)?,
            _ => {}
        }
        match verb {
            Verb::Help => match args.first() {
                Some(w) => writeln!(out, "{}", Verb::resolve(w)?.help())?,
                None => {
                    for h in Verb::all_help() {
                        writeln!(out, "  {h}")?;
                    }
                    writeln!(out, "{PAGING}")?;
                }
            },
            Verb::Report => self.report(out)?,
            Verb::Timeline => self.with(None, |_, t| -> Result<()> {
                let points = mtrace_analysis::report::thin(&t.timeline, mtrace_analysis::report::TIMELINE_ROWS);
                Ok(mtrace_analysis::output::text::write_timeline_table(&points, out)?)
            })??,
            Verb::Show => self.show(&args, out)?,
            Verb::Dump => {
                let (pid, args) = pid_arg(&args);
                let sort = match args.first() {
                    None => SortKey::Bytes,
                    Some(s) => SortKey::parse(s).ok_or_else(|| {
                        anyhow!("dump: unknown order {s:?} (usage, allocations, average, total, tsc, bytes-leaked, leaks, stacks, badfree, mismatched)")
                    })?,
                };
                self.entries(pid, sort, usize::MAX, out)?;
            }
            Verb::Top => {
                let n = args.first().map_or(Ok(10), |a| a.parse::<usize>())?;
                self.entries(None, SortKey::Bytes, n, out)?;
            }
            Verb::Status => self.status(&args, out)?,
            Verb::Proclist => {
                for l in self.live.processes() {
                    writeln!(out, "{l}")?;
                }
            }
            Verb::Markers => {
                self.with(None, |_, t| mtrace_analysis::output::text::write_markers(&t.markers, out))??
            }
            Verb::Marker => {
                let Some(name) = args.first() else { bail!("marker NAME") };
                self.live.send(&Command::Marker((*name).to_owned()))?;
            }
            Verb::Scan => self.scan(&args, out)?,
            Verb::Pprof => {
                let (pid, args) = pid_arg(&args);
                let [file] = args.as_slice() else { bail!("pprof FILE [PID]") };
                self.pprof(pid, std::path::Path::new(file))?;
                writeln!(out, "wrote {file}")?;
            }
            Verb::Reset => {
                let path = self.books(None)?;
                let live = &mut *self.live;
                let reset = Command::Marker(marker::RESET.to_owned());
                let n = self.books[&path].at_next_marker(marker::RESET, ANSWER, || live.send(&reset), |_, n| n)?;
                self.opts.since_marker = Some(format!("{}#{n}", marker::RESET));
                writeln!(out, "counting from now")?;
            }
            Verb::Start => self.live.send(&Command::Start)?,
            Verb::Stop => self.live.send(&Command::Stop)?,
            Verb::Set => match args.as_slice() {
                ["depth", n] if n.parse::<usize>().is_ok_and(|d| (1..=MAX_DEPTH).contains(&d)) => {
                    self.live.send(&Command::Depth(n.parse()?))?;
                }
                ["searchpath", dirs] => {
                    self.opts.binpath = dirs.split(':').filter(|d| !d.is_empty()).map(PathBuf::from).collect();
                    self.sym = self.opts.symbolizer();
                }
                _ => bail!("set depth N (1 to {MAX_DEPTH}) | set searchpath DIR[:DIR…]"),
            },
            Verb::Detach => {
                self.live.send(&Command::Detach)?;
                return Ok(Some(super::Leave::Detach));
            }
            Verb::Quit => return Ok(Some(super::Leave::Quit)),
            Verb::Wait => return Ok(Some(super::Leave::Wait)),
        }
        Ok(None)
    }

    /// Before a view of process `pid`'s books (default: the program's):
    /// the process is asked to write what it buffered and a
    /// [`marker::SYNC`] marker after it, and the books wait until they
    /// took it. Where it did not answer within [`SYNC_WAIT`], the view
    /// says first that it may lack the latest events; once the stream
    /// ended the books are whole, and nothing is asked.
    fn synced(&mut self, pid: Option<u32>, out: &mut dyn Write) -> Result<()> {
        let path = self.books(pid)?;
        let b = &self.books[&path];
        if b.ended() {
            return Ok(());
        }
        let live = &mut *self.live;
        let question = Command::Marker(marker::SYNC.to_owned());
        if !b.sync(SYNC_WAIT, || live.send_to(pid, &question))? && !b.ended() {
            writeln!(
                out,
                "(the process did not send what it buffered within {} s: what follows may lack its latest events)",
                SYNC_WAIT.as_secs()
            )?;
        }
        Ok(())
    }

    /// `pprof FILE`: the books of process `pid` so far as a pprof heap
    /// profile (allocations over the run, blocks live now; no leak kinds:
    /// the console's scans keep only what they found lost).
    fn pprof(&mut self, pid: Option<u32>, file: &std::path::Path) -> Result<()> {
        let path = self.books(pid)?;
        let sym = &mut self.sym;
        let depth = self.opts.depth;
        let mut w = mtrace_analysis::output::open(Some(file))?;
        self.books[&path].with(|st| -> Result<()> {
            let t = st.trace.as_ref().expect("with() checks the header");
            mtrace_analysis::output::pprof::write(t, None, sym, depth, &mut w)?;
            Ok(w.flush()?)
        })?
    }

    /// Runs `f` on the books of process `pid` (default: the program's),
    /// once they hold everything saved so far.
    fn with<T>(&mut self, pid: Option<u32>, f: impl FnOnce(&mut State, &mut Trace) -> T) -> Result<T> {
        let path = self.books(pid)?;
        self.books[&path].with(|st| {
            let mut t = st.trace.take().expect("with() checks the header");
            let out = f(st, &mut t);
            st.trace = Some(t);
            out
        })
    }

    /// `dump` and `top`: the live blocks by backtrace (since the last
    /// `reset`, for the program's process), at most `n` entries.
    fn entries(&mut self, pid: Option<u32>, sort: SortKey, n: usize, out: &mut dyn Write) -> Result<()> {
        let path = self.books(pid)?;
        let sym = &mut self.sym;
        let since = if pid.is_none() { self.opts.since_marker.clone() } else { None };
        let depth = self.opts.depth;
        let heuristics = self.opts.leak_check_heuristics;
        let lost = self.scans.get(&path).map(|s| &s.lost);
        let b = &self.books[&path];
        let mut r = b.with(|st| {
            let base = since.as_ref().and_then(|_| st.baselines.get(marker::RESET)).cloned();
            let t = st.trace.as_mut().expect("with() checks the header");
            mtrace_analysis::pipeline::view(t, base, false, |t| {
                let v = View { lost_before: lost, heuristics, ..View::default() };
                mtrace_analysis::pipeline::build(t, sym, sort, depth, true, v)
            })
        })?;
        r.summary.since_marker = since;
        let style = mtrace_analysis::output::Style { num_callers: self.opts.num_callers, ..Default::default() };
        if matches!(sort, SortKey::Badfree | SortKey::Mismatched) {
            // These keys order the wrong frees (mtrace-ng's meaning).
            if r.errors.is_empty() {
                writeln!(out, "No wrong frees.")?;
            }
            r.errors.truncate(n);
            return Ok(mtrace_analysis::output::errors::write_text(&r.errors, &style, out)?);
        }
        r.stacks.truncate(n);
        mtrace_analysis::output::text::write_entries_only(&r, &style, out)?;
        Ok(())
    }

    /// `report`: a report point; everything live the first time, then the
    /// change since the last one.
    fn report(&mut self, out: &mut dyn Write) -> Result<()> {
        let path = self.books(None)?;
        let sym = &mut self.sym;
        let live = &mut *self.live;
        let opts = &self.opts;
        let report = Command::Marker(marker::REPORT.to_owned());
        let r = self.books[&path].at_next_marker(
            marker::REPORT,
            ANSWER,
            || live.send(&report),
            |st, n| {
                // The follower keeps this marker's totals after we are done:
                // the ones held now are the previous report point's.
                let base = (n > 1).then(|| st.baselines.get(marker::REPORT).cloned()).flatten();
                let t = st.trace.as_mut().expect("a marker came, so the header did");
                let v = View { heuristics: opts.leak_check_heuristics, ..View::default() };
                let mut r = mtrace_analysis::pipeline::view(t, base, false, |t| {
                    mtrace_analysis::pipeline::build(t, sym, opts.sort, opts.depth, true, v)
                });
                r.summary.since_marker = (n > 1).then(|| format!("{}#{}", marker::REPORT, n - 1));
                r.summary.until_marker = Some(format!("{}#{n}", marker::REPORT));
                r
            },
        )?;
        self.write(&r, out)
    }

    fn write(&self, r: &mtrace_analysis::report::Report, out: &mut dyn Write) -> Result<()> {
        match self.opts.format() {
            mtrace_analysis::output::Format::Json => mtrace_analysis::output::json(r, out)?,
            // Every frame: the console's reports are read one at a time.
            _ => mtrace_analysis::output::text::write_text(r, &Default::default(), out)?,
        }
        Ok(())
    }

    /// `scan [all|new|leak] [PID]`: a snapshot, classified at its moment;
    /// shows all live blocks, those allocated since the last scan, or
    /// those the last scan found lost (and whether they still are).
    fn scan(&mut self, args: &[&str], out: &mut dyn Write) -> Result<()> {
        let (pid, rest) = pid_arg(args);
        let mode = match rest.as_slice() {
            [] | ["all"] => "all",
            ["new"] => "new",
            ["leak"] => "leak",
            _ => bail!("scan [all|new|leak] [PID]"),
        };
        let path = self.books(pid)?;
        let sym = &mut self.sym;
        let last = self.scans.get(&path);
        if mode == "leak" && last.is_none() {
            bail!("scan leak: no earlier scan of this process to check again");
        }
        let b = &self.books[&path];
        let live = &mut *self.live;
        let opts = &self.opts;
        let res = b.at_next_marker(
            SCAN_MARKER,
            ANSWER,
            || live.send_to(pid, &Command::Scan),
            |st, n| {
                let t = st.trace.as_mut().expect("a marker came, so the header did");
                let res = mtrace_analysis::pipeline::view(t, None, true, |t| {
                    let allocators = mtrace_analysis::report::allocator_maps::of(t, sym);
                    let classes = mtrace_analysis::scan::classify(t, opts.leak_check_heuristics, &allocators)?;
                    let keep = |addr: u64, b: &Block| match (mode, last) {
                        ("new", Some(l)) => b.time > l.snapshot_time,
                        ("leak", Some(l)) => l.lost.contains(&(addr, b.time)),
                        _ => true,
                    };
                    let v = View { keep: Some(&keep), classes: Some(&classes), ..View::default() };
                    let mut r =
                        mtrace_analysis::report::build_view(t, sym, opts.sort, opts.depth, opts.show_reachable, v);
                    r.summary.until_marker = Some(format!("{SCAN_MARKER}#{n}"));
                    let mut found =
                        LastScan { snapshot_time: t.snapshot_time, lost: HashSet::default(), lost_bytes: 0 };
                    for (place, l) in t.books.live().enumerate() {
                        if classes.at(place, l.addr).is_some_and(|c| matches!(c.kind, Kind::Definite | Kind::Indirect))
                        {
                            found.lost.insert((l.addr, l.block.time));
                            found.lost_bytes += l.bytes;
                        }
                    }
                    Some((r, found))
                });
                // The snapshot (stacks and writable memory) is not needed again.
                t.snapshot = None;
                res
            },
        )?;
        let (r, found) = res.ok_or_else(|| anyhow!("the process answered without a snapshot"))?;
        self.write(&r, out)?;
        self.scans.insert(path, found);
        Ok(())
    }

    /// `status [PID]`.
    fn status(&mut self, args: &[&str], out: &mut dyn Write) -> Result<()> {
        let (pid, _) = pid_arg(args);
        let path = self.books(pid)?;
        let ended = self.live.ended();
        let scan = self.scans.get(&path).map(|s| (s.lost.len(), s.lost_bytes));
        let b = &self.books[&path];
        b.with(|st| -> Result<()> {
            let t = st.trace.as_ref().expect("with() checks the header");
            let k = &t.books;
            let avg = k.cur_bytes.checked_div(k.cur_blocks).unwrap_or(0);
            let state = match t.end {
                Some(e) => format!("ended ({e:?})"),
                None if ended && pid.is_none() => "ended".to_owned(),
                None => "traced".to_owned(),
            };
            writeln!(out, "process {} ({}): {state}", t.header.pid, t.header.exe)?;
            if k.sample_rate != 0 {
                let rate = mtrace_analysis::output::words::size_unit(k.sample_rate);
                writeln!(out, "  sampled: one allocation per {rate} on average; the counts are estimates")?;
            }
            let (n, bytes) = (thousands, |v| plural(v, "byte", "bytes"));
            writeln!(out, "  allocation calls: {}, frees: {}", n(k.allocations), n(k.frees))?;
            let blocks = plural(k.cur_blocks, "block", "blocks");
            writeln!(out, "  in use: {} in {blocks} (average {})", bytes(k.cur_bytes), bytes(avg))?;
            writeln!(out, "  frees of blocks from before tracing: {}", n(k.unmatched_frees()))?;
            let (bad, mismatched) = k.wrong_free_counts();
            writeln!(out, "  wrong frees: {bad} double or invalid, {mismatched} mismatched")?;
            match scan {
                Some((blocks, lost)) => {
                    let blocks = plural(blocks as u64, "block", "blocks");
                    writeln!(out, "  lost at the last scan: {} in {blocks}", bytes(lost))?
                }
                None => writeln!(out, "  lost at the last scan: no scan yet")?,
            }
            Ok(())
        })??;
        Ok(())
    }

    /// `show info|searchpath`.
    fn show(&mut self, args: &[&str], out: &mut dyn Write) -> Result<()> {
        match args.first().copied().filter(|a| !a.is_empty()) {
            Some(a) if "info".starts_with(a) => {
                let since = self.opts.since_marker.clone();
                let path = self.live.trace();
                self.with(None, |_, t| -> Result<()> {
                    let h = &t.header;
                    writeln!(out, "program: {} (pid {}, parent {})", h.exe, h.pid, h.ppid)?;
                    writeln!(out, "command: {}", shell_words::join(&h.cmdline))?;
                    let order = if h.big_endian { "big" } else { "little" };
                    writeln!(out, "target: {}, {}-bit, {order}-endian", h.arch, h.pointer_size * 8)?;
                    writeln!(out, "stream: {} ({} records so far)", path.display(), t.records)?;
                    if let Some(m) = &since {
                        writeln!(out, "counting from: {m}")?;
                    }
                    Ok(())
                })??;
            }
            Some(a) if "searchpath".starts_with(a) => {
                let root = self.opts.sysroot.as_ref().map_or("/".into(), |p| p.display().to_string());
                writeln!(out, "sysroot: {root}")?;
                for b in &self.opts.binpath {
                    writeln!(out, "binpath: {}", b.display())?;
                }
            }
            _ => bail!("show info|searchpath"),
        }
        Ok(())
    }
}

impl Drop for Console<'_> {
    fn drop(&mut self) {
        for b in self.books.values() {
            b.finish();
        }
    }
}

/// A trailing PID argument, and the others.
fn pid_arg<'a>(args: &[&'a str]) -> (Option<u32>, Vec<&'a str>) {
    match args.split_last() {
        Some((last, rest)) if last.parse::<u32>().is_ok() => (last.parse().ok(), rest.to_vec()),
        _ => (None, args.to_vec()),
    }
}

/// How long answers are shown, said under `help`'s list (issue 65, item 6:
/// the console paged without saying so).
const PAGING: &str = "An answer longer than the terminal goes through $PAGER (default: less -FRX); \
                      PAGER=cat prints it whole. `>FILE` after a command writes its answer to FILE.";
