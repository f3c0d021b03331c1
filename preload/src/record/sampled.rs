//! The addresses of the live blocks recorded under sampling (sample.rs):
//! a free must tell, cheaply, whether the stream saw its block. A free
//! of a block the stream never saw is not recorded at all.
//!
//! Three parts:
//! - a filter, [`BITS`]: one bit per 64 bytes of address, modulo 32 MiB
//!   (64 KiB), set while a live sampled block starts there. A clear bit
//!   says "not sampled" with one load, which is the answer for nearly
//!   every free: live sampled blocks are few (one per `rate` bytes live,
//!   plus the large blocks), so few bits are set (at 512K and 1 GiB live,
//!   0.4% of them). Mapped directly, not hashed, so that neighbouring
//!   blocks share its cache lines: a heap of N bytes touches N/512 bytes
//!   of it. Before it, one byte per 16 bytes (a heap touched N/16) put 75%
//!   of the free hook's time on churn on that load (L2 hits), and a hashed
//!   filter missed the cache on most frees.
//! - [`COUNTS`], one counter per bit, raised and lowered by the sampled
//!   blocks under [`LOCK`], which sets a bit when its counter leaves 0 and
//!   clears it when it returns there: a bit is set whenever a live sampled
//!   block maps to it. Only sampled allocations and frees take the lock.
//! - an open-addressing table of the addresses themselves, in levels of
//!   doubling size, mapped when the one before is full where an address
//!   hashes; lock-free. An address is probed for in at most [`PROBE`]
//!   slots per level; a removed address leaves a tombstone that a later
//!   insert reuses. Only sampled frees, and the rare free whose bit
//!   another block set, look here.
//!
//! Correctness rests on the allocator's contract: an address is inserted
//! after the real allocation returned it and before the program sees it,
//! and removed before the real free (or realloc) lets another thread be
//! given it, so an address is never in the table twice.
//!
//! Cost: `scripts/bench`'s "sampled" table (docs/GUIDE.md, "Sampling").

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use crate::platform::spin::SpinLock;
use crate::platform::sys;

/// log2 of the filter's bits (2^19 bits = 64 KiB, for 32 MiB of addresses
/// at 64 bytes a bit).
const FILTER_BITS: u32 = 19;
/// log2 of the bytes of address a bit stands for (a cache line: at most
/// a few blocks start in one).
const GRAIN: u32 = 6;
static BITS: [AtomicU64; 1 << (FILTER_BITS - 6)] = [const { AtomicU64::new(0) }; 1 << (FILTER_BITS - 6)];
/// The live sampled blocks per bit (2 MiB of .bss, written only where
/// sampled blocks start: its pages cost memory once written).
static COUNTS: [AtomicU32; 1 << FILTER_BITS] = [const { AtomicU32::new(0) }; 1 << FILTER_BITS];
/// Held while a counter and its bit change (a few instructions, by
/// sampled allocations and frees only; pthread_atfork holds it across a
/// fork, fork.rs).
static LOCK: SpinLock = SpinLock::new();

/// Slots of level 0 (log2); level k has 2^(BASE_BITS + k).
const BASE_BITS: u32 = 12;
/// Levels: room for about 2^(BASE_BITS + LEVELS) = 2^30 addresses.
const LEVELS: usize = 18;
/// Slots an address may be in per level, from its hash on.
const PROBE: usize = 16;
/// A slot never used (mapped memory starts zeroed).
const EMPTY: u64 = 0;
/// A slot whose address was removed; inserts reuse it.
const TOMB: u64 = 1;

static LEVEL: [AtomicPtr<AtomicU64>; LEVELS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; LEVELS];

/// The address's hash for the table: heap addresses are 16-byte aligned
/// neighbours, so the low bits go and Fibonacci hashing spreads the rest.
#[inline(always)]
fn hash(addr: u64) -> u64 {
    (addr >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The filter's bit of `addr`: its index in [`COUNTS`].
#[inline(always)]
fn bit(addr: u64) -> usize {
    ((addr >> GRAIN) as usize) & ((1 << FILTER_BITS) - 1)
}

/// Whether `addr`'s bit is set (one load).
#[inline(always)]
fn maybe(addr: u64) -> bool {
    let b = bit(addr);
    BITS[b >> 6].load(Ordering::Relaxed) & (1 << (b & 63)) != 0
}

/// Counts a live sampled block at `addr`, setting its bit.
fn raise(addr: u64) {
    let b = bit(addr);
    LOCK.lock();
    if COUNTS[b].fetch_add(1, Ordering::Relaxed) == 0 {
        BITS[b >> 6].fetch_or(1 << (b & 63), Ordering::Relaxed);
    }
    LOCK.unlock();
}

/// Uncounts a sampled block at `addr`, clearing its bit with the last.
fn lower(addr: u64) {
    let b = bit(addr);
    LOCK.lock();
    if COUNTS[b].fetch_sub(1, Ordering::Relaxed) == 1 {
        BITS[b >> 6].fetch_and(!(1 << (b & 63)), Ordering::Relaxed);
    }
    LOCK.unlock();
}

/// pthread_atfork prepare: no counter and bit are half changed when the
/// process is copied.
pub fn hold_for_fork() {
    LOCK.lock();
}

/// pthread_atfork parent and child: releases [`hold_for_fork`]'s lock.
pub fn release_after_fork() {
    LOCK.unlock();
}

/// Level `k`'s slots, mapping them if `make` and not yet mapped.
fn level(k: usize, make: bool) -> Option<&'static [AtomicU64]> {
    let len = 1usize << (BASE_BITS as usize + k);
    let mut p = LEVEL[k].load(Ordering::Acquire);
    if p.is_null() {
        if !make {
            return None;
        }
        let bytes = len * std::mem::size_of::<AtomicU64>();
        let fresh = sys::map_anon(bytes)? as *mut AtomicU64;
        match LEVEL[k].compare_exchange(std::ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => p = fresh,
            Err(other) => {
                // SAFETY: our own mapping, which no one else saw.
                unsafe { sys::unmap(fresh as *mut u8, bytes) };
                p = other;
            }
        }
    }
    // SAFETY: a mapping of `len` zero-initialised AtomicU64s that is never
    // unmapped once published.
    Some(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The memory of the mapped levels, (start, end): the tracer's own,
/// which the leak scan's snapshot leaves out (every sampled block's
/// address is in it).
pub fn ranges() -> impl Iterator<Item = (u64, u64)> {
    (0..LEVELS).filter_map(|k| {
        let p = LEVEL[k].load(Ordering::Acquire);
        let bytes = (1u64 << (BASE_BITS as u64 + k as u64)) * 8;
        (!p.is_null()).then(|| (p as u64, p as u64 + bytes))
    })
}

/// The slots of level `table` to probe for hash `h`.
#[inline]
fn probes(table: &[AtomicU64], h: u64) -> impl Iterator<Item = &AtomicU64> {
    let mask = table.len() - 1;
    let start = (h as usize) & mask;
    (0..PROBE).map(move |i| &table[(start + i) & mask])
}

/// Adds `addr`, a block just sampled; false if every level is full where
/// it hashes (the caller then leaves the block unrecorded).
pub fn insert(addr: u64) -> bool {
    let h = hash(addr);
    raise(addr);
    for k in 0..LEVELS {
        let Some(table) = level(k, true) else { break };
        for slot in probes(table, h) {
            let mut v = slot.load(Ordering::Relaxed);
            while v == EMPTY || v == TOMB {
                match slot.compare_exchange_weak(v, addr, Ordering::Release, Ordering::Relaxed) {
                    Ok(_) => return true,
                    Err(now) => v = now,
                }
            }
        }
    }
    lower(addr);
    false
}

/// Whether `addr` is a live sampled block. One load when it is not, but
/// for the rare address whose bit another block set.
#[cfg(test)]
pub fn contains(addr: u64) -> bool {
    maybe(addr) && find(addr, hash(addr)).is_some()
}

/// Removes `addr` if it is a live sampled block: true if it was.
#[inline]
pub fn remove(addr: u64) -> bool {
    if !maybe(addr) {
        return false;
    }
    match find(addr, hash(addr)) {
        Some(slot) if slot.compare_exchange(addr, TOMB, Ordering::AcqRel, Ordering::Relaxed).is_ok() => {
            lower(addr);
            true
        }
        _ => false,
    }
}

/// The slot holding `addr`, looked for in each mapped level up to its
/// first empty slot.
#[cold]
fn find(addr: u64, h: u64) -> Option<&'static AtomicU64> {
    for k in 0..LEVELS {
        let table = level(k, false)?;
        for slot in probes(table, h) {
            match slot.load(Ordering::Acquire) {
                v if v == addr => return Some(slot),
                EMPTY => break,
                _ => {}
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inserted_addresses_are_found_once() {
        // Addresses of this test only (the statics are shared by tests).
        let base = 0x7f00_0000_0000u64;
        let addrs: Vec<u64> = (0..20_000u64).map(|i| base + i * 32).collect();
        for &a in &addrs {
            assert!(insert(a));
        }
        assert!(addrs.iter().all(|&a| contains(a)));
        assert!(!contains(base + 16));
        assert!(addrs.iter().step_by(2).all(|&a| remove(a)));
        assert!(!remove(base));
        assert!(addrs.iter().skip(1).step_by(2).all(|&a| contains(a)));
        assert!(addrs.iter().step_by(2).all(|&a| !contains(a)));
        // Tombstones are reused, and what was kept stays found.
        assert!(insert(base));
        assert!(contains(base) && contains(base + 32));
        assert!(addrs.iter().skip(1).step_by(2).all(|&a| remove(a)));
        assert!(remove(base));
    }

    #[test]
    fn a_bit_stays_set_while_any_of_its_blocks_lives() {
        // Two blocks 32 MiB apart share a bit, as do two in one 64 bytes.
        let a = 0x7e00_0000_0040u64;
        let (b, c) = (a + (32 << 20), a + 32);
        assert_eq!(bit(a), bit(b));
        assert_eq!(bit(a), bit(c));
        assert!(!maybe(a));
        assert!(insert(a) && insert(b) && insert(c));
        assert!(remove(a) && maybe(a) && contains(b) && contains(c) && !contains(a));
        assert!(remove(c) && contains(b));
        assert!(!remove(a));
        assert!(remove(b));
        assert!(!maybe(a), "the last block's free clears the bit");
    }
}
