//! The fast unwinder (x86_64): framehop over each module's DWARF CFI.
//!
//! Why framehop: it caches the unwind rule of every address it has seen
//! (per thread here, so no sharing on the hot path) and parses `.eh_frame`
//! lazily through the `.eh_frame_hdr` index, where libgcc parses CIE and FDE
//! again for every frame of every call.
//!
//! Module data (`.eh_frame_hdr`, and `.eh_frame` up to the end of the
//! segment that holds it) is copied out of the loaded image once, into a
//! master unwinder; threads clone it (modules are reference-counted inside
//! framehop) whenever the master's generation moved. A copy, not a view:
//! a library unloaded by dlclose while another thread unwinds must not
//! leave that thread reading unmapped memory.

use std::sync::atomic::{AtomicU64, Ordering};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};
use parking_lot::Mutex;

type Unw = UnwinderX86_64<Vec<u8>>;
/// A module ready for the unwinder, and its address range.
type Loaded = (Module<Vec<u8>>, (u64, u64));

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
    /// Address ranges of the modules in `unwinder`, sorted by start.
    ranges: Vec<(u64, u64)>,
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
    let dl_gen = crate::modules::generation();
    let mut m = MASTER.lock();
    if m.as_ref().is_some_and(|m| m.dl_gen == dl_gen) {
        return;
    }
    let old = m.take().map(|m| m.modules).unwrap_or_default();
    let modules = loaded_modules(old);
    let mut unwinder = Unw::new();
    let mut ranges = Vec::new();
    for (module, range) in &modules {
        unwinder.add_module(module.clone());
        ranges.push(*range);
    }
    ranges.sort_unstable();
    *m = Some(Master { unwinder, modules, ranges, dl_gen });
    GEN.fetch_add(1, Ordering::Release);
}

/// The loaded modules; those of `old` still mapped at the same range are
/// reused rather than copied again (a dlopen changes one module, not all).
fn loaded_modules(mut old: Vec<Loaded>) -> Vec<Loaded> {
    let mut out = Vec::new();
    crate::modules::each(|name, bias, phdrs| {
        let loads: Vec<(u64, u64)> = phdrs
            .iter()
            .filter(|p| p.p_type == libc::PT_LOAD)
            .map(|p| (bias.wrapping_add(p.p_vaddr), bias.wrapping_add(p.p_vaddr + p.p_memsz)))
            .collect();
        let (Some(lo), Some(hi)) = (loads.iter().map(|r| r.0).min(), loads.iter().map(|r| r.1).max()) else { return };
        // The same path, range and load bias as before: the same module.
        if let Some(i) = old.iter().position(|(m, r)| *r == (lo, hi) && m.base_avma() == bias && m.name() == name) {
            out.push(old.swap_remove(i));
            return;
        }
        let Some(hdr) = phdrs.iter().find(|p| p.p_type == PT_GNU_EH_FRAME) else { return };
        // SAFETY: PT_GNU_EH_FRAME lies in a loaded segment of this module.
        let hdr_bytes = unsafe { crate::modules::mapped(bias, hdr.p_vaddr, hdr.p_memsz) };
        let Some(eh_avma) = eh_frame_address(hdr_bytes, bias.wrapping_add(hdr.p_vaddr)) else { return };
        // .eh_frame ends with a zero terminator somewhere before the end of
        // its segment; framehop finds entries through the header's table.
        let Some(&(_, seg_end)) = loads.iter().find(|r| r.0 <= eh_avma && eh_avma < r.1) else { return };
        // SAFETY: [eh_avma, seg_end) is inside one loaded segment.
        let eh_bytes = unsafe { crate::modules::mapped(bias, eh_avma - bias, seg_end - eh_avma) };
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            eh_frame_hdr_svma: Some(hdr.p_vaddr..hdr.p_vaddr + hdr.p_memsz),
            eh_frame_hdr: Some(hdr_bytes.to_vec()),
            eh_frame_svma: Some(eh_avma - bias..seg_end - bias),
            eh_frame: Some(eh_bytes.to_vec()),
            ..Default::default()
        };
        out.push((Module::new(name.to_owned(), lo..hi, bias, info), (lo, hi)));
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

/// One thread's unwinder: its copy of the module set and its rule cache.
pub struct ThreadUnwinder {
    unwinder: Unw,
    ranges: Vec<(u64, u64)>,
    cache: CacheX86_64,
    gen: u64,
    /// The top (highest address, exclusive) of the thread's stack: the
    /// unwinder reads only between the stack pointer and this.
    stack_top: u64,
}

/// A stack pointer more than this below the top is not on the thread's own
/// stack (a signal handler on an alternate stack, a coroutine).
const MAX_STACK: u64 = 1 << 30;

impl ThreadUnwinder {
    /// `None` when the thread's stack cannot be found.
    pub fn new() -> Option<ThreadUnwinder> {
        let stack_top = stack_top(current_sp())?;
        let mut t = ThreadUnwinder {
            unwinder: Unw::new(),
            ranges: Vec::new(),
            cache: CacheX86_64::new(),
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
        if let Some(m) = MASTER.lock().as_ref() {
            self.unwinder = m.unwinder.clone();
            self.ranges = m.ranges.clone();
        }
        self.gen = GEN.load(Ordering::Acquire);
    }

    fn known(&self, addr: u64) -> bool {
        let i = self.ranges.partition_point(|r| r.0 <= addr);
        i > 0 && addr < self.ranges[i - 1].1
    }

    /// Writes up to `depth` return addresses into `out`; returns how many,
    /// or `None` when this thread is not on its own stack (a signal
    /// handler on an alternate stack) and the caller should use libgcc.
    #[inline(never)]
    pub fn capture(&mut self, out: &mut [u64], depth: usize) -> Option<usize> {
        self.sync();
        let n = self.walk(out, depth)?;
        // A walk that ends outside every known module: a library may have
        // been loaded since the module set was built (a complete walk ends
        // in _start or clone, which are known). Rebuild it and walk again.
        if n > 0 && !self.known(out[n - 1]) {
            let before = GEN.load(Ordering::Acquire);
            refresh();
            if GEN.load(Ordering::Acquire) != before {
                self.sync();
                return self.walk(out, depth);
            }
        }
        Some(n)
    }

    #[inline(always)]
    fn walk(&mut self, out: &mut [u64], depth: usize) -> Option<usize> {
        let (pc, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers; no memory access.
        unsafe {
            std::arch::asm!("lea {0}, [rip]", "mov {1}, rsp", "mov {2}, rbp",
                out(reg) pc, out(reg) sp, out(reg) bp, options(nomem, nostack, preserves_flags));
        }
        let (lo, hi) = (sp, self.stack_top);
        if sp >= hi || hi - sp > MAX_STACK {
            return None;
        }
        let mut read_stack = |addr: u64| {
            if addr >= lo && addr <= hi - 8 && addr.is_multiple_of(8) {
                // SAFETY: an aligned word inside this thread's own stack mapping.
                Ok(unsafe { *(addr as *const u64) })
            } else {
                Err(())
            }
        };
        let mut it = self.unwinder.iter_frames(pc, UnwindRegsX86_64::new(pc, sp, bp), &mut self.cache, &mut read_stack);
        let frames = std::iter::from_fn(|| it.next().ok().flatten().map(|f| f.address()));
        Some(super::collect(out, depth, frames))
    }
}

/// The end of the mapping that holds `sp`: the top of this thread's stack.
///
/// Read from /proc/self/maps, not pthread_getattr_np: that function holds a
/// lock of the thread while it allocates, and its allocation lands here.
fn stack_top(sp: u64) -> Option<u64> {
    let maps = crate::sys::read_file(c"/proc/self/maps")?;
    maps.split(|&b| b == b'\n').find_map(|line| {
        let range = line.split(|&b| b == b' ').next()?;
        let text = std::str::from_utf8(range).ok()?;
        let (lo, hi) = text.split_once('-')?;
        let (lo, hi) = (u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?);
        (lo <= sp && sp < hi).then_some(hi)
    })
}

/// The stack pointer of the caller, roughly: enough to find its mapping.
#[inline(always)]
fn current_sp() -> u64 {
    let sp: u64;
    // SAFETY: reads one register.
    unsafe { std::arch::asm!("mov {0}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    sp
}
