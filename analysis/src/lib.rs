//! mtrace's analysis library: a stream in (from any `Read` or file), a
//! report out (to any `Write`), shared by the `mtrace` command (analyzer/)
//! and the fuzzing targets (fuzz/). It has no command line, no socket and
//! no ptrace: its options are a plain [`pipeline::ReportOpts`]. From the
//! bottom up:
//! - [`trace`]: the data model (one trace as read), which everything reads;
//! - `addr_table`: values by address (the heap's blocks);
//! - [`books`], [`order`], [`stats`]: what the records add up to;
//! - [`input`]: readers filling a [`trace::Trace`] — an mtrace stream,
//!   glibc's MALLOC_TRACE log, a stream still arriving;
//! - [`scan`] (the leak scan), [`symbolize`];
//! - [`report`]: the report model; [`output`]: its forms, behind one
//!   [`output::Format`];
//! - [`pipeline`]: load, classify, build, write — what every command runs;
//! - [`bounded`]: a stream kept within a size or an age as it arrives.
//!
//! The command-line front ends (`run`, `attach`, `server`, `client`, the
//! console), the listeners and the producers live in the `mtrace` command.

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
