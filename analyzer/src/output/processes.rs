//! The process tree as text, at the top of the report of a run that traced
//! several processes: one line per process, indented under the process
//! that forked it, the program's (reported below it) marked.

use std::io::{self, Write};

use super::words::{plural, thousands};
use crate::report::processes::ProcessNode;

/// Longest command line shown, characters: Chromium's run to kilobytes.
const CMDLINE_SHOWN: usize = 100;

/// Writes the tree `roots` (more than one process in all).
pub fn write_tree(roots: &[ProcessNode], w: &mut dyn Write) -> io::Result<()> {
    let n = count(roots);
    writeln!(w, "Processes traced ({n}; the program's, marked *, is reported below):")?;
    for (i, p) in roots.iter().enumerate() {
        write_node(p, "", i + 1 == roots.len(), true, w)?;
    }
    writeln!(w)
}

fn count(nodes: &[ProcessNode]) -> usize {
    nodes.iter().map(|p| 1 + count(&p.children)).sum()
}

/// One process's line under `indent`, then its children's.
fn write_node(p: &ProcessNode, indent: &str, last: bool, root: bool, w: &mut dyn Write) -> io::Result<()> {
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
    for (i, c) in p.children.iter().enumerate() {
        write_node(c, &deeper, i + 1 == p.children.len(), false, w)?;
    }
    Ok(())
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
}
