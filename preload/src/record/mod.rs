//! A call made a record: the reentrancy guard and the thread's marks
//! (`guard`), calls the tracer makes inside a hook (`nested`), each
//! thread's state, buffer and interned backtraces (`thread`), the
//! recorder that turns a hooked call into records (`recorder`), and under
//! sampling which allocations are recorded (`sample`) and the set of the
//! sampled blocks their frees look up (`sampled`). Below it:
//! the stream it writes to, the unwinders, the platform.

pub mod dead_stacks;
pub mod guard;
pub mod nested;
pub mod recorder;
pub mod sample;
pub mod sampled;
pub mod stack_ids;
pub mod thread;
