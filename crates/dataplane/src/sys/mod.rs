//! The operating-system layer of the data plane (Linux, over `libc`): the TUN device and its
//! offloads. UDP sockets with batched I/O and the shutdown waker are `netio`'s.

pub(crate) mod tun;
pub(crate) mod tun_offload;

pub(crate) use netio::cvt;
