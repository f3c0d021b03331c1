//! A checkpoint's records (docs/FORMAT.md, records 28 and 29): the books of
//! a trace restated so that a reader can start there — every module,
//! setting, pool name, marker and backtrace seen, then every live block at
//! its own allocation time, then each backtrace's totals. What
//! `input::Keeper` enters again from them is what it held.

use mtrace_format::{Family, Record, StackSum};
use rustc_hash::FxHashMap as HashMap;

use crate::books::wrong::align_of_code;
use crate::trace::Trace;

/// Hands `out` the records of a checkpoint of `t` at `time_ns`, in order:
/// the Checkpoint, its section, its CheckpointEnd. `t`'s books should be
/// settled (every event the merge handed on entered); `pending`: the
/// records read and still waiting in the merge ([`crate::order::Merge::pending`]),
/// restated last, each thread's after a Thread record of its own.
pub fn write(t: &Trace, time_ns: u64, pending: &[(u32, Record)], out: &mut impl FnMut(&Record)) {
    let mut totals: Vec<(String, u64)> = t.books.counters().into_iter().map(|(n, v)| (n.to_owned(), v)).collect();
    totals.push(("records".to_owned(), t.records));
    out(&Record::Checkpoint { time_ns, totals });
    // The section is a chunk of its own; its thread is none.
    out(&Record::Thread { tid: 0, time_ns });
    for m in &t.modules {
        out(&Record::Modules { time_ns: m.time, modules: vec![m.module.clone()] });
    }
    for p in &t.patched {
        out(&Record::Patched { time_ns: 0, patch: Box::new(p.clone()) });
    }
    if t.books.sample_rate != 0 {
        out(&Record::Sampling { time_ns: 0, rate: t.books.sample_rate });
    }
    for (&id, name) in &t.pools {
        out(&Record::PoolName { id, name: name.clone() });
    }
    for m in &t.markers {
        out(&Record::Marker { time_ns: m.time_ns, seq: m.seq, name: m.name.clone() });
    }
    for (time_ns, pid, path) in &t.spawned {
        out(&Record::Spawned { time_ns: *time_ns, pid: *pid, path: path.clone() });
    }
    // Every stream id again (the records after the checkpoint use them),
    // and one id per canonical backtrace for the blocks.
    let mut id_of: Vec<u32> = vec![0; t.stacks.frames.len()];
    // In the order of the canonical indices: a reader that starts here
    // numbers them in the same order, and reports break ties between
    // backtraces by that number as the reader of the whole trace does.
    let mut ids: Vec<(u32, u32)> = t.stacks.ids().map(|(id, canon)| (canon, id)).collect();
    ids.sort_unstable();
    for (canon, id) in ids {
        out(&Record::Stack { id, frames: t.stacks.frames[canon as usize].clone() });
        let slot = &mut id_of[canon as usize];
        if *slot == 0 || id < *slot {
            *slot = id;
        }
    }
    let pool_base: HashMap<u32, u32> = t.stacks.pool_copies().map(|((base, _), copy)| (copy, base)).collect();
    let id = |canon: u32| {
        let canon = pool_base.get(&canon).copied().unwrap_or(canon);
        id_of.get(canon as usize).copied().unwrap_or(0)
    };
    let b = &t.books;
    match b.collecting_since {
        Some(since) => out(&Record::Coverage { time_ns: since, collecting: true, whole: b.whole }),
        None => out(&Record::Coverage { time_ns, collecting: false, whole: false }),
    }
    for (addr, block, mapping) in b.every_block() {
        let (time_ns, size, stack) = (block.time, block.size, id(block.stack));
        out(&match (mapping, block.family) {
            (true, _) => Record::Mmap { time_ns, addr, len: size, prot: 3, flags: 0x22, fd: -1, stack },
            (false, Family::Pool) => {
                // Its backtrace index is its pool's (Stacks::for_pool).
                let pool = t.stacks.pool_of.get(&block.stack).copied().unwrap_or((addr >> 48) as u32);
                Record::PoolAlloc { time_ns, pool, addr: crate::input::pool_key(pool, addr), size, stack }
            }
            (false, family) => Record::Alloc { time_ns, family, addr, size, stack, align: align_of_code(block.align) },
        });
    }
    let mut thread = None;
    for (tid, rec) in pending {
        if thread != Some(*tid) {
            thread = Some(*tid);
            out(&Record::Thread { tid: *tid, time_ns: rec.time_ns().unwrap_or(time_ns) });
        }
        out(rec);
    }
    // Pool copies' totals are left out: restored, they would go to the
    // heap's backtrace of the same frames.
    let stacks = b
        .stacks_at_checkpoint()
        .filter(|(canon, ..)| !pool_base.contains_key(canon))
        .map(|(canon, totals, (peak_bytes, peak_blocks))| StackSum {
            id: id(canon),
            allocations: totals.allocations,
            bytes: totals.bytes,
            peak_bytes,
            peak_blocks,
        })
        .collect();
    out(&Record::CheckpointEnd { time_ns, stacks });
}
