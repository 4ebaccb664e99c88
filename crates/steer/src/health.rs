//! Data-node failure detection by sampled heartbeats (the paper's §4.3 "GPN failure
//! detection", §6.1 and §7.1).
//!
//! Fixed-interval heartbeats either load the network or detect slowly; Protego instead tags
//! a sample of the packets it forwards to each data node, and the node answers each tagged
//! packet with a heartbeat, so busy nodes are checked often and cost little. "When there is
//! no reply within a certain period, the packet is regarded as dropped. After three
//! consecutive drops, GIN or GEN concludes that a corresponding GPN fails" (§6.1); the
//! evaluation samples 1/1000 of packets with a minimum sampling interval of 10 ms (§7.1).
//!
//! [`HealthMonitor`] makes those decisions for one steer node; the I/O layer carries the
//! [`ProbeId`]s (e.g. in a Geneve option) and reports replies:
//!
//! - [`HealthMonitor::on_forward`] for every packet forwarded to a data node: a probe is due
//!   when `sample` packets (this one included) have gone to the node since its last probe,
//!   or when its last probe is at least `min_interval` old, or when it was never probed. The
//!   sample is every `sample`-th packet, deterministically (no randomness in this crate).
//! - [`HealthMonitor::on_tick`] at least as often as [`HealthMonitor::poll_timeout`] asks
//!   (or periodically, e.g. every millisecond): notices timed-out probes and returns explicit
//!   probes for nodes not probed within `idle_interval` (idle nodes).
//! - [`HealthMonitor::on_reply`] for every reply: one answering a probe still outstanding
//!   clears the node's consecutive misses; others (late, duplicate, forged, for unknown or
//!   dead nodes) are ignored and counted.
//! - [`HealthMonitor::take_dead`] after the calls above: nodes declared dead since the last
//!   call, each death reported once. A dead node gets no probes and stays dead, whatever
//!   replies arrive, until [`HealthMonitor::add_node`] adds it again.
//!
//! A probe not answered within `timeout` of being sent is a miss; `misses` consecutive misses
//! (no accepted reply between them) mark the node dead. Timeouts are noticed by any call that
//! touches the node, at the `now` of that call. Within one call, timeouts due at or before
//! `now` come first, so a reply arriving exactly `timeout` after its probe is late.
//!
//! Time never goes backwards here: an earlier `now` than seen before is taken as the latest
//! instant seen. Memory is bounded: each node has at most `max_outstanding` probes in flight
//! (further probes wait until one is answered or times out), and each death is queued once.
//!
//! Detection time with the defaults: a node carrying at least one packet per 10 ms is probed
//! at least every 10 ms, so it is declared dead at most about 3 × 10 ms + `timeout` (50 ms)
//! = 80 ms after it stops answering; an idle node, probed every `idle_interval` (20 ms),
//! within about 3 × 20 ms + 50 ms = 110 ms.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crate::error::SteerError;
use crate::ids::{NodeId, ProbeId};

/// Failure detection settings (see the module docs for how each is used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthConfig {
    /// Probe every `sample`-th packet forwarded to a node (default 1000, the paper's 1/1000).
    pub sample: u32,
    /// Probe a node that carries traffic at least this often (default 10 ms, the paper's
    /// minimum sampling interval).
    pub min_interval: Duration,
    /// Send an explicit probe to a node not probed for this long (default 20 ms).
    pub idle_interval: Duration,
    /// A probe not answered within this is a miss (default 50 ms).
    pub timeout: Duration,
    /// Consecutive misses that mark a node dead (default 3, the paper's).
    pub misses: u32,
    /// Most probes in flight per node (default 32).
    pub max_outstanding: usize,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            sample: 1000,
            min_interval: Duration::from_millis(10),
            idle_interval: Duration::from_millis(20),
            timeout: Duration::from_millis(50),
            misses: 3,
            max_outstanding: 32,
        }
    }
}

impl HealthConfig {
    /// Checks every field, naming the first one out of range.
    pub fn validate(&self) -> Result<(), SteerError> {
        let err = |field, reason| Err(SteerError::InvalidHealthConfig { field, reason });
        if self.sample == 0 {
            return err("sample", "must be at least 1 (probe every n-th packet)");
        }
        if self.min_interval.is_zero() {
            return err("min_interval", "must be greater than zero");
        }
        if self.idle_interval.is_zero() {
            return err("idle_interval", "must be greater than zero");
        }
        if self.timeout.is_zero() {
            return err("timeout", "must be greater than zero");
        }
        if self.misses == 0 {
            return err("misses", "must be at least 1");
        }
        if self.max_outstanding == 0 {
            return err("max_outstanding", "must be at least 1");
        }
        Ok(())
    }
}

/// What became of a reply given to [`HealthMonitor::on_reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyOutcome {
    /// It answered an outstanding probe of the node: the node's misses are cleared.
    Accepted,
    /// The node is not monitored.
    UnknownNode,
    /// The node has been declared dead; only [`HealthMonitor::add_node`] revives it.
    NodeDead,
    /// The probe was sent but is not outstanding for this node: it timed out (a late reply),
    /// was answered already (a duplicate), or went to another node.
    Stale,
    /// No probe with this id was ever sent (forged or corrupted).
    NeverIssued,
}

/// One node's health, as [`HealthMonitor::node_status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeStatus {
    /// False once the node has been declared dead.
    pub alive: bool,
    /// Misses since the last accepted reply.
    pub consecutive_misses: u32,
    /// Misses since the node was added.
    pub total_misses: u64,
    /// Probes in flight.
    pub outstanding: usize,
    /// Probes sent since the node was added.
    pub probes_sent: u64,
    /// Replies accepted since the node was added.
    pub replies: u64,
    /// When the last probe was sent.
    pub last_probe: Option<Instant>,
}

/// Counters over all nodes since the monitor was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HealthStats {
    /// Probes on every `sample`-th packet.
    pub sampled_probes: u64,
    /// Probes on packets because the node's last probe was `min_interval` old (or none).
    pub interval_probes: u64,
    /// Explicit probes of idle nodes.
    pub idle_probes: u64,
    /// Probes due but held back because the node had `max_outstanding` in flight.
    pub suppressed_probes: u64,
    /// Replies accepted.
    pub accepted_replies: u64,
    /// Replies for a probe no longer outstanding ([`ReplyOutcome::Stale`]).
    pub stale_replies: u64,
    /// Replies from nodes not monitored.
    pub unknown_node_replies: u64,
    /// Replies from dead nodes.
    pub dead_node_replies: u64,
    /// Replies for probe ids never sent.
    pub never_issued_replies: u64,
    /// Probes that timed out.
    pub misses: u64,
    /// Nodes declared dead.
    pub deaths: u64,
}

/// Why a probe is sent.
#[derive(Debug, Clone, Copy)]
enum Cause {
    Sampled,
    Interval,
    Idle,
}

/// One monitored node.
#[derive(Debug, Clone)]
struct Node {
    dead: bool,
    /// Packets forwarded since the last probe.
    since_probe: u32,
    last_probe: Option<Instant>,
    /// When the node was added: an idle probe is due then if it was never probed.
    added: Instant,
    /// Probes in flight with their send times, oldest first.
    outstanding: VecDeque<(ProbeId, Instant)>,
    consecutive_misses: u32,
    total_misses: u64,
    probes_sent: u64,
    replies: u64,
}

impl Node {
    fn new(now: Instant) -> Self {
        Self {
            dead: false,
            since_probe: 0,
            last_probe: None,
            added: now,
            outstanding: VecDeque::new(),
            consecutive_misses: 0,
            total_misses: 0,
            probes_sent: 0,
            replies: 0,
        }
    }

    /// When the next idle probe is due, if one can be sent.
    fn idle_due(&self, config: &HealthConfig) -> Option<Instant> {
        if self.outstanding.len() >= config.max_outstanding {
            return None;
        }
        match self.last_probe {
            None => Some(self.added),
            Some(t) => t.checked_add(config.idle_interval),
        }
    }
}

/// Sampled-heartbeat failure detector for the data nodes behind one steer node (see the
/// module docs for the calls and their order).
#[derive(Debug, Clone)]
pub struct HealthMonitor {
    config: HealthConfig,
    /// Ordered, so ticks produce probes and deaths in a deterministic order.
    nodes: BTreeMap<NodeId, Node>,
    next_probe: u64,
    /// The latest `now` seen.
    latest: Option<Instant>,
    /// Deaths not yet taken.
    dead: Vec<NodeId>,
    stats: HealthStats,
}

impl HealthMonitor {
    /// A monitor with no nodes, after validating `config`.
    pub fn new(config: HealthConfig) -> Result<Self, SteerError> {
        config.validate()?;
        Ok(Self {
            config,
            nodes: BTreeMap::new(),
            next_probe: 1,
            latest: None,
            dead: Vec::new(),
            stats: HealthStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &HealthConfig {
        &self.config
    }

    /// Starts monitoring `node` as alive, with no history; a node already monitored (alive
    /// or dead) starts over, and any death of it not yet taken is forgotten. Its first probe
    /// is due at once.
    pub fn add_node(&mut self, node: NodeId, now: Instant) {
        let now = self.clock(now);
        self.nodes.insert(node, Node::new(now));
        self.dead.retain(|&n| n != node);
    }

    /// Stops monitoring `node` (and forgets a death of it not yet taken); false if it was
    /// not monitored.
    pub fn remove_node(&mut self, node: NodeId) -> bool {
        self.dead.retain(|&n| n != node);
        self.nodes.remove(&node).is_some()
    }

    /// A packet is being forwarded to `node` at `now`: returns the probe it should carry, if
    /// one is due. `None` also for nodes not monitored or dead.
    pub fn on_forward(&mut self, node: NodeId, now: Instant) -> Option<ProbeId> {
        let now = self.clock(now);
        let config = self.config;
        let n = self.nodes.get_mut(&node)?;
        if n.dead {
            return None;
        }
        if expire(n, now, &config, &mut self.stats) {
            self.dead.push(node);
            return None;
        }
        n.since_probe = n.since_probe.saturating_add(1);
        let cause = if n.since_probe >= config.sample {
            Cause::Sampled
        } else if n
            .last_probe
            .is_none_or(|t| now.saturating_duration_since(t) >= config.min_interval)
        {
            Cause::Interval
        } else {
            return None;
        };
        self.issue(node, now, cause)
    }

    /// Time has come to `now`: notices timed-out probes of every node and returns the explicit
    /// probes to send to idle nodes, in node order.
    pub fn on_tick(&mut self, now: Instant) -> Vec<(NodeId, ProbeId)> {
        let now = self.clock(now);
        let config = self.config;
        let mut probes = Vec::new();
        let mut due = Vec::new();
        for (&id, n) in &mut self.nodes {
            if n.dead {
                continue;
            }
            if expire(n, now, &config, &mut self.stats) {
                self.dead.push(id);
                continue;
            }
            let idle = match n.last_probe {
                None => true,
                Some(t) => now.saturating_duration_since(t) >= config.idle_interval,
            };
            if idle {
                due.push(id);
            }
        }
        for id in due {
            if let Some(p) = self.issue(id, now, Cause::Idle) {
                probes.push((id, p));
            }
        }
        probes
    }

    /// A reply to `probe` came from `node` at `now`.
    pub fn on_reply(&mut self, node: NodeId, probe: ProbeId, now: Instant) -> ReplyOutcome {
        let now = self.clock(now);
        let config = self.config;
        let Some(n) = self.nodes.get_mut(&node) else {
            self.stats.unknown_node_replies += 1;
            return ReplyOutcome::UnknownNode;
        };
        if n.dead {
            self.stats.dead_node_replies += 1;
            return ReplyOutcome::NodeDead;
        }
        if expire(n, now, &config, &mut self.stats) {
            self.dead.push(node);
            self.stats.dead_node_replies += 1;
            return ReplyOutcome::NodeDead;
        }
        if let Some(i) = n.outstanding.iter().position(|&(p, _)| p == probe) {
            n.outstanding.remove(i);
            n.consecutive_misses = 0;
            n.replies += 1;
            self.stats.accepted_replies += 1;
            ReplyOutcome::Accepted
        } else if probe.0 == 0 || probe.0 >= self.next_probe {
            self.stats.never_issued_replies += 1;
            ReplyOutcome::NeverIssued
        } else {
            self.stats.stale_replies += 1;
            ReplyOutcome::Stale
        }
    }

    /// The nodes declared dead since the last call, in the order they died. Each death is
    /// reported once; the node stays dead until [`Self::add_node`].
    pub fn take_dead(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.dead)
    }

    /// When [`Self::on_tick`] next has something to do: the earliest probe timeout or idle
    /// probe over all live nodes (possibly already past). `None` without live nodes.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timeout = self.config.timeout;
        self.nodes
            .values()
            .filter(|n| !n.dead)
            .flat_map(|n| {
                let expiry = n
                    .outstanding
                    .front()
                    .and_then(|&(_, sent)| sent.checked_add(timeout));
                [expiry, n.idle_due(&self.config)]
            })
            .flatten()
            .min()
    }

    /// The health of `node`, if monitored.
    pub fn node_status(&self, node: NodeId) -> Option<NodeStatus> {
        self.nodes.get(&node).map(|n| NodeStatus {
            alive: !n.dead,
            consecutive_misses: n.consecutive_misses,
            total_misses: n.total_misses,
            outstanding: n.outstanding.len(),
            probes_sent: n.probes_sent,
            replies: n.replies,
            last_probe: n.last_probe,
        })
    }

    /// True if `node` is monitored and alive; `None` if not monitored.
    pub fn is_alive(&self, node: NodeId) -> Option<bool> {
        self.nodes.get(&node).map(|n| !n.dead)
    }

    /// The monitored nodes, ascending.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.keys().copied()
    }

    /// Counters over all nodes.
    pub fn stats(&self) -> HealthStats {
        self.stats
    }

    /// `now`, or the latest instant seen if `now` is earlier.
    fn clock(&mut self, now: Instant) -> Instant {
        let now = self.latest.map_or(now, |l| l.max(now));
        self.latest = Some(now);
        now
    }

    /// Sends a probe to `node` now, unless it has `max_outstanding` in flight.
    fn issue(&mut self, node: NodeId, now: Instant, cause: Cause) -> Option<ProbeId> {
        let n = self.nodes.get_mut(&node)?;
        if n.outstanding.len() >= self.config.max_outstanding {
            self.stats.suppressed_probes += 1;
            return None;
        }
        let id = ProbeId(self.next_probe);
        self.next_probe += 1;
        n.outstanding.push_back((id, now));
        n.last_probe = Some(now);
        n.since_probe = 0;
        n.probes_sent += 1;
        match cause {
            Cause::Sampled => self.stats.sampled_probes += 1,
            Cause::Interval => self.stats.interval_probes += 1,
            Cause::Idle => self.stats.idle_probes += 1,
        }
        Some(id)
    }
}

/// Counts the probes of `n` that timed out by `now` as misses; true if that made it dead.
fn expire(n: &mut Node, now: Instant, config: &HealthConfig, stats: &mut HealthStats) -> bool {
    while let Some(&(_, sent)) = n.outstanding.front() {
        if now.saturating_duration_since(sent) < config.timeout {
            break;
        }
        n.outstanding.pop_front();
        n.consecutive_misses += 1;
        n.total_misses += 1;
        stats.misses += 1;
        if n.consecutive_misses >= config.misses {
            n.dead = true;
            n.outstanding.clear();
            stats.deaths += 1;
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests;
