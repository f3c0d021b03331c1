//! A spin lock for the tracer's few short critical sections that a hook
//! may enter: not a parking_lot mutex, whose contended path allocates (its
//! table of parked threads) and would re-enter the hooks or the tracer's
//! heap. A waiter spins, then yields to a holder that was preempted.

use std::sync::atomic::{AtomicBool, Ordering};

/// The lock; `lock` and `unlock` in pairs, by the same thread (nothing
/// checks it: a section that panics never unlocks, and none here can).
pub struct SpinLock {
    locked: AtomicBool,
}

impl SpinLock {
    /// An unlocked lock.
    pub const fn new() -> SpinLock {
        SpinLock { locked: AtomicBool::new(false) }
    }

    /// Takes the lock, spinning 100 times and then yielding the CPU until
    /// it is free.
    pub fn lock(&self) {
        let mut spins = 0u32;
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                // SAFETY: sched_yield has no preconditions.
                unsafe { libc::sched_yield() };
            }
        }
    }

    /// Takes the lock if it is free; whether it did.
    pub fn try_lock(&self) -> bool {
        self.locked.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Releases the lock.
    pub fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// Whether some thread holds it now.
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Acquire)
    }
}

/// A value behind a [`SpinLock`]: for the tracer's state a hook may reach
/// while the program's allocator holds its own lock (a thread's first
/// event), where a parking_lot mutex's contended path could call the
/// allocator (its thread data registers a TLS destructor with
/// `__cxa_thread_atexit_impl`, which calls `calloc`).
pub struct SpinMutex<T> {
    lock: SpinLock,
    value: std::cell::UnsafeCell<T>,
}

// SAFETY: the value is reached only through `lock`'s guard, one thread at
// a time, as with std's Mutex.
unsafe impl<T: Send> Sync for SpinMutex<T> {}

impl<T> SpinMutex<T> {
    /// `value`, unlocked.
    pub const fn new(value: T) -> SpinMutex<T> {
        SpinMutex { lock: SpinLock::new(), value: std::cell::UnsafeCell::new(value) }
    }

    /// Takes the lock ([`SpinLock::lock`]) until the guard goes.
    pub fn lock(&self) -> SpinGuard<'_, T> {
        self.lock.lock();
        SpinGuard { m: self }
    }

    /// Takes the lock without a guard, for a fork: no other thread may be
    /// inside when the process is copied (the child would find it taken
    /// for ever, its value half changed). [`SpinMutex::release`] after.
    pub fn hold(&self) {
        self.lock.lock();
    }

    /// Releases what [`SpinMutex::hold`] took (in the parent and in the
    /// child of the fork).
    pub fn release(&self) {
        self.lock.unlock();
    }
}

/// The value of a locked [`SpinMutex`].
pub struct SpinGuard<'a, T> {
    m: &'a SpinMutex<T>,
}

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock: no other reference exists.
        unsafe { &*self.m.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in deref, and the guard is borrowed mutably.
        unsafe { &mut *self.m.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.m.lock.unlock();
    }
}

/// `m` locked without ever parking, for a parking_lot mutex a hook may
/// wait for: the first time a thread parks, parking_lot registers its
/// thread data's TLS destructor with `__cxa_thread_atexit_impl`, which
/// calls `calloc`, and a hook may run inside the program's allocator with
/// the allocator's lock held (its `mmap`): that `calloc` would wait for
/// its own thread. Spins 100 times, yields the CPU 1,000 times, then
/// sleeps 1 ms between tries (a holder that loads a module's unwind
/// tables takes milliseconds).
pub fn lock_unparked<T>(m: &parking_lot::Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    let mut tries = 0u32;
    loop {
        if let Some(g) = m.try_lock() {
            return g;
        }
        tries += 1;
        if tries < 100 {
            std::hint::spin_loop();
        } else if tries < 1100 {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
        } else {
            super::sys::sleep_ms(1);
        }
    }
}
