//! Tests of the TUN offload logic on crafted packets (the checksum arithmetic is tested in
//! `wire::checksum`): the split of kernel-style super-packets, the coalescing writer, and
//! coalesce -> split round trips (unit and property tests). Every checksum is checked with
//! [`naive_sum`], written independently of the code under test.

use super::split::{split_frame, SplitFault};
use super::writer::{FlushStats, Push, TunWriter};
use super::*;
use proptest::prelude::*;

/// RFC 1071 done the slow way: big-endian 16-bit words added in a u32, folded.
fn naive_sum(data: &[u8]) -> u32 {
    data.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// Where the transport header starts (IPv4 IHL, or after IPv6 options headers) and its protocol.
fn l4_of(p: &[u8]) -> (usize, u8) {
    if p[0] >> 4 == 4 {
        (usize::from(p[0] & 15) * 4, p[9])
    } else {
        let (mut next, mut off) = (p[6], 40);
        while next == 0 || next == 60 {
            next = p[off];
            off += (usize::from(p[off + 1]) + 1) * 8;
        }
        (off, next)
    }
}

/// Whether the IPv4 header checksum (if IPv4) and the transport checksum verify.
fn checksums_ok(p: &[u8]) -> bool {
    let v6 = p[0] >> 4 == 6;
    let (l4, proto) = l4_of(p);
    if !v6 && fold(naive_sum(&p[..l4])) != 0xffff {
        return false;
    }
    let addrs = if v6 { &p[8..40] } else { &p[12..20] };
    let s = naive_sum(addrs) + u32::from(proto) + (p.len() - l4) as u32 + naive_sum(&p[l4..]);
    fold(s) == 0xffff
}

/// A packet to build; IPv4 uses the first four bytes of the addresses.
#[derive(Clone, Debug)]
struct Pkt {
    v6: bool,
    tcp: bool,
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
    ttl: u8,
    tos: u8,
    id: u16,
    df: bool,
    ip_opts: Vec<u8>,
    /// IPv6 destination options header (8 bytes) before the transport header.
    dest_opts: bool,
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    tcp_opts: Vec<u8>,
    payload: Vec<u8>,
}

impl Pkt {
    fn tcp4(payload: usize) -> Self {
        let mut src = [0u8; 16];
        src[..4].copy_from_slice(&[10, 1, 0, 1]);
        let mut dst = [0u8; 16];
        dst[..4].copy_from_slice(&[10, 2, 0, 2]);
        Self {
            v6: false,
            tcp: true,
            src,
            dst,
            sport: 40000,
            dport: 5201,
            ttl: 64,
            tos: 0,
            id: 0x1234,
            df: false,
            ip_opts: vec![],
            dest_opts: false,
            seq: 0xffff_f000,
            ack: 77,
            flags: TCP_ACK,
            window: 512,
            tcp_opts: vec![],
            payload: (0..payload).map(|i| (i * 7 + 3) as u8).collect(),
        }
    }

    fn tcp6(payload: usize) -> Self {
        let mut p = Self::tcp4(payload);
        p.v6 = true;
        p.src = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        p.dst = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        p
    }

    fn udp(mut self) -> Self {
        self.tcp = false;
        self
    }

    /// The next packet of the flow with `payload` bytes.
    fn next(&self, payload: usize) -> Self {
        let mut n = self.clone();
        n.seq = self.seq.wrapping_add(self.payload.len() as u32);
        n.id = self.id.wrapping_add(1);
        n.payload = (0..payload)
            .map(|i| (i as u32).wrapping_add(n.seq) as u8)
            .collect();
        n
    }

    fn build(&self) -> Vec<u8> {
        let proto = if self.tcp { 6 } else { 17 };
        let l3 = if self.v6 {
            40 + if self.dest_opts { 8 } else { 0 }
        } else {
            20 + self.ip_opts.len()
        };
        let thl = if self.tcp {
            20 + self.tcp_opts.len()
        } else {
            8
        };
        let total = l3 + thl + self.payload.len();
        let mut p = vec![0u8; total];
        if self.v6 {
            p[0] = 0x60 | (self.tos >> 4);
            p[1] = self.tos << 4 | 0x0a; // flow label bits too
            p[4..6].copy_from_slice(&((total - 40) as u16).to_be_bytes());
            p[6] = if self.dest_opts { 60 } else { proto };
            p[7] = self.ttl;
            p[8..24].copy_from_slice(&self.src);
            p[24..40].copy_from_slice(&self.dst);
            if self.dest_opts {
                p[40] = proto;
                p[41] = 0;
                p[42] = 1; // PadN
                p[43] = 4;
            }
        } else {
            p[0] = 0x40 | (l3 / 4) as u8;
            p[1] = self.tos;
            p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
            p[4..6].copy_from_slice(&self.id.to_be_bytes());
            p[6] = if self.df { 0x40 } else { 0 };
            p[8] = self.ttl;
            p[9] = proto;
            p[12..16].copy_from_slice(&self.src[..4]);
            p[16..20].copy_from_slice(&self.dst[..4]);
            p[20..l3].copy_from_slice(&self.ip_opts);
            let c = !fold(naive_sum(&p[..l3]));
            p[10..12].copy_from_slice(&c.to_be_bytes());
        }
        p[l3..l3 + 2].copy_from_slice(&self.sport.to_be_bytes());
        p[l3 + 2..l3 + 4].copy_from_slice(&self.dport.to_be_bytes());
        if self.tcp {
            p[l3 + 4..l3 + 8].copy_from_slice(&self.seq.to_be_bytes());
            p[l3 + 8..l3 + 12].copy_from_slice(&self.ack.to_be_bytes());
            p[l3 + 12] = ((thl / 4) as u8) << 4;
            p[l3 + 13] = self.flags;
            p[l3 + 14..l3 + 16].copy_from_slice(&self.window.to_be_bytes());
            p[l3 + 20..l3 + thl].copy_from_slice(&self.tcp_opts);
        } else {
            p[l3 + 4..l3 + 6].copy_from_slice(&((total - l3) as u16).to_be_bytes());
        }
        p[l3 + thl..].copy_from_slice(&self.payload);
        let addrs = if self.v6 { &p[8..40] } else { &p[12..20] };
        let s = naive_sum(addrs) + proto as u32 + (total - l3) as u32 + naive_sum(&p[l3..]);
        let mut c = !fold(s);
        if c == 0 && !self.tcp {
            c = 0xffff;
        }
        let at = l3 + if self.tcp { 16 } else { 6 };
        p[at..at + 2].copy_from_slice(&c.to_be_bytes());
        assert!(checksums_ok(&p));
        p
    }

    /// This packet as the kernel would hand over a GSO super-packet of `gso`-byte segments:
    /// vnet header, then the packet with only the pseudo-header sum as transport checksum.
    fn as_super(&self, gso: u16) -> Vec<u8> {
        let mut p = self.build();
        let (l4, proto) = l4_of(&p);
        let off = l4 + if self.tcp { 16 } else { 6 };
        let addrs = if self.v6 { &p[8..40] } else { &p[12..20] };
        let partial = fold(naive_sum(addrs) + u32::from(proto) + (p.len() - l4) as u32);
        p[off..off + 2].copy_from_slice(&partial.to_be_bytes());
        let vh = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: match (self.tcp, self.v6) {
                (true, false) => GSO_TCPV4,
                (true, true) => GSO_TCPV6,
                _ => GSO_UDP_L4,
            },
            hdr_len: p.len() as u16, // the kernel's hint may be anything
            gso_size: gso,
            csum_start: l4 as u16,
            csum_offset: (off - l4) as u16,
        };
        let mut f = vh.emit().to_vec();
        f.extend_from_slice(&p);
        f
    }
}

/// Splits one frame (vnet header + packet) the way the read batch does; the packets.
fn split_bytes(frame: &[u8]) -> Result<Vec<Vec<u8>>, SplitFault> {
    let vh = VnetHdr::parse(frame).expect("vnet header");
    let pkt = &frame[VNET_HDR_LEN..];
    let gso = usize::from(vh.gso_size.max(1));
    let mut buf = vec![0u8; pkt.len() + (pkt.len() / gso + 1) * 128];
    buf[..pkt.len()].copy_from_slice(pkt);
    let s = split_frame(&mut buf, 0, pkt.len(), &vh)?;
    Ok(buf[..s.len].chunks(s.stride).map(<[u8]>::to_vec).collect())
}

/// Drains a writer, returning each write's bytes.
fn drain_frames(w: &mut TunWriter) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let st = w.drain(|iov| {
        out.push(
            iov.iter()
                .flat_map(|s| s.iter().copied())
                .collect::<Vec<u8>>(),
        );
        Ok(0)
    });
    assert_eq!((st.writes, st.failed), (out.len(), 0));
    out
}

/// Pushes `pkts` into an all-offload writer; the frames written.
fn coalesce(offloads: Offloads, pkts: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut w = TunWriter::new(offloads, 1 << 20, 1024);
    for p in pkts {
        assert_eq!(w.push(p), Push::Queued);
    }
    assert_eq!(w.len(), pkts.len());
    drain_frames(&mut w)
}

/// Completes a written super-packet's checksum the way the kernel does for
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM` (sum from `csum_start` to the end, field included) and checks
/// that the whole super-packet is then a valid IP packet: lengths, IPv4 header checksum and a
/// transport checksum over the pseudo header with the full length.
fn assert_super_packet_completes(frame: &[u8]) {
    let vh = VnetHdr::parse(frame).expect("header");
    assert_eq!(vh.flags, F_NEEDS_CSUM);
    let mut p = frame[VNET_HDR_LEN..].to_vec();
    let at = usize::from(vh.csum_start + vh.csum_offset);
    let c = !fold(naive_sum(&p[usize::from(vh.csum_start)..]));
    p[at..at + 2].copy_from_slice(&c.to_be_bytes());
    assert!(
        checksums_ok(&p),
        "the partial checksum is not the pseudo-header sum"
    );
    let ip_len = if p[0] >> 4 == 6 {
        usize::from(u16::from_be_bytes([p[4], p[5]])) + 40
    } else {
        usize::from(u16::from_be_bytes([p[2], p[3]]))
    };
    assert_eq!(ip_len, p.len());
}

fn round_trip(frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    frames
        .iter()
        .flat_map(|f| split_bytes(f).expect("writer output splits"))
        .collect()
}

#[test]
fn vnet_header_round_trips() {
    let vh = VnetHdr {
        flags: 1,
        gso_type: 0x85,
        hdr_len: 0x1234,
        gso_size: 1448,
        csum_start: 40,
        csum_offset: 6,
    };
    assert_eq!(VnetHdr::parse(&vh.emit()), Some(vh));
    assert_eq!(VnetHdr::parse(&[0; 9]), None);
    assert_eq!(u16::from_ne_bytes([vh.emit()[4], vh.emit()[5]]), 1448);
}

fn arb_flow() -> impl Strategy<Value = Pkt> {
    (
        any::<bool>(),
        any::<bool>(),
        0u16..4,
        prop::sample::select(vec![0usize, 4, 8]),
        prop::sample::select(vec![0usize, 12]),
        any::<u32>(),
        any::<u16>(),
        any::<bool>(),
        1usize..1500,
    )
        .prop_map(|(v6, tcp, port, ipo, tcpo, seq, id, df, mss)| {
            let mut p = if v6 { Pkt::tcp6(mss) } else { Pkt::tcp4(mss) };
            p.tcp = tcp;
            p.sport = 1000 + port;
            p.ip_opts = vec![1; ipo];
            p.tcp_opts = vec![1; tcpo];
            p.seq = seq;
            p.id = id;
            p.df = df;
            p
        })
}

mod split;
mod writer;
