//! One data node's ring agent for one VNet: Algorithm 5's [`Node`] fed with what the data
//! path measures, and turned into what the data path needs, still without I/O (the caller
//! reads the data path's counters, carries the messages and applies the owners).
//!
//! - In: the node's load (a fraction of its capacity) and the cumulative frame counts of the
//!   virtual MACs it owns ([`Agent::observe`]: each virtual MAC's part of the load is its part
//!   of the frames since the last observation), messages from the other nodes, the time.
//! - Out: messages to send, and the owner of every virtual MAC as far as this node knows
//!   ([`Agent::owners`]): itself for those it owns (taken at an offer, so during a hand-over
//!   both nodes process a virtual MAC's frames), the new owner for those it gave away (its
//!   stragglers go there while they linger), and the first partition's owner for the others
//!   (moves between other nodes are not told to it; the data path only asks whether it owns a
//!   virtual MAC and where the ones it gave away went).

use crate::ring::{Action, Msg, Node, NodeId, Params};
use crate::vmac::partition;
use crate::DispatchError;
use std::collections::BTreeMap;
use std::time::Instant;

/// One data node's ring agent for one VNet.
#[derive(Debug)]
pub struct Agent {
    node: Node,
    /// Per virtual MAC index: its owner as far as this node knows.
    owners: Vec<NodeId>,
    /// The owners changed since [`Agent::take_changed`] last said so.
    changed: bool,
    /// The counts of the last observation, per owned virtual MAC.
    last: BTreeMap<u16, u64>,
}

impl Agent {
    /// Node `id` of `ring` (live data nodes in ring order) for a VNet of `k` virtual MACs,
    /// starting from Algorithm 1's partition of them over `ring` (every node computes the
    /// same), at `now`; `seed` seeds the node's choice of `W`.
    pub fn new(
        id: NodeId,
        params: Params,
        ring: Vec<NodeId>,
        k: u32,
        now: Instant,
        seed: u64,
    ) -> Result<Self, DispatchError> {
        let mut owners = vec![id; k as usize];
        for (node, part) in partition(k, &ring) {
            for i in part {
                owners[usize::from(i)] = node;
            }
        }
        Self::with_owners(id, params, ring, owners, now, seed)
    }

    /// Node `id` of `ring` where `owners` (per virtual MAC index) says who owns what: the node
    /// owns the virtual MACs `owners` gives it (none, for a node that joins the ring and is
    /// then given its share by the others' moves, or a share the caller carved out for it).
    pub fn with_owners(
        id: NodeId,
        params: Params,
        ring: Vec<NodeId>,
        owners: Vec<NodeId>,
        now: Instant,
        seed: u64,
    ) -> Result<Self, DispatchError> {
        let k = u32::try_from(owners.len()).unwrap_or(u32::MAX);
        if owners.is_empty() || k > crate::MAX_VMACS {
            return Err(DispatchError::Count { k });
        }
        let mine = owners
            .iter()
            .enumerate()
            .filter(|(_, o)| **o == id)
            .map(|(i, _)| i as u16);
        let (node, _) = Node::new(id, params, ring, mine, now, seed)?;
        Ok(Self {
            node,
            owners,
            changed: true,
            last: BTreeMap::new(),
        })
    }

    /// The ring's node (its loads, its moves).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The owner of each virtual MAC (by index) as far as this node knows.
    pub fn owners(&self) -> &[NodeId] {
        &self.owners
    }

    /// Whether the owners changed since this was last called (the data path's table must
    /// then be replaced).
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The node's load now (a fraction of its capacity) and the frames each virtual MAC it
    /// owns has received so far (cumulative, by index; counts that went down start again).
    pub fn observe(&mut self, load: f64, packets: impl IntoIterator<Item = (u16, u64)>) {
        let now: BTreeMap<u16, u64> = packets.into_iter().collect();
        let delta: Vec<(u16, u64)> = now
            .iter()
            .filter(|(i, _)| self.node.owned().contains(i))
            .map(|(&i, &n)| {
                let before = self.last.get(&i).copied().unwrap_or(0);
                (i, if n >= before { n - before } else { n })
            })
            .collect();
        // Merged: a virtual MAC that comes back goes on from its count then.
        self.last.extend(now.iter().map(|(k, v)| (*k, *v)));
        let total: u64 = delta.iter().map(|(_, d)| d).sum();
        let per_vmac = delta.into_iter().filter(|(_, d)| *d > 0).map(|(i, d)| {
            // Fractions of a total above zero.
            (i, load * d as f64 / total as f64)
        });
        self.node.set_load(load, per_vmac);
    }

    /// Time passes: the messages to send.
    pub fn tick(&mut self, now: Instant) -> Vec<(NodeId, Msg)> {
        let actions = self.node.tick(now);
        self.apply(actions)
    }

    /// A message from node `from`: the messages to send.
    pub fn receive(&mut self, now: Instant, from: NodeId, msg: Msg) -> Vec<(NodeId, Msg)> {
        let actions = self.node.receive(now, from, msg);
        self.apply(actions)
    }

    /// The live data nodes changed; a failed node's virtual MACs that this node (its
    /// successor) adopts are `adopted`.
    pub fn set_ring(&mut self, ring: Vec<NodeId>, adopted: &[u16]) {
        self.node.set_ring(ring);
        let actions = self.node.adopt(adopted.iter().copied());
        let sent = self.apply(actions);
        debug_assert!(sent.is_empty(), "adopting sends nothing");
    }

    fn apply(&mut self, actions: Vec<Action>) -> Vec<(NodeId, Msg)> {
        let me = self.node.id();
        let mut out = Vec::new();
        for a in actions {
            match a {
                Action::Send { to, msg } => out.push((to, msg)),
                Action::Own(v) => self.set_owner(v, me),
                Action::Forward { vmac, to } => self.set_owner(vmac, to),
                // The data path stops sending on by itself once `linger` is over.
                Action::Release(_) => {}
            }
        }
        out
    }

    fn set_owner(&mut self, v: u16, owner: NodeId) {
        if let Some(o) = self.owners.get_mut(usize::from(v)) {
            if *o != owner {
                *o = owner;
                self.changed = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_loaded_node_hands_its_busiest_virtual_macs_to_its_successor() {
        let t0 = Instant::now();
        let params = Params {
            threshold: 0.05,
            ..Params::paper()
        };
        let ring = vec![1, 2];
        let mut a = Agent::new(1, params, ring.clone(), 8, t0, 7).expect("a");
        let mut b = Agent::new(2, params, ring, 8, t0, 7).expect("b");
        assert_eq!(a.owners(), &[1, 1, 1, 1, 2, 2, 2, 2]);
        assert!(a.take_changed() && !a.take_changed());
        // A's virtual MAC 0 carries most of its 80 % load; B is idle.
        a.observe(0.8, [(0, 900), (1, 100)]);
        b.observe(0.0, []);
        let mut now = t0;
        let mut queue: Vec<(NodeId, NodeId, Msg)> = Vec::new();
        for _ in 0..200 {
            now += Duration::from_millis(50);
            for (to, m) in a.tick(now) {
                queue.push((1, to, m));
            }
            for (to, m) in b.tick(now) {
                queue.push((2, to, m));
            }
            while let Some((from, to, m)) = queue.pop() {
                let agent = if to == 1 { &mut a } else { &mut b };
                for (next, m) in agent.receive(now, from, m) {
                    queue.push((to, next, m));
                }
            }
        }
        // B took virtual MAC 0 (the one that levels the two), A knows where it went.
        assert_eq!(b.owners()[0], 2);
        assert_eq!(a.owners()[0], 2);
        assert!(a.take_changed() && b.take_changed());
        assert!(a.node().moves().any(|m| m.vmacs == vec![0]));
    }

    #[test]
    fn a_failed_nodes_virtual_macs_are_adopted_by_its_successor() {
        let t0 = Instant::now();
        let mut a = Agent::new(1, Params::paper(), vec![1, 2, 3], 6, t0, 1).expect("a");
        assert_eq!(a.owners(), &[1, 1, 2, 2, 3, 3]);
        a.take_changed();
        // Node 3 failed; node 1 is its successor and takes its share.
        a.set_ring(vec![1, 2], &[4, 5]);
        assert_eq!(a.owners(), &[1, 1, 2, 2, 1, 1]);
        assert!(a.take_changed());
        assert_eq!(a.node().successor(), 2);
    }

    #[test]
    fn counts_become_each_virtual_macs_part_of_the_load() {
        let t0 = Instant::now();
        let mut a = Agent::new(1, Params::paper(), vec![1], 4, t0, 1).expect("a");
        a.observe(0.5, [(0, 10), (1, 30)]);
        a.observe(0.4, [(0, 20), (1, 60), (9, 5)]);
        // 10 and 30 since the last: a quarter and three quarters of 0.4; index 9 is not
        // owned (K = 4) and is left out.
        assert_eq!(a.node().loads().0, 0.4);
        let parts = |a: &Agent| -> Vec<(u16, f64)> {
            a.node()
                .vmac_loads()
                .iter()
                .map(|(i, l)| (*i, *l))
                .collect()
        };
        assert_eq!(parts(&a), vec![(0, 0.1), (1, 0.3)]);
        // A count that went down (the data path's counters started again) counts from zero.
        a.observe(0.2, [(0, 4), (1, 60)]);
        assert_eq!(parts(&a), vec![(0, 0.2)]);
        assert_eq!(a.owners(), &[1, 1, 1, 1]);
    }
}
