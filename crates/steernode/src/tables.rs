//! The steering tables as the forwarding threads read them: an immutable [`Tables`] snapshot
//! behind an `Arc`, taken once per batch and swapped whole on every update (the control path
//! edits a copy), so updates never stall forwarding. Also the input type of a whole-state
//! update ([`SteerTables`]) and its validation.
//!
//! The maps read per frame hash with `rustc-hash`'s `FxHasher` rather than SipHash, for the
//! reason the `steer` crate gives: their keys (node ids and addresses, VNIs) come from the
//! control node, not from peers, and no hash value leaves the process.

use rustc_hash::FxHashMap;
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};

use steer::{
    AttachEntry, NodeId, PortKey, PortTable, SelectorEntry, SelectorTable, SpiEntry, SpiTable,
    TunnelId, TunnelLimit,
};
use wire::vxlan::Vni;
use wire::EspSpi;

use crate::config::is_unicast;
use crate::error::SteerNodeError;

/// One VNI's outbound steering: its selectors and where ARP, neighbour discovery and traffic
/// for the gateway go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VniSteering {
    /// Outbound selectors in priority order (first match wins, see [`SelectorTable`]).
    pub selectors: Vec<SelectorEntry>,
    /// The data nodes serving the VNet: ARP, neighbour discovery (ICMPv6 133–137) and
    /// packets to a gateway address go to every live one of them.
    pub neighbour_nodes: Vec<NodeId>,
    /// The gateway's own addresses in the VNet (as the data nodes' VNet configuration has
    /// them, link-local included if used): IP packets to them go to the neighbour nodes,
    /// whatever the selectors say.
    pub gateway_ips: Vec<IpAddr>,
}

/// The whole steering state, for [`crate::SteerNode::replace_all`] (e.g. after the steer
/// node (re)registers with the control node).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SteerTables {
    /// The active control node's Geneve address.
    pub control: Option<SocketAddr>,
    /// Every data node and its Geneve address.
    pub data_nodes: Vec<(NodeId, SocketAddr)>,
    /// Inbound SPIs.
    pub spis: Vec<(EspSpi, SpiEntry)>,
    /// Outbound steering per VNI.
    pub vnis: Vec<(Vni, VniSteering)>,
    /// Per-tunnel rate limits (this node's shares, each direction's); tunnels not listed are
    /// not limited.
    pub rate_limits: Vec<(TunnelId, TunnelLimit)>,
    /// Customer attachments: a port's tag pair and the data node serving it. Frames on this
    /// node's own ports go by them; frames from data nodes out of its ports must carry a
    /// listed pair of that port.
    pub attachments: Vec<(PortKey, AttachEntry)>,
}

/// Who sent a Geneve frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sender {
    /// The control node.
    Control,
    /// A data node.
    Data(NodeId),
    /// A known address shared by several nodes (accepted, but attributable to none).
    Ambiguous,
}

/// One VNI's neighbour nodes and gateway addresses.
#[derive(Debug, Clone, Default)]
pub(crate) struct VniExtra {
    pub(crate) neighbour_nodes: Vec<NodeId>,
    pub(crate) gateway_ips: Vec<IpAddr>,
}

/// A snapshot of the steering tables.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tables {
    /// The control node's Geneve address.
    pub(crate) control: Option<SocketAddr>,
    /// Data node -> Geneve address.
    pub(crate) nodes: FxHashMap<NodeId, SocketAddr>,
    /// Exact sender address -> node.
    senders: FxHashMap<SocketAddr, Sender>,
    /// Sender IP -> node, for frames from another port of a node's address.
    sender_ips: FxHashMap<IpAddr, Sender>,
    /// Inbound SPIs.
    pub(crate) spis: SpiTable,
    /// Outbound selectors.
    pub(crate) selectors: SelectorTable,
    /// Per VNI: neighbour nodes and gateway addresses.
    pub(crate) vnis: FxHashMap<Vni, Arc<VniExtra>>,
    /// Customer attachments by port and tag pair.
    pub(crate) ports: PortTable,
}

impl Tables {
    /// Who `src` is: first by exact address, then by IP alone; `None` for a stranger.
    pub(crate) fn sender(&self, src: SocketAddr) -> Option<Sender> {
        self.senders
            .get(&src)
            .or_else(|| self.sender_ips.get(&src.ip()))
            .copied()
    }

    /// The neighbour nodes and gateway addresses of `vni`, if set.
    pub(crate) fn vni(&self, vni: Vni) -> Option<&VniExtra> {
        self.vnis.get(&vni).map(|v| &**v)
    }

    /// Replaces the data nodes (validated by [`validate_nodes`]) and rebuilds the sender maps.
    pub(crate) fn set_nodes(&mut self, nodes: &[(NodeId, SocketAddr)]) {
        self.nodes = nodes.iter().copied().collect();
        self.rebuild_senders();
    }

    /// Sets the control node and rebuilds the sender maps.
    pub(crate) fn set_control(&mut self, control: Option<SocketAddr>) {
        self.control = control;
        self.rebuild_senders();
    }

    fn rebuild_senders(&mut self) {
        self.senders.clear();
        self.sender_ips.clear();
        let all = self
            .nodes
            .iter()
            .map(|(&id, &a)| (a, Sender::Data(id)))
            .chain(self.control.map(|a| (a, Sender::Control)));
        for (addr, who) in all {
            add_sender(&mut self.senders, addr, who);
            add_sender(&mut self.sender_ips, addr.ip(), who);
        }
    }

    /// Sets one VNI (validated whole: the selector table checks its list).
    pub(crate) fn set_vni(&mut self, vni: Vni, v: VniSteering) -> Result<(), SteerNodeError> {
        let field = format!("vni {vni}");
        check_neighbours(&field, &v.neighbour_nodes)?;
        self.selectors
            .set_vni(vni, v.selectors)
            .map_err(|e| SteerNodeError::steer(format!("{field} selectors"), e))?;
        if v.neighbour_nodes.is_empty() && v.gateway_ips.is_empty() {
            self.vnis.remove(&vni);
        } else {
            self.vnis.insert(
                vni,
                Arc::new(VniExtra {
                    neighbour_nodes: v.neighbour_nodes,
                    gateway_ips: v.gateway_ips,
                }),
            );
        }
        Ok(())
    }

    /// The current steering of `vni` (empty if none), to derive an update of part of it.
    pub(crate) fn vni_steering(&self, vni: Vni) -> VniSteering {
        let extra = self.vni(vni).cloned().unwrap_or_default();
        VniSteering {
            selectors: self.selectors.entries(vni).to_vec(),
            neighbour_nodes: extra.neighbour_nodes,
            gateway_ips: extra.gateway_ips,
        }
    }

    /// Builds a whole snapshot from `t`, validating everything first.
    pub(crate) fn build(t: &SteerTables) -> Result<Self, SteerNodeError> {
        let mut out = Self::default();
        if let Some(c) = t.control {
            check_node_addr("control", c)?;
        }
        validate_nodes(&t.data_nodes)?;
        let mut seen = HashSet::new();
        for (i, &(spi, entry)) in t.spis.iter().enumerate() {
            if !seen.insert(spi) {
                return Err(SteerNodeError::table(
                    format!("spis[{i}]"),
                    format!("spi {spi} is listed twice"),
                ));
            }
            out.spis
                .insert(spi, entry)
                .map_err(|e| SteerNodeError::steer(format!("spis[{i}]"), e))?;
        }
        let mut seen = HashSet::new();
        for (i, (vni, v)) in t.vnis.iter().enumerate() {
            if !seen.insert(*vni) {
                return Err(SteerNodeError::table(
                    format!("vnis[{i}]"),
                    format!("vni {vni} is listed twice"),
                ));
            }
            out.set_vni(*vni, v.clone()).map_err(|e| match e {
                SteerNodeError::Steer { source, .. } => {
                    SteerNodeError::steer(format!("vnis[{i}].selectors"), source)
                }
                SteerNodeError::Table { reason, .. } => {
                    SteerNodeError::table(format!("vnis[{i}].neighbour_nodes"), reason)
                }
                other => other,
            })?;
        }
        for (i, &(key, entry)) in t.attachments.iter().enumerate() {
            let checked = PortKey::new(key.port, key.s_tag, key.c_tag)
                .map_err(|e| SteerNodeError::steer(format!("attachments[{i}]"), e))?;
            if out.ports.insert(checked, entry).is_some() {
                return Err(SteerNodeError::table(
                    format!("attachments[{i}]"),
                    format!(
                        "{} tags ({}, {}) are listed twice",
                        key.port, key.s_tag, key.c_tag
                    ),
                ));
            }
        }
        let mut seen = HashSet::new();
        for (i, (tunnel, _)) in t.rate_limits.iter().enumerate() {
            if !seen.insert(*tunnel) {
                return Err(SteerNodeError::table(
                    format!("rate_limits[{i}]"),
                    format!("{tunnel} is listed twice"),
                ));
            }
        }
        out.control = t.control;
        out.set_nodes(&t.data_nodes);
        Ok(out)
    }
}

fn add_sender<K: std::hash::Hash + Eq>(map: &mut FxHashMap<K, Sender>, key: K, who: Sender) {
    map.entry(key)
        .and_modify(|s| {
            if *s != who {
                *s = Sender::Ambiguous;
            }
        })
        .or_insert(who);
}

fn check_neighbours(field: &str, nodes: &[NodeId]) -> Result<(), SteerNodeError> {
    for (i, n) in nodes.iter().enumerate() {
        if nodes[..i].contains(n) {
            return Err(SteerNodeError::table(
                format!("{field} neighbour_nodes[{i}]"),
                format!("{n} is listed twice"),
            ));
        }
    }
    Ok(())
}

/// A node's Geneve address must be a unicast address with a port.
pub(crate) fn check_node_addr(field: &str, addr: SocketAddr) -> Result<(), SteerNodeError> {
    if !is_unicast(&addr.ip()) || addr.port() == 0 {
        return Err(SteerNodeError::table(
            field,
            format!("{addr} is not a unicast address with a port"),
        ));
    }
    Ok(())
}

/// Data nodes: valid addresses, no node or address twice.
pub(crate) fn validate_nodes(nodes: &[(NodeId, SocketAddr)]) -> Result<(), SteerNodeError> {
    for (i, &(id, addr)) in nodes.iter().enumerate() {
        let field = format!("data_nodes[{i}]");
        check_node_addr(&field, addr)?;
        if let Some((_, a)) = nodes[..i].iter().find(|(n, _)| *n == id) {
            return Err(SteerNodeError::table(
                field,
                format!("{id} is listed twice ({a} and {addr})"),
            ));
        }
        if let Some((n, _)) = nodes[..i].iter().find(|(_, a)| *a == addr) {
            return Err(SteerNodeError::table(
                field,
                format!("{addr} is the address of {n} too"),
            ));
        }
    }
    Ok(())
}

/// The published snapshot: one read lock and one reference count per [`Self::load`], which
/// the threads call once per batch.
#[derive(Debug, Default)]
pub(crate) struct Published(RwLock<Arc<Tables>>);

impl Published {
    /// The current snapshot.
    pub(crate) fn load(&self) -> Arc<Tables> {
        Arc::clone(&self.0.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces the snapshot.
    pub(crate) fn store(&self, t: Tables) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steer::{AddrRange, Selector};

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn senders_by_address_then_ip_and_ambiguous_ips() {
        let mut t = Tables::default();
        t.set_nodes(&[
            (NodeId(1), sa("10.0.0.1:6081")),
            (NodeId(2), sa("10.0.0.2:6081")),
            (NodeId(3), sa("10.0.0.2:7000")),
        ]);
        t.set_control(Some(sa("10.0.0.9:6081")));
        assert_eq!(t.sender(sa("10.0.0.1:6081")), Some(Sender::Data(NodeId(1))));
        // Another port of node 1's address is still node 1.
        assert_eq!(t.sender(sa("10.0.0.1:5555")), Some(Sender::Data(NodeId(1))));
        assert_eq!(t.sender(sa("10.0.0.2:7000")), Some(Sender::Data(NodeId(3))));
        assert_eq!(t.sender(sa("10.0.0.2:5555")), Some(Sender::Ambiguous));
        assert_eq!(t.sender(sa("10.0.0.9:1")), Some(Sender::Control));
        assert_eq!(t.sender(sa("10.0.0.3:6081")), None);
        t.set_control(None);
        assert_eq!(t.sender(sa("10.0.0.9:6081")), None);
    }

    #[test]
    fn build_validates_whole_and_names_the_field() {
        let entry = SpiEntry {
            node: NodeId(1),
            tunnel: TunnelId(1),
        };
        let sel = |src: &str| SelectorEntry {
            selector: Selector::between(
                AddrRange::prefix(src.parse().unwrap(), 24).unwrap(),
                AddrRange::V6_ANY,
            ),
            tunnel: Some(TunnelId(1)),
            node: NodeId(1),
        };
        let good = SteerTables {
            control: Some(sa("10.0.0.9:6081")),
            data_nodes: vec![(NodeId(1), sa("10.0.0.1:6081"))],
            spis: vec![(EspSpi(0x1000), entry)],
            vnis: vec![(
                Vni::new(5).unwrap(),
                VniSteering {
                    selectors: vec![],
                    neighbour_nodes: vec![NodeId(1)],
                    gateway_ips: vec![],
                },
            )],
            rate_limits: vec![(TunnelId(1), steer::RateLimit::mbit(1, 1500).into())],
            attachments: vec![(
                PortKey {
                    port: steer::PortId(1),
                    s_tag: 100,
                    c_tag: 20,
                },
                AttachEntry {
                    node: NodeId(1),
                    attachment: steer::AttachmentId(1),
                    vni: None,
                },
            )],
        };
        let t = Tables::build(&good).unwrap();
        assert_eq!(
            t.ports.lookup(steer::PortId(1), 100, 20).map(|e| e.node),
            Some(NodeId(1))
        );
        assert_eq!(t.spis.node(EspSpi(0x1000)), Some(NodeId(1)));
        assert!(t.vni(Vni::new(5).unwrap()).is_some());

        let field = |t: &SteerTables| match Tables::build(t) {
            Err(SteerNodeError::Table { field, .. } | SteerNodeError::Steer { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let mut bad = good.clone();
        bad.control = Some(sa("0.0.0.0:6081"));
        assert_eq!(field(&bad), "control");
        let mut bad = good.clone();
        bad.data_nodes.push((NodeId(1), sa("10.0.0.2:6081")));
        assert_eq!(field(&bad), "data_nodes[1]");
        let mut bad = good.clone();
        bad.data_nodes.push((NodeId(2), sa("10.0.0.1:6081")));
        assert_eq!(field(&bad), "data_nodes[1]");
        let mut bad = good.clone();
        bad.data_nodes.push((NodeId(2), sa("10.0.0.2:0")));
        assert_eq!(field(&bad), "data_nodes[1]");
        let mut bad = good.clone();
        bad.spis.push((EspSpi(7), entry));
        assert_eq!(field(&bad), "spis[1]");
        let mut bad = good.clone();
        bad.spis.push((EspSpi(0x1000), entry));
        assert_eq!(field(&bad), "spis[1]");
        let mut bad = good.clone();
        bad.vnis[0].1.selectors.push(sel("10.0.0.0"));
        assert_eq!(field(&bad), "vnis[0].selectors");
        let mut bad = good.clone();
        bad.vnis[0].1.neighbour_nodes.push(NodeId(1));
        assert_eq!(field(&bad), "vnis[0].neighbour_nodes");
        let mut bad = good.clone();
        bad.vnis.push(bad.vnis[0].clone());
        assert_eq!(field(&bad), "vnis[1]");
        let mut bad = good.clone();
        bad.attachments.push(bad.attachments[0]);
        assert_eq!(field(&bad), "attachments[1]");
        let mut bad = good.clone();
        bad.attachments[0].0.c_tag = 4095;
        assert_eq!(field(&bad), "attachments[0]");
        let mut bad = good;
        bad.rate_limits.push(bad.rate_limits[0]);
        assert_eq!(field(&bad), "rate_limits[1]");
    }
}
