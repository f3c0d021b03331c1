//! Processes in containers (issue 66): a root only the process's own mount
//! namespace sees, made as `unshare` and `chroot` make one, holding the
//! program, libc and the loader and nothing else, with `/proc` mounted
//! (as every container runtime mounts it) and an empty `/tmp`.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A container running `prog`: its own pid and mount namespaces, its root
/// a tmpfs mounted at `root` in its namespace only (the host sees an empty
/// folder there), or with `seen`, the folder `root` itself (as a chroot
/// into a folder, or a runtime's overlay mounted on the host). Returns the
/// `unshare` child ([`server_pid`] finds the program's pid).
fn container(prog: &Path, root: &Path, seen: bool) -> Child {
    std::fs::create_dir_all(root).unwrap();
    let r = root.display();
    let own = if seen { String::new() } else { format!("mount -t tmpfs none {r}\n") };
    let script = format!(
        "set -e\n\
         {own}\
         mkdir -p {r}/bin {r}/lib/x86_64-linux-gnu {r}/lib64 {r}/proc {r}/tmp\n\
         cp {} {r}/bin/server\n\
         cp /lib/x86_64-linux-gnu/libc.so.6 {r}/lib/x86_64-linux-gnu/\n\
         cp /lib64/ld-linux-x86-64.so.2 {r}/lib64/\n\
         mount -t proc proc {r}/proc\n\
         exec chroot {r} /bin/server",
        prog.display()
    );
    Command::new("unshare")
        .args(["--pid", "--mount", "--fork", "--propagation", "private", "sh", "-c", &script])
        .spawn()
        .expect("unshare (util-linux)")
}

/// The pid, as the host numbers it, of the program `unshare` child `c`
/// became by exec (its one child), once in its loop; `None` when it does
/// not start.
fn server_pid(c: &Child) -> Option<u32> {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", c.id())).unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            // Past its loader (which holds a descriptor of each library it
            // opens): libc mapped, and asleep between ticks.
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let asleep = stat.rsplit_once(") ").is_some_and(|(_, s)| s.starts_with('S'));
            if comm.trim() == "server" && maps.contains("/libc.so.6") && asleep {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A container running `prog` (see [`container`], `seen` its root's
/// folder) and the program's pid;
/// panics, the container killed, when it does not start.
fn started(prog: &Path, root: &Path, seen: bool) -> (Child, u32) {
    let mut c = container(prog, root, seen);
    match server_pid(&c) {
        Some(pid) => (c, pid),
        None => {
            let _ = c.kill();
            let _ = c.wait();
            panic!("the container's server did not start");
        }
    }
}

/// `mtrace attach [extra] --duration 2s --json -o REPORT --save SAVED PID`
/// of the container's server, which must succeed and report every
/// allocation call of its window at `tick`'s line, 100 bytes each, at
/// least 3 (a tick every 20 ms, but the suite loads both CPUs: 7 blocks in
/// a second were seen under CI). Its stderr, and the bytes and blocks.
fn attach_window(extra: &[&str], pid: u32, report: &Path, saved: &Path, tick: u32, what: &str) -> (String, (u64, u64)) {
    let out = Command::new(mtrace())
        .arg("attach")
        .args(extra)
        .args(["--duration", "2s", "--json", "-o"])
        .arg(report)
        .arg("--save")
        .arg(saved)
        .arg(pid.to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what}: {err}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let (bytes, blocks) = lost_at(&r, "container_leaker.c", tick);
    assert!(blocks >= 3 && bytes == 100 * blocks, "{what}: {blocks} blocks at line {tick}: {err}");
    assert_eq!(r["summary"]["allocations"].as_u64(), Some(blocks), "{what}: {}", r["summary"]);
    (err, (bytes, blocks))
}

#[test]
fn attach_from_outside_reaches_a_container_and_keeps_its_modules_for_later() {
    let dir = scratch("container-attach");
    let prog = build("container_leaker.c", &dir.join("leaker"), &["-g", "-O0"]);
    let tick = markers("container_leaker.c")["tick"];
    let root = dir.join("root");
    for h in ptrace_hooks() {
        let (mut c, pid) = started(&prog, &root, false);
        // Its files are not here: its root is its namespace's.
        assert!(!root.join("bin/server").exists());
        let saved = dir.join(format!("{h}.mtrace"));
        let report = dir.join(format!("{h}.json"));
        // The tracer found libc's malloc through the kernel's link to the
        // container's file (before: no allocation call at all), and the
        // report named the line.
        let (err, (bytes, blocks)) = attach_window(&["--ptrace", "--hooks", h], pid, &report, &saved, tick, h);
        let kept = PathBuf::from(format!("{}.modules", saved.display()));
        assert!(
            err.contains(&format!(
                "modules of the process's own root kept for the trace's symbols in {}",
                kept.display()
            )),
            "{h}: {err}"
        );
        // The container goes, and its tmpfs with it.
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        c.wait().unwrap();
        // The trace's report still has the program's lines, from the files
        // kept beside it.
        let later = report_json(&saved);
        assert_eq!(lost_at(&later, "container_leaker.c", tick), (bytes, blocks), "{h}");
        // (Under the paths the host reads in the process's maps: its root's
        // mount point's.)
        let inside = kept.join(root.strip_prefix("/").unwrap());
        assert!(inside.join("bin/server").is_file(), "{h}");
        assert!(inside.join("lib/x86_64-linux-gnu/libc.so.6").is_file(), "{h}");
        std::fs::remove_dir_all(&kept).unwrap();
        // Without them, the frames are addresses.
        let bare = report_json(&saved);
        assert_eq!(lost_at(&bare, "container_leaker.c", tick), (0, 0), "{h}");
    }
}

/// The files under process `pid`'s root (its `/proc` left out), as the
/// process sees them, with their modification times.
fn files_of_root(pid: u32) -> Vec<(PathBuf, std::time::SystemTime)> {
    fn walk(d: &Path, out: &mut Vec<(PathBuf, std::time::SystemTime)>) {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            out.push((e.path(), m.modified().unwrap()));
            if m.is_dir() && e.file_name() != "proc" {
                walk(&e.path(), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new(&format!("/proc/{pid}/root")), &mut out);
    out.sort();
    out
}

/// The process's open descriptors and what each refers to.
fn descriptors(pid: u32) -> Vec<(String, PathBuf)> {
    let mut out: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read_link(e.path()).unwrap_or_default()))
        .collect();
    out.sort();
    out
}

#[test]
fn the_library_attaches_into_a_container_from_memory_and_leaves_nothing_behind() {
    let dir = scratch("container-preload");
    let prog = build("container_leaker.c", &dir.join("leaker"), &["-g", "-O0"]);
    let tick = markers("container_leaker.c")["tick"];
    let root = dir.join("root");
    let (mut c, pid) = started(&prog, &root, false);
    let files = files_of_root(pid);
    let fds = descriptors(pid);
    // Twice: the second attach uses the copy the first one loaded.
    for i in 0..2 {
        let saved = dir.join(format!("{i}.mtrace"));
        let report = dir.join(format!("{i}.json"));
        let (err, (bytes, blocks)) = attach_window(&[], pid, &report, &saved, tick, &format!("attach {i}"));
        // The host's pid and the container's (the program is its first).
        assert!(
            err.contains(&format!("attached to process {pid}, 1 in its pid namespace")) && err.contains("from memory"),
            "{i}: {err}"
        );
        // Nothing new or changed in its root (its /tmp included), and its
        // descriptors are its own again.
        assert_eq!(files_of_root(pid), files, "{i}");
        assert_eq!(descriptors(pid), fds, "{i}");
        // One copy of the library, in memory.
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let copies = maps.lines().filter(|l| l.ends_with("/memfd:libmtrace.so (deleted)") && l.contains(" 00000000 "));
        assert_eq!(copies.count(), 1, "{i}: {maps}");
        if i == 1 {
            // The container goes; the trace's lines stay, from the files
            // kept beside it (under the paths the library recorded, the
            // container's own).
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            c.wait().unwrap();
            assert_eq!(lost_at(&report_json(&saved), "container_leaker.c", tick), (bytes, blocks));
        }
    }
    // A root this machine sees: its program is here at the path the host
    // reads in the maps, not at /bin/server, the path the library records,
    // where the kept copy is (before: the frames were addresses).
    let seen = dir.join("seen");
    let (mut c, pid) = started(&prog, &seen, true);
    assert!(seen.join("bin/server").is_file());
    let (saved, report) = (dir.join("seen.mtrace"), dir.join("seen.json"));
    let (err, (bytes, blocks)) = attach_window(&[], pid, &report, &saved, tick, "seen root");
    let kept = PathBuf::from(format!("{}.modules", saved.display()));
    assert!(kept.join("bin/server").is_file(), "{err}");
    let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    c.wait().unwrap();
    std::fs::remove_dir_all(&seen).unwrap();
    assert_eq!(lost_at(&report_json(&saved), "container_leaker.c", tick), (bytes, blocks));
}

#[test]
fn a_program_run_under_another_root_keeps_its_output_and_ptrace_traces_it() {
    let dir = scratch("container-run");
    let root = dir.join("root");
    for d in ["bin", "lib/x86_64-linux-gnu", "lib64"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    build("other_libc.c", &root.join("bin/once"), &["-g", "-O0"]);
    std::fs::copy("/lib/x86_64-linux-gnu/libc.so.6", root.join("lib/x86_64-linux-gnu/libc.so.6")).unwrap();
    std::fs::copy("/lib64/ld-linux-x86-64.so.2", root.join("lib64/ld-linux-x86-64.so.2")).unwrap();
    let lost = markers("other_libc.c")["lost"];
    let unshare = Path::new("/usr/bin/unshare");
    let args = ["--mount", "--pid", "--fork", "chroot", root.to_str().unwrap(), "/bin/once"];
    // The preload: chroot's exec leaves libmtrace.so out of LD_PRELOAD (its
    // new root has none), so the loader prints no error into the program's
    // stderr; the tree says why it is not traced and what traces it.
    let (r, out) = run_json(&dir, &["--scan"], unshare, &args);
    let err = String::from_utf8_lossy(&out.stderr);
    // unshare's scan at its exit: one thread, nobody to stop (a helper
    // task could not start there: its children's pid namespace had lost
    // its init, ENOMEM).
    assert_eq!(
        (r["scan"]["threads_stopped"].as_u64(), &r["scan"]["stopped_by_signal"]),
        (Some(1), &serde_json::Value::Null)
    );
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    assert!(!err.contains("ld.so"), "{err}");
    let chroot = &r["processes"][0]["children"][0];
    assert_eq!(chroot["images"][1]["exe"], "/usr/sbin/chroot", "{r}");
    assert_eq!(
        chroot["not_traced"],
        serde_json::json!({"exec": "/bin/once", "why": "not at that path here: run under another root (chroot, a \
            container), which has no libmtrace.so (mtrace run --ptrace traces it)"}),
        "{r}"
    );
    // The tracer from outside reaches it: its own trace has the leak.
    let traces = dir.join("traces");
    let (_, out) = run_json(&dir, &["--ptrace", "--scan", "--trace-dir", traces.to_str().unwrap()], unshare, &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    let once = std::fs::read_dir(&traces)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("once."))
        .expect("a trace of /bin/once");
    // (Its stdout's buffer, 4,096 bytes at puts' line, is still reachable.)
    let r = report_json(&once);
    assert_eq!(lost_at(&r, "other_libc.c", lost), (3000, 1));
    assert_eq!(r["kinds"]["definite"], serde_json::json!({"blocks": 1, "bytes": 3000}), "{}", r["kinds"]);
}
