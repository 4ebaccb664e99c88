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

use super::Cluster;
use crate::capacity::{Input, Naming, Outcome};
use crate::provider::{ProvidedState, ProviderError};
use control::config::AutoscaleMode;
use provision::Plan;
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

    /// The cluster and the autoscaler as the metrics show them.
    pub(crate) fn metrics_view(
        &self,
    ) -> (
        crate::core::Status,
        Option<crate::capacity::AutoscalerFigures>,
    ) {
        let figures = (self.autoscaler.lock())
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .as_ref()
            .map(crate::capacity::Autoscaler::figures);
        (self.state().core.status(), figures)
    }

    /// The model's input now, and the names of its nodes by id.
    fn autoscale_input(&self) -> (Input, HashMap<u32, String>) {
        let provided = self
            .provider
            .as_ref()
            .map(|p| p.nodes())
            .unwrap_or_default();
        self.state()
            .core
            .autoscale_input(self.provider.is_some(), provided)
    }

    /// Carries out `plan`'s decisions in order; returns what became of each.
    fn carry_out(&self, plan: &Plan, input: &Input) -> Vec<Outcome> {
        let (effects, q) = {
            let mut sh = self.state();
            let effects = sh.core.handle_plan(plan, input, self.provider.is_some());
            let q = self.carry(&mut sh, None);
            (effects, q)
        };
        let mut outcomes = effects.outcomes;
        // The steering the plan changed (attachments leaving a node to stop) is confirmed
        // before the provider is asked.
        self.finish(q);
        // Starts and stops are asked of the provider without the state lock held.
        if let Some(provider) = &self.provider {
            for call in effects.provider_calls {
                let (i, start, name) = (call.decision, call.start, call.name);
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
                            self.state().core.handle_stop_refused(&name);
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
        outcomes
    }
}
