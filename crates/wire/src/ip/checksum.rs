//! The Internet checksum (RFC 1071) and the pseudo-headers of RFC 768 and RFC 8200 §8.1.
//!
//! All functions return the folded ones'-complement *sum* (not complemented); a header
//! verifies when the sum over it, checksum field included, is `0xffff`, and the value to
//! store is `!combine(&[...])`.

use super::IpProtocol;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Ones'-complement sum of `data` as big-endian 16-bit words; an odd last byte is
/// padded with a zero byte (RFC 1071 §4.1).
pub fn sum(data: &[u8]) -> u16 {
    // Summing 32-bit words and folding is equivalent (RFC 1071 §2 (B)) and halves the adds.
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        acc += u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    }
    let mut tail = [0u8; 4];
    let rem = chunks.remainder();
    tail[..rem.len()].copy_from_slice(rem);
    acc += u64::from(u32::from_be_bytes(tail));
    fold(acc)
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
