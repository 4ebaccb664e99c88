//! ESP security associations for Protego: RFC 4303 in tunnel mode, carried in UDP per
//! RFC 3948 (the UDP header is the caller's; see `wire::esp::UdpEncap`).
//!
//! - [`OutboundSa`] seals inner IPv4/IPv6 packets in place in the caller's buffer, with
//!   lock-free sequence number allocation that never reuses or wraps (RFC 4303 §3.3.3).
//!   A pipeline can allocate numbers in its serial stage ([`OutboundSa::allocate`]) and seal
//!   on any thread later ([`OutboundSa::seal_with_seq`]), so numbers leave in arrival order.
//! - [`InboundSa`] opens them: anti-replay check before decryption, ICV, window update after
//!   it (§3.4.3, lock-free for concurrent receivers), ESN inference (Appendix A), padding and
//!   Next Header checks, and a distinct result for dummy packets (§2.6).
//! - Every failure is an [`EspError`] variant carrying the SPI and sequence number; each SA
//!   counts packets, bytes and drops by [`DropReason`], and inbound how many packets arrived
//!   behind a later one and by how much at most ([`CounterSnapshot::max_reorder`]).
//! - Both SA types are shared by worker threads: what every packet writes is either sharded
//!   by thread (counters) or on cache lines of its own (sequence counter, window position).
//!
//! Concurrency is model-checked with loom (`seq/loom_tests.rs`, `replay/loom_tests.rs`):
//! `RUSTFLAGS="--cfg loom" cargo test -p protego-esp --release --lib loom`.
//!
//! Transforms: AES-GCM-16 (RFC 4106), ChaCha20-Poly1305 (RFC 7634), AES-CBC (RFC 3602) with
//! HMAC-SHA1-96 (RFC 2404) or HMAC-SHA2 (RFC 4868), all through `crypto::SaCipher`.
//!
//! No I/O, no clock, no randomness, no allocation per packet.

mod counters;
mod error;
mod inbound;
mod outbound;
pub mod replay;
mod sa;
mod seq;
mod sync;

pub use counters::{CounterSnapshot, DropReason};
pub use error::EspError;
pub use inbound::{InboundSa, Opened, Unaccepted};
pub use outbound::{OutboundSa, Sealed};
pub use replay::{ReplayError, ReplayWindow};
pub use sa::{
    SaConfig, DEFAULT_REPLAY_WINDOW, MAX_HEADER_LEN, MAX_OVERHEAD, MAX_REPLAY_WINDOW,
    MAX_TRAILER_LEN, MIN_REPLAY_WINDOW,
};
pub use seq::{DEFAULT_SOFT_LIMIT, DEFAULT_SOFT_LIMIT_ESN, MAX_ESN, MAX_SEQ};

// Both SA types are shared between worker threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<OutboundSa>();
    assert_send_sync::<InboundSa>();
};

#[cfg(all(test, not(loom)))]
mod tests;
#[cfg(all(test, not(loom)))]
mod vectors;
