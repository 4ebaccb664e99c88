//! The operating-system layer of the data plane (Linux, over `libc`): the TUN device and its
//! offloads, the cycle counter, and the kernel gate of CPU fairness (a socket filter loaded
//! with `bpf(2)`). UDP sockets with batched I/O, the shutdown waker and the AF_PACKET rings of
//! customer-facing interfaces are `netio`'s (shared with the steer node and the benchmark).

pub(crate) mod gate;
pub(crate) mod tsc;
pub(crate) mod tun;
pub(crate) mod tun_offload;

pub(crate) use netio::cvt;
