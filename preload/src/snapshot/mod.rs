//! The memory snapshot the leak scan reads (docs/SCAN.md), written into
//! the trace so that `mtrace report` can classify the blocks offline as
//! memcheck does. Taken at exit by the exiting thread (`MTRACE_SCAN=1`), or
//! on demand by the writer thread (`MTRACE_SCAN_SIGNAL`).
//!
//! The program's other threads are stopped first (stop/). Written: each
//! stopped thread's registers and its stack from the stack pointer up, and
//! every other readable, writable mapping except the tracer's own (this
//! library's data, the writer's stack) and the kernel's ([vvar], [vdso]).
//! Also each module's RELRO (not a root; the analyzer recognises vtables
//! there for memcheck's multipleinheritance heuristic;
//! `mtrace_format::maps::relro` finds it, for the ptrace tracer too).
//! Memory is read with process_vm_readv, which fails where a read would
//! fault (guard pages, mappings whose file shrank) instead of crashing,
//! into working memory the snapshot leaves out (scratch.rs). Of stacks and
//! mappings only the words that can matter to the scan are written
//! (filter.rs).

use std::sync::atomic::{AtomicU64, Ordering};

use mtrace_format::maps::Mapping;
use mtrace_format::region_kind;

use crate::platform::sys;
use crate::record::dead_stacks;
use crate::stream::{FileHold, Session};

mod filter;
mod scratch;
pub mod stop;
use scratch::Scratch;
use stop::Stopped;

/// The readable mappings of `/proc/self/maps`.
fn readable_mappings() -> Vec<Mapping> {
    let Some(maps) = sys::read_file(c"/proc/self/maps") else { return Vec::new() };
    Mapping::all(&String::from_utf8_lossy(&maps)).filter(|m| m.read).collect()
}

/// Who takes the snapshot.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// A thread of the program (at exit, `mtrace_scan()`): its callee-saved
    /// registers and stack pointer (last) at the program's frame, as
    /// `stop::own_registers` orders them; the stack from there up is a root.
    Program([u64; 7]),
    /// The writer thread (on demand): the tracer's own, not a root.
    Writer,
    /// A thread of the program in a signal's handler (a fatal signal's;
    /// the scan signal's in a process with one thread): the registers
    /// the signal interrupted (`stop::interrupted`), and its stack is live
    /// from `live_from` up. Every lock is taken with a deadline (a fatal
    /// signal may have interrupted the thread holding one of the tracer's).
    Interrupted { regs: [u64; crate::snapshot::stop::REGS], len: usize, live_from: u64 },
}

impl By {
    /// The calling thread, a thread of the program, whose own frame is the
    /// caller of the innermost call of `func` (libc's `exit`, the API's
    /// `mtrace_scan`): the frames below it (the exit path, the tracer's)
    /// are not roots. Where unwinding cannot reach that frame, the calling
    /// thread's registers and stack from here.
    pub fn program_calling(func: usize) -> By {
        By::Program(crate::unwind::program_frame::caller_of(func).unwrap_or_else(crate::snapshot::stop::own_registers))
    }

    /// The taker of a scan asked for (a command, the scan signal): the
    /// writer thread, or, in a process without one (solo), the program's
    /// thread in a hook: its roots are those of the program's frame that
    /// called the hook (the hook's and the tracer's frames below it hold
    /// stale words of frames that died), else its registers here.
    pub fn asked(s: &Session) -> By {
        if !s.is_solo() && s.writer_tid() == sys::gettid() {
            return By::Writer;
        }
        let caller = own_range(true)
            .and_then(|(lo, hi)| crate::unwind::program_frame::caller_of_range(lo as usize, hi as usize));
        By::Program(caller.unwrap_or_else(crate::snapshot::stop::own_registers))
    }
}

/// This library's address range, found once: [`take`] leaves its data
/// out of the roots.
static OWN: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// This library's address range; not `patient` (a fatal signal's
/// handler, which may have interrupted the loader holding its lock), only
/// if it was found before (lib.rs's constructor looks it up).
pub fn own_range(patient: bool) -> Option<(u64, u64)> {
    let (lo, hi) = (OWN[0].load(Ordering::Acquire), OWN[1].load(Ordering::Acquire));
    if hi > 0 || !patient {
        return (hi > 0).then_some((lo, hi));
    }
    let (lo, hi) = crate::platform::modules::range_of(own_range as fn(bool) -> Option<(u64, u64)> as usize)?;
    OWN[0].store(lo as u64, Ordering::Release);
    OWN[1].store(hi as u64, Ordering::Release);
    Some((lo as u64, hi as u64))
}

/// `[lo, hi)` minus each of `out` (ranges that may overlap it or not).
fn subtract(lo: u64, hi: u64, out: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut parts = vec![(lo, hi)];
    for &(a, b) in out {
        parts = parts
            .into_iter()
            .flat_map(|(l, h)| {
                if b <= l || a >= h {
                    vec![(l, h)]
                } else {
                    [(l, a), (b, h)].into_iter().filter(|(x, y)| x < y).collect()
                }
            })
            .collect();
    }
    parts
}

/// The tracer's locks the snapshot takes: the trace file (everything the
/// threads buffered written first), and, for a stop from outside, the
/// tracer's heap. Dropped heap first: a thread waiting for the file may
/// hold parking_lot's table of waiters while it allocates that table.
struct Locks<'a> {
    /// Kept for its drop.
    _heap: Option<crate::platform::allocator::Hold>,
    file: FileHold<'a>,
}

/// Takes [`Locks`] (the heap too with `heap`; what the threads buffered
/// written first with `collect`); a warning if it could not.
fn lock(s: &Session, patient: bool, heap: bool, collect: bool) -> Result<Locks<'_>, &'static str> {
    let file = match collect {
        true => s.hold_file(patient).ok_or("the trace stayed locked for 2 s; no leak scan")?,
        false => s.hold_file_as_is(),
    };
    // Not patient: the signal's handler may have interrupted its holder.
    let stayed = "the tracer's heap stayed locked for 1 s; no leak scan";
    let heap = if heap { Some(crate::platform::allocator::hold(patient).ok_or(stayed)?) } else { None };
    Ok(Locks { _heap: heap, file })
}

/// Why the threads were not held from outside.
enum NotHeld {
    /// No scan at all (a lock stayed taken).
    NoScan(&'static str),
    /// ptrace cannot: stop them by signal.
    Refused(String),
}

/// Holds the other threads from outside them, every lock of the tracer's
/// that the snapshot needs taken first, while they run: a held thread may
/// be anywhere, inside a hook too, and must hold none of them.
fn hold_from_outside<'a>(
    s: &'a Session,
    patient: bool,
    skip: &[i32],
    collect: bool,
) -> Result<(Stopped, Locks<'a>), NotHeld> {
    if crate::platform::allocator::range().is_none() {
        // The tracer allocates from the program's malloc, whose lock a
        // held thread may hold.
        return Err(NotHeld::Refused("the tracer's heap could not be reserved".into()));
    }
    if let Some(why) = stop::outside_precluded() {
        return Err(NotHeld::Refused(why));
    }
    let locks = lock(s, patient, true, collect).map_err(NotHeld::NoScan)?;
    match stop::from_outside(skip) {
        Ok(stopped) => Ok((stopped, locks)),
        Err(why) => Err(NotHeld::Refused(why)),
    }
}

/// The program's other threads, stopped, with what the snapshot must know
/// of the time before they were.
pub struct Held {
    stopped: Stopped,
    /// Why they were stopped by signal, not from outside (ptrace refused).
    by_signal: Option<String>,
    /// The stacks of threads that ended, listed before the stop (a
    /// stopped thread may hold the list's lock).
    dead: Vec<(u64, u64)>,
}

/// Stops every thread of the program but the calling one and the writer,
/// with the tracer's locks the snapshot takes (a thread stopped from
/// outside may be anywhere: it holds none of them then), what they
/// buffered written first with `collect`; why not, when it could not (a
/// lock stayed taken).
fn hold(s: &Session, patient: bool, collect: bool) -> Result<(Held, Locks<'_>), &'static str> {
    // Before stopping anybody: a stopped thread may hold the lock of the
    // list of dead stacks.
    let dead = dead_stacks::all();
    let skip = [sys::gettid() as i32, s.writer_tid() as i32];
    if stop::alone(&skip) {
        // Nobody to hold: no helper task, no signal. (A helper could not
        // even start in a process whose children's pid namespace lost its
        // init, `unshare --pid`'s after its child ended: clone failed with
        // ENOMEM, and the report said the threads were stopped by signal.)
        let stopped = stop::by_signal(&skip);
        let locks = lock(s, patient, false, collect)?;
        return Ok((Held { stopped, by_signal: None, dead }, locks));
    }
    match hold_from_outside(s, patient, &skip, collect) {
        Ok((stopped, locks)) => Ok((Held { stopped, by_signal: None, dead }, locks)),
        Err(NotHeld::NoScan(why)) => Err(why),
        Err(NotHeld::Refused(why)) => {
            // The threads first, the locks after: a thread parks only when
            // it leaves the tracer's code (signal.rs).
            let stopped = stop::by_signal(&skip);
            let locks = lock(s, patient, false, collect)?;
            Ok((Held { stopped, by_signal: Some(why), dead }, locks))
        }
    }
}

/// Stops the program's other threads, then writes the snapshot and a
/// ScanEnd into the trace; returns the ScanEnd's time, ns.
pub fn take(s: &Session, by: By) -> u64 {
    let patient = !matches!(by, By::Interrupted { .. });
    // Before stopping anybody: a stopped thread may hold the loader's lock.
    own_range(patient);
    let Some(_one) = stop::one_at_a_time(patient) else {
        sys::warn("another leak scan held the program's threads for 2 s; no scan");
        return s.now();
    };
    let (held, locks) = match hold(s, patient, true) {
        Ok(h) => h,
        Err(why) => {
            sys::warn(why);
            return s.now();
        }
    };
    let now = write(s, by, &held, &locks);
    // The threads go first: one may be waiting for a lock taken here.
    drop(held);
    drop(locks);
    now
}

/// At the end of `exit` (docs/PROCESSES.md): the program's other threads
/// held until the process ends, so that they make no progress while the
/// tracer scans and writes the end of the trace, as natively the process
/// would be gone. A thread stopped inside an append to its buffer would
/// hold the last collection up for good: the stop is made again (up to
/// 50 times, a millisecond apart) until none is. `None`: they could not
/// be held (a lock stayed taken, or a thread was always appending), and
/// run on.
pub fn hold_for_exit(s: &Session) -> Option<Held> {
    let _one = stop::one_at_a_time(true)?;
    for _ in 0..50 {
        // Stopped first, collected after (by the scan, the final flush):
        // a collection of everything the threads buffered took long
        // enough for them to go on a step of work or two.
        let (held, locks) = hold(s, true, false).ok()?;
        if !s.appending() {
            return Some(held);
        }
        drop(held);
        drop(locks);
        sys::sleep_ms(1);
    }
    None
}

/// [`take`] with the other threads `held` already ([`hold_for_exit`]),
/// which stay so.
pub fn take_held(s: &Session, by: By, held: &Held) -> u64 {
    match lock(s, true, true, true) {
        Ok(locks) => write(s, by, held, &locks),
        Err(why) => {
            sys::warn(why);
            s.now()
        }
    }
}

/// Writes the snapshot of the process whose other threads are `held`
/// (the calling thread taking it `by`) and a ScanEnd, the tracer's
/// `locks` taken; the ScanEnd's time, ns.
fn write(s: &Session, by: By, held: &Held, locks: &Locks) -> u64 {
    let patient = !matches!(by, By::Interrupted { .. });
    let own = own_range(patient);
    let me = sys::gettid();
    let writer_stack = (s.writer_stack[0].load(Ordering::Relaxed), s.writer_stack[1].load(Ordering::Relaxed));
    let (stopped, by_signal, dead) = (&held.stopped, &held.by_signal, &held.dead);
    let now = s.now();
    let Some(mut scratch) = Scratch::new(me, now) else {
        sys::warn("no memory for the leak scan's snapshot; no scan");
        return now;
    };
    let file = &locks.file;
    if let Some(why) = by_signal {
        scratch.note(file, region_kind::STOPPED_BY_SIGNAL, why.as_bytes());
    }
    // Registers: the stopped threads', the calling thread's if it is the
    // program's; threads not stopped get an empty (unknown) set.
    let mut stacks: Vec<u64> = Vec::new();
    match &by {
        By::Program(r) => {
            scratch.registers(file, me, r);
            stacks.push(r[r.len() - 1]);
        }
        By::Interrupted { regs, len, live_from } => {
            scratch.registers(file, me, &regs[..*len]);
            stacks.push(*live_from);
        }
        By::Writer => {}
    }
    for p in stopped.parked() {
        scratch.registers(file, p.tid as u32, p.regs());
        stacks.push(p.live_from);
    }
    for &tid in &stopped.missed {
        scratch.registers(file, tid as u32, &[]);
    }
    // The tracer's own memory: this library, its heap, the writer's stack
    // and compression context, the scratch, the stop's helper. And the
    // stacks of threads that ended (no live thread's stack pointer in them).
    let mut tracer = vec![writer_stack, s.zstd_range(), scratch.range(), s.unrecorded_block()];
    tracer.extend(own);
    tracer.extend(crate::platform::allocator::range());
    tracer.extend(stopped.own_memory());
    // The set of sampled blocks holds their addresses: not a root.
    tracer.extend(crate::record::sampled::ranges());
    let me_sp = dead_stacks::stack_address();
    tracer
        .extend(dead.iter().copied().filter(|&(lo, hi)| !stacks.iter().chain([&me_sp]).any(|&sp| lo <= sp && sp < hi)));
    let maps = readable_mappings();
    if cfg!(target_pointer_width = "64") {
        let spans: Vec<(u64, u64, bool)> = maps.iter().map(|m| (m.start, m.end, m.write)).collect();
        scratch.keep_only(filter::Filter::new(&spans));
    }
    for (lo, hi) in mtrace_format::maps::relro(&maps) {
        scratch.memory(file, region_kind::READ_ONLY, lo, hi);
    }
    for m in maps.into_iter().filter(|m| m.write) {
        if m.path == "[vvar]" || m.path == "[vdso]" || m.path == "[vsyscall]" {
            continue;
        }
        let (lo, hi) = (m.start, m.end);
        for (lo, hi) in subtract(lo, hi, &tracer) {
            // A stopped thread's stack: only from its lowest live address
            // up (which may be up to a red zone below the mapping).
            match stacks.iter().find(|&&f| f < hi && f + 128 >= lo) {
                Some(&f) => scratch.memory(file, region_kind::STACK, f.max(lo) & !7, hi),
                None => scratch.memory(file, region_kind::MAPPING, lo, hi),
            }
        }
    }
    scratch.finish(file);
    now
}

/// A leak scan now (the program's threads stopped while memory is read),
/// then its report like [`Session::report_point`]'s. `by` says whether the
/// calling thread is the program's (its stack is a root). With `wait`
/// (the round to run while waiting: `record::guard::report_waited`),
/// returns whether the report was written.
pub fn scan_point(s: &Session, by: By, out: Option<&str>, wait: Option<fn(&Session)>) -> bool {
    take(s, by);
    match wait {
        Some(round) => crate::record::guard::report_waited(s, crate::stream::SCAN_REPORT, out, round),
        None => s.report_point(crate::stream::SCAN_REPORT, out),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn subtract_cuts_holes_and_ends() {
        assert_eq!(super::subtract(0, 100, &[(20, 30), (90, 200)]), vec![(0, 20), (30, 90)]);
        assert_eq!(super::subtract(0, 100, &[(0, 100)]), vec![]);
        assert_eq!(super::subtract(10, 20, &[(0, 5), (30, 40)]), vec![(10, 20)]);
    }
}
