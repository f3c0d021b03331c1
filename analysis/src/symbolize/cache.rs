//! Symbolized frames kept on disk between reports, one file per module
//! build: a report of a program whose modules were symbolized before
//! opens none of their debug info (libc's separate debug file alone is
//! 4.2 MB of zlib to inflate, 40 of a small report's 52 ms), as
//! heaptrack_print never does (heaptrack symbolizes while recording).
//!
//! A file is named by the module's build ID (NT_GNU_BUILD_ID) and a
//! fingerprint of what the frames were read from: the binary and debug
//! file found (path, length, modification time), or that none was, and
//! this mtrace's version. So a debug file installed since, a binary
//! stripped in place (its build ID kept), another `--sysroot` or another
//! mtrace each make another file, never a stale frame. Modules without a
//! build ID are not kept.
//!
//! Where: `MTRACE_SYMBOL_CACHE` (a folder; `off`: none), else
//! `$XDG_CACHE_HOME/mtrace/symbols`, else `~/.cache/mtrace/symbols`;
//! folder 0700, files 0600, written whole under a temporary name and
//! renamed (reports running at once each write a whole file). At most
//! [`MAX_FILES`] are kept, the oldest removed. A file that cannot be read
//! is ignored; one that cannot be written is not kept (no message: the
//! report is the same either way).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::Frame;

/// Files kept in the folder at most; writing one more removes the oldest.
pub const MAX_FILES: usize = 1024;

/// This file layout's number (part of every fingerprint).
const LAYOUT: u32 = 1;

/// The folder of the cache, as the environment says (`None`: no cache).
pub fn folder() -> Option<PathBuf> {
    match std::env::var_os(mtrace_format::settings::SYMBOL_CACHE.name()) {
        Some(v) if v == "off" || v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => {
            let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
                Some(x) => PathBuf::from(x),
                None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".cache"),
            };
            Some(base.join("mtrace").join("symbols"))
        }
    }
}

/// The file name for a module of `build_id` whose frames come from
/// `binary` and `debug` (the files found, if any); `None` without a
/// build ID.
pub fn file_name(build_id: &[u8], binary: Option<&Path>, debug: Option<&Path>) -> Option<String> {
    if build_id.is_empty() {
        return None;
    }
    let mut h = Fnv::default();
    h.add(&LAYOUT.to_le_bytes());
    h.add(env!("CARGO_PKG_VERSION").as_bytes());
    for f in [binary, debug] {
        h.add(&[0xff]);
        let Some(p) = f else { continue };
        h.add(p.as_os_str().as_encoded_bytes());
        let meta = std::fs::metadata(p).ok()?;
        let mtime = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH).ok()?;
        h.add(&meta.len().to_le_bytes());
        h.add(&mtime.as_nanos().to_le_bytes());
    }
    Some(format!("{}-{:016x}.json", super::build_id_hex(build_id), h.0))
}

/// 64-bit FNV-1a: a fingerprint that is the same in every build of
/// mtrace (std's hasher is not promised to be).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// One frame as kept: function and file (a string's index + 1, 0 for
/// none), line, inlined.
type StoredFrame = (u32, u32, Option<u32>, bool);

/// One file: its strings once, then per probe offset (the return
/// address's offset in the module, minus one) its frames.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Stored {
    strings: Vec<String>,
    frames: Vec<(u64, Vec<StoredFrame>)>,
}

/// The frames kept in file `name` of `dir`, by probe offset, made for
/// module file `module` (empty when there is no such file or it cannot
/// be read). Their addresses are 0 (set per use).
pub fn read(dir: &Path, name: &str, module: &str) -> HashMap<u64, Vec<Frame>> {
    let Ok(bytes) = std::fs::read(dir.join(name)) else { return HashMap::new() };
    let Ok(s) = serde_json::from_slice::<Stored>(&bytes) else { return HashMap::new() };
    let text = |i: u32| if i == 0 { None } else { s.strings.get(i as usize - 1).cloned() };
    let mut out = HashMap::with_capacity(s.frames.len());
    for (probe, frames) in &s.frames {
        let v = frames
            .iter()
            .map(|&(function, file, line, inlined)| Frame {
                address: 0,
                function: text(function),
                file: text(file),
                line,
                module: module.to_owned(),
                offset: probe.wrapping_add(1),
                inlined,
            })
            .collect();
        out.insert(*probe, v);
    }
    out
}

/// Writes `found` (frames by probe offset) as file `name` of `dir`,
/// replacing it; then removes the oldest files past [`MAX_FILES`]. Errors:
/// the folder or file could not be made or written.
pub fn write(dir: &Path, name: &str, found: &HashMap<u64, Vec<Frame>>) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let mut s = Stored::default();
    let mut index: HashMap<&str, u32> = HashMap::new();
    let mut probes: Vec<&u64> = found.keys().collect();
    probes.sort();
    for p in probes {
        let mut id = |t| intern(t, &mut index, &mut s.strings);
        let frames = found[p].iter().map(|f| (id(&f.function), id(&f.file), f.line, f.inlined)).collect();
        s.frames.push((*p, frames));
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    // Its own temporary name per writer, threads of one process too.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}", std::process::id()));
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    let written = serde_json::to_writer(std::io::BufWriter::new(&mut f), &s).map_err(std::io::Error::other);
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, dir.join(name))) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    trim(dir, MAX_FILES);
    Ok(())
}

/// The index + 1 of `t` in `strings` (added if new), 0 for none.
fn intern<'a>(t: &'a Option<String>, index: &mut HashMap<&'a str, u32>, strings: &mut Vec<String>) -> u32 {
    let Some(t) = t else { return 0 };
    *index.entry(t.as_str()).or_insert_with(|| {
        strings.push(t.clone());
        strings.len() as u32
    })
}

/// Removes the oldest cache files of `dir` beyond `keep`.
fn trim(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if files.len() <= keep {
        return;
    }
    files.sort();
    for (_, p) in &files[..files.len() - keep] {
        let _ = std::fs::remove_file(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: Option<&str>, line: Option<u32>, inlined: bool) -> Frame {
        Frame {
            address: 0,
            function: function.map(str::to_owned),
            file: Some("/src/a.c".into()),
            line,
            module: "prog".into(),
            offset: 0x1235,
            inlined,
        }
    }

    #[test]
    fn frames_come_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut found = HashMap::new();
        found.insert(0x1234, vec![frame(Some("inner"), Some(7), true), frame(Some("outer"), Some(20), false)]);
        found.insert(0x99, vec![Frame { file: None, offset: 0x9a, ..frame(None, None, false) }]);
        write(dir.path(), "ab-1.json", &found).unwrap();
        let back = read(dir.path(), "ab-1.json", "prog");
        assert_eq!(format!("{:?}", sorted(&back)), format!("{:?}", sorted(&found)));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("ab-1.json")).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        // Damaged: nothing, not an error.
        std::fs::write(dir.path().join("ab-1.json"), b"{\"strings\": [").unwrap();
        assert!(read(dir.path(), "ab-1.json", "prog").is_empty());
    }

    fn sorted(m: &HashMap<u64, Vec<Frame>>) -> Vec<(u64, Vec<Frame>)> {
        let mut v: Vec<_> = m.iter().map(|(k, f)| (*k, f.clone())).collect();
        v.sort_by_key(|(k, _)| *k);
        v
    }

    #[test]
    fn the_name_changes_with_the_files_the_frames_came_from() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("prog");
        std::fs::write(&bin, b"one").unwrap();
        let id = [0xab, 0xcd];
        let first = file_name(&id, Some(&bin), None).unwrap();
        assert!(first.starts_with("abcd-"), "{first}");
        assert_eq!(file_name(&id, Some(&bin), None).as_deref(), Some(first.as_str()));
        // A debug file found since.
        let debug = dir.path().join("prog.debug");
        std::fs::write(&debug, b"dwarf").unwrap();
        assert_ne!(file_name(&id, Some(&bin), Some(&debug)).as_deref(), Some(first.as_str()));
        // The binary changed in place (stripped: same build ID).
        std::fs::write(&bin, b"on").unwrap();
        assert_ne!(file_name(&id, Some(&bin), None).as_deref(), Some(first.as_str()));
        // No build ID: not kept.
        assert_eq!(file_name(&[], Some(&bin), None), None);
    }

    #[test]
    fn the_oldest_files_go_past_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5u64 {
            let p = dir.path().join(format!("{i}.json"));
            std::fs::write(&p, b"{}").unwrap();
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i);
            std::fs::File::options().write(true).open(&p).unwrap().set_modified(t).unwrap();
        }
        trim(dir.path(), 3);
        let mut left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        left.sort();
        assert_eq!(left, ["2.json", "3.json", "4.json"]);
    }
}
