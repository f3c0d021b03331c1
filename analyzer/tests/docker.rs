//! Containers made by Docker (issue 66): images built `FROM scratch` out
//! of this machine's files (no registry), a container in its own mount,
//! pid and network namespaces, and Docker's default seccomp profile.
//! scripts/test starts the daemon when it is not running.

mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Output};

fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().expect("docker")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Removes the container and the image when the test ends, passed or not.
struct Cleanup(String, String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        docker(&["rm", "-f", &self.0]);
        docker(&["rmi", "-f", &self.1]);
    }
}

/// An image holding `files` ((from here, to in the image)), an empty
/// `/tmp`, and nothing else.
fn image(tag: &str, ctx: &Path, files: &[(&Path, &str)]) {
    for (from, to) in files {
        let at = ctx.join(to.trim_start_matches('/'));
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::copy(from, &at).unwrap();
    }
    std::fs::create_dir_all(ctx.join("tmp")).unwrap();
    std::fs::write(ctx.join("Dockerfile"), "FROM scratch\nCOPY . /\n").unwrap();
    let b = docker(&["build", "-q", "-t", tag, ctx.to_str().unwrap()]);
    assert!(b.status.success(), "docker build: {}", text(&b));
}

#[test]
fn a_docker_container_is_attached_to_from_the_host_and_a_sidecar_and_runs_mtrace_inside() {
    if !docker(&["info"]).status.success() {
        assert!(std::env::var_os("CI").is_none(), "a Docker daemon is needed (scripts/test starts dockerd)");
        eprintln!("skipped: no Docker daemon");
        return;
    }
    let dir = scratch("docker");
    let server = build("container_leaker.c", &dir.join("server"), &["-g", "-O0"]);
    let once = build("other_libc.c", &dir.join("once"), &["-g", "-O0"]);
    let (tick, lost) = (markers("container_leaker.c")["tick"], markers("other_libc.c")["lost"]);
    let tag = format!("mtrace-test:{}", std::process::id());
    let name = format!("mtrace-test-{}", std::process::id());
    let lib = |n: &str| Path::new("/lib/x86_64-linux-gnu").join(n);
    let (c, g, m) = (lib("libc.so.6"), lib("libgcc_s.so.1"), lib("libm.so.6"));
    let ld = Path::new("/lib64/ld-linux-x86-64.so.2");
    // The programs, and what they and mtrace need to run.
    image(
        &tag,
        &dir.join("ctx"),
        &[
            (&server, "/bin/server"),
            (&once, "/bin/once"),
            (&c, "/lib/x86_64-linux-gnu/libc.so.6"),
            (&g, "/lib/x86_64-linux-gnu/libgcc_s.so.1"),
            (&m, "/lib/x86_64-linux-gnu/libm.so.6"),
            (ld, "/lib64/ld-linux-x86-64.so.2"),
        ],
    );
    let _cleanup = Cleanup(name.clone(), tag.clone());
    let r = docker(&["run", "-d", "--name", &name, "--network", "none", &tag, "/bin/server"]);
    assert!(r.status.success(), "docker run: {}", text(&r));
    let pid = text(&docker(&["inspect", "-f", "{{.State.Pid}}", &name])).trim().to_string();
    // mtrace and libmtrace.so, mounted into a container (README's line).
    let bin = mtrace();
    let so = bin.with_file_name("libmtrace.so");
    let mounts = [
        "-v".to_string(),
        format!("{}:/opt/mtrace/mtrace:ro", bin.display()),
        "-v".to_string(),
        format!("{}:/opt/mtrace/libmtrace.so:ro", so.display()),
        "-v".to_string(),
        format!("{}:/out", dir.display()),
    ];
    let json = |f: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
    };

    // From the host: its root has not the library, which comes from memory.
    let out = Command::new(mtrace())
        .args(["attach", "--duration", "2s", "--json", "-o"])
        .arg(dir.join("host.json"))
        .arg(&pid)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("from memory"), "{err}");
    let (bytes, blocks) = lost_at(&json("host.json"), "container_leaker.c", tick);
    assert!(blocks >= 3 && bytes == 100 * blocks, "{blocks} blocks at line {tick}: {err}");

    // From a sidecar that shares only its pid namespace. Docker's default
    // seccomp profile, without CAP_SYS_PTRACE, forbids reading its memory:
    // one line, exit status 2, under either hooks.
    let container = format!("container:{name}");
    let sidecar = |extra: &[&str], args: &[&str]| {
        let mut c = Command::new("docker");
        c.args(["run", "--rm", "--network", "none", "--pid", &container]).args(&mounts).args(extra).arg(&tag);
        c.arg("/opt/mtrace/mtrace").args(args).output().unwrap()
    };
    for hooks in [&[][..], &["--ptrace"][..]] {
        let o = sidecar(&[], &[&["attach"][..], hooks, &["--duration", "1s", "1"]].concat());
        assert_eq!(o.status.code(), Some(2), "{hooks:?}: {}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stderr),
            "mtrace: not permitted to read the memory of process 1 (process_vm_readv refused: a seccomp \
             profile, such as Docker's default without --cap-add SYS_PTRACE)\n",
            "{hooks:?}"
        );
    }
    // With it, both work; the library is the copy the host's attach loaded.
    for (hooks, report) in [(&[][..], "side.json"), (&["--ptrace"][..], "side-ptrace.json")] {
        let args = [&["attach"][..], hooks, &["--duration", "2s", "--json", "-o", &format!("/out/{report}"), "1"]];
        let o = sidecar(&["--cap-add", "SYS_PTRACE"], &args.concat());
        assert!(o.status.success(), "{hooks:?}: {}", text(&o));
        let (bytes, blocks) = lost_at(&json(report), "container_leaker.c", tick);
        assert!(blocks >= 3 && bytes == 100 * blocks, "{hooks:?}: {blocks} blocks at line {tick}: {}", text(&o));
    }
    // Nothing was written into the container's files, and the program
    // runs on.
    assert_eq!(text(&docker(&["diff", &name])), "");
    assert_eq!(text(&docker(&["inspect", "-f", "{{.State.Status}}", &name])).trim(), "running");

    // mtrace run inside a container, the two files mounted: the program's
    // output and status are its own.
    let mut c = Command::new("docker");
    c.args(["run", "--rm", "--network", "none"]).args(&mounts).arg(&tag);
    let o = c.args(["/opt/mtrace/mtrace", "run", "--json", "-o", "/out/run.json", "--", "/bin/once"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ran\n");
    assert_eq!(leaks_in(&json("run.json"), "other_libc.c"), [leak(3000, 1, "malloc", "main", lost)]);
}
