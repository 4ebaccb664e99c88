//! VXLAN header view and builder (RFC 7348 §5), interoperable with Linux kernel vxlan devices.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |R|R|R|R|I|R|R|R|            Reserved                           |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                VXLAN Network Identifier (VNI) |   Reserved    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                 inner Ethernet frame ...
//! ```
//!
//! RFC 7348 §5: the I flag MUST be 1 for a valid VNI; the R bits MUST be zero on
//! transmission and are ignored on receipt.

use core::fmt;

use crate::error::WireError;
use crate::field::{need, room, u32_at};

/// Length of the VXLAN header.
pub const VXLAN_HEADER_LEN: usize = 8;
/// IANA-assigned UDP destination port for VXLAN (RFC 7348 §5).
pub const VXLAN_PORT: u16 = 4789;
/// The I flag: the VNI is valid.
pub const FLAG_VNI: u8 = 0x08;

/// A 24-bit VXLAN Network Identifier.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Vni(u32);

impl Vni {
    /// Largest VNI.
    pub const MAX: u32 = 0x00ff_ffff;

    /// A VNI, if `v` fits in 24 bits.
    pub const fn new(v: u32) -> Option<Self> {
        if v <= Self::MAX {
            Some(Self(v))
        } else {
            None
        }
    }

    /// The numeric value.
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Vni {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Vni {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A read/write view of a VXLAN header and the frame it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VxlanPacket<T> {
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

    /// Checks the 8-byte header is present.
    pub fn check_len(&self) -> Result<(), WireError> {
        need("vxlan", self.buffer.as_ref().len(), VXLAN_HEADER_LEN)
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The flags octet.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// True if the I flag is set (the VNI is valid).
    pub fn has_vni(&self) -> bool {
        self.flags() & FLAG_VNI != 0
    }

    /// The VNI field (meaningful only if [`Self::has_vni`]).
    pub fn vni(&self) -> Vni {
        Vni(u32_at(self.buffer.as_ref(), 4) >> 8)
    }

    /// The inner Ethernet frame.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[VXLAN_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VxlanPacket<T> {
    /// Writes a header for `vni`: I flag set, every reserved bit zero.
    pub fn set_header(&mut self, vni: Vni) {
        let b = self.buffer.as_mut();
        b[..VXLAN_HEADER_LEN].copy_from_slice(&[FLAG_VNI, 0, 0, 0, 0, 0, 0, 0]);
        b[4..7].copy_from_slice(&vni.0.to_be_bytes()[1..]);
    }

    /// The inner Ethernet frame, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[VXLAN_HEADER_LEN..]
    }
}

/// The content of a VXLAN header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VxlanRepr {
    /// The network identifier.
    pub vni: Vni,
}

impl VxlanRepr {
    /// Reads a header; RFC 7348 §5 requires the I flag, reserved bits are ignored.
    pub fn parse<T: AsRef<[u8]>>(packet: &VxlanPacket<T>) -> Result<Self, WireError> {
        packet.check_len()?;
        if !packet.has_vni() {
            return Err(WireError::Malformed {
                what: "vxlan",
                field: "I flag",
            });
        }
        Ok(Self { vni: packet.vni() })
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        VXLAN_HEADER_LEN
    }

    /// Writes the header into `buf[..8]`; returns 8.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        room("vxlan", buf.len(), VXLAN_HEADER_LEN)?;
        VxlanPacket::new_unchecked(&mut buf[..VXLAN_HEADER_LEN]).set_header(self.vni);
        Ok(VXLAN_HEADER_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ethernet::{EtherType, EthernetFrame};
    use crate::testdata::{frame, VXLAN_ARP_REQUEST, VXLAN_ICMP};

    #[test]
    fn captured_linux_vxlan() {
        for hex in [VXLAN_ARP_REQUEST, VXLAN_ICMP] {
            let f = frame(hex);
            // Ethernet 14 + IPv4 20 + UDP 8.
            let v = VxlanPacket::new_checked(&f[42..]).unwrap();
            assert_eq!(v.flags(), 0x08);
            assert!(v.has_vni());
            assert_eq!(v.vni(), Vni::new(42).unwrap());
            let repr = VxlanRepr::parse(&v).unwrap();
            let mut out = [0u8; 8];
            assert_eq!(repr.emit(&mut out).unwrap(), 8);
            assert_eq!(&out, &f[42..50]);
            let inner = EthernetFrame::new_checked(v.payload()).unwrap();
            assert!(inner.ethertype() == EtherType::ARP || inner.ethertype() == EtherType::IPV4);
        }
    }

    #[test]
    fn flags_and_vni_limits() {
        let mut b = [0xffu8; 8];
        let mut v = VxlanPacket::new_checked(&mut b[..]).unwrap();
        v.set_header(Vni::new(0x00ab_cdef).unwrap());
        assert_eq!(b, [0x08, 0, 0, 0, 0xab, 0xcd, 0xef, 0]);
        // Reserved bits are ignored on receipt.
        let mut r = b;
        r[0] = 0xff;
        r[7] = 0x55;
        assert_eq!(
            VxlanRepr::parse(&VxlanPacket::new_unchecked(&r[..]))
                .unwrap()
                .vni
                .get(),
            0x00ab_cdef
        );
        // I flag clear: invalid.
        r[0] = 0x00;
        assert!(VxlanRepr::parse(&VxlanPacket::new_unchecked(&r[..])).is_err());
        assert!(VxlanPacket::new_checked(&b[..7]).is_err());
        assert_eq!(Vni::new(1 << 24), None);
        assert_eq!(Vni::new(Vni::MAX).map(Vni::get), Some(0x00ff_ffff));
    }
}
