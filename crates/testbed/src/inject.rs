//! Hand-made traffic for robustness tests: UDP sockets opened inside a test namespace (to send
//! arbitrary IKE or ESP-in-UDP datagrams at a gateway, RFC 7296 / RFC 3948, and read what it
//! answers) and TCP sockets (a client and a server at either end of a tunnel), UDP datagrams
//! counted by destination port across a path ([`UdpByPort`], what a firewall let through), an
//! extra host attached to a [`Topology`]'s WAN (an attacker next to the sites), and the UDP
//! datagrams recorded in a pcap file (to replay captured messages).

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::bed::Testbed;
use crate::error::{Error, Result};
use crate::netns::Netns;
use crate::prefix::IfAddr;
use crate::topology::{Topology, WAN_V4};

impl Netns {
    /// A UDP socket bound to `bind` inside this namespace (port 0: any free port). A socket
    /// belongs to the namespace it was created in, whatever thread uses it later, so the caller
    /// sends and receives from this namespace with ordinary `std` calls.
    pub fn udp_socket(&self, bind: SocketAddr) -> Result<UdpSocket> {
        self.socket_in("bind a UDP socket in", &bind.to_string(), move || {
            UdpSocket::bind(bind)
        })
    }

    /// A TCP listener on `bind` inside this namespace (as [`Netns::udp_socket`]: the caller
    /// accepts with ordinary `std` calls).
    pub fn tcp_listener(&self, bind: SocketAddr) -> Result<TcpListener> {
        self.socket_in("listen on TCP in", &bind.to_string(), move || {
            TcpListener::bind(bind)
        })
    }

    /// A TCP connection from `from` (port 0: any free port) to `to`, opened inside this
    /// namespace within `timeout`: the source address chooses the traffic selector a site's
    /// tunnel carries, as `ping -I` does.
    pub fn tcp_connect(
        &self,
        from: SocketAddr,
        to: SocketAddr,
        timeout: Duration,
    ) -> Result<TcpStream> {
        self.socket_in("connect over TCP in", &format!("{from}->{to}"), move || {
            let socket = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
            socket.bind(&from.into())?;
            socket.connect_timeout(&to.into(), timeout)?;
            Ok(socket.into())
        })
    }

    /// Runs `open` in a thread that entered this namespace and returns what it opened (a
    /// socket, an XDP program's handle); `action` and `what` name it in an error.
    pub fn socket_in<T: Send + 'static>(
        &self,
        action: &'static str,
        what: &str,
        open: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> Result<T> {
        let path = Path::new("/run/netns").join(self.name());
        let file = File::open(&path).map_err(|e| Error::io("open namespace", &path, e))?;
        // setns(2) changes the namespace of the calling thread only: do it in a thread of
        // its own, which ends right after opening the socket.
        let worker = std::thread::spawn(move || -> std::io::Result<T> {
            // SAFETY: setns only reads the descriptor, which `file` keeps open during the call.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            open()
        });
        worker
            .join()
            .map_err(|_| Error::io("enter namespace", &path, std::io::Error::other("panicked")))?
            .map_err(|e| Error::io(action, path.join(what), e))
    }
}

/// UDP datagrams across a path, counted by destination port: what a firewall let through.
#[derive(Debug, Clone, Copy)]
pub struct UdpByPort<'a> {
    /// The sender's namespace.
    pub src: &'a Netns,
    /// The sender's address (port 0: any).
    pub from: IpAddr,
    /// The receivers' namespace.
    pub dst: &'a Netns,
    /// The receivers' address: one socket per port listens on it.
    pub to: IpAddr,
    /// The destination ports, each sent `copies` datagrams.
    pub ports: &'a [u16],
    /// Datagrams per port.
    pub copies: u32,
}

impl UdpByPort<'_> {
    /// Sends `copies` datagrams to every port (port by port) and returns how many each port
    /// received once every port of `expected` received all of its copies, or after `limit`
    /// (the caller compares what arrived with what it expected). A datagram to a port left
    /// out of `expected` that arrives after that is not counted: pair the result with a
    /// counter of the datagrams the path dropped.
    pub fn run(&self, expected: &[u16], limit: Duration) -> Result<BTreeMap<u16, u32>> {
        let receivers = self
            .ports
            .iter()
            .map(|&port| {
                let socket = self.dst.udp_socket(SocketAddr::new(self.to, port))?;
                socket.set_nonblocking(true).map_err(|e| {
                    Error::io("set a UDP socket non-blocking in", self.dst.name(), e)
                })?;
                Ok((port, socket))
            })
            .collect::<Result<Vec<_>>>()?;
        let sender = self.src.udp_socket(SocketAddr::new(self.from, 0))?;
        for &port in self.ports {
            for copy in 0..self.copies {
                let payload = format!("port {port} copy {copy}");
                sender
                    .send_to(payload.as_bytes(), SocketAddr::new(self.to, port))
                    .map_err(|e| Error::io("send a UDP datagram in", self.src.name(), e))?;
            }
        }
        let mut received: BTreeMap<u16, u32> = self.ports.iter().map(|&p| (p, 0)).collect();
        let deadline = Instant::now() + limit;
        let mut buf = [0u8; 2048];
        loop {
            for (port, socket) in &receivers {
                loop {
                    match socket.recv(&mut buf) {
                        Ok(_) => *received.entry(*port).or_default() += 1,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(Error::io("receive UDP in", self.dst.name(), e)),
                    }
                }
            }
            let done = expected
                .iter()
                .all(|p| received.get(p).is_some_and(|&n| n >= self.copies));
            if done || Instant::now() >= deadline {
                return Ok(received);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A host attached to the WAN of a topology, beside the sites and the gateway.
#[derive(Clone, Debug)]
pub struct WanHost {
    /// Its namespace.
    pub ns: Netns,
    /// Its WAN interface.
    pub ifname: String,
    /// Its IPv4 address on the WAN.
    pub addr: IfAddr,
}

/// Creates a namespace `role` with one veth into the WAN bridge of `topo` and the WAN address
/// with host number `host` (pick one above the sites', e.g. 200).
pub fn attach_wan_host(bed: &Testbed, topo: &Topology, role: &str, host: u128) -> Result<WanHost> {
    let bridge = wan_bridge(topo)?;
    let ns = bed.netns(role)?;
    let pair = ns.veth_to(&topo.switch)?;
    topo.switch.set_master(&pair.peer, &bridge)?;
    let wan: crate::prefix::Prefix = WAN_V4.parse()?;
    let addr = wan.if_addr(host)?;
    ns.add_addr(&pair.local, addr)?;
    Ok(WanHost {
        ns,
        ifname: pair.local,
        addr,
    })
}

/// The name of the WAN bridge in the switch namespace: the master of the gateway's WAN veth
/// peer.
fn wan_bridge(topo: &Topology) -> Result<String> {
    let gw = &topo.gateway;
    let json = |out: String| -> Result<serde_json::Value> {
        serde_json::from_str(&out).map_err(|e| Error::Parse {
            what: "ip -j link output",
            detail: e.to_string(),
            input: out.chars().take(400).collect(),
        })
    };
    let own = json(
        gw.ns
            .ip(["-j", "link", "show", "dev", gw.wan_if.as_str()])?,
    )?;
    let peer_index = own[0]["link_index"].as_u64();
    let links = json(topo.switch.ip(["-j", "link", "show"])?)?;
    links
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["ifindex"].as_u64() == peer_index && peer_index.is_some())
        .and_then(|l| l["master"].as_str())
        .map(str::to_owned)
        .ok_or_else(|| Error::Parse {
            what: "ip -j link output",
            detail: format!("no bridge holds the peer of {}", gw.wan_if),
            input: links.to_string().chars().take(400).collect(),
        })
}

/// One UDP datagram from a pcap file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapUdp {
    /// Capture time, microseconds since the epoch.
    pub time_us: u64,
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port.
    pub dst: SocketAddr,
    /// The UDP payload.
    pub payload: Vec<u8>,
}

/// The UDP datagrams of a pcap file (as `tcpdump -w` writes it: Ethernet, Linux cooked v1/v2 or
/// raw IP link types, microsecond or nanosecond timestamps), in capture order. Frames that are
/// not unfragmented IPv4/IPv6 UDP are skipped.
pub fn pcap_udp(path: &Path) -> Result<Vec<PcapUdp>> {
    let data = std::fs::read(path).map_err(|e| Error::io("read pcap", path, e))?;
    let bad = |detail: &str| Error::Parse {
        what: "pcap file",
        detail: detail.to_owned(),
        input: path.display().to_string(),
    };
    let head = data
        .get(..24)
        .ok_or_else(|| bad("shorter than the file header"))?;
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let (little, nanos) = match magic {
        0xa1b2_c3d4 => (true, false),
        0xa1b2_3c4d => (true, true),
        0xd4c3_b2a1 => (false, false),
        0x4d3c_b2a1 => (false, true),
        _ => return Err(bad("not a pcap file (pcapng is not supported)")),
    };
    let u32_at = |b: &[u8], i: usize| {
        let w = [b[i], b[i + 1], b[i + 2], b[i + 3]];
        if little {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let link = u32_at(head, 20);
    let mut out = Vec::new();
    let mut at = 24;
    while let Some(rec) = data.get(at..at + 16) {
        let (secs, frac, caplen) = (u32_at(rec, 0), u32_at(rec, 4), u32_at(rec, 8) as usize);
        let frame = data
            .get(at + 16..at + 16 + caplen)
            .ok_or_else(|| bad("record runs past the end"))?;
        at += 16 + caplen;
        let frac_us = if nanos { frac / 1000 } else { frac };
        let time_us = u64::from(secs) * 1_000_000 + u64::from(frac_us);
        if let Some((src, dst, payload)) = link_udp(link, frame) {
            out.push(PcapUdp {
                time_us,
                src,
                dst,
                payload: payload.to_vec(),
            });
        }
    }
    Ok(out)
}

/// The UDP datagram in one captured frame of link type `link`.
fn link_udp(link: u32, frame: &[u8]) -> Option<(SocketAddr, SocketAddr, &[u8])> {
    let (ethertype, ip) = match link {
        // Ethernet, with up to two VLAN tags.
        1 => {
            let mut off = 12;
            let mut ty = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
            while ty == 0x8100 || ty == 0x88a8 {
                off += 4;
                ty = u16::from_be_bytes([*frame.get(off)?, *frame.get(off + 1)?]);
            }
            (ty, frame.get(off + 2..)?)
        }
        // Linux cooked capture v1 (protocol at 14) and v2 (protocol at 0).
        113 => (
            u16::from_be_bytes([*frame.get(14)?, *frame.get(15)?]),
            frame.get(16..)?,
        ),
        276 => (
            u16::from_be_bytes([*frame.first()?, *frame.get(1)?]),
            frame.get(20..)?,
        ),
        // Raw IP.
        101 | 12 | 14 => match frame.first()? >> 4 {
            4 => (0x0800, frame),
            6 => (0x86dd, frame),
            _ => return None,
        },
        _ => return None,
    };
    let (src_ip, dst_ip, udp): (IpAddr, IpAddr, &[u8]) = match ethertype {
        0x0800 => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]);
            if *ip.get(9)? != 17 || frag & 0x3fff != 0 || ihl < 20 {
                return None;
            }
            let a: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            let b: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
            (
                Ipv4Addr::from(a).into(),
                Ipv4Addr::from(b).into(),
                ip.get(ihl..total)?,
            )
        }
        0x86dd => {
            if *ip.get(6)? != 17 {
                return None;
            }
            let len = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            let a: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let b: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            (
                Ipv6Addr::from(a).into(),
                Ipv6Addr::from(b).into(),
                ip.get(40..40 + len)?,
            )
        }
        _ => return None,
    };
    let sport = u16::from_be_bytes([*udp.first()?, *udp.get(1)?]);
    let dport = u16::from_be_bytes([*udp.get(2)?, *udp.get(3)?]);
    let ulen = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    let payload = udp.get(8..ulen.max(8))?;
    Some((
        SocketAddr::new(src_ip, sport),
        SocketAddr::new(dst_ip, dport),
        payload,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pcap with one Ethernet/IPv4/UDP frame 10.0.0.1:4500 -> 10.0.0.2:500 carrying "hi!".
    fn sample() -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let ip_total: u16 = 20 + 8 + 3;
        f.extend_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f[16..18].copy_from_slice(&ip_total.to_be_bytes());
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&4500u16.to_be_bytes());
        f.extend_from_slice(&500u16.to_be_bytes());
        f.extend_from_slice(&11u16.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(b"hi!");
        let mut p = Vec::new();
        p.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        p.extend_from_slice(&[2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&65535u32.to_le_bytes());
        p.extend_from_slice(&1u32.to_le_bytes());
        p.extend_from_slice(&7u32.to_le_bytes());
        p.extend_from_slice(&9u32.to_le_bytes());
        p.extend_from_slice(&(f.len() as u32).to_le_bytes());
        p.extend_from_slice(&(f.len() as u32).to_le_bytes());
        p.extend_from_slice(&f);
        p
    }

    #[test]
    fn reads_udp_from_pcap() {
        let path = std::env::temp_dir().join(format!("protego-pcap-{}.pcap", std::process::id()));
        std::fs::write(&path, sample()).expect("write");
        let got = pcap_udp(&path).expect("parse");
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            got,
            vec![PcapUdp {
                time_us: 7_000_009,
                src: "10.0.0.1:4500".parse().expect("addr"),
                dst: "10.0.0.2:500".parse().expect("addr"),
                payload: b"hi!".to_vec(),
            }]
        );
    }

    #[test]
    fn truncated_pcap_is_an_error() {
        let path =
            std::env::temp_dir().join(format!("protego-pcap-cut-{}.pcap", std::process::id()));
        let mut p = sample();
        p.truncate(p.len() - 2);
        std::fs::write(&path, p).expect("write");
        let got = pcap_udp(&path);
        let _ = std::fs::remove_file(&path);
        assert!(got.is_err());
    }
}
