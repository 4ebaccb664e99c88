//! Self-dispatch in the distributed form (issue 19, `[cluster.dispatch] mode = "self"`): the
//! ring of data nodes, who owns each virtual MAC of every VNet, and each data node's table.
//!
//! The ring's agents (`dispatch::Agent`, Algorithm 5) run here, one per data node and VNet,
//! fed by the nodes' reports (the busy fraction of their workers, charged to the VNets by
//! their virtual MACs' part of the node's packets, and each owned virtual MAC's frames); their
//! messages (loads to the predecessor every `T_L`, offers and
//! acknowledgements) are delivered between them in this process. What the data nodes see of
//! it is their table ([`Directive::SetDispatch`]), one per node, built by one rule that makes
//! every hand-over lossless, whatever caused it (a move, a join, a node that leaves):
//!
//! > a node keeps a virtual MAC it gives away until the new owner confirmed a table in
//! > which it owns it.
//!
//! So the new owner answers and processes first; the old one then lets go and sends the
//! frames still arriving for it on to the new owner until none came for `linger` (its data
//! path does that when a table takes a virtual MAC away). A failed node's virtual MACs go to
//! its successor at once (nobody else is sending them anywhere).
//!
//! Membership: the ring is the live data nodes that announced a VTEP and are neither parked,
//! draining nor leaving, in id order, once they hold a CHILD_SA of every spread tunnel that is
//! up (one per node; see [`ClusterCore::spread`]). A node that joins takes an even share at
//! once, an equal
//! part of each other node's virtual MACs (their hosts re-learn from its announcements); one
//! that fails is replaced by its successor; one that is drained hands its virtual MACs to its
//! successor as a move does. A new active control node starts again from Algorithm 1's
//! partition; it does not know the nodes' tables, so they move to it at once (the old owners
//! send late frames on until the hosts have moved).

use super::{Await, ClusterCore, Directive, Role};
use control::config::{ClusterDispatch, DispatchMode};
use datapath::{DispatchConfig, VnetOwners};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::time::Instant;
use tracing::{info, warn};
use wire::EspSpi;

/// How many moves `protego ctl dispatch show` lists.
const MOVES_KEPT: usize = 32;

/// Per VNI, the owner (a node id) of each virtual MAC.
pub type Owners = BTreeMap<u32, Vec<u32>>;

/// One change of owners, for `protego ctl dispatch show`.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchMove {
    /// When.
    pub at: Instant,
    /// The VNet.
    pub vni: u32,
    /// From which node (None: a node that joined took its share from every node).
    pub from: Option<u32>,
    /// To which node.
    pub to: u32,
    /// How many virtual MACs.
    pub vmacs: usize,
    /// Why: `"load"` (Algorithm 5), `"join"`, `"failed"`, `"left"`.
    pub why: &'static str,
    /// The two nodes' loads for this VNet when the move was decided (load moves).
    pub loads: Option<(f64, f64)>,
}

/// How long a CHILD_SA asked for may take before it counts as lost and is asked for again
/// (the engine retransmits a CREATE_CHILD_SA for longer than this only over a link that lost
/// several in a row; an answer comes in milliseconds).
const ADD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The CHILD_SAs of one spread tunnel asked for and not answered yet (neither installed nor
/// refused), so that a slow peer is not asked for more than the nodes miss.
#[derive(Debug, Clone, Copy)]
struct Adding {
    /// How many.
    asked: usize,
    /// When the last were asked for.
    at: Instant,
    /// After a refusal: none asked for before this.
    not_before: Option<Instant>,
}

/// A table sent to a node, awaiting its answer.
#[derive(Debug, Clone)]
struct Pending {
    token: u64,
    node: u32,
    owners: Owners,
}

/// The control node's self-dispatch state (see the module's doc).
#[derive(Debug, Default)]
pub struct DispatchState {
    /// `[cluster.dispatch]`; None until set (steer mode).
    pub(crate) settings: Option<ClusterDispatch>,
    /// The ring, in order.
    pub(crate) ring: Vec<u32>,
    /// Per VNI, per ring node, its agent.
    agents: BTreeMap<u32, BTreeMap<u32, dispatch::Agent>>,
    /// Per node, the owners of the table last sent to it.
    sent: HashMap<u32, Owners>,
    /// Per node, the owners of the last table it confirmed.
    held: HashMap<u32, Owners>,
    /// Tables awaiting their answer.
    pending: Vec<Pending>,
    /// Per node, the cumulative frames of each virtual MAC of its last report.
    packets: HashMap<u32, BTreeMap<(u32, u16), u64>>,
    /// Per node and VNI, the load last fed to its agent.
    loads: HashMap<u32, BTreeMap<u32, f64>>,
    moves: VecDeque<DispatchMove>,
    /// Some node's table may have changed since the tables were last built.
    dirty: bool,
    /// Per spread tunnel, the CHILD_SAs asked for and not answered yet.
    adding: HashMap<ike::TunnelId, Adding>,
    /// Spread tunnels whose peer takes no more CHILD_SAs (TS_MAX_QUEUE, NO_ADDITIONAL_SAS),
    /// with how many they held then: none is asked for until they hold fewer (a rekey frees
    /// no place on the peer).
    capped: HashMap<ike::TunnelId, usize>,
    /// CHILD_SAs of lost nodes whose deletion was asked for (not rekeyed meanwhile).
    pub(crate) deleting: std::collections::HashSet<EspSpi>,
    /// Nodes that restarted: they join the ring again only once they hold the CHILD_SAs.
    rejoin: std::collections::HashSet<u32>,
    /// Nodes that refused a table, and when: sent one again after [`super::REKEY_RETRY`].
    refused: HashMap<u32, Instant>,
}

impl DispatchState {
    fn settings(&self) -> Option<&ClusterDispatch> {
        self.settings
            .as_ref()
            .filter(|s| s.mode == DispatchMode::SelfDispatch)
    }

    /// The owner of every virtual MAC of every VNet as the agents have it (during an offer
    /// both nodes own it: the taker counts).
    pub fn owners(&self) -> Owners {
        self.agents
            .iter()
            .map(|(vni, agents)| {
                let k = agents.values().next().map_or(0, |a| a.owners().len());
                let mut owners = vec![u32::MAX; k];
                for (id, a) in agents {
                    for &v in a.node().owned() {
                        let o = &mut owners[usize::from(v)];
                        if *o == u32::MAX || a.node().offered().binary_search(&v).is_err() {
                            *o = *id;
                        }
                    }
                }
                (*vni, owners)
            })
            .collect()
    }

    fn remember(&mut self, m: DispatchMove) {
        if self.moves.len() == MOVES_KEPT {
            self.moves.pop_front();
        }
        self.moves.push_back(m);
    }
}

/// What `protego ctl dispatch show` shows.
#[derive(Debug, Clone)]
pub struct DispatchStatus {
    /// `"steer"` or `"self"`.
    pub mode: &'static str,
    /// `K`.
    pub vmacs: u32,
    /// The ring, in order.
    pub ring: Vec<u32>,
    /// Per VNI, per node, how many virtual MACs it owns.
    pub owned: BTreeMap<u32, BTreeMap<u32, usize>>,
    /// Per node, per VNI, its load (a fraction of the node's capacity) as last reported.
    pub loads: BTreeMap<u32, BTreeMap<u32, f64>>,
    /// Nodes whose latest table is not confirmed yet.
    pub unconfirmed: Vec<u32>,
    /// The last moves, oldest first, with how long ago each was.
    pub moves: Vec<(std::time::Duration, DispatchMove)>,
}

impl ClusterCore {
    /// Sets `[cluster.dispatch]` (steer mode until called).
    pub fn set_dispatch_settings(&mut self, settings: ClusterDispatch, now: Instant) {
        self.dispatch.settings = Some(settings);
        self.dispatch_update(now);
    }

    /// The data nodes that may serve the dispatched VNets: live, with a VTEP, neither
    /// parked, draining nor leaving, by id. Each gets a CHILD_SA of every spread tunnel.
    fn dispatch_candidates(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter(|(_, n)| {
                n.role == Role::Data
                    && n.alive
                    && n.session_open
                    && n.vtep.is_some()
                    && !n.parked
                    && !n.draining
                    && !n.leaving
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// The ring: the candidates that hold a CHILD_SA of every spread tunnel that is up (a node
    /// joins once it can seal what its virtual MACs will bring; before any tunnel is up every
    /// candidate is in). A node in the ring stays while a new tunnel's CHILD_SA is on its way
    /// to it, but not for a tunnel whose peer takes no more (capped): none will come, and
    /// what its virtual MACs bring for that tunnel could not be sealed there.
    fn dispatch_ring(&self) -> Vec<u32> {
        let up: Vec<ike::TunnelId> = self
            .tunnels
            .keys()
            .copied()
            .filter(|t| self.spread_vnet(*t))
            .filter(|t| {
                self.children.values().any(|c| {
                    c.tunnel == *t
                        && c.node
                            .is_some_and(|n| self.nodes.get(&n).is_some_and(|e| e.alive))
                })
            })
            .collect();
        self.dispatch_candidates()
            .into_iter()
            .filter(|id| {
                let stays = self.dispatch.ring.contains(id) && !self.dispatch.rejoin.contains(id);
                up.iter().all(|t| {
                    (stays && !self.dispatch.capped.contains_key(t))
                        || self.children.iter().any(|(spi, c)| {
                            c.tunnel == *t
                                && c.node == Some(*id)
                                && !self.dispatch.deleting.contains(spi)
                        })
                })
            })
            .collect()
    }

    /// Brings the ring, the agents and the nodes' tables up to date: membership, the VNets,
    /// the agents' messages (`now` drives their clocks), and every node's table.
    pub(crate) fn dispatch_update(&mut self, now: Instant) {
        let Some(settings) = self.dispatch.settings().cloned() else {
            return;
        };
        let ring = self.dispatch_ring();
        let vnis: Vec<u32> = self.gateways.keys().copied().collect();
        let d = &mut self.dispatch;
        d.rejoin.retain(|id| !ring.contains(id));
        // VNets gone, and VNets new or the first ring: Algorithm 1's partition.
        let before = d.agents.len();
        d.agents.retain(|vni, _| vnis.contains(vni));
        d.dirty |= d.agents.len() != before;
        if ring != d.ring {
            let old = std::mem::replace(&mut d.ring, ring.clone());
            let left: Vec<u32> = old.iter().copied().filter(|n| !ring.contains(n)).collect();
            let joined: Vec<u32> = ring.iter().copied().filter(|n| !old.contains(n)).collect();
            info!(ring = ?ring, left = ?left, joined = ?joined, "self-dispatch ring changed");
            d.dirty = true;
            for vni in d.agents.keys().copied().collect::<Vec<_>>() {
                Self::ring_changed(d, &settings, vni, &old, &ring, &left, &joined, now, |id| {
                    self.nodes
                        .get(&id)
                        .is_some_and(|n| n.alive && n.session_open)
                });
            }
        }
        if !ring.is_empty() {
            for &vni in &vnis {
                if d.agents.contains_key(&vni) {
                    continue;
                }
                let mut agents = BTreeMap::new();
                for &id in &ring {
                    match dispatch::Agent::new(
                        id,
                        settings.ring,
                        ring.clone(),
                        settings.vmacs,
                        now,
                        u64::from(vni),
                    ) {
                        Ok(a) => {
                            agents.insert(id, a);
                        }
                        Err(e) => warn!(vni, error = %e, "cannot start the ring of a VNet"),
                    }
                }
                d.agents.insert(vni, agents);
                d.dirty = true;
            }
        }
        // The agents' clocks and messages.
        let mut moves = Vec::new();
        for (vni, agents) in &mut d.agents {
            let mut mail: VecDeque<(u32, u32, dispatch::Msg)> = VecDeque::new();
            for (id, a) in agents.iter_mut() {
                mail.extend(a.tick(now).into_iter().map(|(to, m)| (*id, to, m)));
            }
            while let Some((from, to, msg)) = mail.pop_front() {
                if let dispatch::Msg::Offer { vmacs, .. } = &msg {
                    let loads = agents.get(&from).map(|a| a.node().loads());
                    moves.push(DispatchMove {
                        at: now,
                        vni: *vni,
                        from: Some(from),
                        to,
                        vmacs: vmacs.len(),
                        why: "load",
                        loads: loads.map(|(mine, theirs)| (mine, theirs.unwrap_or(f64::NAN))),
                    });
                    info!(
                        vni,
                        from,
                        to,
                        vmacs = vmacs.len(),
                        "self-dispatch: virtual MACs move along the ring"
                    );
                }
                if let Some(a) = agents.get_mut(&to) {
                    mail.extend(
                        a.receive(now, from, msg)
                            .into_iter()
                            .map(|(t, m)| (to, t, m)),
                    );
                }
            }
            for a in agents.values_mut() {
                d.dirty |= a.take_changed();
            }
        }
        for m in moves {
            d.remember(m);
        }
        // Nodes that refused a table get one again once the retry interval is over.
        let before = d.refused.len();
        d.refused
            .retain(|_, at| now.saturating_duration_since(*at) < super::REKEY_RETRY);
        d.dirty |= d.refused.len() != before;
        if std::mem::take(&mut d.dirty) {
            self.dispatch_send();
        }
        self.spread_children(now);
        self.spread_retire();
    }

    /// Live data nodes out of the ring (drained, parked, leaving) whose own confirmed table
    /// gives them no virtual MAC any more: their CHILD_SAs of spread tunnels are deleted with
    /// the peer, as those of a lost node, once the tunnel has one on a node of the ring.
    fn spread_retire(&mut self) {
        let candidates = self.dispatch_candidates();
        let ring = &self.dispatch.ring;
        // Not a node that is joining (a candidate out of the ring until it holds every
        // tunnel's CHILD_SA): only one that may not serve (drained, parked, leaving).
        let retired: Vec<u32> = self
            .nodes
            .iter()
            .filter(|(id, n)| n.role == Role::Data && n.alive && !candidates.contains(id))
            .filter(|(id, _)| {
                !self.dispatch.pending.iter().any(|p| p.node == **id)
                    && self
                        .dispatch
                        .held
                        .get(id)
                        .is_none_or(|h| h.values().all(|o| !o.contains(id)))
            })
            .map(|(id, _)| *id)
            .collect();
        let mut delete = Vec::new();
        for id in retired {
            for (spi, c) in &self.children {
                if c.node != Some(id)
                    || self.dispatch.deleting.contains(spi)
                    || !self.spread(c.tunnel)
                {
                    continue;
                }
                let elsewhere = self.children.values().any(|o| {
                    o.tunnel == c.tunnel && o.node.is_some_and(|n| n != id && ring.contains(&n))
                });
                if elsewhere {
                    delete.push((c.tunnel, *spi, id));
                }
            }
        }
        for (t, spi, id) in delete {
            info!(node = id, tunnel = t.0, spi_in = %spi, "deleting the CHILD_SA of a data node out of the self-dispatch ring");
            self.dispatch.deleting.insert(spi);
            self.outbox.delete_children.push((t, spi));
        }
    }

    /// True if `tunnel`'s CHILD_SAs are spread over the ring, one per node (issue 19 §2):
    /// self-dispatch is on, the tunnel's VNet is dispatched and the ring has a node. Each node
    /// then seals what the VMs of its virtual MACs send with a CHILD_SA of its own.
    pub fn spread(&self, tunnel: ike::TunnelId) -> bool {
        self.spread_vnet(tunnel) && !self.dispatch_candidates().is_empty()
    }

    /// Self-dispatch is on and `tunnel`'s VNet is dispatched.
    fn spread_vnet(&self, tunnel: ike::TunnelId) -> bool {
        self.dispatch.settings().is_some()
            && self
                .tunnels
                .get(&tunnel)
                .and_then(|t| t.vni)
                .is_some_and(|vni| self.gateways.contains_key(&vni))
    }

    /// The data node for a new CHILD_SA of a spread tunnel: a rekey stays on the node of the
    /// CHILD_SA it replaces (if that node is in the ring); another goes to the first node of
    /// the ring that holds none of the tunnel's (nor has one on its way), else to the one with
    /// the fewest.
    pub(crate) fn spread_node(&self, child: &super::NewChild) -> Option<u32> {
        let candidates = self.dispatch_candidates();
        if let Some(r) = child.replaces.and_then(|r| self.children.get(&r)) {
            if let Some(n) = r.node.or(r.installing).filter(|n| candidates.contains(n)) {
                return Some(n);
            }
        }
        let held = self.spread_held(child.tunnel);
        // The ring's nodes first (the first CHILD_SA of a tunnel goes where frames arrive).
        candidates.iter().copied().min_by_key(|n| {
            (
                held.get(n).copied().unwrap_or(0),
                !self.dispatch.ring.contains(n),
                *n,
            )
        })
    }

    /// How many of `tunnel`'s CHILD_SAs each live node holds or is installing.
    fn spread_held(&self, tunnel: ike::TunnelId) -> HashMap<u32, usize> {
        let mut held: HashMap<u32, usize> = HashMap::new();
        for c in self.children.values().filter(|c| c.tunnel == tunnel) {
            if let Some(n) = c
                .node
                .or(c.installing)
                .filter(|n| self.nodes.get(n).is_some_and(|e| e.alive))
            {
                *held.entry(n).or_default() += 1;
            }
        }
        held
    }

    /// True if the CHILD_SA with this inbound SPI is being deleted (its node was lost): it is
    /// not rekeyed elsewhere.
    pub(crate) fn spread_deleting(&self, spi: EspSpi) -> bool {
        self.dispatch.deleting.contains(&spi)
    }

    /// Asks the control loop for the CHILD_SAs the spread tunnels miss: one per candidate
    /// node that holds none, for tunnels that have one already (an established IKE SA), less
    /// those asked for and not answered yet. A request unanswered after [`ADD_TIMEOUT`] counts
    /// as lost; after a refusal none is asked for during [`super::REKEY_RETRY`].
    fn spread_children(&mut self, now: Instant) {
        if self.dispatch.settings().is_none() {
            return;
        }
        let tunnels: Vec<ike::TunnelId> = self.tunnels.keys().copied().collect();
        let mut ask = Vec::new();
        for t in tunnels {
            if !self.spread(t) {
                self.dispatch.adding.remove(&t);
                continue;
            }
            let held = self.spread_held(t);
            if held.is_empty() {
                // Down (its IKE SA went with what was asked for on it): start afresh.
                self.dispatch.adding.remove(&t);
                self.dispatch.capped.remove(&t);
                continue;
            }
            if let Some(&cap) = self.dispatch.capped.get(&t) {
                if held.values().sum::<usize>() >= cap {
                    continue;
                }
                // One is gone: the peer may take another.
                self.dispatch.capped.remove(&t);
            }
            let missing = self
                .dispatch_candidates()
                .iter()
                .filter(|n| !held.contains_key(n))
                .count();
            if missing == 0 {
                self.dispatch.adding.remove(&t);
                continue;
            }
            let adding = self.dispatch.adding.get(&t).copied();
            if adding.and_then(|a| a.not_before).is_some_and(|nb| now < nb) {
                continue;
            }
            let in_flight = adding
                .filter(|a| now.saturating_duration_since(a.at) < ADD_TIMEOUT)
                .map_or(0, |a| a.asked);
            let more = missing.saturating_sub(in_flight);
            if more == 0 {
                continue;
            }
            self.dispatch.adding.insert(
                t,
                Adding {
                    asked: in_flight + more,
                    at: now,
                    not_before: None,
                },
            );
            info!(
                tunnel = t.0,
                missing,
                asking = more,
                "asking for CHILD_SAs for the data nodes of a spread tunnel"
            );
            ask.extend(std::iter::repeat_n(t, more));
        }
        self.outbox.add_children.extend(ask);
        let tunnels = &self.tunnels;
        self.dispatch.adding.retain(|t, _| tunnels.contains_key(t));
        self.dispatch.capped.retain(|t, _| tunnels.contains_key(t));
    }

    /// The peer of `tunnel` refused a CHILD_SA we asked for (`no_more`: for good, with
    /// TS_MAX_QUEUE, RFC 9611, or NO_ADDITIONAL_SAS). One asked for less is in flight; none
    /// is asked for during [`super::REKEY_RETRY`], or, for good, until the tunnel holds fewer
    /// CHILD_SAs than now: the candidates still without one of its CHILD_SAs then leave the
    /// ring (they could not seal its traffic). A refusal while the tunnel holds none is that
    /// of IKE_AUTH's first CHILD_SA, not asked for here, and changes nothing.
    pub fn handle_child_refused(&mut self, tunnel: ike::TunnelId, no_more: bool, now: Instant) {
        let held: usize = self.spread_held(tunnel).values().sum();
        if held == 0 {
            // The first CHILD_SA of IKE_AUTH (not asked for here; the tunnel is not up).
            return;
        }
        if let Some(a) = self.dispatch.adding.get_mut(&tunnel) {
            a.asked = a.asked.saturating_sub(1);
            a.not_before = Some(now + super::REKEY_RETRY);
        }
        if no_more && self.dispatch.capped.insert(tunnel, held).is_none() {
            warn!(
                tunnel = tunnel.0,
                held, "the peer takes no more CHILD_SAs of this tunnel: not asking for more until it holds fewer"
            );
        }
    }

    /// A new CHILD_SA of `tunnel` (not a rekey) was installed: one asked for less is in
    /// flight (the peer's own count too: it then serves a node that missed one).
    pub(crate) fn spread_answered(&mut self, tunnel: ike::TunnelId) {
        if let Some(a) = self.dispatch.adding.get_mut(&tunnel) {
            a.asked = a.asked.saturating_sub(1);
        }
    }

    /// Data node `id` was lost: the CHILD_SAs it held of spread tunnels are deleted with the
    /// peer (which then sends on another of the tunnel's), not rekeyed: the tunnel's other
    /// nodes hold their own. Returns the tunnels that had one there.
    pub(crate) fn spread_lost(&mut self, id: u32) -> Vec<ike::TunnelId> {
        let others = |t: ike::TunnelId| {
            self.spread_held(t)
                .keys()
                .any(|n| *n != id && self.dispatch.ring.contains(n))
        };
        let lost: Vec<(EspSpi, ike::TunnelId)> = self
            .children
            .iter()
            .filter(|(_, c)| {
                c.last_node == Some(id)
                    && c.node.is_none()
                    && self.spread(c.tunnel)
                    && others(c.tunnel)
            })
            .map(|(spi, c)| (*spi, c.tunnel))
            .collect();
        let mut tunnels: Vec<ike::TunnelId> = lost.iter().map(|(_, t)| *t).collect();
        tunnels.sort_unstable();
        tunnels.dedup();
        if !lost.is_empty() {
            warn!(
                node = id,
                children = lost.len(),
                "deleting the CHILD_SAs a lost data node held of spread tunnels"
            );
        }
        for (spi, t) in lost {
            self.dispatch.deleting.insert(spi);
            self.outbox.delete_children.push((t, spi));
        }
        tunnels
    }

    /// The ring of one VNet's agents changed from `old` to `ring`: the virtual MACs of the
    /// nodes that `left` go to their successor (in `old`, among those that stay); the nodes
    /// that `joined` take an equal part of every other node's.
    #[allow(clippy::too_many_arguments)]
    fn ring_changed(
        d: &mut DispatchState,
        settings: &ClusterDispatch,
        vni: u32,
        old: &[u32],
        ring: &[u32],
        left: &[u32],
        joined: &[u32],
        now: Instant,
        alive: impl Fn(u32) -> bool,
    ) {
        let Some(agents) = d.agents.get_mut(&vni) else {
            return;
        };
        if ring.is_empty() {
            // Nobody to give them to: the next ring starts from the partition.
            d.agents.remove(&vni);
            return;
        }
        let mut owners: Vec<u32> = {
            let k = settings.vmacs as usize;
            let mut o = vec![u32::MAX; k];
            for (id, a) in agents.iter() {
                for &v in a.node().owned() {
                    o[usize::from(v)] = *id;
                }
            }
            o
        };
        let mut moved: Vec<DispatchMove> = Vec::new();
        // Leavers: to the next node of the old ring that stays.
        for &gone in left {
            let Some(at) = old.iter().position(|&n| n == gone) else {
                continue;
            };
            let Some(successor) = (1..old.len())
                .map(|step| old[(at + step) % old.len()])
                .find(|n| ring.contains(n))
            else {
                continue;
            };
            let mut n = 0;
            for o in owners.iter_mut().filter(|o| **o == gone) {
                *o = successor;
                n += 1;
            }
            agents.remove(&gone);
            let why = if alive(gone) { "left" } else { "failed" };
            warn!(
                vni,
                node = gone,
                successor,
                vmacs = n,
                why,
                "self-dispatch: a node's virtual MACs go to its successor"
            );
            moved.push(DispatchMove {
                at: now,
                vni,
                from: Some(gone),
                to: successor,
                vmacs: n,
                why,
                loads: None,
            });
        }
        // Unowned ones (a first ring of a node that had none): the first node.
        for o in owners.iter_mut().filter(|o| !ring.contains(o)) {
            *o = ring[0];
        }
        // Joiners: an equal part of every other node's.
        for &new in joined {
            let share = ring.len();
            let mut took = 0;
            for &other in ring.iter().filter(|&&n| n != new && !joined.contains(&n)) {
                let theirs: Vec<usize> = owners
                    .iter()
                    .enumerate()
                    .filter(|(_, o)| **o == other)
                    .map(|(i, _)| i)
                    .collect();
                // The highest indices: contiguous ranges stay contiguous.
                for &i in theirs.iter().rev().take(theirs.len() / share) {
                    owners[i] = new;
                    took += 1;
                }
            }
            moved.push(DispatchMove {
                at: now,
                vni,
                from: None,
                to: new,
                vmacs: took,
                why: "join",
                loads: None,
            });
        }
        // The agents again, from these owners (an offer under way ends: the owners above give
        // its virtual MACs to the node that offered them, which had not let go yet).
        agents.clear();
        for &id in ring {
            match dispatch::Agent::with_owners(
                id,
                settings.ring,
                ring.to_vec(),
                owners.clone(),
                now,
                u64::from(vni),
            ) {
                Ok(a) => {
                    agents.insert(id, a);
                }
                Err(e) => warn!(vni, node = id, error = %e, "cannot restart a ring agent"),
            }
        }
        for m in moved {
            d.remember(m);
        }
    }

    /// A data node's report: its load for each VNet and each virtual MAC's frames, to its
    /// agents. A VNet's load is the busy fraction of the node's workers times its virtual
    /// MACs' part of the packets the node handled (`tunnel_packets`, both ways, or their
    /// frames if more): what the node spends on other work, e.g. opening everything a peer
    /// sends on the CHILD_SA it holds, is not charged to virtual MACs, which could not take
    /// it along.
    pub(crate) fn dispatch_report(
        &mut self,
        id: u32,
        utilization: f64,
        tunnel_packets: u64,
        packets: &[(u32, u16, u64)],
    ) {
        if self.dispatch.settings().is_none() {
            return;
        }
        let d = &mut self.dispatch;
        let now: BTreeMap<(u32, u16), u64> =
            packets.iter().map(|&(vni, v, n)| ((vni, v), n)).collect();
        // Merged, not replaced: a virtual MAC that comes back to the node goes on from its
        // count then (the node keeps counting it across tables).
        let before = d.packets.get(&id).cloned().unwrap_or_default();
        d.packets
            .entry(id)
            .or_default()
            .extend(now.iter().map(|(k, v)| (*k, *v)));
        let mut per_vni: BTreeMap<u32, u64> = BTreeMap::new();
        for (&(vni, v), &n) in &now {
            let b = before.get(&(vni, v)).copied().unwrap_or(0);
            *per_vni.entry(vni).or_default() += if n >= b { n - b } else { n };
        }
        let total: u64 = per_vni.values().sum::<u64>().max(tunnel_packets);
        let utilization = if utilization.is_finite() {
            utilization.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let loads = d.loads.entry(id).or_default();
        loads.clear();
        for (vni, agents) in &mut d.agents {
            let Some(a) = agents.get_mut(&id) else {
                continue;
            };
            let part = per_vni.get(vni).copied().unwrap_or(0);
            let load = if total == 0 {
                0.0
            } else {
                utilization * part as f64 / total as f64
            };
            loads.insert(*vni, load);
            a.observe(
                load,
                now.iter()
                    .filter(|((v, _), _)| v == vni)
                    .map(|((_, i), n)| (*i, *n)),
            );
        }
    }

    /// Node `id`'s table (VTEPs and owners), or None if a node it names has no VTEP.
    fn dispatch_table(&self, owners: &Owners) -> Option<DispatchConfig> {
        let settings = self.dispatch.settings()?;
        let mut vnets = Vec::with_capacity(owners.len());
        for (vni, o) in owners {
            let mut ids: Vec<u32> = o.clone();
            ids.sort_unstable();
            ids.dedup();
            let mut nodes: Vec<IpAddr> = Vec::with_capacity(ids.len());
            for id in &ids {
                nodes.push(self.nodes.get(id)?.vtep?);
            }
            let index: HashMap<u32, u16> = ids
                .iter()
                .enumerate()
                .map(|(i, id)| (*id, i as u16))
                .collect();
            vnets.push(VnetOwners {
                vni: *vni,
                nodes,
                owners: o.iter().map(|id| index[id]).collect(),
            });
        }
        Some(DispatchConfig {
            vmacs: settings.vmacs,
            announce_interval: settings.announce_interval,
            linger: settings.ring.linger,
            vnets,
        })
    }

    /// Sends every live data node whose table changed its new one (see the module's doc for
    /// the rule that keeps a virtual MAC with its old owner until the new one confirmed).
    fn dispatch_send(&mut self) {
        let desired = self.dispatch.owners();
        let targets: Vec<u32> = self
            .nodes
            .iter()
            .filter(|(id, n)| {
                n.role == Role::Data
                    && n.alive
                    && n.session_open
                    && n.vtep.is_some()
                    && !self.dispatch.refused.contains_key(id)
            })
            .map(|(id, _)| *id)
            .collect();
        // The owner confirmed a table giving it v, and none it has not answered yet takes v
        // from it again.
        let confirmed = |d: &DispatchState, owner: u32, vni: u32, v: usize| {
            let owns = |o: &Owners| o.get(&vni).is_some_and(|o| o.get(v) == Some(&owner));
            d.held.get(&owner).is_some_and(owns)
                && d.pending
                    .iter()
                    .filter(|p| p.node == owner)
                    .all(|p| owns(&p.owners))
        };
        for id in targets {
            let mut table: Owners = BTreeMap::new();
            for (vni, owners) in &desired {
                let before = self.dispatch.sent.get(&id).and_then(|s| s.get(vni));
                let confirmed_before = self.dispatch.held.get(&id).and_then(|s| s.get(vni));
                let mine: Vec<u32> = owners
                    .iter()
                    .enumerate()
                    .map(|(v, &owner)| {
                        // What it was last sent or last confirmed.
                        let had = before.is_some_and(|b| b.get(v) == Some(&id))
                            || confirmed_before.is_some_and(|b| b.get(v) == Some(&id));
                        if owner != id && had && !confirmed(&self.dispatch, owner, *vni, v) {
                            id
                        } else {
                            owner
                        }
                    })
                    .collect();
                table.insert(*vni, mine);
            }
            if self.dispatch.sent.get(&id) == Some(&table) {
                continue;
            }
            let Some(config) = self.dispatch_table(&table) else {
                continue;
            };
            let token = self.token();
            self.dispatch.pending.push(Pending {
                token,
                node: id,
                owners: table.clone(),
            });
            self.dispatch.sent.insert(id, table);
            self.emit(
                id,
                Directive::SetDispatch(Box::new(config)),
                Await::Dispatch(token),
            );
        }
    }

    /// The answer to a table sent with `token` ([`Await::Dispatch`]): once confirmed, the
    /// virtual MACs it gave its node may be let go by their old owners.
    pub fn handle_dispatch_answer(&mut self, token: u64, ok: bool, now: Instant) {
        let Some(i) = self.dispatch.pending.iter().position(|p| p.token == token) else {
            return;
        };
        let p = self.dispatch.pending.remove(i);
        if ok {
            self.dispatch.held.insert(p.node, p.owners);
            self.dispatch.dirty = true;
            self.dispatch_update(now);
        } else {
            warn!(
                node = p.node,
                "data node did not take its self-dispatch table; sending it again in {:?}",
                super::REKEY_RETRY
            );
            self.dispatch.sent.remove(&p.node);
            self.dispatch.refused.insert(p.node, now);
        }
    }

    /// The tables whose answers have not come yet, by token.
    pub fn pending_dispatch_acks(&self) -> Vec<u64> {
        self.dispatch.pending.iter().map(|p| p.token).collect()
    }

    /// Data node `id` restarted (its CHILD_SAs are gone): it leaves the ring until it holds
    /// them again, as a node that joins.
    pub(crate) fn dispatch_restarted(&mut self, id: u32) {
        self.dispatch.rejoin.insert(id);
    }

    /// A data node's tables are gone (it restarted) or it left: it is sent a whole table
    /// again when it is back.
    pub(crate) fn dispatch_forget(&mut self, id: u32) {
        self.dispatch.sent.remove(&id);
        self.dispatch.held.remove(&id);
        self.dispatch.packets.remove(&id);
        self.dispatch.pending.retain(|p| p.node != id);
        self.dispatch.refused.remove(&id);
        self.dispatch.loads.remove(&id);
        self.dispatch.dirty = true;
    }

    /// Data node `id` opened a new session without restarting: it still holds its last table;
    /// what it had not answered on the old session is sent again if still wanted.
    pub(crate) fn dispatch_reconnected(&mut self, id: u32) {
        self.dispatch.pending.retain(|p| p.node != id);
        match self.dispatch.held.get(&id).cloned() {
            Some(h) => {
                self.dispatch.sent.insert(id, h);
            }
            None => {
                self.dispatch.sent.remove(&id);
            }
        }
        self.dispatch.refused.remove(&id);
        self.dispatch.dirty = true;
    }

    /// What `protego ctl dispatch show` shows.
    pub fn dispatch_status(&self, now: Instant) -> DispatchStatus {
        let d = &self.dispatch;
        let settings = d.settings();
        let mut owned: BTreeMap<u32, BTreeMap<u32, usize>> = BTreeMap::new();
        for (vni, owners) in d.owners() {
            let counts = owned.entry(vni).or_default();
            for o in owners {
                *counts.entry(o).or_default() += 1;
            }
        }
        let mut unconfirmed: Vec<u32> = d.pending.iter().map(|p| p.node).collect();
        unconfirmed.sort_unstable();
        unconfirmed.dedup();
        DispatchStatus {
            mode: settings.map_or(DispatchMode::Steer, |s| s.mode).as_str(),
            vmacs: settings.map_or(0, |s| s.vmacs),
            ring: d.ring.clone(),
            owned,
            loads: d.loads.iter().map(|(id, l)| (*id, l.clone())).collect(),
            unconfirmed,
            moves: d
                .moves
                .iter()
                .map(|m| (now.saturating_duration_since(m.at), m.clone()))
                .collect(),
        }
    }
}
