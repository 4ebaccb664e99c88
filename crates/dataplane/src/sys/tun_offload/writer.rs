//! The write side of TUN offloads: [`TunWriter`] coalesces consecutive packets of one TCP or
//! UDP flow into GSO super-packets (`VIRTIO_NET_HDR_GSO_TCPV4`/`TCPV6`/`UDP_L4` with a partial
//! checksum, RFC 1071 and the pseudo headers of RFC 9293 §3.1 / RFC 768 / RFC 8200 §8.1), so the
//! kernel gets one write per flow per batch.
//!
//! # How
//! [`TunWriter::push`] copies each packet into a buffer the writer owns. A TCP packet (ACK set;
//! no SYN, RST, URG or CWR; payload present) or, with USO, a UDP packet whose checksums verify
//! is a candidate: it is appended to the most recent entry of its flow (addresses, ports,
//! protocol) when that entry is the same kind, still open, has `gso_size`-byte segments so far,
//! and every header field but the lengths, checksums, IPv4 identification (which must be the
//! next one, unless DF is set: RFC 6864 §4.1), TCP sequence number (which must be the next one)
//! and PSH/FIN matches (TTL/hop limit, ToS/traffic class, flow label, DF, IPv4 options, TCP
//! acknowledgement, window and options). A shorter segment, PSH or FIN close the entry. Only the
//! payload of an appended packet is stored. [`TunWriter::drain`] writes each entry with one
//! vectored write: a super-packet gets `VIRTIO_NET_HDR_GSO_TCPV4`/`TCPV6`/`UDP_L4`, its first
//! packet's header with the total length and the pseudo-header sum as partial checksum
//! (`NEEDS_CSUM`, `csum_start` = transport header); a single packet gets an all-zero header (the
//! kernel verifies its checksum as usual; `VIRTIO_NET_HDR_F_DATA_VALID` is not used because
//! `tun_get_user` ignores it). Packets whose checksum does not verify are written unchanged and
//! alone, so the kernel still drops them: coalescing never launders a bad checksum.
//!
//! Order: packets of one flow leave in the order they were pushed (a packet only joins the
//! *latest* entry of its flow, and any packet of the flow that cannot join starts a newer one).
//! Packets of different flows may leave in a different order within one flush. Without a vnet
//! header every packet is written alone, with no header, in push order.

use wire::checksum;
use wire::ip::IpProtocol;

use super::{
    be16, be32, put16, Offloads, VnetHdr, F_NEEDS_CSUM, GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4,
    MAX_IP_PACKET, MAX_SEGMENTS, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_CSUM_OFFSET, TCP_CWR, TCP_FIN,
    TCP_PSH, TCP_RST, TCP_SYN, TCP_URG, UDP_CSUM_OFFSET, VNET_HDR_LEN,
};
use std::io::{self, IoSlice};

/// What [`TunWriter::push`] did with a packet.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    /// Queued (joined an earlier packet of its flow, or as a new entry).
    Queued,
    /// No room for it: nothing was queued. Flush the writer, then push the packet again.
    Full,
    /// Empty or longer than any IP packet: not queued; count it as dropped.
    Rejected,
}

/// What one [`TunWriter::drain`] (or `flush`) wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FlushStats {
    /// Packets handed to the kernel.
    pub(crate) packets: usize,
    /// Write calls that succeeded (one per super-packet or single packet).
    pub(crate) writes: usize,
    /// Of those, super-packets (more than one packet in one write).
    pub(crate) super_packets: usize,
    /// Packets lost because their write failed.
    pub(crate) failed: usize,
    /// The error of the last failed write.
    pub(crate) last_error: Option<io::ErrorKind>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Written alone.
    Single,
    /// A TCP entry more packets may join.
    Tcp,
    /// A UDP entry more packets may join.
    Udp,
}

const NO_SEG: u32 = u32::MAX;

/// One queued write: a packet, possibly with the payloads of later packets of its flow.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Arena offset of the vnet header slot; the first packet follows it.
    off: usize,
    /// Bytes of the first packet.
    len: usize,
    /// Bytes of the super-packet (first packet plus appended payloads).
    total: usize,
    /// Flow hash (0: no flow, never matched).
    flow: u64,
    kind: Kind,
    v6: bool,
    /// Transport header offset.
    l4: usize,
    /// Bytes of IP and transport headers.
    hdr: usize,
    /// Payload bytes of the first packet: the segment size.
    gso: usize,
    /// Packets in the entry.
    segs: usize,
    next_seq: u32,
    next_id: u16,
    /// No packet may join any more (short segment, PSH or FIN).
    closed: bool,
    /// First and last appended payload in `TunWriter::segs`.
    head: u32,
    tail: u32,
}

/// An appended payload: arena range and the next payload of the same entry.
#[derive(Debug, Clone, Copy)]
struct Seg {
    off: u32,
    len: u32,
    next: u32,
}

/// What [`classify`] learned about a packet.
struct Facts {
    flow: u64,
    kind: Kind,
    v6: bool,
    l4: usize,
    hdr: usize,
    payload: usize,
}

/// The coalescing TUN writer: see the module documentation. Buffers are allocated once, in
/// [`TunWriter::new`]; pushing and flushing do not allocate.
#[derive(Debug)]
pub(crate) struct TunWriter {
    vnet: bool,
    tcp4: bool,
    tcp6: bool,
    udp4: bool,
    udp6: bool,
    arena: Box<[u8]>,
    used: usize,
    entries: Vec<Entry>,
    segs: Vec<Seg>,
    max_packets: usize,
    packets: usize,
}

/// How many recent entries a push looks through for its flow; an older entry of the flow is
/// simply not joined (order stays intact).
const FLOW_SCAN: usize = 64;

impl TunWriter {
    /// A writer for a device with `offloads`, holding up to `bytes` bytes (at least one largest
    /// IP packet) and `max_packets` packets (at least one) between flushes.
    pub(crate) fn new(offloads: Offloads, bytes: usize, max_packets: usize) -> Self {
        let bytes = bytes
            .max(VNET_HDR_LEN + MAX_IP_PACKET)
            .min(u32::MAX as usize);
        let max_packets = max_packets.max(1);
        let v = offloads.vnet_hdr;
        Self {
            vnet: v,
            tcp4: v && offloads.tso4,
            tcp6: v && offloads.tso6,
            udp4: v && offloads.uso4,
            udp6: v && offloads.uso6,
            arena: vec![0u8; bytes].into_boxed_slice(),
            used: 0,
            entries: Vec::with_capacity(max_packets),
            segs: Vec::with_capacity(max_packets),
            max_packets,
            packets: 0,
        }
    }

    /// Packets queued.
    // Only the kernel tests (tests/tun.rs, which include this file) call it.
    #[cfg(test)]
    #[allow(dead_code)]
    pub(crate) fn len(&self) -> usize {
        self.packets
    }

    /// Whether nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.packets == 0
    }

    /// Queues one IP packet (copied), joining the latest entry of its flow when it may.
    pub(crate) fn push(&mut self, pkt: &[u8]) -> Push {
        if pkt.is_empty() || pkt.len() > MAX_IP_PACKET {
            return Push::Rejected;
        }
        if self.packets >= self.max_packets {
            return Push::Full;
        }
        let facts = self.classify(pkt);
        if let Some(f) = &facts {
            if f.kind != Kind::Single {
                if let Some(i) = self.latest_of_flow(f, pkt) {
                    if self.may_join(&self.entries[i], f, pkt) {
                        return self.join(i, f, pkt);
                    }
                }
            }
        }
        let need = VNET_HDR_LEN + pkt.len();
        if self.arena.len() - self.used < need {
            return Push::Full;
        }
        let off = self.used;
        self.arena[off..off + VNET_HDR_LEN].fill(0);
        self.arena[off + VNET_HDR_LEN..off + need].copy_from_slice(pkt);
        self.used += need;
        self.packets += 1;
        let mut e = Entry {
            off,
            len: pkt.len(),
            total: pkt.len(),
            flow: 0,
            kind: Kind::Single,
            v6: false,
            l4: 0,
            hdr: 0,
            gso: 0,
            segs: 1,
            next_seq: 0,
            next_id: 0,
            closed: true,
            head: NO_SEG,
            tail: NO_SEG,
        };
        if let Some(f) = facts {
            e.flow = f.flow;
            e.kind = f.kind;
            e.v6 = f.v6;
            e.l4 = f.l4;
            e.hdr = f.hdr;
            e.gso = f.payload;
            if f.kind != Kind::Single {
                e.next_id = be16(pkt, 4).wrapping_add(1);
                e.closed = false;
                if f.kind == Kind::Tcp {
                    e.next_seq = be32(pkt, f.l4 + 4).wrapping_add(f.payload as u32);
                    e.closed = pkt[f.l4 + 13] & (TCP_PSH | TCP_FIN) != 0;
                }
            }
        }
        self.entries.push(e);
        Push::Queued
    }

    /// Parses a packet: None if it is not TCP or UDP over IP (or is a fragment); otherwise its
    /// flow and, if it may be coalesced (a candidate whose checksums verify), its kind.
    fn classify(&self, pkt: &[u8]) -> Option<Facts> {
        let v6 = match pkt[0] >> 4 {
            4 => false,
            6 => true,
            _ => return None,
        };
        let (l4, proto) = if v6 {
            if pkt.len() < 40 || usize::from(be16(pkt, 4)) + 40 != pkt.len() {
                return None;
            }
            (40, pkt[6])
        } else {
            let ihl = usize::from(pkt[0] & 0x0f) * 4;
            if ihl < 20
                || pkt.len() < ihl
                || usize::from(be16(pkt, 2)) != pkt.len()
                || be16(pkt, 6) & 0x3fff != 0
            {
                return None;
            }
            (ihl, pkt[9])
        };
        let thl = match proto {
            PROTO_TCP if pkt.len() >= l4 + 20 => usize::from(pkt[l4 + 12] >> 4) * 4,
            PROTO_UDP => 8,
            _ => return None,
        };
        if (proto == PROTO_TCP && thl < 20) || pkt.len() < l4 + thl {
            return None;
        }
        let payload = pkt.len() - l4 - thl;
        let flow = flow_hash(pkt, v6, l4, proto);
        let enabled = match (proto, v6) {
            (PROTO_TCP, false) => self.tcp4,
            (PROTO_TCP, true) => self.tcp6,
            (_, false) => self.udp4,
            (_, true) => self.udp6,
        };
        let candidate = enabled
            && payload > 0
            && match proto {
                PROTO_TCP => {
                    let flags = pkt[l4 + 13];
                    flags & TCP_ACK != 0 && flags & (TCP_SYN | TCP_RST | TCP_URG | TCP_CWR) == 0
                }
                // A zero UDP checksum (IPv4 "none") would not survive the round trip.
                _ => be16(pkt, l4 + UDP_CSUM_OFFSET) != 0,
            }
            && (v6 || checksum::sum(&pkt[..l4]) == 0xffff)
            && checksum::pseudo_header_of(pkt, IpProtocol(proto), (pkt.len() - l4) as u32)
                .is_ok_and(|ph| checksum::combine(&[ph, checksum::sum(&pkt[l4..])]) == 0xffff);
        let kind = match (candidate, proto) {
            (false, _) => Kind::Single,
            (true, PROTO_TCP) => Kind::Tcp,
            (true, _) => Kind::Udp,
        };
        Some(Facts {
            flow,
            kind,
            v6,
            l4,
            hdr: l4 + thl,
            payload,
        })
    }

    fn first(&self, e: &Entry) -> &[u8] {
        &self.arena[e.off + VNET_HDR_LEN..e.off + VNET_HDR_LEN + e.len]
    }

    /// The most recent entry (among the last [`FLOW_SCAN`]) of the packet's flow.
    fn latest_of_flow(&self, f: &Facts, pkt: &[u8]) -> Option<usize> {
        let from = self.entries.len().saturating_sub(FLOW_SCAN);
        (from..self.entries.len()).rev().find(|&i| {
            let e = &self.entries[i];
            e.flow == f.flow && e.v6 == f.v6 && {
                let first = self.first(e);
                let addrs = if f.v6 { 8..40 } else { 12..20 };
                first[addrs.clone()] == pkt[addrs]
                    && first[if f.v6 { 6 } else { 9 }] == pkt[if f.v6 { 6 } else { 9 }]
                    && first[e.l4..e.l4 + 4] == pkt[f.l4..f.l4 + 4]
            }
        })
    }

    /// Whether `pkt` may be appended to entry `e` (see the module documentation).
    fn may_join(&self, e: &Entry, f: &Facts, pkt: &[u8]) -> bool {
        let limit = if e.v6 { MAX_IP_PACKET } else { 65535 };
        if e.kind != f.kind
            || e.closed
            || e.segs >= MAX_SEGMENTS
            || f.hdr != e.hdr
            || f.payload > e.gso
            || e.total + f.payload > limit
        {
            return false;
        }
        let first = self.first(e);
        let ip_same = if e.v6 {
            first[..4] == pkt[..4] && first[6..8] == pkt[6..8]
        } else {
            first[..2] == pkt[..2]
                && first[6..10] == pkt[6..10]
                && first[20..e.l4] == pkt[20..e.l4]
                // RFC 6864 §4.1: the ID of an atomic (DF) datagram carries no meaning.
                && (be16(pkt, 4) == e.next_id || first[6] & 0x40 != 0)
        };
        if !ip_same {
            return false;
        }
        if e.kind == Kind::Udp {
            return true;
        }
        let t = e.l4;
        be32(pkt, t + 4) == e.next_seq
            && first[t + 8..t + 13] == pkt[t + 8..t + 13]
            && first[t + 13] & !(TCP_PSH | TCP_FIN) == pkt[t + 13] & !(TCP_PSH | TCP_FIN)
            && first[t + 14..t + 16] == pkt[t + 14..t + 16]
            && first[t + 18..e.hdr] == pkt[t + 18..e.hdr]
    }

    /// Appends `pkt`'s payload to entry `i`.
    fn join(&mut self, i: usize, f: &Facts, pkt: &[u8]) -> Push {
        if self.arena.len() - self.used < f.payload {
            return Push::Full;
        }
        let off = self.used;
        self.arena[off..off + f.payload].copy_from_slice(&pkt[f.hdr..]);
        self.used += f.payload;
        self.packets += 1;
        let s = self.segs.len() as u32;
        self.segs.push(Seg {
            off: off as u32,
            len: f.payload as u32,
            next: NO_SEG,
        });
        let e = &mut self.entries[i];
        if e.tail == NO_SEG {
            e.head = s;
        } else {
            self.segs[e.tail as usize].next = s;
        }
        e.tail = s;
        e.total += f.payload;
        e.segs += 1;
        e.next_id = e.next_id.wrapping_add(1);
        e.next_seq = e.next_seq.wrapping_add(f.payload as u32);
        if f.payload < e.gso {
            e.closed = true;
        }
        if e.kind == Kind::Tcp {
            let flags = pkt[f.l4 + 13] & (TCP_PSH | TCP_FIN);
            if flags != 0 {
                e.closed = true;
                let at = e.off + VNET_HDR_LEN + e.l4 + 13;
                self.arena[at] |= flags;
            }
        }
        Push::Queued
    }

    /// Writes every entry with one call of `write` each (the slices of one frame: vnet header
    /// and first packet, then appended payloads), in entry order, and empties the writer.
    /// Write errors are counted in the result, never returned.
    pub(crate) fn drain(
        &mut self,
        mut write: impl FnMut(&[IoSlice<'_>]) -> io::Result<usize>,
    ) -> FlushStats {
        let mut st = FlushStats::default();
        for i in 0..self.entries.len() {
            let e = self.entries[i];
            let vh = if e.segs > 1 {
                self.finish_super(&e)
            } else {
                VnetHdr::default()
            };
            self.arena[e.off..e.off + VNET_HDR_LEN].copy_from_slice(&vh.emit());
            let from = if self.vnet {
                e.off
            } else {
                e.off + VNET_HDR_LEN
            };
            let mut iov = [IoSlice::new(&[]); MAX_SEGMENTS + 1];
            iov[0] = IoSlice::new(&self.arena[from..e.off + VNET_HDR_LEN + e.len]);
            let mut n = 1;
            let mut s = e.head;
            while s != NO_SEG && n < iov.len() {
                let seg = self.segs[s as usize];
                let (o, l) = (seg.off as usize, seg.len as usize);
                iov[n] = IoSlice::new(&self.arena[o..o + l]);
                n += 1;
                s = seg.next;
            }
            match write(&iov[..n]) {
                Ok(_) => {
                    st.writes += 1;
                    st.packets += e.segs;
                    if e.segs > 1 {
                        st.super_packets += 1;
                    }
                }
                Err(err) => {
                    st.failed += e.segs;
                    st.last_error = Some(err.kind());
                }
            }
        }
        self.entries.clear();
        self.segs.clear();
        self.used = 0;
        self.packets = 0;
        st
    }

    /// Rewrites the first packet's header of a super-packet entry for its total length and
    /// returns the vnet header announcing it.
    fn finish_super(&mut self, e: &Entry) -> VnetHdr {
        let at = e.off + VNET_HDR_LEN;
        let p = &mut self.arena[at..at + e.len];
        let proto = if e.kind == Kind::Tcp {
            PROTO_TCP
        } else {
            PROTO_UDP
        };
        let l4_len = e.total - e.l4;
        if e.v6 {
            put16(p, 4, (e.total - 40) as u16);
        } else {
            put16(p, 2, e.total as u16);
            put16(p, 10, 0);
            let c = !checksum::sum(&p[..e.l4]);
            put16(p, 10, c);
        }
        let csum_offset = if proto == PROTO_TCP {
            TCP_CSUM_OFFSET
        } else {
            put16(p, e.l4 + 4, l4_len as u16);
            UDP_CSUM_OFFSET
        };
        // CHECKSUM_PARTIAL: the field holds the pseudo-header sum, the kernel adds the rest.
        let partial = checksum::pseudo_header_of(p, IpProtocol(proto), l4_len as u32)
            .expect("an entry's first packet has a whole IP header, and an IPv4 entry stays within 65535 bytes (may_join)");
        put16(p, e.l4 + csum_offset, partial);
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: match (proto, e.v6) {
                (PROTO_TCP, false) => GSO_TCPV4,
                (PROTO_TCP, true) => GSO_TCPV6,
                _ => GSO_UDP_L4,
            },
            hdr_len: e.hdr as u16,
            gso_size: e.gso as u16,
            csum_start: e.l4 as u16,
            csum_offset: csum_offset as u16,
        }
    }
}

/// A hash of the packet's protocol, addresses and ports (never 0).
fn flow_hash(pkt: &[u8], v6: bool, l4: usize, proto: u8) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let addrs = if v6 { &pkt[8..40] } else { &pkt[12..20] };
    let mut h = u64::from(proto);
    for c in addrs.chunks_exact(8) {
        h = (h.rotate_left(5) ^ u64::from_ne_bytes(c.try_into().expect("8 bytes"))).wrapping_mul(K);
    }
    h = (h.rotate_left(5) ^ u64::from(be32(pkt, l4))).wrapping_mul(K);
    h | 1
}
