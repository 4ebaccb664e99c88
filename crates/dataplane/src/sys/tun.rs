//! The TUN inside interface (Linux `Documentation/networking/tuntap.rst`): a layer-3 device
//! opened through `/dev/net/tun` with `TUNSETIFF` (`IFF_TUN | IFF_NO_PI`, so each read or write
//! is exactly one IP packet) and brought up; routes are the operator's business.

use super::cvt;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An open TUN device.
#[derive(Debug)]
pub(crate) struct Tun {
    fd: OwnedFd,
    name: String,
}

fn ifreq_for(name: &str) -> io::Result<libc::ifreq> {
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

impl Tun {
    /// Creates (or attaches to) the TUN device `name` and sets it up.
    pub(crate) fn open(name: &str) -> io::Result<Self> {
        let mut req = ifreq_for(name)?;
        let path = CString::new("/dev/net/tun").expect("static path has no NUL");
        // SAFETY: plain syscall with a valid C string; the descriptor is checked then owned.
        let raw = cvt(unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        })?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one ifreq.
        cvt(unsafe { libc::ioctl(raw, libc::TUNSETIFF as _, &mut req as *mut libc::ifreq) })?;
        let tun = Self {
            fd,
            name: name.to_owned(),
        };
        tun.set_up()?;
        Ok(tun)
    }

    /// Sets IFF_UP on the device through an ordinary socket's SIOCSIFFLAGS.
    fn set_up(&self) -> io::Result<()> {
        let mut req = ifreq_for(&self.name)?;
        // SAFETY: plain syscall; the descriptor is checked then owned.
        let raw =
            cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: fresh descriptor.
        let sock = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: SIOCGIFFLAGS / SIOCSIFFLAGS read and write one ifreq.
        unsafe {
            cvt(libc::ioctl(
                sock.as_raw_fd(),
                libc::SIOCGIFFLAGS as _,
                &mut req as *mut libc::ifreq,
            ))?;
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            cvt(libc::ioctl(
                sock.as_raw_fd(),
                libc::SIOCSIFFLAGS as _,
                &mut req as *mut libc::ifreq,
            ))?;
        }
        Ok(())
    }

    /// The device name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The descriptor, for polling.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads one packet without blocking; Ok(None) if none is waiting.
    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: reads at most buf.len() bytes into a live buffer.
            let ret = unsafe { libc::read(self.raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if ret >= 0 {
                return Ok(Some(ret as usize));
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(err),
            }
        }
    }

    /// Writes one packet (the kernel takes it as received on the device).
    pub(crate) fn write(&self, packet: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: writes from a live buffer.
            let ret = unsafe { libc::write(self.raw_fd(), packet.as_ptr().cast(), packet.len()) };
            if ret >= 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused_before_any_syscall() {
        for bad in ["", "0123456789abcdef", "a/b", "a\0b"] {
            assert_eq!(
                ifreq_for(bad).expect_err(bad).kind(),
                io::ErrorKind::InvalidInput
            );
        }
        assert!(ifreq_for("ptun0").is_ok());
    }
}
