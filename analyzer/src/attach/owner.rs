//! The attached process's user: the stream's folder and socket become
//! its user's, and a path it asks its reports to go to is written only
//! when that user is ours.

use anyhow::{anyhow, Context, Result};
use std::os::unix::fs::MetadataExt;

/// The process connects to the socket as its own user: when that is not
/// us (we are root), the folder and the socket become its user's, still
/// closed to everybody else (0700, 0600).
pub fn give_to_owner_of(pid: i32, files: &[&std::path::Path]) -> Result<()> {
    let owner = std::fs::metadata(format!("/proc/{pid}")).map_err(|e| anyhow!("process {pid}: {e}"))?;
    if owner.uid() == nix::unistd::geteuid().as_raw() {
        return Ok(());
    }
    for p in files {
        std::os::unix::fs::chown(p, Some(owner.uid()), Some(owner.gid()))
            .with_context(|| format!("{}: cannot give it to the process's user", p.display()))?;
    }
    Ok(())
}

/// Process `pid` runs as our effective user: its real, effective, saved
/// and file system users all are (/proc/PID/status, proc(5)), so a path
/// it asks its reports to go to is one it could write itself. Not the
/// owner of /proc/PID, which is root for a process that is not dumpable.
pub fn runs_as_us(pid: i32) -> bool {
    let us = nix::unistd::geteuid().as_raw().to_string();
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines().find_map(|l| l.strip_prefix("Uid:")).is_some_and(|ids| ids.split_whitespace().all(|id| id == us))
    })
}
