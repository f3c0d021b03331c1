//! Finding the files that describe a module: the binary itself (by path, or
//! under `--sysroot`/`--binpath` for traces made elsewhere) and its separate
//! debug information, looked up the way gdb does: by build-id under
//! `/usr/lib/debug/.build-id/xx/yyyy.debug`, then by `.gnu_debuglink` name
//! next to the binary, in its `.debug/` folder and under `/usr/lib/debug`.

use std::fs::File;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

/// Where to look for binaries of a trace made on another machine.
#[derive(Clone, Debug, Default)]
pub struct SearchPaths {
    /// Root under which the target's absolute paths are found.
    pub sysroot: Option<PathBuf>,
    /// Folders searched for a module by file name.
    pub binpath: Vec<PathBuf>,
    /// The modules kept beside the trace ([`kept_beside`]), a root
    /// searched first: a container's files, which are not at their
    /// paths here.
    pub kept: Option<PathBuf>,
}

/// The folder beside `trace` where `mtrace attach` keeps the files of a
/// process's modules that this machine has not at their paths (a
/// container's: another mount namespace), under their paths
/// (`TRACE.modules/usr/lib/libc.so.6`), for the trace's symbols once the
/// container is gone (issue 66).
pub fn kept_beside(trace: &Path) -> PathBuf {
    let mut name = trace.as_os_str().to_owned();
    name.push(".modules");
    PathBuf::from(name)
}

/// A mapped ELF file.
pub struct Mapped(memmap2::Mmap);

impl Mapped {
    /// Maps `p` if it is a regular file: a trace names its modules, and a
    /// damaged one could name a FIFO (open would wait) or a device.
    pub fn open(p: &Path) -> Option<Mapped> {
        std::fs::metadata(p).ok().filter(|m| m.is_file())?;
        let f = File::open(p).ok()?;
        // SAFETY: the map is read-only; a file truncated under us would
        // fault, as it would for any tool reading binaries.
        unsafe { memmap2::Mmap::map(&f) }.ok().map(Mapped)
    }

    /// The file parsed as an object file (ELF), `None` when it is not one.
    pub fn object(&self) -> Option<object::File<'_>> {
        object::File::parse(&*self.0).ok()
    }
}

fn build_id_of(p: &Path) -> Option<Vec<u8>> {
    let m = Mapped::open(p)?;
    let o = m.object()?;
    o.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// True when `p` holds DWARF line or function information.
pub fn has_dwarf(p: &Path) -> bool {
    Mapped::open(p)
        .and_then(|m| m.object().map(|o| o.section_by_name(".debug_info").is_some_and(|s| s.size() > 0)))
        .unwrap_or(false)
}

impl SearchPaths {
    /// Where the binary of module `path` may be, in the order searched:
    /// among the modules kept beside the trace, under `--sysroot`, in each
    /// `--binpath` folder, at its path (none for a path that is not
    /// absolute).
    fn candidates(&self, path: &str) -> Vec<PathBuf> {
        if path.is_empty() || !path.starts_with('/') {
            return Vec::new();
        }
        let mut candidates = Vec::new();
        for root in self.kept.iter().chain(&self.sysroot) {
            candidates.push(root.join(path.trim_start_matches('/')));
        }
        if let Some(name) = Path::new(path).file_name() {
            candidates.extend(self.binpath.iter().map(|d| d.join(name)));
        }
        candidates.push(PathBuf::from(path));
        candidates
    }

    /// The binary of a module: the first candidate path that exists and,
    /// when the trace has a build-id, carries the same one.
    pub fn binary(&self, path: &str, build_id: &[u8]) -> Option<PathBuf> {
        self.candidates(path)
            .into_iter()
            .find(|c| c.is_file() && (build_id.is_empty() || build_id_of(c).as_deref() == Some(build_id)))
    }

    /// Where [`Self::binary`] finds nothing for a module with a build-id:
    /// the first candidate that exists all the same, another build of it
    /// (the program rebuilt, or the library updated, since the trace).
    pub fn other_build(&self, path: &str, build_id: &[u8]) -> Option<PathBuf> {
        if build_id.is_empty() {
            return None;
        }
        self.candidates(path).into_iter().find(|c| c.is_file())
    }

    /// A separate debug file for a module, if one is installed.
    pub fn debug_file(&self, binary: Option<&Path>, build_id: &[u8]) -> Option<PathBuf> {
        let roots: Vec<PathBuf> = self.sysroot.iter().cloned().chain([PathBuf::from("/")]).collect();
        if build_id.len() >= 2 {
            let hex = super::build_id_hex(build_id);
            for r in &roots {
                let p = r.join(format!("usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]));
                if p.is_file() {
                    return Some(p);
                }
            }
        }
        let bin = binary?;
        let m = Mapped::open(bin)?;
        let link = m.object()?.gnu_debuglink().ok().flatten()?.0.to_vec();
        let name = Path::new(std::str::from_utf8(&link).ok()?);
        let dir = bin.parent()?;
        let mut candidates = vec![dir.join(name), dir.join(".debug").join(name)];
        for r in &roots {
            candidates.push(r.join("usr/lib/debug").join(dir.strip_prefix("/").unwrap_or(dir)).join(name));
        }
        candidates.into_iter().find(|c| c.is_file() && c != bin)
    }
}
