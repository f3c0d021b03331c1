//! The environment an exec hands on, when the new program could not load
//! this library: a process that changed its root before it execs
//! (`chroot`, `unshare … chroot`, a container runtime's init) no longer has
//! the file `LD_PRELOAD` names, and the new program's loader would print
//! "ERROR: ld.so: object … cannot be preloaded … ignored." into the
//! program's own stderr. The exec then gets the environment without this
//! library's entry: the new program runs untraced (`mtrace run --ptrace`
//! traces it from outside) and its output is its own.

use std::ffi::{c_char, CStr, CString};

use super::modules;

/// A copy of an environment with this library left out of `LD_PRELOAD`:
/// the strings it made, and the NULL-terminated array to pass.
pub struct Env {
    _made: Option<CString>,
    ptrs: Vec<*const c_char>,
}

impl Env {
    /// The array to pass as `envp`.
    pub fn as_ptr(&self) -> *const *const c_char {
        self.ptrs.as_ptr()
    }
}

/// `None` when this library can still be opened at its path (the exec
/// goes as the program asked); else `envp` without this library's
/// `LD_PRELOAD` entry (the variable dropped if nothing else is left).
///
/// # Safety
/// `envp` is an exec's environment: null, or a NULL-terminated array of
/// NUL-terminated strings.
pub unsafe fn without_this_library(envp: *const *const c_char) -> Option<Env> {
    let me = modules::own_path()?;
    let c = CString::new(me.as_str()).ok()?;
    // SAFETY: a NUL-terminated path.
    if envp.is_null() || unsafe { libc::access(c.as_ptr(), libc::R_OK) } == 0 {
        return None;
    }
    let name = std::path::Path::new(&me).file_name()?.to_owned();
    // SAFETY: per the contract.
    unsafe { without(envp, &name) }
}

/// `envp` without the `LD_PRELOAD` entries whose file name is `name`.
///
/// # Safety
/// As [`without_this_library`], `envp` not null.
unsafe fn without(envp: *const *const c_char, name: &std::ffi::OsStr) -> Option<Env> {
    let mut made = None;
    let mut ptrs = Vec::new();
    let mut i = 0;
    loop {
        // SAFETY: per the contract, every entry up to the NULL is readable.
        let p = unsafe { *envp.add(i) };
        if p.is_null() {
            break;
        }
        i += 1;
        // SAFETY: a NUL-terminated string, per the contract.
        let entry = unsafe { CStr::from_ptr(p) }.to_bytes();
        let Some(value) = entry.strip_prefix(b"LD_PRELOAD=") else {
            ptrs.push(p);
            continue;
        };
        let value = String::from_utf8_lossy(value);
        let kept: Vec<&str> = value
            .split([':', ' '])
            .filter(|e| !e.is_empty() && std::path::Path::new(e).file_name() != Some(name))
            .collect();
        if !kept.is_empty() {
            let s = CString::new(format!("LD_PRELOAD={}", kept.join(":"))).ok()?;
            ptrs.push(s.as_ptr());
            made = Some(s);
        }
    }
    ptrs.push(std::ptr::null());
    Some(Env { _made: made, ptrs })
}

/// The process's environment (`environ`), for the execs that take none.
pub fn environ() -> *const *const c_char {
    extern "C" {
        static environ: *const *const c_char;
    }
    // SAFETY: glibc's environ, read once (the program may change it, but
    // not while it calls exec).
    unsafe { environ }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The strings of a NULL-terminated array.
    fn strings(p: *const *const c_char) -> Vec<String> {
        let mut out = Vec::new();
        for i in 0.. {
            // SAFETY: a NULL-terminated array this test made.
            let s = unsafe { *p.add(i) };
            if s.is_null() {
                break;
            }
            // SAFETY: its strings are NUL-terminated.
            out.push(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
        }
        out
    }

    #[test]
    fn a_library_still_there_changes_nothing() {
        // In the test binary own_path is the binary's own path, which
        // exists.
        let a = CString::new("A=1").unwrap();
        let env = [a.as_ptr(), std::ptr::null()];
        // SAFETY: a NULL-terminated array of C strings.
        assert!(unsafe { without_this_library(env.as_ptr()) }.is_none());
    }

    #[test]
    fn only_this_librarys_entry_leaves_ld_preload() {
        let c = |s: &str| CString::new(s).unwrap();
        let (a, p, b) = (c("A=1"), c("LD_PRELOAD=/x/libother.so:/opt/mtrace/libmtrace.so /y/libz.so"), c("B=2"));
        let env = [a.as_ptr(), p.as_ptr(), b.as_ptr(), std::ptr::null()];
        // SAFETY: a NULL-terminated array of C strings.
        let out = unsafe { without(env.as_ptr(), std::ffi::OsStr::new("libmtrace.so")) }.unwrap();
        assert_eq!(strings(out.as_ptr()), ["A=1", "LD_PRELOAD=/x/libother.so:/y/libz.so", "B=2"]);
        let alone = c("LD_PRELOAD=/opt/mtrace/libmtrace.so");
        let env = [alone.as_ptr(), b.as_ptr(), std::ptr::null()];
        // SAFETY: as above.
        let out = unsafe { without(env.as_ptr(), std::ffi::OsStr::new("libmtrace.so")) }.unwrap();
        assert_eq!(strings(out.as_ptr()), ["B=2"]);
    }
}
