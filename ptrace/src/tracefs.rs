//! Uprobe definitions in tracefs (`uprobe_events`, the kernel's
//! Documentation/trace/uprobetracer.rst): one trace event per probed
//! instruction and kind, in a group of this tracer's own
//! (`mtrace_<pid>`), which perf events then count per thread.
//!
//! Why definitions and not perf's `uprobe` PMU: a PMU event is a probe of
//! its own, and closing one waits for the kernel's RCU grace periods under
//! a lock every perf trace event shares (measured here: ~80 ms a close,
//! one after another: 3.8 s for one thread's 44). Per-thread events on a
//! shared definition close at no cost but the last; and a thread's events
//! open in about a millisecond each.

use std::ffi::CString;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use rustc_hash::FxHashMap as HashMap;

/// Where tracefs is, mounting it if it is not (root may).
fn root() -> Result<PathBuf> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("uprobe_events").exists() {
            return Ok(dir.into());
        }
    }
    let dir = "/sys/kernel/tracing";
    nix::mount::mount(Some("nodev"), dir, Some("tracefs"), nix::mount::MsFlags::empty(), None::<&str>)
        .with_context(|| format!("tracefs is not mounted and mounting it at {dir} failed"))?;
    if !Path::new(dir).join("uprobe_events").exists() {
        bail!("the kernel has no uprobe events (CONFIG_UPROBE_EVENTS)");
    }
    // Left mounted: another tracer (ours or perf's) may be using it by
    // the time this one ends; the user is told how to undo it.
    eprintln!("mtrace: mounted tracefs at {dir} for uprobes; it stays mounted (umount {dir} undoes it)");
    Ok(dir.into())
}

/// This tracer's definitions.
pub struct Defs {
    root: PathBuf,
    group: String,
    /// (file, offset, return probe) → (event name, tracepoint id).
    ids: HashMap<(CString, u64, bool), (String, u64)>,
}

impl Defs {
    /// The definitions of a new group; removes those of tracers that died
    /// without removing theirs. Errors: no tracefs or uprobe events, or
    /// no permission to write them (root only).
    pub fn new() -> Result<Defs> {
        let root = root()?;
        let defs = Defs { root, group: format!("mtrace_{}", std::process::id()), ids: HashMap::default() };
        defs.remove_stale();
        // Writable at all? (An empty write does nothing.)
        std::fs::OpenOptions::new()
            .append(true)
            .open(defs.events_file())
            .with_context(|| format!("{} (uprobes need root)", defs.events_file().display()))?;
        Ok(defs)
    }

    fn events_file(&self) -> PathBuf {
        self.root.join("uprobe_events")
    }

    /// The tracepoint id of a probe at `offset` of `path` (a return probe
    /// if `ret`), defined the first time it is asked for.
    pub fn id(&mut self, path: &CString, offset: u64, ret: bool) -> Result<u64> {
        let key = (path.clone(), offset, ret);
        if let Some((_, id)) = self.ids.get(&key) {
            return Ok(*id);
        }
        let name = format!("{}{}", if ret { "r" } else { "p" }, self.ids.len());
        let file = path.to_str().context("a file name that is not UTF-8")?;
        if file.contains(char::is_whitespace) {
            bail!("{file}: a file name with a space cannot be probed through uprobe_events");
        }
        // "p:GROUP/NAME FILE:OFFSET", "r:…" for a return probe.
        let line = format!("{}:{}/{} {}:{:#x}\n", if ret { "r" } else { "p" }, self.group, name, file, offset);
        let mut f = std::fs::OpenOptions::new().append(true).open(self.events_file())?;
        f.write_all(line.as_bytes()).with_context(|| format!("defining {}", line.trim()))?;
        let id_file = self.root.join("events").join(&self.group).join(&name).join("id");
        let id = std::fs::read_to_string(&id_file)
            .with_context(|| id_file.display().to_string())?
            .trim()
            .parse()
            .with_context(|| format!("{}: not a number", id_file.display()))?;
        self.ids.insert(key, (name, id));
        Ok(id)
    }

    /// What removes the definitions, once no event counts them: the file
    /// to write to, and one line per definition.
    pub fn removal(&self) -> (CString, Vec<Vec<u8>>) {
        let file = CString::new(self.events_file().as_os_str().as_encoded_bytes()).unwrap_or_default();
        let lines = self.ids.values().map(|(name, _)| format!("-:{}/{}\n", self.group, name).into_bytes()).collect();
        (file, lines)
    }

    /// Removes the definitions of groups `mtrace_<pid>` whose tracer is
    /// gone (it was killed): nothing counts them any more.
    fn remove_stale(&self) {
        let Ok(dir) = std::fs::read_dir(self.root.join("events")) else { return };
        let mut lines = String::new();
        for e in dir.flatten() {
            let group = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = group.strip_prefix("mtrace_").and_then(|p| p.parse::<u32>().ok()) else { continue };
            if Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            for ev in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                if ev.path().is_dir() {
                    lines.push_str(&format!("-:{}/{}\n", group, ev.file_name().to_string_lossy()));
                }
            }
        }
        if !lines.is_empty() {
            if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(self.events_file()) {
                for l in lines.lines() {
                    let _ = f.write_all(format!("{l}\n").as_bytes());
                }
            }
        }
    }
}
