//! The target's loaded modules, from /proc/PID/maps and their ELF files:
//! what the stream's Modules record says of each (load bias, build id,
//! segments), where the interposed functions are, and their unwind tables.

use std::path::Path;

use anyhow::{Context, Result};
use mtrace_format::maps::Mapping;
use mtrace_format::{Family, Module, Segment};
use nix::unistd::Pid;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable, RelocationTarget, SymbolKind};

use crate::funcs::{self, Call};

/// Bytes shared between the modules of a process and its forked children.
#[derive(Clone)]
pub struct Bytes(pub std::sync::Arc<[u8]>);

impl Default for Bytes {
    fn default() -> Bytes {
        Bytes(std::sync::Arc::from(Vec::new()))
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// One loaded ELF file.
pub struct Loaded {
    pub module: Module,
    /// [start, end) of its mappings.
    pub range: (u64, u64),
    /// Interposed functions it defines: (address, call).
    pub funcs: Vec<(u64, Call)>,
    /// The names of those of the malloc family and the C++ operators (not
    /// the mappings, the loader's or `exit`), with their aliases.
    pub allocation_names: Vec<String>,
    /// .eh_frame_hdr and .eh_frame: (file address, bytes).
    pub eh_frame_hdr: Option<(u64, Bytes)>,
    pub eh_frame: Option<(u64, Bytes)>,
    /// .text: (file address, length).
    pub text: Option<(u64, u64)>,
    /// Its references to mtrace's C API (weak, NULL without the preload):
    /// the GOT slots the loader fills with their addresses, and the
    /// function of each (api.rs points them at the tracer's breakpoints).
    pub api_slots: Vec<(u64, funcs::Api)>,
}

/// A mapping of a file in the target.
#[derive(Clone)]
pub struct FileMapping {
    /// [start, end) in the target.
    pub start: u64,
    pub end: u64,
    /// Its offset in the file, bytes.
    pub offset: u64,
    /// Where this process opens the file: the path itself, or for a file
    /// of another mount namespace (a container's) the kernel's link to it
    /// ([`Mapping::openable`]).
    pub open: String,
    /// The path in /proc/PID/maps.
    pub path: String,
}

/// The mappings of files in `pid`, from /proc/PID/maps.
pub fn file_mappings(pid: Pid) -> Result<Vec<FileMapping>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).with_context(|| format!("/proc/{pid}/maps"))?;
    let open = |m: &Mapping| {
        let places = m.openable(pid.as_raw() as u32);
        let first = places.iter().position(|p| *p == m.path || std::fs::File::open(p).is_ok()).unwrap_or(0);
        places.into_iter().nth(first).unwrap_or_default()
    };
    Ok(Mapping::all(&text)
        .filter(Mapping::is_file)
        .map(|m| FileMapping { start: m.start, end: m.end, offset: m.offset, open: open(&m), path: m.path })
        .collect())
}

/// [start, end) of the kernel's mapping `name` (as `[uprobes]`) in `pid`.
pub fn special_mapping(pid: Pid, name: &str) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let found = Mapping::all(&text).find(|m| m.path == name).map(|m| (m.start, m.end));
    found
}

/// Each file among `mappings` ([`file_mappings`]) once: its lowest
/// mapping, with the highest end of any as `end`.
pub fn files(mappings: &[FileMapping]) -> Vec<FileMapping> {
    let mut files: Vec<FileMapping> = Vec::new();
    for m in mappings {
        match files.iter_mut().find(|f| f.path == m.path) {
            Some(f) => {
                if m.start < f.start {
                    (f.start, f.offset) = (m.start, m.offset);
                }
                f.end = f.end.max(m.end);
            }
            None => files.push(m.clone()),
        }
    }
    files
}

/// The modules among `files` ([`files`]), those in `known` (paths with
/// their starts) left out.
pub fn scan(files: &[FileMapping], known: &[(String, u64)]) -> Vec<Loaded> {
    let mut out = Vec::new();
    for FileMapping { path, start, end, offset, open } in files {
        let (start, end, offset) = (*start, *end, *offset);
        if known.iter().any(|(p, s)| p == path && *s == start) {
            continue;
        }
        match load(path, open, start, end, offset) {
            Ok(Some(l)) => out.push(l),
            // Not an ELF file (a mapped data file, a font): nothing to trace.
            Ok(None) => {}
            Err(e) => eprintln!("mtrace: {path}: {e:#}"),
        }
    }
    out
}

/// The ELF file at `path`, opened at `open` (the path, or the kernel's
/// link to a container's file), mapped at [start, end) with its lowest
/// mapping at file offset `off`.
fn load(path: &str, open: &str, start: u64, end: u64, off: u64) -> Result<Option<Loaded>> {
    let data = match std::fs::read(Path::new(open)) {
        Ok(d) => d,
        Err(_) => return Ok(None),
    };
    let Ok(file) = object::File::parse(&*data) else { return Ok(None) };
    if file.format() != object::BinaryFormat::Elf {
        return Ok(None);
    }
    // The load bias: where the segment at the lowest mapping's file offset
    // landed, minus its address in the file.
    let Some(seg) = file.segments().find(|s| s.file_range().0 == off || (off == 0 && s.file_range().0 == 0)) else {
        return Ok(None);
    };
    let bias = start.wrapping_sub(seg.address() & !0xfff);
    let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec).unwrap_or_default();
    let segments =
        file.segments().map(|s| Segment { vaddr: s.address(), memsz: s.size(), flags: segment_flags(&s) }).collect();
    let mut funcs: Vec<(u64, Call)> = Vec::new();
    let mut allocation_names: Vec<String> = Vec::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if sym.is_undefined() || sym.kind() != SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        if let Some(call) = funcs::lookup(name) {
            if !call.mapping()
                && !matches!(call, Call::LoaderState | Call::Exit)
                && !allocation_names.iter().any(|n| n == name)
            {
                allocation_names.push(name.to_owned());
            }
            let at = bias.wrapping_add(sym.address());
            match funcs.iter_mut().find(|f| f.0 == at) {
                Some(f) => f.1 = aliased(f.1, call),
                None => funcs.push((at, call)),
            }
        }
    }
    let section = |name: &str| {
        file.section_by_name(name).and_then(|s| Some((s.address(), Bytes(s.uncompressed_data().ok()?.into()))))
    };
    let text = file.section_by_name(".text").map(|s| (s.address(), s.size()));
    // GLOB_DAT and JUMP_SLOT relocations naming an API function.
    let mut api_slots = Vec::new();
    if let (Some(relocs), Some(dynsym)) = (file.dynamic_relocations(), file.dynamic_symbol_table()) {
        for (offset, r) in relocs {
            let RelocationTarget::Symbol(i) = r.target() else { continue };
            let Ok(sym) = dynsym.symbol_by_index(i) else { continue };
            if let Some(api) = sym.name().ok().and_then(funcs::api) {
                api_slots.push((bias.wrapping_add(offset), api));
            }
        }
    }
    Ok(Some(Loaded {
        module: Module { path: path.to_owned(), bias, build_id, segments },
        range: (start, end),
        funcs,
        allocation_names,
        eh_frame_hdr: section(".eh_frame_hdr"),
        eh_frame: section(".eh_frame"),
        text,
        api_slots,
    }))
}

/// What a breakpoint at a function with two names `first` and `other`
/// (aliases at one address) means: where both are frees of different
/// families (gperftools' and mimalloc's `free` is their `operator
/// delete`), a free whose call does not say which the program meant
/// (`Family::Shared`, never judged mismatched); else the first name's.
fn aliased(first: Call, other: Call) -> Call {
    match (first, other) {
        // What such a free is told depends on the name the program
        // called: not read.
        (Call::Free { family: a, args: m, .. }, Call::Free { family: b, args: n, .. }) if a != b => {
            Call::Free { family: Family::Shared, args: m.max(n), size: None, align: None }
        }
        _ => first,
    }
}

/// ELF p_flags of `s` (PF_X 1, PF_W 2, PF_R 4).
fn segment_flags(s: &object::Segment<'_, '_>) -> u32 {
    match s.flags() {
        object::SegmentFlags::Elf { p_flags, .. } => p_flags.0,
        _ => 0,
    }
}
