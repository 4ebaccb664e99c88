//! [`SteerNode`]: a running steer node — its sockets, its forwarding threads and the
//! control interface that updates its tables, reads its counters and stops it.

use rustc_hash::FxHashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::Receiver;
use steer::{
    AttachEntry, NodeId, PortId, PortKey, RateLimit, SelectorEntry, SpiEntry, TunnelId, TunnelLimit,
};
use wire::vxlan::Vni;
use wire::EspSpi;

use crate::config::SteerConfig;
use crate::error::SteerNodeError;
use crate::forward::{lock, run_ports, run_underlay, run_wan, Port, Role, Shared};
use crate::health::{Health, SteerEvent};
use crate::limits::Direction;
use crate::stats::{DropStats, ForwardStats, SteerStats, TunnelStats};
use crate::sys::{self, UdpSocket, Waker};
use crate::tables::{check_node_addr, validate_nodes, Published, SteerTables, Tables};

/// The addresses a steer node's sockets are bound to (with the kernel's ports where 0 was
/// configured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalAddrs {
    /// Each VIP's IKE socket, in the order of [`SteerConfig::vips`].
    pub ike: Vec<SocketAddr>,
    /// Each VIP's NAT-T socket, in the same order.
    pub natt: Vec<SocketAddr>,
    /// The VTEP socket hosts send VXLAN to.
    pub vxlan: SocketAddr,
    /// The Geneve socket nodes exchange frames with.
    pub geneve: SocketAddr,
}

/// A customer-facing port as the steer node opened it (what it tells the control node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Its id (carried in the Geneve port option).
    pub id: PortId,
    /// The interface's name.
    pub interface: String,
    /// The interface's MAC: the gateway's MAC on the customers' segments.
    pub mac: [u8; 6],
}

/// A running steer node: the forwarder of the public VIPs (see the crate docs).
///
/// Table updates build a new snapshot off the packet path and swap it in whole; they never
/// stall forwarding. Updates are serialised among themselves.
#[derive(Debug)]
pub struct SteerNode {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Serialises table updates (each edits a copy of the current snapshot).
    update: Mutex<()>,
    events: Receiver<SteerEvent>,
    local: LocalAddrs,
}

/// A forwarding thread's body.
type ThreadMain = fn(Arc<Shared>);

fn bind(role: &'static str, addr: SocketAddr) -> Result<UdpSocket, SteerNodeError> {
    sys::bind(addr).map_err(|source| SteerNodeError::Bind { role, addr, source })
}

impl SteerNode {
    /// Validates `config`, binds every socket and starts the forwarding threads. The tables
    /// start empty: nothing is forwarded until they are set.
    pub fn start(config: SteerConfig) -> Result<Arc<Self>, SteerNodeError> {
        config.validate()?;
        let mut socks = Vec::new();
        let mut roles = Vec::new();
        let mut vip_socks = FxHashMap::default();
        let (mut ike, mut natt) = (Vec::new(), Vec::new());
        for &vip in &config.vips {
            for (role, name, port, list) in [
                (Role::Ike, "ike", config.ike_port, &mut ike),
                (Role::NatT, "natt", config.natt_port, &mut natt),
            ] {
                let s = bind(name, SocketAddr::new(vip, port))?;
                vip_socks.insert(s.local_addr(), socks.len());
                list.push(s.local_addr());
                socks.push(s);
                roles.push(role);
            }
        }
        let vxlan = socks.len();
        socks.push(bind("vxlan", config.vxlan)?);
        roles.push(Role::Vxlan);
        let geneve = socks.len();
        socks.push(bind("geneve", config.geneve)?);
        roles.push(Role::Geneve);
        let local = LocalAddrs {
            ike,
            natt,
            vxlan: socks[vxlan].local_addr(),
            geneve: socks[geneve].local_addr(),
        };
        let (events_tx, events) = crossbeam_channel::unbounded();
        let health = Health::new(config.health, config.revive_interval, events_tx)
            .map_err(|e| SteerNodeError::config("health", e.to_string()))?;
        let waker = Waker::new().map_err(|source| SteerNodeError::Start {
            what: "shutdown eventfd",
            source,
        })?;
        let mut ports = Vec::new();
        for p in &config.ports {
            let sock = netio::packet::PacketSocket::open(&p.interface).map_err(|source| {
                SteerNodeError::Port {
                    interface: p.interface.clone(),
                    source,
                }
            })?;
            // The port's MAC is the gateway's on the customers' segments: a loopback or other
            // interface without a unicast MAC cannot be a customer port.
            let mac = wire::ethernet::EthernetAddress(sock.mac());
            if !mac.is_unicast() || mac.0 == [0; 6] {
                return Err(SteerNodeError::config(
                    "ports",
                    format!(
                        "{} has no unicast Ethernet MAC ({mac}): not a customer port",
                        p.interface
                    ),
                ));
            }
            ports.push(Port { id: p.id, sock });
        }
        let shared = Arc::new(Shared {
            socks,
            roles,
            geneve,
            vxlan,
            vip_socks,
            tables: Published::default(),
            health: Mutex::new(health),
            inbound: Mutex::new(Direction::default()),
            outbound: Mutex::new(Direction::default()),
            wan_counters: Default::default(),
            underlay_counters: Default::default(),
            port_counters: Default::default(),
            port_attach: Default::default(),
            underlay_attach: Default::default(),
            ports,
            waker,
            batch: config.batch,
        });
        let node = Arc::new(Self {
            shared: Arc::clone(&shared),
            threads: Mutex::new(Vec::new()),
            update: Mutex::new(()),
            events,
            local,
        });
        let mut threads: Vec<(&str, ThreadMain)> =
            vec![("steer-wan", run_wan), ("steer-underlay", run_underlay)];
        if !shared.ports.is_empty() {
            threads.push(("steer-ports", run_ports));
        }
        for (name, run) in threads {
            let sh = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || run(sh))
                .map_err(|source| {
                    // Dropping `node` stops the threads already started.
                    SteerNodeError::Start {
                        what: "forwarding thread",
                        source,
                    }
                })?;
            lock(&node.threads).push(handle);
        }
        tracing::info!(
            vips = ?config.vips,
            vxlan = %node.local.vxlan,
            geneve = %node.local.geneve,
            ports = ?config.ports.iter().map(|p| &p.interface).collect::<Vec<_>>(),
            "steer node started"
        );
        Ok(node)
    }

    /// Edits a copy of the current tables with `f` and publishes it if `f` succeeds.
    fn update<R>(
        &self,
        f: impl FnOnce(&mut Tables) -> Result<R, SteerNodeError>,
    ) -> Result<R, SteerNodeError> {
        let _serial = lock(&self.update);
        let mut t = (*self.shared.tables.load()).clone();
        let r = f(&mut t)?;
        self.shared.tables.store(t);
        Ok(r)
    }

    /// A node address the Geneve socket can reach.
    fn check_family(&self, field: &str, addr: SocketAddr) -> Result<(), SteerNodeError> {
        if addr.is_ipv6() != self.local.geneve.is_ipv6() {
            return Err(SteerNodeError::table(
                field,
                format!(
                    "{addr} is not of the Geneve socket's address family ({})",
                    self.local.geneve
                ),
            ));
        }
        Ok(())
    }

    /// Sets (or with `None` clears) the active control node's Geneve address: IKE goes there,
    /// and frames from it are accepted. Without one, IKE is dropped and counted.
    pub fn set_control(&self, geneve: Option<SocketAddr>) -> Result<(), SteerNodeError> {
        if let Some(a) = geneve {
            check_node_addr("control", a)?;
            self.check_family("control", a)?;
        }
        self.update(|t| {
            t.set_control(geneve);
            Ok(())
        })
    }

    /// Replaces the data nodes and their Geneve addresses. The failure detector follows: new
    /// nodes (and nodes whose address changed) start alive and are probed at once, removed
    /// nodes are forgotten, the others keep their state (a dead node stays dead).
    pub fn set_data_nodes(&self, nodes: Vec<(NodeId, SocketAddr)>) -> Result<(), SteerNodeError> {
        validate_nodes(&nodes)?;
        for (i, &(_, a)) in nodes.iter().enumerate() {
            self.check_family(&format!("data_nodes[{i}]"), a)?;
        }
        self.update(|t| {
            // The monitor first: a snapshot never names a node the monitor does not know.
            lock(&self.shared.health).set_nodes(&t.nodes, &nodes, Instant::now());
            t.set_nodes(&nodes);
            Ok(())
        })
    }

    /// Steers inbound ESP with `spi` to `entry` (replacing any previous entry). SPIs 0..=255
    /// are refused (RFC 4303 §2.1 reserves them).
    pub fn set_spi(&self, spi: EspSpi, entry: SpiEntry) -> Result<(), SteerNodeError> {
        self.update(|t| {
            t.spis
                .insert(spi, entry)
                .map(drop)
                .map_err(|e| SteerNodeError::steer("spi", e))
        })
    }

    /// Stops steering `spi`; false if it was not steered.
    pub fn remove_spi(&self, spi: EspSpi) -> bool {
        self.update(|t| Ok(t.spis.remove(spi).is_some()))
            .unwrap_or(false)
    }

    /// Replaces the outbound selectors (priority order, first match wins) and the neighbour
    /// nodes of `vni`, keeping its gateway addresses. Validated whole before anything changes.
    pub fn set_selectors(
        &self,
        vni: Vni,
        entries: Vec<SelectorEntry>,
        neighbour_nodes: Vec<NodeId>,
    ) -> Result<(), SteerNodeError> {
        self.update(|t| {
            let mut v = t.vni_steering(vni);
            v.selectors = entries;
            v.neighbour_nodes = neighbour_nodes;
            t.set_vni(vni, v)
        })
    }

    /// Sets the gateway's own addresses in the VNet of `vni`: IP packets to them go to the
    /// VNI's neighbour nodes (see [`crate::VniSteering::gateway_ips`]).
    pub fn set_gateway_ips(&self, vni: Vni, ips: Vec<IpAddr>) -> Result<(), SteerNodeError> {
        self.update(|t| {
            let mut v = t.vni_steering(vni);
            v.gateway_ips = ips;
            t.set_vni(vni, v)
        })
    }

    /// Steers customers' frames with the tag pair `key` (on its port) to `entry`, replacing
    /// any previous entry (an attachment's migration). The key's VLAN ids are checked.
    pub fn set_port_tags(&self, key: PortKey, entry: AttachEntry) -> Result<(), SteerNodeError> {
        let key = PortKey::new(key.port, key.s_tag, key.c_tag)
            .map_err(|e| SteerNodeError::steer("attachment", e))?;
        self.update(|t| {
            t.ports.insert(key, entry);
            Ok(())
        })
    }

    /// Stops steering the tag pair `key`; false if it was not steered.
    pub fn remove_port_tags(&self, key: PortKey) -> bool {
        self.update(|t| Ok(t.ports.remove(key).is_some()))
            .unwrap_or(false)
    }

    /// Limits `tunnel` to `limit` from now (inbound ESP and outbound VXLAN each to theirs; a
    /// [`RateLimit`] converts into the same limit both ways), or with `None` lifts its limit. A
    /// tunnel without a limit is not limited. With several steer nodes, `limit` is this node's
    /// share of the tunnel's (see [`steer::RateShares`]).
    pub fn set_rate_limit(&self, tunnel: TunnelId, limit: Option<TunnelLimit>) {
        let now = Instant::now();
        lock(&self.shared.inbound).set_limit(tunnel, now, limit.map(|l| l.inbound));
        lock(&self.shared.outbound).set_limit(tunnel, now, limit.map(|l| l.outbound));
    }

    /// Replaces the whole steering state at once (after the steer node (re)registers with the
    /// control node). Everything is validated before anything changes; the failure detector
    /// follows the data nodes as in [`Self::set_data_nodes`]; rate limits become exactly the
    /// listed ones (tunnels keep their credit and counters).
    pub fn replace_all(&self, tables: SteerTables) -> Result<(), SteerNodeError> {
        let new = Tables::build(&tables)?;
        if let Some(c) = tables.control {
            self.check_family("control", c)?;
        }
        for (i, &(_, a)) in tables.data_nodes.iter().enumerate() {
            self.check_family(&format!("data_nodes[{i}]"), a)?;
        }
        let _serial = lock(&self.update);
        let now = Instant::now();
        let old = self.shared.tables.load();
        lock(&self.shared.health).set_nodes(&old.nodes, &tables.data_nodes, now);
        let mentioned: std::collections::HashSet<TunnelId> = new
            .spis
            .iter()
            .map(|(_, e)| e.tunnel)
            .chain(
                tables
                    .vnis
                    .iter()
                    .flat_map(|(_, v)| v.selectors.iter().filter_map(|e| e.tunnel)),
            )
            .collect();
        for (dir, direction) in [
            (&self.shared.inbound, steer::Direction::Inbound),
            (&self.shared.outbound, steer::Direction::Outbound),
        ] {
            let limits: Vec<(TunnelId, RateLimit)> = tables
                .rate_limits
                .iter()
                .map(|(t, l)| (*t, l.get(direction)))
                .collect();
            let mut d = lock(dir);
            d.set_all(&limits, now);
            d.retain_counters(|t| mentioned.contains(&t));
        }
        // Tag pairs the whole tables no longer have lose their counters.
        let pairs: std::collections::HashSet<PortKey> = new.ports.iter().map(|(k, _)| k).collect();
        for c in [&self.shared.port_attach, &self.shared.underlay_attach] {
            c.retain(|k| pairs.contains(&k));
        }
        self.shared.tables.store(new);
        Ok(())
    }

    /// The events (data nodes dead or alive again). Every call returns a handle on the same
    /// queue: each event is received once, by whichever handle takes it first. Events wait
    /// in the queue until taken.
    pub fn events(&self) -> Receiver<SteerEvent> {
        self.events.clone()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SteerStats {
        let mut forwarded = ForwardStats::default();
        let mut dropped = DropStats::default();
        self.shared
            .wan_counters
            .add_to(&mut forwarded, &mut dropped);
        self.shared
            .underlay_counters
            .add_to(&mut forwarded, &mut dropped);
        self.shared
            .port_counters
            .add_to(&mut forwarded, &mut dropped);
        let mut tunnels = std::collections::BTreeMap::<TunnelId, TunnelStats>::new();
        // Both directions are limited or neither (`set_rate_limit`, `replace_all`).
        let mut inbound_limits = std::collections::BTreeMap::new();
        let inbound = lock(&self.shared.inbound).report();
        for (t, (limit, c)) in inbound {
            tunnels.entry(t).or_default().inbound = c;
            if let Some(l) = limit {
                inbound_limits.insert(t, l);
            }
        }
        let outbound = lock(&self.shared.outbound).report();
        for (t, (limit, c)) in outbound {
            let e = tunnels.entry(t).or_default();
            e.outbound = c;
            if let (Some(&inbound), Some(outbound)) = (inbound_limits.get(&t), limit) {
                e.limit = Some(TunnelLimit { inbound, outbound });
            }
        }
        let mut attachments = std::collections::BTreeMap::new();
        self.shared.port_attach.add_to(&mut attachments);
        self.shared.underlay_attach.add_to(&mut attachments);
        let (health, revive, nodes) = lock(&self.shared.health).stats();
        SteerStats {
            forwarded,
            dropped,
            tunnels,
            attachments,
            health,
            revive,
            nodes,
        }
    }

    /// The bound addresses.
    pub fn local_addrs(&self) -> &LocalAddrs {
        &self.local
    }

    /// The customer-facing ports, in the order of [`SteerConfig::ports`].
    pub fn ports(&self) -> Vec<PortInfo> {
        self.shared
            .ports
            .iter()
            .map(|p| PortInfo {
                id: p.id,
                interface: p.sock.name().to_owned(),
                mac: p.sock.mac(),
            })
            .collect()
    }

    /// Stops the forwarding threads and waits for them. Idempotent; the sockets close when the
    /// last handle on the node is dropped. Dropping the node also stops it.
    pub fn shutdown(&self) {
        self.shared.waker.wake();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            if t.join().is_err() {
                tracing::error!("a steer node forwarding thread panicked");
            }
        }
    }
}

impl Drop for SteerNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}
