//! Giving the memory a reading freed back to the system.

/// Returns the free memory at the top and inside glibc's arenas to the
/// kernel (`malloc_trim(0)`, glibc's malloc.h): what a large trace's
/// reading allocated and freed would otherwise stay in the process's RSS.
/// Nothing on a C library without it.
pub fn free_memory_to_the_system() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes no pointer and only releases free pages.
    unsafe {
        libc::malloc_trim(0);
    }
}
