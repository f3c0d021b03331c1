//! The fast unwinder (x86_64): DWARF CFI rules cached per thread by code
//! address, executed in a tight loop; the frame pointer where no FDE
//! covers the code (as framehop would); framehop for the frames those
//! rules cannot express.
//!
//! Why a loop of our own in front of framehop: framehop also caches a rule
//! per address, but its per-frame path (iterator, frame-address and error
//! plumbing, cache statistics) cost about 11 ns per frame here, a third of
//! the whole tracer's time on the churn benchmark. A hit here is a table
//! index, a compare and two loads. The rules come from the same CFI
//! (cfi.rs), so the frames are the same; framehop still unwinds frames
//! whose rule is a DWARF expression, another register, or missing.
//!
//! Module data (`.eh_frame_hdr`, and `.eh_frame` up to the end of the
//! segment that holds it) is copied out of the loaded image once, into a
//! master list; threads clone it (the bytes are reference-counted) whenever
//! the master's generation moved. A copy, not a view: a library unloaded
//! by dlclose while another thread unwinds must not leave that thread
//! reading unmapped memory The main executable's tables are used in place (it is never
//! unloaded).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use parking_lot::Mutex;

use super::cfi::{Bytes, Cfi, Context, Rule, FRAME_POINTER};
use super::rule_cache::RuleCache;
use super::walk::{exec, Kind, Reads, Regs, Step, Unwind, Walker};
use super::Here;

type Unw = UnwinderX86_64<Bytes>;
/// A module ready for framehop, and our view of its CFI.
type Loaded = (Module<Bytes>, Arc<Cfi>);

const PT_GNU_EH_FRAME: u32 = 0x6474_e550;
// DWARF pointer encodings used by .eh_frame_hdr's eh_frame_ptr.
const DW_EH_PE_UDATA4: u8 = 0x03;
const DW_EH_PE_SDATA4: u8 = 0x0b;
const DW_EH_PE_PCREL: u8 = 0x10;

/// The module set every thread copies from.
struct Master {
    unwinder: Unw,
    /// The modules in `unwinder`, kept to reuse when the set is rebuilt.
    modules: Vec<Loaded>,
    /// The modules' CFI, sorted by start address.
    cfis: Vec<Arc<Cfi>>,
    /// The loader's (adds, subs) when the set was built.
    dl_gen: (u64, u64),
}

static MASTER: Mutex<Option<Master>> = Mutex::new(None);
/// Bumped whenever the master changes; threads compare it on every capture.
static GEN: AtomicU64 = AtomicU64::new(0);

/// Rebuilds the master when the loader's module list changed (or was never
/// read). Cheap when nothing changed: one `dl_iterate_phdr` that stops at
/// the first entry.
pub fn refresh() {
    let dl_gen = crate::platform::modules::generation();
    // Hooks come here (platform/spin.rs: why not park).
    let mut m = crate::platform::spin::lock_unparked(&MASTER);
    if m.as_ref().is_some_and(|m| m.dl_gen == dl_gen) {
        return;
    }
    let old = m.take().map(|m| m.modules).unwrap_or_default();
    let modules = loaded_modules(old);
    let mut unwinder = Unw::new();
    let mut cfis = Vec::new();
    for (module, cfi) in &modules {
        unwinder.add_module(module.clone());
        cfis.push(cfi.clone());
    }
    cfis.sort_unstable_by_key(|c| c.range.0);
    *m = Some(Master { unwinder, modules, cfis, dl_gen });
    GEN.fetch_add(1, Ordering::Release);
}

/// The loaded modules; those of `old` still mapped at the same range are
/// reused rather than copied again (a dlopen changes one module, not all).
fn loaded_modules(mut old: Vec<Loaded>) -> Vec<Loaded> {
    let mut out = Vec::new();
    crate::platform::modules::each(|name, bias, phdrs| {
        let loads: Vec<(u64, u64)> = phdrs
            .iter()
            .filter(|p| p.p_type == libc::PT_LOAD)
            .map(|p| (bias.wrapping_add(p.p_vaddr), bias.wrapping_add(p.p_vaddr + p.p_memsz)))
            .collect();
        let (Some(lo), Some(hi)) = (loads.iter().map(|r| r.0).min(), loads.iter().map(|r| r.1).max()) else { return };
        // The same path, range and load bias as before: the same module.
        if let Some(i) = old.iter().position(|(m, c)| c.range == (lo, hi) && m.base_avma() == bias && m.name() == name)
        {
            out.push(old.swap_remove(i));
            return;
        }
        let Some(hdr) = phdrs.iter().find(|p| p.p_type == PT_GNU_EH_FRAME) else { return };
        // SAFETY: PT_GNU_EH_FRAME lies in a loaded segment of this module;
        // 'static only for the main executable's (see `keep`), whose
        // segments stay mapped as long as this image runs; the others are
        // copied during this call.
        let hdr_bytes: &'static [u8] = unsafe { crate::platform::modules::mapped(bias, hdr.p_vaddr, hdr.p_memsz) };
        let Some(eh_avma) = eh_frame_address(hdr_bytes, bias.wrapping_add(hdr.p_vaddr)) else { return };
        // .eh_frame ends with a zero terminator somewhere before the end of
        // its segment; framehop finds entries through the header's table.
        let Some(&(_, seg_end)) = loads.iter().find(|r| r.0 <= eh_avma && eh_avma < r.1) else { return };
        // SAFETY: [eh_avma, seg_end) is inside one loaded segment; 'static
        // as above.
        let eh_bytes: &'static [u8] =
            unsafe { crate::platform::modules::mapped(bias, eh_avma - bias, seg_end - eh_avma) };
        // The main executable (the loader lists it first, without a
        // name) is never unloaded: its tables are used where they are.
        let keep = |b: &'static [u8]| if name.is_empty() { Bytes::Image(b) } else { Bytes::Copy(b.into()) };
        let hdr_copy = keep(hdr_bytes);
        let eh_copy = keep(eh_bytes);
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            eh_frame_hdr_svma: Some(hdr.p_vaddr..hdr.p_vaddr + hdr.p_memsz),
            eh_frame_hdr: Some(hdr_copy.clone()),
            eh_frame_svma: Some(eh_avma - bias..seg_end - bias),
            eh_frame: Some(eh_copy.clone()),
            ..Default::default()
        };
        let cfi = Cfi::new((lo, hi), bias.wrapping_add(hdr.p_vaddr), hdr_copy, eh_avma, eh_copy);
        out.push((Module::new(name.to_owned(), lo..hi, bias, info), Arc::new(cfi)));
    });
    out
}

/// The address of `.eh_frame` from `.eh_frame_hdr` (version 1, then the
/// encodings of eh_frame_ptr, fde_count and the table, then eh_frame_ptr).
fn eh_frame_address(hdr: &[u8], hdr_avma: u64) -> Option<u64> {
    if hdr.len() < 8 || hdr[0] != 1 {
        return None;
    }
    let field = u32::from_ne_bytes(hdr[4..8].try_into().ok()?);
    let value = match hdr[1] & 0x0f {
        DW_EH_PE_SDATA4 => field as i32 as i64 as u64,
        DW_EH_PE_UDATA4 => field as u64,
        _ => return None,
    };
    match hdr[1] & 0x70 {
        0 => Some(value),
        DW_EH_PE_PCREL => Some((hdr_avma + 4).wrapping_add(value)),
        _ => None,
    }
}

/// One thread's unwinder: its copy of the module set, its caches and its
/// previous walk.
pub struct ThreadUnwinder {
    steps: Steps,
    walker: Walker,
    gen: u64,
    /// The top (highest address, exclusive) of the thread's stack: the
    /// unwinder reads only between the stack pointer and this.
    stack_top: u64,
}

/// What unwinds one frame: the rules and their sources.
struct Steps {
    unwinder: Unw,
    cfis: Vec<Arc<Cfi>>,
    rules: RuleCache,
    /// gimli's CFI evaluation state, kept to avoid allocating per miss.
    ctx: Box<Context>,
    /// framehop's rule cache, for the frames it unwinds.
    cache: CacheX86_64,
}

/// A stack pointer more than this below the top is not on the thread's own
/// stack (a signal handler on an alternate stack, a coroutine).
const MAX_STACK: u64 = 1 << 30;

impl ThreadUnwinder {
    /// `None` when the thread's stack cannot be found.
    pub fn new() -> Option<ThreadUnwinder> {
        let stack_top = stack_top(current_sp())?;
        let mut t = ThreadUnwinder {
            steps: Steps {
                unwinder: Unw::new(),
                cfis: Vec::new(),
                rules: RuleCache::new(),
                ctx: Box::new(Context::new()),
                cache: CacheX86_64::new(),
            },
            walker: Walker::new(),
            gen: u64::MAX,
            stack_top,
        };
        t.sync();
        Some(t)
    }

    fn sync(&mut self) {
        let g = GEN.load(Ordering::Acquire);
        if g == self.gen {
            return;
        }
        if g == 0 {
            refresh();
        }
        if let Some(m) = crate::platform::spin::lock_unparked(&MASTER).as_ref() {
            self.steps.unwinder = m.unwinder.clone();
            self.steps.cfis = m.cfis.clone();
        }
        self.steps.rules.clear();
        self.walker.forget();
        self.gen = GEN.load(Ordering::Acquire);
    }

    /// Writes up to `depth` return addresses into `out`; returns how many,
    /// or `None` when this thread is not on its own stack (a signal
    /// handler on an alternate stack) and the caller should use libgcc.
    #[inline(never)]
    pub fn capture(&mut self, out: &mut [u64], depth: usize, at: Here) -> Option<usize> {
        self.sync();
        let n = self.walk(out, depth, at)?;
        // A walk that ends early outside every known module: a library may
        // have been loaded since the module set was built (a complete walk
        // ends in _start or clone, which are known). Rebuild it and walk again.
        if n > 0 && !self.walker.complete() && self.steps.module(out[n - 1]).is_none() {
            let before = GEN.load(Ordering::Acquire);
            refresh();
            if GEN.load(Ordering::Acquire) != before {
                self.sync();
                return self.walk(out, depth, at);
            }
        }
        Some(n)
    }

    #[inline(always)]
    fn walk(&mut self, out: &mut [u64], depth: usize, at: Here) -> Option<usize> {
        let start = at.regs;
        let top = self.stack_top;
        if start.sp >= top || top - start.sp > MAX_STACK {
            return None;
        }
        let steps = &mut self.steps;
        Some(self.walker.walk(start, top, super::own_range(), depth, out, steps))
    }
}

impl Unwind for Steps {
    #[inline(always)]
    fn step(&mut self, r: Regs, first: bool, reads: &mut Reads) -> Step {
        // A return address's call instruction ends at it: look up the byte
        // before, which is inside the call.
        let lookup = if first { r.ip } else { r.ip - 1 };
        let rule = match self.rules.get(lookup) {
            Some(rule) => rule,
            None => self.miss(lookup),
        };
        match rule {
            Rule::Uncovered if !first => exec(FRAME_POINTER, r, reads),
            Rule::Other | Rule::Uncovered => self.framehop_frame(r, first, reads),
            rule => exec(rule, r, reads),
        }
    }
}

impl Steps {
    fn module(&self, addr: u64) -> Option<&Cfi> {
        module_of(&self.cfis, addr)
    }

    /// The rule for `lookup` from its module's CFI, cached.
    #[inline(never)]
    fn miss(&mut self, lookup: u64) -> Rule {
        let rule = module_of(&self.cfis, lookup).map_or(Rule::Uncovered, |c| c.rule(lookup, &mut self.ctx));
        self.rules.insert(lookup, rule);
        rule
    }

    /// The caller's registers by framehop's rules for the frame `r`.
    #[inline(never)]
    fn framehop_frame(&mut self, r: Regs, first: bool, reads: &mut Reads) -> Step {
        let address = if first {
            FrameAddress::from_instruction_pointer(r.ip)
        } else {
            match FrameAddress::from_return_address(r.ip) {
                Some(a) => a,
                None => return Step::End,
            }
        };
        let mut regs = UnwindRegsX86_64::new(r.ip, r.sp, r.bp);
        let mut read_stack = |addr| reads.read(addr).ok_or(());
        match self.unwinder.unwind_frame(address, &mut regs, &mut self.cache, &mut read_stack) {
            Ok(Some(ip)) => Step::Caller(Regs { ip, sp: regs.sp(), bp: regs.bp() }, Kind::Opaque),
            _ => Step::End,
        }
    }
}

/// The module of `cfis` (sorted by start) whose loaded range holds `addr`.
fn module_of(cfis: &[Arc<Cfi>], addr: u64) -> Option<&Cfi> {
    let i = cfis.partition_point(|c| c.range.0 <= addr);
    let c = cfis.get(i.checked_sub(1)?)?;
    (addr < c.range.1).then_some(&**c)
}

/// The end of the mapping that holds `sp`: the top of this thread's stack.
///
/// Read from /proc/self/maps, not pthread_getattr_np: that function holds a
/// lock of the thread while it allocates, and its allocation lands here.
fn stack_top(sp: u64) -> Option<u64> {
    let maps = crate::platform::sys::read_file(c"/proc/self/maps")?;
    let text = String::from_utf8_lossy(&maps);
    let top = mtrace_format::maps::Mapping::all(&text).find(|m| m.start <= sp && sp < m.end).map(|m| m.end);
    top
}

/// The stack pointer of the caller, roughly: enough to find its mapping.
#[inline(always)]
fn current_sp() -> u64 {
    let sp: u64;
    // SAFETY: reads one register.
    unsafe { std::arch::asm!("mov {0}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    sp
}
