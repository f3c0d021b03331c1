//! x86-64 (System V ABI): arguments in rdi, rsi, rdx, rcx (r10 for system
//! calls), r8, r9; the result in rax; at a function's entry the return
//! address is the word at rsp. `int3` (0xcc) traps with rip one past it.

use anyhow::{bail, Context, Result};
use iced_x86::{BlockEncoder, BlockEncoderOptions, Decoder, DecoderOptions, Instruction, InstructionBlock};

/// The target's registers (ptrace's user_regs_struct).
#[derive(Clone, Copy)]
pub struct Regs(pub libc::user_regs_struct);

impl std::fmt::Debug for Regs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Regs {{ ip: {:#x}, sp: {:#x} }}", self.ip(), self.sp())
    }
}

impl Regs {
    pub fn ip(&self) -> u64 {
        self.0.rip
    }
    pub fn set_ip(&mut self, ip: u64) {
        self.0.rip = ip;
    }
    pub fn sp(&self) -> u64 {
        self.0.rsp
    }
    /// The frame pointer, for the unwinder.
    pub fn bp(&self) -> u64 {
        self.0.rbp
    }
    /// Integer argument `i` (from 0) at a function's entry.
    pub fn arg(&self, i: usize) -> u64 {
        let r = &self.0;
        [r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9].get(i).copied().unwrap_or(0)
    }
    /// The integer result after a function returned.
    pub fn result(&self) -> u64 {
        self.0.rax
    }
    /// Returns from a function stopped at its entry with result `v`: the
    /// ip from the return address `ret` (the word at sp), sp above it.
    pub fn return_with(&mut self, ret: u64, v: u64) {
        self.0.rax = v;
        self.0.rip = ret;
        self.0.rsp += 8;
    }
}

/// The user registers a uprobe samples (perf's numbering,
/// arch/x86/include/uapi/asm/perf_regs.h): ax, cx, dx, si, di, bp, sp,
/// ip, r8, r9 — the arguments, the result, and what the unwinder starts
/// from.
pub const PERF_REGS: u64 =
    (1 << 0) | (1 << 2) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 16) | (1 << 17);

impl Regs {
    /// The registers of a sample taken with [`PERF_REGS`]: their words in
    /// the order of the mask's bits; `None` if there are too few.
    pub fn from_perf(words: &[u8]) -> Option<Regs> {
        let w = |i: usize| words.get(i * 8..i * 8 + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
        let mut r = blank_regs();
        r.rax = w(0)?;
        r.rcx = w(1)?;
        r.rdx = w(2)?;
        r.rsi = w(3)?;
        r.rdi = w(4)?;
        r.rbp = w(5)?;
        r.rsp = w(6)?;
        r.rip = w(7)?;
        r.r8 = w(8)?;
        r.r9 = w(9)?;
        Some(Regs(r))
    }
}

/// The breakpoint instruction.
pub const BREAKPOINT: [u8; 1] = [0xcc];

/// The address of the breakpoint a thread stopped at, from its ip.
pub fn trapped_at(ip: u64) -> u64 {
    ip.wrapping_sub(1)
}

/// Where a function's return address is at its entry: the stack slot.
pub fn return_slot(r: &Regs) -> u64 {
    r.sp()
}

/// The registers of the caller of a function stopped at its entry, whose
/// return address is `ret`: (ip, sp, bp).
pub fn caller(r: &Regs, ret: u64) -> (u64, u64, u64) {
    (ret, r.sp() + 8, r.bp())
}

/// Bytes before a return address that hold a direct call.
pub const CALL_LEN: usize = 5;

/// The target of the direct call (`call rel32`) whose return address is
/// `ret`, from the `CALL_LEN` bytes before it; `None` for an indirect call
/// (through the PLT's GOT slot, a function pointer) or no call.
pub fn direct_call_target(before: &[u8; CALL_LEN], ret: u64) -> Option<u64> {
    (before[0] == 0xe8)
        .then(|| ret.wrapping_add_signed(i32::from_le_bytes([before[1], before[2], before[3], before[4]]) as i64))
}

/// Bytes of code read at a breakpoint's address to decode its instruction.
pub const CODE_READ: usize = 16;
/// Room each displaced instruction takes in the scratch page.
pub const SLOT: u64 = 48;

/// The first instruction of `code` (at `from`), moved to `to` so that it
/// does there what it did at `from` (RIP-relative operands and branches
/// re-encoded), followed by a jump back to the instruction after it.
/// Errors when the instruction cannot be moved (unknown, or `to` too far
/// for a RIP-relative operand).
pub fn displaced(code: &[u8], from: u64, to: u64) -> Result<Vec<u8>> {
    let mut d = Decoder::with_ip(64, code, from, DecoderOptions::NONE);
    let first = d.decode();
    if first.is_invalid() {
        bail!("no instruction at {from:#x}");
    }
    let back = Instruction::with_branch(iced_x86::Code::Jmp_rel32_64, first.next_ip()).context("the jump back")?;
    let block = [first, back];
    let r = BlockEncoder::encode(64, InstructionBlock::new(&block, to), BlockEncoderOptions::NONE)
        .map_err(|e| anyhow::anyhow!("cannot move the instruction at {from:#x}: {e}"))?;
    if r.code_buffer.len() as u64 > SLOT {
        bail!("the instruction at {from:#x} takes {} bytes moved", r.code_buffer.len());
    }
    Ok(r.code_buffer)
}

/// How far a displaced RIP-relative operand may reach: scratch pages are
/// placed within this of the code they serve.
pub const NEAR: u64 = (1 << 31) - (1 << 20);

/// A `syscall` followed by a breakpoint, written at a stopped thread's ip
/// to make a system call in the target.
pub const SYSCALL_TRAP: [u8; 3] = [0x0f, 0x05, 0xcc];

/// `r` set up for system call `nr` with `args`, to run at `ip`.
pub fn syscall_regs(r: &Regs, ip: u64, nr: u64, args: [u64; 6]) -> Regs {
    let mut s = *r;
    s.0.rax = nr;
    s.0.orig_rax = u64::MAX;
    s.0.rdi = args[0];
    s.0.rsi = args[1];
    s.0.rdx = args[2];
    s.0.r10 = args[3];
    s.0.r8 = args[4];
    s.0.r9 = args[5];
    s.0.rip = ip;
    s
}

/// All-zero registers, to be filled from a sample.
fn blank_regs() -> libc::user_regs_struct {
    // SAFETY: user_regs_struct is plain integers; zero is a value of each.
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn moves_rip_relative_and_plain_instructions() {
        // push %r12, at 0x1000, moved to 0x2000: the same 2 bytes, then jmp 0x1002.
        let c = super::displaced(&[0x41, 0x54, 0x55, 0x90], 0x1000, 0x2000).unwrap();
        assert_eq!(c[..2], [0x41, 0x54]);
        assert_eq!(c[2], 0xe9);
        assert_eq!(i32::from_le_bytes(c[3..7].try_into().unwrap()) as i64, 0x1002 - 0x2007);
        // cmpb $0x0,0x140e71(%rip) at 0x99610 (memalign's first): the
        // displacement follows the move so that it reads the same byte.
        let code = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0x00, 0x00, 0x90];
        let c = super::displaced(&code, 0x99610, 0x50000).unwrap();
        let disp = i32::from_le_bytes(c[2..6].try_into().unwrap()) as i64;
        assert_eq!(0x50000 + 7 + disp, 0x99610 + 7 + 0x140e71);
        assert_eq!(c[7], 0xe9);
    }
}
