//! Redirecting a process's calls to the hooks by rewriting GOT entries.
//!
//! Loaded by `dlopen` into a running process, this library is last in the
//! symbol lookup order, so its exported functions interpose on nothing. The
//! calls the preload would intercept go through each module's Global
//! Offset Table: a `R_X86_64_JUMP_SLOT` relocation (in `DT_JMPREL`, a call
//! through the PLT) or a `R_X86_64_GLOB_DAT` one (in `DT_RELA`: a call with
//! `-fno-plt`, or the function's address taken) names the function, and
//! its slot holds the address it resolved to (System V x86-64 psABI, 5.2).
//! Writing a hook's address into every such slot of every module — libc's
//! own included, whose internal calls to `malloc` go through its PLT — sends
//! those calls to the hook; the old value is kept to put back. Slots in the
//! `PT_GNU_RELRO` range are read-only once relocated: made writable for the
//! write, read-only again after. The loader (`ld-linux`) is left alone: its
//! calls into libc's `malloc` allocate this library's thread-local storage,
//! which the hooks use. A slot is one aligned word, so a thread calling
//! through it meanwhile gets either the old function or the hook.

use crate::platform::modules;

const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;

/// `Elf64_Dyn`, `Elf64_Rela`, `Elf64_Sym` (System V gABI, ELF-64).
#[repr(C)]
#[derive(Clone, Copy)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    _addend: i64,
}

#[repr(C)]
pub struct Sym {
    pub name: u32,
    pub info: u8,
    pub other: u8,
    pub shndx: u16,
    pub value: u64,
    pub size: u64,
}

/// A rewritten slot: where, what it held, which module (by load bias).
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub addr: u64,
    pub old: u64,
    pub bias: u64,
}

/// A module's dynamic relocations, as the loader left them in memory.
struct Dynamic {
    symtab: u64,
    strtab: u64,
    tables: [(u64, u64); 2],
}

/// Reads the `PT_DYNAMIC` entries of a module (pointers already relocated
/// by the loader: it adds the bias to them in place on x86-64).
///
/// # Safety
/// The module at `bias` with `phdrs` is loaded.
unsafe fn dynamic(bias: u64, phdrs: &[libc::Elf64_Phdr]) -> Option<Dynamic> {
    let dyn_ph = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
    let mut at = bias.wrapping_add(dyn_ph.p_vaddr) as *const Dyn;
    let (mut d, mut rela, mut jmprel) = (Dynamic { symtab: 0, strtab: 0, tables: [(0, 0); 2] }, (0, 0), (0, 0));
    let abs = |v: u64| if v < bias { v.wrapping_add(bias) } else { v };
    loop {
        // SAFETY: per the contract, the dynamic array is mapped and ends with DT_NULL.
        let e = unsafe { *at };
        match e.tag {
            DT_NULL => break,
            DT_SYMTAB => d.symtab = abs(e.val),
            DT_STRTAB => d.strtab = abs(e.val),
            DT_RELA => rela.0 = abs(e.val),
            DT_RELASZ => rela.1 = e.val,
            DT_JMPREL => jmprel.0 = abs(e.val),
            DT_PLTRELSZ => jmprel.1 = e.val,
            _ => {}
        }
        // SAFETY: still inside the array (DT_NULL not reached).
        at = unsafe { at.add(1) };
    }
    d.tables = [rela, jmprel];
    (d.symtab != 0 && d.strtab != 0).then_some(d)
}

/// Points every GOT slot of the module at `bias` that names a function at
/// the hook `hook_of(name, value)` chooses from the function's name and
/// the slot's value now (the function it resolved to, or with lazy
/// binding this module's own PLT stub); `None` leaves the slot alone.
/// Returns the slots changed.
///
/// # Safety
/// The module at `bias` with `phdrs` is loaded and stays loaded during the call.
pub unsafe fn redirect(
    bias: u64,
    phdrs: &[libc::Elf64_Phdr],
    mut hook_of: impl FnMut(&[u8], u64) -> Option<u64>,
) -> Vec<Slot> {
    let mut out = Vec::new();
    // SAFETY: per the contract.
    let Some(d) = (unsafe { dynamic(bias, phdrs) }) else { return out };
    let relro = phdrs.iter().find(|p| p.p_type == libc::PT_GNU_RELRO).map(|p| {
        let start = bias.wrapping_add(p.p_vaddr);
        (start, start + p.p_memsz)
    });
    for (table, size) in d.tables {
        if table == 0 {
            continue;
        }
        let n = size as usize / std::mem::size_of::<Rela>();
        // SAFETY: the loader read the same table; it is mapped.
        let relas = unsafe { std::slice::from_raw_parts(table as *const Rela, n) };
        for r in relas {
            let kind = (r.info & 0xffff_ffff) as u32;
            if kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT {
                continue;
            }
            let sym = (r.info >> 32) as usize;
            // SAFETY: the symbol index and its name come from the module's own tables.
            let name = unsafe {
                let s = &*(d.symtab as *const Sym).add(sym);
                std::ffi::CStr::from_ptr((d.strtab + s.name as u64) as *const libc::c_char)
            };
            let addr = bias.wrapping_add(r.offset);
            // SAFETY: the slot is the module's GOT word named by its relocation.
            let now = unsafe { std::ptr::read_volatile(addr as *const u64) };
            let Some(hook) = hook_of(name.to_bytes(), now) else { continue };
            // SAFETY: the slot is the module's GOT word named by its relocation.
            if let Some(old) = unsafe { write_slot(addr, hook, relro) } {
                out.push(Slot { addr, old, bias });
            }
        }
    }
    out
}

/// Writes `value` into the GOT word at `addr` (made writable for the
/// moment if it lies in `relro`); returns what it held.
///
/// # Safety
/// `addr` is an aligned, mapped GOT word of a loaded module.
pub unsafe fn write_slot(addr: u64, value: u64, relro: Option<(u64, u64)>) -> Option<u64> {
    let p = addr as *mut u64;
    let ro = relro.is_some_and(|(a, b)| (a..b).contains(&addr));
    let page = addr & !4095;
    // SAFETY: per the contract; mprotect covers the page holding the word.
    unsafe {
        if ro && libc::mprotect(page as *mut libc::c_void, 4096, libc::PROT_READ | libc::PROT_WRITE) != 0 {
            return None;
        }
        let old = std::ptr::read_volatile(p);
        if old != value {
            std::ptr::write_volatile(p, value);
        }
        if ro {
            libc::mprotect(page as *mut libc::c_void, 4096, libc::PROT_READ);
        }
        Some(old)
    }
}

/// The RELRO range of the module at `bias`, if it is still loaded.
pub fn relro_of(bias: u64) -> Option<Option<(u64, u64)>> {
    let mut found = None;
    modules::each(|_, b, phdrs| {
        if b == bias && found.is_none() {
            found = Some(phdrs.iter().find(|p| p.p_type == libc::PT_GNU_RELRO).map(|p| {
                let start = b.wrapping_add(p.p_vaddr);
                (start, start + p.p_memsz)
            }));
        }
    });
    found
}

/// Points the loader's own allocator pointers at libc's functions while
/// attached. The loader allocates (a thread's dynamic TLS block on its
/// first access to it, among others) through pointers it set to the global
/// scope's `malloc`, `calloc`, `realloc` and `free`; in a non-PIE
/// executable that takes their address, those are its canonical PLT
/// entries, which jump through the very GOT slots the hooks take over. The
/// hooks' own first use of their thread-local state would then allocate
/// through a hook, which needs that state: an endless recursion. `pairs`
/// holds (canonical PLT entry, libc's function); the loader's words equal
/// to an entry are found in its writable and RELRO data.
///
/// # Safety
/// The loader at `bias` with `phdrs` is loaded.
pub unsafe fn loader_allocator(bias: u64, phdrs: &[libc::Elf64_Phdr], pairs: &[(u64, u64)]) -> Vec<Slot> {
    let mut out = Vec::new();
    if pairs.is_empty() {
        return out;
    }
    let relro = phdrs.iter().find(|p| p.p_type == libc::PT_GNU_RELRO).map(|p| {
        let start = bias.wrapping_add(p.p_vaddr);
        (start, start + p.p_memsz)
    });
    for seg in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_W != 0) {
        let start = bias.wrapping_add(seg.p_vaddr).next_multiple_of(8);
        let end = bias.wrapping_add(seg.p_vaddr + seg.p_filesz);
        let mut a = start;
        while a + 8 <= end {
            // SAFETY: inside the loader's mapped data segment.
            let w = unsafe { std::ptr::read_volatile(a as *const u64) };
            if let Some(&(_, real)) = pairs.iter().find(|&&(plt, _)| plt == w) {
                // SAFETY: an aligned word of the loader's data.
                if let Some(old) = unsafe { write_slot(a, real, relro) } {
                    out.push(Slot { addr: a, old, bias });
                }
            }
            a += 8;
        }
    }
    out
}
