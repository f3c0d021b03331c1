//! The stack walk, and joining the previous walk of the same thread.
//!
//! Consecutive allocations of a thread mostly share their outer frames
//! (main, the event loop, the parser), and unwinding is a deterministic
//! function of a frame's registers (ip, sp, bp) and of the stack words the
//! rules read. So the walk keeps, per frame, those registers and how the
//! frame was unwound; when a new walk reaches a frame with the same ip and
//! sp as a frame of the previous walk (and the same bp, where the rest of
//! the walk depends on bp), and every word the previous walk read from
//! there on still holds the same value, the rest of the previous walk is
//! what the unwinder would find again: it is copied instead of unwound.
//! The words need not be kept: a frame's rule read its return address at
//! the caller's sp − 8 and, if it restores bp, the caller's bp at the
//! caller's sp + an offset, so the caller's registers are the values to
//! compare. Checking is independent loads, where unwinding is a chain of
//! dependent ones (each frame's rule lookup waits for the return address).
//! This is exact, not a heuristic: a word that changed, a bp that matters
//! and differs, or a frame framehop unwound (its reads are not known)
//! forces a walk.

use super::cfi::Rule;
use crate::platform::config::MAX_DEPTH;

/// Frames a walk keeps: the deepest backtrace plus the tracer's own frames.
pub const MAX_FRAMES: usize = MAX_DEPTH + 16;

/// Registers of one frame.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// How a frame was unwound: what it read and whether its bp mattered.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub enum Kind {
    /// CFA from rsp, bp unchanged: the return address was read.
    #[default]
    Passes,
    /// CFA from rsp, the caller's bp restored from CFA + the offset.
    Restores(i32),
    /// CFA from rbp; the caller's bp restored from CFA + the offset, or
    /// unchanged when it is 0.
    FromBp(i32),
    /// The rules call it the outermost frame: nothing read.
    Outermost,
    /// Unwound by framehop, whose reads are not known: never checked.
    Opaque,
}

/// Reads stack words for one frame's unwinding, within bounds. (A refused
/// read ends the walk there: [`exec`] and framehop then return
/// [`Step::End`], or framehop a frame that is never checked.)
pub struct Reads {
    lo: u64,
    hi: u64,
}

impl Reads {
    /// Reads the aligned word at `addr` when it lies in [lo, hi − 8].
    #[inline(always)]
    pub fn read(&mut self, addr: u64) -> Option<u64> {
        if addr < self.lo || addr > self.hi - 8 || !addr.is_multiple_of(8) {
            return None;
        }
        // SAFETY: an aligned word inside this thread's own stack mapping
        // (the caller's bounds: the current sp up to the stack's top).
        Some(unsafe { *(addr as *const u64) })
    }
}

/// Unwinds one frame: registers, whether it is the first frame (its ip is
/// not a return address), and the reader to read the stack through.
pub trait Unwind {
    fn step(&mut self, r: Regs, first: bool, reads: &mut Reads) -> Step;
}

/// The outcome of unwinding one frame.
pub enum Step {
    /// The caller's registers, and how they were found.
    Caller(Regs, Kind),
    /// No caller: the rules say this is the outermost frame.
    Outermost,
    /// No caller found (a read failed, or framehop found none).
    End,
}

/// Runs a [`Rule::Cfa`] or [`Rule::End`] on frame `r` ([`Rule::Other`]
/// is the caller's business: here it counts as the outermost frame).
#[inline(always)]
pub fn exec(rule: Rule, r: Regs, reads: &mut Reads) -> Step {
    let Rule::Cfa { from_bp, cfa_off, bp_off } = rule else { return Step::Outermost };
    let cfa = (if from_bp { r.bp } else { r.sp }).wrapping_add(cfa_off as i64 as u64);
    let Some(ip) = reads.read(cfa.wrapping_sub(8)) else { return Step::End };
    let bp = if bp_off == 0 {
        r.bp
    } else {
        let Some(bp) = reads.read(cfa.wrapping_add(bp_off as i64 as u64)) else { return Step::End };
        bp
    };
    let kind = match (from_bp, bp_off) {
        (true, off) => Kind::FromBp(off),
        (false, 0) => Kind::Passes,
        (false, off) => Kind::Restores(off),
    };
    Step::Caller(Regs { ip, sp: cfa, bp }, kind)
}

/// One frame of a walk: its registers and how it was unwound.
#[derive(Clone, Copy, Default)]
pub struct Frame {
    regs: Regs,
    kind: Kind,
}

impl Frame {
    /// Whether unwinding this frame would still find `next` (the caller's
    /// registers it found before): the words it read hold the same now.
    #[inline(always)]
    fn holds(&self, next: &Regs, lo: u64, hi: u64) -> bool {
        let bp_off = match self.kind {
            Kind::Passes => 0,
            Kind::Restores(off) | Kind::FromBp(off) => off,
            Kind::Outermost => return true,
            Kind::Opaque => return false,
        };
        let word = |addr: u64, v: u64| {
            // SAFETY: an aligned word (it was when read) inside this
            // thread's stack, [lo, hi), checked first.
            addr >= lo && addr <= hi - 8 && unsafe { *(addr as *const u64) } == v
        };
        word(next.sp.wrapping_sub(8), next.ip)
            && (bp_off == 0 || word(next.sp.wrapping_add(bp_off as i64 as u64), next.bp))
    }
}

/// One walk: its frames, innermost first, and how it ended.
struct Log {
    frames: [Frame; MAX_FRAMES],
    n: usize,
    /// Frames below this index may not be joined: a frame at or above it
    /// (toward the caller) could not be checked.
    join_from: usize,
    /// Stopped by the depth limit.
    truncated: bool,
    /// Reached the frame the rules call outermost.
    outermost: bool,
    /// The registers the last frame's unwinding found (the frame after the
    /// last: where a walk stopped at the depth goes on).
    next: Regs,
}

impl Log {
    fn empty() -> Box<Log> {
        Box::new(Log {
            frames: [Frame::default(); MAX_FRAMES],
            n: 0,
            join_from: usize::MAX,
            truncated: false,
            outermost: false,
            next: Regs::default(),
        })
    }

    /// Whether the walk from frame `j` on depends on that frame's bp: the
    /// first frame from there that does not pass bp on to its caller
    /// decides; a walk cut at the depth limit goes on, so it may.
    fn needs_bp(&self, j: usize) -> bool {
        for f in &self.frames[j..self.n] {
            match f.kind {
                Kind::Restores(_) | Kind::Outermost => return false,
                Kind::FromBp(_) | Kind::Opaque => return true,
                Kind::Passes => {}
            }
        }
        self.truncated
    }

    /// The caller's registers frame `k` found.
    #[inline(always)]
    fn next_of(&self, k: usize) -> &Regs {
        match self.frames.get(k + 1) {
            Some(f) if k + 1 < self.n => &f.regs,
            _ => &self.next,
        }
    }
}

/// A thread's walker: the previous walk and the one being made.
pub struct Walker {
    prev: Box<Log>,
    cur: Box<Log>,
}

impl Walker {
    pub fn new() -> Walker {
        Walker { prev: Log::empty(), cur: Log::empty() }
    }

    /// Whether the last walk ended where it should: at the depth limit or
    /// at a frame the rules call outermost (not at an unknown address).
    pub fn complete(&self) -> bool {
        self.prev.truncated || self.prev.outermost
    }

    /// Forgets the previous walk (the rules changed).
    pub fn forget(&mut self) {
        self.prev.n = 0;
    }

    /// Walks from `start` (the first frame, whose ip is an instruction, not
    /// a return address) over the stack [start.sp, `top`), writing the ips
    /// of the frames after the leading ones inside `own` into `out`, at
    /// most `depth`; returns how many. `unwind` unwinds one frame.
    #[inline(always)]
    pub fn walk(
        &mut self,
        start: Regs,
        top: u64,
        own: (u64, u64),
        depth: usize,
        out: &mut [u64],
        unwind: &mut impl Unwind,
    ) -> usize {
        let (lo, hi) = (start.sp, top);
        let depth = depth.min(out.len());
        let (prev, cur) = (&*self.prev, &mut *self.cur);
        cur.n = 0;
        cur.join_from = 0;
        cur.truncated = false;
        cur.outermost = false;
        let mut n_out = 0;
        let mut r = start;
        let mut j = 0;
        let mut first = true;
        loop {
            if n_out == depth || cur.n == MAX_FRAMES {
                cur.truncated = true;
                cur.next = r;
                break;
            }
            if !first {
                while j < prev.n && prev.frames[j].regs.sp < r.sp {
                    j += 1;
                }
                if j < prev.n && j >= prev.join_from.max(1) {
                    let p = &prev.frames[j];
                    if p.regs.sp == r.sp && p.regs.ip == r.ip && (p.regs.bp == r.bp || !prev.needs_bp(j)) {
                        // The rest is the previous walk's, from its frame j,
                        // as far as the words each frame read still hold
                        // (checked while copying; on a change, undone).
                        let (n0, out0) = (cur.n, n_out);
                        let mut k = j;
                        let mut holds = true;
                        while k < prev.n && n_out < depth && cur.n < MAX_FRAMES {
                            let f = &prev.frames[k];
                            if !f.holds(prev.next_of(k), lo, hi) {
                                holds = false;
                                break;
                            }
                            if n_out > 0 || !(own.0..own.1).contains(&f.regs.ip) {
                                out[n_out] = f.regs.ip;
                                n_out += 1;
                            }
                            cur.frames[cur.n] = *f;
                            cur.n += 1;
                            k += 1;
                        }
                        if !holds {
                            (cur.n, n_out) = (n0, out0);
                        } else if k < prev.n {
                            cur.truncated = true;
                            cur.next = prev.frames[k].regs;
                            break;
                        } else if !prev.truncated {
                            cur.outermost = prev.outermost;
                            cur.next = prev.next;
                            break;
                        } else {
                            // The previous walk stopped at its depth; this
                            // one has room for more: go on from there.
                            r = prev.next;
                            continue;
                        }
                    }
                }
            }
            if n_out > 0 || !(own.0..own.1).contains(&r.ip) {
                out[n_out] = r.ip;
                n_out += 1;
            }
            let mut reads = Reads { lo, hi };
            let step = unwind.step(r, first, &mut reads);
            let f = &mut cur.frames[cur.n];
            f.regs = r;
            cur.n += 1;
            match step {
                Step::Caller(next, kind) => {
                    f.kind = kind;
                    cur.next = next;
                    if kind == Kind::Opaque {
                        cur.join_from = cur.n;
                    }
                    // The stack grows down: a caller's frame is above.
                    if next.sp <= r.sp || next.ip == 0 {
                        break;
                    }
                    r = next;
                }
                Step::Outermost => {
                    f.kind = Kind::Outermost;
                    cur.outermost = true;
                    break;
                }
                Step::End => {
                    f.kind = Kind::Opaque;
                    cur.join_from = cur.n;
                    break;
                }
            }
            first = false;
        }
        std::mem::swap(&mut self.prev, &mut self.cur);
        n_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Rules by lookup address, run with [`exec`]; counts the frames it unwound.
    struct Table(HashMap<u64, Rule>, usize);

    impl Unwind for Table {
        fn step(&mut self, r: Regs, first: bool, reads: &mut Reads) -> Step {
            self.1 += 1;
            let lookup = if first { r.ip } else { r.ip - 1 };
            exec(self.0.get(&lookup).copied().unwrap_or(Rule::End), r, reads)
        }
    }

    const SP: Rule = Rule::Cfa { from_bp: false, cfa_off: 16, bp_off: 0 };
    const SP_SAVES_BP: Rule = Rule::Cfa { from_bp: false, cfa_off: 16, bp_off: -16 };
    const BP: Rule = Rule::Cfa { from_bp: true, cfa_off: 16, bp_off: -16 };

    /// A stack of 16-byte frames [saved bp, return address] from `words[0]`
    /// up, frame i returning into ip `0x1000 * (i + 2) + 1`.
    fn stack(frames: usize) -> Vec<u64> {
        let mut w = vec![0u64; frames * 2 + 2];
        for i in 0..frames {
            w[2 * i + 1] = 0x1000 * (i as u64 + 2) + 1;
        }
        w
    }

    fn addr(w: &[u64], i: usize) -> u64 {
        &w[i] as *const u64 as u64
    }

    fn walk(wk: &mut Walker, t: &mut Table, w: &[u64], first_word: usize, ip: u64, bp: u64) -> Vec<u64> {
        let mut out = [0u64; 64];
        let start = Regs { ip, sp: addr(w, first_word), bp };
        let top = addr(w, w.len() - 1) + 8;
        let n = wk.walk(start, top, (0, 0), 64, &mut out, t);
        out[..n].to_vec()
    }

    fn table(rules: &[(u64, Rule)]) -> Table {
        Table(rules.iter().copied().collect(), 0)
    }

    /// The hook's frame of a later walk: an instruction, not a return
    /// address, with an rsp-based rule.
    const HOOK: u64 = 0x1100;

    #[test]
    fn joins_the_previous_walk_only_while_its_words_hold() {
        // ips 0x1000 (first), 0x2001, 0x3001, ... each an rsp-based frame.
        let mut w = stack(6);
        let mut rules: Vec<(u64, Rule)> = (1..=6).map(|i| (0x1000 * i as u64, SP)).collect();
        rules.push((HOOK, SP));
        let mut t = table(&rules);
        let mut wk = Walker::new();
        let full = walk(&mut wk, &mut t, &w, 0, 0x1000, 0);
        assert_eq!(full, [0x1000, 0x2001, 0x3001, 0x4001, 0x5001, 0x6001, 0x7001]);
        assert_eq!(t.1, 7);
        // From a shallower hook frame: its caller is the previous walk's
        // frame 2, from where the rest is copied.
        t.1 = 0;
        assert_eq!(walk(&mut wk, &mut t, &w, 2, HOOK, 0), [&[HOOK][..], &full[2..]].concat());
        assert_eq!(t.1, 1);
        // A return address above changed (another caller at the same sp):
        // the copy would be stale, so it walks until the words agree again.
        w[7] = 0x6001;
        t.1 = 0;
        assert_eq!(walk(&mut wk, &mut t, &w, 2, HOOK, 0), [HOOK, 0x3001, 0x4001, 0x6001, 0x6001, 0x7001]);
        assert_eq!(t.1, 4);
    }

    #[test]
    fn bp_matters_only_where_the_rest_uses_it() {
        // Frame 2 (ip 0x3001) finds its CFA from rbp.
        let w = stack(4);
        let bp_frame = addr(&w, 4);
        let mut t = table(&[(0x1000, SP), (0x2000, SP), (0x3000, BP), (0x4000, SP), (HOOK, SP)]);
        let mut wk = Walker::new();
        let full = walk(&mut wk, &mut t, &w, 0, 0x1000, bp_frame);
        assert_eq!(full, [0x1000, 0x2001, 0x3001, 0x4001, 0x5001]);
        // Same frame, other bp: the copy would be wrong, so it walks (and
        // the rbp-based frame now points outside the stack and ends).
        t.1 = 0;
        assert_eq!(walk(&mut wk, &mut t, &w, 2, HOOK, 1 << 40), [HOOK, 0x3001]);
        assert_eq!(t.1, 2);
        // A frame that restores bp from the stack does not depend on it.
        let mut t = table(&[(0x1000, SP), (0x2000, SP), (0x3000, SP_SAVES_BP), (0x4000, SP), (HOOK, SP)]);
        let mut wk = Walker::new();
        let full = walk(&mut wk, &mut t, &w, 0, 0x1000, 7);
        t.1 = 0;
        assert_eq!(walk(&mut wk, &mut t, &w, 2, HOOK, 9), [&[HOOK][..], &full[2..]].concat());
        assert_eq!(t.1, 1);
    }

    #[test]
    fn a_truncated_walk_goes_on_where_the_previous_one_stopped() {
        let w = stack(6);
        let mut rules: Vec<(u64, Rule)> = (1..=6).map(|i| (0x1000 * i as u64, SP)).collect();
        rules.push((HOOK, SP));
        let mut t = table(&rules);
        let mut wk = Walker::new();
        let mut out = [0u64; 64];
        let top = addr(&w, w.len() - 1) + 8;
        let n = wk.walk(Regs { ip: 0x1000, sp: addr(&w, 0), bp: 0 }, top, (0, 0), 3, &mut out, &mut t);
        assert_eq!(out[..n], [0x1000, 0x2001, 0x3001]);
        t.1 = 0;
        let n = wk.walk(Regs { ip: HOOK, sp: addr(&w, 2), bp: 0 }, top, (0, 0), 5, &mut out, &mut t);
        assert_eq!(out[..n], [HOOK, 0x3001, 0x4001, 0x5001, 0x6001]);
        // The hook unwound, 0x3001 copied, then 0x4001.. unwound again.
        assert_eq!(t.1, 4);
    }

    #[test]
    fn leading_own_frames_are_left_out() {
        let w = stack(3);
        let mut t = table(&[(0x1000, SP), (0x2000, SP), (0x3000, SP)]);
        let mut out = [0u64; 8];
        let top = addr(&w, w.len() - 1) + 8;
        let own = (0x1000, 0x2800);
        let n = Walker::new().walk(Regs { ip: 0x1000, sp: addr(&w, 0), bp: 0 }, top, own, 8, &mut out, &mut t);
        assert_eq!(out[..n], [0x3001, 0x4001]);
    }
}
