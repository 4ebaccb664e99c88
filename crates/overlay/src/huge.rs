//! Transparent huge pages for the bucket arrays: a 16 M-entry table spans 250 MB, and with
//! 4 KiB pages nearly every lookup of a random key misses the TLB as well as the caches, a page
//! walk before the bucket's own miss. `madvise(MADV_HUGEPAGE)` on the array before it is first
//! written lets the kernel back it with 2 MiB pages where transparent huge pages are in
//! `madvise` mode (the common default; `always` needs no advice, `never` ignores it). A hint:
//! nothing else depends on it, and where it is refused the table works as before.
//!
//! Not a crate: `memmap2` advises its own mappings only, and the arrays are `Vec`s; this is
//! one system call on memory the vector owns.

use core::mem::MaybeUninit;

/// Arrays smaller than a huge page are not advised.
const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the whole pages of `mem` with huge pages. Call it on a vector's
/// spare capacity before the vector writes it (pages already touched are backed as they are
/// until the kernel's background collapse, if ever).
pub(crate) fn advise<T>(mem: &mut [MaybeUninit<T>]) {
    #[cfg(target_os = "linux")]
    {
        let bytes = core::mem::size_of_val(mem);
        if bytes < HUGE_PAGE {
            return;
        }
        // SAFETY: sysconf has no preconditions.
        let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            p if p > 0 => p as usize,
            _ => return,
        };
        let start = mem.as_mut_ptr() as usize;
        let first = start.next_multiple_of(page);
        let end = (start + bytes) / page * page;
        if end <= first {
            return;
        }
        // SAFETY: [first, end) lies within `mem`, memory this process owns and that nothing
        // reads before the caller writes it; MADV_HUGEPAGE changes how the kernel backs the
        // pages, never their contents. The result is ignored: a kernel without transparent
        // huge pages refuses the advice and the pages stay small.
        let _ =
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = mem;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_leaves_memory_usable_whatever_its_size() {
        for n in [0usize, 1, 4096, 3 << 20] {
            let mut v: Vec<u64> = Vec::with_capacity(n);
            advise(v.spare_capacity_mut());
            v.resize(n, 7);
            assert!(v.iter().all(|&x| x == 7));
        }
    }
}
