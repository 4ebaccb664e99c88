//! The load generator: its sockets in the peer and host namespaces, its receiver threads, and
//! one measurement run — build a pool of packets, send it at a set rate (paced GSO trains),
//! wait until the gateway has delivered what it will, and read the gateway's CPU time, drop
//! counters and per-worker packets around it.
//!
//! Inbound runs send ESP-in-UDP (RFC 4303, RFC 3948) sealed with the SAs the load generator
//! negotiated, every packet with a fresh sequence number (the gateway keeps an anti-replay
//! window, RFC 4303 §3.4.3), so a pool is built anew for each run. Outbound runs send VXLAN
//! frames (RFC 7348) from the host VTEP, or plain UDP from the VM address for strongSwan.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wire::ethernet::{EtherType, EthernetAddress};

use crate::cpu;
use crate::error::{BenchError, Result};
use crate::gateway::GatewayCounters;
use crate::ike_client::{inbound_by_spi, TunnelSa};
use crate::net::{self, BenchNet};
use crate::options::PacketSize;
use crate::packet::{self, InnerSpec, INNER_HEADERS, VXLAN_FRAME_HEADER};
use crate::pool::{Built, Pool};
use crate::rx::{GatewayMac, Measure, RxHandle, RxKind, RxReport};
use crate::sock::{self, realtime_ns, send_trains, SendScratch, Socket};

/// Socket buffers of the load generator.
const SOCKET_BUFFER: usize = 64 << 20;
/// Distinct inner UDP source ports (flows) per tunnel.
const FLOWS: u64 = 64;
/// How long the receiver may see nothing new before a run is considered drained.
const QUIET: Duration = Duration::from_millis(150);
/// Longest drain wait.
const DRAIN_MAX: Duration = Duration::from_secs(10);
/// Most trains per `sendmmsg` call.
pub(crate) const TRAINS_PER_CALL: usize = 64;

/// The gateway process under test, as a run sees it.
pub(crate) trait UnderTest {
    /// `protego` or `strongswan`.
    fn name(&self) -> &'static str;
    /// Its pid.
    fn pid(&self) -> u32;
    /// Its own counters (drops, per-worker packets), if it reports them.
    fn counters(&self) -> Option<GatewayCounters>;
    /// `Ok` while it runs.
    fn check_running(&self) -> Result<()>;
    /// Stops it (SIGTERM, then SIGKILL after a grace period).
    fn stop(&self);
    /// Its whole status document, if it has one (Protego's control socket).
    fn status(&self) -> Option<serde_json::Value> {
        None
    }
}

/// The inbound packets of a [`Flow::Planned`] run: which tunnel each goes through and what
/// it carries (`protego bench fairness` mixes tenants and kinds of traffic).
pub(crate) trait InboundPlan {
    /// The tunnel (an index into the flow's SAs) and the inner IP packet's length of the
    /// run's packet `i`.
    fn slot(&self, i: u32) -> (usize, usize);
    /// Writes the run's packet `i` (as long as [`slot`](Self::slot) said) at the start of
    /// `buf`, marking it with `tag` if it is a kind the receiver counts; None if it cannot.
    fn write(&self, i: u32, tag: u32, buf: &mut [u8]) -> Option<()>;
    /// The longest inner IP packet of the plan.
    fn max_len(&self) -> usize;
}

/// Where the host side of the load generator sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostSide {
    /// A VXLAN VTEP (Protego).
    Vxlan,
    /// A plain address the gateway's kernel routes to (strongSwan).
    Plain,
}

/// The traffic of a run.
pub(crate) enum Flow<'a> {
    /// ESP from the peer to the gateway; inner packets arrive at the host.
    Inbound {
        /// The tunnels' SAs (packets cycle over them).
        sas: &'a [TunnelSa],
        /// How inner packets arrive.
        host: HostSide,
    },
    /// Inner packets from the host to the gateway; ESP arrives at the peer.
    Outbound {
        /// The tunnels' SAs (to open the gateway's ESP).
        sas: &'a [TunnelSa],
        /// How inner packets leave the host.
        host: HostSide,
        /// The gateway's MAC in the VNet (VXLAN only).
        gw_mac: EthernetAddress,
    },
    /// VXLAN frames from the peer namespace to the host VTEP, forwarded by the gateway
    /// namespace's kernel: the path without any gateway in user space.
    Baseline,
    /// ESP from the peer to the gateway as `plan` lays it out (tunnel, size and content per
    /// packet); inner packets the plan marks are counted at the host.
    Planned {
        /// The tunnels' SAs.
        sas: &'a [TunnelSa],
        /// The packets.
        plan: &'a dyn InboundPlan,
    },
}

/// How to run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunSpec {
    /// Inner packet sizes.
    pub(crate) size: PacketSize,
    /// Packets to build (fewer if the pool is too small).
    pub(crate) packets: u32,
    /// Offered rate, packets per second (infinite: as fast as the load generator can).
    pub(crate) rate_pps: f64,
    /// Packets per GSO train at most.
    pub(crate) train: usize,
    /// Trains per system call at most ([`TRAINS_PER_CALL`]; with `train` 1 and this 1, one
    /// datagram per system call: a peer that does not batch).
    pub(crate) per_call: usize,
    /// Record per-packet receive times for latency.
    pub(crate) record: bool,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunResult {
    /// Offered rate, packets per second.
    pub(crate) offered_pps: f64,
    /// Packets the kernel took from the load generator.
    pub(crate) sent: u64,
    /// Packets that arrived.
    pub(crate) delivered: u64,
    /// Their inner bytes.
    pub(crate) delivered_bytes: u64,
    /// Time between the first and the last arrival, seconds.
    pub(crate) rx_span_s: f64,
    /// Time the sending took, seconds.
    pub(crate) send_span_s: f64,
    /// Gateway CPU time over the run, nanoseconds.
    pub(crate) cpu_ns: u64,
    /// The gateway's own drop counters over the run (None if it has none).
    pub(crate) gateway_drops: Option<u64>,
    /// UDP receive-buffer drops in the gateway namespace over the run.
    pub(crate) gateway_socket_drops: u64,
    /// UDP receive-buffer drops at the load generator's receiving socket.
    pub(crate) loadgen_overflow: u64,
    /// Interface drops in the gateway namespace and input backlog drops of the machine.
    pub(crate) path_drops: u64,
    /// Packets per gateway worker over the run (empty if not reported).
    pub(crate) worker_packets: Vec<u64>,
    /// The gateway's largest inbound reordering so far and its smallest replay window.
    pub(crate) reorder: Option<(u64, u64)>,
    /// One-way delays of the recorded packets, nanoseconds.
    pub(crate) latency_ns: Vec<u64>,
    /// The gateway's status documents just before and just after the run (Protego only).
    pub(crate) status: Option<(serde_json::Value, serde_json::Value)>,
}

impl RunResult {
    /// Delivered packets per second (over the arrival span, or the send span if all arrived
    /// at once).
    pub(crate) fn delivered_pps(&self) -> f64 {
        let span = if self.rx_span_s > 1e-4 {
            self.rx_span_s
        } else {
            self.send_span_s
        };
        if span > 0.0 {
            self.delivered as f64 / span
        } else {
            0.0
        }
    }

    /// Delivered inner bits per second.
    pub(crate) fn delivered_bps(&self) -> f64 {
        if self.delivered == 0 {
            return 0.0;
        }
        self.delivered_pps() * 8.0 * self.delivered_bytes as f64 / self.delivered as f64
    }
}

/// The gateway's counters at one instant.
struct Snapshot {
    status: Option<serde_json::Value>,
    counters: Option<GatewayCounters>,
    udp_drops: u64,
    path_drops: u64,
    cpu: cpu::ThreadTimes,
}

/// Sets the calling thread's timer slack (sleep precision) to `ns`.
pub(crate) fn set_timer_slack(ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long by value and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
}

/// The load generator.
pub(crate) struct Loadgen {
    /// The peer's NAT-T socket (IKE after the float, ESP both ways).
    pub(crate) natt: Arc<Socket>,
    /// The peer's IKE socket (port 500).
    pub(crate) ike: Arc<UdpSocket>,
    host: Arc<Socket>,
    plain: Arc<Socket>,
    base: Arc<Socket>,
    /// The receiver of the NAT-T socket.
    pub(crate) rx_peer: Arc<RxHandle>,
    rx_host: Arc<RxHandle>,
    rx_plain: Arc<RxHandle>,
    gw_mac: GatewayMac,
    pool: Pool,
    scratch: SendScratch,
    send_ns: Vec<u64>,
    /// The tunnel of each packet of the pool of a [`Flow::Planned`] run.
    planned: Vec<u32>,
    next_tag: u32,
    interrupted: Arc<AtomicBool>,
    /// The load generator's namespaces (for their interface drop counters).
    namespaces: [testbed::Netns; 2],
}

/// A load generator socket at `addr` in `ns`; `rx`: one a receiver thread reads.
fn open(ns: &testbed::Netns, addr: SocketAddr, rx: bool) -> Result<Arc<Socket>> {
    let s = ns.udp_socket(addr)?;
    Ok(Arc::new(sock::wrap(s, SOCKET_BUFFER, rx).map_err(|e| {
        BenchError::io(format!("socket {addr}"), e)
    })?))
}

impl Loadgen {
    /// Opens the sockets in `bench`'s namespaces and starts the receivers.
    pub(crate) fn new(
        bench: &BenchNet,
        pool_bytes: usize,
        interrupted: Arc<AtomicBool>,
    ) -> Result<Loadgen> {
        set_timer_slack(1_000);
        let natt = open(&bench.peer, SocketAddr::from((net::PEER, 4500)), true)?;
        let ike = Arc::new(bench.peer.udp_socket(SocketAddr::from((net::PEER, 500)))?);
        let host = open(
            &bench.host,
            SocketAddr::from((net::HOST_VTEP, net::VXLAN_PORT)),
            true,
        )?;
        let plain = open(
            &bench.host,
            SocketAddr::from((net::VM, net::PLAIN_PORT)),
            true,
        )?;
        let base = open(&bench.peer, SocketAddr::from((net::PEER, 0)), false)?;
        let gw_mac: GatewayMac = Arc::new(Mutex::new(None));
        let rx_peer = Arc::new(RxHandle::spawn(
            "rx-peer",
            RxKind::PeerEsp,
            Arc::clone(&natt),
            Arc::clone(&gw_mac),
        )?);
        let rx_host = Arc::new(RxHandle::spawn(
            "rx-host",
            RxKind::HostVxlan,
            Arc::clone(&host),
            Arc::clone(&gw_mac),
        )?);
        let rx_plain = Arc::new(RxHandle::spawn(
            "rx-plain",
            RxKind::HostPlain,
            Arc::clone(&plain),
            Arc::clone(&gw_mac),
        )?);
        Ok(Loadgen {
            natt,
            ike,
            host,
            plain,
            base,
            rx_peer,
            rx_host,
            rx_plain,
            gw_mac,
            pool: Pool::with_budget(pool_bytes),
            scratch: SendScratch::default(),
            send_ns: Vec::new(),
            planned: Vec::new(),
            next_tag: (std::process::id() << 12) ^ 0x5a5a_0000,
            interrupted,
            namespaces: [bench.peer.clone(), bench.host.clone()],
        })
    }

    /// The pool's byte budget.
    pub(crate) fn pool_budget(&self) -> usize {
        self.pool.budget()
    }

    /// Whether the sending sockets still use GSO.
    pub(crate) fn gso(&self) -> bool {
        self.natt.gso() && self.host.gso()
    }

    /// Resolves the gateway's MAC in the VNet: ARP requests (in VXLAN) for its gateway address
    /// until a reply arrives.
    pub(crate) fn resolve_gateway_mac(&self, timeout: Duration) -> Result<EthernetAddress> {
        ask_gateway_mac(&self.host, &self.gw_mac, net::VM, timeout)
    }

    /// Points IKE messages arriving on the NAT-T socket at `inbox`.
    pub(crate) fn set_ike_inbox(
        &self,
        inbox: Option<crossbeam_channel::Sender<crate::ike_client::IkeDatagram>>,
    ) -> Result<()> {
        self.rx_peer.set_ike(inbox)
    }

    /// Runs `flow` as `spec` says against `gw`.
    pub(crate) fn run(
        &mut self,
        flow: &Flow<'_>,
        spec: &RunSpec,
        gw: Option<&dyn UnderTest>,
    ) -> Result<RunResult> {
        if self.interrupted.load(Ordering::Relaxed) {
            return Err(BenchError::Interrupted);
        }
        self.next_tag = self.next_tag.wrapping_add(1);
        let tag = self.next_tag;
        let built = self.build(flow, spec, tag)?;
        if built == 0 {
            return Err(BenchError::NoTraffic {
                case: "pool".to_owned(),
                detail: "the packet pool holds no packet (budget too small)".to_owned(),
            });
        }
        self.send_ns.clear();
        self.send_ns.resize(built as usize, 0);
        let (rx, send_sock, measure) = self.route(flow, spec, tag, built);
        let (rx, send_sock) = (Arc::clone(rx), Arc::clone(send_sock));
        rx.start(measure)?;
        let before = gw.map(|g| self.snapshot(g)).transpose()?;
        let send_start = Instant::now();
        let sent = send_paced(
            &send_sock,
            &mut self.scratch,
            &self.pool,
            &mut self.send_ns,
            spec.rate_pps,
            spec.per_call,
            &self.interrupted,
        );
        let send_span_s = send_start.elapsed().as_secs_f64();
        if let Flow::Inbound { sas, .. } = flow {
            // Packet i of the pool went to tunnel i % n with the tunnel's i / n-th number;
            // packets go out in pool order, so each tunnel's next number follows its last sent.
            let n = sas.len().max(1) as u64;
            for (t, sa) in sas.iter().enumerate() {
                let sent_t = sent.saturating_sub(t as u64).div_ceil(n);
                sa.next_seq.fetch_add(sent_t, Ordering::Relaxed);
            }
        }
        if let Flow::Planned { sas, .. } = flow {
            // The sent packets are the pool's first `sent`: each tunnel's next number follows
            // the last of them it carried.
            let mut per_tunnel = vec![0u64; sas.len()];
            for &t in self.planned.iter().take(sent as usize) {
                if let Some(n) = per_tunnel.get_mut(t as usize) {
                    *n += 1;
                }
            }
            for (sa, n) in sas.iter().zip(per_tunnel) {
                sa.next_seq.fetch_add(n, Ordering::Relaxed);
            }
        }
        drain(&rx, sent);
        let mut result = RunResult {
            offered_pps: spec.rate_pps,
            sent,
            send_span_s,
            ..RunResult::default()
        };
        if let (Some(g), Some(before)) = (gw, before) {
            let after = self.snapshot(g)?;
            result.cpu_ns = after.cpu.since(&before.cpu);
            result.gateway_socket_drops = after.udp_drops.saturating_sub(before.udp_drops);
            result.path_drops = after.path_drops.saturating_sub(before.path_drops);
            if let (Some(c0), Some(c1)) = (before.counters, after.counters) {
                let d = c1.since(&c0);
                result.gateway_drops = Some(d.drops);
                result.worker_packets = d.worker_packets;
                result.reorder = Some((d.max_reorder, d.replay_window));
            }
            if let (Some(s0), Some(s1)) = (before.status, after.status) {
                result.status = Some((s0, s1));
            }
            g.check_running()?;
        }
        let report: RxReport = rx.stop()?;
        result.delivered = report.packets;
        result.delivered_bytes = report.bytes;
        result.loadgen_overflow = report.overflow;
        if let (Some(f), Some(l)) = (report.first_ns, report.last_ns) {
            result.rx_span_s = l.saturating_sub(f) as f64 / 1e9;
        }
        if spec.record {
            result.latency_ns = report
                .samples
                .iter()
                .filter_map(|&(index, rx_ns)| {
                    let sent = *self.send_ns.get(index as usize)?;
                    (sent != 0).then(|| rx_ns.saturating_sub(sent))
                })
                .collect();
        }
        Ok(result)
    }

    /// Where a run's packets leave and arrive, and what the receiver counts.
    fn route(
        &self,
        flow: &Flow<'_>,
        spec: &RunSpec,
        tag: u32,
        built: u32,
    ) -> (&Arc<RxHandle>, &Arc<Socket>, Measure) {
        let plain = |record| Measure {
            tag,
            record,
            sample_every: 1,
            sas: Arc::default(),
            esp_sizes: Vec::new(),
        };
        match flow {
            Flow::Baseline => (&self.rx_host, &self.base, plain(spec.record)),
            Flow::Planned { .. } => (&self.rx_host, &self.natt, plain(spec.record)),
            Flow::Inbound { host, .. } => {
                let rx = match host {
                    HostSide::Vxlan => &self.rx_host,
                    HostSide::Plain => &self.rx_plain,
                };
                (rx, &self.natt, plain(spec.record))
            }
            Flow::Outbound { sas, host, .. } => {
                // The inner length of a datagram that is not opened, from its ESP length.
                let esp_sizes = spec
                    .size
                    .sizes()
                    .into_iter()
                    .map(|s| {
                        let s = usize::from(s);
                        (sas.first().map_or(s, |t| t.outbound.sealed_len(s)), s)
                    })
                    .collect();
                // Open enough datagrams for good percentiles without spending a core on it.
                let sample_every = if spec.record {
                    (u64::from(built) / 50_000).clamp(1, 64) as u32
                } else {
                    u32::MAX
                };
                let send = match host {
                    HostSide::Vxlan => &self.host,
                    HostSide::Plain => &self.plain,
                };
                let measure = Measure {
                    tag,
                    record: spec.record,
                    sample_every,
                    sas: Arc::new(inbound_by_spi(sas)),
                    esp_sizes,
                };
                (&self.rx_peer, send, measure)
            }
        }
    }

    /// The gateway's CPU time and counters now.
    fn snapshot(&self, g: &dyn UnderTest) -> Result<Snapshot> {
        // The status query first: the thread answering it is then (nearly) done when the
        // CPU times are read.
        let status = g.status();
        let counters = match &status {
            Some(s) => Some(GatewayCounters::from_status(s)),
            None => g.counters(),
        };
        Ok(Snapshot {
            status,
            counters,
            udp_drops: cpu::netns_udp_drops(g.pid()),
            path_drops: cpu::path_drops(g.pid()) + self.loadgen_link_drops(),
            cpu: cpu::thread_cpu_ns(g.pid())
                .map_err(|e| BenchError::io(format!("read the CPU time of pid {}", g.pid()), e))?,
        })
    }

    /// Interface drops in the load generator's namespaces.
    fn loadgen_link_drops(&self) -> u64 {
        self.namespaces.iter().map(cpu::netns_link_drops).sum()
    }

    /// Builds the pool for a run; returns the packets built.
    fn build(&mut self, flow: &Flow<'_>, spec: &RunSpec, tag: u32) -> Result<u32> {
        let size = spec.size;
        let max_inner = usize::from(size.max());
        let train = spec.train;
        match flow {
            Flow::Inbound { sas, .. } => {
                let tunnels = sas.len().max(1) as u64;
                let first = sas.first().ok_or_else(|| BenchError::NoTraffic {
                    case: "inbound".to_owned(),
                    detail: "no tunnel".to_owned(),
                })?;
                let max_len = first.outbound.sealed_len(max_inner);
                let dst = BenchNet::gw_natt();
                self.pool.build(spec.packets, max_len, train, |i, slot| {
                    let t = &sas[(u64::from(i) % tunnels) as usize];
                    let seq = t.next_seq.load(Ordering::Relaxed) + u64::from(i) / tunnels;
                    let s = usize::from(size.size_of(u64::from(i)));
                    let hl = t.outbound.header_len();
                    let inner = InnerSpec {
                        src: t.addr,
                        dst: net::VM,
                        src_port: 1024 + (u64::from(i) / tunnels % FLOWS) as u16,
                        dst_port: net::INNER_PORT,
                    };
                    packet::write_inner(&mut slot[hl..], &inner, s, tag, i).ok_or_else(|| {
                        BenchError::NoTraffic {
                            case: "inbound".to_owned(),
                            detail: format!("cannot build a {s}-byte packet"),
                        }
                    })?;
                    let sealed = t.outbound.seal_with_seq(slot, s, seq).map_err(|source| {
                        BenchError::Esp {
                            spi: t.outbound.spi().0,
                            source,
                        }
                    })?;
                    Ok(Built {
                        len: sealed.len,
                        dst,
                    })
                })
            }
            Flow::Planned { sas, plan } => {
                let first = sas.first().ok_or_else(|| BenchError::NoTraffic {
                    case: "planned".to_owned(),
                    detail: "no tunnel".to_owned(),
                })?;
                let max_len = first.outbound.sealed_len(plan.max_len());
                let dst = BenchNet::gw_natt();
                let mut used = vec![0u64; sas.len()];
                let planned = &mut self.planned;
                planned.clear();
                self.pool.build(spec.packets, max_len, train, |i, slot| {
                    let (k, s) = plan.slot(i);
                    let bad = |detail: String| BenchError::NoTraffic {
                        case: "planned".to_owned(),
                        detail,
                    };
                    let t = sas
                        .get(k)
                        .ok_or_else(|| bad(format!("packet {i}: no tunnel {k}")))?;
                    let seq = t.next_seq.load(Ordering::Relaxed) + used[k];
                    used[k] += 1;
                    planned.push(k as u32);
                    let hl = t.outbound.header_len();
                    slot.get_mut(hl..hl + s)
                        .and_then(|buf| plan.write(i, tag, buf))
                        .ok_or_else(|| bad(format!("cannot build a {s}-byte packet")))?;
                    let sealed = t.outbound.seal_with_seq(slot, s, seq).map_err(|source| {
                        BenchError::Esp {
                            spi: t.outbound.spi().0,
                            source,
                        }
                    })?;
                    Ok(Built {
                        len: sealed.len,
                        dst,
                    })
                })
            }
            Flow::Outbound {
                sas,
                host: HostSide::Vxlan,
                gw_mac,
            } => {
                let tunnels = sas.len().max(1) as u64;
                let dst = BenchNet::gw_vtep();
                let gw_mac = *gw_mac;
                self.pool.build(
                    spec.packets,
                    VXLAN_FRAME_HEADER + max_inner,
                    train,
                    |i, slot| {
                        let t = (u64::from(i) % tunnels) as u32;
                        let s = usize::from(size.size_of(u64::from(i)));
                        let h = packet::write_vxlan_header(
                            slot,
                            net::vni(),
                            gw_mac,
                            net::VM_MAC,
                            EtherType::IPV4,
                        )
                        .ok_or_else(|| too_small(s))?;
                        let inner = InnerSpec {
                            src: net::VM,
                            dst: net::tunnel_addr(t),
                            src_port: 1024 + (u64::from(i) / tunnels % FLOWS) as u16,
                            dst_port: net::INNER_PORT,
                        };
                        packet::write_inner(&mut slot[h..], &inner, s, tag, i)
                            .ok_or_else(|| too_small(s))?;
                        Ok(Built { len: h + s, dst })
                    },
                )
            }
            Flow::Outbound {
                sas,
                host: HostSide::Plain,
                ..
            } => {
                // One destination per GSO train: packets go to one tunnel a train at a time.
                let tunnels = sas.len().max(1) as u64;
                let chunk = train.max(1) as u64;
                self.pool.build(spec.packets, max_inner, train, |i, slot| {
                    let t = (u64::from(i) / chunk % tunnels) as u32;
                    let s = usize::from(size.size_of(u64::from(i)));
                    let payload = s - INNER_HEADERS;
                    let body = slot.get_mut(..payload).ok_or_else(|| too_small(s))?;
                    body.fill(0);
                    body[..4].copy_from_slice(&tag.to_be_bytes());
                    body[4..8].copy_from_slice(&i.to_be_bytes());
                    Ok(Built {
                        len: payload,
                        dst: SocketAddr::from((net::tunnel_addr(t), net::INNER_PORT)),
                    })
                })
            }
            Flow::Baseline => {
                let dst = SocketAddr::from((net::HOST_VTEP, net::VXLAN_PORT));
                self.pool.build(
                    spec.packets,
                    VXLAN_FRAME_HEADER + max_inner,
                    train,
                    |i, slot| {
                        let s = usize::from(size.size_of(u64::from(i)));
                        let h = packet::write_vxlan_header(
                            slot,
                            net::vni(),
                            net::VM_MAC,
                            net::VM_MAC,
                            EtherType::IPV4,
                        )
                        .ok_or_else(|| too_small(s))?;
                        let inner = InnerSpec {
                            src: net::PEER,
                            dst: net::VM,
                            src_port: 1024 + (u64::from(i) % FLOWS) as u16,
                            dst_port: net::INNER_PORT,
                        };
                        packet::write_inner(&mut slot[h..], &inner, s, tag, i)
                            .ok_or_else(|| too_small(s))?;
                        Ok(Built { len: h + s, dst })
                    },
                )
            }
        }
    }
}

fn too_small(s: usize) -> BenchError {
    BenchError::NoTraffic {
        case: "pool".to_owned(),
        detail: format!("cannot build a {s}-byte packet"),
    }
}

/// Sends the pool's trains at `rate` packets per second: every wake-up sends what is due by
/// then (up to `per_call` trains per system call) and records the send time of each packet;
/// between wake-ups the thread sleeps.
pub(crate) fn send_paced(
    sock: &Socket,
    scratch: &mut SendScratch,
    pool: &Pool,
    send_ns: &mut [u64],
    rate: f64,
    per_call: usize,
    interrupted: &AtomicBool,
) -> u64 {
    let per_call = per_call.max(1);
    let trains = pool.trains();
    let t0 = Instant::now();
    let mut k = 0usize;
    let mut queued = 0u64;
    let mut sent = 0u64;
    while k < trains.len() {
        if interrupted.load(Ordering::Relaxed) {
            break;
        }
        let due = if rate.is_finite() && rate > 0.0 {
            (t0.elapsed().as_secs_f64() * rate) as u64 + 1
        } else {
            u64::MAX
        };
        if queued >= due {
            let next = t0 + Duration::from_secs_f64(queued as f64 / rate);
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
            continue;
        }
        let mut j = k;
        let mut pk = queued;
        while j < trains.len() && j - k < per_call && pk < due {
            pk += trains[j].count as u64;
            j += 1;
        }
        let now_ns = realtime_ns();
        for t in &trains[k..j] {
            let first = t.first as usize;
            for slot in send_ns.iter_mut().skip(first).take(t.count) {
                *slot = now_ns;
            }
        }
        sent += send_trains(sock, scratch, pool, &trains[k..j]);
        queued = pk;
        k = j;
    }
    sent
}

/// Waits until the receiver has counted `target` packets or nothing new arrived for [`QUIET`].
pub(crate) fn drain(rx: &RxHandle, target: u64) {
    let start = Instant::now();
    let mut last = rx.progress();
    let mut changed = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(5));
        let p = rx.progress();
        if p >= target || start.elapsed() > DRAIN_MAX {
            return;
        }
        if p != last {
            last = p;
            changed = Instant::now();
        } else if changed.elapsed() > QUIET {
            return;
        }
    }
}

/// Asks the gateway for its MAC in the VNet (an ARP request over VXLAN from `vm` for the
/// VNet's gateway address, sent from `host` every 200 ms) until the host's receiver thread
/// records the reply in `gw_mac`, or `timeout` passes.
pub(crate) fn ask_gateway_mac(
    host: &Socket,
    gw_mac: &GatewayMac,
    vm: std::net::Ipv4Addr,
    timeout: Duration,
) -> Result<EthernetAddress> {
    if let Ok(mut m) = gw_mac.lock() {
        *m = None;
    }
    let req = packet::arp_request(net::VM_MAC, vm, net::VNET_GW);
    let mut buf = [0u8; 128];
    let n = packet::write_arp_frame(
        &mut buf,
        net::vni(),
        EthernetAddress::BROADCAST,
        net::VM_MAC,
        &req,
    )
    .ok_or_else(|| BenchError::Gateway {
        gateway: "protego",
        reason: "cannot build an ARP request".to_owned(),
        log_tail: String::new(),
    })?;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        host.send_to(&buf[..n], BenchNet::gw_vtep())
            .map_err(|e| BenchError::io("send an ARP request to the gateway", e))?;
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(10));
            if let Some(mac) = gw_mac.lock().ok().and_then(|m| *m) {
                return Ok(mac);
            }
        }
    }
    Err(BenchError::Gateway {
        gateway: "protego",
        reason: format!(
            "no ARP reply for the VNet gateway {} within {timeout:?}",
            net::VNET_GW
        ),
        log_tail: String::new(),
    })
}
