//! The program's registers at the frame where it called into libc's exit
//! path or the tracer's API: the roots of the leak scan's calling thread
//! (docs/SCAN.md). A snapshot taken from inside `exit` or a hook sees, below
//! that frame, the exit path's and the tracer's frames, whose unwritten
//! slots hold words of frames that died long ago (a pointer that was the
//! program's only one to a block makes it look reachable). Those frames
//! are not roots: the caller's frame is where the program's state is.
//!
//! libgcc's unwinder is used (not the fast one): it restores every
//! callee-saved register through each frame's CFI, which the fast one
//! does not track, and this runs once per scan, not per allocation.

use std::ffi::c_void;

/// `_Unwind_Context`, opaque.
#[repr(C)]
struct Context {
    _private: [u8; 0],
}

type Trace = extern "C" fn(ctx: *mut Context, arg: *mut c_void) -> i32;

/// `_URC_NO_REASON`: go on to the next frame; anything else stops.
const GO_ON: i32 = 0;
const STOP: i32 = 4;

extern "C" {
    fn _Unwind_Backtrace(f: Trace, arg: *mut c_void) -> i32;
    fn _Unwind_GetIP(ctx: *mut Context) -> usize;
    fn _Unwind_GetCFA(ctx: *mut Context) -> usize;
    fn _Unwind_GetGR(ctx: *mut Context, reg: i32) -> usize;
    fn _Unwind_FindEnclosingFunction(pc: *mut c_void) -> *mut c_void;
}

/// DWARF numbers (x86-64 psABI) of rbx, rbp, r12, r13, r14, r15: the
/// callee-saved registers, in the order of `stop::own_registers`.
const CALLEE_SAVED: [i32; 6] = [3, 6, 12, 13, 14, 15];

/// Which frame's caller is wanted.
#[derive(Clone, Copy)]
enum Callee {
    /// The innermost call of the function at this address.
    Func(usize),
    /// The outermost of the innermost run of frames in [lo, hi) (this
    /// library's code: a hook and what it called).
    Within(usize, usize),
}

struct Walk {
    callee: Callee,
    /// The previous frame was the callee's (`Func`'s, or one in the range).
    after: bool,
    frames: usize,
    found: Option<[u64; 7]>,
}

extern "C" fn frame(ctx: *mut Context, arg: *mut c_void) -> i32 {
    // SAFETY: `arg` is the `Walk` that `find` passes, alive for the call;
    // the context is libgcc's for this frame, valid during the callback.
    let (w, ip) = unsafe { (&mut *(arg as *mut Walk), _Unwind_GetIP(ctx)) };
    w.frames += 1;
    if ip == 0 || w.frames > 512 {
        return STOP;
    }
    // Still inside the library: its caller is further out.
    let within = matches!(w.callee, Callee::Within(lo, hi) if (lo..hi).contains(&(ip - 1)));
    if w.after && !within {
        let mut regs = [0u64; 7];
        for (r, &n) in regs.iter_mut().zip(&CALLEE_SAVED) {
            // SAFETY: libgcc's initial context saves every callee-saved
            // register, and each frame's rules keep them known.
            *r = unsafe { _Unwind_GetGR(ctx, n) } as u64;
        }
        // The stack pointer at the call. libgcc's context of a frame holds
        // the CFA of the frame it was unwound from (its callee): that is
        // this frame's stack pointer at the call. (The previous frame's
        // value, used before, is the callee's own stack pointer: the
        // roots then took in the whole frame of `mtrace_scan`, whose
        // unwritten slots held a stale pointer to a dropped block in a
        // debug build of the library: ctests/scan_busy.c.)
        // SAFETY: reads libgcc's context of this frame, valid during the callback.
        regs[6] = unsafe { _Unwind_GetCFA(ctx) } as u64;
        w.found = Some(regs);
        return STOP;
    }
    // A return address may be just past its call's function (a call that
    // does not return ends it): look up the byte before.
    w.after = match w.callee {
        Callee::Func(func) => {
            // SAFETY: a pure lookup in the loaded modules' unwind tables.
            let start = unsafe { _Unwind_FindEnclosingFunction((ip - 1) as *mut c_void) } as usize;
            start == func
        }
        Callee::Within(..) => within,
    };
    GO_ON
}

/// The callee-saved registers and stack pointer (last), as
/// `stop::own_registers` orders them, of the caller of the innermost call
/// of the function at address `func` (libc's `exit`, the API's
/// `mtrace_scan`); None when the walk does not reach that frame (no
/// unwind information on the way).
pub fn caller_of(func: usize) -> Option<[u64; 7]> {
    walk(Callee::Func(func))
}

/// [`caller_of`] the code in [lo, hi) (this library) the calling thread
/// is in: the program's frame that called the hook (or a library's, such
/// as libstdc++'s `operator new` calling `malloc`).
pub fn caller_of_range(lo: usize, hi: usize) -> Option<[u64; 7]> {
    walk(Callee::Within(lo, hi))
}

fn walk(callee: Callee) -> Option<[u64; 7]> {
    let mut w = Walk { callee, after: false, frames: 0, found: None };
    // SAFETY: the callback only reads the context it is given; `w` outlives the walk.
    unsafe { _Unwind_Backtrace(frame, &mut w as *mut Walk as *mut c_void) };
    w.found
}
