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
    /// As the reading process's root sees it: a file of another mount
    /// namespace (a container's) may not be there at all.
    pub path: String,
    /// The file's inode (0: anonymous).
    pub inode: u64,
}

impl Mapping {
    /// The mapping on `line`; `None` for a line that is not one.
    pub fn parse(line: &str) -> Option<Mapping> {
        let mut f = line.split_ascii_whitespace();
        let (range, perms, offset, _dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let (start, end) = range.split_once('-')?;
        let p = perms.as_bytes();
        Some(Mapping {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            read: p.first() == Some(&b'r'),
            write: p.get(1) == Some(&b'w'),
            exec: p.get(2) == Some(&b'x'),
            offset: u64::from_str_radix(offset, 16).ok()?,
            inode: inode.parse().ok()?,
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

    /// Where this process can open the file this mapping of process
    /// `pid` maps, best first: its path when the file there has the
    /// mapping's inode; else `/proc/PID/map_files/START-END`, the kernel's
    /// link to the very file, which reaches into another mount namespace
    /// (a container's, whose files are not under their paths here; opening
    /// it takes CAP_SYS_ADMIN, proc(5)); else the path under the process's
    /// own root, `/proc/PID/root/PATH`, when the file there has the
    /// mapping's inode (the kernel printed the path as the container sees
    /// it: a sidecar with ptrace rights only); then the path all the same.
    pub fn openable(&self, pid: u32) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        let link = format!("/proc/{pid}/map_files/{:x}-{:x}", self.start, self.end);
        let rooted = format!("/proc/{pid}/root{}", self.path);
        let same = |p: &str| std::fs::metadata(p).is_ok_and(|m| m.ino() == self.inode);
        if same(&self.path) {
            vec![self.path.clone(), link]
        } else if same(&rooted) {
            vec![link, rooted]
        } else {
            vec![link, self.path.clone()]
        }
    }
}

/// The RELRO parts of modules among `maps` (sorted by address, as a maps
/// file lists them): a read-only file mapping that ends where a writable
/// mapping of the same file begins (the loader made the start of the
/// data segment read-only after relocating it: `PT_GNU_RELRO`). Vtables
/// live there, which the scan's multipleinheritance heuristic reads; the
/// rest of a module's read-only data matters to no scan.
pub fn relro(maps: &[Mapping]) -> Vec<(u64, u64)> {
    maps.windows(2)
        .filter(|w| {
            let (ro, rw) = (&w[0], &w[1]);
            ro.read && !ro.write && rw.write && ro.end == rw.start && ro.path.starts_with('/') && ro.path == rw.path
        })
        .map(|w| (w[0].start, w[0].end))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Mapping;

    #[test]
    fn a_file_is_opened_at_its_path_only_if_it_is_the_one_mapped() {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let m = Mapping::all(&text).find(Mapping::is_file).unwrap();
        let me = std::process::id();
        let link = format!("/proc/{me}/map_files/{:x}-{:x}", m.start, m.end);
        assert_eq!(m.openable(me), [m.path.clone(), link.clone()]);
        // Another file at that path (a container's, seen from the host):
        // the kernel's link to the one mapped first.
        let other = Mapping { inode: m.inode + 1, ..m.clone() };
        assert_eq!(other.openable(me), [link, m.path.clone()]);
    }

    #[test]
    fn relro_is_the_read_only_part_before_a_files_data() {
        let text = "\
55e0a000-55e0b000 r--p 00000000 08:01 1 /usr/bin/prog
55e0b000-55e0c000 r-xp 00001000 08:01 1 /usr/bin/prog
55e0c000-55e0d000 r--p 00002000 08:01 1 /usr/bin/prog
55e0d000-55e0e000 r--p 00002000 08:01 1 /usr/bin/prog
55e0e000-55e0f000 rw-p 00003000 08:01 1 /usr/bin/prog
55e0f000-55e10000 rw-p 00000000 00:00 0
7f000000-7f001000 r--p 00000000 08:01 2 /usr/lib/libc.so.6
7f001000-7f002000 rw-p 00000000 00:00 0
";
        let maps: Vec<Mapping> = Mapping::all(text).collect();
        assert_eq!(super::relro(&maps), [(0x55e0d000, 0x55e0e000)]);
    }

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
