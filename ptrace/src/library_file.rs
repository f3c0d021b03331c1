//! What `mtrace attach` reads of a library's file before it loads it into
//! a process: the libraries it needs (`DT_NEEDED`), whether the process's
//! libc defines every symbol version it needs, and the bytes the dynamic
//! loader reads (for a copy in memory).

use std::path::Path;

use anyhow::{anyhow, bail, Result};

/// `lib`'s `DT_NEEDED` entries (its sonames), but for libc and the
/// dynamic loader, which every process it can join has. Errors: `lib`
/// cannot be read, or is no 64-bit ELF file.
pub fn needed(lib: &Path) -> Result<Vec<String>> {
    use object::read::elf::{Dyn, FileHeader, SectionHeader};
    let data = std::fs::read(lib).map_err(|e| anyhow!("{}: {e}", lib.display()))?;
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&*data)?;
    let endian = header.endian()?;
    let sections = header.sections(endian, &*data)?;
    let mut out = Vec::new();
    for s in sections.iter() {
        let Some((entries, link)) = s.dynamic(endian, &*data)? else { continue };
        let strings = sections.strings(endian, &*data, link)?;
        for d in entries {
            if d.tag(endian) == object::elf::DT_NEEDED {
                let name = d.string(endian, strings)?;
                out.push(String::from_utf8_lossy(name).into_owned());
            }
        }
    }
    out.retain(|n| !n.starts_with("libc.so") && !n.starts_with("ld-linux"));
    Ok(out)
}

/// Refuses, in one line naming `--ptrace`, a process whose libc is older
/// than the one `lib` was built for: a symbol version `lib` needs from
/// libc (`.gnu.version_r`) that the process's libc does not define
/// (`libc_versions`, from its `.gnu.version_d`: `inspect::Target`'s),
/// where its `dlopen` would fail with "version `GLIBC_2.34' not found".
/// Errors: that, or `lib` unreadable.
pub fn check_versions(pid: i32, lib: &Path, libc_versions: &[String]) -> Result<()> {
    let data = std::fs::read(lib).map_err(|e| anyhow!("{}: {e}", lib.display()))?;
    let lacking = lacking(&versions(&data)?.needed, libc_versions);
    if lacking.is_empty() {
        return Ok(());
    }
    let newest = libc_versions.iter().filter(|v| v.starts_with("GLIBC_2.")).max_by_key(|v| version_key(v));
    bail!(
        "process {pid} runs on an older glibc ({}) than libmtrace.so was built for (it needs {}); mtrace attach \
         --ptrace {pid} traces it from outside",
        newest.map_or("no GLIBC_ versions", |v| v.as_str()),
        lacking.join(", ")
    )
}

/// The versions among `needed` ((library, version) pairs) that a libc
/// defining `defined` lacks.
fn lacking(needed: &[(String, String)], defined: &[String]) -> Vec<String> {
    let mut out: Vec<String> = needed
        .iter()
        .filter(|(file, v)| file.starts_with("libc.so") && !defined.contains(v))
        .map(|(_, v)| v.clone())
        .collect();
    out.sort_by_key(|v| version_key(v));
    out.dedup();
    out
}

/// `GLIBC_2.34` → [2, 34], for ordering.
fn version_key(v: &str) -> Vec<u32> {
    v.trim_start_matches(|c: char| !c.is_ascii_digit()).split('.').filter_map(|n| n.parse().ok()).collect()
}

/// The symbol versions an ELF file defines, and those it needs.
pub(crate) struct Versions {
    pub(crate) defined: Vec<String>,
    /// (library, version) pairs.
    needed: Vec<(String, String)>,
}

/// The symbol versions of ELF file `data`.
pub(crate) fn versions(data: &[u8]) -> Result<Versions> {
    use object::read::elf::FileHeader;
    let header = object::elf::FileHeader64::<object::Endianness>::parse(data)?;
    let endian = header.endian()?;
    let sections = header.sections(endian, data)?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut defined = Vec::new();
    if let Some((mut defs, link)) = sections.gnu_verdef(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        while let Some((_, mut aux)) = defs.next()? {
            if let Some(a) = aux.next()? {
                defined.push(text(a.name(endian, strings)?));
            }
        }
    }
    let mut needed = Vec::new();
    if let Some((mut needs, link)) = sections.gnu_verneed(endian, data)? {
        let strings = sections.strings(endian, data, link)?;
        while let Some((n, mut aux)) = needs.next()? {
            let file = text(n.file(endian, strings)?);
            while let Some(a) = aux.next()? {
                needed.push((file.clone(), text(a.name(endian, strings)?)));
            }
        }
    }
    Ok(Versions { defined, needed })
}

/// What the dynamic loader reads of ELF file `lib`: its bytes up to the
/// end of its last loadable segment, without the section headers (which
/// lie after, with the debug information and the symbol table: 2 MiB of
/// the release libmtrace.so's 26). For a copy in memory
/// (`mtrace attach` into a container), where every byte costs the
/// process RAM. Errors: `lib` cannot be read, or is no 64-bit ELF file.
pub fn loadable_image(lib: &Path) -> Result<Vec<u8>> {
    use object::read::elf::{FileHeader, ProgramHeader};
    let mut data = std::fs::read(lib).map_err(|e| anyhow!("{}: {e}", lib.display()))?;
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&*data)?;
    let endian = header.endian()?;
    let end = header
        .program_headers(endian, &*data)?
        .iter()
        .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
        .map(|p| p.p_offset(endian) + p.p_filesz(endian))
        .max()
        .ok_or_else(|| anyhow!("{}: no loadable segment", lib.display()))?;
    let phdrs_end = header.e_phoff(endian) + u64::from(header.e_phnum(endian)) * 56;
    data.truncate(end.max(phdrs_end) as usize);
    // No section headers any more: e_shoff (at 0x28), e_shnum (0x3c) and
    // e_shstrndx (0x3e) of the ELF64 header say so.
    data[0x28..0x30].fill(0);
    data[0x3c..0x40].fill(0);
    Ok(data)
}

#[cfg(test)]
mod tests {
    #[test]
    fn needs_leave_out_libc_and_the_loader() {
        // This test binary's own needs: libgcc_s.so.1 (Rust's unwinder),
        // libc, the loader; only the first is left.
        let n = super::needed(&std::env::current_exe().unwrap()).unwrap();
        assert_eq!(n, vec!["libgcc_s.so.1".to_string()]);
    }

    #[test]
    fn a_libc_older_than_the_library_needs_is_told_apart() {
        // This machine's libc defines what this test binary needs.
        let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let defined = super::versions(&libc).unwrap().defined;
        assert!(defined.contains(&"GLIBC_2.34".to_string()), "{defined:?}");
        let needed = super::versions(&std::fs::read(std::env::current_exe().unwrap()).unwrap()).unwrap().needed;
        assert!(needed.iter().any(|(f, v)| f == "libc.so.6" && v == "GLIBC_2.2.5"), "{needed:?}");
        assert_eq!(super::lacking(&needed, &defined), Vec::<String>::new());
        // glibc 2.31's (Debian 11 has 2.31) lacks what 2.32 and later added.
        let old: Vec<String> = defined.iter().filter(|v| super::version_key(v) <= vec![2, 31]).cloned().collect();
        let want = |v: &str| ("libc.so.6".to_string(), v.to_string());
        let needs = [want("GLIBC_2.34"), want("GLIBC_2.2.5"), want("GLIBC_2.32"), want("GLIBC_2.34")];
        assert_eq!(super::lacking(&needs, &old), vec!["GLIBC_2.32", "GLIBC_2.34"]);
    }

    #[test]
    fn the_loadable_image_is_the_segments_and_parses() {
        let exe = std::env::current_exe().unwrap();
        let image = super::loadable_image(&exe).unwrap();
        assert!(image.len() < std::fs::metadata(&exe).unwrap().len() as usize);
        let elf = object::File::parse(&*image).unwrap();
        assert_eq!(object::Object::sections(&elf).count(), 0);
        assert!(object::Object::segments(&elf).count() >= 2);
    }
}
