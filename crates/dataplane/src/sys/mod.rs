//! The operating-system layer of the data plane (Linux, over `libc`): UDP sockets with batched
//! I/O and offloads, the TUN device, and the shutdown waker the I/O threads poll.

pub(crate) mod socket;
pub(crate) mod tun;
pub(crate) mod tun_offload;
pub(crate) mod waker;

/// Turns a libc return value into an `io::Result`, reading `errno` on -1.
pub(crate) fn cvt(ret: libc::c_int) -> std::io::Result<libc::c_int> {
    if ret == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}
