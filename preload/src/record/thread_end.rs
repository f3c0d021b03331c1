//! The end of a thread: its exit is registered once it makes an event
//! outside the allocator, and at its exit its state is torn down inside
//! the guard (thread.rs keeps the state; the guard, guard.rs, writes what
//! the hook kept as it leaves, through that state: the destructor that
//! enters the guard sits above both).

use crate::record::guard::Guard;
use crate::record::slot::Slot;
use crate::record::thread;
use crate::stream::Session;

/// After the calling thread's first event made outside the allocator
/// (`thread::push_in` said so), with session `s`: [`thread_exit`] is
/// registered for its exit (a TLS destructor: glibc's
/// `__cxa_thread_atexit_impl`, which `calloc`s its entry).
#[cold]
#[inline(never)]
pub fn register(s: &Session, slot: Slot) {
    if let Some(p) = thread::registering(s, slot) {
        crate::platform::real::thread_atexit(thread_exit, p);
    }
}

/// TLS destructor of a thread's state: runs after the C++ thread_local
/// destructors registered after the thread's first event (in reverse
/// order of registration), before its pthread key destructors, whose
/// events then go out synchronously.
extern "C" fn thread_exit(p: *mut libc::c_void) {
    let _g = Guard::enter();
    thread::tear_down(p);
}
