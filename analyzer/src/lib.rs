//! The analyzer's core, shared by the `mtrace` binary and the fuzzing
//! targets (fuzz/): reading a stream into the books (`load`, `books`; `live` while it
//! arrives),
//! symbolizing, the leak scan, and the reports. The command-line front
//! ends (`run`, `attach`, the console) live in the binary.

pub mod books;
pub mod live;
pub mod load;
pub mod malloc_trace;
pub mod order;
pub mod progress;
pub mod report;
pub mod scan;
pub mod stats;
pub mod symbolize;
