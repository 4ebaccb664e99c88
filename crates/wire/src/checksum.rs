//! The Internet checksum (RFC 1071), the pseudo-headers of TCP (RFC 9293 §3.1), UDP (RFC 768)
//! and IPv6 upper layers (RFC 8200 §8.1), and filling the TCP or UDP checksum of a packet: in an
//! IP packet whose transport header is known ([`fill_l4`]), in an IP packet ([`finish_ip`]) or
//! in a customer's tagged Ethernet frame ([`finish_frame`]).
//!
//! The sums ([`sum`], [`combine`], the `pseudo_header*` functions) return the folded
//! ones'-complement *sum* (not complemented); a header verifies when the sum over it, checksum
//! field included, is `0xffff`, and the value to store is `!combine(&[...])`.
//!
//! [`finish_frame`] is for a frame the kernel hands a packet socket with
//! `TP_STATUS_CSUMNOTREADY`: sent by a local stack with checksum offload (a veth peer's
//! namespace), its TCP or UDP checksum field holds only the pseudo-header sum, and whoever
//! takes the frame further (the data plane's attach stage, the steer node's port thread) writes
//! the real one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::WireError;
use crate::ethernet::{tags, EtherType};
use crate::field::{need, set_u16};
use crate::flow::upper_layer_v6;
use crate::ip::{IpProtocol, IpVersion, Ipv4Packet, Ipv6Packet, IPV4_HEADER_LEN, IPV6_HEADER_LEN};

/// Offset of the checksum in a TCP header (RFC 9293 §3.1).
const TCP_CHECKSUM: usize = 16;
/// Bytes of a TCP header without options.
const TCP_HEADER_LEN: usize = 20;
/// Offset of the checksum in a UDP header (RFC 768).
const UDP_CHECKSUM: usize = 6;
/// Bytes of a UDP header.
const UDP_HEADER_LEN: usize = 8;

/// Ones'-complement sum of `data` as big-endian 16-bit words; an odd last byte is padded with
/// a zero byte (RFC 1071 §4.1).
pub fn sum(data: &[u8]) -> u16 {
    // RFC 1071 §2 (A) and (B): the sum may be taken over wider words and in either byte
    // order, folded and swapped at the end. Eight bytes at a time in host order, carries added
    // back in (end-around carry).
    let mut acc: u64 = 0;
    let mut add = |x: u64| {
        let (s, carry) = acc.overflowing_add(x);
        acc = s + u64::from(carry);
    };
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        add(u64::from_ne_bytes(
            c.try_into().expect("chunks_exact(8) yields 8 bytes"),
        ));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut tail = [0u8; 8];
        tail[..rest.len()].copy_from_slice(rest);
        add(u64::from_ne_bytes(tail));
    }
    // The fold of a host-order sum is the byte-swapped fold of the big-endian one.
    u16::from_be(fold(acc))
}

/// Ones'-complement sum of partial sums.
pub fn combine(sums: &[u16]) -> u16 {
    fold(sums.iter().map(|&s| u64::from(s)).sum())
}

fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Sum of the IPv4 pseudo-header (RFC 768): source, destination, zero, protocol, length.
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: IpProtocol, length: u16) -> u16 {
    combine(&[
        sum(&src.octets()),
        sum(&dst.octets()),
        u16::from(protocol.0),
        length,
    ])
}

/// Sum of the IPv6 pseudo-header (RFC 8200 §8.1): source, destination, 32-bit
/// upper-layer length, zero, next header.
pub fn pseudo_header_v6(
    src: &Ipv6Addr,
    dst: &Ipv6Addr,
    next_header: IpProtocol,
    length: u32,
) -> u16 {
    combine(&[
        sum(&src.octets()),
        sum(&dst.octets()),
        (length >> 16) as u16,
        length as u16,
        u16::from(next_header.0),
    ])
}

/// Sum of the pseudo-header for either family; `None` if the families differ.
pub fn pseudo_header(src: &IpAddr, dst: &IpAddr, protocol: IpProtocol, length: u32) -> Option<u16> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Some(pseudo_header_v4(
            *s,
            *d,
            protocol,
            u16::try_from(length).ok()?,
        )),
        (IpAddr::V6(s), IpAddr::V6(d)) => Some(pseudo_header_v6(s, d, protocol, length)),
        _ => None,
    }
}

/// Sum of the pseudo-header of a transport part of `length` bytes in the IP packet that starts
/// `packet`, its addresses read in place (the version from the first nibble; the rest of the
/// header is not checked). An error if `packet` is shorter than the fixed header, is no IPv4
/// or IPv6, or `length` does not fit the IPv4 pseudo-header's 16 bits.
pub fn pseudo_header_of(
    packet: &[u8],
    protocol: IpProtocol,
    length: u32,
) -> Result<u16, WireError> {
    // Source and destination are adjacent in both headers: one sum covers them.
    let (addresses, length) = match IpVersion::of(packet)? {
        IpVersion::V4 => {
            need("ipv4", packet.len(), IPV4_HEADER_LEN)?;
            let length = u16::try_from(length).map_err(|_| WireError::Malformed {
                what: "ipv4",
                field: "total length",
            })?;
            (&packet[12..20], [0, length])
        }
        IpVersion::V6 => {
            need("ipv6", packet.len(), IPV6_HEADER_LEN)?;
            (&packet[8..40], [(length >> 16) as u16, length as u16])
        }
    };
    Ok(combine(&[
        sum(addresses),
        u16::from(protocol.0),
        length[0],
        length[1],
    ]))
}

/// Computes and stores the checksum of the TCP or UDP header at `packet[l4..]` of the IP packet
/// `packet` (IP header first, transport part up to the end of the slice): the pseudo-header
/// ([`pseudo_header_of`]) plus the transport header and data, whatever the checksum field held.
/// A computed zero is stored as 0xFFFF for UDP (RFC 768). An error, and nothing written, for
/// another protocol or a packet too short for its headers.
pub fn fill_l4(packet: &mut [u8], l4: usize, protocol: IpProtocol) -> Result<(), WireError> {
    let (what, header, field) = match protocol {
        IpProtocol::TCP => ("tcp", TCP_HEADER_LEN, TCP_CHECKSUM),
        IpProtocol::UDP => ("udp", UDP_HEADER_LEN, UDP_CHECKSUM),
        other => {
            return Err(WireError::Unsupported {
                what: "ip",
                field: "protocol",
                value: other.0.into(),
            })
        }
    };
    need(what, packet.len().saturating_sub(l4), header)?;
    let length = u32::try_from(packet.len() - l4).map_err(|_| WireError::Malformed {
        what,
        field: "length",
    })?;
    let pseudo = pseudo_header_of(packet, protocol, length)?;
    let at = l4 + field;
    set_u16(packet, at, 0);
    let c = !combine(&[pseudo, sum(&packet[l4..])]);
    // RFC 768: a computed zero is transmitted as all ones (zero means "no checksum").
    let c = if c == 0 && protocol == IpProtocol::UDP {
        0xffff
    } else {
        c
    };
    set_u16(packet, at, c);
    Ok(())
}

/// Computes and stores the TCP or UDP checksum of the IPv4 or IPv6 packet that starts `packet`
/// (bytes after its length, Ethernet padding say, are not covered), with [`fill_l4`]. IPv6
/// extension headers are walked to the transport header. An error, and nothing written, if the
/// packet does not parse, is an IPv4 fragment or an IPv6 non-first fragment, or carries neither
/// TCP nor UDP. (A local stack finishes checksums before it fragments, so frames whose checksum
/// is left to finish are never fragments.)
pub fn finish_ip(packet: &mut [u8]) -> Result<(), WireError> {
    let (end, l4, protocol) = match IpVersion::of(packet)? {
        IpVersion::V4 => {
            let p = Ipv4Packet::new_checked(&*packet)?;
            if p.is_fragment() {
                return Err(WireError::Unsupported {
                    what: "ipv4",
                    field: "fragment offset",
                    value: p.frag_offset().into(),
                });
            }
            (usize::from(p.total_len()), p.header_len(), p.protocol())
        }
        IpVersion::V6 => {
            let p = Ipv6Packet::new_checked(&*packet)?;
            let payload = p.payload();
            let (protocol, Some(rest)) = upper_layer_v6(p.next_header(), payload) else {
                return Err(WireError::Malformed {
                    what: "ipv6",
                    field: "extension headers",
                });
            };
            let l4 = IPV6_HEADER_LEN + payload.len() - rest.len();
            (p.total_len(), l4, protocol)
        }
    };
    // `new_checked` passed: the buffer holds the whole packet.
    fill_l4(&mut packet[..end], l4, protocol)
}

/// Computes and stores the TCP or UDP checksum of the IP packet in a customer's tagged
/// Ethernet frame (tags read by [`tags::read`], as the attach stage and the steer node's port
/// thread read them), with [`finish_ip`]. An error, and nothing written, if the tags are no
/// attachment's, the EtherType is neither IPv4 nor IPv6 or disagrees with the packet's
/// version, or [`finish_ip`] fails.
pub fn finish_frame(frame: &mut [u8]) -> Result<(), WireError> {
    let tagged = tags::read(frame).map_err(|_| WireError::Malformed {
        what: "ethernet",
        field: "vlan tags",
    })?;
    let version = match tagged.ethertype {
        EtherType::IPV4 => IpVersion::V4,
        EtherType::IPV6 => IpVersion::V6,
        other => {
            return Err(WireError::Unsupported {
                what: "ethernet",
                field: "ethertype",
                value: other.0.into(),
            })
        }
    };
    let Some(packet) = frame.get_mut(tagged.payload..) else {
        return Err(WireError::Truncated {
            what: "ethernet",
            need: tagged.payload,
            got: frame.len(),
        });
    };
    if IpVersion::of(packet)? != version {
        return Err(WireError::Malformed {
            what: "ethernet",
            field: "ethertype",
        });
    }
    finish_ip(packet)
}

#[cfg(test)]
mod tests;
