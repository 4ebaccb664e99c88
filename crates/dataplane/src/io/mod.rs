//! The I/O stage, the only part of the data plane besides `sys/` that touches sockets and the
//! TUN device: the socket table ([`sockets`]), the input stage that fills a receive batch
//! ([`input`]) and the output stage that sends a finished send batch ([`output`]).

pub(crate) mod input;
pub(crate) mod output;
pub(crate) mod sockets;
