//! Test helpers shared by the unit tests and the loopback integration tests (which include
//! this file by path, so it uses only other crates' public APIs): CHILD_SA descriptions with
//! fixed keys, the peer's side of such an SA, and packet builders.

#![allow(dead_code, unreachable_pub)]

use crypto::{Encr, SaCipher};
use esp::{EspError, InboundSa, Opened, OutboundSa, SaConfig};
use ike::{ChildKeys, ChildSaInfo, IkeSpis, TrafficSelector, TunnelId};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use wire::arp::{ArpOperation, ArpRepr};
use wire::ethernet::{EtherType, EthernetAddress, EthernetFrame, ETHERNET_HEADER_LEN};
use wire::ip::{IpProtocol, Ipv4Repr, IPV4_HEADER_LEN};
use wire::udp::{UdpChecksum, UdpRepr, UDP_HEADER_LEN};
use wire::vxlan::{Vni, VxlanPacket, VXLAN_HEADER_LEN};
use wire::{EspSpi, IkeSpi};
use zeroize::Zeroizing;

/// A selector for an address range, any protocol and port.
pub fn ts(start: &str, end: &str) -> TrafficSelector {
    TrafficSelector {
        ip_proto: 0,
        start_port: 0,
        end_port: u16::MAX,
        start: start.parse().expect("start address"),
        end: end.parse().expect("end address"),
    }
}

/// 20 bytes of AES-GCM-128 keying material (16 key + 4 salt) derived from a seed.
fn key(seed: u32) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(
        (0..20u8)
            .map(|i| (seed as u8).wrapping_mul(31).wrapping_add(i))
            .collect(),
    )
}

/// A CHILD_SA of `tunnel` with AES-GCM-16-128, keys derived from the SPIs.
pub fn child(
    tunnel: u32,
    spi_in: u32,
    spi_out: u32,
    local: SocketAddr,
    remote: SocketAddr,
    local_ts: TrafficSelector,
    remote_ts: TrafficSelector,
) -> ChildSaInfo {
    ChildSaInfo {
        tunnel: TunnelId(tunnel),
        ike: IkeSpis {
            initiator: IkeSpi(u64::from(tunnel) + 1),
            responder: IkeSpi(u64::from(tunnel) + 2),
        },
        inbound_spi: EspSpi(spi_in),
        outbound_spi: EspSpi(spi_out),
        encr: Encr::AesGcm16_128,
        integ: None,
        esn: false,
        pfs: None,
        keys: ChildKeys {
            inbound_encr: key(spi_in),
            inbound_integ: Zeroizing::new(Vec::new()),
            outbound_encr: key(spi_out),
            outbound_integ: Zeroizing::new(Vec::new()),
        },
        local_ts: vec![local_ts],
        remote_ts: vec![remote_ts],
        local,
        remote,
        replay_window: 64,
        replaces: None,
        outbound_active: true,
        proposal: "AES_GCM_16_128/NO_EXT_SEQ".into(),
    }
}

/// The peer's side of a CHILD_SA: it seals with our inbound keys and opens with our outbound.
pub struct Peer {
    /// Peer -> us.
    pub out: OutboundSa,
    /// Us -> peer.
    pub inb: InboundSa,
}

impl Peer {
    /// The peer of `child`.
    pub fn of(child: &ChildSaInfo) -> Self {
        let cfg = SaConfig {
            esn: child.esn,
            replay_window: 1024,
            rekey_after: None,
        };
        let c = |k: &[u8]| SaCipher::new(child.encr, k, None).expect("test key");
        Self {
            out: OutboundSa::new(child.inbound_spi, c(&child.keys.inbound_encr), &cfg)
                .expect("peer outbound SA"),
            inb: InboundSa::new(child.outbound_spi, c(&child.keys.outbound_encr), &cfg)
                .expect("peer inbound SA"),
        }
    }

    /// An ESP packet (UDP payload) carrying `inner`.
    pub fn seal(&self, inner: &[u8]) -> Vec<u8> {
        let h = self.out.header_len();
        let mut buf = vec![0u8; inner.len() + self.out.overhead()];
        buf[h..h + inner.len()].copy_from_slice(inner);
        let sealed = self.out.seal(&mut buf, inner.len()).expect("seal");
        buf.truncate(sealed.len);
        buf
    }

    /// The inner packet of an ESP packet we sent.
    pub fn open(&self, esp: &[u8]) -> Result<Vec<u8>, EspError> {
        let mut buf = esp.to_vec();
        match self.inb.open(&mut buf)? {
            Opened::Packet { inner, .. } => Ok(buf[inner].to_vec()),
            Opened::Dummy { .. } => Ok(Vec::new()),
        }
    }
}

/// An IPv4/UDP packet with valid checksums.
pub fn udp4(src: &str, sport: u16, dst: &str, dport: u16, ttl: u8, payload: &[u8]) -> Vec<u8> {
    let (s, d): (Ipv4Addr, Ipv4Addr) = (src.parse().expect("src"), dst.parse().expect("dst"));
    let mut p = vec![0u8; IPV4_HEADER_LEN + UDP_HEADER_LEN + payload.len()];
    p[IPV4_HEADER_LEN + UDP_HEADER_LEN..].copy_from_slice(payload);
    UdpRepr {
        src_port: sport,
        dst_port: dport,
        payload_len: payload.len(),
    }
    .emit(
        &mut p[IPV4_HEADER_LEN..],
        UdpChecksum::V4 { src: s, dst: d },
    )
    .expect("udp");
    Ipv4Repr {
        src_addr: s,
        dst_addr: d,
        protocol: IpProtocol::UDP,
        payload_len: UDP_HEADER_LEN + payload.len(),
        ttl,
        dscp: 0,
        ecn: 0,
        ident: 0x1234,
        dont_frag: true,
    }
    .emit(&mut p)
    .expect("ipv4");
    p
}

/// A VXLAN datagram (UDP payload) carrying an Ethernet frame.
pub fn vxlan(
    vni: u32,
    dst: [u8; 6],
    src: [u8; 6],
    ethertype: EtherType,
    payload: &[u8],
) -> Vec<u8> {
    let mut d = vec![0u8; VXLAN_HEADER_LEN + ETHERNET_HEADER_LEN + payload.len()];
    VxlanPacket::new_unchecked(&mut d[..]).set_header(Vni::new(vni).expect("vni"));
    let mut eth = EthernetFrame::new_unchecked(&mut d[VXLAN_HEADER_LEN..]);
    eth.set_dst_addr(EthernetAddress(dst));
    eth.set_src_addr(EthernetAddress(src));
    eth.set_ethertype(ethertype);
    d[VXLAN_HEADER_LEN + ETHERNET_HEADER_LEN..].copy_from_slice(payload);
    d
}

/// A decoded VXLAN datagram: VNI, Ethernet destination, source, type, payload.
pub fn parse_vxlan(d: &[u8]) -> (u32, [u8; 6], [u8; 6], EtherType, Vec<u8>) {
    let vx = VxlanPacket::new_checked(d).expect("vxlan");
    assert!(vx.has_vni(), "I flag set");
    let eth = EthernetFrame::new_checked(&d[VXLAN_HEADER_LEN..]).expect("ethernet");
    (
        vx.vni().get(),
        eth.dst_addr().0,
        eth.src_addr().0,
        eth.ethertype(),
        eth.payload().to_vec(),
    )
}

/// An ARP packet.
pub fn arp(op: ArpOperation, sha: [u8; 6], spa: &str, tha: [u8; 6], tpa: &str) -> Vec<u8> {
    let r = ArpRepr {
        operation: op,
        source_hardware_addr: EthernetAddress(sha),
        source_protocol_addr: spa.parse().expect("spa"),
        target_hardware_addr: EthernetAddress(tha),
        target_protocol_addr: tpa.parse().expect("tpa"),
    };
    let mut b = vec![0u8; r.buffer_len()];
    r.emit(&mut b).expect("arp");
    b
}

/// Parses an IP address (test shorthand).
pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip address")
}

/// A self-dispatch table for VNI `vni`: `owners.len()` virtual MACs, the owner of each an
/// index into `nodes` (VTEP addresses), announced every 30 s, sent on for 5 s after a move.
pub fn dispatch_table(vni: u32, nodes: &[&str], owners: Vec<u16>) -> datapath::DispatchConfig {
    datapath::DispatchConfig {
        vmacs: owners.len() as u32,
        announce_interval: std::time::Duration::from_secs(30),
        linger: std::time::Duration::from_secs(5),
        vnets: vec![datapath::VnetOwners {
            vni,
            nodes: nodes.iter().map(|n| n.parse().expect("ip")).collect(),
            owners,
        }],
    }
}

/// The thread ids of this process's data plane workers (threads named `dp-worker…`).
pub fn worker_threads() -> std::io::Result<Vec<u32>> {
    let mut tids = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")? {
        let dir = task?.path();
        if std::fs::read_to_string(dir.join("comm"))?.starts_with("dp-worker") {
            if let Some(tid) = dir
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok())
            {
                tids.push(tid);
            }
        }
    }
    Ok(tids)
}

/// Nanoseconds threads `tids` of this process have run on a CPU
/// (`/proc/self/task/TID/schedstat`, its first field).
pub fn threads_cpu_ns(tids: &[u32]) -> std::io::Result<u64> {
    let mut total = 0;
    for tid in tids {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))?;
        total += stat
            .split_whitespace()
            .next()
            .and_then(|f| f.parse::<u64>().ok())
            .ok_or_else(|| std::io::Error::other(format!("thread {tid}: bad schedstat")))?;
    }
    Ok(total)
}
