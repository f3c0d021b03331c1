//! The ptrace producer of the mtrace stream: the same records as
//! libmtrace.so writes, made from outside the process, for what a preload
//! cannot reach — statically linked programs, processes where no library
//! can be loaded — and, with a port of `arch`, other CPUs.
//!
//! How: the program is started seized (`spawn`); at its exec, and
//! whenever the dynamic loader says the module list changed
//! (`_dl_debug_state`), every module's interposed functions (`funcs`,
//! found by symbol) get a breakpoint whose displaced instruction runs out
//! of line (`process`); at an entry stop the tracer reads the arguments,
//! unwinds the stack with the modules' CFI (`unwind`), and replaces the
//! return address by a trampoline breakpoint to see the result (`calls`);
//! the records go to a stream per process (`stream`). `tracer` is the loop.
//!
//! Or, as root, kernel uprobes instead of the breakpoints (`uprobes`,
//! defined in `tracefs`, counted by `perf` events per thread): the thread
//! does not stop; the kernel copies its registers and the top of its stack
//! into a ring, and the same call logic (`calls`) runs on the copies.
//!
//! And for `mtrace attach` (the preload's way in): [`inspect`] looks a
//! running process over (its libc's loader functions, whether it can be
//! attached to), [`inject`] calls a function inside it (`dlopen` of
//! libmtrace.so) from a thread that holds no lock the call needs, and
//! [`library_call`] calls one of libmtrace.so's own functions there (a
//! round of an idle process with one thread, for its reader).

mod api;
mod arch;
mod calls;
mod funcs;
pub mod inject;
pub mod inspect;
pub mod library_call;
pub mod library_file;
mod live;
mod modules;
mod perf;
mod process;
mod reports;
mod snapshot;
mod spawn;
mod stats;
mod stream;
mod target;
mod tracefs;
mod tracer;
mod unwind;
mod uprobes;

pub use mtrace_format::recording::Recording;
pub use spawn::{pass_on, signals_to_pass_on, take_passed_on, ExecFailed};
pub use tracer::{attach, run, Hooks, Options, Outcome};
