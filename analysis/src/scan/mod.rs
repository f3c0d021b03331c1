//! The leak scan: classifies the blocks live at a memory snapshot with
//! valgrind memcheck's leak kinds (docs/SCAN.md).
//!
//! - **still reachable**: a chain of start-pointers from a root reaches it;
//! - **possibly lost**: only chains that use an interior pointer do;
//! - **definitely lost**: nothing reaches it from the roots, and it is the
//!   first block of its lost group found;
//! - **indirectly lost**: reachable only from lost blocks.
//!
//! Roots are the snapshot's registers, the stack from the stack pointer up,
//! and every writable mapping that holds no heap block and that no
//! allocator made for its own use; only aligned
//! pointer-sized words count. Each word is looked up by binary search in
//! the sorted block starts, so marking is O(W log n) for W words and n
//! blocks.

use serde::Serialize;

use crate::trace::Trace;
use mtrace_format::{region_kind, Family};

mod classes;
mod heap;
pub mod heuristics;
mod memory;
use crate::trace::{Region, Word};
pub use classes::Classes;
use heap::{mmapped_chunks_only, Heap};
pub use heuristics::{Heuristic, Heuristics};
use memory::Memory;
use std::collections::HashMap;

/// memcheck's leak kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// No pointer reaches it from a root or another block (memcheck's "definitely lost").
    Definite,
    /// Reached only from definitely lost blocks ("indirectly lost").
    Indirect,
    /// Reached only through interior pointers ("possibly lost").
    Possible,
    /// A pointer to its start is reachable from a root ("still reachable").
    Reachable,
}

impl Kind {
    /// memcheck's words for the kind: "definitely lost", ….
    pub fn words(self) -> &'static str {
        match self {
            Kind::Definite => "definitely lost",
            Kind::Indirect => "indirectly lost",
            Kind::Possible => "possibly lost",
            Kind::Reachable => "still reachable",
        }
    }
}

/// Bytes and blocks of one kind.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Total {
    /// Bytes.
    pub bytes: u64,
    /// Blocks.
    pub blocks: u64,
}

/// The four totals, memcheck's "LEAK SUMMARY".
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Kinds {
    /// Definitely lost.
    pub definite: Total,
    /// Indirectly lost.
    pub indirect: Total,
    /// Possibly lost.
    pub possible: Total,
    /// Still reachable.
    pub reachable: Total,
    /// Of the still reachable: those only a heuristic's interior pointer
    /// reaches, per heuristic (heuristics.rs).
    pub reachable_via_heuristic: heuristics::ViaHeuristic,
    /// Not a kind: the program's own mappings (mmap) live at the scan,
    /// roots to it rather than blocks it classifies (memcheck and LSan do
    /// not track mmap), in "not freed" beside the four kinds.
    pub mappings: Total,
    /// Not a kind either: the mappings an allocator made for its own use
    /// (its metadata), live at the scan and not roots to it
    /// (report/allocator_maps.rs).
    pub allocator_mappings: Total,
}

impl Kinds {
    /// The total of `kind`.
    pub fn get(&self, kind: Kind) -> Total {
        match kind {
            Kind::Definite => self.definite,
            Kind::Indirect => self.indirect,
            Kind::Possible => self.possible,
            Kind::Reachable => self.reachable,
        }
    }

    /// The total of `kind`, to change.
    pub fn get_mut(&mut self, kind: Kind) -> &mut Total {
        match kind {
            Kind::Definite => &mut self.definite,
            Kind::Indirect => &mut self.indirect,
            Kind::Possible => &mut self.possible,
            Kind::Reachable => &mut self.reachable,
        }
    }
}

/// When a scan was taken and how it saw the threads.
#[derive(Clone, Debug, Serialize)]
pub struct ScanInfo {
    /// Seconds since the program started.
    pub time_s: f64,
    /// Taken at exit (else on demand: `MTRACE_SCAN_SIGNAL`, `mtrace_scan()`).
    pub at_exit: bool,
    /// Threads whose registers and stack pointer were read.
    pub threads_stopped: u64,
    /// Threads that could not be stopped: their whole stacks count as roots
    /// and their registers are unknown, so a leak can look reachable.
    pub threads_not_stopped: u64,
    /// The threads were stopped by a signal handler in the process, not
    /// from outside (ptrace was refused: this says why), so system calls
    /// they waited in may have returned EINTR; `None` for a stop from
    /// outside, and for traces older than version 11 (always by signal).
    pub stopped_by_signal: Option<String>,
    /// Bytes of memory the snapshot holds (stacks and mappings).
    pub bytes: u64,
    /// Seconds the analyzer spent marking and classifying (wall time; not
    /// reading the trace).
    pub marking_s: f64,
}

/// The scan `t` classifies with, if any.
pub fn info(t: &Trace) -> Option<ScanInfo> {
    let snap = t.snapshot.as_ref()?;
    let regs = snap.iter().filter(|r| r.kind == region_kind::REGISTERS);
    let stopped = regs.clone().filter(|r| r.len > 0).count() as u64;
    Some(ScanInfo {
        time_s: t.snapshot_time as f64 / 1e9,
        at_exit: !t.snapshot_on_demand,
        threads_stopped: stopped,
        threads_not_stopped: regs.count() as u64 - stopped,
        stopped_by_signal: t.snapshot_stopped_by_signal.clone(),
        bytes: snap.iter().filter(|r| r.kind != region_kind::REGISTERS).map(|r| r.len).sum(),
        marking_s: 0.0,
    })
}

/// A classified block: its address and kind; `owner` is the definitely
/// lost block whose group an indirectly lost block belongs to.
#[derive(Clone, Copy, Debug)]
pub struct Classified {
    /// The block's start.
    pub addr: u64,
    /// Its kind.
    pub kind: Kind,
    /// For an indirectly lost block, the definitely lost one that owns it.
    pub owner: Option<u64>,
    /// Still reachable only through an interior pointer this heuristic accepted.
    pub via: Option<Heuristic>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Unreached,
    Possible,
    Reachable,
    Definite,
    Indirect,
}

/// Classifies the heap blocks (malloc family, new, aligned) live in `t`
/// and allocated before the snapshot was taken against `t.snapshot`.
/// Mappings and pool blocks are not classified: like memcheck, the scan
/// covers heap blocks.
/// Interior pointers that match one of `set` count as start pointers
/// (memcheck's heuristics, heuristics.rs). `allocators` are the
/// recorded mappings an allocator made for its own use, as
/// (start, end) in any order (report/allocator_maps.rs finds them): not
/// roots outside the heap blocks in them. They are ignored in a trace
/// from an attach or a sampled one, whose heap outside the known blocks
/// is a root anyway.
pub fn classify(t: &Trace, set: Heuristics, allocators: &[(u64, u64)]) -> Option<Classes> {
    let snap = t.snapshot.as_ref()?;
    let unknown_blocks = t.attached || t.books.sample_rate != 0;
    let mut allocators: Vec<(u64, u64)> = if unknown_blocks { Vec::new() } else { allocators.to_vec() };
    allocators.sort_unstable();
    // Each block with its place among the books' live blocks, where the
    // verdicts go (classes.rs).
    let (mut places, mut huge) = (0, HashMap::new());
    let blocks = t
        .books
        .live_blocks()
        .inspect(|_| places += 1)
        .enumerate()
        .filter(|(_, (_, b))| !matches!(b.family, Family::Mmap | Family::Pool) && b.time <= t.snapshot_time)
        .map(|(place, (a, b))| {
            let (block, aside) = heap::Block::new(a, b.size, place as u32);
            if aside {
                huge.insert(place as u32, b.size);
            }
            block
        })
        .collect();
    let heap = Heap::new(blocks, huge);
    let mut regions: Vec<&Region> = snap.iter().filter(|r| r.kind != region_kind::REGISTERS).collect();
    regions.sort_by_key(|r| r.addr);
    let word = Word::of(&t.header);
    let mem = Memory::new(regions, word);
    let n = heap.len();
    let mut state = vec![State::Unreached; n];
    let mut via: Vec<Option<Heuristic>> = vec![None; n];
    let mut work = Vec::new();
    let segments = heuristics::Segments::of(&t.modules);
    // The program's own mappings (mmap records), sorted; but a mapping
    // heap blocks lie in is an allocator's arena, mapped where no hook
    // saw it inside the allocator (a static jemalloc's constructor maps
    // its first arena so): there, as in glibc's heap, the words outside
    // the blocks are the allocator's (its thread cache keeps stale
    // pointers to blocks it handed out), not roots. A static jemalloc's
    // 9 blocks of ctests/scan.c were all still reachable so.
    // Nor are the allocator's own mappings the program's.
    let mut program_maps: Vec<(u64, u64)> = t
        .books
        .live_blocks()
        .filter(|(_, b)| b.family == Family::Mmap && b.time <= t.snapshot_time)
        .map(|(a, b)| (a, a + b.size))
        .filter(|&(lo, hi)| !heap.overlaps(lo, hi) && allocators.binary_search(&(lo, hi)).is_err())
        .collect();
    program_maps.sort_unstable();
    // Block numbers are u32 (as the books' slots): 4 bytes a block the
    // marking holds, where every block can wait at once.
    let mut reach = |p: u64, from_reachable: bool, state: &mut Vec<State>, work: &mut Vec<u32>| {
        if let Some((i, at_start)) = heap.find(p) {
            // As memcheck: a heuristic is asked only for an interior pointer
            // from a root or a reachable block; a start pointer reaching a
            // block a heuristic reached clears the heuristic.
            let (start, size) = heap.block(i);
            let h = if from_reachable && !at_start && state[i] != State::Reachable {
                heuristics::matching(set, p, start, size, &mem, &segments)
            } else {
                None
            };
            if from_reachable && at_start && state[i] == State::Reachable {
                via[i] = None;
            }
            let new = if from_reachable && (at_start || h.is_some()) { State::Reachable } else { State::Possible };
            let better = matches!((state[i], new), (State::Unreached, _) | (State::Possible, State::Reachable));
            if better {
                state[i] = new;
                if new == State::Reachable {
                    via[i] = h;
                }
                work.push(i as u32);
            }
        }
    };
    // Roots: registers, the stacks, and mappings that hold no heap block
    // (a mapping's pieces are decided together: the end of a heap with no
    // block in it is not a root).
    let mut i = 0;
    while i < snap.len() {
        let r = &snap[i];
        if r.kind == region_kind::READ_ONLY {
            // Not a root: read only to recognise vtables.
            i += 1;
            continue;
        }
        if r.kind == region_kind::REGISTERS {
            for w in r.dense_bytes().unwrap_or_default().chunks_exact(word.size) {
                reach(word.read(w), true, &mut state, &mut work);
            }
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < snap.len() && snap[j].continues && snap[j].kind == r.kind {
            j += 1;
        }
        let group = &snap[i..j];
        let (lo, hi) = (r.addr, group.iter().map(|g| g.end()).max().unwrap_or(r.addr));
        if r.kind == region_kind::STACK {
            for g in group {
                mem.words(g.addr, g.end(), |w| reach(w, true, &mut state, &mut work));
            }
        } else if !heap.overlaps(lo, hi) {
            // A mapping of no heap block: a root, but where an allocator
            // made it for its own use (jemalloc's extent metadata points
            // to the first block of each slab).
            for (lo, hi) in outside(lo, hi, &allocators) {
                mem.words(lo, hi, |w| reach(w, true, &mut state, &mut work));
            }
        } else if unknown_blocks {
            // Traced from an attach, the blocks allocated before it are
            // unknown; in a sampled trace, the blocks not sampled are. So
            // the heap outside the known blocks is a root: a block an
            // unknown one points to is never called lost
            // (docs/SAMPLING.md).
            let mut at = lo;
            for (start, size) in heap.within(lo, hi) {
                mem.words(at, start, |w| reach(w, true, &mut state, &mut work));
                at = at.max(start + size);
            }
            mem.words(at, hi, |w| reach(w, true, &mut state, &mut work));
        } else {
            // A mapping whose only blocks are large ones malloc mapped on
            // their own (mmap'd chunks) is malloc's only there: the rest is
            // memory the kernel merged with them, the loader's among it
            // (its early pages: the link maps of the libraries loaded at
            // start, the main thread's static TLS), a root. python3 with a
            // 128 KiB block beside those pages had every dlopen'd module's
            // link map possibly lost in 1 run of 20.
            if let Some(mut chunks) = mmapped_chunks_only(&heap, lo, hi) {
                chunks.extend(allocators.iter().filter(|m| m.0 < hi && m.1 > lo));
                chunks.sort_unstable();
                for (lo, hi) in outside(lo, hi, &chunks) {
                    mem.words(lo, hi, |w| reach(w, true, &mut state, &mut work));
                }
                i = j;
                continue;
            }
            // The program's own mmaps are roots even where the kernel merged
            // them into one mapping with malloc's (an anonymous mapping next
            // to a large block's): python's object arenas beside a big
            // malloc block made the dict tables they point to look lost,
            // depending on where the kernel placed them.
            for &(mlo, mhi) in program_maps.iter().filter(|m| m.0 < hi && m.1 > lo) {
                let (mlo, mhi) = (mlo.max(lo), mhi.min(hi));
                let mut at = mlo;
                for (start, size) in heap.within(mlo, mhi) {
                    mem.words(at, start, |w| reach(w, true, &mut state, &mut work));
                    at = at.max(start + size);
                }
                mem.words(at, mhi, |w| reach(w, true, &mut state, &mut work));
            }
        }
        i = j;
    }
    // Blocks glibc allocated inside a hook (the TLS set-up of a thread, the
    // tracer's calls into libc) are not classified; what they point to is
    // reachable, as through the thread structures that hold them.
    for (addr, size, time) in t.books.internal_blocks() {
        if time <= t.snapshot_time {
            mem.words(addr, addr + size, |w| reach(w, true, &mut state, &mut work));
        }
    }
    // Through the blocks reached.
    while let Some(i) = work.pop() {
        let i = i as usize;
        let (start, size) = heap.block(i);
        let from_reachable = state[i] == State::Reachable;
        mem.words(start, start + size, |w| reach(w, from_reachable, &mut state, &mut work));
    }
    drop(work);
    // What is left is lost: each group's first block definitely, the rest
    // (everything reachable from it) indirectly; a group leader reached
    // from a later group joins that group.
    // (u32 numbers, not Option<usize>: 4 bytes a block rather than 16.)
    // (Made at the first lost block: a program that lost none needs none.)
    let mut owner: Vec<u32> = Vec::new();
    // One stack for every group (a new one each was a malloc per lost
    // block: 20 M of them).
    let mut stack: Vec<u32> = Vec::new();
    for leader in 0..n {
        if state[leader] != State::Unreached {
            continue;
        }
        if owner.is_empty() {
            owner = vec![NONE; n];
        }
        state[leader] = State::Definite;
        stack.push(leader as u32);
        while let Some(j) = stack.pop() {
            let (start, size) = heap.block(j as usize);
            mem.words(start, start + size, |w| {
                if let Some((t, _)) = heap.find(w) {
                    if t != leader && matches!(state[t], State::Unreached | State::Definite) {
                        state[t] = State::Indirect;
                        owner[t] = leader as u32;
                        stack.push(t as u32);
                    }
                }
            });
        }
    }
    // Members of a group whose leader joined another group follow it, with
    // path compression: a lost list joins one group per block, and walking
    // those chains for each block would be quadratic.
    drop(stack);
    let mut root = |i: usize| {
        let mut r = i;
        while owner[r] != NONE && owner[r] as usize != r {
            r = owner[r] as usize;
        }
        let mut j = i;
        while owner[j] != NONE && owner[j] as usize != j {
            let o = owner[j] as usize;
            owner[j] = r as u32;
            j = o;
        }
        r
    };
    let kind = |i: usize| match state[i] {
        State::Reachable => Kind::Reachable,
        State::Possible => Kind::Possible,
        State::Definite => Kind::Definite,
        _ => Kind::Indirect,
    };
    // The verdicts need the blocks' places and starts only: 12 bytes a
    // block, the rest handed back before the verdicts take theirs.
    let (place, starts) = heap.into_places_and_starts();
    let mut classes = Classes::new(places, place, starts);
    classes.allocators = allocators;
    for (i, &via) in via.iter().enumerate() {
        classes.set(i, kind(i), via);
    }
    for i in (0..n).filter(|&i| kind(i) == Kind::Indirect) {
        classes.set_owner(i, root(i));
    }
    Some(classes)
}

/// The parts of `[lo, hi)` outside `holes` (sorted by start; they may
/// overlap each other and reach past either end).
fn outside(lo: u64, hi: u64, holes: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut parts = Vec::new();
    let mut at = lo;
    for &(a, b) in holes.iter().filter(|h| h.0 < hi && h.1 > lo) {
        if a > at {
            parts.push((at, a));
        }
        at = at.max(b);
    }
    if at < hi {
        parts.push((at, hi));
    }
    parts
}

/// No owner, in the marking's table of owners.
const NONE: u32 = u32::MAX;

#[cfg(test)]
mod tests;
