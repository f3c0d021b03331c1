//! Process lifetime: the calls after which buffered events must already be
//! in the trace (`_exit`, `_Exit`, `abort`, `exec*`), `pthread_create`,
//! before which the writer thread starts, and `dlclose`, before
//! which the module list is recorded so that the closed library's frames
//! still symbolize. (`dlopen` is not interposed: glibc resolves a relative
//! name against the *caller's* RUNPATH, which a wrapper would change; the
//! writer thread notices new modules instead.)

use std::ffi::{c_char, c_void};

use mtrace_format::EndReason;

use crate::platform::exec_env;
use crate::platform::real::{next, NextFn};
use crate::record::guard::Guard;
use crate::{platform::sys, record::recorder, stream};

static EXIT: NextFn = NextFn::new(c"_exit");
static ABORT: NextFn = NextFn::new(c"abort");
static EXECVE: NextFn = NextFn::new(c"execve");
static EXECV: NextFn = NextFn::new(c"execv");
static EXECVP: NextFn = NextFn::new(c"execvp");
static EXECVPE: NextFn = NextFn::new(c"execvpe");
static FEXECVE: NextFn = NextFn::new(c"fexecve");
static POSIX_SPAWN: NextFn = NextFn::new(c"posix_spawn");
static POSIX_SPAWNP: NextFn = NextFn::new(c"posix_spawnp");
static DLCLOSE: NextFn = NextFn::new(c"dlclose");

fn flush(reason: EndReason) {
    match Guard::enter() {
        Some(_g) => recorder::final_flush(reason, false),
        // Inside a hook: the tracer's own code may hold the locks the
        // flush takes (an abort in it): it waits for none for long.
        None => recorder::final_flush(reason, true),
    }
}

fn real_exit(status: i32) -> ! {
    type F = unsafe extern "C" fn(i32) -> !;
    // SAFETY: F is _exit's signature.
    match unsafe { next::<F>(&EXIT) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(status) },
        // SAFETY: exit_group ends the process and does not return.
        None => unsafe {
            libc::syscall(libc::SYS_exit_group, status);
            std::hint::unreachable_unchecked()
        },
    }
}

#[no_mangle]
pub extern "C" fn _exit(status: i32) -> ! {
    flush(EndReason::UnderscoreExit(Some(status as u8)));
    real_exit(status)
}

#[no_mangle]
pub extern "C" fn _Exit(status: i32) -> ! {
    flush(EndReason::UnderscoreExit(Some(status as u8)));
    real_exit(status)
}

#[no_mangle]
pub extern "C" fn abort() -> ! {
    // The program's own call (glibc's calls, an assert's among them, are
    // internal and end in the fatal-signal handler, which scans too). A
    // thread that meets a fatal signal meanwhile waits for this one; if
    // another thread is already ending the process, its SIGABRT waits.
    if crate::lifecycle::signals::claim_the_end() {
        if let Some(_g) = Guard::enter() {
            if let Some(s) = stream::current() {
                if s.scan && s.pid == sys::getpid() && !s.is_finished() {
                    let by = crate::snapshot::By::program_calling(abort as extern "C" fn() -> ! as usize);
                    crate::snapshot::take(s, by);
                }
            }
        }
        flush(EndReason::Abort);
    }
    type F = unsafe extern "C" fn() -> !;
    // SAFETY: F is abort's signature.
    match unsafe { next::<F>(&ABORT) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f() },
        // SAFETY: raising SIGABRT with its default action ends the process.
        None => unsafe {
            libc::signal(libc::SIGABRT, libc::SIG_DFL);
            libc::raise(libc::SIGABRT);
            libc::syscall(libc::SYS_exit_group, 127);
            std::hint::unreachable_unchecked()
        },
    }
}

/// Flushes, runs `call` (an exec of `path`, as the program gave it: null
/// for `fexecve`), and if it returns (the exec failed) resumes tracing.
/// After vfork the child shares the parent's memory and has another pid:
/// it must not touch the parent's session.
fn around_exec(path: *const c_char, call: impl FnOnce() -> i32) -> i32 {
    // SAFETY: exec's contract: a NUL-terminated path (null: fexecve).
    let named = (!path.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes());
    match stream::current() {
        Some(s) if s.pid == sys::getpid() => {
            let path =
                named.map_or_else(|| "(a descriptor: fexecve)".into(), |p| String::from_utf8_lossy(p).into_owned());
            s.exec_of(path);
        }
        // A vfork child: the parent's memory, not its session. Kept in a
        // slot its parent's next round writes (no lock, no allocation).
        Some(_) => stream::spawned::note(sys::getpid(), named.unwrap_or(b"(a descriptor: fexecve)")),
        None => {}
    }
    flush(EndReason::Exec);
    let rc = call();
    let errno = sys::errno();
    if let Some(s) = stream::current() {
        if s.pid == sys::getpid() {
            s.resume();
        }
    }
    sys::set_errno(errno);
    rc
}

type Argv = *const *const c_char;

/// # Safety
/// The C contract of execve.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: Argv, envp: Argv) -> i32 {
    // SAFETY: envp per execve's contract.
    let env = unsafe { exec_env::without_this_library(envp) };
    let envp = env.as_ref().map_or(envp, |e| e.as_ptr());
    // SAFETY: as the caller's.
    unsafe { real_execve(path, argv, envp) }
}

/// The real execve, with the tracer's flush around it.
///
/// # Safety
/// The C contract of execve.
unsafe fn real_execve(path: *const c_char, argv: Argv, envp: Argv) -> i32 {
    type F = unsafe extern "C" fn(*const c_char, Argv, Argv) -> i32;
    // SAFETY: F is execve's signature; arguments per contract.
    around_exec(path, || match unsafe { next::<F>(&EXECVE) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(path, argv, envp) },
        None => -1,
    })
}

/// # Safety
/// The C contract of execvpe.
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> i32 {
    // SAFETY: envp per execvpe's contract.
    let env = unsafe { exec_env::without_this_library(envp) };
    let envp = env.as_ref().map_or(envp, |e| e.as_ptr());
    // SAFETY: as the caller's.
    unsafe { real_execvpe(file, argv, envp) }
}

/// The real execvpe, with the tracer's flush around it.
///
/// # Safety
/// The C contract of execvpe.
unsafe fn real_execvpe(file: *const c_char, argv: Argv, envp: Argv) -> i32 {
    type F = unsafe extern "C" fn(*const c_char, Argv, Argv) -> i32;
    // SAFETY: as execve.
    around_exec(file, || match unsafe { next::<F>(&EXECVPE) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(file, argv, envp) },
        None => -1,
    })
}

/// # Safety
/// The C contract of execv.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: Argv) -> i32 {
    // SAFETY: the process's environment is one.
    if let Some(env) = unsafe { exec_env::without_this_library(exec_env::environ()) } {
        // SAFETY: execv is execve with the process's environment.
        return unsafe { real_execve(path, argv, env.as_ptr()) };
    }
    type F = unsafe extern "C" fn(*const c_char, Argv) -> i32;
    // SAFETY: F is execv's signature.
    around_exec(path, || match unsafe { next::<F>(&EXECV) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(path, argv) },
        None => -1,
    })
}

/// # Safety
/// The C contract of execvp.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: Argv) -> i32 {
    // SAFETY: the process's environment is one.
    if let Some(env) = unsafe { exec_env::without_this_library(exec_env::environ()) } {
        // SAFETY: execvp is execvpe with the process's environment.
        return unsafe { real_execvpe(file, argv, env.as_ptr()) };
    }
    type F = unsafe extern "C" fn(*const c_char, Argv) -> i32;
    // SAFETY: F is execvp's signature.
    around_exec(file, || match unsafe { next::<F>(&EXECVP) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(file, argv) },
        None => -1,
    })
}

/// # Safety
/// The C contract of fexecve.
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: i32, argv: Argv, envp: Argv) -> i32 {
    // SAFETY: envp per fexecve's contract.
    let env = unsafe { exec_env::without_this_library(envp) };
    let envp = env.as_ref().map_or(envp, |e| e.as_ptr());
    type F = unsafe extern "C" fn(i32, Argv, Argv) -> i32;
    // SAFETY: F is fexecve's signature.
    around_exec(std::ptr::null(), || match unsafe { next::<F>(&FEXECVE) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(fd, argv, envp) },
        None => -1,
    })
}

type Spawn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const c_void,
    *const c_void,
    *const *mut c_char,
    *const *mut c_char,
) -> i32;

/// `posix_spawn` or `posix_spawnp` (`f`) of `path`: glibc's child execs by
/// the system call, past the exec hooks; the child is noted for the
/// process's stream (stream/spawned.rs), its own trace following where it
/// can be traced.
///
/// # Safety
/// The C contract of posix_spawn.
unsafe fn spawned(
    f: &NextFn,
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> i32 {
    // SAFETY: Spawn is posix_spawn's (and posix_spawnp's) signature.
    let rc = match unsafe { next::<Spawn>(f) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(real) => unsafe { real(pid, path, actions, attr, argv, envp) },
        None => libc::ENOSYS,
    };
    if rc == 0 && !pid.is_null() && !path.is_null() && stream::current().is_some_and(|s| s.pid == sys::getpid()) {
        // SAFETY: on success the child's pid was written; path is the
        // caller's NUL-terminated string.
        unsafe { stream::spawned::note(*pid as u32, std::ffi::CStr::from_ptr(path).to_bytes()) };
    }
    rc
}

/// # Safety
/// The C contract of posix_spawn.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> i32 {
    // SAFETY: forwarded under the caller's contract.
    unsafe { spawned(&POSIX_SPAWN, pid, path, actions, attr, argv, envp) }
}

/// # Safety
/// The C contract of posix_spawnp.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> i32 {
    // SAFETY: forwarded under the caller's contract.
    unsafe { spawned(&POSIX_SPAWNP, pid, file, actions, attr, argv, envp) }
}

/// # Safety
/// The C contract of dlclose.
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> i32 {
    if let Some(_g) = Guard::enter() {
        recorder::modules_changed();
    }
    type F = unsafe extern "C" fn(*mut c_void) -> i32;
    // SAFETY: F is dlclose's signature; handle per contract.
    let rc = match unsafe { next::<F>(&DLCLOSE) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(handle) },
        None => -1,
    };
    // The fast unwinder must not apply the closed library's unwind rules to
    // whatever is mapped at its addresses next.
    #[cfg(target_arch = "x86_64")]
    if let Some(_g) = Guard::enter() {
        crate::unwind::fast::refresh();
    }
    rc
}

/// A process's second thread: the writer thread starts before it
/// (session::solo::leave_solo), so that a process that stays single-threaded
/// never has one of the tracer's. Threads libc starts itself (timers'
/// helper, POSIX AIO) and raw `clone`s are found at their first event of
/// the malloc family instead.
///
/// # Safety
/// The C contract of pthread_create.
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: crate::platform::real::ThreadMain,
    arg: *mut c_void,
) -> i32 {
    if let Some(_g) = Guard::enter() {
        let errno = sys::errno();
        // The session, if this is the process's first event: its writer
        // must come before the thread, which may allocate at once.
        if crate::session::get().is_some() {
            crate::session::solo::leave_solo();
        }
        sys::set_errno(errno);
    }
    type F = unsafe extern "C" fn(
        *mut libc::pthread_t,
        *const libc::pthread_attr_t,
        crate::platform::real::ThreadMain,
        *mut c_void,
    ) -> i32;
    // SAFETY: F is pthread_create's signature.
    match unsafe { next::<F>(&crate::platform::real::PTHREAD_CREATE) } {
        // SAFETY: the real function, with the arguments of the caller's C contract.
        Some(f) => unsafe { f(thread, attr, start, arg) },
        None => libc::EAGAIN,
    }
}

// The variadic exec functions are written in C (src/exec_shim.c): stable
// Rust cannot define variadic functions, and a cdylib exports only Rust
// items. These naked exports jump to the C versions with every register and
// stack slot as the caller left them.
extern "C" {
    fn mtrace_execl();
    fn mtrace_execlp();
    fn mtrace_execle();
}

macro_rules! jump_to {
    ($sym:literal, $name:ident, $target:ident) => {
        /// Variadic exec: a tail jump to the C implementation.
        ///
        /// # Safety
        /// The C contract of the exec function of this name.
        #[unsafe(naked)]
        #[export_name = $sym]
        pub unsafe extern "C" fn $name() {
            #[cfg(target_arch = "x86_64")]
            core::arch::naked_asm!("jmp {t}", t = sym $target);
            #[cfg(target_arch = "aarch64")]
            core::arch::naked_asm!("b {t}", t = sym $target);
        }
    };
}

jump_to!("execl", execl, mtrace_execl);
jump_to!("execlp", execlp, mtrace_execlp);
jump_to!("execle", execle, mtrace_execle);
