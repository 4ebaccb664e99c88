//! IPv4 header view and builder (RFC 791 §3.1).

use std::net::Ipv4Addr;

use super::IpProtocol;
use crate::checksum;
use crate::error::WireError;
use crate::field::{need, room, set_u16, set_u32, u16_at, u32_at};

/// Length of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;

mod f {
    pub(super) const VER_IHL: usize = 0;
    pub(super) const DSCP_ECN: usize = 1;
    pub(super) const LENGTH: usize = 2;
    pub(super) const IDENT: usize = 4;
    pub(super) const FLG_OFF: usize = 6;
    pub(super) const TTL: usize = 8;
    pub(super) const PROTOCOL: usize = 9;
    pub(super) const CHECKSUM: usize = 10;
    pub(super) const SRC: usize = 12;
    pub(super) const DST: usize = 16;
}

/// A read/write view of an IPv4 packet (RFC 791 §3.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
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

    /// Checks that every accessor can be called without panicking: version 4, IHL >= 5,
    /// header and Total Length within the buffer, Total Length >= header length.
    /// Bytes after Total Length (link-layer padding) are allowed and ignored.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        need("ipv4", b.len(), IPV4_HEADER_LEN)?;
        if b[f::VER_IHL] >> 4 != 4 {
            return Err(WireError::Malformed {
                what: "ipv4",
                field: "version",
            });
        }
        let hl = self.header_len();
        if hl < IPV4_HEADER_LEN {
            return Err(WireError::Malformed {
                what: "ipv4",
                field: "ihl",
            });
        }
        need("ipv4", b.len(), hl)?;
        let total = usize::from(self.total_len());
        if total < hl {
            return Err(WireError::Malformed {
                what: "ipv4",
                field: "total length",
            });
        }
        need("ipv4", b.len(), total)
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The Version field (4 once checked).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[f::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL * 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[f::VER_IHL] & 0x0f) * 4
    }

    /// Differentiated Services Code Point (RFC 2474).
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[f::DSCP_ECN] >> 2
    }

    /// Explicit Congestion Notification bits (RFC 3168).
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[f::DSCP_ECN] & 0x03
    }

    /// Total Length: header plus payload, in bytes.
    pub fn total_len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), f::LENGTH)
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        u16_at(self.buffer.as_ref(), f::IDENT)
    }

    /// The Don't Fragment flag.
    pub fn dont_frag(&self) -> bool {
        u16_at(self.buffer.as_ref(), f::FLG_OFF) & 0x4000 != 0
    }

    /// The More Fragments flag.
    pub fn more_frags(&self) -> bool {
        u16_at(self.buffer.as_ref(), f::FLG_OFF) & 0x2000 != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (u16_at(self.buffer.as_ref(), f::FLG_OFF) & 0x1fff) << 3
    }

    /// True for any fragment (first, middle or last).
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    /// Time to Live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[f::TTL]
    }

    /// Protocol.
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol(self.buffer.as_ref()[f::PROTOCOL])
    }

    /// Header Checksum as stored.
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), f::CHECKSUM)
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32_at(self.buffer.as_ref(), f::SRC))
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32_at(self.buffer.as_ref(), f::DST))
    }

    /// Options (between the fixed header and the payload).
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[IPV4_HEADER_LEN..self.header_len()]
    }

    /// The payload: from the end of the header to Total Length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }

    /// True if the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(&self.buffer.as_ref()[..self.header_len()]) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    /// Sets Version to 4 and IHL from `header_len` (a multiple of 4, 20..=60).
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[f::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets DSCP and ECN.
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: u8) {
        self.buffer.as_mut()[f::DSCP_ECN] = (dscp << 2) | (ecn & 0x03);
    }

    /// Sets Total Length.
    pub fn set_total_len(&mut self, len: u16) {
        set_u16(self.buffer.as_mut(), f::LENGTH, len);
    }

    /// Sets Identification.
    pub fn set_ident(&mut self, ident: u16) {
        set_u16(self.buffer.as_mut(), f::IDENT, ident);
    }

    /// Sets the flags and fragment offset (`offset` in bytes, a multiple of 8).
    pub fn set_fragment(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let v =
            (u16::from(dont_frag) << 14) | (u16::from(more_frags) << 13) | ((offset >> 3) & 0x1fff);
        set_u16(self.buffer.as_mut(), f::FLG_OFF, v);
    }

    /// Sets Time to Live.
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[f::TTL] = ttl;
    }

    /// Sets Protocol.
    pub fn set_protocol(&mut self, protocol: IpProtocol) {
        self.buffer.as_mut()[f::PROTOCOL] = protocol.0;
    }

    /// Stores a Header Checksum value.
    pub fn set_checksum(&mut self, checksum: u16) {
        set_u16(self.buffer.as_mut(), f::CHECKSUM, checksum);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        set_u32(self.buffer.as_mut(), f::SRC, addr.into());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        set_u32(self.buffer.as_mut(), f::DST, addr.into());
    }

    /// Computes and stores the header checksum (call after every other header field is set).
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let sum = checksum::sum(&self.buffer.as_ref()[..hl]);
        self.set_checksum(!sum);
    }

    /// The payload, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, total) = (self.header_len(), usize::from(self.total_len()));
        &mut self.buffer.as_mut()[hl..total]
    }
}

/// The fields of an IPv4 header without options, for building outer headers.
/// Fragmentation other than DF is not represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Protocol of the payload.
    pub protocol: IpProtocol,
    /// Payload length in bytes (Total Length minus header length).
    pub payload_len: usize,
    /// Time to Live.
    pub ttl: u8,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN (2 bits).
    pub ecn: u8,
    /// Identification.
    pub ident: u16,
    /// Don't Fragment.
    pub dont_frag: bool,
}

impl Ipv4Repr {
    /// Reads a checked packet; the header checksum must verify. Options are skipped,
    /// fragments are accepted (their offset is not represented).
    pub fn parse<T: AsRef<[u8]>>(packet: &Ipv4Packet<T>) -> Result<Self, WireError> {
        packet.check_len()?;
        if !packet.verify_checksum() {
            return Err(WireError::Checksum { what: "ipv4" });
        }
        Ok(Self {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: usize::from(packet.total_len()) - packet.header_len(),
            ttl: packet.ttl(),
            dscp: packet.dscp(),
            ecn: packet.ecn(),
            ident: packet.ident(),
            dont_frag: packet.dont_frag(),
        })
    }

    /// Bytes [`Self::emit`] writes: the 20-byte header.
    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// Writes the header (checksum included) into `buf[..20]`; the payload is the caller's.
    /// Returns the header length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        room("ipv4", buf.len(), IPV4_HEADER_LEN)?;
        let total = u16::try_from(IPV4_HEADER_LEN + self.payload_len).map_err(|_| {
            WireError::Malformed {
                what: "ipv4",
                field: "payload length",
            }
        })?;
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..IPV4_HEADER_LEN]);
        p.set_version_and_header_len(IPV4_HEADER_LEN);
        p.set_dscp_ecn(self.dscp, self.ecn);
        p.set_total_len(total);
        p.set_ident(self.ident);
        p.set_fragment(self.dont_frag, false, 0);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.fill_checksum();
        Ok(IPV4_HEADER_LEN)
    }
}
