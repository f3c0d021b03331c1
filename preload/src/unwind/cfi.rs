//! One module's DWARF call frame information, and the translation of the
//! CFI row for one address into a [`Rule`] the hot path can execute with
//! two loads and no lookup.
//!
//! The data is `.eh_frame_hdr` (the sorted address → FDE table) and
//! `.eh_frame` (CIEs and FDEs), copied out of the loaded image once
//! (fast.rs says why a copy) and shared with framehop's module list.
//! The format is the LSB's "Exception Frames" chapter over DWARF 4 §6.4;
//! gimli (the crate framehop itself parses with) reads it.

use std::ops::Deref;
use std::sync::Arc;

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, RegisterRule, UnwindContext, UnwindSection, X86_64,
};

/// Immutable bytes shared between our [`Cfi`] and framehop's module.
#[derive(Clone)]
pub enum Bytes {
    /// A copy, for a module `dlclose` may unload while a thread unwinds.
    Copy(Arc<[u8]>),
    /// The loaded image itself: the main executable's, mapped as long as
    /// the process runs this image (an exec replaces this library too).
    /// Not copied: cc1plus's unwind tables are 2.9 MiB, and the copy
    /// read every page of them as well.
    Image(&'static [u8]),
}

impl Default for Bytes {
    fn default() -> Bytes {
        Bytes::Image(&[])
    }
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Copy(b) => b,
            Bytes::Image(b) => b,
        }
    }
}

/// How to find the caller's frame from a frame at one code address
/// (x86-64 System V: the return address is the word below the CFA, and
/// the caller's stack pointer is the CFA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// CFA = (rbp if `from_bp` else rsp) + `cfa_off`; the caller's rbp is
    /// saved at CFA + `bp_off`, or unchanged when `bp_off` is 0.
    Cfa { from_bp: bool, cfa_off: i32, bp_off: i32 },
    /// The outermost frame: the return address is undefined (`_start`,
    /// `clone`, the thread start of glibc mark theirs so).
    End,
    /// No FDE covers the address: code built without unwind tables
    /// (Chromium's executable has FDEs for 8,850 of its functions, in
    /// 236 MB of code, and frame pointers), or code outside every module
    /// (V8's JIT). A caller's frame is found by the frame pointer, as
    /// framehop does for such an address (its `rule_if_uncovered_by_fde`
    /// and its fallback outside modules): [`FRAME_POINTER`]. A first
    /// frame (not after a call) goes to framehop.
    Uncovered,
    /// Anything else (a CFA expression such as a PLT's or a signal frame's,
    /// registers other than rsp/rbp): framehop unwinds this frame.
    Other,
}

/// The frame-pointer walk's rule: CFA = rbp + 16, the return address
/// below it and the caller's rbp at rbp (`push rbp; mov rbp, rsp`).
pub const FRAME_POINTER: Rule = Rule::Cfa { from_bp: true, cfa_off: 16, bp_off: -16 };

/// Call frame information of one loaded module.
pub struct Cfi {
    /// Address range of the module's loaded segments, [lo, hi).
    pub range: (u64, u64),
    hdr_avma: u64,
    hdr: Bytes,
    eh_avma: u64,
    eh: Bytes,
}

/// Per-thread scratch for evaluating CFI (gimli's row state machine).
pub type Context = UnwindContext<usize>;

impl Cfi {
    /// `hdr` and `eh` are the bytes of `.eh_frame_hdr` at `hdr_avma` and of
    /// `.eh_frame` (up to the end of its segment) at `eh_avma`.
    pub fn new(range: (u64, u64), hdr_avma: u64, hdr: Bytes, eh_avma: u64, eh: Bytes) -> Cfi {
        Cfi { range, hdr_avma, hdr, eh_avma, eh }
    }

    /// The rule for code address `addr` (an instruction address: the
    /// caller subtracts 1 from a return address first).
    pub fn rule(&self, addr: u64, ctx: &mut Context) -> Rule {
        self.row_rule(addr, ctx).unwrap_or(Rule::Other)
    }

    fn row_rule(&self, addr: u64, ctx: &mut Context) -> Option<Rule> {
        let bases = BaseAddresses::default().set_eh_frame_hdr(self.hdr_avma).set_eh_frame(self.eh_avma);
        let hdr = EhFrameHdr::new(&self.hdr, LittleEndian).parse(&bases, 8).ok()?;
        let eh = EhFrame::new(&self.eh, LittleEndian);
        let fde = match hdr.table()?.fde_for_address(&eh, &bases, addr, EhFrame::cie_from_offset) {
            Ok(fde) => fde,
            Err(gimli::Error::NoUnwindInfoForAddress) => return Some(Rule::Uncovered),
            Err(_) => return None,
        };
        if fde.cie().is_signal_trampoline() {
            return None;
        }
        let row = fde.unwind_info_for_address(&eh, &bases, ctx, addr).ok()?;
        translate(row.cfa(), row.register(X86_64::RA), row.register(X86_64::RBP))
    }
}

type Reg = Option<RegisterRule<usize>>;

/// The [`Rule`] for a CFI row's CFA, return address and rbp rules; `None`
/// when it takes more than rsp/rbp plus offsets.
fn translate(cfa: &CfaRule<usize>, ra: Reg, bp: Reg) -> Option<Rule> {
    match ra {
        Some(RegisterRule::Undefined) => return Some(Rule::End),
        Some(RegisterRule::Offset(-8)) => {}
        _ => return None,
    }
    let CfaRule::RegisterAndOffset { register, offset } = *cfa else { return None };
    let from_bp = match register {
        X86_64::RSP => false,
        X86_64::RBP => true,
        _ => return None,
    };
    let bp_off = match bp {
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => 0,
        Some(RegisterRule::Offset(n)) if n != 0 => n,
        _ => return None,
    };
    Some(Rule::Cfa { from_bp, cfa_off: i32::try_from(offset).ok()?, bp_off: i32::try_from(bp_off).ok()? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(register: gimli::Register, offset: i64) -> CfaRule<usize> {
        CfaRule::RegisterAndOffset { register, offset }
    }

    #[test]
    fn translates_the_common_rows() {
        let ra = Some(RegisterRule::Offset(-8));
        // Function entry: CFA = rsp + 8, rbp untouched.
        assert_eq!(
            translate(&at(X86_64::RSP, 8), ra.clone(), None),
            Some(Rule::Cfa { from_bp: false, cfa_off: 8, bp_off: 0 })
        );
        // After push rbp; mov rbp, rsp.
        assert_eq!(
            translate(&at(X86_64::RBP, 16), ra.clone(), Some(RegisterRule::Offset(-16))),
            Some(Rule::Cfa { from_bp: true, cfa_off: 16, bp_off: -16 })
        );
        assert_eq!(translate(&at(X86_64::RSP, 8), Some(RegisterRule::Undefined), None), Some(Rule::End));
    }

    #[test]
    fn leaves_the_rest_to_framehop() {
        let ra = Some(RegisterRule::Offset(-8));
        // Stack realignment: CFA from r10.
        assert_eq!(translate(&at(X86_64::R10, 0), ra.clone(), None), None);
        // Return address somewhere unusual.
        assert_eq!(translate(&at(X86_64::RSP, 8), Some(RegisterRule::Offset(-16)), None), None);
        // rbp kept in another register.
        assert_eq!(translate(&at(X86_64::RSP, 8), ra, Some(RegisterRule::Register(X86_64::RBX))), None);
    }
}
