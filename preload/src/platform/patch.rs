//! Hooking a function by patching its entry, for an allocator the
//! interposition cannot reach (defined in the executable, which the loader
//! searches before any preload; docs/ALLOCATORS.md). x86-64 only.
//!
//! The function's first instructions (the fewest whole ones that cover 5
//! bytes) give way to a `jmp rel32` to a *thunk* near the executable,
//! which jumps on to the hook (`jmp [rip]` and the hook's address: the
//! hook may be anywhere). The displaced instructions, moved by iced-x86's
//! block encoder (RIP-relative operands and branches re-encoded for their
//! new place) and followed by a jump back to the first instruction not
//! displaced, are the function as it was: the hook calls them as the real
//! function. No `int3` and no signal: the program runs no code of ours
//! but the hook.
//!
//! A function is left alone (the caller says why in the trace) when its
//! symbol gives no size or less than 5 bytes; when one of its first
//! instructions is a call (under a later stop, a return address could
//! point between the displaced bytes) or anything but plain code and
//! branches; or when any branch in its body lands inside the displaced
//! bytes (a loop back to the entry).

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionBlock,
};

/// Bytes of the jump written at a function's entry.
pub const JUMP_LEN: usize = 5;
/// How far a `rel32` operand reaches, with a margin: thunks and moved
/// RIP-relative operands must lie this near the code they serve.
const NEAR: u64 = (1 << 31) - (1 << 20);
/// Room for one function in the trampoline mapping: its thunk, then its
/// displaced instructions moved and the jump back.
const SLOT: usize = 128;
/// The thunk's part of a slot: `jmp [rip+0]` (6 bytes) and the address.
const THUNK: usize = 16;
/// The trampoline mapping: room for 512 functions.
const MAP_LEN: usize = 64 << 10;

/// The instructions a patch displaces at a function's entry.
#[derive(Debug)]
pub struct Displaced {
    entry: u64,
    instrs: Vec<Instruction>,
    /// Bytes they take: at least [`JUMP_LEN`].
    len: usize,
}

/// Decodes the entry of the function at `entry`, `size` bytes long, and
/// checks that a jump may replace its first instructions; why not, if not.
///
/// # Safety
/// `[entry, entry + size)` is mapped, readable code that stays mapped.
pub unsafe fn displace(entry: u64, size: u64) -> Result<Displaced, String> {
    if size == 0 {
        return Err("its symbol has no size".into());
    }
    if size < JUMP_LEN as u64 {
        return Err(format!("{size} bytes long, shorter than the {JUMP_LEN}-byte jump"));
    }
    // SAFETY: per the contract.
    let body = unsafe { std::slice::from_raw_parts(entry as *const u8, size as usize) };
    let mut d = Decoder::with_ip(64, body, entry, DecoderOptions::NONE);
    let mut instrs = Vec::new();
    let mut len = 0;
    while len < JUMP_LEN {
        let i = d.decode();
        if i.is_invalid() {
            return Err(format!("no instruction decoded at +{len}"));
        }
        match i.flow_control() {
            FlowControl::Next | FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch => {}
            FlowControl::IndirectBranch | FlowControl::Return => {}
            FlowControl::Call | FlowControl::IndirectCall => {
                return Err(format!("a call among its first {JUMP_LEN} bytes"));
            }
            _ => return Err(format!("an instruction that cannot be moved at +{len}")),
        }
        len += i.len();
        instrs.push(i);
    }
    if len as u64 > size {
        return Err(format!("its first instructions ({len} bytes) run past its end ({size} bytes)"));
    }
    // Every branch of the body: none may land inside the displaced bytes.
    let mut all = Decoder::with_ip(64, body, entry, DecoderOptions::NONE);
    while all.can_decode() {
        let i = all.decode();
        let branch = matches!(
            i.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch | FlowControl::Call
        );
        let t = i.near_branch_target();
        if branch && t > entry && t < entry + len as u64 {
            return Err(format!("a branch at +{} to +{} lands in its first {len} bytes", i.ip() - entry, t - entry));
        }
    }
    Ok(Displaced { entry, instrs, len })
}

/// A function whose entry jumps to its hook (once [`write_jumps`] ran).
#[derive(Clone, Copy, Debug)]
pub struct Site {
    /// The function's address.
    pub entry: u64,
    /// Its first bytes as they were (`len` of them), for [`restore`].
    pub saved: [u8; 16],
    /// How many of them the jump replaces (the displaced instructions').
    pub len: usize,
    /// The thunk the entry jumps to.
    pub thunk: u64,
    /// The function as it was: the displaced instructions moved, then a
    /// jump back. What the hook calls.
    pub original: u64,
}

/// Executable memory within `rel32` reach of a module's code, for the
/// thunks and moved instructions of its patched functions.
pub struct Trampolines {
    base: u64,
    used: usize,
}

impl Trampolines {
    /// A new writable mapping within reach of `[lo, hi)` (the module's
    /// code): tried below `lo`, then above `hi`, a MiB at a time, with
    /// `MAP_FIXED_NOREPLACE` so that nothing mapped is replaced; `None`
    /// when no place is free (or the module spans more than the reach).
    pub fn near(lo: u64, hi: u64) -> Option<Trampolines> {
        const STEP: u64 = 1 << 20;
        let fits = |a: u64| hi.max(a + MAP_LEN as u64) - lo.min(a) < NEAR;
        let below = (1..).map(|k| (lo & !(STEP - 1)).wrapping_sub(k * STEP)).take_while(|&a| a < lo && fits(a));
        let above = (0..).map(|k| hi.div_ceil(STEP) * STEP + k * STEP).take_while(|&a| fits(a));
        for hint in below.chain(above).take(2048) {
            if hint < (1 << 16) {
                continue;
            }
            // SAFETY: a new anonymous mapping at a free place (the kernel
            // refuses an occupied one: MAP_FIXED_NOREPLACE); the system
            // call, not the mmap hook.
            let p = unsafe {
                libc::syscall(
                    libc::SYS_mmap,
                    hint,
                    MAP_LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1i64,
                    0usize,
                )
            };
            if p <= 0 {
                continue;
            }
            let p = p as u64;
            if fits(p) {
                return Some(Trampolines { base: p, used: 0 });
            }
            // A kernel before 4.17 took the flag for a hint.
            // SAFETY: the mapping just made, unused.
            unsafe { super::sys::unmap(p as *mut u8, MAP_LEN) };
        }
        None
    }

    /// Writes the thunk to `hook` and the moved instructions of `d`; the
    /// site, whose jump is not written yet. Errors when the mapping is
    /// full or the instructions cannot be moved.
    pub fn add(&mut self, d: &Displaced, hook: u64) -> Result<Site, String> {
        if self.used + SLOT > MAP_LEN {
            return Err("no room left for its trampoline".into());
        }
        let thunk = self.base + self.used as u64;
        let original = thunk + THUNK as u64;
        let back = Instruction::with_branch(Code::Jmp_rel32_64, d.entry + d.len as u64)
            .map_err(|e| format!("the jump back: {e}"))?;
        let mut block = d.instrs.clone();
        block.push(back);
        let moved = BlockEncoder::encode(64, InstructionBlock::new(&block, original), BlockEncoderOptions::NONE)
            .map_err(|e| format!("its first instructions cannot be moved: {e}"))?;
        let code = moved.code_buffer;
        if code.len() > SLOT - THUNK {
            return Err(format!("its first instructions take {} bytes moved", code.len()));
        }
        let mut jump = [0u8; THUNK];
        jump[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
        jump[6..14].copy_from_slice(&hook.to_le_bytes());
        jump[14..].fill(0xcc);
        if d.len > 16 {
            return Err(format!("its first instructions take {} bytes", d.len));
        }
        let mut saved = [0u8; 16];
        // SAFETY: the mapping is writable and [thunk, thunk + SLOT) is this
        // slot's alone; the displaced bytes lie inside the function
        // (`displace` checked), readable code.
        unsafe {
            std::ptr::copy_nonoverlapping(jump.as_ptr(), thunk as *mut u8, THUNK);
            std::ptr::copy_nonoverlapping(code.as_ptr(), original as *mut u8, code.len());
            std::ptr::copy_nonoverlapping(d.entry as *const u8, saved.as_mut_ptr(), d.len);
        }
        self.used += SLOT;
        Ok(Site { entry: d.entry, saved, len: d.len, thunk, original })
    }

    /// Points `site`'s thunk at `hook` instead (before [`Trampolines::seal`]).
    pub fn set_thunk(&mut self, site: &Site, hook: u64) {
        // SAFETY: the thunk's address word in this writable mapping.
        unsafe { std::ptr::write_unaligned((site.thunk + 6) as *mut u64, hook) };
    }

    /// Makes the mapping executable and read-only; false if the kernel
    /// refused (then no site of it may be used).
    pub fn seal(&self) -> bool {
        // SAFETY: the mapping is ours; nothing executes in it yet.
        unsafe { libc::mprotect(self.base as *mut libc::c_void, MAP_LEN, libc::PROT_READ | libc::PROT_EXEC) == 0 }
    }
}

/// What the executable's patching did, kept for every stream of the
/// process (a fork's child's too): a [`mtrace_format::Record::Patched`].
static DONE: parking_lot::Mutex<Option<mtrace_format::Record>> = parking_lot::Mutex::new(None);

/// Keeps `rec`, the record of what was patched.
pub fn remember(rec: mtrace_format::Record) {
    *DONE.lock() = Some(rec);
}

/// The record of what was patched, if anything was tried.
pub fn remembered() -> Option<mtrace_format::Record> {
    DONE.lock().clone()
}

/// The patches were taken back (`mtrace attach`'s detach): later streams
/// have none to announce.
pub fn forget() {
    *DONE.lock() = None;
}

/// Writes each site's jump over its entry: `jmp rel32` to its thunk, the
/// rest of the displaced bytes `int3`. `prot` gives the protection each
/// code page has (restored after the write). Errors per site, in order.
///
/// # Safety
/// No other thread runs (or all are held) with its instruction pointer
/// inside a site's displaced bytes, and none runs code on a page being
/// written (they are held, or there are none); the sites come from
/// [`Trampolines::add`] of a sealed mapping.
pub unsafe fn write_jumps(sites: &[Site], prot: impl Fn(u64) -> Option<i32>) -> Vec<Result<(), String>> {
    let jumps: Vec<(u64, [u8; 16], usize)> = sites
        .iter()
        .map(|s| {
            let mut bytes = [0xccu8; 16];
            bytes[0] = 0xe9;
            let rel = s.thunk.wrapping_sub(s.entry + JUMP_LEN as u64) as i64;
            bytes[1..5].copy_from_slice(&(rel as i32).to_le_bytes());
            (s.entry, bytes, s.len)
        })
        .collect();
    // SAFETY: per the contract; `rel` fits (the thunk is within NEAR).
    unsafe { write_code(&jumps, prot) }
}

/// Puts each site's first bytes back as they were (`mtrace attach`'s
/// detach): from then on the function runs as it did before it was
/// patched. Errors per site, in order.
///
/// # Safety
/// As [`write_jumps`]: no other thread runs code on a page being written
/// (a thread inside a hook or a moved prologue goes on as before: both
/// stay mapped).
pub unsafe fn restore(sites: &[Site], prot: impl Fn(u64) -> Option<i32>) -> Vec<Result<(), String>> {
    let old: Vec<(u64, [u8; 16], usize)> = sites.iter().map(|s| (s.entry, s.saved, s.len)).collect();
    // SAFETY: per the contract.
    unsafe { write_code(&old, prot) }
}

/// Writes `bytes[..len]` at each `addr` of code, its pages made writable
/// for the write and given back the protection `prot` says.
///
/// # Safety
/// As [`write_jumps`].
unsafe fn write_code(writes: &[(u64, [u8; 16], usize)], prot: impl Fn(u64) -> Option<i32>) -> Vec<Result<(), String>> {
    const PAGE: u64 = 4096;
    // No signal handler of the program may run on a page made writable
    // and not executable.
    super::sys::with_signals_blocked(|| {
        writes
            .iter()
            .map(|&(addr, bytes, len)| {
                let first = addr & !(PAGE - 1);
                let last = (addr + len as u64 - 1) & !(PAGE - 1);
                let span = (last - first + PAGE) as usize;
                let before = prot(first).ok_or("its page's protection is unknown")?;
                // SAFETY: the pages of the function, made writable for the
                // write below and put back; no thread executes them meanwhile
                // (the contract), so plain read-write is enough where the
                // kernel refuses writable code.
                let writable = unsafe {
                    let p = first as *mut libc::c_void;
                    libc::mprotect(p, span, before | libc::PROT_WRITE) == 0
                        || libc::mprotect(p, span, libc::PROT_READ | libc::PROT_WRITE) == 0
                };
                if !writable {
                    return Err(format!("mprotect: errno {}", super::sys::errno()));
                }
                // SAFETY: [addr, addr + len) is writable now and replaced as a
                // whole.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, len);
                    libc::mprotect(first as *mut libc::c_void, span, before);
                }
                Ok(())
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Code in a mapping of its own, at a known address.
    fn code(bytes: &[u8]) -> u64 {
        let p = crate::platform::sys::map_anon(4096).unwrap();
        // SAFETY: a fresh 4096-byte mapping.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
        p as u64
    }

    #[test]
    fn displaces_whole_instructions_and_refuses_what_cannot_move() {
        // test rdi,rdi (3); je +0x10 (2); mov eax,1 (5); ret; …
        let f = code(&[0x48, 0x85, 0xff, 0x74, 0x10, 0xb8, 1, 0, 0, 0, 0xc3, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90]);
        // SAFETY: the mapping made above.
        let d = unsafe { displace(f, 18) }.unwrap();
        assert_eq!((d.instrs.len(), d.len), (2, 5));
        // SAFETY: as above.
        assert!(unsafe { displace(f, 3) }.unwrap_err().contains("shorter"));
        // SAFETY: as above.
        assert!(unsafe { displace(f, 0) }.is_err());
        // call rel32 first.
        let c = code(&[0xe8, 0, 0, 0, 0, 0xc3]);
        // SAFETY: as above.
        assert!(unsafe { displace(c, 6) }.unwrap_err().contains("call"));
        // push rbx (1); jmp back to +0 … a loop to +1: inside the first 5 bytes.
        let l = code(&[0x53, 0x90, 0x90, 0x90, 0x90, 0x90, 0xeb, 0xf9, 0xc3]);
        // SAFETY: as above.
        assert!(unsafe { displace(l, 9) }.unwrap_err().contains("lands in"));
    }

    #[test]
    fn a_patched_function_jumps_to_the_hook_and_its_original_still_runs() {
        // lea rax,[rdi+1]; ret (the "real" function: x + 1), padded.
        let f = code(&[0x48, 0x8d, 0x47, 0x01, 0xc3, 0x90, 0x90, 0x90]);
        extern "C" fn hook(x: u64) -> u64 {
            let real: extern "C" fn(u64) -> u64 =
                // SAFETY: ORIGINAL holds the moved original, of this signature.
                unsafe { std::mem::transmute(ORIGINAL.load(std::sync::atomic::Ordering::Acquire) as usize) };
            real(x) * 10
        }
        static ORIGINAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut t = Trampolines::near(f, f + 4096).unwrap();
        // SAFETY: the mapping made above.
        let d = unsafe { displace(f, 8) }.unwrap();
        let site = t.add(&d, hook as *const () as u64).unwrap();
        assert!(t.seal());
        ORIGINAL.store(site.original, std::sync::atomic::Ordering::Release);
        // SAFETY: one thread runs this code (this test's); the sealed
        // mapping's site.
        let r = unsafe { write_jumps(&[site], |_| Some(libc::PROT_READ | libc::PROT_EXEC)) };
        assert!(r[0].is_ok(), "{r:?}");
        // SAFETY: f is now executable code of this signature.
        let patched: extern "C" fn(u64) -> u64 = unsafe { std::mem::transmute(f as usize) };
        assert_eq!(patched(4), 50);
    }
}
