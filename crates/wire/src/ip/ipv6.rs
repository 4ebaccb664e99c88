//! IPv6 fixed header view and builder (RFC 8200 §3).

use std::net::Ipv6Addr;

use super::IpProtocol;
use crate::error::WireError;
use crate::field::{need, room, set_u16, set_u32, u16_at, u32_at};

/// Length of the IPv6 fixed header.
pub const IPV6_HEADER_LEN: usize = 40;

mod f {
    pub(super) const VER_TC_FLOW: usize = 0;
    pub(super) const LENGTH: usize = 4;
    pub(super) const NXT_HDR: usize = 6;
    pub(super) const HOP_LIMIT: usize = 7;
    pub(super) const SRC: usize = 8;
    pub(super) const DST: usize = 24;
}

fn ipv6_at(b: &[u8], at: usize) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[at..at + 16]);
    Ipv6Addr::from(o)
}

/// A read/write view of an IPv6 packet (RFC 8200 §3). Extension headers are part of the
/// payload; [`Self::next_header`] is the fixed header's Next Header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps a buffer without checks; accessors may panic unless [`Self::check_len`] passed.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after [`Self::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks version 6 and that the fixed header plus Payload Length fit in the buffer.
    /// Jumbograms (RFC 2675) are not supported: their Payload Length 0 reads as empty.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        need("ipv6", b.len(), IPV6_HEADER_LEN)?;
        if b[f::VER_TC_FLOW] >> 4 != 6 {
            return Err(WireError::Malformed {
                what: "ipv6",
                field: "version",
            });
        }
        need(
            "ipv6",
            b.len(),
            IPV6_HEADER_LEN + usize::from(self.payload_len()),
        )
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The Version field (6 once checked).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[f::VER_TC_FLOW] >> 4
    }

    /// Traffic Class (DSCP << 2 | ECN).
    pub fn traffic_class(&self) -> u8 {
        ((u32_at(self.buffer.as_ref(), f::VER_TC_FLOW) >> 20) & 0xff) as u8
    }

    /// Flow Label (20 bits).
    pub fn flow_label(&self) -> u32 {
        u32_at(self.buffer.as_ref(), f::VER_TC_FLOW) & 0x000f_ffff
    }

    /// Payload Length (everything after the fixed header, extension headers included).
    pub fn payload_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), f::LENGTH)
    }

    /// Next Header.
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol(self.buffer.as_ref()[f::NXT_HDR])
    }

    /// Hop Limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[f::HOP_LIMIT]
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        ipv6_at(self.buffer.as_ref(), f::SRC)
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        ipv6_at(self.buffer.as_ref(), f::DST)
    }

    /// Total packet length (fixed header plus Payload Length).
    pub fn total_len(&self) -> usize {
        IPV6_HEADER_LEN + usize::from(self.payload_len())
    }

    /// The payload (extension headers included), up to Payload Length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[IPV6_HEADER_LEN..self.total_len()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Sets Version 6, Traffic Class and Flow Label (low 20 bits used).
    pub fn set_version_tc_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let v = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0x000f_ffff);
        set_u32(self.buffer.as_mut(), f::VER_TC_FLOW, v);
    }

    /// Sets Payload Length.
    pub fn set_payload_len(&mut self, len: u16) {
        set_u16(self.buffer.as_mut(), f::LENGTH, len);
    }

    /// Sets Next Header.
    pub fn set_next_header(&mut self, next_header: IpProtocol) {
        self.buffer.as_mut()[f::NXT_HDR] = next_header.0;
    }

    /// Sets Hop Limit.
    pub fn set_hop_limit(&mut self, hop_limit: u8) {
        self.buffer.as_mut()[f::HOP_LIMIT] = hop_limit;
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: &Ipv6Addr) {
        self.buffer.as_mut()[f::SRC..f::SRC + 16].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: &Ipv6Addr) {
        self.buffer.as_mut()[f::DST..f::DST + 16].copy_from_slice(&addr.octets());
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let total = self.total_len();
        &mut self.buffer.as_mut()[IPV6_HEADER_LEN..total]
    }
}

/// The fields of an IPv6 fixed header, for building outer headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Next Header.
    pub next_header: IpProtocol,
    /// Payload Length in bytes.
    pub payload_len: usize,
    /// Hop Limit.
    pub hop_limit: u8,
    /// Traffic Class.
    pub traffic_class: u8,
    /// Flow Label (20 bits).
    pub flow_label: u32,
}

impl Ipv6Repr {
    /// Reads a packet's fixed header.
    pub fn parse<T: AsRef<[u8]>>(packet: &Ipv6Packet<T>) -> Result<Self, WireError> {
        packet.check_len()?;
        Ok(Self {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            payload_len: usize::from(packet.payload_len()),
            hop_limit: packet.hop_limit(),
            traffic_class: packet.traffic_class(),
            flow_label: packet.flow_label(),
        })
    }

    /// Bytes [`Self::emit`] writes: the 40-byte fixed header.
    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN
    }

    /// Writes the fixed header into `buf[..40]`; returns 40.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        room("ipv6", buf.len(), IPV6_HEADER_LEN)?;
        let len = u16::try_from(self.payload_len).map_err(|_| WireError::Malformed {
            what: "ipv6",
            field: "payload length",
        })?;
        if self.flow_label > 0x000f_ffff {
            return Err(WireError::Malformed {
                what: "ipv6",
                field: "flow label",
            });
        }
        let mut p = Ipv6Packet::new_unchecked(&mut buf[..IPV6_HEADER_LEN]);
        p.set_version_tc_flow(self.traffic_class, self.flow_label);
        p.set_payload_len(len);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(&self.src_addr);
        p.set_dst_addr(&self.dst_addr);
        Ok(IPV6_HEADER_LEN)
    }
}
