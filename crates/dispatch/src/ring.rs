//! One data node's side of flow migration along the ring (the clustering paper's Algorithm 5).

use crate::DispatchError;
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// A data node's number in the ring (the cluster's node id).
pub type NodeId = u32;

/// The ring's parameters (the paper's §4.3 values in [`Params::paper`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// `T_L`: how often a node reports its load to its predecessor.
    pub load_interval: Duration,
    /// `T_M`: how often a node decides whether to hand virtual MACs to its successor.
    pub move_interval: Duration,
    /// `L_D`: the load difference (loads are fractions of a node's capacity, `0..=1`) above
    /// which a node hands some over.
    pub threshold: f64,
    /// `|W|`: the most virtual MACs handed over in one move.
    pub batch: usize,
    /// How long a node keeps forwarding the frames of a virtual MAC it gave away after the
    /// successor acknowledged it (the hosts re-learn from the new owner's announcement).
    pub linger: Duration,
    /// How long a node waits for the acknowledgement of an offer before it sends the offer
    /// again (a message was lost; a successor that left the ring ends the offer).
    pub ack_timeout: Duration,
}

impl Params {
    /// The paper's evaluation: `T_L` = 1.33 s, `T_M` = 4 s, `L_D` = 10 %, `|W|` = 4; one
    /// second of forwarding after the acknowledgement and 2 s for it to come.
    pub fn paper() -> Self {
        Self {
            load_interval: Duration::from_millis(1330),
            move_interval: Duration::from_secs(4),
            threshold: 0.10,
            batch: 4,
            linger: Duration::from_secs(1),
            ack_timeout: Duration::from_secs(2),
        }
    }

    /// Checks that the parameters can run a ring.
    pub fn check(&self) -> Result<(), DispatchError> {
        let bad = |what: &str| {
            Err(DispatchError::Params {
                what: what.to_owned(),
            })
        };
        if self.load_interval.is_zero() || self.move_interval.is_zero() {
            return bad("T_L and T_M must be longer than zero");
        }
        if self.move_interval < self.load_interval {
            return bad("T_M must be at least T_L: a move decides on the successor's last report");
        }
        if !(self.threshold > 0.0 && self.threshold < 1.0) {
            return bad("L_D must be between 0 and 1 (a fraction of a node's capacity)");
        }
        if self.batch == 0 {
            return bad("|W| must be at least 1");
        }
        Ok(())
    }
}

/// What nodes tell each other (over the cluster's links, not the LAN).
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    /// The sender's load (to its predecessor), a fraction of its capacity.
    Load {
        /// The load.
        load: f64,
    },
    /// The sender (the receiver's predecessor) hands these virtual MACs over (Algorithm 5,
    /// step 3); it serves them until the receiver acknowledges, and the receiver serves them
    /// from the offer on, so every frame finds a node that processes it.
    Offer {
        /// The sender's number for this move.
        round: u64,
        /// The virtual MACs' indices.
        vmacs: Vec<u16>,
    },
    /// The receiver of an offer owns these now (step 4): every virtual MAC of the offer,
    /// also those it owned already (an offer sent again after a lost acknowledgement).
    Ack {
        /// The offer's round.
        round: u64,
        /// The virtual MACs it owns.
        vmacs: Vec<u16>,
    },
}

/// What the node's data path must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send `msg` to node `to`.
    Send {
        /// The node.
        to: NodeId,
        /// The message.
        msg: Msg,
    },
    /// Own this virtual MAC from now on: answer ARP (ND) with it for the VMs it serves,
    /// process the frames sent to it, and announce it to the hosts (a frame from it, which
    /// also is the paper's acknowledging frame: the hosts learn its new place).
    Own(u16),
    /// Given away and acknowledged: stop processing the frames of this virtual MAC and
    /// forward those still arriving for it to node `to`, its new owner, until
    /// [`Action::Release`].
    Forward {
        /// The virtual MAC.
        vmac: u16,
        /// Its new owner.
        to: NodeId,
    },
    /// Stop forwarding the frames of this virtual MAC (its hosts have moved).
    Release(u16),
}

/// One move this node made or took, for `ctl dispatch show`.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// When.
    pub at: Instant,
    /// From which node.
    pub from: NodeId,
    /// To which node.
    pub to: NodeId,
    /// The virtual MACs.
    pub vmacs: Vec<u16>,
    /// The two loads that decided it (sender's, successor's).
    pub loads: (f64, f64),
}

/// How many moves a node remembers.
const MOVES_KEPT: usize = 16;

/// A data node's side of Algorithm 5 (see the crate's doc). The node is told its ring
/// ([`set_ring`](Self::set_ring), the live data nodes in ring order), its load
/// ([`set_load`](Self::set_load)) and the time ([`tick`](Self::tick)), and what other nodes
/// send it ([`receive`](Self::receive)); it answers with [`Action`]s.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    params: Params,
    ring: Vec<NodeId>,
    owned: BTreeSet<u16>,
    /// Offered to the successor, not acknowledged yet (still owned and served): (round,
    /// successor, vmacs, when to send the offer again).
    offered: Option<(u64, NodeId, Vec<u16>, Instant)>,
    /// Acknowledged, still forwarded until the instant.
    lingering: BTreeMap<u16, Instant>,
    /// Taken from the predecessor less than `linger` ago: not handed on before
    /// then. The hosts may still send their frames to the node they came from, which sends
    /// them on here; a frame another node sent on is not sent on again (no loops), so a
    /// second move in that time would lose them.
    arrived: BTreeMap<u16, Instant>,
    load: f64,
    /// Per owned virtual MAC, its part of the load (when the data path measures it).
    vmac_loads: BTreeMap<u16, f64>,
    /// The successor's last report: (its id, its load, when).
    successor_load: Option<(NodeId, f64, Instant)>,
    next_report: Instant,
    /// When the next decision is due; it is taken on the first report of the successor
    /// that came after the last decision.
    next_move: Instant,
    /// When the last decision was taken (the node's start before the first).
    decided: Instant,
    round: u64,
    rng: ChaCha8Rng,
    moves: VecDeque<Move>,
}

impl Node {
    /// Node `id` of `ring` (live data nodes in ring order; it must be one of them), owning
    /// `owned`, at `now`; `seed` seeds its choice of `W`. Returns the node and the actions
    /// that announce what it owns.
    pub fn new(
        id: NodeId,
        params: Params,
        ring: Vec<NodeId>,
        owned: impl IntoIterator<Item = u16>,
        now: Instant,
        seed: u64,
    ) -> Result<(Self, Vec<Action>), DispatchError> {
        params.check()?;
        if !ring.contains(&id) {
            return Err(DispatchError::Params {
                what: format!("node {id} is not in the ring {ring:?}"),
            });
        }
        let owned: BTreeSet<u16> = owned.into_iter().collect();
        let actions = owned.iter().map(|&v| Action::Own(v)).collect();
        // The first report waits one `T_L`, so that it tells a load measured since the node
        // started. The first decision is due then: `T_M` is the time a move needs to show
        // in the loads (the hosts re-learn, the loads are measured again), and before the
        // first move there is none to wait for. Staggered by the node's id, so the nodes do
        // not all decide at the same instant.
        let stagger = params.load_interval.mul_f64(f64::from(id % 16) / 16.0);
        Ok((
            Self {
                id,
                params,
                ring,
                owned,
                offered: None,
                lingering: BTreeMap::new(),
                arrived: BTreeMap::new(),
                load: 0.0,
                vmac_loads: BTreeMap::new(),
                successor_load: None,
                next_report: now + params.load_interval,
                next_move: now + params.load_interval + stagger,
                decided: now,
                round: 0,
                rng: ChaCha8Rng::seed_from_u64(seed ^ u64::from(id)),
                moves: VecDeque::new(),
            },
            actions,
        ))
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The virtual MACs it owns (serves: answers ARP for, processes), those offered but not
    /// acknowledged included.
    pub fn owned(&self) -> &BTreeSet<u16> {
        &self.owned
    }

    /// The virtual MACs offered to the successor and not acknowledged yet.
    pub fn offered(&self) -> &[u16] {
        self.offered.as_ref().map_or(&[], |o| o.2.as_slice())
    }

    /// The moves it made or took, oldest first (the last 16).
    pub fn moves(&self) -> impl Iterator<Item = &Move> {
        self.moves.iter()
    }

    /// Each owned virtual MAC's part of the load, as last set (empty: not measured).
    pub fn vmac_loads(&self) -> &BTreeMap<u16, f64> {
        &self.vmac_loads
    }

    /// Its last load, and its successor's as last reported.
    pub fn loads(&self) -> (f64, Option<f64>) {
        (self.load, self.successor_load.map(|(_, l, _)| l))
    }

    /// The node before this one in the ring (itself when alone).
    pub fn predecessor(&self) -> NodeId {
        self.neighbour(-1)
    }

    /// The node after this one in the ring (itself when alone).
    pub fn successor(&self) -> NodeId {
        self.neighbour(1)
    }

    fn neighbour(&self, step: isize) -> NodeId {
        let n = self.ring.len() as isize;
        let i = self.ring.iter().position(|&x| x == self.id).unwrap_or(0) as isize;
        self.ring[((i + step) % n + n) as usize % n as usize]
    }

    /// The node's load now (a fraction of its capacity) and, if the data path measures it,
    /// each owned virtual MAC's part of it (what lets a move pick the virtual MACs that
    /// balance the two nodes; without it `W` is random, as in the paper).
    pub fn set_load(&mut self, load: f64, per_vmac: impl IntoIterator<Item = (u16, f64)>) {
        self.load = if load.is_finite() { load.max(0.0) } else { 0.0 };
        self.vmac_loads = per_vmac
            .into_iter()
            .filter(|(_, l)| l.is_finite() && *l >= 0.0)
            .collect();
    }

    /// The live data nodes changed (`ring`, in ring order, holding this node; another ring
    /// is ignored). An offer to a successor that left ends (the node kept serving its
    /// virtual MACs); the new successor's load is not known until it reports.
    pub fn set_ring(&mut self, ring: Vec<NodeId>) {
        if !ring.contains(&self.id) {
            return;
        }
        self.ring = ring;
        if self
            .offered
            .as_ref()
            .is_some_and(|o| o.1 != self.successor())
        {
            self.offered = None;
        }
        if self
            .successor_load
            .is_some_and(|(who, _, _)| who != self.successor())
        {
            self.successor_load = None;
        }
    }

    /// A failed node's virtual MACs become this node's (it was the failed node's successor):
    /// the data path announces them at once.
    pub fn adopt(&mut self, vmacs: impl IntoIterator<Item = u16>) -> Vec<Action> {
        let mut out = Vec::new();
        for v in vmacs {
            if self.lingering.remove(&v).is_some() {
                out.push(Action::Release(v));
            }
            if self.owned.insert(v) {
                out.push(Action::Own(v));
            }
        }
        out
    }

    /// Time passes: reports every `T_L`, decisions every `T_M` (the first one `T_L` after the
    /// start; each waits for a report of the successor newer than the last decision), offers
    /// that were not acknowledged in time are sent again, forwarding ends after `linger`.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        let ended: Vec<u16> = self
            .lingering
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(v, _)| *v)
            .collect();
        for v in ended {
            self.lingering.remove(&v);
            out.push(Action::Release(v));
        }
        let linger = self.params.linger;
        self.arrived
            .retain(|_, at| now.saturating_duration_since(*at) < linger);
        if let Some((round, to, vmacs, again)) = self.offered.as_mut() {
            if *again <= now {
                *again = now + self.params.ack_timeout;
                out.push(Action::Send {
                    to: *to,
                    msg: Msg::Offer {
                        round: *round,
                        vmacs: vmacs.clone(),
                    },
                });
            }
        }
        if now >= self.next_report {
            self.next_report = now + self.params.load_interval;
            let p = self.predecessor();
            if p != self.id {
                out.push(Action::Send {
                    to: p,
                    msg: Msg::Load { load: self.load },
                });
            }
        }
        if now >= self.next_move && self.decide(now, &mut out) {
            self.decided = now;
            self.next_move = now + self.params.move_interval;
        }
        out
    }

    /// Algorithm 5, step 3: hand `W` to the successor if this node's load exceeds the
    /// successor's by more than `L_D`; one move at a time. Decides (returns true) only on a
    /// report of the successor that came after the last decision and within the last two
    /// `T_L`; without one (a successor that is new or silent) the decision stays due.
    fn decide(&mut self, now: Instant, out: &mut Vec<Action>) -> bool {
        let to = self.successor();
        if to == self.id || self.offered.is_some() {
            return false;
        }
        let Some((who, theirs, at)) = self.successor_load else {
            return false;
        };
        if who != to
            || at <= self.decided
            || now.saturating_duration_since(at) > 2 * self.params.load_interval
        {
            return false;
        }
        let difference = self.load - theirs;
        if difference <= self.params.threshold {
            return true;
        }
        let w = self.choose(now, difference);
        if w.is_empty() {
            // Nothing to hand over yet because what would level the pair arrived less than
            // `linger` ago: decide again once it may move, not a whole T_M later.
            return self.arrived.is_empty();
        }
        self.round += 1;
        out.push(Action::Send {
            to,
            msg: Msg::Offer {
                round: self.round,
                vmacs: w.clone(),
            },
        });
        self.remember(Move {
            at: now,
            from: self.id,
            to,
            vmacs: w.clone(),
            loads: (self.load, theirs),
        });
        self.offered = Some((self.round, to, w, now + self.params.ack_timeout));
        true
    }

    /// `W`: with per-virtual-MAC loads, at most `|W|` of them whose loads add up as close to
    /// half of `difference` as they can (taken heaviest first, each only if it brings the sum
    /// closer: the two nodes end nearer each other than before); without, `|W|` at random.
    /// Never every virtual MAC the node owns, nor one that arrived less than `linger` ago.
    fn choose(&mut self, now: Instant, difference: f64) -> Vec<u16> {
        let most = self.params.batch.min(self.owned.len().saturating_sub(1));
        if most == 0 {
            return Vec::new();
        }
        let linger = self.params.linger;
        let arrived = &self.arrived;
        let movable = |v: &u16| {
            arrived
                .get(v)
                .is_none_or(|at| now.saturating_duration_since(*at) >= linger)
        };
        let measured = self
            .owned
            .iter()
            .any(|v| self.vmac_loads.get(v).is_some_and(|l| *l > 0.0));
        if !measured {
            let mut pool: Vec<u16> = self.owned.iter().copied().filter(|v| movable(v)).collect();
            let mut w = Vec::with_capacity(most);
            for _ in 0..most.min(pool.len()) {
                let i = (self.rng.next_u64() % pool.len() as u64) as usize;
                w.push(pool.swap_remove(i));
            }
            w.sort_unstable();
            return w;
        }
        let mut loaded: Vec<(u16, f64)> = self
            .owned
            .iter()
            .filter(|v| movable(v))
            .filter_map(|v| Some((*v, *self.vmac_loads.get(v)?)))
            .filter(|(_, l)| *l > 0.0)
            .collect();
        loaded.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let target = difference / 2.0;
        let mut w = Vec::new();
        let mut sum = 0.0;
        for &(v, l) in &loaded {
            if w.len() == most {
                break;
            }
            if (target - (sum + l)).abs() < (target - sum).abs() {
                sum += l;
                w.push(v);
            }
        }
        w.sort_unstable();
        w
    }

    /// A message from node `from`.
    pub fn receive(&mut self, now: Instant, from: NodeId, msg: Msg) -> Vec<Action> {
        let mut out = Vec::new();
        match msg {
            Msg::Load { load } => {
                if from == self.successor() && load.is_finite() {
                    self.successor_load = Some((from, load.max(0.0), now));
                }
            }
            // Step 4: take them, announce them (the acknowledging frame), acknowledge.
            Msg::Offer { round, vmacs } => {
                if from != self.predecessor() {
                    return out;
                }
                let mut taken = Vec::new();
                for &v in &vmacs {
                    // One this node gave away earlier and still forwards: its own again.
                    if self.lingering.remove(&v).is_some() {
                        out.push(Action::Release(v));
                    }
                    if self.owned.insert(v) {
                        out.push(Action::Own(v));
                        self.arrived.insert(v, now);
                        taken.push(v);
                    }
                }
                if !taken.is_empty() {
                    self.remember(Move {
                        at: now,
                        from,
                        to: self.id,
                        vmacs: taken,
                        loads: (f64::NAN, self.load),
                    });
                }
                out.push(Action::Send {
                    to: from,
                    msg: Msg::Ack { round, vmacs },
                });
            }
            // Step 5: they are the successor's; forward their stragglers a while longer.
            Msg::Ack { round, vmacs } => {
                let Some((r, to, offered, again)) = self.offered.take() else {
                    return out;
                };
                if r != round || to != from {
                    self.offered = Some((r, to, offered, again));
                    return out;
                }
                for v in offered.into_iter().filter(|v| vmacs.contains(v)) {
                    self.owned.remove(&v);
                    self.vmac_loads.remove(&v);
                    self.lingering.insert(v, now + self.params.linger);
                    out.push(Action::Forward { vmac: v, to });
                }
            }
        }
        out
    }

    fn remember(&mut self, m: Move) {
        if self.moves.len() == MOVES_KEPT {
            self.moves.pop_front();
        }
        self.moves.push_back(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offers(actions: &[Action]) -> Vec<Vec<u16>> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send {
                    msg: Msg::Offer { vmacs, .. },
                    ..
                } => Some(vmacs.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_first_decision_comes_with_the_successors_first_report_and_the_next_a_t_m_later() {
        let p = Params::paper();
        let t0 = Instant::now();
        let (mut a, _) = Node::new(0, p, vec![0, 1], 0..4, t0, 1).expect("node");
        a.set_load(0.9, [(0, 0.6), (1, 0.3)]);
        // Nothing is reported or decided before one T_L.
        assert!(a.tick(t0 + p.load_interval / 2).is_empty());
        // The decision is due at T_L but waits for the successor's report.
        let at = t0 + p.load_interval;
        assert!(offers(&a.tick(at)).is_empty());
        a.receive(at, 1, Msg::Load { load: 0.1 });
        let later = at + Duration::from_millis(50);
        // Half the difference is 0.4: virtual MAC 0 (0.6) comes nearest.
        assert_eq!(offers(&a.tick(later)), vec![vec![0]]);
        let acked = a.receive(
            later,
            1,
            Msg::Ack {
                round: 1,
                vmacs: vec![0],
            },
        );
        assert_eq!(acked, vec![Action::Forward { vmac: 0, to: 1 }]);
        // Still unbalanced, and reports keep coming: the next decision only a T_M later.
        a.receive(later + p.load_interval, 1, Msg::Load { load: 0.2 });
        assert!(offers(&a.tick(later + p.move_interval - STEP)).is_empty());
        a.receive(later + p.move_interval - STEP, 1, Msg::Load { load: 0.2 });
        assert_eq!(offers(&a.tick(later + p.move_interval)), vec![vec![1]]);
    }

    const STEP: Duration = Duration::from_millis(10);

    #[test]
    fn a_decision_waits_for_a_report_newer_than_the_last_one() {
        // T_M as short as T_L: the report a decision used is still recent at the next one.
        let p = Params {
            load_interval: Duration::from_secs(1),
            move_interval: Duration::from_secs(1),
            ..Params::paper()
        };
        let t0 = Instant::now();
        let (mut a, _) = Node::new(0, p, vec![0, 1], 0..8, t0, 1).expect("node");
        a.set_load(0.9, [(0, 0.2), (1, 0.2), (2, 0.2)]);
        let at = t0 + p.load_interval;
        a.receive(at, 1, Msg::Load { load: 0.1 });
        let first = at + STEP;
        assert_eq!(offers(&a.tick(first)).len(), 1);
        a.receive(
            first,
            1,
            Msg::Ack {
                round: 1,
                vmacs: (0..3).collect(),
            },
        );
        a.set_load(0.9, [(3, 0.3), (4, 0.3)]);
        // Due again, the report it decided on still within two T_L: nothing without a new one.
        let due = first + p.move_interval;
        assert!(offers(&a.tick(due)).is_empty());
        assert!(offers(&a.tick(due + STEP)).is_empty());
        a.receive(due + STEP, 1, Msg::Load { load: 0.3 });
        assert_eq!(
            offers(&a.tick(due + 2 * STEP)).len(),
            1,
            "a new report decides"
        );
    }

    #[test]
    fn a_virtual_mac_just_taken_is_not_handed_on_before_linger() {
        // Node 1 takes virtual MAC 7 from node 0; the hosts may still send its frames to
        // node 0, which sends them on to node 1 only (a frame sent on is not sent on again).
        let p = Params::paper();
        let t0 = Instant::now();
        let (mut b, _) = Node::new(1, p, vec![0, 1, 2], 4..8, t0, 1).expect("node");
        let at = t0 + p.load_interval;
        let took = b.receive(
            at,
            0,
            Msg::Offer {
                round: 1,
                vmacs: vec![7, 8],
            },
        );
        assert!(took.contains(&Action::Own(8)));
        // 8 carries most of node 1's load; its successor is idle.
        b.set_load(0.9, [(8, 0.5), (4, 0.1)]);
        b.receive(at, 2, Msg::Load { load: 0.0 });
        // After node 1's stagger (a sixteenth of T_L), well within `linger`.
        let soon = at + p.load_interval / 8;
        assert_eq!(offers(&b.tick(soon)), vec![vec![4]], "8 arrived just now");
        b.receive(
            soon,
            2,
            Msg::Ack {
                round: 1,
                vmacs: vec![4],
            },
        );
        let late = soon + p.move_interval;
        b.receive(late, 2, Msg::Load { load: 0.1 });
        assert_eq!(offers(&b.tick(late + STEP)), vec![vec![8]]);
    }
}
