//! The functions a module's file defines, from its symbol tables: `.dynsym`
//! and `.symtab` (the executable's own allocator is often only in the
//! latter: a program linked with `libtcmalloc_minimal.a` exports nothing,
//! Rust's `_rjem_malloc` is hidden). Read from the file, mapped read-only
//! for the call with the system call (no hook, no descriptor kept), parsed
//! with the `object` crate.

use std::ffi::CStr;

use object::read::elf::ElfFile64;
use object::{Object, ObjectSymbol, SymbolKind};

/// One function the file defines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Its name, without a symbol version.
    pub name: String,
    /// Its file virtual address (runtime address = load bias + this).
    pub vaddr: u64,
    /// Its size, bytes (0: the symbol does not say).
    pub size: u64,
}

/// The functions `path` defines whose names `wanted` accepts, each
/// (name, address) once; `None` when the file cannot be read or is not a
/// 64-bit ELF object of this machine's byte order. Names longer than
/// `longest` bytes are not asked about (a large C++ executable has
/// hundreds of thousands of long ones: this runs in every traced
/// process).
pub fn defined(path: &CStr, longest: usize, wanted: impl Fn(&str) -> bool) -> Option<Vec<Function>> {
    let file = Mapped::open(path)?;
    let elf = ElfFile64::<object::Endianness>::parse(file.bytes()).ok()?;
    let mut out: Vec<Function> = Vec::new();
    for s in elf.dynamic_symbols().chain(elf.symbols()) {
        // Before the name, whose string table a large program's constructor
        // would otherwise read whole: an allocator's entry points are
        // global (or weak) functions.
        if s.is_undefined() || s.is_local() || s.kind() != SymbolKind::Text || s.address() == 0 {
            continue;
        }
        let Ok(bytes) = s.name_bytes() else { continue };
        let bytes = bytes.split(|&b| b == b'@').next().unwrap_or(bytes);
        if bytes.len() > longest {
            continue;
        }
        let Ok(name) = std::str::from_utf8(bytes) else { continue };
        if !wanted(name) || out.iter().any(|f| f.name == name && f.vaddr == s.address()) {
            continue;
        }
        out.push(Function { name: name.to_owned(), vaddr: s.address(), size: s.size() });
    }
    Some(out)
}

/// A file mapped read-only for as long as this lives.
struct Mapped {
    addr: *mut u8,
    len: usize,
}

impl Mapped {
    fn open(path: &CStr) -> Option<Mapped> {
        // SAFETY: a NUL-terminated path; the descriptor is closed below.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        let len = super::sys::file_size(fd).filter(|&n| n > 0);
        let addr = len.and_then(|len| {
            // SAFETY: a new private read-only mapping of the file; no
            // existing memory is touched. The system call, not the mmap
            // hook: this is the tracer's own.
            let p = unsafe {
                libc::syscall(libc::SYS_mmap, 0usize, len, libc::PROT_READ, libc::MAP_PRIVATE, fd as i64, 0usize)
            };
            (p > 0).then_some(p as *mut u8)
        });
        // SAFETY: fd is ours; the mapping outlives it.
        unsafe { libc::close(fd) };
        Some(Mapped { addr: addr?, len: len? })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes until drop.
        unsafe { std::slice::from_raw_parts(self.addr, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, no longer borrowed.
        unsafe { super::sys::unmap(self.addr, self.len) };
    }
}
