//! Shutdown signalling for the I/O threads: an `eventfd` every thread polls beside its own file
//! descriptors. Once woken it stays readable (nobody reads it), so every thread sees it.

use super::cvt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The shared shutdown signal.
#[derive(Debug)]
pub(crate) struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// Creates the eventfd.
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the returned descriptor is checked and then owned.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Signals shutdown to every thread polling this waker.
    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A failure (counter
        // overflow) still leaves the eventfd readable, which is all we need.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// True once [`wake`](Self::wake) was called (one `poll` call; not for per-packet use).
    pub(crate) fn is_woken(&self) -> bool {
        matches!(wait(&[], self, Some(Duration::ZERO)), Ok(Ready::Shutdown))
    }
}

/// What [`wait`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ready {
    /// Shutdown was signalled.
    Shutdown,
    /// These descriptors (bit i = `fds[i]`) are readable; 0 after a timeout.
    Readable(u64),
}

/// Waits until one of `fds` (at most 63) is readable, the waker fired, or `timeout` passed.
pub(crate) fn wait(fds: &[RawFd], waker: &Waker, timeout: Option<Duration>) -> io::Result<Ready> {
    const MAX: usize = 64;
    let n = fds.len().min(MAX - 1);
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX];
    for (slot, fd) in pfds.iter_mut().zip(fds.iter().take(n)) {
        *slot = libc::pollfd {
            fd: *fd,
            events: libc::POLLIN,
            revents: 0,
        };
    }
    pfds[n] = libc::pollfd {
        fd: waker.fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout_ms = match timeout {
        None => -1,
        Some(d) => i32::try_from(d.as_millis()).unwrap_or(i32::MAX),
    };
    loop {
        // SAFETY: `pfds` holds n + 1 initialised pollfd entries.
        let ret = unsafe { libc::poll(pfds.as_mut_ptr(), (n + 1) as libc::nfds_t, timeout_ms) };
        if ret == -1 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        break;
    }
    if pfds[n].revents != 0 {
        return Ok(Ready::Shutdown);
    }
    let mut mask = 0u64;
    for (i, p) in pfds.iter().take(n).enumerate() {
        // POLLERR/POLLHUP also make a read return (with the error), so treat them as readable.
        if p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0 {
            mask |= 1 << i;
        }
    }
    Ok(Ready::Readable(mask))
}

/// Waits up to `timeout` for `fd` to become writable; false on timeout.
pub(crate) fn wait_writable(fd: RawFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one initialised pollfd.
    let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
    ret > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_is_seen_by_every_waiter() {
        let w = Waker::new().expect("eventfd");
        assert_eq!(
            wait(&[], &w, Some(Duration::ZERO)).expect("poll"),
            Ready::Readable(0)
        );
        assert!(!w.is_woken());
        w.wake();
        assert!(w.is_woken());
        assert_eq!(wait(&[], &w, None).expect("poll"), Ready::Shutdown);
        assert_eq!(wait(&[], &w, None).expect("poll"), Ready::Shutdown);
    }
}
