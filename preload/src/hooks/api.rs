//! The C API a program may call (declared in include/mtrace.h). Each is a
//! weak reference in the program, so it is a no-op without the preload.

use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

use mtrace_format::Record;

use crate::record::guard::{self, Guard};
use crate::{record::recorder, record::thread, session};

fn text(p: *const c_char) -> Option<String> {
    // SAFETY: the caller passes NULL or a NUL-terminated string.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Marks this moment in the trace as `name`, for `mtrace report
/// --since-marker NAME` / `--until-marker NAME`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mtrace_marker(name: *const c_char) {
    let Some(_g) = Guard::enter() else { return };
    let name = text(name).unwrap_or_default();
    if let Some(s) = session::get() {
        thread::push(s, thread::When::Early(s.now()), None, |time_ns, _| Record::Marker { time_ns, seq: 0, name });
    }
}

/// Writes an incremental report now and returns when it is written: to
/// `path`, or to `<program>-<pid>-<n>.memlog` when `path` is NULL. Returns 0
/// on success, -1 when no report could be made.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mtrace_report(path: *const c_char) -> i32 {
    let Some(_g) = Guard::enter() else { return -1 };
    let out = text(path);
    match session::get() {
        Some(s) if guard::report_waited(s, "mtrace_report", out.as_deref(), session::solo::round_now) => 0,
        _ => -1,
    }
}

/// Scans memory for leaks now, classifying every live block as memcheck
/// does (docs/SCAN.md; the program's other threads are stopped while memory
/// is read), and writes the report: to `path`, or to
/// `<program>-<pid>-<n>.memlog` when `path` is NULL. Returns when the report
/// is written: 0 on success, -1 when no report could be made.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mtrace_scan(path: *const c_char) -> i32 {
    let Some(_g) = Guard::enter() else { return -1 };
    let out = text(path);
    match session::get() {
        Some(s)
            if crate::snapshot::scan_point(
                s,
                crate::snapshot::By::program_calling(mtrace_scan as *const () as usize),
                out.as_deref(),
                Some(session::solo::round_now),
            ) =>
        {
            0
        }
        _ => -1,
    }
}

/// Starts recording allocations (after `MTRACE_START=off` or `mtrace_stop()`).
#[no_mangle]
pub extern "C" fn mtrace_start() {
    match Guard::enter() {
        Some(_g) => {
            // First: a session starting now sets the flag from MTRACE_START.
            session::get();
            recorder::set_collecting(true)
        }
        None => recorder::init_collecting(true),
    }
}

/// Stops recording allocations; frees are still recorded.
#[no_mangle]
pub extern "C" fn mtrace_stop() {
    match Guard::enter() {
        Some(_g) => {
            session::get();
            recorder::set_collecting(false)
        }
        None => recorder::init_collecting(false),
    }
}

static GLIBC_MTRACE_CALLS: AtomicU64 = AtomicU64::new(0);

/// glibc's `mtrace()`, as libmemleak gave it meaning under a preload: the
/// first call starts collection (if `MTRACE_START=off` held it back), each
/// later call writes an incremental report. glibc's MALLOC_TRACE log is
/// not written.
#[export_name = "mtrace"]
pub extern "C" fn glibc_mtrace() {
    let Some(_g) = Guard::enter() else { return };
    if GLIBC_MTRACE_CALLS.fetch_add(1, Ordering::AcqRel) == 0 {
        session::get();
        recorder::set_collecting(true);
    } else if let Some(s) = session::get() {
        guard::report_waited(s, "mtrace()", None, session::solo::round_now);
    }
}

/// glibc's `muntrace()`: stops collection and writes a final incremental report.
#[export_name = "muntrace"]
pub extern "C" fn glibc_muntrace() {
    let Some(_g) = Guard::enter() else { return };
    let s = session::get();
    recorder::set_collecting(false);
    if let Some(s) = s {
        guard::report_waited(s, "muntrace()", None, session::solo::round_now);
    }
}

/// Records a block of a pool the program manages itself (or any resource):
/// reported under the pool's name like an allocation, with this backtrace.
///
/// # Safety
/// `pool` is NULL or a NUL-terminated string; `ptr` is only an identifier.
#[no_mangle]
pub unsafe extern "C" fn mtrace_alloc(pool: *const c_char, ptr: *const std::ffi::c_void, size: usize) {
    let Some(_g) = Guard::enter() else { return };
    let errno = crate::platform::sys::errno();
    session::get();
    recorder::pool_alloc(crate::unwind::Here::now(), &text(pool).unwrap_or_default(), ptr as u64, size as u64);
    crate::platform::sys::set_errno(errno);
}

/// Records the release of a block recorded with `mtrace_alloc`.
///
/// # Safety
/// `pool` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn mtrace_free(pool: *const c_char, ptr: *const std::ffi::c_void) {
    let Some(_g) = Guard::enter() else { return };
    let errno = crate::platform::sys::errno();
    session::get();
    recorder::pool_free(&text(pool).unwrap_or_default(), ptr as u64);
    crate::platform::sys::set_errno(errno);
}
