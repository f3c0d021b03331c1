//! glibc's MALLOC_TRACE logs, so that users of glibc's `mtrace()` get a
//! drop-in upgrade: `mtrace report LOG` reads them like a trace, and
//! `mtrace PROG LOG` prints glibc's table of them (`crate::output::glibc`).
//!
//! Log lines (glibc 2.36, malloc/mtrace-impl.c): `= Start`, `= End`, and
//! `@ CALLER OP ADDR [SIZE]` where OP is `+` (allocation of SIZE bytes),
//! `-` (free), `<` (the old block of a realloc) and `>` (its new block, of
//! SIZE bytes). CALLER is `path:[0xOFFSET]` (offset in the module), or
//! `path:(symbol+0xOFF)[0xADDR]`, or `[0xADDR]`; numbers are hex.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use mtrace_format::{Family, Header, Module, Segment};
use object::{Object, ObjectSegment};

use crate::books::Block;
use crate::trace::{ModuleSeen, Trace};

/// Where the synthetic load biases of logged modules start: far above any
/// file address, one slot of 2^44 bytes per module.
const BIAS_STEP: u64 = 1 << 44;

/// True when `path` starts like a MALLOC_TRACE log.
pub fn is_log(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else { return false };
    let mut first = String::new();
    let _ = BufReader::new(f).take(256).read_line(&mut first);
    first.starts_with("= Start") || first.starts_with("@ ")
}

/// A problem the glibc script also reports, as it words it.
pub struct Complaint {
    /// The line glibc's script prints.
    pub text: String,
}

/// Lowest PT_LOAD address of an ELF file (0 for PIE, 0x400000 for a
/// classic executable): log offsets are relative to it.
fn image_base(p: &Path) -> u64 {
    let Ok(data) = std::fs::read(p) else { return 0 };
    let Ok(obj) = object::File::parse(&*data) else { return 0 };
    obj.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff
}

fn hex(t: &str) -> Option<u64> {
    u64::from_str_radix(t.trim_start_matches("0x"), 16).ok()
}

/// Reads a MALLOC_TRACE log. `prog` stands for the logged module of the
/// same file name (as glibc's script takes the program from its command line).
pub fn load(path: &Path, prog: Option<&Path>) -> Result<Trace> {
    load_with_complaints(path, prog).map(|(t, _)| t)
}

/// [`load`], and the problems glibc's script would report (a free of an address never allocated, …).
pub fn load_with_complaints(path: &Path, prog: Option<&Path>) -> Result<(Trace, Vec<Complaint>)> {
    let f = std::fs::File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let exe = prog.map_or_else(|| "(glibc MALLOC_TRACE log)".to_owned(), |p| p.display().to_string());
    let header = Header { exe: exe.clone(), cmdline: vec![exe], ..Header::default() };
    let mut t = Trace::new(path, header);
    let mut complaints = Vec::new();
    let mut live = std::collections::HashSet::new();
    let mut pending_old: Option<(u64, u64)> = None;
    let mut next_id = 1u32;
    let mut module_of = std::collections::HashMap::<String, (u64, u64)>::new();
    for (n, line) in BufReader::new(f).lines().enumerate() {
        let n = n as u64 + 1;
        let line = line.with_context(|| format!("{}: read error at line {n}", path.display()))?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with("= End") {
            t.end = Some(mtrace_format::EndReason::Exit(None));
        }
        if words.first() != Some(&"@") || words.len() < 4 {
            continue;
        }
        let (caller, op, addr) = (words[1], words[2], hex(words[3]));
        let Some(addr) = addr else {
            complaints.push(Complaint { text: format!("unreadable address {:?}", words[3]) });
            continue;
        };
        if op != ">" {
            if let Some((old, at)) = pending_old.take() {
                // A `<` without its `>`: realloc(p, 0), a free.
                t.books.free(0, old, at);
            }
        }
        let frame = caller_frame(caller, prog, &mut module_of, &mut t.modules);
        let mut stack = |t: &mut Trace| {
            t.stacks.define(next_id, frame.into_iter().collect(), n);
            next_id += 1;
            t.stacks.canon(next_id - 1)
        };
        match op {
            "+" | ">" => {
                let size = words.get(4).and_then(|w| hex(w)).unwrap_or(0);
                let st = stack(&mut t);
                t.stats.alloc(0, addr, size, st);
                let b = Block { size, stack: st, family: Family::Malloc, time: n, align: 0 };
                if !live.insert(addr) {
                    complaints.push(Complaint { text: format!("+ {addr:#018x} Alloc {n} duplicate") });
                }
                match (op, pending_old.take()) {
                    (">", Some((old, at))) => t.books.realloc(0, old, at, addr, b),
                    _ => t.books.alloc(0, addr, b),
                }
            }
            "-" | "<" => {
                if !live.remove(&addr) {
                    let what = if op == "-" { "Free" } else { "Realloc" };
                    complaints
                        .push(Complaint { text: format!("- {addr:#018x} {what} {n} was never alloc'd {caller}") });
                }
                if op == "-" {
                    t.books.free(0, addr, n);
                    t.stats.free(0, addr);
                } else {
                    pending_old = Some((addr, n));
                }
            }
            _ => complaints.push(Complaint { text: format!("unknown operation {op:?}") }),
        }
        t.records += 1;
        t.last_time = n;
    }
    if let Some((old, at)) = pending_old {
        t.books.free(0, old, at);
    }
    t.books.settle();
    Ok((t, complaints))
}

/// The frame of a logged caller, registering its module under a synthetic
/// bias so that the ordinary symbolizer resolves it.
fn caller_frame(
    caller: &str,
    prog: Option<&Path>,
    module_of: &mut std::collections::HashMap<String, (u64, u64)>,
    modules: &mut Vec<ModuleSeen>,
) -> Option<u64> {
    let open = caller.rfind('[')?;
    let offset = hex(caller[open + 1..].trim_end_matches(']'))?;
    let path = caller[..open].split(":(").next().unwrap_or("").trim_end_matches(':');
    if path.is_empty() {
        return Some(offset);
    }
    let (bias, base) = *module_of.entry(path.to_owned()).or_insert_with(|| {
        let file: PathBuf = match prog {
            Some(p) if Path::new(path).file_name() == p.file_name() => p.to_owned(),
            _ => PathBuf::from(path),
        };
        let file = file.canonicalize().unwrap_or(file);
        let bias = BIAS_STEP * (modules.len() as u64 + 1);
        modules.push(ModuleSeen {
            module: Module {
                path: file.display().to_string(),
                bias,
                build_id: Vec::new(),
                segments: vec![Segment { vaddr: 0, memsz: BIAS_STEP, flags: 5 }],
            },
            time: 0,
        });
        (bias, image_base(&file))
    });
    Some(bias + base + offset)
}
