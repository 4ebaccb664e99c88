//! The operating-system layer of the data plane (Linux, over `libc`): the TUN device and its
//! offloads, and AF_PACKET rings on customer-facing interfaces. UDP sockets with batched I/O and the shutdown waker are `netio`'s.

pub(crate) mod packet;
pub(crate) mod tun;
pub(crate) mod tun_offload;

pub(crate) use netio::cvt;
