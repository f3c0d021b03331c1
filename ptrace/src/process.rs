//! One traced process: its stream, modules, breakpoints and the scratch
//! pages where breakpoints' displaced instructions run.
//!
//! A breakpoint never comes out: the instruction it covers was copied,
//! moved (arch::displaced), to a scratch page in the target followed by a
//! jump back, and a thread that hits the breakpoint goes on there. So no
//! thread ever runs the function without its breakpoint, and no thread
//! waits for another while one steps over it (glibc here has no endbr64 to
//! skip: Debian 12's functions begin with `push`, `test`, a RIP-relative
//! `cmpb`…). Scratch pages are mapped in the target by a system call the
//! tracer makes there, within reach of RIP-relative operands of the code
//! they serve; their first slot is the breakpoint that catches returns.

use std::sync::Arc;

use anyhow::{bail, Result};
use mtrace_format::Record;
use nix::unistd::Pid;
use rustc_hash::FxHashMap as HashMap;

use crate::arch::{self, NEAR, SLOT};
use crate::funcs::Call;
use crate::modules::{self, Loaded};
use crate::stream::Stream;
use crate::target;
use crate::unwind::Unwind;
use crate::uprobes::Point;

/// A breakpoint: the call it stands for, where its displaced instruction
/// runs, and the range of the module that defines it.
#[derive(Clone, Copy, Debug)]
pub struct Breakpoint {
    /// The function's address.
    pub at: u64,
    pub call: Call,
    pub displaced: u64,
    pub module: (u64, u64),
    /// The byte the breakpoint replaced.
    pub orig: u8,
}

/// A scratch page of the target.
#[derive(Clone, Copy, Debug)]
struct Scratch {
    start: u64,
    len: u64,
    used: u64,
}

/// Bytes per scratch mapping.
const SCRATCH_LEN: u64 = 64 << 10;

/// How long a breakpoint waits for a uprobe's breakpoint instruction at
/// its function to go (the closing child of a `--hooks uprobes` tracer
/// that had just detached took 1.3–1.5 s here; docs/PTRACE.md).
const BREAKPOINT_GONE: std::time::Duration = std::time::Duration::from_secs(5);

pub struct Process {
    pub pid: Pid,
    pub stream: Stream,
    pub modules: Vec<Arc<Loaded>>,
    pub breakpoints: HashMap<u64, Breakpoint>,
    scratch: Vec<Scratch>,
    /// The breakpoint returns come back to (first slot of the first scratch).
    pub trampoline: u64,
    pub unwind: Unwind,
    /// A statically linked program: the allocator is part of the
    /// executable, and its own calls cannot be told from the program's.
    pub static_exe: bool,
    /// [start, end) of the executable's mappings: a call its own code
    /// makes to a function it defines is the program's, direct or not
    /// (an allocator of its own, as Chromium's or own_malloc.c's).
    pub exe_range: Option<(u64, u64)>,
    /// For a static program, or under sampling, the blocks reported live:
    /// a free of any other address is the allocator's own (its caches) or
    /// of a block not sampled, and not recorded ([`Process::keeps_live`]).
    pub live: rustc_hash::FxHashSet<u64>,
    /// Under sampling (`--sample-rate`), the mean bytes between recorded
    /// allocations (`mtrace_format::sampling`); 0: every one.
    pub sample_rate: u64,
    /// When the resident set size was last sampled, ns of the stream.
    sampled: u64,
    /// The interposed functions are hooked by kernel uprobes (`uprobes`),
    /// not breakpoints; the loader's breakpoint stays one.
    pub uprobes: bool,
    /// Under uprobes, every function probed so far, in the order threads
    /// open their events for them.
    pub points: Vec<Point>,
    /// The kernel's `[uprobes]` page, where return probes return to.
    area: Option<(u64, u64)>,
    /// The leak scan's snapshot of this image was taken (at its end).
    pub scanned: bool,
    /// The stacks of its threads that ended ([`crate::snapshot::dead_stack`]).
    pub dead_stacks: Vec<(u64, u64)>,
    /// Report points made so far (reports.rs).
    pub reports: u64,
    /// The C API's stubs (api.rs): each function's breakpoint address.
    pub api: Vec<(crate::funcs::Api, u64)>,
    /// The GOT slots of the API's references are to be written again at
    /// the next entry of an interposed function (api.rs says why).
    pub api_pending: bool,
    /// Allocations are recorded (`mtrace_start()`/`mtrace_stop()`).
    pub collecting: bool,
    /// Pool names given to `mtrace_alloc()` in this stream; a pool's id is
    /// its index + 1.
    pub pools: Vec<String>,
}

/// How often the resident set size is sampled while the program makes
/// calls, ns (as the preload's writer: every 10 ms).
const SAMPLE_NS: u64 = 10_000_000;

impl Process {
    /// A process with no module known yet.
    fn new(pid: Pid, stream: Stream) -> Process {
        Process {
            pid,
            stream,
            modules: Vec::new(),
            breakpoints: HashMap::default(),
            scratch: Vec::new(),
            trampoline: 0,
            unwind: Unwind::default(),
            static_exe: false,
            exe_range: None,
            live: Default::default(),
            sample_rate: 0,
            sampled: 0,
            uprobes: false,
            points: Vec::new(),
            area: None,
            scanned: false,
            dead_stacks: Vec::new(),
            reports: 0,
            api: Vec::new(),
            api_pending: false,
            collecting: true,
            pools: Vec::new(),
        }
    }

    /// Whether the interposed functions are hooked by uprobes: the
    /// stream's records then come a ring at a time (stream.rs).
    fn set_uprobes(&mut self, uprobes: bool) {
        self.uprobes = uprobes;
        if uprobes {
            self.stream.set_unordered();
        }
    }

    /// Whether `w`, a return address read from the stack, is the one a
    /// caught return replaced it by: the trampoline breakpoint, or under
    /// uprobes the kernel's `[uprobes]` page (read from /proc/PID/maps
    /// the first time one is asked about: the page exists once a probe
    /// was hit).
    pub fn is_trampoline(&mut self, w: u64) -> bool {
        if !self.uprobes {
            return w == self.trampoline && w != 0;
        }
        if self.area.is_none() {
            self.area = modules::special_mapping(self.pid, "[uprobes]");
        }
        self.area.is_some_and(|(a, b)| a <= w && w < b)
    }

    /// A Sample record (RSS from /proc/PID/statm) when the last is
    /// [`SAMPLE_NS`] old: the memory chart of the HTML page and `--timeline`.
    pub fn sample(&mut self, tid: u32) {
        let time_ns = self.stream.now();
        if time_ns < self.sampled + SAMPLE_NS {
            return;
        }
        self.sampled = time_ns;
        let statm = std::fs::read_to_string(format!("/proc/{}/statm", self.pid)).unwrap_or_default();
        let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as u64;
        if !self.uprobes {
            // Breakpoints record every event when it happens: all stamped
            // before now are in the stream, so the books enter them before
            // the sample takes the heap's size.
            self.stream.watermark(time_ns);
        }
        self.stream.record(tid, &Record::Sample { time_ns, rss: pages * page });
    }

    /// The process `pid` just after an exec (stopped at its first
    /// instruction, nothing allocated yet): its stream says it is whole.
    pub fn exec(
        pid: Pid,
        ppid: u32,
        pattern: &str,
        uprobes: bool,
        signals: &mut Vec<nix::sys::signal::Signal>,
    ) -> Result<Process> {
        target::settle(pid, signals)?;
        let stream = Stream::create(pattern, pid.as_raw() as u32, ppid)?;
        let mut p = Process::new(pid, stream);
        p.set_uprobes(uprobes);
        p.update_modules(pid, signals)?;
        p.static_exe = p.no_loader();
        p.exe_range = p.executable();
        p.say_own_allocator(pid.as_raw() as u32);
        let time_ns = p.stream.now();
        p.stream.record(pid.as_raw() as u32, &Record::Coverage { time_ns, collecting: true, whole: true });
        Ok(p)
    }

    /// Running process `pid`, just seized and stopped (thread `tid`): a
    /// stream that does not know the blocks allocated before, marked as an
    /// attach (the analyzer says "allocated while attached").
    pub fn attach(
        pid: Pid,
        tid: Pid,
        pattern: &str,
        uprobes: bool,
        signals: &mut Vec<nix::sys::signal::Signal>,
    ) -> Result<Process> {
        let stream = Stream::create(pattern, pid.as_raw() as u32, parent_of(pid))?;
        let mut p = Process::new(pid, stream);
        p.set_uprobes(uprobes);
        let time_ns = p.stream.now();
        let name = mtrace_format::protocol::marker::ATTACH.to_owned();
        p.stream.record(tid.as_raw() as u32, &Record::Marker { time_ns, seq: 0, name });
        p.update_modules(tid, signals)?;
        p.static_exe = p.no_loader();
        p.exe_range = p.executable();
        p.say_own_allocator(tid.as_raw() as u32);
        Ok(p)
    }

    /// The child `pid` a fork of `parent` made: the same modules,
    /// breakpoints and scratch pages (its memory is a copy), a stream of
    /// its own that does not know the blocks it inherited.
    pub fn fork(parent: &Process, pid: Pid, pattern: &str) -> Result<Process> {
        let mut stream = Stream::create(pattern, pid.as_raw() as u32, parent.pid.as_raw() as u32)?;
        if parent.uprobes {
            stream.set_unordered();
        }
        let mut unwind = Unwind::default();
        for m in &parent.modules {
            unwind.add(m);
        }
        let mut p = Process {
            pid,
            stream,
            modules: parent.modules.clone(),
            breakpoints: parent.breakpoints.clone(),
            scratch: parent.scratch.clone(),
            trampoline: parent.trampoline,
            unwind,
            static_exe: parent.static_exe,
            exe_range: parent.exe_range,
            live: parent.live.clone(),
            sample_rate: 0,
            sampled: 0,
            uprobes: parent.uprobes,
            points: parent.points.clone(),
            area: parent.area,
            scanned: false,
            dead_stacks: Vec::new(),
            reports: 0,
            api: parent.api.clone(),
            api_pending: parent.api_pending,
            collecting: parent.collecting,
            pools: Vec::new(),
        };
        p.write_modules(pid.as_raw() as u32);
        p.say_own_allocator(pid.as_raw() as u32);
        p.sample_at(parent.sample_rate);
        Ok(p)
    }

    /// Samples allocations at `rate` bytes from now (0: records every
    /// one), saying so in the stream.
    pub fn sample_at(&mut self, rate: u64) {
        self.sample_rate = rate;
        if rate != 0 {
            let time_ns = self.stream.now();
            self.stream.record(self.pid.as_raw() as u32, &Record::Sampling { time_ns, rate });
        }
    }

    /// Allocations are recorded from now on, or not (`mtrace_start()`,
    /// `mtrace_stop()`, the console's `start`, `stop`), said in the stream
    /// by thread `tid`'s Coverage record when it changes.
    pub fn set_collecting(&mut self, tid: u32, on: bool) {
        if self.collecting != on {
            self.collecting = on;
            let time_ns = self.stream.now();
            self.stream.record(tid, &Record::Coverage { time_ns, collecting: on, whole: false });
        }
    }

    /// Whether the stream holds only the blocks in [`Process::live`]: a
    /// static program's (its allocator's own calls look like the
    /// program's), or a sampled one's.
    pub fn keeps_live(&self) -> bool {
        self.static_exe || self.sample_rate != 0
    }

    fn write_modules(&mut self, tid: u32) {
        let modules = self.modules.iter().map(|m| m.module.clone()).collect();
        let time_ns = self.stream.now();
        self.stream.record(tid, &Record::Modules { time_ns, modules });
    }

    /// Looks at the modules mapped now (stopped thread `tid`): new ones get
    /// their breakpoints and unwind tables, gone ones are forgotten, and
    /// the stream gets the list when it changed.
    pub fn update_modules(&mut self, tid: Pid, signals: &mut Vec<nix::sys::signal::Signal>) -> Result<()> {
        // /proc/PID/maps read once: the files mapped now, each with where
        // this process opens it.
        let mappings = modules::file_mappings(self.pid)?;
        let files = modules::files(&mappings);
        let maps: Vec<(String, u64)> = files.iter().map(|f| (f.path.clone(), f.start)).collect();
        let gone: Vec<u64> = self
            .modules
            .iter()
            .filter(|m| !maps.contains(&(m.module.path.clone(), m.range.0)))
            .map(|m| m.range.0)
            .collect();
        for start in &gone {
            self.unwind.remove(*start);
            self.breakpoints.retain(|_, b| b.module.0 != *start);
        }
        self.modules.retain(|m| !gone.contains(&m.range.0));
        let known: Vec<(String, u64)> = self.modules.iter().map(|m| (m.module.path.clone(), m.range.0)).collect();
        let new = modules::scan(&files, &known);
        let changed = !gone.is_empty() || !new.is_empty();
        for m in new {
            self.unwind.add(&m);
            for &(addr, call) in &m.funcs {
                if self.uprobes && !matches!(call, Call::LoaderState | Call::Exit) {
                    // In the file's mapping that holds it: the file offset.
                    match mappings.iter().find(|f| f.start <= addr && addr < f.end) {
                        Some(f) => self.points.push(Point {
                            at: addr,
                            call,
                            module: m.range,
                            // Where this process opens the file: the kernel
                            // resolves a uprobe's path here.
                            path: Arc::new(std::ffi::CString::new(f.open.as_str())?),
                            offset: addr - f.start + f.offset,
                        }),
                        None => eprintln!("mtrace: {addr:#x} ({}) is in no mapping of the file", m.module.path),
                    }
                    continue;
                }
                if let Err(e) = self.breakpoint(tid, addr, call, m.range, signals) {
                    eprintln!("mtrace: no breakpoint at {addr:#x} ({}): {e:#}", m.module.path);
                }
            }
            self.modules.push(Arc::new(m));
        }
        if changed {
            self.write_modules(tid.as_raw() as u32);
        }
        if self.modules.iter().any(|m| !m.api_slots.is_empty()) {
            self.patch_api(tid, signals);
        }
        Ok(())
    }

    /// A scratch slot within reach of `near` (mapping a new page there if
    /// none has room).
    pub(crate) fn slot(&mut self, tid: Pid, near: u64, signals: &mut Vec<nix::sys::signal::Signal>) -> Result<u64> {
        let fits = |s: &Scratch| s.used + SLOT <= s.len && s.start.abs_diff(near) < NEAR;
        if let Some(s) = self.scratch.iter_mut().find(|s| fits(s)) {
            let at = s.start + s.used;
            s.used += SLOT;
            return Ok(at);
        }
        // A page near the code, at one of a few distances below or above
        // it, where nothing is mapped (MAP_FIXED_NOREPLACE: never over a
        // mapping, and exactly there).
        let prot = (libc::PROT_READ | libc::PROT_EXEC) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64;
        let mut at = None;
        for step in [64u64 << 20, 256 << 20, 1 << 30] {
            for hint in [near.checked_sub(step), near.checked_add(step)].into_iter().flatten() {
                let hint = hint & !0xfff;
                if hint < 1 << 20 {
                    continue;
                }
                let got = target::syscall(
                    tid,
                    libc::SYS_mmap as u64,
                    [hint, SCRATCH_LEN, prot, flags, u64::MAX, 0],
                    signals,
                )?;
                if got == hint {
                    at = Some(got);
                    break;
                }
            }
            if at.is_some() {
                break;
            }
        }
        let Some(at) = at else { bail!("no room for a scratch page within reach of {near:#x}") };
        let mut s = Scratch { start: at, len: SCRATCH_LEN, used: 0 };
        if self.trampoline == 0 {
            // The first slot: the breakpoint returns come back to.
            target::poke(tid, at, &arch::BREAKPOINT)?;
            self.trampoline = at;
            s.used = SLOT;
        }
        let slot = s.start + s.used;
        s.used += SLOT;
        self.scratch.push(s);
        Ok(slot)
    }

    /// Puts a breakpoint for `call` at `addr` of the module at `module`.
    fn breakpoint(
        &mut self,
        tid: Pid,
        addr: u64,
        call: Call,
        module: (u64, u64),
        signals: &mut Vec<nix::sys::signal::Signal>,
    ) -> Result<()> {
        if self.breakpoints.contains_key(&addr) {
            return Ok(());
        }
        let mut code = [0u8; arch::CODE_READ];
        // A breakpoint instruction there already is a uprobe's that is being
        // removed (a `--hooks uprobes` tracer just before this one: its
        // closing child takes seconds; docs/PTRACE.md) or one the kernel
        // failed to remove ("leaking uprobe" in dmesg), or another tracer's.
        // Taken for the function's own first byte, it was put back at the
        // detach: the program later died of SIGTRAP, and meanwhile the
        // kernel's removal took this tracer's out (no call seen). So it
        // waits for the instruction to be the file's again.
        let until = std::time::Instant::now() + BREAKPOINT_GONE;
        loop {
            if target::read(self.pid, addr, &mut code) < code.len() {
                bail!("cannot read its code");
            }
            if code[..arch::BREAKPOINT.len()] != arch::BREAKPOINT {
                break;
            }
            if std::time::Instant::now() >= until {
                bail!(
                    "its first instruction is a breakpoint already, for {} s: another tracer's, or a uprobe the \
                     kernel failed to remove (dmesg: \"leaking uprobe\")",
                    BREAKPOINT_GONE.as_secs()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let slot = self.slot(tid, addr, signals)?;
        let moved = arch::displaced(&code, addr, slot)?;
        target::poke(tid, slot, &moved)?;
        target::poke(tid, addr, &arch::BREAKPOINT)?;
        self.breakpoints.insert(addr, Breakpoint { at: addr, call, displaced: slot, module, orig: code[0] });
        Ok(())
    }

    /// No dynamic loader is mapped: a statically linked program.
    /// A dynamic executable that defines `malloc` has an allocator of its
    /// own, which may hand out and take back blocks through functions of
    /// its own, as Chromium's does: the stream says which of its functions
    /// have breakpoints, as the preload's Patched record says which it
    /// patched, and the analyzer judges its frees accordingly
    /// (`Books::every_path_seen`). A static one's `malloc` is libc's.
    fn say_own_allocator(&mut self, tid: u32) {
        let Some(exe) = self.exe_range.and_then(|r| self.modules.iter().find(|m| m.range == r)) else { return };
        if self.static_exe || !exe.allocation_names.iter().any(|n| n == "malloc") {
            return;
        }
        let patch = mtrace_format::Patch {
            path: exe.module.path.clone(),
            hooked: exe.allocation_names.clone(),
            refused: Vec::new(),
        };
        let time_ns = self.stream.now();
        self.stream.record(tid, &Record::Patched { time_ns, patch: Box::new(patch) });
    }

    /// The executable's mappings among the modules (`/proc/PID/exe` names
    /// the file its maps do).
    fn executable(&self) -> Option<(u64, u64)> {
        let exe = std::fs::read_link(format!("/proc/{}/exe", self.pid)).ok()?;
        self.modules.iter().find(|m| std::path::Path::new(&m.module.path) == exe).map(|m| m.range)
    }

    fn no_loader(&self) -> bool {
        !self.modules.iter().any(|m| m.module.path.contains("/ld-linux") || m.module.path.contains("/ld-musl"))
    }

    /// Puts back every byte a breakpoint replaced (stopped thread `tid`).
    pub fn remove_breakpoints(&mut self, tid: Pid) {
        for (&addr, b) in &self.breakpoints {
            let _ = target::poke(tid, addr, &[b.orig]);
        }
        self.breakpoints.clear();
    }
}

/// The parent of process `pid` (0 when unknown).
pub fn parent_of(pid: Pid) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}
