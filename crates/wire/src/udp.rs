//! UDP header view and builder (RFC 768), with the checksum over the IPv4 pseudo-header
//! (RFC 768) or the IPv6 pseudo-header (RFC 8200 §8.1).
//!
//! ```text
//!  0      7 8     15 16    23 24    31
//! +--------+--------+--------+--------+
//! |   Source Port   | Destination Port|
//! +--------+--------+--------+--------+
//! |     Length      |    Checksum     |
//! +--------+--------+--------+--------+
//! |          data octets ...
//! ```
//!
//! A zero checksum means "none" over IPv4 (RFC 768); over IPv6 it is invalid except for
//! tunnel protocols that opt out (RFC 6935/6936), which [`UdpChecksum::Zero`] allows a
//! sender to choose. RFC 3948 §2.1 lets ESP-in-UDP senders transmit a zero checksum.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::error::WireError;
use crate::field::{need, room, set_u16, u16_at};
use crate::ip::IpProtocol;

/// Length of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;

const SRC_PORT: usize = 0;
const DST_PORT: usize = 2;
const LENGTH: usize = 4;
const CHECKSUM: usize = 6;

/// A read/write view of a UDP datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
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

    /// Checks the header fits, Length >= 8 and Length <= buffer length (bytes after Length
    /// are ignored).
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        need("udp", b.len(), UDP_HEADER_LEN)?;
        let len = usize::from(self.len());
        if len < UDP_HEADER_LEN {
            return Err(WireError::Malformed {
                what: "udp",
                field: "length",
            });
        }
        need("udp", b.len(), len)
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        u16_at(self.buffer.as_ref(), DST_PORT)
    }

    /// Length field: header plus data.
    pub fn len(&self) -> u16 {
        u16_at(self.buffer.as_ref(), LENGTH)
    }

    /// True if the datagram carries no data.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= UDP_HEADER_LEN
    }

    /// Checksum as stored.
    pub fn checksum(&self) -> u16 {
        u16_at(self.buffer.as_ref(), CHECKSUM)
    }

    /// The data, up to Length.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[UDP_HEADER_LEN..usize::from(self.len())]
    }

    fn datagram(&self) -> &[u8] {
        &self.buffer.as_ref()[..usize::from(self.len())]
    }

    /// True if the checksum verifies over the IPv4 pseudo-header, or is zero (none sent).
    pub fn verify_checksum_v4(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let ph = checksum::pseudo_header_v4(src, dst, IpProtocol::UDP, self.len());
        checksum::combine(&[ph, checksum::sum(self.datagram())]) == 0xffff
    }

    /// True if the checksum verifies over the IPv6 pseudo-header. A zero checksum is
    /// rejected (RFC 8200 §8.1); tunnel endpoints that accept it (RFC 6936) check
    /// [`Self::checksum`] first.
    pub fn verify_checksum_v6(&self, src: &Ipv6Addr, dst: &Ipv6Addr) -> bool {
        if self.checksum() == 0 {
            return false;
        }
        let ph = checksum::pseudo_header_v6(src, dst, IpProtocol::UDP, u32::from(self.len()));
        checksum::combine(&[ph, checksum::sum(self.datagram())]) == 0xffff
    }

    /// [`Self::verify_checksum_v4`] or [`Self::verify_checksum_v6`]; false if the families differ.
    pub fn verify_checksum(&self, src: &IpAddr, dst: &IpAddr) -> bool {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => self.verify_checksum_v4(*s, *d),
            (IpAddr::V6(s), IpAddr::V6(d)) => self.verify_checksum_v6(s, d),
            _ => false,
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, port: u16) {
        set_u16(self.buffer.as_mut(), SRC_PORT, port);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, port: u16) {
        set_u16(self.buffer.as_mut(), DST_PORT, port);
    }

    /// Sets Length.
    pub fn set_len(&mut self, len: u16) {
        set_u16(self.buffer.as_mut(), LENGTH, len);
    }

    /// Stores a checksum value.
    pub fn set_checksum(&mut self, checksum: u16) {
        set_u16(self.buffer.as_mut(), CHECKSUM, checksum);
    }

    /// Computes and stores the checksum over the given pseudo-header sum; a computed zero
    /// is sent as 0xffff (RFC 768).
    fn fill_with_pseudo(&mut self, pseudo: u16) {
        self.set_checksum(0);
        let sum = checksum::combine(&[pseudo, checksum::sum(self.datagram())]);
        let c = !sum;
        self.set_checksum(if c == 0 { 0xffff } else { c });
    }

    /// Computes and stores the checksum over the IPv4 pseudo-header (Length must be set and
    /// the data in place).
    pub fn fill_checksum_v4(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        let ph = checksum::pseudo_header_v4(src, dst, IpProtocol::UDP, self.len());
        self.fill_with_pseudo(ph);
    }

    /// Computes and stores the checksum over the IPv6 pseudo-header.
    pub fn fill_checksum_v6(&mut self, src: &Ipv6Addr, dst: &Ipv6Addr) {
        let ph = checksum::pseudo_header_v6(src, dst, IpProtocol::UDP, u32::from(self.len()));
        self.fill_with_pseudo(ph);
    }

    /// The data, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = usize::from(self.len());
        &mut self.buffer.as_mut()[UDP_HEADER_LEN..len]
    }
}

/// How [`UdpRepr::emit`] fills the checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdpChecksum {
    /// Send zero (no checksum): IPv4, or IPv6 tunnels under RFC 6935.
    Zero,
    /// Compute over the IPv4 pseudo-header.
    V4 {
        /// Source address of the enclosing IPv4 header.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
    },
    /// Compute over the IPv6 pseudo-header.
    V6 {
        /// Source address of the enclosing IPv6 header.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
    },
}

/// The fields of a UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Data length in bytes.
    pub payload_len: usize,
}

impl UdpRepr {
    /// Reads a datagram's header (checksum verification is the caller's, it needs the
    /// addresses: [`UdpPacket::verify_checksum`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &UdpPacket<T>) -> Result<Self, WireError> {
        packet.check_len()?;
        Ok(Self {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: usize::from(packet.len()) - UDP_HEADER_LEN,
        })
    }

    /// Bytes of the whole datagram: header plus data.
    pub const fn buffer_len(&self) -> usize {
        UDP_HEADER_LEN + self.payload_len
    }

    /// Writes the header into `buf[..8]`, with the data already at `buf[8..8 + payload_len]`
    /// (the checksum covers it). Returns the datagram length.
    pub fn emit(&self, buf: &mut [u8], checksum: UdpChecksum) -> Result<usize, WireError> {
        let total = self.buffer_len();
        room("udp", buf.len(), total)?;
        let len = u16::try_from(total).map_err(|_| WireError::Malformed {
            what: "udp",
            field: "length",
        })?;
        let mut p = UdpPacket::new_unchecked(&mut buf[..total]);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len);
        match checksum {
            UdpChecksum::Zero => p.set_checksum(0),
            UdpChecksum::V4 { src, dst } => p.fill_checksum_v4(src, dst),
            UdpChecksum::V6 { src, dst } => p.fill_checksum_v6(&src, &dst),
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ip::{Ipv4Packet, Ipv6Packet};
    use crate::testdata::{frame, NAT_KEEPALIVE, UDP6, VXLAN_ARP_REQUEST};

    #[test]
    fn captured_udp6_checksum() {
        let f = frame(UDP6);
        let ip = Ipv6Packet::new_checked(&f[14..]).unwrap();
        let udp = UdpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!(udp.src_port(), 38477);
        assert_eq!(udp.dst_port(), 4500);
        assert_eq!(udp.len(), 25);
        assert_eq!(udp.payload(), b"protego udp6 test");
        assert!(udp.verify_checksum_v6(&ip.src_addr(), &ip.dst_addr()));
        assert!(udp.verify_checksum(&ip.src_addr().into(), &ip.dst_addr().into()));
        assert!(!udp.verify_checksum_v6(&ip.dst_addr(), &"fd00:9::3".parse().unwrap()));

        // Rebuild the datagram from its Repr and the payload: identical bytes.
        let repr = UdpRepr::parse(&udp).unwrap();
        let mut out = vec![0u8; repr.buffer_len()];
        out[8..].copy_from_slice(udp.payload());
        let n = repr
            .emit(
                &mut out,
                UdpChecksum::V6 {
                    src: ip.src_addr(),
                    dst: ip.dst_addr(),
                },
            )
            .unwrap();
        assert_eq!(&out[..n], ip.payload());

        // IPv6 forbids a zero checksum.
        let mut z = ip.payload().to_vec();
        z[6] = 0;
        z[7] = 0;
        let zp = UdpPacket::new_checked(&z[..]).unwrap();
        assert!(!zp.verify_checksum_v6(&ip.src_addr(), &ip.dst_addr()));
    }

    #[test]
    fn captured_udp4_checksums() {
        for hex in [NAT_KEEPALIVE, VXLAN_ARP_REQUEST] {
            let f = frame(hex);
            let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
            let udp = UdpPacket::new_checked(ip.payload()).unwrap();
            assert_ne!(udp.checksum(), 0);
            assert!(udp.verify_checksum_v4(ip.src_addr(), ip.dst_addr()));
            let mut copy = ip.payload().to_vec();
            let mut p = UdpPacket::new_unchecked(&mut copy[..]);
            p.set_checksum(0x1234);
            assert!(!p.verify_checksum_v4(ip.src_addr(), ip.dst_addr()));
            p.fill_checksum_v4(ip.src_addr(), ip.dst_addr());
            assert_eq!(p.checksum(), udp.checksum());
            // Zero means "no checksum" over IPv4.
            p.set_checksum(0);
            assert!(p.verify_checksum_v4(ip.src_addr(), ip.dst_addr()));
        }
    }

    #[test]
    fn length_checks() {
        assert!(matches!(
            UdpPacket::new_checked(&[0u8; 7][..]),
            Err(WireError::Truncated { .. })
        ));
        let mut d = [0u8; 12];
        d[4..6].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(
            UdpPacket::new_checked(&d[..]),
            Err(WireError::Malformed {
                what: "udp",
                field: "length"
            })
        );
        d[4..6].copy_from_slice(&13u16.to_be_bytes());
        assert!(matches!(
            UdpPacket::new_checked(&d[..]),
            Err(WireError::Truncated { .. })
        ));
        d[4..6].copy_from_slice(&10u16.to_be_bytes());
        let p = UdpPacket::new_checked(&d[..]).unwrap();
        assert_eq!(p.payload().len(), 2);
        let r = UdpRepr {
            src_port: 1,
            dst_port: 2,
            payload_len: 10,
        };
        assert!(matches!(
            r.emit(&mut d, UdpChecksum::Zero),
            Err(WireError::BufferTooSmall { .. })
        ));
    }
}
