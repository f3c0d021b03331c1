//! The process tree as text, at the top of the report of a run that traced
//! several processes: one line per process, indented under the process
//! that forked it, the program's (reported below it) marked.

use std::io::{self, Write};

use super::words::{plural, thousands};
use crate::report::processes::ProcessNode;

/// Longest command line shown, characters: Chromium's run to kilobytes.
const CMDLINE_SHOWN: usize = 100;

/// Most process lines of the tree in text. A longer run's (a shell loop,
/// `make`, pyenv's shims) shows the processes that matter ([`choose`]) and
/// counts the rest in one line; JSON has every process.
pub const TREE_LINES: usize = 10;

/// Writes the tree `roots` (more than one process in all): every process
/// when there are at most [`TREE_LINES`], else those [`choose`] picks.
pub fn write_tree(roots: &[ProcessNode], w: &mut dyn Write) -> io::Result<()> {
    let mut all = Vec::new();
    flatten(roots, None, &mut all);
    writeln!(w, "Processes traced ({}; the program's, marked *, is reported below):", all.len())?;
    let shown = if all.len() <= TREE_LINES { vec![true; all.len()] } else { choose(&all) };
    let mut at = 0;
    let top: Vec<&ProcessNode> = roots.iter().collect();
    write_level(&top, "", true, &shown, &mut at, w)?;
    let hidden: Vec<&ProcessNode> = all.iter().zip(&shown).filter(|(_, &s)| !s).map(|((p, _), _)| *p).collect();
    if !hidden.is_empty() {
        let (bytes, blocks) = hidden.iter().fold((0, 0), |(b, k), p| (b + p.not_freed_bytes, k + p.not_freed_blocks));
        let left = match blocks {
            0 => "nothing left among them".to_owned(),
            n => format!("{} bytes in {} not freed among them", thousands(bytes), plural(n, "block", "blocks")),
        };
        let odd = hidden.iter().filter(|p| notable(p)).count();
        let odd = match odd {
            0 => String::new(),
            n => format!("; {n} of them killed, not traced, still running or with an allocator mtrace did not see"),
        };
        let more = if hidden.len() == 1 { "process" } else { "processes" };
        let n = thousands(hidden.len() as u64);
        writeln!(w, "  … {n} more {more} ({left}{odd}): the JSON report lists every process")?;
    }
    writeln!(w)
}

/// The tree's nodes in the order they are written, each with its
/// parent's index.
fn flatten<'a>(nodes: &'a [ProcessNode], parent: Option<usize>, out: &mut Vec<(&'a ProcessNode, Option<usize>)>) {
    for p in nodes {
        let at = out.len();
        out.push((p, parent));
        flatten(&p.children, Some(at), out);
    }
}

/// A process the tree should show whatever its length: one that did not
/// end by exit, _exit or exec into a traced program (killed, aborted, no
/// end record, still running), or was not traced, or whose allocators
/// mtrace did not all see.
fn notable(p: &ProcessNode) -> bool {
    let ended = matches!(p.ended_by.as_deref(), Some("exit" | "_exit" | "detach"));
    !ended || p.not_traced.is_some() || p.blind || p.running
}

/// The nodes of `all` (in writing order) to show, [`TREE_LINES`] at
/// most: the program's, then the [`notable`] ones, then those that left
/// the most bytes not freed, each with the processes above it (so that
/// the tree stays a tree); none that ended well and left nothing.
fn choose(all: &[(&ProcessNode, Option<usize>)]) -> Vec<bool> {
    let mut order: Vec<usize> = (0..all.len()).collect();
    let rank = |p: &ProcessNode| (!p.reported, !notable(p), std::cmp::Reverse(p.not_freed_bytes));
    order.sort_by_key(|&i| rank(all[i].0));
    let mut shown = vec![false; all.len()];
    let mut n = 0;
    for i in order {
        let p = all[i].0;
        if !p.reported && !notable(p) && p.not_freed_blocks == 0 {
            continue;
        }
        // It and the processes above it not shown yet.
        let mut path = Vec::new();
        let mut at = Some(i);
        while let Some(k) = at.filter(|&k| !shown[k]) {
            path.push(k);
            at = all[k].1;
        }
        if n + path.len() > TREE_LINES {
            continue;
        }
        n += path.len();
        for k in path {
            shown[k] = true;
        }
    }
    shown
}

/// Writes the shown ones of `nodes` (siblings) under `indent`, each
/// followed by its children; `at` is the writing-order index of
/// `nodes[0]`, and is moved past them and their subtrees.
fn write_level(
    nodes: &[&ProcessNode],
    indent: &str,
    root: bool,
    shown: &[bool],
    at: &mut usize,
    w: &mut dyn Write,
) -> io::Result<()> {
    // Each node's index, and whether it is shown (a hidden one's subtree
    // is hidden too: a shown node's parent is shown).
    let mut idx = Vec::with_capacity(nodes.len());
    for p in nodes {
        idx.push(*at);
        *at += 1 + count(&p.children);
    }
    let visible: Vec<(usize, &ProcessNode)> =
        idx.iter().zip(nodes).filter(|(i, _)| shown[**i]).map(|(i, p)| (*i, *p)).collect();
    for (k, (i, p)) in visible.iter().enumerate() {
        let last = k + 1 == visible.len();
        let branch = match (root, last) {
            (true, _) => "",
            (false, false) => "├─ ",
            (false, true) => "└─ ",
        };
        let mark = if p.reported { "* " } else { "  " };
        writeln!(w, "{mark}{indent}{branch}{}", line(p))?;
        let deeper = match (root, last) {
            (true, _) => indent.to_owned(),
            (false, false) => format!("{indent}│  "),
            (false, true) => format!("{indent}   "),
        };
        let children: Vec<&ProcessNode> = p.children.iter().collect();
        let mut child_at = i + 1;
        write_level(&children, &deeper, false, shown, &mut child_at, w)?;
    }
    Ok(())
}

fn count(nodes: &[ProcessNode]) -> usize {
    nodes.iter().map(|p| 1 + count(&p.children)).sum()
}

/// `PID COMMAND LINE (images): how it ended, calls, what it left`; for a
/// child started past the hooks that wrote no trace, `PID PROGRAM: why`.
fn line(p: &ProcessNode) -> String {
    if let (true, Some(n)) = (p.images.is_empty(), &p.not_traced) {
        let why = n.why.as_deref().unwrap_or("it wrote no trace");
        return format!("{} {}: not traced: {why}", p.pid, n.exec);
    }
    let last = p.images.last();
    let cmd = last.map(|i| shorten(&shell_words::join(&i.cmdline))).unwrap_or_default();
    let mut exes: Vec<&str> = p.images.iter().map(|i| i.exe.as_str()).collect();
    exes.dedup();
    let chain = if exes.len() > 1 { format!(" ({})", exes.join(" → ")) } else { String::new() };
    let ended = match (&p.ended_by, p.exit_status, &p.not_traced) {
        (_, _, Some(n)) => match &n.why {
            Some(why) => format!("exec of {}, not traced: {why}", n.exec),
            None => format!("exec of {}, which wrote no trace", n.exec),
        },
        (Some(how), Some(status), None) => format!("{how} {status}"),
        (Some(how), None, None) if how.starts_with("signal ") => format!("killed by {how}"),
        (Some(how), None, None) => how.clone(),
        (None, _, None) if p.running => "still running (its trace so far)".to_owned(),
        (None, _, None) => "no end record (killed by SIGKILL?)".to_owned(),
    };
    let left = match (p.not_freed_blocks, p.blind) {
        (0, false) => String::from("nothing left"),
        (n, blind) => format!(
            "{} bytes in {} not freed{}",
            thousands(p.not_freed_bytes),
            plural(n, "block", "blocks"),
            if blind { " (of what mtrace saw: not every allocator)" } else { "" }
        ),
    };
    format!("{} {cmd}{chain}: {ended}; {}, {left}", p.pid, plural(p.allocations, "call", "calls"))
}

/// `s` cut to [`CMDLINE_SHOWN`] characters, with an ellipsis.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(CMDLINE_SHOWN) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::processes::{Image, NotTraced};

    fn p(pid: u32, cmd: &[&str], ended: Option<&str>, status: Option<u8>, children: Vec<ProcessNode>) -> ProcessNode {
        ProcessNode {
            pid,
            ppid: 0,
            images: vec![Image {
                exe: format!("/bin/{}", cmd[0]),
                cmdline: cmd.iter().map(|s| s.to_string()).collect(),
                trace: Default::default(),
            }],
            ended_by: ended.map(str::to_owned),
            exit_status: status,
            not_traced: None,
            allocations: 1234,
            not_freed_bytes: 0,
            not_freed_blocks: 0,
            blind: false,
            running: false,
            reported: pid == 1,
            children,
        }
    }

    #[test]
    fn a_tree_as_text() {
        let mut stat = p(4, &["sh", "-c", "busybox true"], Some("exec"), None, vec![]);
        stat.not_traced =
            Some(NotTraced { exec: "busybox".into(), why: Some("/bin/busybox: a static executable".into()) });
        let mut leaky = p(3, &["sort", "a b"], Some("signal 9"), None, vec![]);
        (leaky.not_freed_bytes, leaky.not_freed_blocks) = (4096, 2);
        let tree = vec![p(
            1,
            &["sh", "-c", "x"],
            Some("exit"),
            Some(0),
            vec![p(2, &["seq", "3"], Some("exit"), Some(1), vec![stat]), leaky],
        )];
        let mut out = Vec::new();
        write_tree(&tree, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Processes traced (4; the program's, marked *, is reported below):\n\
             * 1 sh -c x: exit 0; 1,234 calls, nothing left\n\
             \x20 ├─ 2 seq 3: exit 1; 1,234 calls, nothing left\n\
             \x20 │  └─ 4 sh -c 'busybox true': exec of busybox, not traced: /bin/busybox: a static executable; 1,234 calls, nothing left\n\
             \x20 └─ 3 sort 'a b': killed by signal 9; 1,234 calls, 4,096 bytes in 2 blocks not freed\n\n"
        );
    }

    #[test]
    fn a_long_tree_shows_what_matters_and_counts_the_rest() {
        // A shell loop's 30 children: one killed, three that left blocks
        // (one under a child that left nothing), the rest nothing.
        let mut kids: Vec<ProcessNode> = (0..30).map(|i| p(10 + i, &["true"], Some("exit"), Some(0), vec![])).collect();
        (kids[5].ended_by, kids[5].exit_status) = (Some("signal 9".into()), None);
        for (k, bytes) in [(7, 100), (20, 300)] {
            (kids[k].not_freed_bytes, kids[k].not_freed_blocks) = (bytes, 1);
        }
        let mut grandchild = p(99, &["cat"], Some("exit"), Some(0), vec![]);
        (grandchild.not_freed_bytes, grandchild.not_freed_blocks) = (200, 2);
        kids[25].children.push(grandchild);
        let tree = vec![p(1, &["sh", "-c", "loop"], Some("exit"), Some(0), kids)];
        let mut out = Vec::new();
        write_tree(&tree, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Processes traced (32; the program's, marked *, is reported below):\n\
             * 1 sh -c loop: exit 0; 1,234 calls, nothing left\n\
             \x20 ├─ 15 true: killed by signal 9; 1,234 calls, nothing left\n\
             \x20 ├─ 17 true: exit 0; 1,234 calls, 100 bytes in 1 block not freed\n\
             \x20 ├─ 30 true: exit 0; 1,234 calls, 300 bytes in 1 block not freed\n\
             \x20 └─ 35 true: exit 0; 1,234 calls, nothing left\n\
             \x20    └─ 99 cat: exit 0; 1,234 calls, 200 bytes in 2 blocks not freed\n\
             \x20 … 26 more processes (nothing left among them): the JSON report lists every process\n\n"
        );
        // More notable processes than lines: the rest are counted as such.
        let kids: Vec<ProcessNode> = (0..12).map(|i| p(10 + i, &["true"], Some("signal 9"), None, vec![])).collect();
        let tree = vec![p(1, &["sh", "-c", "loop"], Some("exit"), Some(0), kids)];
        let mut out = Vec::new();
        write_tree(&tree, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out.lines().count(), 1 + 10 + 1 + 1, "{out}");
        assert!(out.ends_with(
            "  … 3 more processes (nothing left among them; 3 of them killed, not traced, still running or with an \
             allocator mtrace did not see): the JSON report lists every process\n\n"
        ));
    }
}
