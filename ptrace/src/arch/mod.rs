//! What the tracer needs to know of the CPU, behind one small interface:
//! where a function's arguments, its result and its return address are at
//! its entry, the breakpoint instruction, how a breakpoint's displaced
//! instruction runs out of line, and how to make a system call in the
//! target. x86-64 is the one implemented (`x86_64.rs`).
//!
//! A port to another CPU implements the same functions. What it needs:
//! - aarch64: arguments in x0–x7, the result in x0, the return address in
//!   the link register x30 at entry (not on the stack: the return is caught
//!   by rewriting x30, not a stack slot); `brk #0` (4 bytes) as the
//!   breakpoint, reported at its own address (no adjustment); displaced
//!   instructions relocated for PC-relative forms (adr, adrp, ldr literal,
//!   b/bl/cbz/tbz); `svc #0` with the number in x8; registers through
//!   PTRACE_GETREGSET (NT_PRSTATUS).
//! - 32-bit ARM: r0–r3 then the stack, result in r0, return address in lr,
//!   Thumb and ARM breakpoints of their own sizes, and the mode bit of the
//!   address.
//! - PowerPC (32 and 64): r3–r10, result in r3, return address in the link
//!   register, `trap` (0x7fe00008) as the breakpoint, big-endian words.

#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use x86_64::*;

#[cfg(not(target_arch = "x86_64"))]
compile_error!("the ptrace tracer is implemented for x86_64 only (see arch/mod.rs for what a port needs)");
