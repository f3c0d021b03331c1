//! The stacks of the program's threads that have ended: no roots for the
//! leak scan (the snapshot reads them from here), set as threads end and
//! begin.

use crate::platform::spin::SpinMutex;
use crate::platform::sys;

/// The stacks of the program's threads that have ended, [low, high):
/// glibc keeps an exited thread's stack mapped for the next thread (its
/// cache) or until it is joined, with stale pointers in its dead frames
/// that would hide the blocks they point to (memcheck never scans a dead
/// thread's stack). From the mapping's start up to the thread's descriptor
/// (`struct pthread`, at the top of the mapping on x86_64 and aarch64:
/// glibc's own pointers, to the thread's DTV among them, stay roots). Set
/// by thread.rs for the threads that made an event; a stack a new thread
/// uses again leaves.
/// Behind a spin lock: a thread's first event reaches it (see SpinMutex).
static DEAD_STACKS: SpinMutex<Vec<(u64, u64)>> = SpinMutex::new(Vec::new());

/// The calling thread ends: its stack is no root from now on (but for a
/// thread that takes it over).
pub fn thread_ended() {
    if sys::gettid() == sys::getpid() {
        // The main thread's stack ends with the process.
        return;
    }
    // SAFETY: pthread_self has no preconditions.
    let descriptor = unsafe { libc::pthread_self() } as u64;
    if let Some((lo, _)) = sys::own_stack().filter(|&(lo, hi)| lo < descriptor && descriptor <= hi) {
        let mut dead = DEAD_STACKS.lock();
        if !dead.contains(&(lo, descriptor)) {
            dead.push((lo, descriptor));
        }
    }
}

/// The calling thread began (its first event): a dead stack it runs on
/// is live again.
pub fn thread_began() {
    let sp = stack_address();
    DEAD_STACKS.lock().retain(|&(lo, hi)| !(lo <= sp && sp < hi));
}

/// An address on the calling thread's stack.
#[inline(never)]
pub fn stack_address() -> u64 {
    let here = std::hint::black_box(0u8);
    std::hint::black_box(&here as *const u8 as u64)
}

/// Before a fork: the list is not being changed while the process is
/// copied (`release_after_fork` in both processes).
pub fn hold_for_fork() {
    DEAD_STACKS.hold();
}

/// After a fork, in the parent and in the child.
pub fn release_after_fork() {
    DEAD_STACKS.release();
}

/// The dead stacks now, [low, high) each.
pub fn all() -> Vec<(u64, u64)> {
    DEAD_STACKS.lock().clone()
}
