//! Dividing a tunnel's rate limit among the steer nodes that share its traffic (the paper's
//! §4.3 "Rate limiting" with several GINs and GENs behind ECMP).
//!
//! Each steer node enforces its own token buckets ([`crate::RateLimiters`]), so a tunnel
//! limited to `L` must get shares that add up to at most `L`, not `L` on every node. The
//! router in front of the steer nodes spreads a tunnel's flows as its hash decides (all of a
//! tunnel's inbound ESP has one outer 5-tuple and lands on one node; outbound VXLAN carries
//! one source port per inner flow and spreads), so the shares follow the traffic each node
//! reports, per direction:
//!
//! - [`RateShares::handle_report`] takes a steer node's report: per tunnel and direction, the
//!   bytes its limiter admitted and dropped during the interval. The node's *demand* is the
//!   offered rate (admitted + dropped); a node that dropped is held back by its share and its
//!   senders (TCP) backed off, so its demand counts as at least [`ShareConfig::probe_factor`]
//!   times what it carried. The estimate rises at once and falls by half per report (a short
//!   lull does not hand the share away).
//! - [`RateShares::shares`] divides `L` among the live steer nodes: each *wants* its demand
//!   plus [`ShareConfig::headroom_percent`], at least the floor ([`ShareConfig::floor_percent`]
//!   of an equal share `L / k`), and an equal share while it has not reported yet (it just
//!   joined). Wants are met max-min fairly (water-filling: nobody gets more than it wants while
//!   another gets less than its fair level), and what is left over goes out in proportion to
//!   the wants. The shares add up to at most `L`, every node gets at least the floor, and a
//!   single live node gets the whole `L`.
//!   A node that has not reported yet (it just joined), or whose reports carry no interval
//!   (a steer node that predates the division), gets an equal share and never more.
//! - [`RateShares::update`] moves what the nodes hold toward that division and returns the
//!   changed shares, one batch per node. It keeps what all nodes may enforce together
//!   ([`RateShares::committed`]) at most `L`: a lowered share counts at its old value until
//!   the node confirms it ([`RateShares::confirm`]), and a share grows only into what nobody
//!   may hold, so growth that waits for a lowering goes out in a later round. A share moves
//!   only by more than [`ShareConfig::hysteresis_percent`] (demand estimates move every
//!   report), unless the node set changed or a node that is dropping the tunnel's packets
//!   grows.
//! - [`RateShares::add_node`] and [`RateShares::node_lost`] follow the steer nodes' sessions.
//!   A lost node may still forward (partitioned from control, not from the router), so what
//!   it may hold stays reserved for [`ShareConfig::lost_grace`], and afterwards its fallback:
//!   every share carries one (the floor), to which the steer node drops on its own once its
//!   session has been down a while. A new node starts at an equal share of what is free.
//!
//! Each share comes with its own bucket depth, [`burst_bytes`] of the share. Pure: the caller
//! passes each report's interval and the time, and decides when to update (after each
//! report, each session change, and periodically to release growth and expire graces).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::ids::{NodeId, TunnelId};
use crate::rate::RateLimit;

/// Shortest bucket depth, bytes: two of iperf3's default 128 KiB writes (TCP sends a write
/// as one line-rate train, which a shallower bucket cuts short, and TCP then backs off far
/// below the limit).
pub const MIN_BURST_BYTES: u64 = 256 * 1024;

/// How long the bucket depth lasts at the rate: 20 ms.
const BURST_DIVISOR: u64 = 50;

/// The token bucket depth for a rate of `bits_per_second`: 20 ms at the rate, at least
/// [`MIN_BURST_BYTES`].
pub fn burst_bytes(bits_per_second: u64) -> u64 {
    (bits_per_second / 8 / BURST_DIVISOR).max(MIN_BURST_BYTES)
}

/// A direction of a tunnel's traffic through a steer node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// ESP from the peer toward the data nodes.
    Inbound,
    /// VXLAN from the cloud hosts toward the data nodes.
    Outbound,
}

impl Direction {
    /// Both directions.
    pub const ALL: [Direction; 2] = [Direction::Inbound, Direction::Outbound];

    fn index(self) -> usize {
        match self {
            Direction::Inbound => 0,
            Direction::Outbound => 1,
        }
    }
}

/// A tunnel's limit at one steer node, per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TunnelLimit {
    /// The limit of inbound ESP.
    pub inbound: RateLimit,
    /// The limit of outbound VXLAN.
    pub outbound: RateLimit,
}

impl TunnelLimit {
    /// The limit of `direction`.
    pub fn get(&self, direction: Direction) -> RateLimit {
        match direction {
            Direction::Inbound => self.inbound,
            Direction::Outbound => self.outbound,
        }
    }
}

impl From<RateLimit> for TunnelLimit {
    /// The same limit both ways.
    fn from(limit: RateLimit) -> Self {
        Self {
            inbound: limit,
            outbound: limit,
        }
    }
}

/// What a steer node's limiter did with one direction of a tunnel during a report interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Bytes admitted.
    pub admitted_bytes: u64,
    /// Bytes dropped for exceeding the node's share.
    pub dropped_bytes: u64,
}

/// A tunnel's traffic at one steer node during a report interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TunnelUsage {
    /// Inbound ESP.
    pub inbound: Usage,
    /// Outbound VXLAN.
    pub outbound: Usage,
}

impl TunnelUsage {
    fn get(&self, direction: Direction) -> Usage {
        match direction {
            Direction::Inbound => self.inbound,
            Direction::Outbound => self.outbound,
        }
    }
}

/// How shares follow demand (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareConfig {
    /// Every live steer node keeps at least this percentage of an equal share (`L / k`), so a
    /// node the router starts sending the tunnel to is not starved until its next report
    /// (default 10: with two nodes, 5 % of the limit). It is also the share a node falls back
    /// to once it lost control for longer than [`Self::lost_grace`]. At most 100.
    pub floor_percent: u64,
    /// A node may grow this much (percent) above its demand before its next report
    /// (default 25).
    pub headroom_percent: u64,
    /// A node that dropped the tunnel's packets counts as demanding at least this many times
    /// what it admitted (default 2): its senders backed off, so the offered rate understates
    /// what they would send.
    pub probe_factor: u64,
    /// A share is sent again only when it moves by more than this percentage of the one the
    /// node holds (default 10), unless the node set changed or (for a growing share) the node
    /// is dropping the tunnel's packets: demand estimates move every report, and a directive
    /// per tunnel and report would flood the steer nodes.
    pub hysteresis_percent: u64,
    /// How long a steer node whose session ended keeps its share reserved (it may still
    /// forward with it); afterwards only its fallback (the floor) stays reserved. The steer
    /// node falls back to that floor on its own after a shorter wait (default 5 s).
    pub lost_grace: Duration,
}

impl Default for ShareConfig {
    fn default() -> Self {
        Self {
            floor_percent: 10,
            headroom_percent: 25,
            probe_factor: 2,
            hysteresis_percent: 10,
            lost_grace: Duration::from_secs(5),
        }
    }
}

/// What a steer node holds of one tunnel's limit: its share each way, and the share it falls
/// back to once it lost control for longer than its grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// The share each way.
    pub limit: TunnelLimit,
    /// The fallback, bit/s, both ways (never above the share; 0: none, the node keeps its
    /// share — a steer node that predates fallbacks).
    pub fallback_bits_per_second: u64,
}

impl Share {
    /// What the node enforces once it falls back: per direction the lower of its share and
    /// the fallback.
    pub fn fallen_back(&self) -> TunnelLimit {
        if self.fallback_bits_per_second == 0 {
            return self.limit;
        }
        let f = self.fallback_bits_per_second;
        let lower = |l: RateLimit| {
            if l.bits_per_second <= f {
                l
            } else {
                RateLimit::new(f, burst_bytes(f))
            }
        };
        TunnelLimit {
            inbound: lower(self.limit.inbound),
            outbound: lower(self.limit.outbound),
        }
    }
}

/// One steer node's demand for one tunnel, per direction.
#[derive(Debug, Clone, Copy, Default)]
struct Demand {
    /// Bit/s.
    bps: [u64; 2],
    /// It dropped the tunnel's packets during the last report's interval.
    dropping: [bool; 2],
}

/// What control sent a node of one tunnel's limit, and the most the node may hold.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// The last share sent.
    sent: Share,
    /// Per direction the most the node may enforce (a share sent lower counts only once
    /// the node confirmed it), and the most its fallback may be (`u64::MAX`: it may have
    /// none).
    bound: [u64; 2],
    bound_fallback: u64,
}

/// One steer node.
#[derive(Debug, Clone, Default)]
struct NodeState {
    /// It has reported since it joined.
    reported: bool,
    /// Its reports carry no interval (a steer node that predates the division): it gets an
    /// equal share, the same both ways, and never falls back on its own.
    legacy: bool,
    /// Its session ended then (it may still forward with what it holds).
    lost_at: Option<Instant>,
    /// Its grace ran out (only its fallback stays reserved).
    expired: bool,
    /// Per tunnel, its demand.
    tunnels: BTreeMap<TunnelId, Demand>,
    /// Per tunnel, what it was sent and may hold.
    held: BTreeMap<TunnelId, Held>,
}

impl NodeState {
    fn live(&self) -> bool {
        self.lost_at.is_none()
    }

    /// The most it may enforce of `tunnel` in direction `i` (0 if it holds nothing).
    fn reserved(&self, tunnel: TunnelId, i: usize) -> u64 {
        self.reserved_when(tunnel, i, self.expired)
    }

    /// [`Self::reserved`], with its grace run out or not.
    fn reserved_when(&self, tunnel: TunnelId, i: usize, expired: bool) -> u64 {
        let Some(h) = self.held.get(&tunnel) else {
            return 0;
        };
        if expired && !self.legacy {
            h.bound[i].min(h.bound_fallback)
        } else {
            h.bound[i]
        }
    }
}

/// Changed shares for one steer node: one directive's worth.
pub type ShareBatch = (NodeId, Vec<(TunnelId, Share)>);

/// The steer nodes' demand per tunnel, what each was sent, and the division of limits it
/// implies (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct RateShares {
    config: ShareConfig,
    nodes: BTreeMap<NodeId, NodeState>,
    /// The node set changed since the last [`Self::update`] (its next round ignores the
    /// hysteresis).
    changed: bool,
}

impl RateShares {
    /// No steer nodes yet. A `floor_percent` above 100 counts as 100.
    pub fn new(mut config: ShareConfig) -> Self {
        config.floor_percent = config.floor_percent.min(100);
        Self {
            config,
            nodes: BTreeMap::new(),
            changed: false,
        }
    }

    /// The settings.
    pub fn config(&self) -> ShareConfig {
        self.config
    }

    /// A steer node is live (it joined, or came back): it starts at an equal share, with no
    /// demand known. A node already known starts over the same way, but what it was sent
    /// stays counted until it confirms its new shares (it may still hold them).
    pub fn add_node(&mut self, node: NodeId) {
        let n = self.nodes.entry(node).or_default();
        let fell_back = n.expired && !n.legacy;
        let mut held = std::mem::take(&mut n.held);
        // Its tables are sent again: with no more than it may hold now (after its grace, its
        // fallback), so that its growth is counted like anyone's.
        for h in held.values_mut() {
            if fell_back {
                for b in h.bound.iter_mut() {
                    *b = (*b).min(h.bound_fallback);
                }
            }
            let at_most = |l: RateLimit, bound: u64| {
                if l.bits_per_second <= bound {
                    l
                } else {
                    limit(bound)
                }
            };
            h.sent.limit = TunnelLimit {
                inbound: at_most(h.sent.limit.inbound, h.bound[0]),
                outbound: at_most(h.sent.limit.outbound, h.bound[1]),
            };
        }
        *n = NodeState {
            held,
            ..NodeState::default()
        };
        self.changed = true;
    }

    /// A steer node's session ended at `now`: it may still forward with what it holds, so its
    /// shares stay reserved for [`ShareConfig::lost_grace`], then its fallbacks (for as long
    /// as it stays lost). False if it was not live.
    pub fn node_lost(&mut self, node: NodeId, now: Instant) -> bool {
        match self.nodes.get_mut(&node).filter(|n| n.live()) {
            Some(n) => {
                n.lost_at = Some(now);
                self.changed = true;
                true
            }
            None => false,
        }
    }

    /// Forgets a node entirely (it is no steer node any more): nothing stays reserved for it.
    /// False if it was not known.
    pub fn remove_node(&mut self, node: NodeId) -> bool {
        self.changed |= self.nodes.contains_key(&node);
        self.nodes.remove(&node).is_some()
    }

    /// The live steer nodes, in id order.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .iter()
            .filter(|(_, n)| n.live())
            .map(|(&id, _)| id)
    }

    /// Takes `node`'s report covering `interval`: each tunnel's usage during it. Tunnels it
    /// does not mention count as carrying nothing. A zero interval marks a steer node that
    /// predates the division (it reports none): from then on it gets an equal share, the same
    /// both ways. False (and nothing changes) if the node is not live or the interval is zero.
    pub fn handle_report(
        &mut self,
        node: NodeId,
        interval: Duration,
        usage: impl IntoIterator<Item = (TunnelId, TunnelUsage)>,
    ) -> bool {
        let config = self.config;
        let Some(n) = self.nodes.get_mut(&node).filter(|n| n.live()) else {
            return false;
        };
        let nanos = interval.as_nanos();
        if nanos == 0 {
            if !n.legacy {
                n.legacy = true;
                self.changed = true;
            }
            return false;
        }
        let rate = |bytes: u64| -> u64 {
            let bps = u128::from(bytes) * 8 * 1_000_000_000 / nanos;
            u64::try_from(bps).unwrap_or(u64::MAX)
        };
        let mut samples: BTreeMap<TunnelId, Demand> = BTreeMap::new();
        for (tunnel, u) in usage {
            let s = samples.entry(tunnel).or_default();
            for dir in Direction::ALL {
                let Usage {
                    admitted_bytes,
                    dropped_bytes,
                } = u.get(dir);
                let mut demand = rate(admitted_bytes.saturating_add(dropped_bytes));
                if dropped_bytes > 0 {
                    demand = demand.max(rate(admitted_bytes).saturating_mul(config.probe_factor));
                }
                let i = dir.index();
                s.bps[i] = s.bps[i].max(demand);
                s.dropping[i] |= dropped_bytes > 0;
            }
        }
        // Rise at once, fall by half per report; forget tunnels that carry nothing.
        for (tunnel, old) in n.tunnels.iter_mut() {
            let new = samples.remove(tunnel).unwrap_or_default();
            for i in 0..2 {
                old.bps[i] = new.bps[i].max(old.bps[i] / 2);
            }
            old.dropping = new.dropping;
        }
        n.tunnels.extend(samples);
        n.tunnels.retain(|_, d| d.bps.iter().any(|&x| x > 0));
        n.reported = true;
        true
    }

    /// `node`'s demand estimate for `tunnel` in `direction`, bit/s (`None`: the node is not
    /// live or has not reported yet).
    pub fn demand(&self, node: NodeId, tunnel: TunnelId, direction: Direction) -> Option<u64> {
        let n = self.nodes.get(&node).filter(|n| n.live() && n.reported)?;
        Some(
            n.tunnels
                .get(&tunnel)
                .map_or(0, |d| d.bps[direction.index()]),
        )
    }

    /// The floor: [`ShareConfig::floor_percent`] of `total / k`.
    fn floor(&self, total: u64, k: u64) -> u64 {
        let equal = total.checked_div(k).unwrap_or(total);
        u64::try_from(u128::from(equal) * u128::from(self.config.floor_percent) / 100)
            .unwrap_or(u64::MAX)
    }

    /// The share of a tunnel limited to `bits_per_second` for a steer node outside the
    /// division (not live): the floor of an equal share counting it, the same both ways.
    pub fn outsider_share(&self, bits_per_second: u64) -> TunnelLimit {
        let k = self.nodes.len() as u64 + 1;
        let f = self.floor(bits_per_second, k).max(1);
        RateLimit::new(f, burst_bytes(f)).into()
    }

    /// True if `node`'s reports carry no interval (a steer node that predates the division,
    /// which reads one limit for both directions and knows no fallback).
    pub fn legacy(&self, node: NodeId) -> bool {
        self.nodes.get(&node).is_some_and(|n| n.legacy)
    }

    /// What `node` was last sent of `tunnel`'s limit (`None`: nothing yet).
    pub fn sent(&self, node: NodeId, tunnel: TunnelId) -> Option<Share> {
        Some(self.nodes.get(&node)?.held.get(&tunnel)?.sent)
    }

    /// Per direction, the most all steer nodes together may enforce of `tunnel` (live nodes
    /// what they were sent, until they confirm a lower share; lost ones what they may still
    /// hold at `now`). [`Self::update`] keeps it at most the tunnel's limit.
    pub fn committed(&self, tunnel: TunnelId, now: Instant) -> [u64; 2] {
        let mut sum = [0u64; 2];
        for n in self.nodes.values() {
            let expired = n.expired
                || n.lost_at
                    .is_some_and(|at| now >= at + self.config.lost_grace);
            for (i, s) in sum.iter_mut().enumerate() {
                *s = s.saturating_add(n.reserved_when(tunnel, i, expired));
            }
        }
        sum
    }

    /// Marks the lost nodes whose grace ran out by `now`; true if any did.
    fn expire(&mut self, now: Instant) -> bool {
        let grace = self.config.lost_grace;
        let mut any = false;
        for n in self.nodes.values_mut() {
            if !n.expired && n.lost_at.is_some_and(|at| now >= at + grace) {
                n.expired = true;
                any = true;
                // It fell back by now: should it come back, it holds at most its fallbacks.
                if !n.legacy {
                    for h in n.held.values_mut() {
                        for b in h.bound.iter_mut() {
                            *b = (*b).min(h.bound_fallback);
                        }
                    }
                }
            }
        }
        any
    }

    /// The target shares of a tunnel limited to `bits_per_second` at the live steer nodes
    /// (in id order), per direction, bit/s: what the lost nodes may hold is set aside, the
    /// rest divided (see the module docs).
    fn targets(&self, tunnel: TunnelId, bits_per_second: u64) -> Vec<(NodeId, [u64; 2])> {
        let live: Vec<(NodeId, &NodeState)> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.live())
            .map(|(&id, n)| (id, n))
            .collect();
        let k = live.len() as u64;
        if k == 0 {
            return Vec::new();
        }
        let mut divided = [Vec::new(), Vec::new()];
        for dir in Direction::ALL {
            let i = dir.index();
            let reserved: u64 = self
                .nodes
                .values()
                .filter(|n| !n.live())
                .map(|n| n.reserved(tunnel, i))
                .fold(0, u64::saturating_add);
            let total = bits_per_second.saturating_sub(reserved);
            let equal = total / k;
            let floor = self.floor(total, k);
            let (wants, capped): (Vec<u64>, Vec<bool>) = live
                .iter()
                .map(|(_, n)| {
                    // A newcomer, or a node that predates the division: an equal share,
                    // never more.
                    if !n.reported || n.legacy {
                        return (equal, true);
                    }
                    let d = n.tunnels.get(&tunnel).map_or(0, |d| d.bps[i]);
                    let grown =
                        u128::from(d) * u128::from(100 + self.config.headroom_percent) / 100;
                    (u64::try_from(grown).unwrap_or(u64::MAX).max(floor), false)
                })
                .unzip();
            divided[i] = divide_capped(total, &wants, &capped);
        }
        live.iter()
            .enumerate()
            .map(|(j, (id, n))| {
                let mut t = [divided[0][j], divided[1][j]];
                if n.legacy {
                    // It reads one limit for both directions.
                    let both = t[0].min(t[1]);
                    t = [both, both];
                }
                (*id, t)
            })
            .collect()
    }

    /// The target division of a tunnel's limit of `bits_per_second` among the live steer
    /// nodes (in id order), each direction on its own; each share with its bucket depth
    /// ([`burst_bytes`]). Targets add up to at most `bits_per_second` less what lost nodes may
    /// still hold, and are never 0. What the nodes are sent follows them through
    /// [`Self::update`].
    pub fn shares(&self, tunnel: TunnelId, bits_per_second: u64) -> Vec<(NodeId, TunnelLimit)> {
        self.targets(tunnel, bits_per_second)
            .into_iter()
            .map(|(node, t)| {
                (
                    node,
                    TunnelLimit {
                        inbound: limit(t[0]),
                        outbound: limit(t[1]),
                    },
                )
            })
            .collect()
    }

    /// `node`'s target share of a tunnel's limit of `bits_per_second` (see [`Self::shares`]);
    /// `None` if the node is not live.
    pub fn share(
        &self,
        node: NodeId,
        tunnel: TunnelId,
        bits_per_second: u64,
    ) -> Option<TunnelLimit> {
        self.shares(tunnel, bits_per_second)
            .into_iter()
            .find(|(n, _)| *n == node)
            .map(|(_, l)| l)
    }

    /// Moves what the live steer nodes hold toward the targets for the tunnels `limits`
    /// (tunnel, bit/s) at `now`, and returns the changed shares to send, one batch per node,
    /// nodes with a lowered share first. Tunnels not listed are forgotten (no limit).
    ///
    /// The sum of what every node may enforce ([`Self::committed`]) never exceeds a tunnel's
    /// limit: a lowered share counts only once the node confirmed it ([`Self::confirm`]), and
    /// a share grows only into what nobody may hold, so a growth that waits for a lowering
    /// comes in a later round (call again after confirmations). A share moves only by more
    /// than [`ShareConfig::hysteresis_percent`], unless the node set changed since the last
    /// round, or it grows for a node that is dropping the tunnel's packets, or the node holds
    /// nothing of the tunnel yet.
    pub fn update(&mut self, limits: &[(TunnelId, u64)], now: Instant) -> Vec<ShareBatch> {
        let force = std::mem::take(&mut self.changed) | self.expire(now);
        let hysteresis = self.config.hysteresis_percent;
        let moved = |from: u64, to: u64| {
            u128::from(from.abs_diff(to)) * 100 > u128::from(from) * u128::from(hysteresis)
        };
        let all = self.nodes.len() as u64;
        let mut batches: BTreeMap<NodeId, (bool, Vec<(TunnelId, Share)>)> = BTreeMap::new();
        for n in self.nodes.values_mut() {
            n.held.retain(|t, _| limits.iter().any(|(l, _)| l == t));
        }
        for &(tunnel, bps) in limits {
            let fallback = self.floor(bps, all).max(1);
            let targets = self.targets(tunnel, bps);
            // Per live node: the share to send per direction (None: unchanged), whether one
            // is lowered, whether it holds nothing of the tunnel yet.
            let mut next: BTreeMap<NodeId, ([Option<u64>; 2], bool, bool)> = BTreeMap::new();
            for &(node, target) in &targets {
                let n = &self.nodes[&node];
                let held = n.held.get(&tunnel);
                let mut out = [None, None];
                let mut lowered = false;
                for i in 0..2 {
                    let Some(h) = held else { continue };
                    let sent = dir_of(&h.sent.limit, i);
                    if target[i] < sent && (force || moved(sent, target[i])) {
                        out[i] = Some(target[i].max(1));
                        lowered = true;
                    }
                }
                next.insert(node, (out, lowered, held.is_none()));
            }
            // Growth, into what nobody may hold (lowered shares still count at their old
            // value).
            for i in 0..2 {
                let mut committed: u64 = self
                    .nodes
                    .values()
                    .map(|n| n.reserved(tunnel, i))
                    .fold(0, u64::saturating_add);
                for &(node, target) in &targets {
                    let fresh = next[&node].2;
                    let n = &self.nodes[&node];
                    let sent = match n.held.get(&tunnel) {
                        Some(h) if !fresh => dir_of(&h.sent.limit, i),
                        _ => 0,
                    };
                    let dropping = n.tunnels.get(&tunnel).is_some_and(|d| d.dropping[i]);
                    let grow = fresh
                        || (target[i] > sent && (force || dropping || moved(sent, target[i])));
                    if !grow {
                        continue;
                    }
                    let own = n.reserved(tunnel, i);
                    let free = bps.saturating_sub(committed.saturating_sub(own));
                    let give = target[i].min(free).max(1);
                    if !fresh && give <= sent {
                        continue;
                    }
                    next.get_mut(&node).expect("every target has an entry").0[i] = Some(give);
                    committed = committed.saturating_sub(own).saturating_add(give.max(own));
                    // Counted now so the next node's growth sees it.
                    let n = self.nodes.get_mut(&node).expect("a target is a known node");
                    let h = n.held.entry(tunnel).or_insert(Held {
                        sent: Share {
                            limit: limit(give).into(),
                            fallback_bits_per_second: 0,
                        },
                        bound: [0, 0],
                        bound_fallback: u64::MAX,
                    });
                    h.bound[i] = h.bound[i].max(give);
                }
            }
            for (node, (out, lowered, fresh)) in next {
                let n = self.nodes.get_mut(&node).expect("a target is a known node");
                let legacy = n.legacy;
                let Some(h) = n.held.get_mut(&tunnel) else {
                    continue;
                };
                let fb = if legacy { 0 } else { fallback };
                let fallback_moved = h.sent.fallback_bits_per_second != fb && force;
                if out == [None, None] && !fallback_moved && !fresh {
                    continue;
                }
                let mut bps_each = [0u64; 2];
                for (i, b) in bps_each.iter_mut().enumerate() {
                    *b = out[i].unwrap_or_else(|| dir_of(&h.sent.limit, i));
                    if *b == 0 {
                        *b = 1;
                    }
                }
                if legacy {
                    let both = bps_each[0].min(bps_each[1]);
                    bps_each = [both, both];
                }
                let share = Share {
                    limit: TunnelLimit {
                        inbound: limit(bps_each[0]),
                        outbound: limit(bps_each[1]),
                    },
                    fallback_bits_per_second: fb,
                };
                if share == h.sent && !fresh {
                    continue;
                }
                h.sent = share;
                for (i, b) in h.bound.iter_mut().enumerate() {
                    *b = (*b).max(bps_each[i]);
                }
                h.bound_fallback = h.bound_fallback.max(if fb == 0 { u64::MAX } else { fb });
                let e = batches.entry(node).or_default();
                e.0 |= lowered;
                e.1.push((tunnel, share));
            }
        }
        let mut out: Vec<(bool, ShareBatch)> = batches
            .into_iter()
            .map(|(node, (lowered, list))| (lowered, (node, list)))
            .collect();
        // Lowered shares go out first.
        out.sort_by_key(|(lowered, (node, _))| (!*lowered, *node));
        out.into_iter().map(|(_, b)| b).collect()
    }

    /// `node` confirmed it holds `share` of `tunnel`: if that is the last share it was sent,
    /// it holds no more than that from now on (a lowered share frees the rest).
    pub fn confirm(&mut self, node: NodeId, tunnel: TunnelId, share: Share) {
        let Some(h) = self
            .nodes
            .get_mut(&node)
            .and_then(|n| n.held.get_mut(&tunnel))
        else {
            return;
        };
        // Only ever narrower: a late confirmation must not undo a grace that ran out.
        if h.sent == share {
            h.bound[0] = h.bound[0].min(share.limit.inbound.bits_per_second);
            h.bound[1] = h.bound[1].min(share.limit.outbound.bits_per_second);
            h.bound_fallback = h.bound_fallback.min(match share.fallback_bits_per_second {
                0 => u64::MAX,
                f => f,
            });
        }
    }
}

/// A share of `bps` (at least 1 bit/s: 0 means no limit) with its bucket depth.
fn limit(bps: u64) -> RateLimit {
    let bps = bps.max(1);
    RateLimit::new(bps, burst_bytes(bps))
}

/// Direction `i`'s rate of `l`.
fn dir_of(l: &TunnelLimit, i: usize) -> u64 {
    if i == 0 {
        l.inbound.bits_per_second
    } else {
        l.outbound.bits_per_second
    }
}

/// [`divide`], except that `capped` entries get at most their want: what is left over goes
/// to the others only (in proportion to their wants; equally if they want nothing), and stays
/// undivided if every entry is capped.
pub fn divide_capped(total: u64, wants: &[u64], capped: &[bool]) -> Vec<u64> {
    let mut out = water_fill(total, wants);
    let left = total - out.iter().sum::<u64>();
    let open: Vec<usize> = (0..wants.len()).filter(|&i| !capped[i]).collect();
    if left > 0 && !open.is_empty() {
        let sum: u128 = open.iter().map(|&i| u128::from(wants[i])).sum();
        for &i in &open {
            let extra = match (u128::from(left) * u128::from(wants[i])).checked_div(sum) {
                Some(by_want) => by_want,
                None => u128::from(left) / open.len() as u128,
            };
            out[i] += u64::try_from(extra).expect("a part of `left` fits in u64");
        }
    }
    out
}

/// Max-min fair division of `total` up to each want (water-filling).
fn water_fill(total: u64, wants: &[u64]) -> Vec<u64> {
    let k = wants.len();
    let mut out = vec![0u64; k];
    let mut order: Vec<usize> = (0..k).collect();
    order.sort_by_key(|&i| (wants[i], i));
    let mut left = total;
    for (served, &i) in order.iter().enumerate() {
        let level = left / (k - served) as u64;
        let give = wants[i].min(level);
        out[i] = give;
        left -= give;
    }
    out
}

/// Divides `total` among `wants`: max-min fairly up to each want (water-filling), then what is
/// left in proportion to the wants (equally if all want nothing). The result adds up to at
/// most `total`; every entry gets at least `min(want, total / wants.len())`.
pub fn divide(total: u64, wants: &[u64]) -> Vec<u64> {
    divide_capped(total, wants, &vec![false; wants.len()])
}

#[cfg(test)]
mod tests;
