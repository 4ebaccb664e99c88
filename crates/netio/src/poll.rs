//! Waiting: the shutdown [`Waker`] every I/O thread polls beside its own descriptors, and the
//! [`Poller`] that waits on both.

use crate::cvt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A shutdown signal shared by threads: an `eventfd` they poll beside their descriptors.
/// Once woken it stays readable (nobody reads it), so every thread sees it.
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// Creates the eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the returned descriptor is checked and then owned.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Signals shutdown to every thread polling this waker.
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. A failure (counter
        // overflow) still leaves the eventfd readable, which is all that is needed.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// True once [`wake`](Self::wake) was called (one `poll` call; not for per-packet use).
    pub fn is_woken(&self) -> bool {
        let mut pfd = pollfd(self.fd.as_raw_fd(), libc::POLLIN);
        matches!(poll(std::slice::from_mut(&mut pfd), 0), Ok(n) if n > 0 && pfd.revents != 0)
    }
}

/// What [`Poller::wait`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Shutdown was signalled (whatever else is readable).
    Shutdown,
    /// The descriptors for which [`Poller::readable`] is true may be read; none after a
    /// timeout.
    Readable,
}

/// A `poll` set: some descriptors (for reading) and a [`Waker`]. Built once per thread; a wait
/// allocates nothing.
#[derive(Debug)]
pub struct Poller {
    /// The descriptors in the order given, then the waker.
    fds: Vec<libc::pollfd>,
}

fn pollfd(fd: RawFd, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// One `poll` call over `fds`, retried when a signal interrupts it.
fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<libc::c_int> {
    loop {
        // SAFETY: `fds` holds initialised pollfd entries and its length is passed.
        let ret = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        match cvt(ret) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// A timeout for `poll`, in whole milliseconds rounded up (so that a wait for a deadline less
/// than a millisecond away does not spin); -1 (forever) for `None`.
fn timeout_ms(timeout: Option<Duration>) -> libc::c_int {
    match timeout {
        None => -1,
        Some(d) => {
            libc::c_int::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(libc::c_int::MAX)
        }
    }
}

impl Poller {
    /// Polls `fds` (for reading; a descriptor closed meanwhile is never readable) and `waker`.
    pub fn new(fds: &[RawFd], waker: &Waker) -> Self {
        let mut set: Vec<libc::pollfd> = fds.iter().map(|&fd| pollfd(fd, libc::POLLIN)).collect();
        set.push(pollfd(waker.fd.as_raw_fd(), libc::POLLIN));
        Self { fds: set }
    }

    /// Waits until a descriptor is readable, the waker fired, or `timeout` passed (`None`:
    /// no timeout; rounded up to whole milliseconds).
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<Ready> {
        poll(&mut self.fds, timeout_ms(timeout))?;
        match self.fds.last() {
            Some(w) if w.revents != 0 => Ok(Ready::Shutdown),
            _ => Ok(Ready::Readable),
        }
    }

    /// True if descriptor `i` (in the order given to [`Self::new`]) was found readable by the
    /// last wait, or in error, which a read then reports.
    pub fn readable(&self, i: usize) -> bool {
        i + 1 < self.fds.len() && readable(&self.fds[i])
    }

    /// True if any descriptor was found readable (or in error) by the last wait.
    pub fn any_readable(&self) -> bool {
        self.fds
            .split_last()
            .is_some_and(|(_, socks)| socks.iter().any(readable))
    }
}

fn readable(p: &libc::pollfd) -> bool {
    p.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0
}

/// Waits up to `timeout` (whole milliseconds, rounded down) for `fd` to become writable;
/// false on timeout or error.
pub(crate) fn wait_writable(fd: RawFd, timeout: Duration) -> bool {
    let mut pfd = pollfd(fd, libc::POLLOUT);
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one initialised pollfd.
    let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
    ret > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SocketOptions, UdpSocket};

    #[test]
    fn wake_is_seen_by_every_poller_and_stays() {
        let w = Waker::new().expect("eventfd");
        let mut a = Poller::new(&[], &w);
        let mut b = Poller::new(&[], &w);
        assert_eq!(a.wait(Some(Duration::ZERO)).expect("poll"), Ready::Readable);
        assert!(!w.is_woken() && !a.any_readable());
        w.wake();
        assert!(w.is_woken());
        assert_eq!(a.wait(None).expect("poll"), Ready::Shutdown);
        assert_eq!(b.wait(None).expect("poll"), Ready::Shutdown);
        assert_eq!(a.wait(None).expect("poll"), Ready::Shutdown);
    }

    #[test]
    fn readable_names_the_descriptor_with_data() {
        let opts = SocketOptions::default();
        let socks: Vec<UdpSocket> = (0..3)
            .map(|_| UdpSocket::bind("127.0.0.1:0".parse().expect("addr"), &opts).expect("bind"))
            .collect();
        let w = Waker::new().expect("eventfd");
        let fds: Vec<RawFd> = socks.iter().map(AsRawFd::as_raw_fd).collect();
        let mut p = Poller::new(&fds, &w);
        socks[0].send_to(b"x", socks[2].local_addr()).expect("send");
        assert_eq!(
            p.wait(Some(Duration::from_secs(5))).expect("poll"),
            Ready::Readable
        );
        assert!(p.any_readable());
        assert_eq!(
            (0..4).map(|i| p.readable(i)).collect::<Vec<_>>(),
            [false, false, true, false],
            "index 3 is the waker, not a descriptor"
        );
    }

    #[test]
    fn timeouts_round_up_to_whole_milliseconds() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1500))), 2);
        assert_eq!(timeout_ms(Some(Duration::from_millis(7))), 7);
        assert_eq!(timeout_ms(Some(Duration::MAX)), libc::c_int::MAX);
        let started = std::time::Instant::now();
        let w = Waker::new().expect("eventfd");
        let mut p = Poller::new(&[], &w);
        assert_eq!(
            p.wait(Some(Duration::from_micros(300))).expect("poll"),
            Ready::Readable
        );
        assert!(started.elapsed() >= Duration::from_micros(300));
    }
}
