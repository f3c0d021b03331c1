//! The functions the tracer puts breakpoints on: the table both producers
//! share (`mtrace_format::functions`), and the loader's hook.

pub use mtrace_format::functions::{lookup, Call};
