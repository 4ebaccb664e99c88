//! `protego steer`: a steer node. It runs the forwarder of the public VIPs
//! (`steernode::SteerNode`) and applies the control node's directives to its tables: the
//! whole tables after registering, then SPI, selector, node, rate limit and customer port
//! tag updates. Its Hello announces its customer-facing ports (`[steer] ports`, numbered from
//! 1 in the file's order) with their MACs. It passes its failure detector's verdicts up as
//! events and reports per-tunnel traffic and rate-limit drops, and per-attachment frames and
//! drops, every interval.
//!
//! Forwarding never waits for the session: when it breaks the steer node keeps steering with
//! the tables it has, and gets whole tables again when it reconnects.

use crate::agent::{Agent, Applier};
use crate::data_node::{boot_id, load_node_tls, op_name, NodeError};
use crate::link::Answer;
use crate::node_config::NodeConfig;
use rpc::certs::NodeRole;
use rpc::pb;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use steer::{AttachEntry, HealthConfig, NodeId, PortKey, SpiEntry};
use steernode::{
    PortSpec, SteerConfig, SteerEvent, SteerNode, SteerStats, SteerTables, VniSteering,
};
use tracing::{info, warn};
use wire::vxlan::Vni;
use wire::EspSpi;

fn parse_addr(field: &str, text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{field}: invalid address {text:?}"))
}

fn vni(field: &str, value: u32) -> Result<Vni, String> {
    Vni::new(value).ok_or_else(|| format!("{field}: VNI {value} is above 2^24 - 1"))
}

/// Data nodes and their Geneve addresses.
type DataNodes = Vec<(NodeId, SocketAddr)>;

/// The steer node's directive handler.
struct SteerApplier {
    name: String,
    node: Arc<SteerNode>,
    boot_id: u64,
    /// What the last report counted, and when.
    last: Mutex<LastReport>,
    /// This node's shares of the tunnels' limits as control last sent them (with their
    /// fallbacks, applied once control counts the node as lost).
    shares: Mutex<BTreeMap<steer::TunnelId, steer::Share>>,
}

impl SteerApplier {
    fn nodes(n: &pb::SteerNodes) -> Result<(Option<SocketAddr>, DataNodes), String> {
        let control = if n.control.is_empty() {
            None
        } else {
            Some(parse_addr("set_nodes.control", &n.control)?)
        };
        let mut data = Vec::new();
        for (i, d) in n.data.iter().enumerate() {
            data.push((
                NodeId(d.node),
                parse_addr(&format!("set_nodes.data[{i}].geneve"), &d.geneve)?,
            ));
        }
        Ok((control, data))
    }

    fn vni_steering(v: &pb::VniSelectors) -> Result<(Vni, VniSteering), String> {
        let vni = vni("set_selectors.vni", v.vni)?;
        let selectors = v
            .selectors
            .iter()
            .enumerate()
            .map(|(i, s)| {
                rpc::convert::selector_from_pb(s)
                    .map_err(|e| format!("set_selectors.selectors[{i}]: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let gateway_ips = v
            .gateway_ips
            .iter()
            .map(|ip| {
                ip.parse::<IpAddr>()
                    .map_err(|_| format!("set_selectors.gateway_ips: invalid address {ip:?}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((
            vni,
            VniSteering {
                selectors,
                neighbour_nodes: v.neighbour_nodes.iter().map(|n| NodeId(*n)).collect(),
                gateway_ips,
            },
        ))
    }

    /// A port's tag pair and its serving node, checked (`field` names it in errors): valid
    /// VLAN ids on one of this node's ports.
    fn port_tag(&self, field: &str, t: &pb::PortTag) -> Result<(PortKey, AttachEntry), String> {
        let (key, entry) =
            rpc::convert::port_tag_from_pb(t).map_err(|e| format!("{}", e.context(field)))?;
        self.own_port(field, key.port)?;
        Ok((key, entry))
    }

    /// Fails unless `port` is one of this node's ports.
    fn own_port(&self, field: &str, port: steer::PortId) -> Result<(), String> {
        if self.node.ports().iter().any(|p| p.id == port) {
            Ok(())
        } else {
            Err(format!(
                "{field}.port: {port} is not one of this node's ports ([steer] ports)"
            ))
        }
    }

    fn spi(s: &pb::SteerSpi) -> (EspSpi, SpiEntry) {
        (
            EspSpi(s.spi),
            SpiEntry {
                node: NodeId(s.node),
                tunnel: steer::TunnelId(s.tunnel),
            },
        )
    }

    /// This node's share of a tunnel's limit (`None`: not limited), checked.
    fn share(
        field: &str,
        r: &pb::RateLimit,
    ) -> Result<(steer::TunnelId, Option<steer::Share>), String> {
        rpc::convert::share_from_pb(r).map_err(|e| format!("{field}.{e}"))
    }

    /// [`Self::share`] of every limit of a list, each error naming `field[i]`.
    fn shares(
        field: &str,
        limits: &[pb::RateLimit],
    ) -> Result<Vec<(steer::TunnelId, Option<steer::Share>)>, String> {
        limits
            .iter()
            .enumerate()
            .map(|(i, l)| Self::share(&format!("{field}[{i}]"), l))
            .collect()
    }

    /// Takes new shares: the forwarder enforces them, and they are remembered with their
    /// fallbacks.
    fn set_shares(&self, shares: Vec<(steer::TunnelId, Option<steer::Share>)>) {
        let mut held = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        for (t, s) in shares {
            self.node.set_rate_limit(t, s.map(|s| s.limit));
            match s {
                Some(s) => held.insert(t, s),
                None => held.remove(&t),
            };
        }
    }
}

/// What a steer node that lost control enforces: each share lowered to its fallback (shares
/// without one stay).
fn fallen_back(
    shares: &BTreeMap<steer::TunnelId, steer::Share>,
) -> Vec<(steer::TunnelId, steer::TunnelLimit)> {
    shares
        .iter()
        .filter(|(_, s)| s.fallen_back() != s.limit)
        .map(|(&t, s)| (t, s.fallen_back()))
        .collect()
}

impl Applier for SteerApplier {
    fn hello(&self) -> pb::Hello {
        pb::Hello {
            name: self.name.clone(),
            role: pb::Role::Steer as i32,
            geneve: self.node.local_addrs().geneve.to_string(),
            workers: 2,
            boot_id: self.boot_id,
            installed_spis: Vec::new(),
            installed: Vec::new(),
            ce_macs: Vec::new(),
            ports: self
                .node
                .ports()
                .into_iter()
                .map(|p| {
                    rpc::convert::steer_port_to_pb(&rpc::convert::SteerPort {
                        id: p.id,
                        interface: p.interface,
                        mac: p.mac,
                    })
                })
                .collect(),
            ..pb::Hello::default()
        }
    }

    fn welcomed(&self, _welcome: &pb::Welcome) {}

    fn apply(&self, op: pb::directive::Op) -> Result<Answer, String> {
        self.apply_op(op).map(|()| Answer::Applied)
    }

    fn report(&self) -> pb::Report {
        let stats = self.node.stats();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // The first report covers everything since the node started; never 0 ms (which
        // marks a steer node that measures no interval).
        let interval = last
            .at
            .replace(now)
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
            .max(Duration::from_millis(1));
        build_report(&stats, &mut last.tunnels, interval)
    }

    /// Control counts this node as lost (it may give its shares to the other steer nodes):
    /// each tunnel drops to its fallback, until new tables come.
    fn control_lost(&self) {
        let shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let lowered = fallen_back(&shares);
        if !lowered.is_empty() {
            warn!(
                tunnels = lowered.len(),
                "no session with control: rate limits drop to their fallback shares"
            );
        }
        for (t, l) in lowered {
            self.node.set_rate_limit(t, Some(l));
        }
    }
}

impl SteerApplier {
    /// Applies one directive; `Err` names why nothing changed.
    fn apply_op(&self, op: pb::directive::Op) -> Result<(), String> {
        use pb::directive::Op;
        let e = |e: steernode::SteerNodeError| e.to_string();
        match op {
            Op::SteerTables(t) => {
                let (control, data_nodes) = match &t.nodes {
                    Some(n) => Self::nodes(n)?,
                    None => (None, Vec::new()),
                };
                let shares = Self::shares("steer_tables.limits", &t.limits)?;
                let attachments = t
                    .attachments
                    .iter()
                    .enumerate()
                    .map(|(i, a)| self.port_tag(&format!("steer_tables.attachments[{i}]"), a))
                    .collect::<Result<Vec<_>, _>>()?;
                let tables = SteerTables {
                    control,
                    data_nodes,
                    spis: t.spis.iter().map(Self::spi).collect(),
                    vnis: t
                        .vnis
                        .iter()
                        .map(Self::vni_steering)
                        .collect::<Result<_, _>>()?,
                    rate_limits: shares
                        .iter()
                        .filter_map(|(t, s)| Some((*t, s.as_ref()?.limit)))
                        .collect(),
                    attachments,
                };
                let counts = (
                    tables.spis.len(),
                    tables.vnis.len(),
                    tables.data_nodes.len(),
                    tables.attachments.len(),
                );
                self.node.replace_all(tables).map_err(e)?;
                *self.shares.lock().unwrap_or_else(|e| e.into_inner()) = shares
                    .into_iter()
                    .filter_map(|(t, s)| Some((t, s?)))
                    .collect();
                info!(
                    spis = counts.0,
                    vnis = counts.1,
                    data_nodes = counts.2,
                    attachments = counts.3,
                    "steering tables replaced"
                );
                Ok(())
            }
            Op::SetSpi(s) => {
                let (spi, entry) = Self::spi(&s);
                self.node.set_spi(spi, entry).map_err(e)
            }
            Op::RemoveSpi(r) => {
                self.node.remove_spi(EspSpi(r.spi));
                Ok(())
            }
            Op::SetSelectors(v) => {
                let (vni, s) = Self::vni_steering(&v)?;
                self.node
                    .set_selectors(vni, s.selectors, s.neighbour_nodes)
                    .map_err(e)?;
                self.node.set_gateway_ips(vni, s.gateway_ips).map_err(e)
            }
            Op::SetNodes(n) => {
                let (control, data) = Self::nodes(&n)?;
                self.node.set_control(control).map_err(e)?;
                self.node.set_data_nodes(data).map_err(e)
            }
            Op::SetRateLimit(r) => {
                let share = Self::share("set_rate_limit", &r)?;
                self.set_shares(vec![share]);
                Ok(())
            }
            Op::SetRateLimits(r) => {
                self.set_shares(Self::shares("set_rate_limits.limits", &r.limits)?);
                Ok(())
            }
            Op::SetPortTag(t) => {
                let (key, entry) = self.port_tag("set_port_tag", &t)?;
                self.node.set_port_tags(key, entry).map_err(e)
            }
            Op::RemovePortTag(t) => {
                let key = rpc::convert::remove_port_tag_from_pb(&t)
                    .map_err(|e| format!("{}", e.context("remove_port_tag")))?;
                self.own_port("remove_port_tag", key.port)?;
                self.node.remove_port_tags(key);
                Ok(())
            }
            other => Err(format!("{} is not a steer node directive", op_name(&other))),
        }
    }
}

/// A tunnel's cumulative counters at the last report.
#[derive(Debug, Clone, Copy, Default)]
struct Counted {
    bytes_in: u64,
    bytes_out: u64,
    dropped_packets: u64,
    dropped_bytes_in: u64,
    dropped_bytes_out: u64,
}

/// What the last report counted.
#[derive(Debug, Default)]
struct LastReport {
    /// When it was built.
    at: Option<Instant>,
    /// Per tunnel.
    tunnels: BTreeMap<u32, Counted>,
}

/// Per-tunnel traffic and rate-limit drops during `interval` (since the last report), and the
/// drop and per-attachment counters (cumulative).
fn build_report(
    stats: &SteerStats,
    last: &mut BTreeMap<u32, Counted>,
    interval: Duration,
) -> pb::Report {
    let mut tunnels = Vec::new();
    for (t, s) in &stats.tunnels {
        let now = Counted {
            bytes_in: s.inbound.admitted_bytes,
            bytes_out: s.outbound.admitted_bytes,
            dropped_packets: s
                .inbound
                .dropped_packets
                .wrapping_add(s.outbound.dropped_packets),
            dropped_bytes_in: s.inbound.dropped_bytes,
            dropped_bytes_out: s.outbound.dropped_bytes,
        };
        let before = last.insert(t.0, now).unwrap_or_default();
        tunnels.push(pb::TunnelUsage {
            tunnel: t.0,
            cpu_ns: 0,
            bytes_in: now.bytes_in.saturating_sub(before.bytes_in),
            packets_in: 0,
            bytes_out: now.bytes_out.saturating_sub(before.bytes_out),
            packets_out: 0,
            rate_dropped: now.dropped_packets.saturating_sub(before.dropped_packets),
            rate_dropped_bytes_in: now.dropped_bytes_in.saturating_sub(before.dropped_bytes_in),
            rate_dropped_bytes_out: now
                .dropped_bytes_out
                .saturating_sub(before.dropped_bytes_out),
        });
    }
    // Tunnels no longer counted are forgotten.
    last.retain(|t, _| stats.tunnels.contains_key(&steer::TunnelId(*t)));
    let attachments = stats
        .attachments
        .iter()
        .map(|(key, a)| pb::AttachmentUsage {
            attachment: a.attachment.0,
            port: key.port.0,
            s_tag: u32::from(key.s_tag),
            c_tag: u32::from(key.c_tag),
            from_ce_frames: a.from_ce_frames,
            from_ce_bytes: a.from_ce_bytes,
            to_ce_frames: a.to_ce_frames,
            to_ce_bytes: a.to_ce_bytes,
            dropped: a.dropped,
        })
        .collect();
    pb::Report {
        interval_ms: u32::try_from(interval.as_millis()).unwrap_or(u32::MAX),
        utilization: 0.0,
        tunnels,
        attachments,
        drops: stats
            .dropped
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| (r.name().to_owned(), n))
            .collect(),
        ..pb::Report::default()
    }
}

/// A running steer node process.
pub struct SteerNodeProcess {
    node: Arc<SteerNode>,
    agent: Agent,
    /// `[metrics] listen`.
    metrics: Option<metrics::MetricsServer>,
}

impl SteerNodeProcess {
    /// Binds the VIPs and the underlay sockets and opens the session with control.
    pub fn start(config: &NodeConfig) -> Result<Self, NodeError> {
        let s = config
            .steer
            .clone()
            .ok_or_else(|| NodeError::MissingSection {
                path: config.path.clone(),
                role: "steer",
            })?;
        let tls = Arc::new(load_node_tls(config, NodeRole::Steer)?);
        let mut sc = SteerConfig::new(s.vips.clone(), s.vxlan, s.geneve);
        sc.ike_port = s.ike_port;
        sc.natt_port = s.natt_port;
        sc.health = HealthConfig {
            sample: s.probe_sample,
            min_interval: s.probe_interval,
            idle_interval: s.probe_interval,
            timeout: s.probe_timeout,
            misses: s.probe_misses,
            ..HealthConfig::default()
        };
        sc.ports = s
            .ports
            .iter()
            .zip(1u32..)
            .map(|(interface, id)| PortSpec {
                id: steer::PortId(id),
                interface: interface.clone(),
            })
            .collect();
        let node = SteerNode::start(sc).map_err(|e| NodeError::Steer(e.to_string()))?;
        let started = Instant::now();
        let source = || -> Arc<dyn metrics::Source> {
            Arc::new(crate::metrics::SteerNodeMetrics {
                node: Arc::clone(&node),
                started,
            })
        };
        let metrics = crate::metrics::serve(config, source).inspect_err(|_| node.shutdown())?;
        let applier = Arc::new(SteerApplier {
            name: config.node.name.clone(),
            node: Arc::clone(&node),
            boot_id: boot_id(),
            last: Mutex::new(LastReport {
                at: Some(Instant::now()),
                tunnels: BTreeMap::new(),
            }),
            shares: Mutex::new(BTreeMap::new()),
        });
        let agent = Agent::start(
            "steer",
            config.node.control.clone(),
            tls,
            applier,
            node.events(),
            |e| {
                use pb::node_event::Event;
                Some(match e {
                    SteerEvent::NodeDead(n) => Event::NodeDead(n.0),
                    SteerEvent::NodeAlive(n) => Event::NodeAlive(n.0),
                })
            },
        )
        .map_err(NodeError::Start)?;
        info!(node = %config.node.name, vips = ?s.vips, vxlan = %s.vxlan, geneve = %s.geneve, ports = ?s.ports, "steer node started");
        Ok(Self {
            node,
            agent,
            metrics,
        })
    }

    /// The forwarder's counters.
    pub fn stats(&self) -> SteerStats {
        self.node.stats()
    }

    /// Stops the session and the forwarder.
    pub fn shutdown(mut self) {
        drop(self.metrics.take());
        self.agent.shutdown();
        self.node.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(args: &[&str]) {
        let st = std::process::Command::new("ip")
            .args(args)
            .status()
            .expect("run ip");
        assert!(st.success(), "ip {args:?}");
    }

    /// A steer node with one customer port (a veth end in a namespace of the test's own)
    /// announces it in its Hello, takes port tags of it and refuses bad ones, naming the field,
    /// and forwards a customer's frame by the tags its whole tables gave it.
    #[test]
    fn port_tags_are_applied_and_bad_fields_named() {
        if !testreq::program("port_tags_are_applied_and_bad_fields_named", "ip") {
            return;
        }
        // Namespaces are per thread: everything runs in a thread that made its own.
        std::thread::spawn(|| {
            // SAFETY: plain system call; affects this thread (and the threads it starts) only.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
            ip(&["link", "set", "lo", "up"]);
            ip(&[
                "link", "add", "port0", "type", "veth", "peer", "name", "ce0",
            ]);
            ip(&["link", "set", "port0", "up"]);
            ip(&["link", "set", "ce0", "up"]);
            port_tags_in_namespace();
        })
        .join()
        .expect("in its own namespace");
    }

    fn port_tags_in_namespace() {
        let mut c = SteerConfig::new(
            vec!["127.0.0.10".parse().unwrap()],
            "127.0.0.20:0".parse().unwrap(),
            "127.0.0.20:0".parse().unwrap(),
        );
        (c.ike_port, c.natt_port) = (0, 0);
        // The test's data node answers no probes: never declared dead.
        c.health = HealthConfig {
            timeout: Duration::from_secs(600),
            idle_interval: Duration::from_secs(600),
            ..HealthConfig::default()
        };
        c.ports = vec![PortSpec {
            id: steer::PortId(1),
            interface: "port0".into(),
        }];
        let node = SteerNode::start(c).expect("steer node");
        let a = SteerApplier {
            name: "steer1".into(),
            node: Arc::clone(&node),
            boot_id: 1,
            last: Mutex::new(LastReport::default()),
            shares: Mutex::new(BTreeMap::new()),
        };
        let hello = a.hello();
        assert_eq!(hello.ports.len(), 1);
        assert_eq!(
            (hello.ports[0].id, hello.ports[0].interface.as_str()),
            (1, "port0")
        );
        assert_eq!(hello.ports[0].mac.len(), 6);

        use pb::directive::Op;
        let tag = |port, s_tag, c_tag| pb::PortTag {
            port,
            s_tag,
            c_tag,
            node: 1,
            attachment: 1,
            vni: None,
        };
        a.apply(Op::SetPortTag(tag(1, 100, 20)))
            .expect("a tag pair of port 1");
        a.apply(Op::SetPortTag(tag(1, 0, 30)))
            .expect("a single tag");
        let fails = |op: Op, field: &str| {
            let e = a.apply(op).expect_err(field);
            assert!(e.starts_with(field), "{e} does not name {field}");
        };
        fails(Op::SetPortTag(tag(2, 100, 20)), "set_port_tag.port");
        fails(Op::SetPortTag(tag(1, 100, 4095)), "set_port_tag.c_tag");
        fails(Op::SetPortTag(tag(1, 5000, 20)), "set_port_tag.s_tag");
        fails(
            Op::RemovePortTag(pb::RemovePortTag {
                port: 1,
                s_tag: 0,
                c_tag: 0,
            }),
            "remove_port_tag.c_tag",
        );
        a.apply(Op::RemovePortTag(pb::RemovePortTag {
            port: 1,
            s_tag: 0,
            c_tag: 30,
        }))
        .expect("removed");
        let tables = |attachments| {
            Op::SteerTables(pb::SteerTables {
                attachments,
                ..pb::SteerTables::default()
            })
        };
        a.apply(tables(vec![tag(1, 100, 20), tag(1, 0, 7)]))
            .expect("whole tables with attachments");
        // With its data node: a customer's frame of the pair reaches it, with the port option.
        let data = std::net::UdpSocket::bind("127.0.1.1:0").expect("data node socket");
        data.set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        a.apply(Op::SteerTables(pb::SteerTables {
            nodes: Some(pb::SteerNodes {
                data: vec![pb::DataNode {
                    node: 1,
                    name: "data1".into(),
                    geneve: data.local_addr().unwrap().to_string(),
                }],
                control: String::new(),
            }),
            attachments: vec![tag(1, 100, 20)],
            ..pb::SteerTables::default()
        }))
        .expect("tables with a data node");
        let mut frame = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
        frame.extend_from_slice(&[0x88, 0xa8, 0, 100, 0x81, 0x00, 0, 20, 0x08, 0x00]);
        frame.extend_from_slice(&[0xa1; 60]);
        let ce = netio::packet::PacketSocket::open("ce0").expect("the customer's side");
        let mut scratch = netio::packet::PacketScratch::default();
        ce.send_batch(std::iter::once(&frame[..]), &mut scratch);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = vec![0u8; 2048];
        let got = loop {
            assert!(Instant::now() < deadline, "no frame at the data node");
            let Ok((n, _)) = data.recv_from(&mut buf) else {
                continue;
            };
            let f = wire::relay::parse_frame(&buf[..n]).expect("Geneve");
            if let Some(eth) = f.ethernet {
                assert_eq!(f.port, Some(1));
                break buf[eth].to_vec();
            }
        };
        assert_eq!(got, frame);
        // The next report counts it for the attachment of its tag pair (wait for the port
        // thread's fold after the send).
        let counted = loop {
            let r = a.report();
            if let Some(u) = r.attachments.first().filter(|u| u.from_ce_frames > 0) {
                break *u;
            }
            assert!(Instant::now() < deadline, "the frame not counted: {r:?}");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(
            counted,
            pb::AttachmentUsage {
                attachment: 1,
                port: 1,
                s_tag: 100,
                c_tag: 20,
                from_ce_frames: 1,
                from_ce_bytes: frame.len() as u64,
                ..pb::AttachmentUsage::default()
            }
        );
        fails(
            tables(vec![tag(1, 100, 20), tag(3, 0, 7)]),
            "steer_tables.attachments[1].port",
        );
        node.shutdown();
    }

    #[test]
    fn a_steer_node_that_lost_control_drops_each_share_to_its_fallback() {
        const M: u64 = 1_000_000;
        let limit = |bps| steer::RateLimit::new(bps, steer::burst_bytes(bps));
        let share = |inbound, outbound, fallback| steer::Share {
            limit: steer::TunnelLimit {
                inbound: limit(inbound),
                outbound: limit(outbound),
            },
            fallback_bits_per_second: fallback,
        };
        let shares: BTreeMap<steer::TunnelId, steer::Share> = [
            (steer::TunnelId(1), share(95 * M, 3 * M, 5 * M)),
            // Already at or below its fallback: unchanged, not listed.
            (steer::TunnelId(2), share(4 * M, 4 * M, 5 * M)),
            // No fallback (an old control node): kept.
            (steer::TunnelId(3), share(80 * M, 80 * M, 0)),
        ]
        .into();
        assert_eq!(
            fallen_back(&shares),
            vec![(
                steer::TunnelId(1),
                steer::TunnelLimit {
                    inbound: limit(5 * M),
                    outbound: limit(3 * M),
                }
            )]
        );
    }

    /// The report's usage is made of the forwarder's counters: a tunnel's outbound admitted
    /// and dropped bytes (VXLAN from hosts and CEs' packets into the tunnel alike), as deltas
    /// since the last report, from which control divides the tunnel's limit; attachments'
    /// counters as they are (cumulative).
    #[test]
    fn a_report_carries_the_interval_s_outbound_usage_and_the_attachments() {
        let mut stats = SteerStats::default();
        let tunnel = steer::TunnelId(7);
        let outbound = |admitted_bytes, dropped_bytes| steer::TunnelCounters {
            admitted_packets: 1,
            admitted_bytes,
            dropped_packets: 1,
            dropped_bytes,
        };
        stats.tunnels.insert(
            tunnel,
            steernode::TunnelStats {
                outbound: outbound(1000, 3000),
                ..Default::default()
            },
        );
        let key = PortKey::new(steer::PortId(1), 100, 20).unwrap();
        stats.attachments.insert(
            key,
            steernode::AttachmentStats {
                attachment: steer::AttachmentId(4),
                from_ce_frames: 5,
                from_ce_bytes: 1000,
                to_ce_frames: 2,
                to_ce_bytes: 400,
                dropped: 15,
            },
        );
        let mut last = BTreeMap::new();
        let r = build_report(&stats, &mut last, Duration::from_secs(1));
        let t = &r.tunnels[0];
        assert_eq!(
            (t.tunnel, t.bytes_out, t.rate_dropped_bytes_out, t.bytes_in),
            (7, 1000, 3000, 0)
        );
        assert_eq!(
            r.attachments,
            [pb::AttachmentUsage {
                attachment: 4,
                port: 1,
                s_tag: 100,
                c_tag: 20,
                from_ce_frames: 5,
                from_ce_bytes: 1000,
                to_ce_frames: 2,
                to_ce_bytes: 400,
                dropped: 15,
            }]
        );
        // The next interval: only what was added since.
        stats.tunnels.get_mut(&tunnel).unwrap().outbound = outbound(1600, 3000);
        let r = build_report(&stats, &mut last, Duration::from_secs(1));
        assert_eq!(
            (r.tunnels[0].bytes_out, r.tunnels[0].rate_dropped_bytes_out),
            (600, 0)
        );
        assert_eq!(r.attachments[0].from_ce_frames, 5, "cumulative");
    }
}
