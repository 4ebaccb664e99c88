//! The steer node's static configuration: which addresses it owns and listens on, failure
//! detection settings and the batch size. Validated whole before any socket is opened.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use steer::{HealthConfig, PortId};

use crate::error::SteerNodeError;

/// Largest batch of datagrams per `recvmmsg` / `sendmmsg` call.
pub const MAX_BATCH: usize = 1024;

/// How a steer node is started (see [`crate::SteerNode::start`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteerConfig {
    /// The public VIPs peers send IKE and ESP to. Each gets its own IKE and NAT-T socket, bound
    /// to the address itself (never a wildcard), so the local address of every datagram is
    /// known without `IP_PKTINFO`.
    pub vips: Vec<IpAddr>,
    /// IKE port on every VIP (500; 0 lets the kernel choose, for tests).
    pub ike_port: u16,
    /// NAT-T port on every VIP (4500; 0 lets the kernel choose, for tests).
    pub natt_port: u16,
    /// The underlay VTEP address and port (normally 4789) cloud hosts send VXLAN to.
    pub vxlan: SocketAddr,
    /// The underlay address and port (normally 6081) data and control nodes exchange Geneve
    /// frames with; frames to them are sent from it.
    pub geneve: SocketAddr,
    /// Data-node failure detection.
    pub health: HealthConfig,
    /// How often a data node declared dead is probed to notice that it answers again (then a
    /// [`crate::SteerEvent::NodeAlive`] is reported and it is forwarded to again). `None`: a
    /// dead node stays dead until [`crate::SteerNode::set_data_nodes`] drops and re-adds it.
    pub revive_interval: Option<Duration>,
    /// Datagrams per `recvmmsg` / `sendmmsg` call (1..=1024; a receive takes at most 64,
    /// each thread keeping a 64 KiB buffer per slot).
    pub batch: usize,
    /// Customer-facing ports: Ethernet interfaces where customers' edge routers are attached
    /// over VLAN or Q-in-Q, each with its id on this node (announced to the control node,
    /// carried in the Geneve port option). Each is
    /// opened with an AF_PACKET ring (`netio::packet`, needs CAP_NET_RAW) and read by a thread
    /// of its own; none: no such thread.
    pub ports: Vec<PortSpec>,
}

/// A customer-facing port of this steer node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// Its id on this steer node (carried in the Geneve port option; `protego steer` numbers
    /// `[steer] ports` from 1).
    pub id: PortId,
    /// The interface's name.
    pub interface: String,
}

impl SteerConfig {
    /// A configuration with the standard ports on `vips`, the given underlay sockets, the
    /// paper's failure detection defaults, dead nodes probed every second and batches of 32.
    pub fn new(vips: Vec<IpAddr>, vxlan: SocketAddr, geneve: SocketAddr) -> Self {
        Self {
            vips,
            ike_port: 500,
            natt_port: wire::esp::NAT_T_PORT,
            vxlan,
            geneve,
            health: HealthConfig::default(),
            revive_interval: Some(Duration::from_secs(1)),
            batch: 32,
            ports: Vec::new(),
        }
    }

    /// Checks every field, naming the first one that is wrong.
    pub fn validate(&self) -> Result<(), SteerNodeError> {
        if self.vips.is_empty() {
            return Err(SteerNodeError::config("vips", "at least one VIP is needed"));
        }
        for (i, vip) in self.vips.iter().enumerate() {
            if !is_unicast(vip) {
                return Err(SteerNodeError::config(
                    format!("vips[{i}]"),
                    format!("{vip} is not a unicast address"),
                ));
            }
            if self.vips[..i].contains(vip) {
                return Err(SteerNodeError::config(
                    format!("vips[{i}]"),
                    format!("{vip} is listed twice"),
                ));
            }
        }
        if self.ike_port != 0 && self.ike_port == self.natt_port {
            return Err(SteerNodeError::config(
                "natt_port",
                "must differ from ike_port",
            ));
        }
        for (field, addr) in [("vxlan", self.vxlan), ("geneve", self.geneve)] {
            if !is_unicast(&addr.ip()) {
                return Err(SteerNodeError::config(
                    field,
                    format!("{} is not a unicast address", addr.ip()),
                ));
            }
        }
        if self.vxlan.port() != 0 && self.vxlan == self.geneve {
            return Err(SteerNodeError::config(
                "geneve",
                "must differ from the vxlan address",
            ));
        }
        self.health
            .validate()
            .map_err(|e| SteerNodeError::config("health", e.to_string()))?;
        if self.revive_interval.is_some_and(|d| d.is_zero()) {
            return Err(SteerNodeError::config(
                "revive_interval",
                "must be greater than zero",
            ));
        }
        if self.batch == 0 || self.batch > MAX_BATCH {
            return Err(SteerNodeError::config(
                "batch",
                format!("{} is outside 1..={MAX_BATCH}", self.batch),
            ));
        }
        for (i, p) in self.ports.iter().enumerate() {
            let field = format!("ports[{i}]");
            // IFNAMSIZ is 16 with the terminating NUL.
            if p.interface.is_empty() || p.interface.len() > 15 || p.interface.contains('/') {
                return Err(SteerNodeError::config(
                    field,
                    format!("{:?} is not an interface name", p.interface),
                ));
            }
            if let Some(j) = self.ports[..i]
                .iter()
                .position(|q| q.id == p.id || q.interface == p.interface)
            {
                return Err(SteerNodeError::config(
                    field,
                    format!(
                        "{} ({}) repeats ports[{j}]'s id or interface",
                        p.id, p.interface
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// True for an address a socket can own: not unspecified, not multicast, not IPv4 broadcast.
pub(crate) fn is_unicast(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => !a.is_unspecified() && !a.is_multicast() && !a.is_broadcast(),
        IpAddr::V6(a) => !a.is_unspecified() && !a.is_multicast(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> SteerConfig {
        SteerConfig::new(
            vec!["192.0.2.1".parse().unwrap()],
            "10.0.0.1:4789".parse().unwrap(),
            "10.0.0.1:6081".parse().unwrap(),
        )
    }

    fn port(id: u32, interface: &str) -> PortSpec {
        PortSpec {
            id: PortId(id),
            interface: interface.into(),
        }
    }

    #[test]
    fn defaults_are_valid_and_each_bad_field_is_named() {
        base().validate().unwrap();
        let mut c = base();
        c.ports = vec![port(1, "eth1"), port(2, "eth2")];
        c.validate().unwrap();
        type Change = Box<dyn Fn(&mut SteerConfig)>;
        let cases: Vec<(&str, Change)> = vec![
            ("vips", Box::new(|c| c.vips.clear())),
            (
                "vips[0]",
                Box::new(|c| c.vips[0] = "0.0.0.0".parse().unwrap()),
            ),
            ("vips[1]", Box::new(|c| c.vips.push(c.vips[0]))),
            ("natt_port", Box::new(|c| c.natt_port = c.ike_port)),
            (
                "vxlan",
                Box::new(|c| c.vxlan = "[ff02::1]:4789".parse().unwrap()),
            ),
            ("geneve", Box::new(|c| c.geneve = c.vxlan)),
            ("health", Box::new(|c| c.health.misses = 0)),
            (
                "revive_interval",
                Box::new(|c| c.revive_interval = Some(Duration::ZERO)),
            ),
            ("batch", Box::new(|c| c.batch = 0)),
            ("batch", Box::new(|c| c.batch = MAX_BATCH + 1)),
            ("ports[0]", Box::new(|c| c.ports = vec![port(1, "")])),
            (
                "ports[0]",
                Box::new(|c| c.ports = vec![port(1, "a-name-too-long-x")]),
            ),
            (
                "ports[1]",
                Box::new(|c| c.ports = vec![port(1, "eth1"), port(1, "eth2")]),
            ),
            (
                "ports[1]",
                Box::new(|c| c.ports = vec![port(1, "eth1"), port(2, "eth1")]),
            ),
        ];
        for (field, change) in cases {
            let mut c = base();
            change(&mut c);
            match c.validate() {
                Err(SteerNodeError::Config { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
