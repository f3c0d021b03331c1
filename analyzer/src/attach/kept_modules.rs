//! The modules of a process in a container, kept beside its trace: a
//! container's root is another mount namespace, whose files this machine
//! has not at their paths (or has other files there), and it may be gone
//! by the time the trace is reported. Before the report of an attach (the
//! process still runs), each module the process maps from a file not at
//! its path here is copied through the kernel's link to the very file
//! (`/proc/PID/map_files/…`, `Mapping::openable`) to `TRACE.modules/PATH`
//! (`mtrace_analysis::symbolize::kept_beside`), where every report of
//! the trace looks first (issue 66, item 2). PATH is the path this
//! machine reads in the process's maps, which the ptrace tracer records;
//! the library inside the process records the path as the process sees
//! it, without its root's folder (`/bin/server` for
//! `/srv/root/bin/server`): the copy is found under that path too. A root
//! this machine sees (a chroot into one of its folders, a runtime's overlay
//! mounted on the host) has its modules here at their maps paths, but the
//! library's trace names them by the inside path, where this machine has
//! another file or none: those are kept under the inside path alone.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use mtrace_format::maps::Mapping;

/// Copies the ELF files process `pid` maps that are not at their paths
/// here, or that it sees at other paths (another root), into the folder
/// beside `trace`; the maps paths of those copied (none for a process of
/// this machine's root). A file that cannot be read
/// or written is left out: its frames are then not symbolized, as before.
pub fn keep(pid: u32, trace: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return Vec::new() };
    let dir = mtrace_analysis::symbolize::kept_beside(trace);
    let root = std::fs::read_link(format!("/proc/{pid}/root")).unwrap_or_else(|_| "/".into());
    let mut kept: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for m in Mapping::all(&text).filter(Mapping::is_file) {
        if seen.contains(&m.path) {
            continue;
        }
        seen.push(m.path.clone());
        let from = m.openable(pid);
        let to = dir.join(m.path.trim_start_matches('/'));
        // The path inside, as the library in the process records it.
        let inside = Path::new(&m.path).strip_prefix(&root).ok().map(|p| dir.join(p)).filter(|p| *p != to);
        if from.first() == Some(&m.path) {
            // At its path here: the same file. A root this machine sees
            // (a chroot into one of its folders, a runtime's overlay) still
            // names it otherwise inside, where this machine may have
            // another file or none: kept under that path.
            if let Some(also) = inside {
                if copy_elf(&m.path, &also, &dir).is_ok() {
                    kept.push(m.path);
                }
            }
            continue;
        }
        // (Not the file at its path here: another one.)
        if from.iter().filter(|f| **f != m.path).any(|f| copy_elf(f, &to, &dir).is_ok()) {
            // The path inside: the same file, linked.
            if let Some(also) = inside {
                if also.parent().is_some_and(|p| dirs(p).is_ok()) {
                    let _ = std::fs::hard_link(&to, &also);
                }
            }
            kept.push(m.path);
        }
    }
    kept
}

/// Copies `from` to `to` (0600, its folders made 0700 up to `root`) if it
/// is an ELF file.
fn copy_elf(from: &str, to: &Path, root: &Path) -> std::io::Result<()> {
    let mut src = std::fs::File::open(from)?;
    let mut magic = [0u8; 4];
    src.read_exact(&mut magic)?;
    if &magic != b"\x7fELF" {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    dirs(to.parent().unwrap_or(root))?;
    let mut dst = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(to)?;
    dst.write_all(&magic)?;
    std::io::copy(&mut src, &mut dst)?;
    Ok(())
}

/// Makes folder `dir` and those above it that are missing, 0700.
fn dirs(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}
