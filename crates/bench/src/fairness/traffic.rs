//! The tenants' traffic of `protego bench fairness`: what each tenant sends (a TCP SYN flood,
//! a DNS query flood, IMIX or fixed-size UDP) and how the load generator's pool interleaves
//! the tenants ([`TenantPlan`], an [`InboundPlan`]).
//!
//! ```text
//! SYN (64 B):  IPv4 (20) | TCP (20 + 24 of options: MSS, SACK permitted, timestamps, window scale), flag SYN
//! DNS (64 B):  IPv4 (20) | UDP (8) to port 53 | DNS query (36: header, `bench.fairness.net` A IN)
//! UDP:         IPv4 (20) | UDP (8) to port 5001 | run tag (4) | packet index (4) | zeros
//! ```
//!
//! Packets go out in blocks of `block` packets of one tenant (one size, so one UDP GSO train
//! and, at the gateway, one run of the CPU charge); blocks follow a repeating pattern in which
//! each tenant appears as often as its offered share says (RFC 793 for TCP, RFC 1035 §4.1 for
//! the query).

use std::net::Ipv4Addr;

use wire::ip::{IpProtocol, Ipv4Repr};

use crate::imix;
use crate::load::InboundPlan;
use crate::net;
use crate::packet::{self, InnerSpec, IPV4_HEADER_LEN};

/// The port the SYN flood aims at (the SYN-cookie program is built to protect it).
pub(crate) const SYN_PORT: u16 = 80;
/// The DNS port (RFC 1035).
pub(crate) const DNS_PORT: u16 = 53;
/// Length of the flood packets (SYN and DNS query), IPv4 header included.
pub(crate) const FLOOD_LEN: usize = 64;
/// TCP header of the SYN: 20 bytes and 24 of options.
const TCP_LEN: usize = 44;
/// The query's name, in labels (RFC 1035 §3.1): 20 bytes.
const QNAME: &[u8] = b"\x05bench\x08fairness\x03net\x00";
/// Distinct source ports per tenant (flows).
const FLOWS: u32 = 1024;

/// What a tenant sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Traffic {
    /// TCP SYNs to port 80 of the VM, 64 bytes.
    SynFlood,
    /// DNS queries (UDP to port 53) to the VM, 64 bytes.
    DnsFlood,
    /// UDP in the simple IMIX (40, 576, 1500 bytes, 7:4:1), counted at the host.
    Imix,
    /// UDP packets of this length, counted at the host.
    Udp(u16),
}

impl Traffic {
    /// The inner IP packet's length of the tenant's packet number `j`.
    pub(crate) fn len_of(self, j: u64) -> usize {
        match self {
            Traffic::SynFlood | Traffic::DnsFlood => FLOOD_LEN,
            Traffic::Imix => usize::from(imix::size_of(j)),
            Traffic::Udp(n) => usize::from(n),
        }
    }

    /// The longest packet.
    pub(crate) fn max_len(self) -> usize {
        match self {
            Traffic::SynFlood | Traffic::DnsFlood => FLOOD_LEN,
            Traffic::Imix => usize::from(imix::MAX),
            Traffic::Udp(n) => usize::from(n),
        }
    }

    /// A short label for tables.
    pub fn label(self) -> String {
        match self {
            Traffic::SynFlood => "SYN flood".to_owned(),
            Traffic::DnsFlood => "DNS flood".to_owned(),
            Traffic::Imix => "UDP IMIX".to_owned(),
            Traffic::Udp(n) => format!("UDP {n} B"),
        }
    }
}

/// Writes a TCP SYN from `src` (port `sport`) to `dst`:[`SYN_PORT`], [`FLOOD_LEN`] bytes, with
/// checksums, at the start of `buf`.
pub(crate) fn write_syn(
    buf: &mut [u8],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    isn: u32,
) -> Option<()> {
    let buf = buf.get_mut(..FLOOD_LEN)?;
    Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        protocol: IpProtocol::TCP,
        payload_len: TCP_LEN,
        ttl: 64,
        dscp: 0,
        ecn: 0,
        ident: sport,
        dont_frag: true,
    }
    .emit(&mut *buf)
    .ok()?;
    let tcp = &mut buf[IPV4_HEADER_LEN..];
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&SYN_PORT.to_be_bytes());
    tcp[4..8].copy_from_slice(&isn.to_be_bytes());
    tcp[8..12].fill(0);
    // Data offset (11 words), flags: SYN.
    tcp[12] = ((TCP_LEN / 4) as u8) << 4;
    tcp[13] = 0x02;
    tcp[14..16].copy_from_slice(&64240u16.to_be_bytes());
    tcp[16..20].fill(0);
    // Options as a Linux client sends them: MSS 1460, SACK permitted, timestamps, NOP,
    // window scale 7, padded with NOPs to 24 bytes.
    let options: [u8; 24] = [
        2, 4, 0x05, 0xb4, // MSS
        4, 2, // SACK permitted
        8, 10, 0, 0, 0, 1, 0, 0, 0, 0, // timestamps
        1, // NOP
        3, 3, 7, // window scale
        1, 1, 1, 1, // NOPs
    ];
    tcp[20..44].copy_from_slice(&options);
    wire::checksum::finish_ip(buf).ok()
}

/// Writes a DNS query (A record of `bench.fairness.net`, id `id`) from `src`:`sport` to
/// `dst`:53, [`FLOOD_LEN`] bytes, with checksums, at the start of `buf`.
pub(crate) fn write_dns_query(
    buf: &mut [u8],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    id: u16,
) -> Option<()> {
    let buf = buf.get_mut(..FLOOD_LEN)?;
    let udp_len = FLOOD_LEN - IPV4_HEADER_LEN;
    Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        protocol: IpProtocol::UDP,
        payload_len: udp_len,
        ttl: 64,
        dscp: 0,
        ecn: 0,
        ident: id,
        dont_frag: false,
    }
    .emit(&mut *buf)
    .ok()?;
    let udp = &mut buf[IPV4_HEADER_LEN..];
    udp[0..2].copy_from_slice(&sport.to_be_bytes());
    udp[2..4].copy_from_slice(&DNS_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    udp[6..8].fill(0);
    let dns = &mut udp[8..];
    // Header: id, flags (a standard query, recursion desired), one question.
    dns[0..2].copy_from_slice(&id.to_be_bytes());
    dns[2..4].copy_from_slice(&0x0100u16.to_be_bytes());
    dns[4..6].copy_from_slice(&1u16.to_be_bytes());
    dns[6..12].fill(0);
    dns[12..12 + QNAME.len()].copy_from_slice(QNAME);
    let q = 12 + QNAME.len();
    dns[q..q + 2].copy_from_slice(&1u16.to_be_bytes()); // A
    dns[q + 2..q + 4].copy_from_slice(&1u16.to_be_bytes()); // IN
    wire::checksum::finish_ip(buf).ok()
}

/// One tenant as the plan sees it.
#[derive(Debug, Clone)]
pub(crate) struct PlanTenant {
    /// What it sends.
    pub(crate) traffic: Traffic,
    /// Its offered share (blocks per pattern; 0: it sends nothing).
    pub(crate) share: u32,
    /// Its tunnels' indices in the flow's SAs, and their inner addresses.
    pub(crate) tunnels: Vec<(usize, Ipv4Addr)>,
}

/// A position of the repeating block pattern: the tenant, and how many of its blocks came
/// before in the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    tenant: usize,
    rank: u32,
}

/// The interleaving of the tenants' packets for one run.
#[derive(Debug, Clone)]
pub(crate) struct TenantPlan {
    tenants: Vec<PlanTenant>,
    block: u32,
    pattern: Vec<Position>,
}

impl TenantPlan {
    /// A plan over `tenants` in blocks of `block` packets; None if no tenant sends or one
    /// that sends has no tunnel.
    pub(crate) fn new(tenants: Vec<PlanTenant>, block: u32) -> Option<TenantPlan> {
        if tenants.iter().any(|t| t.share > 0 && t.tunnels.is_empty()) {
            return None;
        }
        let rounds = tenants.iter().map(|t| t.share).max().unwrap_or(0);
        let mut pattern = Vec::new();
        for r in 0..rounds {
            for (k, t) in tenants.iter().enumerate() {
                if t.share > r {
                    pattern.push(Position { tenant: k, rank: r });
                }
            }
        }
        if pattern.is_empty() {
            return None;
        }
        Some(TenantPlan {
            tenants,
            block: block.max(1),
            pattern,
        })
    }

    /// The tenant of packet `i` and its number among that tenant's packets.
    pub(crate) fn tenant_of(&self, i: u32) -> (usize, u64) {
        let b = u64::from(i / self.block);
        let n = self.pattern.len() as u64;
        let p = self.pattern[(b % n) as usize];
        let share = u64::from(self.tenants[p.tenant].share);
        let k = (b / n) * share + u64::from(p.rank);
        (
            p.tenant,
            k * u64::from(self.block) + u64::from(i % self.block),
        )
    }

    /// Packets of each tenant among the first `count`.
    pub(crate) fn counts(&self, count: u64) -> Vec<u64> {
        let mut out = vec![0u64; self.tenants.len()];
        // One pattern cycle, then the remainder packet by packet.
        let cycle = self.pattern.len() as u64 * u64::from(self.block);
        for p in &self.pattern {
            out[p.tenant] += (count / cycle) * u64::from(self.block);
        }
        for i in 0..(count % cycle) {
            let (t, _) = self.tenant_of(i as u32);
            out[t] += 1;
        }
        out
    }

    /// The tunnel and inner address of the tenant's packet `j` (its blocks go round its
    /// tunnels).
    fn tunnel_of(&self, tenant: usize, j: u64) -> (usize, Ipv4Addr) {
        let t = &self.tenants[tenant].tunnels;
        t[((j / u64::from(self.block)) % t.len() as u64) as usize]
    }
}

impl InboundPlan for TenantPlan {
    fn slot(&self, i: u32) -> (usize, usize) {
        let (t, j) = self.tenant_of(i);
        (self.tunnel_of(t, j).0, self.tenants[t].traffic.len_of(j))
    }

    fn write(&self, i: u32, tag: u32, buf: &mut [u8]) -> Option<()> {
        let (t, j) = self.tenant_of(i);
        let (_, src) = self.tunnel_of(t, j);
        let sport = 1024 + (j % u64::from(FLOWS)) as u16;
        match self.tenants[t].traffic {
            Traffic::SynFlood => write_syn(
                buf,
                src,
                net::VM,
                sport,
                (j as u32).wrapping_mul(2_654_435_761),
            ),
            Traffic::DnsFlood => write_dns_query(buf, src, net::VM, sport, j as u16),
            traffic @ (Traffic::Imix | Traffic::Udp(_)) => {
                let spec = InnerSpec {
                    src,
                    dst: net::VM,
                    src_port: sport,
                    dst_port: net::INNER_PORT,
                };
                packet::write_inner(buf, &spec, traffic.len_of(j), tag, i).map(|_| ())
            }
        }
    }

    fn max_len(&self) -> usize {
        self.tenants
            .iter()
            .filter(|t| t.share > 0)
            .map(|t| t.traffic.max_len())
            .max()
            .unwrap_or(FLOOD_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::ip::Ipv4Packet;

    fn tenant(traffic: Traffic, share: u32, tunnels: &[usize]) -> PlanTenant {
        PlanTenant {
            traffic,
            share,
            tunnels: tunnels
                .iter()
                .map(|&k| (k, net::tunnel_addr(k as u32)))
                .collect(),
        }
    }

    #[test]
    fn blocks_follow_the_shares_and_go_round_the_tunnels() {
        let plan = TenantPlan::new(
            vec![
                tenant(Traffic::SynFlood, 1, &[0]),
                tenant(Traffic::DnsFlood, 0, &[1]),
                tenant(Traffic::Udp(64), 2, &[2, 3]),
            ],
            4,
        )
        .expect("plan");
        let tenants: Vec<usize> = (0..24).map(|i| plan.tenant_of(i).0).collect();
        assert_eq!(
            tenants,
            [[0; 4], [2; 4], [2; 4], [0; 4], [2; 4], [2; 4]].concat()
        );
        // The third tenant's packets are numbered in order, its blocks alternate tunnels.
        assert_eq!(plan.tenant_of(4), (2, 0));
        assert_eq!(plan.tenant_of(8), (2, 4));
        assert_eq!(plan.tenant_of(16), (2, 8));
        assert_eq!(plan.slot(4).0, 2);
        assert_eq!(plan.slot(8).0, 3);
        assert_eq!(plan.slot(16).0, 2);
        assert_eq!(plan.counts(24), vec![8, 0, 16]);
        assert_eq!(plan.counts(26), vec![10, 0, 16]);
        assert_eq!(plan.max_len(), 64);
        assert!(TenantPlan::new(vec![tenant(Traffic::Imix, 0, &[0])], 8).is_none());
        assert!(TenantPlan::new(vec![tenant(Traffic::Imix, 1, &[])], 8).is_none());
    }

    #[test]
    fn packets_parse_and_carry_their_checksums() {
        let mut buf = [0u8; 128];
        let src = net::tunnel_addr(0);
        write_syn(&mut buf, src, net::VM, 4000, 7).expect("syn");
        let ip = Ipv4Packet::new_checked(&buf[..FLOOD_LEN]).expect("ipv4");
        assert!(ip.verify_checksum());
        assert_eq!(ip.protocol(), IpProtocol::TCP);
        assert_eq!(usize::from(ip.total_len()), FLOOD_LEN);
        let tcp = ip.payload();
        assert_eq!(u16::from_be_bytes([tcp[2], tcp[3]]), SYN_PORT);
        assert_eq!(tcp[13], 0x02);
        let pseudo =
            wire::checksum::pseudo_header_v4(src, net::VM, IpProtocol::TCP, TCP_LEN as u16);
        assert_eq!(
            !wire::checksum::combine(&[pseudo, wire::checksum::sum(tcp)]),
            0
        );

        write_dns_query(&mut buf, src, net::VM, 4000, 9).expect("dns");
        let ip = Ipv4Packet::new_checked(&buf[..FLOOD_LEN]).expect("ipv4");
        assert!(ip.verify_checksum());
        let udp = ip.payload();
        assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), DNS_PORT);
        assert_eq!(&udp[8 + 12..8 + 12 + QNAME.len()], QNAME);
        assert_eq!(udp.len(), 8 + 12 + QNAME.len() + 4);

        let plan = TenantPlan::new(vec![tenant(Traffic::Imix, 1, &[0])], 8).expect("plan");
        let (_, len) = plan.slot(0);
        plan.write(0, 0xabcd, &mut buf).expect("udp");
        let mark = packet::read_inner(&buf[..len]).expect("marked");
        assert_eq!((mark.tag, mark.index, mark.len), (0xabcd, 0, 40));
    }
}
