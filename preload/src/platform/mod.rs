//! What the tracer stands on: system calls without libc's locks (`sys`),
//! the event clock (`clock`), the `MTRACE_*` settings (`config`), the
//! loaded modules (`modules`), the tracer's own heap (`allocator`), the
//! spin lock of the sections a hook may enter (`spin`), where a
//! thread-local lies from the thread pointer (`static_tls`), the
//! functions the hooks forward to (`real`), the functions a module's file
//! defines (`symbols`), hooking one by patching its entry (`patch`), the
//! hooks' addresses as data and the shared frees' slots
//! (`hook_addresses`), and where a thread parks while a stop holds the
//! program (`park`).
//! Names nothing above it.

pub mod allocator;
pub mod clock;
pub mod config;
pub mod exec_env;
pub mod hook_addresses;
pub mod modules;
pub mod park;
pub mod patch;
pub mod real;
pub mod spin;
pub mod static_tls;
pub mod symbols;
pub mod sys;
