//! What a thread's stop at a breakpoint means: an interposed function's
//! entry, or its return to the trampoline. Frees are recorded at entry
//! (before the real free runs), allocations when they return, realloc's
//! free half stamped at entry. Calls an interposed function makes to
//! another (libstdc++'s `new` calling malloc, glibc's free calling munmap)
//! are the outer call's: one event, as libmtrace.so records them.

use mtrace_format::realloc::Realloc;
use mtrace_format::recording::Recording;
use mtrace_format::{Family, Record};
use nix::unistd::Pid;

use crate::arch::{self, Regs};
use crate::funcs::Call;
use crate::process::Process;
use crate::target::{self, Stack};

/// An interposed function's hook: where it is, what it does, and the
/// module that defines it.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    pub at: u64,
    pub call: Call,
    /// [start, end) of the module.
    pub module: (u64, u64),
}

/// The outermost interposed call a thread is in.
#[derive(Clone, Copy, Debug)]
pub struct Outer {
    /// The stack pointer at its entry (the slot of its return address).
    /// A later entry with a lower one is nested in it while that slot
    /// still holds `ret` (after it returned, the caller's next call
    /// overwrote it); one above it means it has returned (or was left by
    /// an exception or a longjmp).
    sp: u64,
    ret: u64,
    /// Its first argument: a call at the same stack pointer with the same
    /// one is a tail call it made (libstdc++'s `delete[]` jumps to
    /// `delete`, `delete` to `free`, `new[]` to `new`), part of it.
    arg: u64,
    /// It can make no more tail calls (its event is complete): a call at
    /// its stack pointer is one its caller made next.
    done: bool,
    /// For `operator new`: the family and size of the block the
    /// allocation it makes returns, its backtrace, whether it is
    /// recorded (under sampling), and the alignment it asked for (0: not
    /// an aligned new).
    new: Option<(Family, u64, u32, bool, u64)>,
}

/// A call whose return is caught: its return address was replaced by the
/// trampoline's.
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    /// Where the return address is (the stack slot).
    slot: u64,
    ret: u64,
    call: Call,
    args: [u64; 5],
    stack: u32,
    /// When it was entered, ns.
    time: u64,
    /// `operator new`'s family, size and alignment (0: none asked for),
    /// for the allocation it made.
    new: Option<(Family, u64, u64)>,
    /// Its allocation is recorded: always, but under sampling when the
    /// thread's count-down did not pick it.
    picked: bool,
}

/// A thread's state between its stops.
#[derive(Default, Debug)]
pub struct Thread {
    pub outer: Option<Outer>,
    pub pending: Vec<Pending>,
    /// Its registers at the entry of `exit`, if it called it: the leak
    /// scan's roots are the calling frame's, not the exit path's.
    pub exit_call: Option<Regs>,
    /// Under sampling: bytes to its next sample point (0: none drawn
    /// yet) and its random state (`mtrace_format::sampling::pick`).
    pub sampling: (u64, u64),
}

/// Threads that drew a first sample point, for their seeds.
static SAMPLING_THREADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether the allocation of `size` bytes thread `th` makes is recorded
/// (always when every allocation is).
fn pick(th: &mut Thread, s: &Recording, size: u64) -> bool {
    if s.sample_rate == 0 {
        return true;
    }
    let (left, rng) = &mut th.sampling;
    mtrace_format::sampling::pick(left, rng, size, s.sample_rate, || {
        let n = SAMPLING_THREADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match s.sample_seed {
            // As the preload: the n-th thread's points from the seed and n.
            Some(seed) => seed ^ n.wrapping_mul(0xd1b5_4a32_d192_ed03),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(n, |d| d.as_nanos() as u64 ^ n),
        }
    })
}

/// The backtrace of a call stopped at its entry with return address `ret`.
pub(crate) fn backtrace(p: &mut Process, tid: u32, at: &Entry, ret: u64, depth: usize, frames: &mut Vec<u64>) -> u32 {
    let t = std::time::Instant::now();
    frames.clear();
    p.unwind.walk(p.pid, arch::caller(at.regs, ret), at.stack, depth, frames);
    crate::stats::add(&crate::stats::UNWIND_NS, t);
    crate::stats::UNWINDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    p.stream.stack(tid, frames)
}

/// Whether the call of `b`'s function returning to `ret` is one the
/// library that defines it makes itself, which libmtrace.so does not see
/// either: glibc's mappings for large blocks and thread stacks; in a
/// shared library, a direct call to the function (glibc's `__libc_free`
/// of the blocks in a thread's cache when it exits, which the program
/// freed already), where calls that go through the PLT are the ones
/// interposition reaches. In the executable every call is the program's
/// (the preload patches the functions it defines, and sees each one):
/// a PIE calls the malloc it defines directly.
fn own_call(p: &Process, b: &Hook, ret: u64) -> bool {
    let inside = b.module.0 <= ret && ret < b.module.1;
    if !inside {
        return false;
    }
    if b.call.mapping() {
        return true;
    }
    if p.static_exe || p.exe_range == Some(b.module) {
        return false;
    }
    let mut before = [0u8; arch::CALL_LEN];
    let n = target::read(p.pid, ret.wrapping_sub(arch::CALL_LEN as u64), &mut before);
    n == before.len() && arch::direct_call_target(&before, ret) == Some(b.at)
}

/// A thread at an interposed function's entry: its registers, its stack,
/// and the time (ns of the stream).
pub struct Entry<'a> {
    pub regs: &'a Regs,
    pub stack: Stack<'a>,
    pub time: u64,
}

/// Thread `tid` entered hooked function `b` (`at`: its registers, stack
/// and time). Returns whether the module list may have changed.
pub fn entry(
    p: &mut Process,
    th: &mut Thread,
    tid: Pid,
    b: &Hook,
    at: &Entry,
    s: &Recording,
    frames: &mut Vec<u64>,
) -> bool {
    if b.call == Call::LoaderState {
        return true;
    }
    if b.call == Call::Exit {
        th.exit_call = Some(*at.regs);
        return false;
    }
    let r = at.regs;
    let t = tid.as_raw() as u32;
    let slot = arch::return_slot(r);
    let Some(ret) = at.stack.read_u64(p.pid, slot) else { return false };
    // A tail call from a function whose return is caught already
    // (reallocarray jumps to realloc): its outcome is that function's.
    if p.is_trampoline(ret) {
        return false;
    }
    let args = [r.arg(0), r.arg(1), r.arg(2), r.arg(3), r.arg(4)];
    // Deeper down, a call is the outer one's while that is still running:
    // its return is still awaited (malloc's, posix_memalign's…), or it is
    // new and this its allocation, or delete and this the free of its
    // block. The slot of a call that returned may still hold its return
    // address (nothing wrote there since), so that alone would take any
    // later call deeper down for the outer's (python3 lost a third of its
    // allocations so).
    // A call inside one the outer made whose return is still awaited is
    // the outer's too (`operator new` → an executable's own malloc →
    // mmap: the allocator's own mapping, as under the preload).
    let its = |o: &Outer| {
        th.pending.iter().any(|q| q.slot == o.sp || (slot < q.slot && q.slot < o.sp))
            || (!o.done && (o.new.is_some() || (matches!(b.call, Call::Free { .. }) && args[0] == o.arg)))
    };
    // And its return address is still there, or the trampoline's it was
    // replaced by (read only then: a stop's read is a system call).
    let mut outer_live = |o: &Outer| at.stack.read_u64(p.pid, o.sp).is_some_and(|w| w == o.ret || p.is_trampoline(w));
    let nested = match th.outer {
        Some(o) if slot < o.sp && its(&o) && outer_live(&o) => Some(o),
        Some(o) if slot == o.sp && !o.done && args[0] == o.arg => Some(o),
        _ => None,
    };
    if nested.is_none() {
        th.outer = None;
    }
    // The pending returns the thread left (longjmp) are gone.
    th.pending.retain(|q| q.slot > slot);
    if own_call(p, b, ret) {
        return false;
    }
    let time = at.time;
    let outer = |arg, done, new| Some(Outer { sp: slot, ret, arg, done, new });
    match b.call {
        Call::LoaderState | Call::Exit => {}
        Call::Free { family, size, align, .. } => match nested {
            None => {
                if args[0] != 0 && (!p.keeps_live() || p.live.remove(&args[0])) {
                    let stack = if s.check_frees { backtrace(p, t, at, ret, s.depth, frames) } else { 0 };
                    // What a sized or aligned free was told of the block,
                    // as the preload writes it: the size with the frees'
                    // checks only (-S), the alignment always.
                    let told = |i: Option<u8>| i.map_or(0, |i| args[usize::from(i)]);
                    let size = if s.check_frees { told(size) } else { 0 };
                    let align = told(align);
                    p.stream.record(t, &Record::Free { time_ns: time, family, addr: args[0], stack, align, size });
                }
                // free() calls no other free; delete ends in free.
                th.outer = outer(args[0], family == Family::Malloc, None);
            }
            Some(_) if family == Family::Malloc => {
                if let Some(o) = th.outer.as_mut() {
                    o.done = true;
                }
            }
            Some(_) => {}
        },
        Call::Munmap => {
            if nested.is_none() {
                p.stream.record(t, &Record::Munmap { time_ns: time, addr: args[0], len: args[1] });
            }
        }
        Call::New { family, align } => {
            if nested.is_none() {
                let picked = p.collecting && pick(th, s, args[0]);
                let stack = if picked { backtrace(p, t, at, ret, s.depth, frames) } else { 0 };
                let align = align.map_or(0, |i| args[usize::from(i)]);
                th.outer = outer(args[0], false, Some((family, args[0], stack, picked, align)));
            }
        }
        call => {
            let (stack, new, picked) = match nested {
                // The allocation `operator new` makes: its block is new's.
                Some(Outer { new: Some((family, size, stack, picked, align)), .. }) => {
                    if let Some(o) = th.outer.as_mut() {
                        (o.done, o.new) = (true, None);
                    }
                    (stack, Some((family, size, align)), picked)
                }
                Some(_) => return false,
                None => {
                    // Its tail calls come back with the trampoline's return address.
                    th.outer = outer(args[0], true, None);
                    let picked = p.collecting && (call.mapping() || pick(th, s, requested(call, &args)));
                    let stack = if picked { backtrace(p, t, at, ret, s.depth, frames) } else { 0 };
                    (stack, None, picked)
                }
            };
            // Not picked (sampling, or `mtrace_stop()`), with no block of
            // the stream to free: nothing to record at its return.
            let frees_sampled = matches!(call, Call::Realloc { .. }) && recorded(p, args[0]);
            if !picked && !frees_sampled {
                return false;
            }
            // Under uprobes the kernel's return probe replaced it already.
            if p.uprobes || target::poke(tid, slot, &p.trampoline.to_le_bytes()).is_ok() {
                th.pending.push(Pending { slot, ret, call, args, stack, time, new, picked });
            }
        }
    }
    false
}

/// The family of the blocks `call` allocates or frees, the functions'
/// table's (`Call::family`); only asked of calls that make blocks.
fn family_of(call: Call) -> Family {
    call.family().unwrap_or(Family::Malloc)
}

/// The bytes allocation `call` with arguments `args` asks for, as the
/// count-down of sampling counts them.
fn requested(call: Call, args: &[u64; 5]) -> u64 {
    match call {
        Call::Alloc { size, .. } => args[size],
        Call::Calloc => args[0].wrapping_mul(args[1]),
        Call::PosixMemalign => args[2],
        Call::Realloc { array: true } => args[1].wrapping_mul(args[2]),
        Call::Realloc { array: false } => args[1],
        _ => 0,
    }
}

/// Whether the stream holds block `addr` (as far as the tracer knows:
/// when it keeps no set of them, any).
fn recorded(p: &Process, addr: u64) -> bool {
    !p.keeps_live() || p.live.contains(&addr)
}

/// Under sampling or `mtrace_stop()`, what the stream gets of `rec`, the
/// outcome of a call whose new block was `picked` or not
/// (docs/SAMPLING.md: a realloc's free is recorded if the old block was,
/// its new block if picked).
fn sampled(p: &Process, rec: Record, picked: bool) -> Option<Record> {
    match rec {
        Record::Alloc { .. } | Record::Mmap { .. } | Record::Mremap { .. } if !picked => None,
        Record::Realloc { time_ns, free_time_ns, old, new, size, stack } => match (recorded(p, old), picked) {
            (true, true) => Some(rec),
            (false, true) => Some(Record::Alloc { time_ns, family: Family::Malloc, addr: new, size, stack, align: 0 }),
            (true, false) => Some(Record::Free {
                time_ns: free_time_ns,
                family: Family::Malloc,
                addr: old,
                stack: 0,
                align: 0,
                size: 0,
            }),
            (false, false) => None,
        },
        Record::Free { addr, .. } if !recorded(p, addr) => None,
        rec => Some(rec),
    }
}

/// Thread `tid` came back to the trampoline with registers `r` at
/// `time_ns` (`stack`: its stack); sets its ip to where the call returns
/// to and records the call's outcome. `false`: no call of this thread was
/// waiting for it.
pub fn returned(p: &mut Process, th: &mut Thread, tid: Pid, r: &mut Regs, stack: Stack, time_ns: u64) -> bool {
    // After the return, the stack pointer is one word above the slot.
    let sp = r.sp();
    let Some(i) = th.pending.iter().rposition(|q| q.slot + 8 == sp) else { return false };
    let q = th.pending[i];
    th.pending.truncate(i);
    r.set_ip(q.ret);
    if th.outer.is_some_and(|o| o.sp <= q.slot) {
        th.outer = None;
    }
    let t = tid.as_raw() as u32;
    let res = r.result();
    let [a0, a1, a2, a3, a4] = q.args;
    let alloc = |addr: u64, (family, size, align): (Family, u64, u64)| Record::Alloc {
        time_ns,
        family,
        addr,
        size,
        stack: q.stack,
        align,
    };
    let rec = match q.call {
        Call::Alloc { family, size } => {
            let new = q.new.unwrap_or((family, q.args[size], 0));
            (res != 0).then(|| alloc(res, new))
        }
        Call::Calloc => (res != 0).then(|| alloc(res, (family_of(q.call), a0.wrapping_mul(a1), 0))),
        Call::PosixMemalign => {
            let block = if res == 0 {
                stack.read_u64(p.pid, a0).or_else(|| target::read_u64(p.pid, a0)).unwrap_or(0)
            } else {
                0
            };
            let new = q.new.unwrap_or((family_of(q.call), a2, 0));
            (block != 0).then(|| alloc(block, new))
        }
        Call::Realloc { array } => {
            let size = if array { a1.wrapping_mul(a2) } else { a1 };
            let (old, new) = (a0, res);
            match Realloc::of(old, new, size) {
                Realloc::Failed => None,
                Realloc::Allocated => Some(alloc(new, (family_of(q.call), size, 0))),
                Realloc::Freed => Some(Record::Free {
                    time_ns: q.time,
                    family: family_of(q.call),
                    addr: old,
                    stack: 0,
                    align: 0,
                    size: 0,
                }),
                Realloc::Resized => {
                    Some(Record::Realloc { time_ns, free_time_ns: q.time, old, new, size, stack: q.stack })
                }
            }
        }
        // mmap and mremap return MAP_FAILED, -1, when they fail.
        Call::Mmap => (res != u64::MAX).then_some(Record::Mmap {
            time_ns,
            addr: res,
            len: a1,
            prot: a2 as u32,
            flags: a3 as u32,
            fd: a4 as i32,
            stack: q.stack,
        }),
        Call::Mremap => (res != u64::MAX).then_some(Record::Mremap {
            time_ns,
            old: a0,
            old_len: a1,
            new: res,
            new_len: a2,
            stack: q.stack,
        }),
        _ => None,
    };
    let rec = if p.sample_rate != 0 || !q.picked { rec.and_then(|r| sampled(p, r, q.picked)) } else { rec };
    if let Some(rec) = rec {
        if p.keeps_live() {
            match rec {
                Record::Alloc { addr, .. } => {
                    p.live.insert(addr);
                }
                Record::Realloc { old, new, .. } => {
                    p.live.remove(&old);
                    p.live.insert(new);
                }
                Record::Free { addr, .. } => {
                    p.live.remove(&addr);
                }
                _ => {}
            }
        }
        p.stream.record(t, &rec);
    }
    true
}

/// Puts back the return addresses of the calls thread `tid` is inside of
/// (when the tracer leaves).
pub fn restore_returns(th: &mut Thread, tid: Pid) {
    for q in th.pending.drain(..).rev() {
        let _ = target::poke(tid, q.slot, &q.ret.to_le_bytes());
    }
}
