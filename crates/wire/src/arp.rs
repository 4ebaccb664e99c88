//! ARP (RFC 826) for IPv4 over Ethernet: packet view and `Repr`. Other hardware or
//! protocol types are reported as `Unsupported`.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-------------------------------+-------------------------------+
//! |   Hardware type (1 = Ether)   |   Protocol type (0x0800)      |
//! +---------------+---------------+-------------------------------+
//! |  HLEN (6)     |  PLEN (4)     |   Operation (1 req, 2 reply)  |
//! +---------------+---------------+-------------------------------+
//! |  Sender hardware address (6) | Sender protocol address (4)    |
//! |  Target hardware address (6) | Target protocol address (4)    |
//! +---------------------------------------------------------------+
//! ```

use core::fmt;
use std::net::Ipv4Addr;

use crate::error::WireError;
use crate::ethernet::{EtherType, EthernetAddress};
use crate::field::{need, room, set_u16, u16_at, u32_at};

/// Length of an Ethernet/IPv4 ARP packet.
pub const ARP_LEN: usize = 28;

const HTYPE: usize = 0;
const PTYPE: usize = 2;
const HLEN: usize = 4;
const PLEN: usize = 5;
const OPER: usize = 6;
const SHA: usize = 8;
const SPA: usize = 14;
const THA: usize = 18;
const TPA: usize = 24;
const HTYPE_ETHERNET: u16 = 1;

/// An ARP operation code; an open registry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArpOperation(pub u16);

impl ArpOperation {
    /// Request.
    pub const REQUEST: Self = Self(1);
    /// Reply.
    pub const REPLY: Self = Self(2);
}

impl fmt::Debug for ArpOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::REQUEST => f.write_str("request"),
            Self::REPLY => f.write_str("reply"),
            Self(v) => write!(f, "{v:#06x}"),
        }
    }
}

/// A read/write view of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
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

    /// Checks 28 bytes are present and the packet is Ethernet (1) / IPv4 (0x0800) with
    /// address lengths 6 and 4. Trailing bytes (Ethernet padding) are ignored.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        need("arp", b.len(), ARP_LEN)?;
        let htype = u16_at(b, HTYPE);
        if htype != HTYPE_ETHERNET {
            return Err(WireError::Unsupported {
                what: "arp",
                field: "hardware type",
                value: htype.into(),
            });
        }
        let ptype = u16_at(b, PTYPE);
        if ptype != EtherType::IPV4.0 {
            return Err(WireError::Unsupported {
                what: "arp",
                field: "protocol type",
                value: ptype.into(),
            });
        }
        if b[HLEN] != 6 {
            return Err(WireError::Malformed {
                what: "arp",
                field: "hardware length",
            });
        }
        if b[PLEN] != 4 {
            return Err(WireError::Malformed {
                what: "arp",
                field: "protocol length",
            });
        }
        Ok(())
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Operation.
    pub fn operation(&self) -> ArpOperation {
        ArpOperation(u16_at(self.buffer.as_ref(), OPER))
    }

    /// Sender hardware address.
    pub fn source_hardware_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[SHA..SHA + 6]);
        EthernetAddress(a)
    }

    /// Sender protocol address.
    pub fn source_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32_at(self.buffer.as_ref(), SPA))
    }

    /// Target hardware address (zero in a request).
    pub fn target_hardware_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[THA..THA + 6]);
        EthernetAddress(a)
    }

    /// Target protocol address.
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32_at(self.buffer.as_ref(), TPA))
    }
}

/// An Ethernet/IPv4 ARP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArpRepr {
    /// Request or reply.
    pub operation: ArpOperation,
    /// Sender MAC.
    pub source_hardware_addr: EthernetAddress,
    /// Sender IPv4 address.
    pub source_protocol_addr: Ipv4Addr,
    /// Target MAC.
    pub target_hardware_addr: EthernetAddress,
    /// Target IPv4 address.
    pub target_protocol_addr: Ipv4Addr,
}

impl ArpRepr {
    /// Parses an ARP packet; only requests and replies are accepted.
    pub fn parse<T: AsRef<[u8]>>(packet: &ArpPacket<T>) -> Result<Self, WireError> {
        packet.check_len()?;
        let operation = packet.operation();
        if operation != ArpOperation::REQUEST && operation != ArpOperation::REPLY {
            return Err(WireError::Unsupported {
                what: "arp",
                field: "operation",
                value: operation.0.into(),
            });
        }
        Ok(Self {
            operation,
            source_hardware_addr: packet.source_hardware_addr(),
            source_protocol_addr: packet.source_protocol_addr(),
            target_hardware_addr: packet.target_hardware_addr(),
            target_protocol_addr: packet.target_protocol_addr(),
        })
    }

    /// The reply a host owning `target_protocol_addr` with MAC `mac` sends to this request.
    pub fn reply(&self, mac: EthernetAddress) -> Self {
        Self {
            operation: ArpOperation::REPLY,
            source_hardware_addr: mac,
            source_protocol_addr: self.target_protocol_addr,
            target_hardware_addr: self.source_hardware_addr,
            target_protocol_addr: self.source_protocol_addr,
        }
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        ARP_LEN
    }

    /// Writes the packet into `buf[..28]`; returns 28.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        room("arp", buf.len(), ARP_LEN)?;
        let b = &mut buf[..ARP_LEN];
        set_u16(b, HTYPE, HTYPE_ETHERNET);
        set_u16(b, PTYPE, EtherType::IPV4.0);
        b[HLEN] = 6;
        b[PLEN] = 4;
        set_u16(b, OPER, self.operation.0);
        b[SHA..SHA + 6].copy_from_slice(&self.source_hardware_addr.0);
        b[SPA..SPA + 4].copy_from_slice(&self.source_protocol_addr.octets());
        b[THA..THA + 6].copy_from_slice(&self.target_hardware_addr.0);
        b[TPA..TPA + 4].copy_from_slice(&self.target_protocol_addr.octets());
        Ok(ARP_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{frame, ARP_REPLY, ARP_REQUEST, VXLAN_ARP_REQUEST};

    #[test]
    fn captured_request_and_reply() {
        let req = frame(ARP_REQUEST);
        let p = ArpPacket::new_checked(&req[14..]).unwrap();
        let r = ArpRepr::parse(&p).unwrap();
        assert_eq!(r.operation, ArpOperation::REQUEST);
        assert_eq!(
            r.source_hardware_addr,
            EthernetAddress([2, 0, 0, 0, 0x0a, 0x01])
        );
        assert_eq!(r.source_protocol_addr, Ipv4Addr::new(10, 9, 0, 1));
        assert_eq!(r.target_hardware_addr, EthernetAddress([0; 6]));
        assert_eq!(r.target_protocol_addr, Ipv4Addr::new(10, 9, 0, 2));
        let mut out = [0u8; 28];
        r.emit(&mut out).unwrap();
        assert_eq!(&out[..], &req[14..]);

        // Our reply to the captured request is byte-identical to the kernel's.
        let rep = frame(ARP_REPLY);
        let answer = r.reply(EthernetAddress([2, 0, 0, 0, 0x0b, 0x02]));
        answer.emit(&mut out).unwrap();
        assert_eq!(&out[..], &rep[14..]);
        assert_eq!(
            ArpRepr::parse(&ArpPacket::new_checked(&rep[14..]).unwrap()).unwrap(),
            answer
        );

        // Inside VXLAN (offset 14 + 20 + 8 + 8 + 14).
        let v = frame(VXLAN_ARP_REQUEST);
        let p = ArpPacket::new_checked(&v[64..]).unwrap();
        assert_eq!(p.target_protocol_addr(), Ipv4Addr::new(192, 168, 77, 2));
    }

    #[test]
    fn rejects_other_types() {
        let req = frame(ARP_REQUEST);
        let arp = &req[14..];
        assert!(matches!(
            ArpPacket::new_checked(&arp[..27]),
            Err(WireError::Truncated { .. })
        ));
        for (i, v) in [(1, 6u8), (3, 0x06), (4, 8), (5, 16)] {
            let mut b = arp.to_vec();
            b[i] = v;
            assert!(ArpPacket::new_checked(&b[..]).is_err(), "byte {i}");
        }
        let mut b = arp.to_vec();
        b[7] = 3; // RARP request
        assert!(ArpRepr::parse(&ArpPacket::new_checked(&b[..]).unwrap()).is_err());
        assert_eq!(format!("{:?}", ArpOperation(3)), "0x0003");
    }
}
