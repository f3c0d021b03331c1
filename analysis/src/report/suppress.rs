//! Suppressions in LeakSanitizer's format: one `leak:PATTERN` per line
//! (`#` starts a comment). An entry is suppressed when PATTERN matches the
//! function, the file or the module of any of its frames; `*` matches any
//! run of characters, `^` and `$` anchor the start and the end, otherwise
//! the pattern may match anywhere. The same file may name the program's
//! own allocation wrappers, `wrapper:PATTERN` (its `xmalloc`, redis's
//! `zmalloc`): frames they match are folded with the allocator's at the
//! top of a backtrace and never name an entry (`own_code`).

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::Report;

/// One suppression and what it suppressed.
#[derive(Serialize, Debug, Clone)]
pub struct Rule {
    /// The `leak:` line's pattern.
    pub pattern: String,
    /// Entries, blocks and bytes it suppressed.
    pub entries: u64,
    /// Blocks it suppressed.
    pub blocks: i64,
    /// Bytes it suppressed.
    pub bytes: i64,
}

/// A suppressions file as read: its `leak:` rules and its `wrapper:`
/// patterns.
#[derive(Debug, Clone, Default)]
pub struct Suppressions {
    /// The `leak:` lines, in order.
    pub rules: Vec<Rule>,
    /// The `wrapper:` lines' patterns, in order.
    pub wrappers: Vec<String>,
}

/// Reads a suppressions file. Errors: it cannot be read, or a line is
/// neither `leak:PATTERN` nor `wrapper:PATTERN` (valgrind's format is
/// named as such).
pub fn read(path: &std::path::Path) -> Result<Suppressions> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let mut rules = Vec::new();
    let mut wrappers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(p) = line.strip_prefix("wrapper:") {
            wrappers.push(p.trim().to_owned());
            continue;
        }
        let Some(p) = line.strip_prefix("leak:") else {
            if line == "{" || line.starts_with("Memcheck:") || line.starts_with("fun:") {
                bail!(
                    "{}:{}: valgrind's suppression format; mtrace reads LeakSanitizer's: a line \
                     leak:PATTERN per entry, e.g. leak:FUNCTION for a fun:FUNCTION frame",
                    path.display(),
                    n + 1
                );
            }
            bail!("{}:{}: not a leak:PATTERN suppression (nor wrapper:PATTERN): {line:?}", path.display(), n + 1);
        };
        rules.push(Rule { pattern: p.trim().to_owned(), entries: 0, blocks: 0, bytes: 0 });
    }
    Ok(Suppressions { rules, wrappers })
}

/// Whether `pattern` matches frame `f`'s function, file or module, as a
/// suppression's does.
pub fn matches_frame(pattern: &str, f: &crate::symbolize::Frame) -> bool {
    [f.function.as_deref(), f.file.as_deref(), Some(f.module.as_str())]
        .into_iter()
        .flatten()
        .any(|t| matches(pattern, t))
}

/// Glob match with `*`, anchored only where the pattern says `^`/`$`.
pub fn matches(pattern: &str, text: &str) -> bool {
    let anchored_start = pattern.starts_with('^');
    let anchored_end = pattern.ends_with('$') && !pattern.ends_with("\\$");
    let p = pattern.trim_start_matches('^');
    let p = if anchored_end { &p[..p.len() - 1] } else { p };
    let parts: Vec<&str> = p.split('*').collect();
    let mut pos = 0;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            continue;
        }
        let found = if i == 0 && anchored_start {
            text.starts_with(part).then_some(0)
        } else {
            text[pos..].find(part).map(|f| f + pos)
        };
        let Some(at) = found else { return false };
        pos = at + part.len();
    }
    if anchored_end {
        let last = parts.last().copied().unwrap_or("");
        return last.is_empty() || text.ends_with(last) && pos <= text.len();
    }
    true
}

/// Removes the suppressed entries from `r` (and from its kind totals),
/// counting them in `rules`.
pub fn apply(r: &mut Report, rules: &mut [Rule]) {
    r.stacks.retain(|e| {
        let hit = rules.iter_mut().find(|rule| e.frames.iter().any(|f| matches_frame(&rule.pattern, f)));
        let Some(rule) = hit else { return true };
        rule.entries += 1;
        rule.blocks += e.blocks;
        rule.bytes = rule.bytes.saturating_add(e.bytes);
        if let (Some(k), Some(kinds)) = (e.kind, r.kinds.as_mut()) {
            let t = kinds.get_mut(k);
            t.bytes = t.bytes.saturating_sub(e.bytes as u64);
            t.blocks = t.blocks.saturating_sub(e.blocks as u64);
        }
        false
    });
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn patterns() {
        assert!(matches("leak_here", "my_leak_here_fn"));
        assert!(matches("^leak", "leak_here"));
        assert!(!matches("^leak", "my_leak"));
        assert!(matches("here$", "leak_here"));
        assert!(!matches("here$", "here_not"));
        assert!(matches("lib*.so", "libfoo.so.6"));
        assert!(matches("^std::*::allocate$", "std::__new_allocator<int>::allocate"));
        assert!(!matches("zzz", "leak"));
    }
}
