//! The steer node's side of data-node failure detection: the sampled-heartbeat
//! [`HealthMonitor`] of the `steer` crate for live nodes, a second monitor that keeps probing
//! nodes declared dead so that one answering again is noticed (the `steer` monitor keeps a
//! dead node dead until it is added again), the events both produce, and the mapping of
//! probe ids onto the Geneve probe option.
//!
//! **Probe option encoding.** [`ProbeId`]s are 64-bit; the Geneve option carries a 32-bit id
//! and a 32-bit stamp that the data node echoes. The id carries the low 32 bits, the stamp's
//! low 31 bits the next 31, and the stamp's top bit says which monitor sent the probe (0: the
//! live nodes', 1: the dead nodes'). Probe ids count up from 1, so 2⁶³ of them are never
//! reached.

use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use steer::{
    HealthConfig, HealthMonitor, HealthStats, NodeId, NodeStatus, ProbeId, ReplyOutcome, SteerError,
};
use wire::geneve::HealthProbe;

/// Something the control node should hear about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SteerEvent {
    /// The data node missed enough probes in a row to be declared dead; nothing is forwarded
    /// to it any more.
    NodeDead(NodeId),
    /// A data node declared dead answered a probe again; it is forwarded to again.
    NodeAlive(NodeId),
}

/// Which monitor issued a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Monitor {
    /// The live nodes' monitor.
    Live,
    /// The dead nodes' monitor.
    Dead,
}

const DEAD_BIT: u32 = 1 << 31;

/// The Geneve option fields for probe `id` of `monitor` (`None` past 2⁶³ probes).
pub(crate) fn encode_probe(monitor: Monitor, id: ProbeId) -> Option<HealthProbe> {
    let high = u32::try_from(id.0 >> 32)
        .ok()
        .filter(|h| h & DEAD_BIT == 0)?;
    let flag = match monitor {
        Monitor::Live => 0,
        Monitor::Dead => DEAD_BIT,
    };
    Some(HealthProbe {
        id: id.0 as u32,
        stamp: high | flag,
    })
}

/// The monitor and probe id of an echoed probe option.
pub(crate) fn decode_probe(p: HealthProbe) -> (Monitor, ProbeId) {
    let monitor = if p.stamp & DEAD_BIT != 0 {
        Monitor::Dead
    } else {
        Monitor::Live
    };
    let id = (u64::from(p.stamp & !DEAD_BIT) << 32) | u64::from(p.id);
    (monitor, ProbeId(id))
}

/// The failure detector of one steer node (see the module docs).
#[derive(Debug)]
pub(crate) struct Health {
    live: HealthMonitor,
    /// Probes dead nodes; `None` if they are not to be revived.
    dead: Option<HealthMonitor>,
    events: Sender<SteerEvent>,
}

impl Health {
    /// A detector with no nodes; dead nodes are probed every `revive_interval` if given.
    pub(crate) fn new(
        config: HealthConfig,
        revive_interval: Option<Duration>,
        events: Sender<SteerEvent>,
    ) -> Result<Self, SteerError> {
        let dead = match revive_interval {
            Some(interval) => Some(HealthMonitor::new(HealthConfig {
                // Dead nodes carry no traffic: only explicit probes, one per interval,
                // and they never die a second time.
                sample: u32::MAX,
                min_interval: interval,
                idle_interval: interval,
                timeout: config.timeout,
                misses: u32::MAX,
                max_outstanding: config.max_outstanding,
            })?),
            None => None,
        };
        Ok(Self {
            live: HealthMonitor::new(config)?,
            dead,
            events,
        })
    }

    /// The data nodes changed from `old` to `new`: new nodes, and nodes whose address changed,
    /// start over as alive; removed nodes are forgotten; others keep their state.
    pub(crate) fn set_nodes(
        &mut self,
        old: &FxHashMap<NodeId, SocketAddr>,
        new: &[(NodeId, SocketAddr)],
        now: Instant,
    ) {
        let new_map: HashMap<NodeId, SocketAddr> = new.iter().copied().collect();
        for &id in old.keys() {
            if !new_map.contains_key(&id) {
                self.live.remove_node(id);
                if let Some(d) = &mut self.dead {
                    d.remove_node(id);
                }
            }
        }
        for &(id, addr) in new {
            if old.get(&id) != Some(&addr) || self.live.is_alive(id).is_none() {
                self.live.add_node(id, now);
                if let Some(d) = &mut self.dead {
                    d.remove_node(id);
                }
            }
        }
    }

    /// True if `node` is monitored and alive, `Some(false)` if dead, `None` if unknown.
    pub(crate) fn is_alive(&self, node: NodeId) -> Option<bool> {
        self.live.is_alive(node)
    }

    /// A packet goes to `node` now: the probe it should carry, if one is due.
    pub(crate) fn on_forward(&mut self, node: NodeId, now: Instant) -> Option<HealthProbe> {
        let id = self.live.on_forward(node, now)?;
        encode_probe(Monitor::Live, id)
    }

    /// Explicit probes due now (idle live nodes, dead nodes), in node order per monitor.
    pub(crate) fn on_tick(&mut self, now: Instant) -> Vec<(NodeId, HealthProbe)> {
        let mut out: Vec<(NodeId, HealthProbe)> = self
            .live
            .on_tick(now)
            .into_iter()
            .filter_map(|(n, id)| Some((n, encode_probe(Monitor::Live, id)?)))
            .collect();
        if let Some(d) = &mut self.dead {
            out.extend(
                d.on_tick(now)
                    .into_iter()
                    .filter_map(|(n, id)| Some((n, encode_probe(Monitor::Dead, id)?))),
            );
        }
        out
    }

    /// A probe reply from `node`; true if a monitor accepted it.
    pub(crate) fn on_reply(&mut self, node: NodeId, probe: HealthProbe, now: Instant) -> bool {
        match decode_probe(probe) {
            (Monitor::Live, id) => self.live.on_reply(node, id, now) == ReplyOutcome::Accepted,
            (Monitor::Dead, id) => {
                let Some(d) = &mut self.dead else {
                    return false;
                };
                if d.on_reply(node, id, now) != ReplyOutcome::Accepted {
                    return false;
                }
                d.remove_node(node);
                if self.live.is_alive(node) == Some(false) {
                    self.live.add_node(node, now);
                    tracing::info!(node = %node, "data node answers probes again");
                    let _ = self.events.send(SteerEvent::NodeAlive(node));
                }
                true
            }
        }
    }

    /// Reports the nodes declared dead since the last call and starts probing them for
    /// revival.
    pub(crate) fn flush(&mut self, now: Instant) {
        let dead = self.live.take_dead();
        for node in dead {
            tracing::warn!(node = %node, "data node declared dead: missed probes");
            if let Some(d) = &mut self.dead {
                d.add_node(node, now);
            }
            let _ = self.events.send(SteerEvent::NodeDead(node));
        }
        if let Some(d) = &mut self.dead {
            // The dead nodes' monitor never declares deaths (misses = u32::MAX); drain anyway.
            for node in d.take_dead() {
                d.add_node(node, now);
            }
        }
    }

    /// When [`Self::on_tick`] next has something to do.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let d = self.dead.as_ref().and_then(HealthMonitor::poll_timeout);
        match (self.live.poll_timeout(), d) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Counters of both monitors and each node's status.
    pub(crate) fn stats(&self) -> (HealthStats, HealthStats, BTreeMap<NodeId, NodeStatus>) {
        let nodes = self
            .live
            .nodes()
            .filter_map(|n| Some((n, self.live.node_status(n)?)))
            .collect();
        let dead = self
            .dead
            .as_ref()
            .map(HealthMonitor::stats)
            .unwrap_or_default();
        (self.live.stats(), dead, nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_ids_round_trip_through_the_option() {
        for id in [1u64, 0xffff_ffff, 0x1_0000_0000, (1 << 63) - 1] {
            for m in [Monitor::Live, Monitor::Dead] {
                let p = encode_probe(m, ProbeId(id)).unwrap();
                assert_eq!(decode_probe(p), (m, ProbeId(id)));
            }
        }
        assert_eq!(encode_probe(Monitor::Live, ProbeId(1 << 63)), None);
        let p = encode_probe(Monitor::Live, ProbeId(5)).unwrap();
        assert_eq!((p.id, p.stamp), (5, 0));
        let p = encode_probe(Monitor::Dead, ProbeId(5)).unwrap();
        assert_eq!((p.id, p.stamp), (5, 1 << 31));
    }

    fn config() -> HealthConfig {
        HealthConfig {
            sample: 1000,
            min_interval: Duration::from_millis(10),
            idle_interval: Duration::from_millis(20),
            timeout: Duration::from_millis(50),
            misses: 3,
            max_outstanding: 32,
        }
    }

    /// Answers nothing until the node is dead, then answers the dead nodes' probes.
    #[test]
    fn a_dead_node_that_answers_again_is_revived_with_one_event_each() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut h = Health::new(config(), Some(Duration::from_millis(100)), tx).unwrap();
        let n = NodeId(7);
        let t0 = Instant::now();
        h.set_nodes(
            &FxHashMap::default(),
            &[(n, "10.0.0.1:6081".parse().unwrap())],
            t0,
        );
        let mut now = t0;
        let mut probes = Vec::new();
        while h.is_alive(n) == Some(true) && now < t0 + Duration::from_secs(5) {
            now += Duration::from_millis(5);
            probes.extend(h.on_tick(now));
            h.flush(now);
        }
        assert_eq!(h.is_alive(n), Some(false));
        assert_eq!(rx.try_recv(), Ok(SteerEvent::NodeDead(n)));
        // A late answer to a live-monitor probe does not revive it.
        let (_, old) = probes[0];
        assert!(!h.on_reply(n, old, now));
        assert_eq!(h.is_alive(n), Some(false));
        // The dead nodes' monitor probes it; answering revives it.
        let mut revived = false;
        while !revived && now < t0 + Duration::from_secs(5) {
            now += Duration::from_millis(5);
            for (node, p) in h.on_tick(now) {
                assert_eq!(node, n);
                if decode_probe(p).0 == Monitor::Dead {
                    revived = h.on_reply(n, p, now);
                }
            }
            h.flush(now);
        }
        assert!(revived);
        assert_eq!(h.is_alive(n), Some(true));
        assert_eq!(rx.try_recv(), Ok(SteerEvent::NodeAlive(n)));
        assert!(rx.try_recv().is_err());
        // Removing the node forgets it in both monitors.
        h.set_nodes(
            &[(n, "10.0.0.1:6081".parse().unwrap())]
                .into_iter()
                .collect(),
            &[],
            now,
        );
        assert_eq!(h.is_alive(n), None);
        assert!(h.on_tick(now + Duration::from_secs(1)).is_empty());
    }

    #[test]
    fn without_revival_a_dead_node_stays_dead_until_re_added_with_a_new_address() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut h = Health::new(config(), None, tx).unwrap();
        let n = NodeId(1);
        let a: SocketAddr = "10.0.0.1:6081".parse().unwrap();
        let t0 = Instant::now();
        h.set_nodes(&FxHashMap::default(), &[(n, a)], t0);
        let mut now = t0;
        while h.is_alive(n) == Some(true) && now < t0 + Duration::from_secs(5) {
            now += Duration::from_millis(5);
            h.on_tick(now);
            h.flush(now);
        }
        assert_eq!(rx.try_recv(), Ok(SteerEvent::NodeDead(n)));
        // Same node, same address: kept as it is (dead).
        let old: FxHashMap<_, _> = [(n, a)].into_iter().collect();
        h.set_nodes(&old, &[(n, a)], now);
        assert_eq!(h.is_alive(n), Some(false));
        assert!(h.on_tick(now + Duration::from_secs(1)).is_empty());
        // A new address starts it over.
        h.set_nodes(&old, &[(n, "10.0.0.2:6081".parse().unwrap())], now);
        assert_eq!(h.is_alive(n), Some(true));
    }
}
