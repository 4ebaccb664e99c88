//! The autoscaler's side of the cluster: the model's input from the registry, the load
//! reports and the node provider, and (`[cluster.autoscale] mode = "act"`) carrying a plan
//! out:
//!
//! - `Migrate` and `Place` change the tunnel's placement and rekey it (the zero-loss move of
//!   [`Cluster::migrate`]: the new CHILD_SA lands on the target while the old one works);
//! - `Activate` unparks a data node, `Deactivate` parks an empty one (it stays registered,
//!   with every VNet and table: warm, and back at once);
//! - `Start` and `Stop` go to the node provider; a node stops only when parked and empty.
//!
//! Each decision that cannot be carried out says why (`protego ctl capacity`); the next step
//! plans again from what the cluster then is.

use super::{Cluster, Role, Task};
use crate::capacity::{Input, Naming, NodeInput, Outcome};
use crate::provider::{ProvidedState, ProviderError};
use control::config::AutoscaleMode;
use ike::TunnelId;
use provision::{Action, Plan};
use std::collections::HashMap;
use std::time::Instant;
use tracing::{error, info, warn};

impl Cluster {
    /// One autoscaler step, if its τ has passed since the last (from the autoscaler thread,
    /// [`crate::control_node`]): builds the model's input, plans, and in act mode carries the
    /// plan out.
    pub fn autoscale(&self, now: Instant) {
        let mut guard = self
            .autoscaler
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (Some(a), last) = &mut *guard else {
            return;
        };
        if last.is_some_and(|t| now.saturating_duration_since(t) < a.tau()) {
            // The provider escalates stops and reaps its processes when asked for its nodes.
            if let Some(p) = &self.provider {
                drop(p.nodes());
            }
            return;
        }
        *last = Some(now);
        let (input, names) = self.autoscale_input();
        // Nodes started long ago that never registered (a wrong certificate or control
        // address, a hung process): stopped, and counted as failed.
        if let Some(p) = &self.provider {
            for (id, name) in a.stuck(&input, now) {
                warn!(node = %name, "autoscaler: started data node never registered; stopping it");
                if let Err(e) = p.stop(&name) {
                    warn!(node = %name, error = %e, "autoscaler: node provider refused");
                }
                a.note_failure(id, now);
            }
        }
        // A fault in the model must not take the control node down with it.
        let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let plan = a.step(now, std::time::SystemTime::now(), &input)?;
            let outcomes = match a.mode() {
                AutoscaleMode::Advise => vec![Outcome::Advised; plan.decisions.len()],
                AutoscaleMode::Act => self.carry_out(&plan, &input),
            };
            let naming = Naming {
                nodes: &names,
                tunnels: &input.tunnels,
            };
            a.record(now, &naming, outcomes);
            Ok::<(), provision::ProvisionError>(())
        }));
        match step {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, "autoscaler step failed"),
            Err(_) => {
                error!("autoscaler panicked; disabled");
                guard.0 = None;
            }
        }
    }

    /// What the autoscaler found and did (`protego ctl capacity`).
    pub fn capacity(&self) -> serde_json::Value {
        let guard = self
            .autoscaler
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut v = match &guard.0 {
            Some(a) => a.describe(),
            None => {
                return serde_json::json!({ "error": "the autoscaler is disabled (see the log)" })
            }
        };
        v["provider"] = match &self.provider {
            None => serde_json::Value::Null,
            Some(p) => serde_json::json!({
                "kind": p.kind(),
                "nodes": p.nodes().iter().map(|n| {
                    let (state, reason) = match &n.state {
                        ProvidedState::Stopped => ("stopped", None),
                        ProvidedState::Running { .. } => ("running", None),
                        ProvidedState::Stopping => ("stopping", None),
                        ProvidedState::Failed { reason } => ("failed", Some(reason.clone())),
                    };
                    serde_json::json!({ "node": n.name, "state": state, "reason": reason })
                }).collect::<Vec<_>>(),
            }),
        };
        v
    }

    /// The model's input now, and the names of its nodes by id.
    fn autoscale_input(&self) -> (Input, HashMap<u32, String>) {
        let provided = self
            .provider
            .as_ref()
            .map(|p| p.nodes())
            .unwrap_or_default();
        let inventory = self.inventory();
        let mut st = self.state();
        let mut nodes: Vec<NodeInput> = st
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
            let id = Self::id_of(&mut st, &p.name);
            match nodes.iter_mut().find(|n| n.id == id) {
                Some(n) => n.provided = Some(p.state),
                // Not registered (or a steer node of the same name, which the provider's
                // configuration check rules out): only the provider knows it.
                None if st.nodes.get(&id).is_none_or(|n| n.role == Role::Data) => {
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
        let input = Input {
            provider: self.provider.is_some(),
            nodes,
            placement: st.placement.iter().map(|(t, n)| (*t, *n)).collect(),
            tunnels: inventory
                .tunnels
                .values()
                .map(|t| (t.id, (t.name.clone(), t.rate_limit_mbit)))
                .collect(),
        };
        (input, names)
    }

    /// Carries out `plan`'s decisions in order; returns what became of each.
    fn carry_out(&self, plan: &Plan, input: &Input) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(plan.decisions.len());
        let mut rekey: Vec<TunnelId> = Vec::new();
        // Where each moved tunnel was: one moved and moved back is not rekeyed.
        let mut origin: HashMap<TunnelId, Option<u32>> = HashMap::new();
        // Starts and stops are asked of the provider without the state lock held.
        let mut provider_calls: Vec<(usize, bool, String)> = Vec::new();
        {
            let mut st = self.state();
            // A parked node that holds tunnels (a fallback placement, a takeover) is serving:
            // the model counted it active.
            let serving: Vec<u32> = st.placement.values().copied().collect();
            for id in serving {
                if let Some(n) = st.nodes.get_mut(&id) {
                    n.parked = false;
                }
            }
            for (i, d) in plan.decisions.iter().enumerate() {
                let outcome = match d.action {
                    Action::Activate { node } => match st.nodes.get_mut(&node.0) {
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
                        let holds = st.placement.values().any(|n| *n == node.0);
                        match st.nodes.get_mut(&node.0) {
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
                        let t = TunnelId(tunnel.0);
                        match st.nodes.get_mut(&node.0) {
                            Some(n) if n.role == Role::Data && n.alive && !n.draining => {
                                n.parked = false;
                                if st.placement.get(&t) != Some(&node.0) {
                                    let was = st.placement.insert(t, node.0);
                                    origin.entry(t).or_insert(was);
                                    if st.children.values().any(|c| c.tunnel == t) {
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
                        match (&self.provider, stopped) {
                            (None, _) => Outcome::Skipped("no node provider is configured".into()),
                            (Some(_), None) => Outcome::Skipped(
                                "the node provider has no stopped data node left".into(),
                            ),
                            (Some(_), Some(n)) => {
                                provider_calls.push((i, true, n.name.clone()));
                                Outcome::Done
                            }
                        }
                    }
                    Action::Stop { node } => {
                        // Not while a CHILD_SA is on it, nor while steer nodes still send it
                        // late packets of removed ones (their grace).
                        let holds = st.placement.values().any(|n| *n == node.0)
                            || st.children.values().any(|c| c.node == Some(node.0))
                            || st.retiring.iter().any(|r| r.node == Some(node.0));
                        let managed = input
                            .nodes
                            .iter()
                            .find(|n| n.id == node.0 && n.provided.is_some());
                        match (&self.provider, managed, st.nodes.get(&node.0)) {
                            (None, _, _) => {
                                Outcome::Skipped("no node provider is configured".into())
                            }
                            (Some(_), None, _) => {
                                Outcome::Skipped("the node provider does not manage it".into())
                            }
                            _ if holds => Outcome::Skipped("tunnels are still on it".into()),
                            (Some(_), Some(_), Some(n)) if n.alive && !n.parked => {
                                Outcome::Skipped("it is active".into())
                            }
                            // A node stops from the reserve, once it has joined it: a start
                            // is not undone before the node could be used.
                            (Some(_), Some(m), _) if !m.alive => {
                                Outcome::Skipped("it is still starting".into())
                            }
                            (Some(_), Some(m), _)
                                if !matches!(m.provided, Some(ProvidedState::Running { .. })) =>
                            {
                                Outcome::Skipped("the node provider does not run it".into())
                            }
                            (Some(_), Some(m), _) => {
                                // Nothing is placed on it from now on, not even as a fallback.
                                if let Some(n) = st.nodes.get_mut(&node.0) {
                                    n.leaving = true;
                                }
                                provider_calls.push((i, false, m.name.clone()));
                                Outcome::Done
                            }
                        }
                    }
                };
                outcomes.push(outcome);
            }
            // Each tunnel rekeyed once, and only if it ends elsewhere.
            rekey.sort_unstable();
            rekey.dedup();
            rekey.retain(|t| origin.get(t).copied().flatten() != st.placement.get(t).copied());
        }
        if let Some(provider) = &self.provider {
            for (i, start, name) in provider_calls {
                let result = if start {
                    provider.start(&name)
                } else {
                    provider.stop(&name)
                };
                match result {
                    Ok(()) => info!(
                        node = %name,
                        action = if start { "start" } else { "stop" },
                        "autoscaler: asked the node provider"
                    ),
                    Err(e) => {
                        warn!(node = %name, error = %e, "autoscaler: node provider refused");
                        if !start {
                            let mut st = self.state();
                            if let Some(id) = st.ids.get(&name).copied() {
                                if let Some(n) = st.nodes.get_mut(&id) {
                                    n.leaving = false;
                                }
                            }
                        }
                        outcomes[i] = Outcome::Skipped(match e {
                            ProviderError::UnknownNode(_) => {
                                "the node provider does not manage it".into()
                            }
                            other => other.to_string(),
                        });
                    }
                }
            }
        }
        if !rekey.is_empty() {
            info!(tunnels = rekey.len(), "autoscaler: migrating tunnels");
            let _ = self.tasks.send(Task::Rekey(rekey, "autoscaler"));
        }
        outcomes
    }
}
