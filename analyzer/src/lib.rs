//! The analyzer's core, shared by the `mtrace` binary and the fuzzing
//! targets (fuzz/). From the bottom up:
//! - [`trace`]: the data model (one trace as read), which everything reads;
//! - `addr_table`: values by address (the heap's blocks);
//! - [`books`], [`order`], [`stats`]: what the records add up to;
//! - [`input`]: readers filling a [`trace::Trace`] — an mtrace stream,
//!   glibc's MALLOC_TRACE log, a stream still arriving;
//! - [`scan`] (the leak scan), [`symbolize`];
//! - [`report`]: the report model; [`output`]: its forms, behind one
//!   [`output::Format`];
//! - [`pipeline`]: load, classify, build, write — what every command runs.
//!
//! The command-line front ends (`run`, `attach`, `server`, `client`, the
//! console) live in the binary.

mod addr_table;
pub mod books;
pub mod bounded;
pub mod input;
pub mod order;
pub mod output;
pub mod pipeline;
pub mod progress;
pub mod report;
pub mod scan;
pub mod stats;
pub mod symbolize;
pub mod trace;
