//! A call made a record. Its files, from the top down (each names only
//! files below it; `scripts/module_cycles` checks it):
//! - `traced`: the path of every allocation hook, from its entry (the
//!   guard, the session, the real call) to its event recorded;
//! - `recorder`: turns a hooked call into records;
//! - `thread_end`: a thread's exit registered, its state torn down;
//! - `guard`: the reentrancy guard, which writes the nested calls as the
//!   hook leaves;
//! - `nested`: calls the tracer makes inside a hook, kept and written;
//! - `thread`: each thread's state, buffer and interned backtraces
//!   (`stack_ids`, `dead_stacks`);
//! - `sample` and `sampled`: under sampling, which allocations are
//!   recorded and the set of the sampled blocks their frees look up;
//! - `slot`: the thread's word of hook state, found with one access.
//!
//! Below it: the stream it writes to, the unwinders, the platform.

pub mod dead_stacks;
pub mod guard;
pub mod nested;
pub mod recorder;
pub mod sample;
pub mod sampled;
pub mod slot;
pub mod stack_ids;
pub mod thread;
pub mod thread_end;
pub mod traced;
