//! Wire formats for Protego: zero-copy packet views (`Packet<T: AsRef<[u8]>>`, smoltcp style) for
//! the hot path and `parse` / `emit` / `buffer_len` structures for IKEv2 messages.
//!
//! No I/O, no clock, no randomness.

pub mod arp;
pub mod checksum;
pub mod error;
pub mod esp;
pub mod ethernet;
mod field;
pub mod flow;
pub mod geneve;
pub mod ike;
pub mod ip;
pub mod ndp;
pub mod prefetch;
pub mod relay;
#[cfg(test)]
mod testdata;
pub mod udp;
pub mod vxlan;

/// Defines an open newtype over an IANA registry (STYLE.md: unknown values are representable
/// and print in hex): named constants, `name()`, and `Debug`/`Display` printing the registry
/// name or `Type(0x..)`. Shared by `wire` and `crypto`.
#[macro_export]
macro_rules! iana_registry {
    ($(#[$m:meta])* $name:ident($repr:ty) { $($(#[$cm:meta])* $c:ident = $v:expr,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub $repr);
        impl $name {
            $($(#[$cm])* pub const $c: Self = Self($v);)*
            /// The registry name of a known value.
            pub fn name(self) -> Option<&'static str> {
                match self { $(Self::$c => Some(stringify!($c)),)* _ => None }
            }
        }
        impl ::core::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "{}({:#x})", stringify!($name), self.0),
                }
            }
        }
        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                ::core::fmt::Debug::fmt(self, f)
            }
        }
    };
}

use core::fmt;

/// An IKE SA SPI (RFC 7296 §3.1), 8 bytes on the wire, big-endian.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct IkeSpi(pub u64);

impl fmt::Debug for IkeSpi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}
impl fmt::Display for IkeSpi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// An ESP SPI (RFC 4303 §2.1), 4 bytes on the wire, big-endian. Values 1..=255 are reserved
/// and 0 is never used on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EspSpi(pub u32);

impl fmt::Debug for EspSpi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}
impl fmt::Display for EspSpi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A datagram an engine wants sent: the engine wrote `size` bytes (the UDP payload, without
/// the RFC 3948 non-ESP marker, which the I/O layer adds on port 4500) into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Local address and port to send from (port 500 or 4500).
    pub local: std::net::SocketAddr,
    /// Destination address and port.
    pub remote: std::net::SocketAddr,
    /// Bytes written into the caller's buffer.
    pub size: usize,
}
