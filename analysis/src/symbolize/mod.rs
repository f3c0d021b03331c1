//! Symbolization: return address → module, function (demangled), file,
//! line, with inlined frames, through the binaries the trace names.

mod cache;
mod debugfile;

use std::collections::HashMap;
use std::path::Path;

pub use debugfile::{kept_beside, Mapped, SearchPaths};

use crate::trace::ModuleSeen;

/// One symbolized frame. A return address yields one frame per level of
/// inlining: the inlined functions first (`inlined: true`), then the
/// function they were inlined into.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Frame {
    /// The return address as recorded (hex in JSON).
    #[serde(serialize_with = "hex")]
    pub address: u64,
    /// The function, demangled (the inlined one for an inlined frame).
    pub function: Option<String>,
    /// The source file.
    pub file: Option<String>,
    /// The line.
    pub line: Option<u32>,
    /// File name of the module, or `?` when no module covers the address.
    pub module: String,
    /// Offset of the address in the module's own numbering (file vaddr).
    #[serde(serialize_with = "hex")]
    pub offset: u64,
    /// Inlined into the frame after it (same address).
    pub inlined: bool,
}

fn hex<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{v:#x}"))
}

struct Loaded {
    /// The binary found, and the file with its DWARF (itself or its
    /// separate debug file).
    paths: (Option<std::path::PathBuf>, Option<std::path::PathBuf>),
    /// Those two opened (DWARF, symbol table), once a frame not in
    /// `found` needs them: with the frames cached on disk none may.
    opened: Option<(Option<addr2line::Loader>, Option<addr2line::Loader>)>,
    /// Frames found before, by probe offset (their `address` is set per
    /// call): backtraces share most of their frames, and a lookup with its
    /// demangling is far slower than this map (cc1plus's report asks for
    /// 230,000 frames at some 50,000 addresses). Starts with the frames
    /// cached on disk ([`cache`]).
    found: HashMap<u64, Vec<Frame>>,
    /// The module's cache file (`None`: not cached).
    cached: Option<String>,
    /// `found` has frames the cache file does not: it is written again.
    fresh: bool,
    /// No binary of the traced build found, but this file at a place
    /// searched: another build (the program rebuilt since the trace).
    other_build: Option<std::path::PathBuf>,
    /// A frame was asked for in this module.
    used: bool,
}

/// A module traced in one build and found in another: its path, the
/// traced build ID, the file found ([`Symbolizer::other_builds`]).
pub type OtherBuild = (String, Vec<u8>, std::path::PathBuf);

impl Loaded {
    /// The module's files, opened on first use.
    fn files(&mut self) -> &(Option<addr2line::Loader>, Option<addr2line::Loader>) {
        let (bin, dwarf) = &self.paths;
        self.opened.get_or_insert_with(|| {
            let open = |p: &Path| addr2line::Loader::new(p).ok();
            (dwarf.as_deref().and_then(open), bin.as_deref().and_then(open))
        })
    }
}

/// Resolves addresses, caching one parsed object per module, and the
/// frames found on disk ([`cache`]) when it is dropped.
pub struct Symbolizer {
    paths: SearchPaths,
    cache: HashMap<(String, Vec<u8>), Loaded>,
    /// The folder of the frames kept between reports (`None`: not kept).
    disk: Option<std::path::PathBuf>,
}

impl Drop for Symbolizer {
    fn drop(&mut self) {
        let Some(dir) = &self.disk else { return };
        for l in self.cache.values().filter(|l| l.fresh) {
            if let Some(name) = &l.cached {
                let _ = cache::write(dir, name, &l.found);
            }
        }
    }
}

impl Symbolizer {
    /// A symbolizer looking for binaries and debug files as `paths` says,
    /// with the frames kept between reports where the environment says
    /// ([`cache`]: `MTRACE_SYMBOL_CACHE`).
    pub fn new(paths: SearchPaths) -> Symbolizer {
        Symbolizer { paths, cache: HashMap::new(), disk: cache::folder() }
    }

    /// The binary of module `path` with `build_id` (empty: any), where the
    /// search paths find it.
    pub fn binary(&self, path: &str, build_id: &[u8]) -> Option<std::path::PathBuf> {
        self.paths.binary(path, build_id)
    }

    /// Module `path` of `build_id`: its files found, and the frames
    /// cached for them; opened when first needed ([`Loaded::files`]).
    fn loaded(&mut self, path: &str, build_id: &[u8]) -> &mut Loaded {
        let (paths, disk) = (&self.paths, &self.disk);
        self.cache.entry((path.to_owned(), build_id.to_vec())).or_insert_with(|| {
            let bin = paths.binary(path, build_id);
            let dwarf = match &bin {
                Some(b) if debugfile::has_dwarf(b) => Some(b.clone()),
                _ => paths.debug_file(bin.as_deref(), build_id),
            };
            let cached = disk.as_ref().and_then(|_| cache::file_name(build_id, bin.as_deref(), dwarf.as_deref()));
            let found = match (disk, &cached) {
                (Some(dir), Some(name)) => cache::read(dir, name, &module_name(path)),
                _ => HashMap::new(),
            };
            Loaded {
                other_build: if bin.is_none() { paths.other_build(path, build_id) } else { None },
                paths: (bin, dwarf),
                opened: None,
                found,
                cached,
                fresh: false,
                used: false,
            }
        })
    }

    /// The modules some frame was asked for whose binary was not found in
    /// the build the trace names (by its NT_GNU_BUILD_ID) while another
    /// build of it was: (the module's path and build ID, the file found),
    /// sorted. Their frames are module+offset only: symbols of another
    /// build would be wrong ones.
    pub fn other_builds(&self) -> Vec<OtherBuild> {
        let mut v: Vec<_> = self
            .cache
            .iter()
            .filter(|(_, l)| l.used)
            .filter_map(|((path, id), l)| Some((path.clone(), id.clone(), l.other_build.clone()?)))
            .collect();
        v.sort();
        v
    }

    /// Opens (and decompresses) the debug info of `modules` ahead of use,
    /// one after the other until `stop` is set.
    pub fn open_modules(&mut self, modules: &[mtrace_format::Module], stop: &std::sync::atomic::AtomicBool) {
        for m in modules {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            // The tracer's own library: no recorded frame is in it (walks
            // start at the hook's caller), and its debug info, with all the
            // crates it links, is the largest to open. Only the warm-up
            // skips it: a frame there would still be symbolized on demand.
            if Path::new(&m.path).file_name().is_some_and(|n| n.to_string_lossy().starts_with("libmtrace")) {
                continue;
            }
            // A module with frames cached is not opened ahead: the frames
            // of a report of the same program most likely all are (a
            // frame that is not opens it then).
            let l = self.loaded(&m.path, &m.build_id);
            if l.found.is_empty() {
                l.files();
            }
        }
    }

    /// Symbolizes return address `addr` of a backtrace defined at `time`
    /// (ns), using the module mapped at that address then. Never fails: what
    /// cannot be resolved is reported as module+offset.
    pub fn frames(&mut self, modules: &[ModuleSeen], addr: u64, time: u64) -> Vec<Frame> {
        let Some(m) = module_at(modules, addr, time) else {
            return vec![Frame {
                address: addr,
                function: None,
                file: None,
                line: None,
                module: "?".into(),
                offset: addr,
                inlined: false,
            }];
        };
        let offset = addr.wrapping_sub(m.bias);
        // A return address points after the call; the call is one byte before.
        let probe = offset.wrapping_sub(1);
        let loaded = self.loaded(&m.path, &m.build_id);
        loaded.used = true;
        if let Some(found) = loaded.found.get(&probe) {
            return found.iter().map(|f| Frame { address: addr, ..f.clone() }).collect();
        }
        let base = Frame {
            address: addr,
            function: None,
            file: None,
            line: None,
            module: module_name(&m.path),
            offset,
            inlined: false,
        };
        let mut out = Vec::new();
        loaded.fresh = true;
        let (dwarf, binary) = loaded.files();
        if let Some(d) = dwarf {
            if let Ok(mut it) = d.find_frames(probe) {
                while let Ok(Some(f)) = it.next() {
                    let mut fr = base.clone();
                    fr.function = f.function.as_ref().and_then(|n| n.demangle().ok()).map(|c| c.into_owned());
                    if let Some(loc) = f.location {
                        fr.file = loc.file.map(str::to_owned);
                        fr.line = loc.line;
                    }
                    fr.inlined = true;
                    out.push(fr);
                }
            }
        }
        if let Some(last) = out.last_mut() {
            last.inlined = false;
        } else {
            out.push(base);
        }
        // No function from DWARF: fall back to the symbol tables.
        if out.last().is_some_and(|f| f.function.is_none()) {
            let sym = [dwarf, binary].into_iter().flatten().find_map(|l| l.find_symbol(probe));
            if let Some(s) = sym {
                out.last_mut().expect("non-empty").function =
                    Some(addr2line::demangle_auto(s.into(), None).into_owned());
            }
        }
        loaded.found.insert(probe, out.clone());
        out
    }
}

/// The name frames give module `path`: its file name.
fn module_name(path: &str) -> String {
    Path::new(path).file_name().map_or_else(|| path.to_owned(), |n| n.to_string_lossy().into_owned())
}

/// A build ID (NT_GNU_BUILD_ID's bytes) as lowercase hex, as
/// `/usr/lib/debug/.build-id/` and pprof name it.
pub fn build_id_hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The module covering `addr`; when several did over time (a library
/// unloaded and another loaded in its place), the latest one recorded no
/// later than `time`, else the earliest.
pub(crate) fn module_at(modules: &[ModuleSeen], addr: u64, time: u64) -> Option<&mtrace_format::Module> {
    let covering = modules.iter().filter(|s| {
        s.module.segments.iter().any(|seg| {
            let lo = s.module.bias.wrapping_add(seg.vaddr);
            addr >= lo && addr < lo.wrapping_add(seg.memsz)
        })
    });
    let (before, after): (Vec<&ModuleSeen>, Vec<&ModuleSeen>) = covering.partition(|s| s.time <= time);
    before.into_iter().max_by_key(|s| s.time).or_else(|| after.into_iter().min_by_key(|s| s.time)).map(|s| &s.module)
}
