//! Allocators of the program's own, in its executable: hooked by patching
//! (never deadlocked by the tracer, held where a thread is inside one while
//! it is patched, said so in a forked child's trace), named unseen with why
//! where one cannot be patched, and, where one also hands out blocks through
//! functions of its own, no wrong free called where mtrace cannot judge.

mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
#[test]
fn an_allocator_in_the_executable_is_hooked_by_patching_and_never_deadlocked() {
    let dir = scratch("alloc-own");
    let prog = build("own_malloc.c", &dir.join("own_malloc"), &["-g", "-O0"]);
    let m = markers("own_malloc.c");
    let (r, out) = run_json(&dir, &[], &prog, &[]);
    // Each thread's first event is an mmap made inside the program's malloc
    // with its lock held: a tracer that called the allocator there (to
    // register the thread's exit) made it exit 3, "re-entered".
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "own_malloc: done\n");
    // Its malloc family, defined in the executable, wins over the preload
    // by name: hooked by patching, every block is seen (16 threads x 64
    // blocks of 100,000 bytes, lost with their threads' arrays); the
    // mappings it makes inside its malloc are its own, not the program's.
    assert_eq!(r["allocators"][0]["name"], "malloc");
    assert_eq!(r["allocators"][0]["seen"], true);
    assert_eq!(
        r["allocators"][0]["how"],
        "hooked by patching its entry points (7 functions: malloc, calloc, realloc, free, …)"
    );
    assert_eq!(r["notices"], serde_json::json!([]));
    assert_eq!(lost_at(&r, "own_malloc.c", m["keep"]), (102_400_000, 1024));
    assert_eq!(r["errors"], serde_json::json!([]));
    // The text names it, and warns of nothing.
    let txt = dir.join("report.txt");
    let st = Command::new(mtrace()).arg("run").arg("-o").arg(&txt).arg("--").arg(&prog).output().unwrap();
    assert_eq!(st.status.code(), Some(0), "{}", String::from_utf8_lossy(&st.stderr));
    let text = std::fs::read_to_string(&txt).unwrap();
    let exe = prog.to_str().unwrap();
    assert!(
        text.contains(&format!(
            "\n  allocator:        the program's own malloc in {exe} (hooked by patching its entry points"
        )),
        "{text}"
    );
    assert!(!text.contains("WARNING"), "{text}");
    // Run by a shell: its line in the process tree is a plain one.
    let st = Command::new(mtrace())
        .arg("run")
        .arg("-o")
        .arg(&txt)
        .args(["--", "sh", "-c"])
        .arg(format!("{exe} > /dev/null; true"))
        .output()
        .unwrap();
    assert_eq!(st.status.code(), Some(0), "{}", String::from_utf8_lossy(&st.stderr));
    let text = std::fs::read_to_string(&txt).unwrap();
    let line = text.lines().find(|l| l.contains("─ ") && l.contains(exe)).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(" 102,4"), "{line}");
    assert!(!line.contains("not every allocator"), "{line}");
}

#[test]
fn a_thread_inside_the_allocator_while_it_is_patched_is_held() {
    let dir = scratch("alloc-own-ctor-thread");
    let prog = build("own_malloc.c", &dir.join("own_malloc"), &["-g", "-O0"]);
    let lib = build_lib("ctor_thread.c", &dir.join("libctor_thread.so"));
    let m = markers("own_malloc.c");
    for run in 0..3 {
        let env = [("LD_PRELOAD", lib.to_str().unwrap())];
        let (r, out) = run_json_env(&dir, &env, &[], &prog, &[]);
        assert_eq!(out.status.code(), Some(0), "run {run}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "own_malloc: done\n");
        assert!(String::from_utf8_lossy(&out.stderr).contains("ctor_thread: churned\n"));
        // Blocks the thread made before the jumps are freed after them:
        // no wrong free, and every block of the program's own found.
        assert_eq!(r["errors"], serde_json::json!([]), "run {run}");
        assert_eq!(r["notices"], serde_json::json!([]), "run {run}");
        assert_eq!(r["allocators"][0]["seen"], true, "run {run}");
        assert_eq!(lost_at(&r, "own_malloc.c", m["keep"]), (102_400_000, 1024), "run {run}");
    }
}

#[test]
fn a_forked_child_of_a_patched_executable_says_so_in_its_own_trace() {
    let dir = scratch("alloc-own-fork");
    let prog = build("own_malloc.c", &dir.join("own_malloc"), &["-g", "-O0"]);
    let m = markers("own_malloc.c");
    let kept = dir.join("traces");
    let _ = std::fs::remove_dir_all(&kept);
    std::fs::create_dir_all(&kept).unwrap();
    let (r, out) = run_json(&dir, &["--keep-traces", "--trace-dir", kept.to_str().unwrap()], &prog, &["fork"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "own_malloc: done\n");
    let main = r["pid"].as_u64().unwrap();
    let children: Vec<_> = trace_headers(&kept).into_iter().filter(|(_, h)| h.pid as u64 != main).collect();
    assert_eq!(children.len(), 1, "{children:?}");
    // The child's stream starts with what its parent's constructor
    // patched: its allocator is seen, its 10 blocks found.
    let c = report_json(&children[0].0);
    assert_eq!(c["allocators"][0]["seen"], true, "{}", c["allocators"]);
    assert_eq!(c["notices"], serde_json::json!([]));
    assert_eq!(c["summary"]["allocations"], 10, "{}", c["summary"]);
    let at = c["stacks"].as_array().unwrap().iter().filter(|e| line_in(e, "own_malloc.c") == Some(m["forked"] as u64));
    assert_eq!(at.map(|e| e["blocks"].as_u64().unwrap()).sum::<u64>(), 10, "{}", c["stacks"]);
}

#[test]
fn an_allocator_that_cannot_be_patched_is_named_unseen_with_why() {
    // Built with -pg -mfentry, every function starts with a call to
    // __fentry__: a jump over its first bytes would move a call, whose
    // return address a stopped thread may hold.
    let dir = scratch("alloc-own-pg");
    let prog = build("own_malloc.c", &dir.join("own_malloc_pg"), &["-g", "-O0", "-pg", "-mfentry"]);
    let (r, out) = run_json(&dir, &[], &prog, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "own_malloc: done\n");
    let exe = prog.to_str().unwrap();
    assert_eq!(r["allocators"][0]["seen"], false);
    assert_eq!(
        r["notices"],
        serde_json::json!([
            format!(
                "the program's own malloc in {exe}: its entry points could not be hooked (below); \
                 mtrace does not see the allocations made through it"
            ),
            format!(
                "malloc, calloc, realloc, free, memalign, aligned_alloc, posix_memalign in {exe}: \
                 not hooked (a call among its first 5 bytes); mtrace does not see the calls made to them"
            ),
        ])
    );
    // What it did see: the 1 MiB mappings its malloc made (16 threads x
    // 64 blocks of 100,016 bytes, 10 to a mapping: 103).
    let maps = r["summary"]["allocations"].as_u64().unwrap();
    assert!((102..=104).contains(&maps), "{}", r["summary"]);
    let txt = dir.join("report.txt");
    // In `dir`: the profiled program writes its gmon.out where it runs.
    let st = Command::new(mtrace()).current_dir(&dir).arg("run").arg("-o").arg(&txt).arg("--").arg(&prog).output();
    let st = st.unwrap();
    assert_eq!(st.status.code(), Some(0), "{}", String::from_utf8_lossy(&st.stderr));
    let text = std::fs::read_to_string(&txt).unwrap();
    assert!(text.contains("\n  WARNING: the program's own malloc in "), "{text}");
    assert!(text.contains("\nOf the allocations mtrace saw: "), "{text}");
}

/// The first `n` bytes of function `name` of executable `exe` as its file
/// has them, and as they are in process `pid` now (where `exe` is mapped).
fn code_now_and_in_file(exe: &Path, name: &str, pid: u32, n: usize) -> (Vec<u8>, Vec<u8>) {
    use object::{Object, ObjectSection, ObjectSymbol};
    let data = std::fs::read(exe).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let sym = file.symbols().find(|s| s.name() == Ok(name)).unwrap();
    let section = file.section_by_index(sym.section_index().unwrap()).unwrap();
    let off = (sym.address() - section.address() + section.file_range().unwrap().0) as usize;
    let in_file = data[off..off + n].to_vec();
    // The load bias: the mapping of the file at offset 0.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let exe_s = exe.to_str().unwrap();
    let base = maps
        .lines()
        .find(|l| l.ends_with(exe_s) && l.split_whitespace().nth(2) == Some("00000000"))
        .map(|l| u64::from_str_radix(l.split('-').next().unwrap(), 16).unwrap())
        .unwrap();
    let mut now = vec![0u8; n];
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    mem.read_exact_at(&mut now, base + sym.address()).unwrap();
    (now, in_file)
}

#[test]
fn attaches_to_threads_inside_an_allocator_that_maps_under_its_lock() {
    let dir = scratch("alloc-own-attach");
    let prog = build("own_malloc.c", &dir.join("own_malloc"), &["-g", "-O0"]);
    // Until its standard input closes (60 s at the most): the attaches
    // may take long on a loaded machine.
    let mut child = Command::new(&prog)
        .arg("60")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take();
    std::thread::sleep(Duration::from_millis(300));
    // A thread's first hook after an attach is its mmap, inside the
    // program's malloc: a thread-local reached through __tls_get_addr, a
    // TLS destructor registered or a mutex that parks would call malloc.
    // The executable's malloc family is patched while the attach holds
    // the threads, and put back at the detach.
    for i in 0..12 {
        let r = attach_for(child.id(), "200ms", &dir.join(format!("report{i}.json")), &format!("attach {i}"));
        if r["summary"]["ended_by"] != "detach" {
            // The program ended (CI saw "exit" once): how, and what it said.
            drop(stdin);
            let out = child.wait_with_output().unwrap();
            panic!(
                "attach {i}: ended by {}; the program: {}, {}",
                r["summary"]["ended_by"],
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Four threads allocate and free a block every 100 µs or so:
        // hundreds in 200 ms (the mappings alone, before: a dozen).
        assert!(r["summary"]["allocations"].as_u64().unwrap() > 200, "attach {i}: {}", r["summary"]);
        assert!(r["summary"]["frees"].as_u64().unwrap() > 100, "attach {i}: {}", r["summary"]);
        assert_eq!(r["allocators"][0]["seen"], true, "attach {i}: {}", r["allocators"]);
        assert_eq!(r["errors"], serde_json::json!([]), "attach {i}");
        let (now, in_file) = code_now_and_in_file(&prog, "malloc", child.id(), 8);
        assert_eq!(now, in_file, "attach {i}: malloc's first bytes after the detach");
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "own_malloc: done\n");
}

#[test]
fn frees_an_allocator_of_its_own_may_explain_are_not_called_wrong() {
    // ctests/own_shim.cpp: a new'd block freed by the allocator's own
    // function, its address handed out again by another and freed with
    // free(); then handed out and freed with free() again. mtrace sees the
    // new and the two free() calls only: the block it holds at the address
    // is gone, and it cannot tell. Called a mismatched free (new, free)
    // before: 1 Chromium run in some 65, its browser process's report.
    let dir = scratch("alloc-own-shim");
    let prog = build("own_shim.cpp", &dir.join("own_shim"), &["-g", "-O0"]);
    let exe = prog.display();
    let why = format!(
        "the program's own allocator in {exe} may hand out and take back blocks through functions of its own, \
         which mtrace does not see"
    );
    // The ptrace tracer's breakpoints see the same calls (and say so in
    // the stream as the preload's patch does).
    for (mode, how) in [(None, "hooked by patching"), (Some("--ptrace"), "breakpoints on its malloc family")] {
        let (r, out) = run_json(&dir, &Vec::from_iter(mode), &prog, &[]);
        assert_eq!(out.status.code(), Some(0), "{mode:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "own_shim: done\n");
        assert_eq!(r["allocators"][0]["seen"], true, "{mode:?}: {}", r["allocators"]);
        assert!(r["allocators"][0]["how"].as_str().unwrap().starts_with(how), "{mode:?}: {}", r["allocators"]);
        assert_eq!((&r["summary"]["bad_frees"], &r["summary"]["mismatched_frees"]), (&0.into(), &0.into()));
        assert_eq!(r["errors"], serde_json::json!([]), "{mode:?}");
        // The new'd block and stdout's buffer; not the mapping the
        // allocator makes inside `operator new`'s malloc (under ptrace:
        // 3 calls before).
        assert_eq!(r["summary"]["allocations"], 2, "{mode:?}");
        // Said, with why.
        assert_eq!(
            r["notices"],
            serde_json::json!([
                format!("1 free of an address mtrace had seen freed already is not called a double free: {why}"),
                format!(
                    "1 free by another family than the block's allocation (or told another size) is not called \
                     mismatched: {why}"
                ),
            ]),
            "{mode:?}"
        );
    }
}

#[test]
fn under_ptrace_the_executables_own_calls_to_its_allocator_are_seen() {
    // A PIE calls the malloc it defines directly, not through its PLT: the
    // tracer took such calls for the allocator's own, as glibc's direct
    // calls inside libc.so are, and saw none of own_malloc.c's 1,024
    // blocks (only the mappings, and libc's calls).
    let dir = scratch("alloc-own-ptrace");
    let prog = build("own_malloc.c", &dir.join("own_malloc"), &["-g", "-O0"]);
    let m = markers("own_malloc.c");
    let (r, out) = run_json(&dir, &["--ptrace"], &prog, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "own_malloc: done\n");
    assert_eq!(r["allocators"][0]["how"], "breakpoints on its malloc family");
    assert_eq!(lost_at(&r, "own_malloc.c", m["keep"]), (102_400_000, 1024));
    assert_eq!(r["errors"], serde_json::json!([]));
}
