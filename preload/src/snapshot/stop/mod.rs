//! Stopping the program's other threads while the leak scan reads memory,
//! and reading their registers (docs/SCAN.md, "Stopping the threads").
//!
//! From outside them ([`from_outside`]): a helper task holds every thread
//! with ptrace, as LeakSanitizer does (helper.rs, ptrace.rs). No code runs
//! on a held thread, so the calls it waits in go on (also those that fail
//! with EINTR after Ctrl-Z and `fg`: helper.rs sets them to be made
//! again), threads that block signals are held too, and each has its exact
//! registers. The caller takes every lock of the tracer's that the
//! snapshot needs before (a held thread may be anywhere, inside a hook
//! too).
//!
//! Where ptrace is refused (a seccomp filter, Yama, another tracer), by a
//! signal whose handler parks each thread ([`by_signal`], signal.rs).

mod helper;
mod ptrace;
mod signal;

pub use crate::platform::park::{own_registers, REGS};
pub use signal::{interrupted, interrupted_pc, park_in_signal, reset_in_child};

use parking_lot::{Mutex, MutexGuard};

use crate::platform::sys;

/// The x86-64 ABI's red zone: a leaf function's live data below the stack
/// pointer, which neither an interrupting signal nor a ptrace stop moves.
const RED_ZONE: u64 = 128;

/// One stop at a time (the writer's on-demand scan, the exit scan).
static LOCK: Mutex<()> = Mutex::new(());

/// Waits for any other stop to end; not `patient` (a fatal signal's
/// handler): `None` when one holds the threads for 2 s.
pub fn one_at_a_time(patient: bool) -> Option<MutexGuard<'static, ()>> {
    crate::stream::lock(&LOCK, !patient)
}

/// A thread held by a stop. A plain value: the snapshot keeps register
/// values (which may point to the program's blocks) only on its stack and
/// in its own scratch mapping, never in memory it scans.
#[derive(Clone, Copy)]
pub struct Parked {
    pub tid: i32,
    regs: [u64; REGS],
    len: usize,
    /// Its stack is live from here up.
    pub live_from: u64,
}

impl Parked {
    /// Its registers (the stack pointer among them) when it stopped.
    pub fn regs(&self) -> &[u64] {
        &self.regs[..self.len]
    }
}

/// How the threads are held.
enum How {
    Outside(ptrace::Holding),
    Signal(signal::Parking),
}

/// The other threads, stopped until this is dropped.
pub struct Stopped {
    how: How,
    /// Threads not stopped: their registers are unknown, their stacks are
    /// read whole.
    pub missed: Vec<i32>,
}

impl Stopped {
    /// The stopped threads, with their registers.
    pub fn parked(&self) -> Vec<Parked> {
        match &self.how {
            How::Outside(h) => h.parked().collect(),
            How::Signal(p) => p.parked().collect(),
        }
    }

    /// Memory of the stop's own (the helper's stack), [low, high): never
    /// a root.
    pub fn own_memory(&self) -> Option<(u64, u64)> {
        match &self.how {
            How::Outside(h) => Some(h.stack()),
            How::Signal(_) => None,
        }
    }
}

/// Why the threads cannot be held from outside here, known before trying
/// (a seccomp filter, Yama's scope 3, the architecture): asked before any
/// lock is taken.
pub fn outside_precluded() -> Option<String> {
    ptrace::precluded()
}

/// Holds every thread of the process but those in `skip` from outside
/// them; why not, if ptrace refuses (nothing is held then). The caller
/// holds every lock of the tracer's that it takes until the drop.
pub fn from_outside(skip: &[i32]) -> Result<Stopped, String> {
    let h = ptrace::hold(skip)?;
    let missed = h.missed(skip);
    Ok(Stopped { how: How::Outside(h), missed })
}

/// Whether the process has no thread but those in `skip`: nothing to
/// hold, neither from outside nor by signal.
pub fn alone(skip: &[i32]) -> bool {
    tasks().iter().all(|t| skip.contains(t))
}

/// Stops every thread of the process but those in `skip` by the stop
/// signal (see signal.rs for what that costs the program).
pub fn by_signal(skip: &[i32]) -> Stopped {
    let (p, missed) = signal::stop(skip);
    Stopped { how: How::Signal(p), missed }
}

/// The thread ids of this process, from /proc/self/task.
fn tasks() -> Vec<i32> {
    sys::numbered_entries(c"/proc/self/task")
}

/// The value of field `name` (with its colon: `"SigBlk:"`) of a
/// `/proc/…/status` text, trimmed.
fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim)
}
