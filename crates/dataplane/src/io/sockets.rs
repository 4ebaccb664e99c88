//! The socket table of the I/O stage: every UDP socket the data plane opens (IKE and NAT-T per
//! listen address, the VTEPs' receiving and source-port sockets, the Geneve socket in relay
//! mode) and the TUN device, opened once at start and named by index everywhere else. Only
//! this stage ([`crate::io`]) and `sys/` touch them; the other stages write socket indexes
//! into send batches.
//!
//! Sockets: per listen address one on the IKE port and one on the NAT-T port (IPv6 sockets are
//! IPV6_V6ONLY; all bind concrete addresses, so no IP_PKTINFO is needed); per local VTEP one
//! on the VXLAN port, which receives from hosts and sends ARP/ND, plus
//! [`VXLAN_SOURCE_PORTS`] send-only sockets on ephemeral ports whose source ports carry the
//! flow hash of RFC 7348 §5. UDP GRO and GSO are used where the kernel accepts them.

use crate::lane::LaneKind;
use crate::sys::tun::Tun;
use crate::sys::tun_offload::Offloads;
use datapath::{AttachmentPort, DataplaneConfig, DataplaneError, XdpMode};
use netio::packet::PacketSocket;
use netio::xdp::{XdpAttach, XdpSteering, Xsk};
use netio::{SendMode, SocketOptions, UdpSocket};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// Socket buffer size asked for, each way (the kernel may clamp it).
const SOCKET_BUFFER: usize = 4 << 20;

/// How long a send waits for socket buffer space, at most three times per batch, before the
/// rest of the batch is dropped.
const SEND_BLOCK: Duration = Duration::from_millis(50);

/// Source ports per VTEP for VXLAN toward hosts: the flow hash picks one (RFC 7348 §5).
pub(crate) const VXLAN_SOURCE_PORTS: usize = 16;

/// An unused address (the source of a TUN frame, the local address of lanes without one).
pub(crate) const UNSPECIFIED: SocketAddr = crate::batch::UNSPECIFIED;

/// How the data plane opens a socket: UDP GRO on receive if `gro`, UDP GSO on send if `gso`.
/// A socket that is not read (`recv` false) gets a minimal receive buffer, so that stray
/// datagrams to it cannot pile up.
fn socket_options(gro: bool, gso: bool, recv: bool) -> SocketOptions {
    SocketOptions {
        recv_buffer: if recv { SOCKET_BUFFER } else { 1 },
        send_buffer: SOCKET_BUFFER,
        gro,
        gso,
        timestamps: false,
        queue_drops: false,
        send_mode: SendMode::Bounded(SEND_BLOCK),
    }
}

/// One local VTEP: the socket on the VXLAN port that receives from hosts, and the sockets
/// on ephemeral ports whose source ports carry the flow entropy.
#[derive(Debug, Clone)]
pub(crate) struct Vtep {
    /// Underlay address.
    pub(crate) ip: IpAddr,
    /// Socket index of the receiving socket (also sends ARP/ND).
    pub(crate) recv: usize,
    /// Socket indexes of the source-port pool.
    pub(crate) pool: Vec<usize>,
    /// With self-dispatch, the MAC this node's frames on this VTEP come from when they come
    /// from none of its virtual MACs (`vnet::vmacs::node_mac`).
    pub(crate) node_mac: wire::ethernet::EthernetAddress,
}

/// A listen address: its IKE and NAT-T sockets.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Listen {
    /// Address.
    pub(crate) ip: IpAddr,
    /// Socket index on the IKE port.
    pub(crate) ike: usize,
    /// Socket index on the NAT-T port.
    pub(crate) natt: usize,
}

/// Every socket and the TUN device.
pub(crate) struct Sockets {
    /// Every socket; messages name them by index.
    pub(crate) socks: Vec<Arc<UdpSocket>>,
    /// Listen addresses (none in relay mode).
    pub(crate) listen: Vec<Listen>,
    /// Local VTEPs (fixed at start).
    pub(crate) vteps: Vec<Vtep>,
    /// Relay mode: index of the Geneve socket.
    pub(crate) relay_sock: Option<usize>,
    /// The VTEPs' main sockets receive on the VXLAN port (not in relay mode, unless with
    /// self-dispatch): each is an input lane.
    pub(crate) vteps_receive: bool,
    /// The TUN device, if configured.
    pub(crate) tun: Option<Tun>,
    /// AF_PACKET sockets of the attachments' interfaces, one per interface (in order of
    /// first use in the configuration).
    pub(crate) packet: Vec<PacketSocket>,
    /// By attachment (configuration index): the index of its interface's socket in `packet`.
    attach_iface: Vec<usize>,
    /// AF_XDP steering, one per interface (`[gateway] xdp`); dropping it detaches the
    /// programs.
    pub(crate) xdp: Vec<XdpSteering>,
    /// The AF_XDP sockets of the lanes that have them (every receive queue of the lane's
    /// interface), with the losses already counted of each.
    xsks: Vec<(LaneKind, Vec<XskInput>)>,
}

/// An AF_XDP socket of a lane, with the kernel's loss count last read.
pub(crate) struct XskInput {
    /// The socket.
    pub(crate) xsk: Arc<Xsk>,
    /// Frames lost so far, as last counted into the drops.
    counted: std::sync::atomic::AtomicU64,
    /// Frames read from it.
    pub(crate) frames: std::sync::atomic::AtomicU64,
    /// Its interface's index in `Sockets::xdp`.
    iface: usize,
}

impl XskInput {
    /// The frames lost since the last call (`XDP_STATISTICS`, one `getsockopt`).
    pub(crate) fn new_losses(&self) -> u64 {
        let Ok(l) = self.xsk.losses() else {
            return 0;
        };
        let total = l.total();
        let before = self
            .counted
            .swap(total, std::sync::atomic::Ordering::Relaxed);
        total.saturating_sub(before)
    }
}

impl Sockets {
    /// Opens the sockets of `cfg` (validated) with VTEPs on `vtep_ips`, and the TUN device.
    pub(crate) fn open(cfg: &DataplaneConfig, vtep_ips: &[IpAddr]) -> Result<Self, DataplaneError> {
        // In relay mode hosts send to the steer nodes, not here: the VTEP's main socket only
        // sends (ARP/ND), from an ephemeral port. With self-dispatch the hosts send to the
        // data nodes' VTEPs; in relay mode a VTEP port already taken on this address (another
        // data node on the same host) leaves this node without (it cannot join the ring,
        // see `Dataplane::vteps_receive`).
        let mut bound = Vec::with_capacity(vtep_ips.len());
        let mut vteps_receive = cfg.relay.is_none() || cfg.dispatch.is_some();
        if vteps_receive {
            for &ip in vtep_ips {
                let addr = SocketAddr::new(ip, cfg.vxlan_port);
                match UdpSocket::bind(addr, &socket_options(true, true, true)) {
                    Ok(s) => bound.push(s),
                    Err(e) if cfg.relay.is_some() && e.kind() == std::io::ErrorKind::AddrInUse => {
                        tracing::warn!(
                            vtep = %addr,
                            "the VTEP port is taken on this address: this data node cannot take part in self-dispatch"
                        );
                        bound.clear();
                        vteps_receive = false;
                        break;
                    }
                    Err(source) => return Err(DataplaneError::Bind { addr, source }),
                }
            }
        }
        // The receiving sockets come first in `socks`.
        let mut socks: Vec<Arc<UdpSocket>> = Vec::new();
        let mut receivers: Vec<usize> = Vec::with_capacity(bound.len());
        for s in bound {
            socks.push(Arc::new(s));
            receivers.push(socks.len() - 1);
        }
        let mut open = |addr: SocketAddr, opts: SocketOptions| -> Result<usize, DataplaneError> {
            let s = UdpSocket::bind(addr, &opts)
                .map_err(|source| DataplaneError::Bind { addr, source })?;
            socks.push(Arc::new(s));
            Ok(socks.len() - 1)
        };
        let esp_opts = socket_options(true, true, true);
        let mut listen = Vec::with_capacity(cfg.listen.len());
        for ip in &cfg.listen {
            let ike = open(
                SocketAddr::new(*ip, cfg.ike_port),
                socket_options(false, false, true),
            )?;
            let natt = open(SocketAddr::new(*ip, cfg.natt_port), esp_opts)?;
            listen.push(Listen { ip: *ip, ike, natt });
        }
        let relay_sock = match &cfg.relay {
            Some(r) => Some(open(r.listen, esp_opts)?),
            None => None,
        };
        let mut vteps = Vec::with_capacity(vtep_ips.len());
        let mut receivers = receivers.into_iter();
        for &ip in vtep_ips {
            let recv = match receivers.next() {
                Some(i) => i,
                None => open(SocketAddr::new(ip, 0), socket_options(false, true, false))?,
            };
            let mut pool = Vec::with_capacity(VXLAN_SOURCE_PORTS);
            for _ in 0..VXLAN_SOURCE_PORTS {
                pool.push(open(
                    SocketAddr::new(ip, 0),
                    socket_options(false, true, false),
                )?);
            }
            vteps.push(Vtep {
                ip,
                recv,
                pool,
                node_mac: crate::vnet::vmacs::node_mac(ip),
            });
        }
        let tun =
            match &cfg.tun_name {
                Some(name) => Some(Tun::open_with(name, Offloads::ALL).map_err(|source| {
                    DataplaneError::Tun {
                        name: name.clone(),
                        source,
                    }
                })?),
                None => None,
            };
        // One socket per interface, told apart by index: an alternative name (`ip link
        // property add … altname`) is the same interface, whose frames must be read once.
        let mut packet: Vec<PacketSocket> = Vec::new();
        let mut attach_iface = Vec::with_capacity(cfg.attachments.len());
        // Relay mode: the attachments are on the steer nodes' ports (no local interface).
        let local = if cfg.relay.is_some() {
            &[][..]
        } else {
            &cfg.attachments[..]
        };
        for (i, a) in local.iter().enumerate() {
            let AttachmentPort::Interface(interface) = &a.port else {
                return Err(DataplaneError::Config {
                    field: format!("attachments[{i}].port"),
                    reason: format!("{}: a steer node's port needs relay mode", a.port),
                });
            };
            let cannot = |e: std::io::Error| DataplaneError::Config {
                field: format!("attachments[{i}].interface"),
                reason: format!("cannot open an AF_PACKET ring on {interface}: {e}"),
            };
            let ifindex = netio::packet::interface_index(interface).map_err(cannot)?;
            if let Some(at) = packet.iter().position(|p| p.ifindex() == ifindex) {
                attach_iface.push(at);
                continue;
            }
            attach_iface.push(packet.len());
            packet.push(PacketSocket::open(interface).map_err(cannot)?);
        }
        let mut sockets = Self {
            socks,
            listen,
            vteps,
            relay_sock,
            vteps_receive,
            tun,
            packet,
            attach_iface,
            xdp: Vec::new(),
            xsks: Vec::new(),
        };
        sockets.open_xdp(cfg.xdp)?;
        Ok(sockets)
    }

    /// The lanes whose datagrams an XDP program can steer (NAT-T, VTEP, Geneve), with their
    /// sockets' addresses.
    fn steerable(&self) -> Vec<(LaneKind, usize)> {
        let mut lanes = Vec::new();
        for (i, l) in self.listen.iter().enumerate() {
            lanes.push((LaneKind::Natt { listen: i }, l.natt));
        }
        if let Some(sock) = self.relay_sock {
            lanes.push((LaneKind::Relay, sock));
        }
        if self.vteps_receive {
            for (i, v) in self.vteps.iter().enumerate() {
                lanes.push((LaneKind::Vtep { vtep: i }, v.recv));
            }
        }
        lanes
    }

    /// Steers the NAT-T, VTEP and Geneve lanes' datagrams into AF_XDP sockets (`mode`), one
    /// XDP program per interface. With `auto`, a lane whose interface cannot (no address of
    /// its own, a program there already, no XDP in the kernel) keeps its UDP socket alone,
    /// and the log says why; with `native` or `generic` that is an error.
    fn open_xdp(&mut self, mode: XdpMode) -> Result<(), DataplaneError> {
        let modes: &[XdpAttach] = match mode {
            XdpMode::Off => return Ok(()),
            XdpMode::Auto => &[XdpAttach::Native, XdpAttach::Generic],
            XdpMode::Native => &[XdpAttach::Native],
            XdpMode::Generic => &[XdpAttach::Generic],
        };
        let refuse = |what: String| -> Result<(), DataplaneError> {
            if mode == XdpMode::Auto {
                tracing::warn!(reason = %what, "xdp = \"auto\": this input stays on its UDP socket");
                Ok(())
            } else {
                Err(DataplaneError::Config {
                    field: "xdp".into(),
                    reason: format!("xdp = \"{}\": {what}", mode.name()),
                })
            }
        };
        // Group the lanes by interface, in order of first appearance.
        let mut by_iface: Vec<(u32, Vec<(LaneKind, usize)>)> = Vec::new();
        for (kind, sock) in self.steerable() {
            let addr = self.local_addr(sock);
            match netio::xdp::interface_of(addr.ip()) {
                Ok(ifindex) => match by_iface.iter_mut().find(|(i, _)| *i == ifindex) {
                    Some((_, lanes)) => lanes.push((kind, sock)),
                    None => by_iface.push((ifindex, vec![(kind, sock)])),
                },
                Err(e) => refuse(format!("{addr}: {e}"))?,
            }
        }
        for (ifindex, lanes) in by_iface {
            let addrs: Vec<SocketAddr> = lanes.iter().map(|(_, s)| self.local_addr(*s)).collect();
            match XdpSteering::open(ifindex, &addrs, modes) {
                Ok(steering) => {
                    // In generic mode the program runs after the kernel's GRO, which would join
                    // datagrams for a GRO socket into one frame: the steered sockets (which
                    // then see only what the program leaves to the kernel: fragments, IPv4
                    // with options) receive datagram by datagram. Native mode runs before GRO.
                    if steering.attach == XdpAttach::Generic {
                        let refused = lanes.iter().find_map(|(_, sock)| {
                            self.socks[*sock].stop_gro().err().map(|e| (*sock, e))
                        });
                        if let Some((sock, e)) = refused {
                            let addr = self.local_addr(sock);
                            drop(steering);
                            refuse(format!(
                                "cannot turn UDP GRO off on {addr} for generic XDP: {e}"
                            ))?;
                            continue;
                        }
                    }
                    tracing::info!(interface = %steering.interface, attach = steering.attach.name(),
                        zero_copy = steering.zero_copy,
                        addresses = ?addrs, queues = steering.sockets.first().map_or(0, |s| s.1.len()),
                        "AF_XDP input up: the XDP program steers these addresses into AF_XDP sockets");
                    for ((kind, _), (_, xsks)) in lanes.iter().zip(&steering.sockets) {
                        let inputs = xsks
                            .iter()
                            .map(|x| XskInput {
                                xsk: Arc::clone(x),
                                counted: std::sync::atomic::AtomicU64::new(0),
                                frames: std::sync::atomic::AtomicU64::new(0),
                                iface: self.xdp.len(),
                            })
                            .collect();
                        self.xsks.push((*kind, inputs));
                    }
                    self.xdp.push(steering);
                }
                Err(e) => {
                    let name = netio::xdp::interface_name(ifindex)
                        .unwrap_or_else(|_| format!("interface {ifindex}"));
                    let busy = if e.raw_os_error() == Some(libc::EBUSY) {
                        " (it has an XDP program already, which is left alone)"
                    } else {
                        ""
                    };
                    refuse(format!(
                        "cannot steer {addrs:?} with XDP on {name}: {e}{busy}"
                    ))?
                }
            }
        }
        Ok(())
    }

    /// The AF_XDP sockets of lane `kind` (none without XDP).
    pub(crate) fn lane_xsks(&self, kind: LaneKind) -> &[XskInput] {
        self.xsks
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(&[], |(_, x)| x.as_slice())
    }

    /// What `protego status` shows of the AF_XDP input, per interface.
    pub(crate) fn xdp_stats(&self) -> Vec<datapath::XdpStats> {
        self.xdp
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let addresses: Vec<SocketAddr> = s.sockets.iter().map(|(a, _)| *a).collect();
                let frames = self
                    .all_xsks()
                    .filter(|x| x.iface == i)
                    .map(|x| x.frames.load(std::sync::atomic::Ordering::Relaxed))
                    .sum();
                datapath::XdpStats {
                    interface: s.interface.clone(),
                    attach: s.attach.name().to_owned(),
                    zero_copy: s.zero_copy,
                    addresses,
                    queues: s.sockets.first().map_or(0, |(_, x)| x.len()),
                    frames,
                }
            })
            .collect()
    }

    /// Every lane's AF_XDP sockets.
    pub(crate) fn all_xsks(&self) -> impl Iterator<Item = &XskInput> {
        self.xsks.iter().flat_map(|(_, x)| x)
    }

    /// The inputs, one lane each, with the descriptor workers poll: IKE and NAT-T sockets per
    /// listen address, then the Geneve socket (relay mode) and the VTEPs' receiving sockets,
    /// then the TUN device.
    pub(crate) fn inputs(&self) -> Vec<(LaneKind, RawFd)> {
        let mut inputs = Vec::new();
        for (i, l) in self.listen.iter().enumerate() {
            inputs.push((LaneKind::Ike { listen: i }, self.socks[l.ike].as_raw_fd()));
            inputs.push((LaneKind::Natt { listen: i }, self.socks[l.natt].as_raw_fd()));
        }
        if let Some(sock) = self.relay_sock {
            inputs.push((LaneKind::Relay, self.socks[sock].as_raw_fd()));
        }
        if self.vteps_receive {
            for (i, v) in self.vteps.iter().enumerate() {
                inputs.push((LaneKind::Vtep { vtep: i }, self.socks[v.recv].as_raw_fd()));
            }
        }
        if let Some(t) = &self.tun {
            inputs.push((LaneKind::Tun, t.raw_fd()));
        }
        for (i, p) in self.packet.iter().enumerate() {
            inputs.push((LaneKind::Attach { iface: i }, p.raw_fd()));
        }
        inputs
    }

    /// The address socket `sock` is bound to.
    pub(crate) fn local_addr(&self, sock: usize) -> SocketAddr {
        self.socks[sock].local_addr()
    }

    /// The local address datagrams of lane `kind` arrive on (unspecified for the TUN device and
    /// the Geneve socket, whose datagrams carry their own).
    pub(crate) fn lane_local(&self, kind: LaneKind) -> SocketAddr {
        match kind {
            LaneKind::Ike { listen } => self.local_addr(self.listen[listen].ike),
            LaneKind::Natt { listen } => self.local_addr(self.listen[listen].natt),
            LaneKind::Vtep { vtep } => self.local_addr(self.vteps[vtep].recv),
            LaneKind::Tun | LaneKind::Relay | LaneKind::Attach { .. } => UNSPECIFIED,
        }
    }

    /// The index of the packet socket of attachment `attachment` (its configuration index).
    pub(crate) fn packet_iface(&self, attachment: usize) -> Option<usize> {
        self.attach_iface.get(attachment).copied()
    }

    /// The NAT-T socket on `ip`.
    pub(crate) fn natt_sock(&self, ip: IpAddr) -> Option<usize> {
        self.listen.iter().find(|l| l.ip == ip).map(|l| l.natt)
    }

    /// The socket ESP of a CHILD_SA whose local address is `ip` leaves from: the NAT-T
    /// socket on `ip`, or in relay mode (where `ip` is a steer node's VIP) the Geneve socket.
    pub(crate) fn outer_sock(&self, ip: IpAddr) -> Option<usize> {
        self.relay_sock.or_else(|| self.natt_sock(ip))
    }

    /// The socket for sending IKE from `local`: (socket, add the non-ESP marker).
    pub(crate) fn ike_sock(&self, local: SocketAddr) -> Option<(usize, bool)> {
        let family_match = |l: &&Listen| {
            l.ip == local.ip() || (local.ip().is_unspecified() && l.ip.is_ipv4() == local.is_ipv4())
        };
        self.listen.iter().filter(family_match).find_map(|l| {
            if self.socks[l.natt].local_addr().port() == local.port() {
                Some((l.natt, true))
            } else if self.socks[l.ike].local_addr().port() == local.port() {
                Some((l.ike, false))
            } else {
                None
            }
        })
    }

    /// Sends one datagram from socket `sock` to `dst` at once (the control plane's slow path:
    /// IKE messages and NAT keepalives; the packet path sends batches).
    pub(crate) fn send_datagram(&self, sock: usize, buf: &[u8], dst: SocketAddr) -> io::Result<()> {
        self.socks[sock].send_to(buf, dst)
    }

    /// Logs what was opened.
    pub(crate) fn log_opened(&self, steer: Option<&Vec<SocketAddr>>) {
        for (i, l) in self.listen.iter().enumerate() {
            tracing::info!(ike = %self.socks[l.ike].local_addr(), natt = %self.socks[l.natt].local_addr(),
                gro = self.socks[l.natt].gro(), gso = self.socks[l.natt].gso(), listen = i, "listening");
        }
        for v in &self.vteps {
            tracing::info!(vtep = %self.socks[v.recv].local_addr(), "VXLAN VTEP up");
        }
        if let Some(sock) = self.relay_sock {
            let s = &self.socks[sock];
            tracing::info!(geneve = %s.local_addr(), gro = s.gro(), gso = s.gso(),
                steer = ?steer, "relay mode: receiving from steer nodes");
        }
        if let Some(t) = &self.tun {
            tracing::info!(device = t.name(), "TUN device up");
        }
        for p in &self.packet {
            let m = p.mac();
            tracing::info!(interface = p.name(), mac = %wire::ethernet::EthernetAddress(m),
                "attachment interface up (AF_PACKET, TPACKET_V3 ring)");
        }
    }
}
