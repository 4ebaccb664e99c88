//! Interface requests (`struct ifreq`, netdevice(7)): one builder that checks the name, and
//! one ioctl through a plain datagram socket of the calling thread's network namespace. Used
//! by the AF_XDP set-up ([`crate::xdp`]: MTU, channels) and the data plane's TUN device (up).

use crate::cvt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An `ifreq` naming interface `name` (1 to 15 bytes, no NUL or '/'), the rest zero.
pub fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.is_empty()
        || bytes.len() >= libc::IFNAMSIZ
        || bytes.contains(&0)
        || bytes.contains(&b'/')
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name must have 1 to 15 bytes, no NUL or '/'",
        ));
    }
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

/// Runs interface ioctl `request` on `req` (which names the interface; a data pointer in it
/// must stay valid across the call) through a datagram socket opened for it.
pub fn interface_ioctl(request: libc::c_ulong, req: &mut libc::ifreq) -> io::Result<()> {
    // SAFETY: plain syscall; the descriptor is checked, then owned.
    let raw =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a fresh descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `request` is an interface ioctl that reads and writes one live ifreq.
    cvt(unsafe { libc::ioctl(sock.as_raw_fd(), request as _, req as *mut libc::ifreq) }).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused_before_any_syscall() {
        for bad in ["", "0123456789abcdef", "a/b", "a\0b"] {
            assert_eq!(
                ifreq(bad).expect_err(bad).kind(),
                io::ErrorKind::InvalidInput
            );
        }
        assert!(ifreq("ptun0").is_ok());
    }

    #[test]
    fn the_loopback_mtu_reads_through_an_ioctl() {
        let mut req = ifreq("lo").expect("name");
        interface_ioctl(libc::SIOCGIFMTU as libc::c_ulong, &mut req).expect("SIOCGIFMTU");
        // SAFETY: SIOCGIFMTU filled the union's MTU member.
        assert!(unsafe { req.ifr_ifru.ifru_mtu } > 0);
    }
}
