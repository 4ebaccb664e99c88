//! ESP header view (RFC 4303 §2) and the UDP encapsulation rules of RFC 3948 §2 for port
//! 4500: non-ESP marker (IKE), NAT-keepalive, ESP.
//!
//! ```text
//! RFC 4303 §2.1                                 RFC 3948 §2.2 (IKE on port 4500)
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |               Security Parameters Index (SPI)                 |  <- 0 = non-ESP marker
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                      Sequence Number                          |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |   IV, encrypted payload, padding, pad length, next header,    |
//! |   ICV (the esp crate handles these)                           |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! RFC 3948 §2.3: a NAT-keepalive is a UDP payload of the single octet 0xFF.

use crate::error::WireError;
use crate::field::{need, set_u32, u32_at};
use crate::EspSpi;

/// Length of the ESP header (SPI and Sequence Number).
pub const ESP_HEADER_LEN: usize = 8;
/// UDP port for IKE and ESP after NAT detection (RFC 3948 §2.2, RFC 7296 §2.23).
pub const NAT_T_PORT: u16 = 4500;
/// The non-ESP marker that precedes IKE messages on port 4500 (RFC 3948 §2.2).
pub const NON_ESP_MARKER: [u8; 4] = [0; 4];
/// Length of the non-ESP marker.
pub const NON_ESP_MARKER_LEN: usize = 4;
/// The NAT-keepalive payload octet (RFC 3948 §2.3).
pub const NAT_KEEPALIVE: u8 = 0xff;

/// A read/write view of an ESP packet's header; the rest is opaque here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EspPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EspPacket<T> {
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
        need("esp", self.buffer.as_ref().len(), ESP_HEADER_LEN)
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Security Parameters Index.
    pub fn spi(&self) -> EspSpi {
        EspSpi(u32_at(self.buffer.as_ref(), 0))
    }

    /// Sequence Number (the low 32 bits when ESN is used, RFC 4303 §2.2.1).
    pub fn seq(&self) -> u32 {
        u32_at(self.buffer.as_ref(), 4)
    }

    /// Everything after the header: IV, ciphertext, ICV.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[ESP_HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EspPacket<T> {
    /// Sets the SPI.
    pub fn set_spi(&mut self, spi: EspSpi) {
        set_u32(self.buffer.as_mut(), 0, spi.0);
    }

    /// Sets the (low 32 bits of the) sequence number.
    pub fn set_seq(&mut self, seq: u32) {
        set_u32(self.buffer.as_mut(), 4, seq);
    }

    /// Everything after the header, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[ESP_HEADER_LEN..]
    }
}

/// What a UDP payload received on port 4500 carries (RFC 3948 §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UdpEncap {
    /// A NAT-keepalive (one 0xFF octet): drop after noting the peer is alive.
    NatKeepalive,
    /// An IKE message after the non-ESP marker; it starts at [`NON_ESP_MARKER_LEN`].
    Ike,
    /// An ESP packet with this SPI; it starts at offset 0.
    Esp(EspSpi),
}

impl UdpEncap {
    /// Classifies a UDP payload from port 4500. Per RFC 3948 §2.2 a zero first word is the
    /// non-ESP marker (SPI 0 is never used), otherwise the payload is ESP and must hold at
    /// least the ESP header.
    pub fn classify(udp_payload: &[u8]) -> Result<Self, WireError> {
        match udp_payload {
            [NAT_KEEPALIVE] => Ok(Self::NatKeepalive),
            [0, 0, 0, 0, ..] => Ok(Self::Ike),
            p if p.len() >= ESP_HEADER_LEN => Ok(Self::Esp(EspSpi(u32_at(p, 0)))),
            p => Err(WireError::Truncated {
                what: "udp-encap",
                need: ESP_HEADER_LEN,
                got: p.len(),
            }),
        }
    }

    /// Where the carried message starts in the UDP payload (the IKE header after the
    /// marker; the ESP header at 0). `None` for a keepalive.
    pub fn payload_offset(self) -> Option<usize> {
        match self {
            Self::NatKeepalive => None,
            Self::Ike => Some(NON_ESP_MARKER_LEN),
            Self::Esp(_) => Some(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ip::Ipv4Packet;
    use crate::testdata::{frame, NAT_KEEPALIVE as KEEPALIVE_FRAME};
    use crate::udp::UdpPacket;

    #[test]
    fn header_fields() {
        let mut b = [0u8; 12];
        let mut p = EspPacket::new_checked(&mut b[..]).unwrap();
        p.set_spi(EspSpi(0xc0ffee01));
        p.set_seq(7);
        p.payload_mut()[0] = 0xaa;
        assert_eq!(&b[..9], &[0xc0, 0xff, 0xee, 0x01, 0, 0, 0, 7, 0xaa]);
        let p = EspPacket::new_checked(&b[..]).unwrap();
        assert_eq!(p.spi(), EspSpi(0xc0ffee01));
        assert_eq!(p.seq(), 7);
        assert_eq!(p.payload().len(), 4);
        assert!(EspPacket::new_checked(&b[..7]).is_err());
    }

    #[test]
    fn classify_port_4500() {
        let f = frame(KEEPALIVE_FRAME);
        let ip = Ipv4Packet::new_checked(&f[14..]).unwrap();
        let udp = UdpPacket::new_checked(ip.payload()).unwrap();
        assert_eq!(udp.dst_port(), NAT_T_PORT);
        assert_eq!(
            UdpEncap::classify(udp.payload()),
            Ok(UdpEncap::NatKeepalive)
        );
        assert_eq!(UdpEncap::NatKeepalive.payload_offset(), None);

        let ike = [0, 0, 0, 0, 0x11, 0x22];
        assert_eq!(UdpEncap::classify(&ike), Ok(UdpEncap::Ike));
        assert_eq!(UdpEncap::Ike.payload_offset(), Some(4));
        let esp = [0, 0, 1, 0, 0, 0, 0, 1];
        assert_eq!(UdpEncap::classify(&esp), Ok(UdpEncap::Esp(EspSpi(256))));
        assert!(UdpEncap::classify(&esp[..7]).is_err());
        assert!(UdpEncap::classify(&[]).is_err());
        assert!(UdpEncap::classify(&[0xfe]).is_err());
        assert!(UdpEncap::classify(&[0, 0, 0]).is_err());
    }
}
