//! IPv4 (RFC 791) and IPv6 (RFC 8200 §3) header views and builders, the IP protocol number
//! registry (IANA "Assigned Internet Protocol Numbers"). The Internet checksum and the
//! pseudo-headers are in [`crate::checksum`].
//!
//! ```text
//! IPv4 (RFC 791 §3.1)                       IPv6 (RFC 8200 §3)
//!  0               1               2               3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-------+-------+-----------+---+-------------------------------+
//! |Version|  IHL  |   DSCP    |ECN|          Total Length         |
//! +-------+-------+-----------+---+-----+-------------------------+
//! |         Identification        |Flags|     Fragment Offset     |
//! +---------------+---------------+-----+-------------------------+
//! |  Time to Live |    Protocol   |         Header Checksum       |
//! +---------------+---------------+-------------------------------+
//! |                       Source Address                          |
//! +---------------------------------------------------------------+
//! |                    Destination Address                        |
//! +---------------------------------------------------------------+
//!
//! +-------+---------------+---------------------------------------+
//! |Version| Traffic Class |              Flow Label               |
//! +-------+---------------+-------+---------------+---------------+
//! |         Payload Length        |  Next Header  |   Hop Limit   |
//! +-------------------------------+---------------+---------------+
//! |                 Source Address (128 bits)                     |
//! |               Destination Address (128 bits)                  |
//! +---------------------------------------------------------------+
//! ```

use core::fmt;
use std::net::IpAddr;

use crate::error::WireError;

/// An IP protocol number (IPv4 Protocol field) or IPv6 Next Header value; an open registry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct IpProtocol(pub u8);

impl IpProtocol {
    /// IPv6 Hop-by-Hop Options.
    pub const HOPOPT: Self = Self(0);
    /// ICMP (RFC 792).
    pub const ICMP: Self = Self(1);
    /// IPv4 encapsulation: the ESP Next Header of an IPv4 packet in tunnel mode (RFC 4303 §2.6).
    pub const IPV4: Self = Self(4);
    /// TCP.
    pub const TCP: Self = Self(6);
    /// UDP (RFC 768).
    pub const UDP: Self = Self(17);
    /// IPv6 encapsulation: the ESP Next Header of an IPv6 packet in tunnel mode.
    pub const IPV6: Self = Self(41);
    /// IPv6 Routing Header.
    pub const IPV6_ROUTE: Self = Self(43);
    /// IPv6 Fragment Header.
    pub const IPV6_FRAG: Self = Self(44);
    /// GRE.
    pub const GRE: Self = Self(47);
    /// Encapsulating Security Payload (RFC 4303).
    pub const ESP: Self = Self(50);
    /// Authentication Header (RFC 4302).
    pub const AH: Self = Self(51);
    /// ICMPv6 (RFC 4443).
    pub const ICMPV6: Self = Self(58);
    /// No Next Header: also marks an ESP dummy packet (RFC 4303 §2.6).
    pub const NO_NEXT_HEADER: Self = Self(59);
    /// IPv6 Destination Options.
    pub const IPV6_OPTS: Self = Self(60);
    /// SCTP.
    pub const SCTP: Self = Self(132);

    /// The registry name of a known value.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::HOPOPT => "HOPOPT",
            Self::ICMP => "ICMP",
            Self::IPV4 => "IPv4",
            Self::TCP => "TCP",
            Self::UDP => "UDP",
            Self::IPV6 => "IPv6",
            Self::IPV6_ROUTE => "IPv6-Route",
            Self::IPV6_FRAG => "IPv6-Frag",
            Self::GRE => "GRE",
            Self::ESP => "ESP",
            Self::AH => "AH",
            Self::ICMPV6 => "ICMPv6",
            Self::NO_NEXT_HEADER => "IPv6-NoNxt",
            Self::IPV6_OPTS => "IPv6-Opts",
            Self::SCTP => "SCTP",
            _ => return None,
        })
    }
}

impl fmt::Debug for IpProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "{:#04x}", self.0),
        }
    }
}

impl fmt::Display for IpProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The version of an IP packet, read from its first nibble.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpVersion {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl IpVersion {
    /// The version of the packet starting at `packet[0]`.
    pub fn of(packet: &[u8]) -> Result<Self, WireError> {
        match packet.first().map(|b| b >> 4) {
            None => Err(WireError::Truncated {
                what: "ip",
                need: 1,
                got: 0,
            }),
            Some(4) => Ok(Self::V4),
            Some(6) => Ok(Self::V6),
            Some(v) => Err(WireError::Unsupported {
                what: "ip",
                field: "version",
                value: v.into(),
            }),
        }
    }

    /// The protocol number that announces a packet of this version inside a tunnel
    /// (ESP Next Header, RFC 4303 §2.6): 4 for IPv4, 41 for IPv6.
    pub fn encapsulation_protocol(self) -> IpProtocol {
        match self {
            Self::V4 => IpProtocol::IPV4,
            Self::V6 => IpProtocol::IPV6,
        }
    }

    /// The version announced by an encapsulation protocol number (inverse of
    /// [`IpVersion::encapsulation_protocol`]).
    pub fn from_encapsulation_protocol(protocol: IpProtocol) -> Option<Self> {
        match protocol {
            IpProtocol::IPV4 => Some(Self::V4),
            IpProtocol::IPV6 => Some(Self::V6),
            _ => None,
        }
    }
}

mod ipv4;
mod ipv6;

pub use ipv4::{Ipv4Packet, Ipv4Repr, IPV4_HEADER_LEN};
pub use ipv6::{Ipv6Packet, Ipv6Repr, IPV6_HEADER_LEN};

/// The source and destination of an IP packet of either version, for pseudo-header
/// computations; `None` unless `packet` passes the version's `check_len`.
pub fn addresses(packet: &[u8]) -> Option<(IpAddr, IpAddr)> {
    match IpVersion::of(packet).ok()? {
        IpVersion::V4 => {
            let p = Ipv4Packet::new_checked(packet).ok()?;
            Some((p.src_addr().into(), p.dst_addr().into()))
        }
        IpVersion::V6 => {
            let p = Ipv6Packet::new_checked(packet).ok()?;
            Some((p.src_addr().into(), p.dst_addr().into()))
        }
    }
}

#[cfg(test)]
mod tests;
