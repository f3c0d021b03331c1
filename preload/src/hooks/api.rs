//! The C API a program may call (declared in include/mtrace.h). Each is a
//! weak reference in the program, so it is a no-op without the preload.

use std::ffi::{c_char, CStr};

use mtrace_format::Record;

use crate::guard::Guard;
use crate::{session, thread};

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
        thread::push(s, s.now(), false, |time_ns, _| Record::Marker { time_ns, seq: 0, name });
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
        Some(s) if s.report_point("mtrace_report", out.as_deref(), true) => 0,
        _ => -1,
    }
}
