//! `protego steer`: a steer node. It runs the forwarder of the public VIPs
//! (`steernode::SteerNode`) and applies the control node's directives to its tables: the
//! whole tables after registering, then SPI, selector, node and rate limit updates. It
//! passes its failure detector's verdicts up as events and reports per-tunnel traffic and
//! rate-limit drops every interval.
//!
//! Forwarding never waits for the session: when it breaks the steer node keeps steering with
//! the tables it has, and gets whole tables again when it reconnects.

use crate::agent::{Agent, Applier};
use crate::data_node::{boot_id, load_node_tls, op_name, NodeError};
use crate::node_config::NodeConfig;
use control::certs::NodeRole;
use rpc::pb;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use steer::{HealthConfig, NodeId, SpiEntry};
use steernode::{SteerConfig, SteerEvent, SteerNode, SteerStats, SteerTables, VniSteering};
use tracing::info;
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
    /// Per-tunnel cumulative counters at the last report.
    last: Mutex<BTreeMap<u32, (u64, u64, u64)>>,
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

    fn spi(s: &pb::SteerSpi) -> (EspSpi, SpiEntry) {
        (
            EspSpi(s.spi),
            SpiEntry {
                node: NodeId(s.node),
                tunnel: steer::TunnelId(s.tunnel),
            },
        )
    }

    fn limit(r: &pb::RateLimit) -> (steer::TunnelId, Option<steer::RateLimit>) {
        let limit = (r.bits_per_second > 0)
            .then(|| steer::RateLimit::new(r.bits_per_second, r.burst_bytes.max(1)));
        (steer::TunnelId(r.tunnel), limit)
    }
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
        }
    }

    fn welcomed(&self, _welcome: &pb::Welcome) {}

    fn apply(&self, op: pb::directive::Op) -> Result<(), String> {
        use pb::directive::Op;
        let e = |e: steernode::SteerNodeError| e.to_string();
        match op {
            Op::SteerTables(t) => {
                let (control, data_nodes) = match &t.nodes {
                    Some(n) => Self::nodes(n)?,
                    None => (None, Vec::new()),
                };
                let tables = SteerTables {
                    control,
                    data_nodes,
                    spis: t.spis.iter().map(Self::spi).collect(),
                    vnis: t
                        .vnis
                        .iter()
                        .map(Self::vni_steering)
                        .collect::<Result<_, _>>()?,
                    rate_limits: t
                        .limits
                        .iter()
                        .map(Self::limit)
                        .filter_map(|(t, l)| Some((t, l?)))
                        .collect(),
                };
                let counts = (
                    tables.spis.len(),
                    tables.vnis.len(),
                    tables.data_nodes.len(),
                );
                self.node.replace_all(tables).map_err(e)?;
                info!(
                    spis = counts.0,
                    vnis = counts.1,
                    data_nodes = counts.2,
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
                let (t, l) = Self::limit(&r);
                self.node.set_rate_limit(t, l);
                Ok(())
            }
            other => Err(format!("{} is not a steer node directive", op_name(&other))),
        }
    }

    fn report(&self) -> pb::Report {
        let stats = self.node.stats();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        build_report(&stats, &mut last)
    }
}

/// Per-tunnel traffic and rate-limit drops since the last report, and the drop counters.
fn build_report(stats: &SteerStats, last: &mut BTreeMap<u32, (u64, u64, u64)>) -> pb::Report {
    let mut tunnels = Vec::new();
    for (t, s) in &stats.tunnels {
        let now = (
            s.inbound.admitted_bytes,
            s.outbound.admitted_bytes,
            s.inbound.dropped_packets + s.outbound.dropped_packets,
        );
        let before = last.insert(t.0, now).unwrap_or_default();
        tunnels.push(pb::TunnelUsage {
            tunnel: t.0,
            cpu_ns: 0,
            bytes_in: now.0.saturating_sub(before.0),
            packets_in: 0,
            bytes_out: now.1.saturating_sub(before.1),
            packets_out: 0,
            rate_dropped: now.2.saturating_sub(before.2),
        });
    }
    pb::Report {
        interval_ms: 0,
        utilization: 0.0,
        tunnels,
        drops: stats
            .dropped
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| (r.name().to_owned(), n))
            .collect(),
    }
}

/// A running steer node process.
pub struct SteerNodeProcess {
    node: Arc<SteerNode>,
    agent: Agent,
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
        let node = SteerNode::start(sc).map_err(|e| NodeError::Steer(e.to_string()))?;
        let applier = Arc::new(SteerApplier {
            name: config.node.name.clone(),
            node: Arc::clone(&node),
            boot_id: boot_id(),
            last: Mutex::new(BTreeMap::new()),
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
        info!(node = %config.node.name, vips = ?s.vips, vxlan = %s.vxlan, geneve = %s.geneve, "steer node started");
        Ok(Self { node, agent })
    }

    /// The forwarder's counters.
    pub fn stats(&self) -> SteerStats {
        self.node.stats()
    }

    /// Stops the session and the forwarder.
    pub fn shutdown(mut self) {
        self.agent.shutdown();
        self.node.shutdown();
    }
}
