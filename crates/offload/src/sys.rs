//! The one call into C the offload makes: handing the heap's free pages back to the system after
//! the neuron cache shrank.

/// Returns the heap's free pages to the system, so that resident memory follows a neuron cache that
/// shrank (its units are small allocations inside the heap, which `free` keeps for reuse). glibc's
/// `malloc_trim(0)` (it `madvise`s the free pages of every arena); a no-op elsewhere (musl's
/// allocator returns freed memory by itself).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas under their locks; it takes no pointer and is
    // safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
