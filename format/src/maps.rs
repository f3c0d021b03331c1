//! One line of `/proc/PID/maps` (proc(5)), parsed once for the preload's
//! snapshot and unwinder, `mtrace attach` and the ptrace tracer.
//!
//! A line: `START-END PERMS OFFSET DEV INODE [PATH]`, addresses and offset
//! in hex; PATH may hold spaces, and ends in ` (deleted)` for a file that
//! is gone; kernel mappings have names in brackets (`[stack]`, `[vdso]`).

/// A mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `r`.
    pub read: bool,
    /// `w`.
    pub write: bool,
    /// `x`.
    pub exec: bool,
    /// Offset in the file mapped, bytes.
    pub offset: u64,
    /// The file's path, a kernel mapping's `[name]`, or empty (anonymous).
    pub path: String,
}

impl Mapping {
    /// The mapping on `line`; `None` for a line that is not one.
    pub fn parse(line: &str) -> Option<Mapping> {
        let mut f = line.split_ascii_whitespace();
        let (range, perms, offset, _dev, _inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let (start, end) = range.split_once('-')?;
        let p = perms.as_bytes();
        Some(Mapping {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            read: p.first() == Some(&b'r'),
            write: p.get(1) == Some(&b'w'),
            exec: p.get(2) == Some(&b'x'),
            offset: u64::from_str_radix(offset, 16).ok()?,
            path: f.collect::<Vec<_>>().join(" "),
        })
    }

    /// Every mapping of a whole maps file's `text`.
    pub fn all(text: &str) -> impl Iterator<Item = Mapping> + '_ {
        text.lines().filter_map(Mapping::parse)
    }

    /// A mapping of a file that is still there (a path, not ` (deleted)`).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/') && !self.path.ends_with(" (deleted)")
    }
}

#[cfg(test)]
mod tests {
    use super::Mapping;

    #[test]
    fn lines_of_every_kind() {
        let m = Mapping::parse("7f12a000-7f12b000 r-xp 00002000 fe:00 1234    /usr/lib/my lib.so").unwrap();
        assert_eq!(
            (m.start, m.end, m.read, m.write, m.exec, m.offset),
            (0x7f12a000, 0x7f12b000, true, false, true, 0x2000)
        );
        assert_eq!(m.path, "/usr/lib/my lib.so");
        assert!(m.is_file());
        let anon = Mapping::parse("5600-5700 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!((anon.write, anon.path.as_str(), anon.is_file()), (true, "", false));
        assert_eq!(Mapping::parse("7ffc-7ffd rw-p 00000000 00:00 0   [stack]").unwrap().path, "[stack]");
        assert!(!Mapping::parse("1-2 r--p 0 fe:00 9 /gone (deleted)").unwrap().is_file());
        assert_eq!(Mapping::parse("garbage"), None);
        assert_eq!(Mapping::all("1-2 r--p 0 0:0 0\nnot a line\n3-4 rw-p 0 0:0 0\n").count(), 2);
    }
}
