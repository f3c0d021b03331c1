//! A system call a tracer's stop interrupted: the rule both producers (the
//! preload's stop for the leak scan, the ptrace crate's attach, injection
//! and tracer) follow when they let the thread go on, so that the program
//! sees the call as if it had never been stopped.
//!
//! A `PTRACE_INTERRUPT` wakes a thread blocked in a system call as a
//! signal does. Most calls then stop with an error the kernel turns into a
//! restart when no handler runs (`-ERESTARTSYS`, `-ERESTARTNOHAND`,
//! `-ERESTART_RESTARTBLOCK`: arch/x86/kernel/signal.c,
//! `arch_do_signal_or_restart`), but some fail with plain `-EINTR`, which
//! the program sees: signal(7), "Interruption of system calls and library
//! functions by stop signals" lists them (epoll_wait, semop, sigtimedwait,
//! socket calls with a timeout …). For those, [`after_stop`] gives the
//! result register the tracer writes at the stop: `-ERESTARTNOHAND`, so
//! that the kernel makes the call again when the thread goes on — and
//! still returns EINTR should a signal with a handler be delivered then,
//! as it would have without the stop.

/// `-ERESTARTNOHAND` (the kernel's include/linux/errno.h): restart the
/// system call unless a signal handler runs (then it fails with EINTR).
pub const ERESTARTNOHAND: i64 = -514;
/// `-ERESTART_RESTARTBLOCK` (include/linux/errno.h): restart through the
/// thread's restart block (`restart_syscall`), which holds what the call
/// had left (a poll's or a sleep's time).
pub const ERESTART_RESTARTBLOCK: i64 = -516;
/// `-EINTR`.
const EINTR: i64 = -(libc::EINTR as i64);

/// The calls signal(7) lists as failing with EINTR after a stop even
/// without a handler, on the kernels we run on (the entries for Linux 3.7
/// and older are left out), that are safe to make again from their
/// arguments: such a call failing with EINTR did nothing (a receive or send
/// failing so moved no data). `connect` is listed there but not here: made
/// again it would fail with EALREADY (the first attempt goes on).
#[cfg(target_arch = "x86_64")]
const FAIL_AFTER_STOP: &[i64] = &[
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_rt_sigtimedwait,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_recvmmsg,
    libc::SYS_sendto,
    libc::SYS_sendmsg,
    libc::SYS_sendmmsg,
];
/// (Both producers stop threads with ptrace on x86-64 only.)
#[cfg(not(target_arch = "x86_64"))]
const FAIL_AFTER_STOP: &[i64] = &[];

/// The result register (`rax`) to give a thread found at an interrupt stop
/// of the tracer's (`PTRACE_EVENT_STOP` with SIGTRAP: not a signal's, not a
/// group stop's) in system call `nr` (`orig_rax`; negative outside a
/// system call) that returned `ret` (`rax`), so that the call goes on when
/// the thread does; `None`: leave the thread as it is (the kernel restarts
/// the call itself, or it was not interrupted).
///
/// Only at the stop the tracer caused: a call that failed with EINTR
/// because of a signal stops at that signal's delivery instead, and keeps
/// its EINTR. A signal sent to the thread while it is held still makes the
/// call fail with EINTR once it goes on (the kernel's rule for
/// `-ERESTARTNOHAND`), as without the stop.
pub fn after_stop(nr: i64, ret: i64) -> Option<i64> {
    (nr >= 0 && ret == EINTR && FAIL_AFTER_STOP.contains(&nr)).then_some(ERESTARTNOHAND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn only_a_listed_call_that_failed_with_eintr_is_made_again() {
        assert_eq!(after_stop(libc::SYS_epoll_wait, EINTR), Some(ERESTARTNOHAND));
        assert_eq!(after_stop(libc::SYS_rt_sigtimedwait, EINTR), Some(ERESTARTNOHAND));
        // Restarted by the kernel already, or not interrupted.
        assert_eq!(after_stop(libc::SYS_epoll_wait, -512), None);
        assert_eq!(after_stop(libc::SYS_epoll_wait, 1), None);
        // Not safe to make again (close may have closed), or not a call.
        assert_eq!(after_stop(libc::SYS_close, EINTR), None);
        assert_eq!(after_stop(libc::SYS_connect, EINTR), None);
        assert_eq!(after_stop(-1, EINTR), None);
    }
}
