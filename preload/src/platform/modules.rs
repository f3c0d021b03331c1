//! The module map: every loaded ELF object as `dl_iterate_phdr` reports it,
//! with its PT_LOAD segments and GNU build-id.

use mtrace_format::{Module, Segment};
use std::ffi::CStr;

const NT_GNU_BUILD_ID: u32 = 3;

/// Calls `f(path, bias, program headers)` for every loaded module, in
/// `dl_iterate_phdr` order (the main executable first, with an empty path).
pub fn each(mut f: impl FnMut(&str, u64, &[libc::Elf64_Phdr])) {
    let mut f: &mut dyn FnMut(&str, u64, &[libc::Elf64_Phdr]) = &mut f;
    // SAFETY: the callback reads the dl_phdr_info it is given during the
    // call and passes it on to `f` by reference.
    unsafe {
        libc::dl_iterate_phdr(Some(trampoline), (&mut f as *mut &mut dyn FnMut(&str, u64, &[libc::Elf64_Phdr])).cast())
    };
}

unsafe extern "C" fn trampoline(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> i32 {
    // SAFETY: dl_iterate_phdr passes a valid info and each()'s closure as data.
    let (info, f) = unsafe { (&*info, &mut *(data as *mut &mut dyn FnMut(&str, u64, &[libc::Elf64_Phdr]))) };
    let path = if info.dlpi_name.is_null() {
        std::borrow::Cow::Borrowed("")
    } else {
        // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy()
    };
    // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    f(&path, info.dlpi_addr, phdrs);
    0
}

/// The bytes of a module's memory at file address `vaddr`.
///
/// # Safety
/// `[bias + vaddr, + len)` lies in a loaded segment of a module that stays
/// loaded while the slice is used (for instance during [`each`]).
pub unsafe fn mapped<'a>(bias: u64, vaddr: u64, len: u64) -> &'a [u8] {
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(bias.wrapping_add(vaddr) as *const u8, len as usize) }
}

/// Lists the loaded modules. The main executable (empty name) gets the path
/// of `/proc/self/exe`.
pub fn list() -> Vec<Module> {
    let mut out: Vec<Module> = Vec::new();
    each(|path, bias, phdrs| {
        let mut segments = Vec::new();
        let mut build_id = Vec::new();
        for ph in phdrs {
            if ph.p_type == libc::PT_LOAD {
                segments.push(Segment { vaddr: ph.p_vaddr, memsz: ph.p_memsz, flags: ph.p_flags });
            } else if ph.p_type == libc::PT_NOTE && build_id.is_empty() {
                // SAFETY: PT_NOTE segments are mapped for the module's lifetime.
                build_id = find_build_id(unsafe { mapped(bias, ph.p_vaddr, ph.p_memsz) }).unwrap_or_default();
            }
        }
        // The vDSO has a name like "linux-vdso.so.1" and no file: keep it,
        // the analyzer shows its frames as module+offset.
        out.push(Module { path: path.to_owned(), bias, build_id, segments });
    });
    if let Some(first) = out.first_mut() {
        if first.path.is_empty() {
            first.path = crate::platform::sys::readlink(c"/proc/self/exe").unwrap_or_default();
        }
    }
    out
}

/// Finds the NT_GNU_BUILD_ID descriptor in a PT_NOTE segment (ELF notes:
/// namesz, descsz, type, then name and descriptor each padded to 4 bytes).
fn find_build_id(mut notes: &[u8]) -> Option<Vec<u8>> {
    let word = |b: &[u8], i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap());
    while notes.len() >= 12 {
        let (namesz, descsz, ty) = (word(notes, 0) as usize, word(notes, 4) as usize, word(notes, 8));
        let name_end = 12 + namesz.next_multiple_of(4);
        let desc_end = name_end + descsz.next_multiple_of(4);
        if desc_end > notes.len() {
            return None;
        }
        if ty == NT_GNU_BUILD_ID && &notes[12..12 + namesz] == b"GNU\0" {
            return Some(notes[name_end..name_end + descsz].to_vec());
        }
        notes = &notes[desc_end..];
    }
    None
}

/// The address range `[start, end)` covered by the module that contains
/// `addr` (used to drop the tracer's own frames from backtraces).
pub fn range_of(addr: usize) -> Option<(usize, usize)> {
    containing(addr).map(|(_, lo, hi)| (lo as usize, hi as usize))
}

/// The loaded module whose segments span `addr`, with that span `[lo, hi)`.
pub fn containing(addr: usize) -> Option<(Module, u64, u64)> {
    list().into_iter().find_map(|m| {
        let (lo, hi) = span(&m)?;
        (lo as usize <= addr && addr < hi as usize).then_some((m, lo, hi))
    })
}

/// The addresses a module's segments cover, [lo, hi).
fn span(m: &Module) -> Option<(u64, u64)> {
    let lo = m.segments.iter().map(|s| m.bias + s.vaddr).min()?;
    let hi = m.segments.iter().map(|s| m.bias + s.vaddr + s.memsz).max()?;
    Some((lo, hi))
}

/// The dynamic loader's mappings, [lo, hi): the module whose file name
/// starts with `ld-` (glibc's `ld-linux-x86-64.so.2`, `ld-linux-aarch64.so.1`).
pub fn loader_range() -> Option<(u64, u64)> {
    list().into_iter().find_map(|m| {
        let name = m.path.rsplit('/').next().unwrap_or_default();
        name.starts_with("ld-").then(|| span(&m)).flatten()
    })
}

/// `(dlpi_adds, dlpi_subs)`: how many objects were ever loaded and
/// unloaded. A change means the module list changed.
pub fn generation() -> (u64, u64) {
    let mut g = (0u64, 0u64);
    // SAFETY: the callback reads the counters of the first entry and stops.
    unsafe { libc::dl_iterate_phdr(Some(gen_callback), (&mut g as *mut (u64, u64)).cast()) };
    g
}

unsafe extern "C" fn gen_callback(info: *mut libc::dl_phdr_info, _size: usize, data: *mut libc::c_void) -> i32 {
    // SAFETY: valid pointers from dl_iterate_phdr and generation().
    unsafe {
        *(data as *mut (u64, u64)) = ((*info).dlpi_adds, (*info).dlpi_subs);
    }
    1
}

/// This library's path, as the loader opened it (`LD_PRELOAD`'s entry,
/// the path `dlopen` was given).
pub fn own_path() -> Option<String> {
    // SAFETY: dladdr fills `info` for an address inside a loaded object;
    // dli_fname is a C string owned by the loader.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(own_path as *const libc::c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned())
    }
}
