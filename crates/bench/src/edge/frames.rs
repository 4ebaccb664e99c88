//! The customer edge's frames on the attachment's link: Ethernet with an IEEE 802.1ad S-tag
//! (TPID 0x88a8) outside an 802.1Q C-tag (0x8100), as the CE's VLAN sub-interfaces would send
//! them, carrying the bench's inner IPv4/UDP packets or ARP (RFC 826).
//!
//! ```text
//!  dst MAC (6) | src MAC (6) | 0x88a8 | S-tag (2) | 0x8100 | C-tag (2) | EtherType (2) | payload
//! ```
//!
//! Received frames may come with their outer tag already taken off by the kernel (it hands it
//! over as packet metadata): [`ip_payload`] skips whatever tags are left.

use wire::arp::ArpRepr;
use wire::ethernet::{EtherType, EthernetAddress};

use crate::packet::{self, InnerSpec};

/// TPID of an 802.1ad service tag.
pub(crate) const TPID_S: u16 = 0x88a8;
/// TPID of an 802.1Q customer tag.
pub(crate) const TPID_C: u16 = 0x8100;
/// Ethernet header with two tags.
pub(crate) const QINQ_HEADER: usize = 22;
/// Shortest Ethernet frame without FCS.
const MIN_FRAME: usize = 60;
/// ARP payload length (Ethernet/IPv4).
const ARP_LEN: usize = 28;

/// The two VLAN ids of a Q-in-Q attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tags {
    /// Outer (802.1ad) VLAN id.
    pub(crate) s_tag: u16,
    /// Inner (802.1Q) VLAN id.
    pub(crate) c_tag: u16,
}

/// Writes the tagged Ethernet header at the start of `buf`; returns [`QINQ_HEADER`], or None
/// if `buf` is too short.
fn write_header(
    buf: &mut [u8],
    dst: EthernetAddress,
    src: EthernetAddress,
    tags: Tags,
    ethertype: EtherType,
) -> Option<usize> {
    let h = buf.get_mut(..QINQ_HEADER)?;
    h[0..6].copy_from_slice(&dst.0);
    h[6..12].copy_from_slice(&src.0);
    h[12..14].copy_from_slice(&TPID_S.to_be_bytes());
    h[14..16].copy_from_slice(&(tags.s_tag & 0x0fff).to_be_bytes());
    h[16..18].copy_from_slice(&TPID_C.to_be_bytes());
    h[18..20].copy_from_slice(&(tags.c_tag & 0x0fff).to_be_bytes());
    h[20..22].copy_from_slice(&ethertype.0.to_be_bytes());
    Some(QINQ_HEADER)
}

/// Writes a tagged frame carrying an inner IPv4/UDP packet of `size` bytes (tag and index in
/// its payload, see [`packet::write_inner`]); returns the frame's length, or None if it does
/// not fit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_ip_frame(
    buf: &mut [u8],
    dst: EthernetAddress,
    src: EthernetAddress,
    tags: Tags,
    inner: &InnerSpec,
    size: usize,
    tag: u32,
    index: u32,
) -> Option<usize> {
    let h = write_header(buf, dst, src, tags, EtherType::IPV4)?;
    let n = packet::write_inner(buf.get_mut(h..)?, inner, size, tag, index)?;
    let len = h + n;
    // Short frames are padded (after the IP packet, which its Total Length delimits).
    if len < MIN_FRAME {
        buf.get_mut(len..MIN_FRAME)?.fill(0);
        return Some(MIN_FRAME);
    }
    Some(len)
}

/// Writes a tagged frame carrying `arp` (padded to the Ethernet minimum); returns its length.
pub(crate) fn write_arp_frame(
    buf: &mut [u8],
    dst: EthernetAddress,
    src: EthernetAddress,
    tags: Tags,
    arp: &ArpRepr,
) -> Option<usize> {
    let h = write_header(buf, dst, src, tags, EtherType::ARP)?;
    let len = (h + ARP_LEN).max(MIN_FRAME);
    let body = buf.get_mut(h..len)?;
    body.fill(0);
    arp.emit(&mut body[..ARP_LEN]).ok()?;
    Some(len)
}

/// The IPv4 packet of a received frame, after any VLAN tags still in it; None for a frame
/// that is not IPv4.
pub(crate) fn ip_payload(frame: &[u8]) -> Option<&[u8]> {
    let mut at = 12;
    loop {
        let t = u16::from_be_bytes(frame.get(at..at + 2)?.try_into().ok()?);
        match t {
            TPID_S | TPID_C => at += 4,
            0x0800 => return frame.get(at + 2..),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const A: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);
    const B: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 2]);
    const TAGS: Tags = Tags {
        s_tag: 100,
        c_tag: 10,
    };

    fn spec() -> InnerSpec {
        InnerSpec {
            src: Ipv4Addr::new(10, 99, 0, 2),
            dst: Ipv4Addr::new(64, 0, 0, 9),
            src_port: 1024,
            dst_port: 5001,
        }
    }

    #[test]
    fn an_ip_frame_has_both_tags_and_the_mark() {
        let mut buf = [0xffu8; 2048];
        let n = write_ip_frame(&mut buf, A, B, TAGS, &spec(), 1400, 0xabcd, 7).expect("fits");
        assert_eq!(n, QINQ_HEADER + 1400);
        assert_eq!(&buf[0..6], &A.0);
        assert_eq!(&buf[6..12], &B.0);
        assert_eq!(
            &buf[12..22],
            &[0x88, 0xa8, 0, 100, 0x81, 0x00, 0, 10, 0x08, 0x00]
        );
        let ip = ip_payload(&buf[..n]).expect("IPv4");
        let m = packet::read_inner(ip).expect("ours");
        assert_eq!((m.tag, m.index, m.len), (0xabcd, 7, 1400));
        // With the outer tag taken off by the kernel the packet is still found.
        let mut stripped = buf[..12].to_vec();
        stripped.extend_from_slice(&buf[16..n]);
        let m = packet::read_inner(ip_payload(&stripped).expect("IPv4")).expect("ours");
        assert_eq!(m.index, 7);
        // Too small a buffer or a packet is refused.
        assert_eq!(
            write_ip_frame(&mut buf[..100], A, B, TAGS, &spec(), 1400, 1, 1),
            None
        );
        assert_eq!(
            write_ip_frame(&mut buf, A, B, TAGS, &spec(), 20, 1, 1),
            None
        );
    }

    #[test]
    fn short_frames_are_padded_and_arp_is_tagged() {
        let mut buf = [0xffu8; 256];
        // 22 + 36 = 58 bytes: padded to 60.
        let n = write_ip_frame(&mut buf, A, B, TAGS, &spec(), 36, 1, 2).expect("fits");
        assert_eq!(n, 60);
        assert_eq!(&buf[58..60], &[0, 0]);
        let req = packet::arp_request(B, Ipv4Addr::new(10, 99, 0, 2), Ipv4Addr::new(10, 99, 0, 1));
        let n = write_arp_frame(&mut buf, EthernetAddress::BROADCAST, B, TAGS, &req).expect("fits");
        assert_eq!(n, 60);
        assert_eq!(&buf[20..22], &[0x08, 0x06]);
        let parsed = wire::arp::ArpPacket::new_checked(&buf[22..50]).expect("arp");
        assert_eq!(ArpRepr::parse(&parsed).expect("repr"), req);
        assert_eq!(ip_payload(&buf[..n]), None);
        assert_eq!(ip_payload(&buf[..13]), None);
    }
}
