//! `mtrace attach --ptrace` to the same process one attach after another,
//! each with other hooks: a uprobes tracer's closing child removes its
//! probes for a second or more after it detached, and a breakpoints
//! tracer started meanwhile took the probe's breakpoint instruction for
//! the function's first byte. It saw no call (the kernel's removal took
//! its breakpoint out), and put that instruction back at its detach:
//! the program died of SIGTRAP at its next malloc.

mod common;
use common::*;

use std::process::Command;

#[test]
fn one_attach_after_another_sees_every_call_and_leaves_the_program_whole() {
    if !ptrace_hooks().contains(&"uprobes") {
        // ptrace_hooks said why; under CI that is a failure, not a skip.
        assert!(std::env::var_os("CI").is_none(), "uprobes are needed for this test");
        return;
    }
    let dir = scratch("ptrace-again");
    let prog = build("attach_target.c", &dir.join("target"), &["-g", "-O0"]);
    let m = markers("attach_target.c");
    let mut t = AttachTarget::start(&prog);
    for (i, h) in ["uprobes", "breakpoints", "uprobes", "breakpoints"].iter().enumerate() {
        let report = dir.join(format!("{i}-{h}.json"));
        let mut c = Command::new(mtrace());
        c.args(["attach", "--ptrace", "--hooks", h, "--json", "-o"]).arg(&report).arg(t.child.id().to_string());
        let mut a = spawn_until(&mut c, "attached to process");
        let n = 100 + i;
        assert_eq!(t.ask(&format!("leak {n}")), format!("ok leak {n}\n"));
        // SAFETY: kill with our child's pid and a valid signal.
        unsafe { libc::kill(a.id() as i32, libc::SIGTERM) };
        assert!(a.wait().unwrap().success(), "{i} {h}");
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(leaks_in(&r, "attach_target.c"), vec![leak(n as i64, 1, "malloc", "keep", m["window"])], "{i} {h}");
    }
    // Untraced, it goes on allocating and ends as it does natively.
    assert_eq!(t.ask("leak 10"), "ok leak 10\n");
    assert_eq!(t.ask("tmp 10"), "ok tmp 10\n");
    t.ask("quit");
    assert_eq!(t.child.wait().unwrap().code(), Some(3));
}
