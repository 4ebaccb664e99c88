//! The read side of TUN offloads: [`split_frame`] turns a GSO super-packet from the kernel
//! (`VIRTIO_NET_HDR_GSO_TCPV4`/`TCPV6`/`UDP_L4`) into ordinary IP packets in place (RFC 9293
//! §3.1 sequence numbers and flags, RFC 791 identification and header checksum, RFC 8200 §3
//! payload length, RFC 768 length) and completes partial checksums (RFC 1071).
//!
//! # How
//! With `TUN_F_TSO4 | TUN_F_TSO6` (and `TUN_F_USO4 | TUN_F_USO6`) the kernel hands the device
//! one TCP (UDP) super-packet of up to 64 KiB per read: one IP and transport header, the payload
//! of many segments, and a header saying `gso_size` (payload per segment) and, with
//! `VIRTIO_NET_HDR_F_NEEDS_CSUM`, that the transport checksum is only the pseudo-header sum.
//! [`split_frame`] turns it into ordinary packets *in place*: segment `k` lands at
//! `start + k * (hdr + gso_size)`, so walking the segments from the last to the first moves every
//! payload forward (never over data still to be read) and copies the headers from the untouched
//! first one. Each segment then gets its IP length, IPv4 identification (`id + k`) and header
//! checksum, TCP sequence number (`seq + k * gso_size`, FIN and PSH only on the last segment,
//! CWR only on the first) or UDP length, and a full transport checksum. The result is back to
//! back packets of `stride` bytes (the last one shorter), the layout of a UDP GRO train.
//! `hdr_len` from the kernel is only a hint and is ignored; the headers are parsed. Anything that
//! does not parse is reported as a [`TunDrop`] and left for the caller to count.

use wire::checksum;
use wire::ip::IpProtocol;

use super::{
    be16, be32, put16, TunDrop, VnetHdr, F_NEEDS_CSUM, GSO_ECN, GSO_NONE, GSO_TCPV4, GSO_TCPV6,
    GSO_UDP_L4, PROTO_TCP, PROTO_UDP, TCP_CSUM_OFFSET, TCP_CWR, TCP_FIN, TCP_PSH, UDP_CSUM_OFFSET,
};

/// Where a frame read from the device ended up after [`split_frame`]: `len` bytes of back to back
/// IP packets from the frame's start, `stride` bytes each but the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segmented {
    /// Bytes of all packets.
    pub(crate) len: usize,
    /// Bytes of each packet but the last (equal to `len` for one packet).
    pub(crate) stride: usize,
    /// Number of packets.
    pub(crate) segments: usize,
    /// Whether the frame was a GSO super-packet.
    pub(crate) gso: bool,
}

/// Why [`split_frame`] did not produce packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SplitFault {
    /// The frame is invalid: drop and count it.
    Drop(TunDrop),
    /// The segments need `needed` bytes from the frame's start, more than the buffer has; the
    /// buffer is unchanged.
    NoRoom {
        /// Bytes the segments need.
        needed: usize,
    },
}

/// The IP-level facts of a GSO super-packet.
struct GsoHeaders {
    v6: bool,
    l4: usize,
    hdr: usize,
    proto: u8,
}

/// Parses the headers of a super-packet of GSO type `gso` (ECN bit removed).
fn gso_headers(pkt: &[u8], gso: u8) -> Option<GsoHeaders> {
    let proto = match gso {
        GSO_TCPV4 | GSO_TCPV6 => PROTO_TCP,
        GSO_UDP_L4 => PROTO_UDP,
        _ => return None,
    };
    let version = pkt.first()? >> 4;
    let (v6, l4) = match (gso, version) {
        (GSO_TCPV4 | GSO_UDP_L4, 4) => {
            let ihl = usize::from(pkt.first()? & 0x0f) * 4;
            if ihl < 20
                || pkt.len() < ihl
                || usize::from(be16(pkt, 2)) != pkt.len()
                || pkt[9] != proto
                // A fragment is not a GSO packet: MF clear and offset zero.
                || be16(pkt, 6) & 0x3fff != 0
            {
                return None;
            }
            (false, ihl)
        }
        (GSO_TCPV6 | GSO_UDP_L4, 6) => {
            if pkt.len() < 40 || usize::from(be16(pkt, 4)) + 40 != pkt.len() {
                return None;
            }
            // Hop-by-hop and destination options may precede the transport header; routing
            // headers (whose final destination the pseudo header would need) and fragments may
            // not.
            let (mut next, mut off) = (pkt[6], 40);
            for _ in 0..8 {
                if next == proto {
                    break;
                }
                if next != 0 && next != 60 {
                    return None;
                }
                if pkt.len() < off + 8 {
                    return None;
                }
                next = pkt[off];
                off += (usize::from(pkt[off + 1]) + 1) * 8;
            }
            if next != proto {
                return None;
            }
            (true, off)
        }
        _ => return None,
    };
    let thl = if proto == PROTO_TCP {
        if pkt.len() < l4 + 20 {
            return None;
        }
        let thl = usize::from(pkt[l4 + 12] >> 4) * 4;
        if thl < 20 {
            return None;
        }
        thl
    } else {
        8
    };
    if pkt.len() < l4 + thl {
        return None;
    }
    Some(GsoHeaders {
        v6,
        l4,
        hdr: l4 + thl,
        proto,
    })
}

/// Turns one frame read from a vnet device into ordinary IP packets, in place. The packet (after
/// the vnet header `vh`) is `buf[start..start + len]`; the packets are written from `start` on,
/// back to back, and `buf` must extend as far as they may grow (a super-packet of `n` segments
/// grows by `(n - 1)` header copies). A non-GSO frame has its checksum completed when the
/// kernel left it partial. On error nothing in `buf` has changed.
pub(crate) fn split_frame(
    buf: &mut [u8],
    start: usize,
    len: usize,
    vh: &VnetHdr,
) -> Result<Segmented, SplitFault> {
    let end = match start.checked_add(len) {
        Some(end) if end <= buf.len() && len > 0 => end,
        _ => return Err(SplitFault::Drop(TunDrop::Short)),
    };
    let gso = vh.gso_type & !GSO_ECN;
    if gso == GSO_NONE {
        if vh.flags & F_NEEDS_CSUM != 0 {
            complete_checksum(&mut buf[start..end], vh)?;
        }
        return Ok(Segmented {
            len,
            stride: len,
            segments: 1,
            gso: false,
        });
    }
    if !matches!(gso, GSO_TCPV4 | GSO_TCPV6 | GSO_UDP_L4) || vh.gso_size == 0 {
        return Err(SplitFault::Drop(TunDrop::BadHeader));
    }
    let Some(h) = gso_headers(&buf[start..end], gso) else {
        return Err(SplitFault::Drop(TunDrop::GsoMalformed));
    };
    let csum_offset = if h.proto == PROTO_TCP {
        TCP_CSUM_OFFSET
    } else {
        UDP_CSUM_OFFSET
    };
    if vh.flags & F_NEEDS_CSUM != 0
        && (usize::from(vh.csum_start) != h.l4 || usize::from(vh.csum_offset) != csum_offset)
    {
        return Err(SplitFault::Drop(TunDrop::GsoMalformed));
    }
    let g = usize::from(vh.gso_size);
    let payload = len - h.hdr;
    let n = payload.div_ceil(g).max(1);
    let needed = n * h.hdr + payload;
    if buf.len() - start < needed {
        return Err(SplitFault::NoRoom { needed });
    }
    let stride = if n == 1 { needed } else { h.hdr + g };
    // Move from the last segment to the first: every payload moves forward, and the first
    // segment's headers (the source of every copy) are only touched at the end.
    for k in (1..n).rev() {
        let src = start + h.hdr + k * g;
        let seg_payload = g.min(payload - k * g);
        let dst = start + k * stride;
        buf.copy_within(src..src + seg_payload, dst + h.hdr);
        buf.copy_within(start..start + h.hdr, dst);
    }
    let first = &buf[start..start + h.hdr];
    let id0 = be16(first, 4);
    let seq0 = if h.proto == PROTO_TCP {
        be32(first, h.l4 + 4)
    } else {
        0
    };
    for k in 0..n {
        let seg_payload = g.min(payload - k * g);
        let at = start + k * stride;
        let seg = &mut buf[at..at + h.hdr + seg_payload];
        let seg_len = seg.len();
        if h.v6 {
            put16(seg, 4, (seg_len - 40) as u16);
        } else {
            put16(seg, 2, seg_len as u16);
            put16(seg, 4, id0.wrapping_add(k as u16));
            put16(seg, 10, 0);
            let c = !checksum::sum(&seg[..h.l4]);
            put16(seg, 10, c);
        }
        if h.proto == PROTO_TCP {
            let seq = seq0.wrapping_add((k * g) as u32);
            seg[h.l4 + 4..h.l4 + 8].copy_from_slice(&seq.to_be_bytes());
            if k + 1 < n {
                seg[h.l4 + 13] &= !(TCP_FIN | TCP_PSH);
            }
            if k > 0 {
                seg[h.l4 + 13] &= !TCP_CWR;
            }
        } else {
            put16(seg, h.l4 + 4, (seg_len - h.l4) as u16);
        }
        // Cannot fail once `gso_headers` passed (an IP header of the segment's version, a
        // whole TCP or UDP header); were it to, the frame is dropped.
        checksum::fill_l4(seg, h.l4, IpProtocol(h.proto))
            .map_err(|_| SplitFault::Drop(TunDrop::GsoMalformed))?;
    }
    Ok(Segmented {
        len: needed,
        stride,
        segments: n,
        gso: true,
    })
}

/// Completes a partial checksum (`VIRTIO_NET_HDR_F_NEEDS_CSUM` without GSO): the field at
/// `csum_start + csum_offset` holds the pseudo-header sum; the sum from `csum_start` to the end
/// is folded, complemented and stored (zero as 0xFFFF, like the kernel's `skb_checksum_help`).
fn complete_checksum(pkt: &mut [u8], vh: &VnetHdr) -> Result<(), SplitFault> {
    let start = usize::from(vh.csum_start);
    let at = start + usize::from(vh.csum_offset);
    if at + 2 > pkt.len() {
        return Err(SplitFault::Drop(TunDrop::BadHeader));
    }
    let c = !checksum::sum(&pkt[start..]);
    put16(pkt, at, if c == 0 { 0xffff } else { c });
    Ok(())
}
