//! The packets the load generator builds and reads: inner IPv4/UDP packets (RFC 791, RFC 768)
//! whose payload carries a run tag and a packet index, VXLAN frames (RFC 7348) around them, and
//! ARP (RFC 826) inside VXLAN, all with the `wire` crate's views.
//!
//! ```text
//! inner packet:  IPv4 (20) | UDP (8, checksum 0) | tag (4) | index (4) | zeros ...
//! VXLAN frame:   VXLAN (8) | Ethernet (14) | inner packet or ARP
//! ```

use std::net::Ipv4Addr;

use wire::arp::{ArpOperation, ArpPacket, ArpRepr};
use wire::ethernet::{EtherType, EthernetAddress, EthernetFrame, ETHERNET_HEADER_LEN};
use wire::ip::{IpProtocol, Ipv4Packet, Ipv4Repr};
use wire::udp::{UdpChecksum, UdpRepr, UDP_HEADER_LEN};
use wire::vxlan::{Vni, VxlanPacket, VxlanRepr, VXLAN_HEADER_LEN};

/// IPv4 header without options.
pub(crate) const IPV4_HEADER_LEN: usize = 20;
/// Inner IPv4 + UDP headers.
pub(crate) const INNER_HEADERS: usize = IPV4_HEADER_LEN + UDP_HEADER_LEN;
/// Bytes of payload the load generator needs: run tag and packet index.
pub(crate) const MARK_LEN: usize = 8;
/// VXLAN header plus untagged Ethernet header.
pub(crate) const VXLAN_FRAME_HEADER: usize = VXLAN_HEADER_LEN + ETHERNET_HEADER_LEN;
/// Shortest Ethernet payload (frames are padded to 60 bytes without FCS).
const MIN_ETHERNET_PAYLOAD: usize = 46;

/// Addresses and ports of an inner packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InnerSpec {
    /// Source address.
    pub(crate) src: Ipv4Addr,
    /// Destination address.
    pub(crate) dst: Ipv4Addr,
    /// UDP source port.
    pub(crate) src_port: u16,
    /// UDP destination port.
    pub(crate) dst_port: u16,
}

/// What the receiver learns from an inner packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    /// The run tag (packets of other runs are ignored).
    pub(crate) tag: u32,
    /// The packet's index in its run.
    pub(crate) index: u32,
    /// The inner packet's length (IPv4 Total Length).
    pub(crate) len: usize,
}

/// Writes an inner IPv4/UDP packet of `total_len` bytes (at least [`INNER_HEADERS`] +
/// [`MARK_LEN`]) at the start of `buf`, with `tag` and `index` in the payload. Returns
/// `total_len`, or None if it does not fit.
pub(crate) fn write_inner(
    buf: &mut [u8],
    spec: &InnerSpec,
    total_len: usize,
    tag: u32,
    index: u32,
) -> Option<usize> {
    if total_len < INNER_HEADERS + MARK_LEN || buf.len() < total_len || total_len > 65535 {
        return None;
    }
    let payload_len = total_len - INNER_HEADERS;
    let udp = &mut buf[IPV4_HEADER_LEN..total_len];
    udp[UDP_HEADER_LEN..UDP_HEADER_LEN + 4].copy_from_slice(&tag.to_be_bytes());
    udp[UDP_HEADER_LEN + 4..UDP_HEADER_LEN + 8].copy_from_slice(&index.to_be_bytes());
    udp[UDP_HEADER_LEN + MARK_LEN..].fill(0);
    UdpRepr {
        src_port: spec.src_port,
        dst_port: spec.dst_port,
        payload_len,
    }
    .emit(udp, UdpChecksum::Zero)
    .ok()?;
    Ipv4Repr {
        src_addr: spec.src,
        dst_addr: spec.dst,
        protocol: IpProtocol::UDP,
        payload_len: total_len - IPV4_HEADER_LEN,
        ttl: 64,
        dscp: 0,
        ecn: 0,
        ident: index as u16,
        dont_frag: false,
    }
    .emit(buf)
    .ok()?;
    Some(total_len)
}

/// Reads the mark of an inner IPv4/UDP packet; None if it is not one of ours.
pub(crate) fn read_inner(pkt: &[u8]) -> Option<Mark> {
    let ip = Ipv4Packet::new_checked(pkt).ok()?;
    if ip.protocol() != IpProtocol::UDP || ip.is_fragment() {
        return None;
    }
    let len = usize::from(ip.total_len());
    let payload = ip.payload().get(UDP_HEADER_LEN..)?;
    let mut mark = read_mark(payload)?;
    mark.len = len;
    Some(mark)
}

/// Reads a mark from a UDP payload (its `len` is the inner packet length the payload implies).
pub(crate) fn read_mark(payload: &[u8]) -> Option<Mark> {
    let tag = u32::from_be_bytes(payload.get(0..4)?.try_into().ok()?);
    let index = u32::from_be_bytes(payload.get(4..8)?.try_into().ok()?);
    Some(Mark {
        tag,
        index,
        len: payload.len() + INNER_HEADERS,
    })
}

/// Writes the VXLAN and Ethernet headers of a frame at the start of `buf`; returns
/// [`VXLAN_FRAME_HEADER`], or None if `buf` is too short.
pub(crate) fn write_vxlan_header(
    buf: &mut [u8],
    vni: Vni,
    dst: EthernetAddress,
    src: EthernetAddress,
    ethertype: EtherType,
) -> Option<usize> {
    if buf.len() < VXLAN_FRAME_HEADER {
        return None;
    }
    VxlanRepr { vni }.emit(buf).ok()?;
    let mut eth = EthernetFrame::new_unchecked(&mut buf[VXLAN_HEADER_LEN..VXLAN_FRAME_HEADER]);
    eth.set_dst_addr(dst);
    eth.set_src_addr(src);
    eth.set_ethertype(ethertype);
    Some(VXLAN_FRAME_HEADER)
}

/// What a VXLAN datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VxlanFrame<'a> {
    /// An IPv4 packet.
    Ipv4 {
        /// The VNI.
        vni: Vni,
        /// The packet (Ethernet padding included, if any).
        packet: &'a [u8],
    },
    /// An ARP message.
    Arp {
        /// The VNI.
        vni: Vni,
        /// The Ethernet source.
        src: EthernetAddress,
        /// The message.
        arp: ArpRepr,
    },
    /// Anything else (IPv6, other EtherTypes).
    Other,
}

/// Parses a VXLAN datagram; None if it is malformed.
pub(crate) fn parse_vxlan(datagram: &[u8]) -> Option<VxlanFrame<'_>> {
    let vx = VxlanPacket::new_checked(datagram).ok()?;
    let vni = VxlanRepr::parse(&vx).ok()?.vni;
    let eth = EthernetFrame::new_checked(&datagram[VXLAN_HEADER_LEN..]).ok()?;
    let payload = &datagram[VXLAN_FRAME_HEADER..];
    Some(match eth.ethertype() {
        EtherType::IPV4 => VxlanFrame::Ipv4 {
            vni,
            packet: payload,
        },
        EtherType::ARP => {
            let arp = ArpRepr::parse(&ArpPacket::new_checked(payload).ok()?).ok()?;
            VxlanFrame::Arp {
                vni,
                src: eth.src_addr(),
                arp,
            }
        }
        _ => VxlanFrame::Other,
    })
}

/// Writes a VXLAN datagram carrying `arp` from `src` to `dst` (padded to the Ethernet
/// minimum); returns its length.
pub(crate) fn write_arp_frame(
    buf: &mut [u8],
    vni: Vni,
    dst: EthernetAddress,
    src: EthernetAddress,
    arp: &ArpRepr,
) -> Option<usize> {
    let len = VXLAN_FRAME_HEADER + MIN_ETHERNET_PAYLOAD;
    if buf.len() < len {
        return None;
    }
    write_vxlan_header(buf, vni, dst, src, EtherType::ARP)?;
    let body = &mut buf[VXLAN_FRAME_HEADER..len];
    body.fill(0);
    arp.emit(body).ok()?;
    Some(len)
}

/// An ARP request from `sender` (`mac`, `ip`) for `target`.
pub(crate) fn arp_request(mac: EthernetAddress, ip: Ipv4Addr, target: Ipv4Addr) -> ArpRepr {
    ArpRepr {
        operation: ArpOperation::REQUEST,
        source_hardware_addr: mac,
        source_protocol_addr: ip,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> InnerSpec {
        InnerSpec {
            src: Ipv4Addr::new(10, 128, 0, 1),
            dst: Ipv4Addr::new(10, 2, 0, 2),
            src_port: 1234,
            dst_port: 5001,
        }
    }

    #[test]
    fn inner_packet_round_trip() {
        let mut buf = [0xAAu8; 2000];
        for len in [40usize, 64, 576, 1400, 1500] {
            assert_eq!(write_inner(&mut buf, &spec(), len, 0xfeed, 77), Some(len));
            let ip = Ipv4Packet::new_checked(&buf[..len]).expect("valid IPv4");
            assert!(ip.verify_checksum());
            assert_eq!(usize::from(ip.total_len()), len);
            assert_eq!(ip.src_addr(), Ipv4Addr::new(10, 128, 0, 1));
            let m = read_inner(&buf[..len]).expect("our packet");
            assert_eq!(
                m,
                Mark {
                    tag: 0xfeed,
                    index: 77,
                    len
                }
            );
            // Bytes after the mark are zero (no stale pool content leaks into packets).
            assert!(buf[INNER_HEADERS + MARK_LEN..len].iter().all(|&b| b == 0));
        }
        // Padding after the packet (Ethernet minimum, TFC) does not change the length.
        write_inner(&mut buf, &spec(), 40, 1, 2).expect("fits");
        assert_eq!(read_inner(&buf[..60]).expect("ours").len, 40);
        assert_eq!(write_inner(&mut buf, &spec(), 35, 1, 2), None);
        assert_eq!(write_inner(&mut buf[..100], &spec(), 200, 1, 2), None);
        assert!(read_inner(&[0x45, 0, 0]).is_none());
    }

    #[test]
    fn vxlan_frames() {
        let vni = Vni::new(100).expect("24 bits");
        let gw = EthernetAddress([2, 0x50, 0x47, 0, 0, 100]);
        let vm = EthernetAddress([2, 0, 0, 0, 0, 2]);
        let mut buf = [0u8; 200];
        let h = write_vxlan_header(&mut buf, vni, gw, vm, EtherType::IPV4).expect("fits");
        let n = write_inner(&mut buf[h..], &spec(), 64, 5, 6).expect("fits");
        match parse_vxlan(&buf[..h + n]) {
            Some(VxlanFrame::Ipv4 { vni: v, packet }) => {
                assert_eq!(v, vni);
                assert_eq!(read_inner(packet).map(|m| m.index), Some(6));
            }
            other => panic!("unexpected {other:?}"),
        }
        let req = arp_request(vm, Ipv4Addr::new(10, 2, 0, 2), Ipv4Addr::new(10, 2, 0, 1));
        let n = write_arp_frame(&mut buf, vni, EthernetAddress::BROADCAST, vm, &req).expect("fits");
        assert_eq!(n, VXLAN_FRAME_HEADER + 46);
        match parse_vxlan(&buf[..n]) {
            Some(VxlanFrame::Arp { arp, src, .. }) => {
                assert_eq!(arp, req);
                assert_eq!(src, vm);
                let reply = arp.reply(gw);
                assert_eq!(reply.target_hardware_addr, vm);
                assert_eq!(reply.source_protocol_addr, Ipv4Addr::new(10, 2, 0, 1));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(parse_vxlan(&buf[..10]).is_none());
    }
}
