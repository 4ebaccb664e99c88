//! Ethernet II frames and IEEE 802.1Q VLAN tags (single C-tag, or 802.1ad Q-in-Q with an
//! S-tag outside a C-tag): views, and a `Repr` that parses and emits the whole tag stack.
//!
//! ```text
//! +----------------+----------------+--------+------------------
//! | destination(6) |   source(6)    | type(2)| payload ...              untagged
//! +----------------+----------------+--------+------------------
//! | destination(6) |   source(6)    | 0x8100 | TCI(2) | type(2)| ...   802.1Q
//! +----------------+----------------+--------+--------+--------+
//!   TCI: PCP(3) | DEI(1) | VID(12)
//! ```

use core::fmt;
use std::net::Ipv6Addr;

use crate::error::WireError;
use crate::field::{need, room, set_u16, u16_at};

/// Length of an untagged Ethernet II header.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Length of one VLAN tag (TPID is the previous EtherType; TCI plus the next EtherType).
pub const VLAN_TAG_LEN: usize = 4;

/// A 48-bit MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: Self = Self([0xff; 6]);

    /// Reads an address from the first six bytes of `b` (which must hold them).
    fn from_slice(b: &[u8]) -> Self {
        let mut a = [0u8; 6];
        a.copy_from_slice(&b[..6]);
        Self(a)
    }

    /// True for ff:ff:ff:ff:ff:ff.
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// True if the group bit is set (multicast or broadcast).
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// True for an individual (unicast) address.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// True if the locally-administered bit is set.
    pub fn is_local(&self) -> bool {
        self.0[0] & 0x02 != 0
    }

    /// The MAC address an IPv6 multicast group maps to: 33:33 and the group's low 32 bits
    /// (RFC 2464 §7).
    pub fn from_ipv6_multicast(group: &Ipv6Addr) -> Self {
        let o = group.octets();
        Self([0x33, 0x33, o[12], o[13], o[14], o[15]])
    }
}

impl fmt::Debug for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Why a text is not a MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a MAC address: six hexadecimal bytes separated by colons, e.g. 02:00:5e:10:00:01")]
pub struct MacParseError;

impl core::str::FromStr for EthernetAddress {
    type Err = MacParseError;

    /// Reads the usual form: six bytes of one or two hexadecimal digits, separated by colons
    /// (`02:00:5e:10:00:01`, as `ip link` prints it).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut mac = [0u8; 6];
        let mut parts = text.split(':');
        for b in &mut mac {
            let p = parts.next().ok_or(MacParseError)?;
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(MacParseError);
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| MacParseError)?;
        }
        if parts.next().is_some() {
            return Err(MacParseError);
        }
        Ok(Self(mac))
    }
}

/// An EtherType (IEEE 802 numbers); an open registry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct EtherType(pub u16);

impl EtherType {
    /// IPv4.
    pub const IPV4: Self = Self(0x0800);
    /// ARP.
    pub const ARP: Self = Self(0x0806);
    /// IEEE 802.1Q customer VLAN tag (C-tag).
    pub const VLAN: Self = Self(0x8100);
    /// IPv6.
    pub const IPV6: Self = Self(0x86dd);
    /// IEEE 802.1ad service VLAN tag (S-tag, Q-in-Q).
    pub const QINQ: Self = Self(0x88a8);

    fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::IPV4 => "IPv4",
            Self::ARP => "ARP",
            Self::VLAN => "802.1Q",
            Self::IPV6 => "IPv6",
            Self::QINQ => "802.1ad",
            _ => return None,
        })
    }
}

impl fmt::Debug for EtherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "{:#06x}", self.0),
        }
    }
}

impl fmt::Display for EtherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A read/write view of an Ethernet II frame (no FCS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
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

    /// Checks the 14-byte header is present.
    pub fn check_len(&self) -> Result<(), WireError> {
        need("ethernet", self.buffer.as_ref().len(), ETHERNET_HEADER_LEN)
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Destination address.
    pub fn dst_addr(&self) -> EthernetAddress {
        EthernetAddress::from_slice(&self.buffer.as_ref()[0..6])
    }

    /// Source address.
    pub fn src_addr(&self) -> EthernetAddress {
        EthernetAddress::from_slice(&self.buffer.as_ref()[6..12])
    }

    /// The (outermost) EtherType; a VLAN TPID if the frame is tagged.
    pub fn ethertype(&self) -> EtherType {
        EtherType(u16_at(self.buffer.as_ref(), 12))
    }

    /// Everything after the 14-byte header (a VLAN tag first if tagged).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[ETHERNET_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[0..6].copy_from_slice(&a.0);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[6..12].copy_from_slice(&a.0);
    }

    /// Sets the EtherType.
    pub fn set_ethertype(&mut self, t: EtherType) {
        set_u16(self.buffer.as_mut(), 12, t.0);
    }

    /// Everything after the header, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[ETHERNET_HEADER_LEN..]
    }
}

/// The Tag Control Information of a VLAN tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTci {
    /// Priority Code Point (3 bits).
    pub pcp: u8,
    /// Drop Eligible Indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits; 0 = priority tag only, 4095 reserved).
    pub vid: u16,
}

impl VlanTci {
    /// Decodes a 16-bit TCI.
    pub fn from_bits(tci: u16) -> Self {
        Self {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }

    /// Encodes the TCI; `None` if a field is out of range.
    pub fn to_bits(self) -> Option<u16> {
        (self.pcp <= 7 && self.vid <= 0x0fff)
            .then(|| (u16::from(self.pcp) << 13) | (u16::from(self.dei) << 12) | self.vid)
    }
}

/// A read/write view of one VLAN tag as it follows a TPID: TCI, then the next EtherType.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VlanPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VlanPacket<T> {
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

    /// Checks the 4-byte tag is present.
    pub fn check_len(&self) -> Result<(), WireError> {
        need("vlan", self.buffer.as_ref().len(), VLAN_TAG_LEN)
    }

    /// The Tag Control Information.
    pub fn tci(&self) -> VlanTci {
        VlanTci::from_bits(u16_at(self.buffer.as_ref(), 0))
    }

    /// The EtherType after the tag.
    pub fn ethertype(&self) -> EtherType {
        EtherType(u16_at(self.buffer.as_ref(), 2))
    }

    /// Everything after the tag.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[VLAN_TAG_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VlanPacket<T> {
    /// Sets the TCI from raw bits.
    pub fn set_tci_bits(&mut self, tci: u16) {
        set_u16(self.buffer.as_mut(), 0, tci);
    }

    /// Sets the EtherType after the tag.
    pub fn set_ethertype(&mut self, t: EtherType) {
        set_u16(self.buffer.as_mut(), 2, t.0);
    }
}

/// The VLAN tags of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum VlanTags {
    /// Untagged.
    #[default]
    None,
    /// One 802.1Q C-tag (TPID 0x8100).
    Single(VlanTci),
    /// Q-in-Q: an outer S-tag (emitted with TPID 0x88a8; 0x8100 also accepted on parse)
    /// and an inner C-tag (0x8100).
    Double {
        /// The service (outer) tag.
        outer: VlanTci,
        /// The customer (inner) tag.
        inner: VlanTci,
    },
}

impl VlanTags {
    /// Bytes the tags occupy.
    pub const fn len(&self) -> usize {
        match self {
            Self::None => 0,
            Self::Single(_) => VLAN_TAG_LEN,
            Self::Double { .. } => 2 * VLAN_TAG_LEN,
        }
    }

    /// True if untagged.
    pub const fn is_empty(&self) -> bool {
        matches!(self, Self::None)
    }
}

/// An Ethernet header with its VLAN tag stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Source address.
    pub src_addr: EthernetAddress,
    /// Destination address.
    pub dst_addr: EthernetAddress,
    /// VLAN tags.
    pub vlans: VlanTags,
    /// The EtherType of the payload (after any tags).
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Parses the header and up to two VLAN tags; returns the representation and the offset
    /// of the payload. More than two tags is `Unsupported`.
    pub fn parse(frame: &[u8]) -> Result<(Self, usize), WireError> {
        let f = EthernetFrame::new_checked(frame)?;
        let mut off = ETHERNET_HEADER_LEN;
        let mut ethertype = f.ethertype();
        let mut tags = [VlanTci::default(); 2];
        let mut n = 0;
        while ethertype == EtherType::VLAN || ethertype == EtherType::QINQ {
            if n == 2 {
                return Err(WireError::Unsupported {
                    what: "ethernet",
                    field: "vlan depth",
                    value: 3,
                });
            }
            let tag = VlanPacket::new_checked(&frame[off..])?;
            tags[n] = tag.tci();
            ethertype = tag.ethertype();
            off += VLAN_TAG_LEN;
            n += 1;
        }
        let vlans = match n {
            0 => VlanTags::None,
            1 => VlanTags::Single(tags[0]),
            _ => VlanTags::Double {
                outer: tags[0],
                inner: tags[1],
            },
        };
        Ok((
            Self {
                src_addr: f.src_addr(),
                dst_addr: f.dst_addr(),
                vlans,
                ethertype,
            },
            off,
        ))
    }

    /// Bytes [`Self::emit`] writes (14 plus 4 per tag).
    pub const fn buffer_len(&self) -> usize {
        ETHERNET_HEADER_LEN + self.vlans.len()
    }

    /// Writes the header and tags into `buf`; returns the payload offset.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.buffer_len();
        room("ethernet", buf.len(), len)?;
        let bits = |t: VlanTci| {
            t.to_bits().ok_or(WireError::Malformed {
                what: "vlan",
                field: "tci",
            })
        };
        let mut f = EthernetFrame::new_unchecked(&mut buf[..len]);
        f.set_dst_addr(self.dst_addr);
        f.set_src_addr(self.src_addr);
        match self.vlans {
            VlanTags::None => f.set_ethertype(self.ethertype),
            VlanTags::Single(t) => {
                let tci = bits(t)?;
                f.set_ethertype(EtherType::VLAN);
                let mut v = VlanPacket::new_unchecked(&mut buf[ETHERNET_HEADER_LEN..len]);
                v.set_tci_bits(tci);
                v.set_ethertype(self.ethertype);
            }
            VlanTags::Double { outer, inner } => {
                let (o, i) = (bits(outer)?, bits(inner)?);
                f.set_ethertype(EtherType::QINQ);
                let mut v = VlanPacket::new_unchecked(&mut buf[ETHERNET_HEADER_LEN..]);
                v.set_tci_bits(o);
                v.set_ethertype(EtherType::VLAN);
                let mut v =
                    VlanPacket::new_unchecked(&mut buf[ETHERNET_HEADER_LEN + VLAN_TAG_LEN..len]);
                v.set_tci_bits(i);
                v.set_ethertype(self.ethertype);
            }
        }
        Ok(len)
    }
}

pub mod tags;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{frame, ARP_REQUEST, NS};

    #[test]
    fn mac_addresses_read_as_ip_link_prints_them() {
        let m: EthernetAddress = "02:00:5e:10:0:Ab".parse().unwrap();
        assert_eq!(m, EthernetAddress([2, 0, 0x5e, 0x10, 0, 0xab]));
        assert_eq!(m.to_string(), "02:00:5e:10:00:ab");
        for bad in [
            "",
            "02:00:5e:10:00",
            "02:00:5e:10:00:01:02",
            "02-00-5e-10-00-01",
            "02:00:5e:10:00:100",
            "02:00:5e:10::01",
            "02:00:5e:10:00:+1",
            "g2:00:5e:10:00:01",
        ] {
            assert_eq!(
                bad.parse::<EthernetAddress>(),
                Err(MacParseError),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn captured_frames() {
        let f = frame(ARP_REQUEST);
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert!(e.dst_addr().is_broadcast());
        assert_eq!(e.src_addr(), EthernetAddress([2, 0, 0, 0, 0x0a, 0x01]));
        assert!(e.src_addr().is_unicast() && e.src_addr().is_local());
        assert_eq!(e.ethertype(), EtherType::ARP);
        assert_eq!(e.payload().len(), 28);
        let (r, off) = EthernetRepr::parse(&f).unwrap();
        assert_eq!((r.vlans, off), (VlanTags::None, 14));
        let mut out = [0u8; 14];
        r.emit(&mut out).unwrap();
        assert_eq!(&out[..], &f[..14]);
        assert_eq!(format!("{}", e.src_addr()), "02:00:00:00:0a:01");

        // The NS goes to the solicited-node group's MAC (RFC 2464 §7).
        let f = frame(NS);
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        let group: Ipv6Addr = "ff02::1:ff00:2".parse().unwrap();
        assert_eq!(e.dst_addr(), EthernetAddress::from_ipv6_multicast(&group));
        assert!(e.dst_addr().is_multicast());
        assert_eq!(e.ethertype(), EtherType::IPV6);
    }

    #[test]
    fn vlan_single_and_qinq_round_trip() {
        let base = EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress::BROADCAST,
            vlans: VlanTags::Single(VlanTci {
                pcp: 5,
                dei: true,
                vid: 100,
            }),
            ethertype: EtherType::IPV4,
        };
        let mut buf = [0u8; 22];
        assert_eq!(base.emit(&mut buf).unwrap(), 18);
        assert_eq!(&buf[12..18], &[0x81, 0x00, 0xb0, 0x64, 0x08, 0x00]);
        assert_eq!(EthernetRepr::parse(&buf[..18]).unwrap(), (base, 18));

        let qinq = EthernetRepr {
            vlans: VlanTags::Double {
                outer: VlanTci {
                    pcp: 0,
                    dei: false,
                    vid: 7,
                },
                inner: VlanTci::from_bits(0x0fff),
            },
            ..base
        };
        assert_eq!(qinq.emit(&mut buf).unwrap(), 22);
        assert_eq!(
            &buf[12..22],
            &[0x88, 0xa8, 0x00, 0x07, 0x81, 0x00, 0x0f, 0xff, 0x08, 0x00]
        );
        assert_eq!(EthernetRepr::parse(&buf).unwrap(), (qinq, 22));

        // Old-style 0x8100/0x8100 double tagging parses too; a third tag does not.
        buf[12..14].copy_from_slice(&[0x81, 0x00]);
        assert!(matches!(
            EthernetRepr::parse(&buf).unwrap().0.vlans,
            VlanTags::Double { .. }
        ));
        let mut three = buf.to_vec();
        three[20..22].copy_from_slice(&[0x81, 0x00]);
        three.extend_from_slice(&[0, 1, 8, 0]);
        assert!(matches!(
            EthernetRepr::parse(&three),
            Err(WireError::Unsupported { .. })
        ));
        // Truncated tag.
        assert!(matches!(
            EthernetRepr::parse(&buf[..16]),
            Err(WireError::Truncated { .. })
        ));
        // Out-of-range TCI fields are rejected on emit.
        let bad = EthernetRepr {
            vlans: VlanTags::Single(VlanTci {
                pcp: 8,
                dei: false,
                vid: 1,
            }),
            ..base
        };
        assert!(bad.emit(&mut buf).is_err());
        assert!(EthernetFrame::new_checked(&buf[..13]).is_err());
    }
}
