//! Software prefetch: asks the CPU to start loading a cache line that a lookup will read a
//! little later, so that the misses of a batch overlap instead of following one another. The
//! overlay table's batch lookup and the data plane's ESP open stage use it. Not a wire format,
//! but the one crate every hot-path crate already depends on.

/// Bytes in a cache line on the CPUs Protego runs on (x86-64, Arm server cores).
pub const CACHE_LINE: usize = 64;

/// Starts loading every cache line of `*r` into all cache levels. A hint: it has no effect on
/// the program's result, only on its speed. A no-op on architectures without a stable
/// prefetch intrinsic.
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    let start = (r as *const T).cast::<u8>();
    let mut offset = 0;
    while offset < core::mem::size_of::<T>() {
        line(start.wrapping_add(offset));
        offset += CACHE_LINE;
    }
}

/// Starts loading the cache line holding `p` (any address: a prefetch never faults).
#[inline(always)]
pub fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: `_mm_prefetch` needs SSE, which every x86-64 CPU has (it is part of the
        // x86_64 baseline the compiler targets). A prefetch never faults and never reads
        // memory into the program: it is a hint, valid for any address (callers pass
        // addresses inside live objects, or the dangling pointer of an empty `Vec`, which is
        // equally harmless).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
