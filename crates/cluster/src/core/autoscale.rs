//! The autoscaler's side of the core: the model's input from the registry, and carrying a
//! plan out on the registry and the placement (`[cluster.autoscale] mode = "act"`):
//!
//! - `Migrate` and `Place` change the tunnel's placement and rekey it (the zero-loss move of
//!   [`ClusterCore::handle_migrate`]);
//! - `Activate` unparks a data node, `Deactivate` parks an empty one;
//! - `Start` and `Stop` become [`ProviderCall`]s for the shell to make of the node provider;
//!   a node stops only when parked and empty.

use super::{ClusterCore, Role};
use crate::capacity::{Input, NodeInput, Outcome};
use crate::provider::{ProvidedNode, ProvidedState};
use ike::TunnelId;
use provision::{Action, Plan};
use std::collections::{HashMap, HashSet};
use tracing::info;

/// A start or stop the shell asks of the node provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderCall {
    /// The plan decision it carries out.
    pub decision: usize,
    /// Start (true) or stop.
    pub start: bool,
    /// The node.
    pub name: String,
}

/// What carrying out a plan became.
#[derive(Debug)]
pub struct PlanEffects {
    /// Per decision, what became of it (a provider call may still fail).
    pub(crate) outcomes: Vec<Outcome>,
    /// The node provider calls to make, in order.
    pub provider_calls: Vec<ProviderCall>,
}

impl ClusterCore {
    /// The model's input now (`provided`: the node provider's nodes, `provider`: one is
    /// configured), and the names of its nodes by id.
    pub(crate) fn autoscale_input(
        &mut self,
        provider: bool,
        provided: Vec<ProvidedNode>,
    ) -> (Input, HashMap<u32, String>) {
        let mut nodes: Vec<NodeInput> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.role == Role::Data)
            .map(|(id, n)| NodeInput {
                id: *id,
                name: n.name.clone(),
                alive: n.alive,
                draining: n.draining,
                parked: n.parked,
                leaving: n.leaving,
                provided: None,
                load: n.last_report.clone().map(|l| (n.reports, l)),
            })
            .collect();
        for p in provided {
            let id = self.node_id(&p.name);
            match nodes.iter_mut().find(|n| n.id == id) {
                Some(n) => n.provided = Some(p.state),
                // Not registered (or a steer node of the same name, which the provider's
                // configuration check rules out): only the provider knows it.
                None if self.nodes.get(&id).is_none_or(|n| n.role == Role::Data) => {
                    nodes.push(NodeInput {
                        id,
                        name: p.name,
                        alive: false,
                        draining: false,
                        parked: false,
                        leaving: false,
                        provided: Some(p.state),
                        load: None,
                    });
                }
                None => {}
            }
        }
        let names = nodes.iter().map(|n| (n.id, n.name.clone())).collect();
        let live = |n: Option<u32>| n.is_some_and(|n| self.nodes.get(&n).is_some_and(|n| n.alive));
        let with_child: HashSet<TunnelId> = self.children.values().map(|c| c.tunnel).collect();
        // A CHILD_SA whose install to a live node is in flight (a first one, a rekey) is held.
        let held: HashSet<TunnelId> = self
            .children
            .values()
            .filter(|c| live(c.node) || live(c.installing))
            .map(|c| c.tunnel)
            .collect();
        let input = Input {
            provider,
            nodes,
            placement: self.placement.iter().map(|(t, n)| (*t, *n)).collect(),
            unplaced: with_child.difference(&held).copied().collect(),
            with_child,
            tunnels: self
                .tunnels
                .values()
                .map(|t| (t.id, (t.name.clone(), t.rate_limit_mbit)))
                .collect(),
        };
        (input, names)
    }

    /// Carries out `plan`'s decisions in order on the registry and the placement (act
    /// mode); `input` is what the plan was made from, `provider` whether a node provider is
    /// configured. Moved tunnels are rekeyed (once, and only if they end elsewhere).
    pub(crate) fn handle_plan(
        &mut self,
        plan: &Plan,
        input: &Input,
        provider: bool,
    ) -> PlanEffects {
        let mut outcomes = Vec::with_capacity(plan.decisions.len());
        let mut rekey: Vec<TunnelId> = Vec::new();
        // Where each moved tunnel was: one moved and moved back is not rekeyed.
        let mut origin: HashMap<TunnelId, Option<u32>> = HashMap::new();
        let mut provider_calls = Vec::new();
        // A parked node that holds tunnels (a fallback placement, a takeover) is serving:
        // the model counted it active.
        let serving: Vec<u32> = self.placement.values().copied().collect();
        for id in serving {
            if let Some(n) = self.nodes.get_mut(&id) {
                n.parked = false;
            }
        }
        for (i, d) in plan.decisions.iter().enumerate() {
            let outcome = match d.action {
                Action::Activate { node } => match self.nodes.get_mut(&node.0) {
                    Some(n) if n.role == Role::Data && n.alive && !n.draining => {
                        if n.parked {
                            n.parked = false;
                            info!(node = %n.name, "autoscaler: data node activated");
                        }
                        Outcome::Done
                    }
                    _ => Outcome::Skipped("the node is not a live data node".into()),
                },
                Action::Deactivate { node } => {
                    // Its last CHILD_SAs may still be leaving (a migration of this same
                    // plan): parking only keeps new ones away.
                    let holds = self.placement.values().any(|n| *n == node.0);
                    match self.nodes.get_mut(&node.0) {
                        _ if holds => Outcome::Skipped("tunnels are still on it".into()),
                        Some(n) if n.role == Role::Data => {
                            if !n.parked {
                                n.parked = true;
                                info!(node = %n.name, "autoscaler: data node parked (inactive)");
                            }
                            Outcome::Done
                        }
                        _ => Outcome::Skipped("the node is not registered".into()),
                    }
                }
                Action::Place { tunnel, node }
                | Action::Migrate {
                    tunnel, to: node, ..
                } => {
                    let t = tunnel;
                    // A planned move (as a drain): not onto a node whose per-VM routes are
                    // behind while the tunnel is on a live node whose routes are not.
                    let from = self
                        .placement
                        .get(&t)
                        .copied()
                        .filter(|p| self.nodes.get(p).is_some_and(|n| n.alive));
                    let behind = from.is_some_and(|f| f != node.0 && !self.routed_for(f, node.0));
                    match self.nodes.get_mut(&node.0) {
                        Some(_) if behind => Outcome::Skipped(
                            "the target's per-VM routes are not current yet".into(),
                        ),
                        Some(n) if n.role == Role::Data && n.alive && !n.draining => {
                            n.parked = false;
                            if self.placement.get(&t) != Some(&node.0) {
                                let was = self.placement.insert(t, node.0);
                                origin.entry(t).or_insert(was);
                                if self.children.values().any(|c| c.tunnel == t) {
                                    rekey.push(t);
                                }
                            }
                            Outcome::Done
                        }
                        _ => Outcome::Skipped("the target is not a live data node".into()),
                    }
                }
                Action::Start { node, .. } => {
                    let stopped = input.nodes.iter().find(|n| {
                        n.id == node.0
                            && !n.alive
                            && matches!(
                                n.provided,
                                Some(ProvidedState::Stopped | ProvidedState::Failed { .. })
                            )
                    });
                    match (provider, stopped) {
                        (false, _) => Outcome::Skipped("no node provider is configured".into()),
                        (true, None) => Outcome::Skipped(
                            "the node provider has no stopped data node left".into(),
                        ),
                        (true, Some(n)) => {
                            provider_calls.push(ProviderCall {
                                decision: i,
                                start: true,
                                name: n.name.clone(),
                            });
                            Outcome::Done
                        }
                    }
                }
                Action::Stop { node } => {
                    self.plan_stop(i, node.0, input, provider, &mut provider_calls)
                }
            };
            outcomes.push(outcome);
        }
        // Each tunnel rekeyed once, and only if it ends elsewhere.
        rekey.sort_unstable();
        rekey.dedup();
        rekey.retain(|t| origin.get(t).copied().flatten() != self.placement.get(t).copied());
        if !rekey.is_empty() {
            info!(tunnels = rekey.len(), "autoscaler: migrating tunnels");
        }
        self.rekey(rekey, "autoscaler");
        PlanEffects {
            outcomes,
            provider_calls,
        }
    }

    /// A `Stop` decision: not while a CHILD_SA is on the node, nor while steer nodes still
    /// send it late packets of removed ones (their grace); the attachments it serves are
    /// steered elsewhere first.
    fn plan_stop(
        &mut self,
        i: usize,
        node: u32,
        input: &Input,
        provider: bool,
        calls: &mut Vec<ProviderCall>,
    ) -> Outcome {
        let holds = self.placement.values().any(|n| *n == node)
            || self.children.values().any(|c| c.node == Some(node))
            || self.retiring.iter().any(|r| r.node == Some(node));
        let managed = input
            .nodes
            .iter()
            .find(|n| n.id == node && n.provided.is_some());
        match (provider, managed, self.nodes.get(&node)) {
            (false, _, _) => Outcome::Skipped("no node provider is configured".into()),
            (true, None, _) => Outcome::Skipped("the node provider does not manage it".into()),
            _ if holds => Outcome::Skipped("tunnels are still on it".into()),
            (true, Some(_), Some(n)) if n.alive && !n.parked => {
                Outcome::Skipped("it is active".into())
            }
            // A node stops from the reserve, once it has joined it: a start is not undone
            // before the node could be used.
            (true, Some(m), _) if !m.alive => Outcome::Skipped("it is still starting".into()),
            (true, Some(m), _) if !matches!(m.provided, Some(ProvidedState::Running { .. })) => {
                Outcome::Skipped("the node provider does not run it".into())
            }
            (true, Some(m), _) => {
                // The attachments it serves move first (steering flips, confirmed by the
                // steer nodes before the provider is asked), all or none.
                let served: Vec<u32> = self
                    .attachments
                    .values()
                    .filter(|a| a.node == Some(node))
                    .map(|a| a.id)
                    .collect();
                let mut moves = Vec::new();
                for a in &served {
                    match self.choose_attachment_planned(*a, node) {
                        Some(to) => moves.push((*a, to)),
                        None if self.choose_attachment(*a, Some(node)).is_some() => {
                            return Outcome::Skipped(
                                "the other data nodes' per-VM routes are not current yet".into(),
                            )
                        }
                        None => {
                            return Outcome::Skipped(
                                "no other data node can serve its attachments".into(),
                            )
                        }
                    }
                }
                for (a, to) in moves {
                    if let Some(e) = self.attachments.get_mut(&a) {
                        e.node = Some(to);
                    }
                }
                self.emit_attachment_steering(&served, None);
                // Nothing is placed on it from now on, not even as a fallback.
                if let Some(n) = self.nodes.get_mut(&node) {
                    n.leaving = true;
                }
                calls.push(ProviderCall {
                    decision: i,
                    start: false,
                    name: m.name.clone(),
                });
                Outcome::Done
            }
        }
    }

    /// The node provider refused to stop `name`: it may take tunnels again.
    pub fn handle_stop_refused(&mut self, name: &str) {
        if let Some(id) = self.ids.get(name).copied() {
            if let Some(n) = self.nodes.get_mut(&id) {
                n.leaving = false;
            }
        }
    }
}
