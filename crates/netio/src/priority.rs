//! Background work that yields to forwarding: [`Background`] lowers the calling thread's
//! scheduling priority (its nice value, per thread on Linux) while it lives and raises it
//! back when dropped.
//!
//! A bulk route load or restore takes a core for about a second per million entries. On a
//! machine whose cores the workers share with it (and with the peers, the hosts and
//! everything else), the scheduler gives such a thread an equal share: a worker that wakes
//! with packets waiting may then wait a whole time slice, milliseconds, for a core. At a
//! higher nice value the background thread's slices are short and a waking worker runs
//! first; the background work still gets every cycle nobody else wants.

use tracing::debug;

/// How much nicer the thread becomes (nice 0 → 10: about a tenth of a nice-0 thread's
/// weight when both want the core).
pub const BACKGROUND_NICE: libc::c_int = 10;

/// While it lives, the calling thread runs at [`BACKGROUND_NICE`] above its nice value.
/// Dropping it (on the same thread) restores the value; if the process may not raise a
/// thread's priority (no `CAP_SYS_NICE` and `RLIMIT_NICE` too low), the thread stays nicer
/// and a debug line says so. Not `Send`: it names the thread that made it.
#[derive(Debug)]
pub struct Background {
    tid: libc::id_t,
    before: Option<libc::c_int>,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// The calling thread's id.
fn gettid() -> libc::id_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as libc::id_t }
}

/// The nice value of thread `tid`.
fn nice_of(tid: libc::id_t) -> Option<libc::c_int> {
    // getpriority returns the nice value, which may be -1: errno tells an error apart.
    // SAFETY: errno is thread-local; getpriority reads no memory of ours.
    unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, tid);
        (n != -1 || *libc::__errno_location() == 0).then_some(n)
    }
}

/// Sets the nice value of thread `tid`.
fn set_nice(tid: libc::id_t, nice: libc::c_int) -> std::io::Result<()> {
    // SAFETY: setpriority reads no memory of ours.
    crate::cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) }).map(|_| ())
}

impl Background {
    /// Lowers the calling thread's priority until the guard is dropped.
    pub fn enter() -> Background {
        let tid = gettid();
        let before = nice_of(tid);
        let before = before.filter(|n| match set_nice(tid, (n + BACKGROUND_NICE).min(19)) {
            Ok(()) => true,
            Err(e) => {
                debug!(error = %e, "cannot lower a background thread's priority");
                false
            }
        });
        Background {
            tid,
            before,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(n) = self.before {
            if let Err(e) = set_nice(self.tid, n) {
                debug!(error = %e, nice = n, "cannot raise a background thread's priority back");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_is_nicer_inside_and_as_before_after() {
        // A thread of its own, so that no other test's thread changes.
        std::thread::spawn(|| {
            let tid = gettid();
            let before = nice_of(tid).expect("nice");
            {
                let _bg = Background::enter();
                assert_eq!(nice_of(tid), Some((before + BACKGROUND_NICE).min(19)));
                // Only this thread: the process's main thread is untouched.
                // SAFETY: getpid cannot fail.
                let main = unsafe { libc::getpid() } as libc::id_t;
                assert_ne!(main, tid);
            }
            // Raising it back needs CAP_SYS_NICE (the tests run as root); without it the
            // thread stays nicer, which the guard allows.
            let after = nice_of(tid).expect("nice");
            let root = unsafe { libc::geteuid() } == 0;
            if root {
                assert_eq!(after, before);
            } else {
                assert!(after >= before);
            }
        })
        .join()
        .expect("thread");
    }
}
