//! The functions the tracer puts breakpoints on: the table both producers
//! share (`mtrace_format::functions`), the loader's hook, and the C API
//! the program may call.

pub use mtrace_format::functions::{api, lookup, Api, Call};
