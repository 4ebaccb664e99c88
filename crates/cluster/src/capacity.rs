//! The elastic provisioning model of issue 5 (the `provision` crate) run on the live cluster's
//! load reports, for `protego ctl capacity`: what the model would reserve, which data nodes are
//! hotspots, and the decisions it takes each τ with their reasons.
//!
//! This is the autoscaler's advisory mode: the decisions are shown, not carried out (moving
//! tunnels and starting or stopping data nodes on its own comes with the node provider).
//!
//! Units: loads are throughput in Mbit/s, both directions of a tunnel together, against a
//! data node's capacity `[cluster] node_capacity_mbit`; the paper's CPU share of a tunnel is
//! proportional to it for packets of one size, and the data nodes' per-tunnel CPU time is
//! itself only an estimate from packet shares. A tunnel's cap σ is twice its `rate_limit`
//! (the steer nodes limit each direction), or 30 % of a node without one (the paper's σ).

use crate::manager::NodeLoad;
use ike::TunnelId;
use provision::{
    Cluster as Model, NodeId, NodeState, Plan, Planner, PlannerConfig, ProvisionError, UsageBook,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Decisions kept for `protego ctl capacity`.
const HISTORY: usize = 50;

/// The shortest step: a plan of 10 000 tunnels takes about 0.15 s, and the steps run in the
/// cluster's tick thread. With the default window of 1440 samples the histograms then cover
/// four hours (the paper's one-minute τ: a day).
pub(crate) const MIN_TAU: Duration = Duration::from_secs(10);

/// One data node as the model sees it.
#[derive(Debug, Clone)]
pub(crate) struct NodeInput {
    /// Its id in the cluster.
    pub(crate) id: u32,
    /// Its name.
    pub(crate) name: String,
    /// Alive and not drained by an operator (drained nodes are left out of the model).
    pub(crate) usable: bool,
    /// Alive (its reports count).
    pub(crate) alive: bool,
    /// Its last load report and that report's number (a report is recorded once).
    pub(crate) load: Option<(u64, NodeLoad)>,
}

/// The cluster's state for one step.
#[derive(Debug, Clone, Default)]
pub(crate) struct Input {
    /// Every registered data node.
    pub(crate) nodes: Vec<NodeInput>,
    /// Where each placed tunnel is.
    pub(crate) placement: Vec<(TunnelId, u32)>,
    /// Each configured tunnel's rate limit (Mbit/s per direction) and name.
    pub(crate) tunnels: BTreeMap<TunnelId, (String, Option<u32>)>,
}

/// The advisor: the usage histograms and the planner, stepped every τ.
pub(crate) struct Advisor {
    planner: Planner,
    usage: UsageBook,
    node_capacity: f64,
    last_consolidation: Option<Instant>,
    /// The report number last recorded per node.
    recorded: HashMap<u32, u64>,
    /// Tunnels with a usage histogram.
    seen: std::collections::HashSet<TunnelId>,
    last: Option<Step>,
    history: VecDeque<(u64, String)>,
}

/// What the last step found.
struct Step {
    at_ms: u64,
    plan: Plan,
    loads: BTreeMap<u32, f64>,
    names: HashMap<u32, String>,
    tunnels: usize,
    demand: f64,
    /// The plan's decisions with node and tunnel names.
    decisions: Vec<String>,
}

/// True if two actions advise the same thing (a start's expected time moves with the clock).
fn same_advice(a: &provision::Action, b: &provision::Action) -> bool {
    use provision::Action;
    match (a, b) {
        (Action::Start { node: x, .. }, Action::Start { node: y, .. }) => x == y,
        _ => a == b,
    }
}

/// `text` (a decision as the planner prints it, with `node<id>` and `tunnel<id>`) with the
/// names of the nodes and tunnels.
fn with_names(
    text: &str,
    nodes: &HashMap<u32, String>,
    tunnels: &BTreeMap<TunnelId, (String, Option<u32>)>,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let next = ["node", "tunnel"]
            .iter()
            .filter_map(|w| rest.find(w).map(|i| (i, *w)))
            .min();
        let Some((i, word)) = next else {
            out.push_str(rest);
            break;
        };
        let after = &rest[i + word.len()..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let boundary = rest[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_alphanumeric());
        let name = (boundary && digits > 0)
            .then(|| after[..digits].parse::<u32>().ok())
            .flatten()
            .and_then(|id| match word {
                "node" => nodes.get(&id).cloned(),
                _ => tunnels.get(&TunnelId(id)).map(|(n, _)| n.clone()),
            });
        out.push_str(&rest[..i]);
        match name {
            Some(n) => {
                out.push_str(&n);
                rest = &after[digits..];
            }
            None => {
                out.push_str(word);
                rest = after;
            }
        }
    }
    out
}

impl Advisor {
    /// An advisor for data nodes of `node_capacity_mbit`, stepped every `tau` (at least
    /// [`MIN_TAU`]).
    pub(crate) fn new(node_capacity_mbit: u32, tau: Duration) -> Result<Self, ProvisionError> {
        let tau = tau.max(MIN_TAU);
        let node_capacity = f64::from(node_capacity_mbit.max(1));
        let defaults = PlannerConfig::default();
        let config = PlannerConfig {
            node_capacity,
            default_sigma: defaults.default_sigma * node_capacity,
            tau,
            ..defaults
        };
        let planner = Planner::new(config)?;
        let usage = UsageBook::new(planner.config().usage_config())?;
        Ok(Self {
            planner,
            usage,
            node_capacity,
            last_consolidation: None,
            recorded: HashMap::new(),
            seen: std::collections::HashSet::new(),
            last: None,
            history: VecDeque::new(),
        })
    }

    /// How often the advisor wants a step.
    pub(crate) fn tau(&self) -> Duration {
        self.planner.config().tau
    }

    /// One step: records the new reports' usage, builds the model of the usable data nodes
    /// and their tunnels, and plans.
    pub(crate) fn step(
        &mut self,
        now: Instant,
        wall: SystemTime,
        input: &Input,
    ) -> Result<(), ProvisionError> {
        let mut model = Model::new();
        let mut usable: HashMap<u32, bool> = HashMap::new();
        let mut alpha: HashMap<TunnelId, f64> = HashMap::new();
        // This step's new measurements, summed over the nodes of a tunnel (two during a move).
        let mut fresh_alpha: HashMap<TunnelId, f64> = HashMap::new();
        let mut names = HashMap::new();
        for n in &input.nodes {
            usable.insert(n.id, n.usable);
            names.insert(n.id, n.name.clone());
            if n.usable {
                model.add_node(NodeId(n.id), NodeState::Active)?;
            }
            // A lost node's last report no longer describes anything.
            let Some((seq, load)) = n.load.as_ref().filter(|_| n.alive) else {
                continue;
            };
            let fresh = self.recorded.get(&n.id) != Some(seq);
            self.recorded.insert(n.id, *seq);
            // A node's first report covers everything since it started, not an interval.
            if load.interval_ms == 0 {
                continue;
            }
            let seconds = f64::from(load.interval_ms) / 1000.0;
            for (&t, &bytes) in &load.tunnel_bytes {
                let mbit = bytes as f64 * 8.0 / seconds / 1e6;
                let tunnel = TunnelId(t);
                *alpha.entry(tunnel).or_default() += mbit;
                if fresh {
                    *fresh_alpha.entry(tunnel).or_default() += mbit;
                }
            }
        }
        for (&tunnel, &mbit) in &fresh_alpha {
            if input.tunnels.contains_key(&tunnel) {
                let cap = self.sigma(input, tunnel);
                let t = provision::TunnelId(tunnel.0);
                self.usage.set_sigma(t, cap)?;
                self.usage.record(t, mbit.min(cap))?;
            }
        }
        // Tunnels no longer configured are forgotten.
        for gone in self
            .seen
            .iter()
            .filter(|t| !input.tunnels.contains_key(t))
            .copied()
            .collect::<Vec<_>>()
        {
            self.usage.remove(provision::TunnelId(gone.0));
            self.seen.remove(&gone);
        }
        self.seen
            .extend(fresh_alpha.keys().filter(|t| input.tunnels.contains_key(t)));
        for (tunnel, node) in &input.placement {
            if !input.tunnels.contains_key(tunnel) {
                continue;
            }
            let a = alpha
                .get(tunnel)
                .copied()
                .unwrap_or(0.0)
                .min(self.sigma(input, *tunnel));
            let t = provision::TunnelId(tunnel.0);
            model.add_tunnel(t, a)?;
            if usable.get(node).copied().unwrap_or(false) {
                model.assign(t, NodeId(*node))?;
            }
        }
        let plan = self
            .planner
            .plan(&model, &self.usage, now, self.last_consolidation)?;
        if plan.consolidation.is_some() {
            self.last_consolidation = Some(now);
        }
        let at_ms = wall
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let decisions: Vec<String> = plan
            .decisions
            .iter()
            .map(|d| with_names(&d.to_string(), &names, &input.tunnels))
            .collect();
        // Advice is not carried out, so the same decisions come back every step (with new
        // figures in their reasons): the history keeps a decision whose action is new.
        let previous: Vec<provision::Action> = self
            .last
            .iter()
            .flat_map(|l| l.plan.decisions.iter().map(|d| d.action))
            .collect();
        for (d, text) in plan.decisions.iter().zip(&decisions) {
            if previous.iter().any(|p| same_advice(p, &d.action)) {
                continue;
            }
            if self.history.len() == HISTORY {
                self.history.pop_front();
            }
            self.history.push_back((at_ms, text.clone()));
        }
        self.last = Some(Step {
            at_ms,
            loads: model
                .active_loads()
                .into_iter()
                .map(|(n, l)| (n.0, l.max(0.0)))
                .collect(),
            names,
            tunnels: model.tunnel_count(),
            demand: model.total_load(),
            plan,
            decisions,
        });
        Ok(())
    }

    /// A tunnel's cap σ in Mbit/s: both directions of its rate limit, else the default.
    fn sigma(&self, input: &Input, tunnel: TunnelId) -> f64 {
        match input.tunnels.get(&tunnel).and_then(|(_, limit)| *limit) {
            Some(mbit) => (2.0 * f64::from(mbit)).min(self.node_capacity),
            None => self.planner.config().default_sigma,
        }
    }

    /// What `protego ctl capacity` shows.
    pub(crate) fn describe(&self) -> serde_json::Value {
        let config = self.planner.config();
        let model = serde_json::json!({
            "node_capacity_mbit": self.node_capacity,
            "hotspot_threshold": config.hotspot_threshold,
            "epsilon": config.epsilon,
            "tau_ms": config.tau.as_millis() as u64,
            "consolidation_interval_s": config.consolidation_interval.as_secs(),
            "default_sigma_mbit": config.default_sigma,
        });
        let history: Vec<serde_json::Value> = self
            .history
            .iter()
            .map(|(at, d)| serde_json::json!({ "at_ms": at, "decision": d }))
            .collect();
        let Some(step) = &self.last else {
            return serde_json::json!({
                "mode": "advise",
                "model": model,
                "step": null,
                "decisions": history,
                "note": "no step yet: the first comes one report interval after start",
            });
        };
        let r = &step.plan.reservation;
        let nodes: Vec<serde_json::Value> = step
            .loads
            .iter()
            .map(|(id, load)| {
                serde_json::json!({
                    "node": step.names.get(id).cloned().unwrap_or_default(),
                    "used_mbit": load,
                    "utilization": load / self.node_capacity,
                    "hotspot": load / self.node_capacity > config.hotspot_threshold,
                })
            })
            .collect();
        let name = |n: &NodeId| {
            step.names
                .get(&n.0)
                .cloned()
                .unwrap_or_else(|| n.to_string())
        };
        serde_json::json!({
            "mode": "advise",
            "note": "decisions are shown, not carried out",
            "model": model,
            "step": {
                "at_ms": step.at_ms,
                "tunnels": step.tunnels,
                "used_mbit": step.demand,
                "nodes": nodes,
                "active": r.active,
                "reserved": r.reserved,
                "required": r.required,
                "predicted_mbit": r.capacity,
                "predicted_nodes": r.capacity_nodes,
                "mean_mbit": r.mean,
                "hotspots": step.plan.hotspots.iter().map(name).collect::<Vec<_>>(),
                "unplaced": step.plan.unplaced.len(),
                "consolidated": step.plan.consolidation.is_some(),
                "decisions": step.decisions,
            },
            "decisions": history,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(interval_ms: u32, mbit: &[(u32, f64)]) -> NodeLoad {
        NodeLoad {
            interval_ms,
            tunnel_bytes: mbit
                .iter()
                .map(|(t, m)| (*t, (m * 1e6 / 8.0 * f64::from(interval_ms) / 1000.0) as u64))
                .collect(),
            ..NodeLoad::default()
        }
    }

    fn input(seq: u64, a: &[(u32, f64)], b: &[(u32, f64)]) -> Input {
        Input {
            nodes: vec![
                NodeInput {
                    id: 1,
                    name: "data1".into(),
                    usable: true,
                    alive: true,
                    load: Some((seq, load(1000, a))),
                },
                NodeInput {
                    id: 2,
                    name: "data2".into(),
                    usable: true,
                    alive: true,
                    load: Some((seq, load(1000, b))),
                },
            ],
            placement: a
                .iter()
                .map(|(t, _)| (TunnelId(*t), 1))
                .chain(b.iter().map(|(t, _)| (TunnelId(*t), 2)))
                .collect(),
            tunnels: (1..=6)
                .map(|t| (TunnelId(t), (format!("t{t}"), Some(1000))))
                .collect(),
        }
    }

    #[test]
    fn a_hot_node_and_the_reserve_are_shown_with_reasons() {
        let mut a = Advisor::new(5000, Duration::from_secs(1)).unwrap();
        let t0 = Instant::now();
        assert!(a.describe()["step"].is_null());
        // data1 carries 4 × 1.2 Gbit/s = 4.8 of 5 Gbit/s (above T_H = 0.9); data2 a little.
        let hot = [(1, 1200.0), (2, 1200.0), (3, 1200.0), (4, 1200.0)];
        a.step(t0, SystemTime::now(), &input(1, &hot, &[(5, 100.0)]))
            .unwrap();
        let d = a.describe();
        let step = &d["step"];
        assert_eq!(d["mode"], "advise");
        assert_eq!(step["tunnels"], 5);
        assert!(
            (step["used_mbit"].as_f64().unwrap() - 4900.0).abs() < 1.0,
            "{d}"
        );
        let decisions: Vec<&str> = step["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        // The first step consolidates; either way tunnels leave data1, named as operators
        // know them, and no node stays above T_H.
        assert!(
            decisions
                .iter()
                .any(|d| d.starts_with("migrate t") && d.contains("data1 -> data2")),
            "{decisions:?}"
        );
        assert!(step["hotspots"].as_array().unwrap().is_empty(), "{d}");
        assert!(step["required"].as_u64().unwrap() >= 2, "{d}");
        assert_eq!(d["decisions"].as_array().unwrap().len(), decisions.len());
        let first = decisions.len();
        // The same report again is not recorded twice; a drained node leaves the model.
        let mut again = input(1, &hot, &[(5, 100.0)]);
        again.nodes[1].usable = false;
        a.step(t0 + Duration::from_secs(1), SystemTime::now(), &again)
            .unwrap();
        let d = a.describe();
        let nodes = d["step"]["nodes"].as_array().unwrap();
        assert!(nodes.iter().all(|n| n["node"] != "data2"), "{d}");
        // Advice repeated from one step to the next is kept in the history once.
        let repeated = d["step"]["decisions"].as_array().unwrap().len();
        a.step(t0 + Duration::from_secs(2), SystemTime::now(), &again)
            .unwrap();
        let d = a.describe();
        assert_eq!(
            d["decisions"].as_array().unwrap().len(),
            first + repeated,
            "{d}"
        );
    }

    #[test]
    fn first_reports_and_lost_nodes_do_not_count() {
        let mut a = Advisor::new(5000, Duration::from_secs(1)).unwrap();
        assert_eq!(a.tau(), MIN_TAU);
        let mut i = input(1, &[(1, 1000.0)], &[(2, 1000.0)]);
        // data1's first report covers its whole life (no interval); data2 was lost.
        if let Some((_, l)) = i.nodes[0].load.as_mut() {
            l.interval_ms = 0;
        }
        i.nodes[1].alive = false;
        i.nodes[1].usable = false;
        a.step(Instant::now(), SystemTime::now(), &i).unwrap();
        let d = a.describe();
        assert_eq!(d["step"]["used_mbit"].as_f64(), Some(0.0), "{d}");
        assert!(a
            .usage
            .get(provision::TunnelId(1))
            .is_none_or(|h| h.samples() == 0));
        assert!(a
            .usage
            .get(provision::TunnelId(2))
            .is_none_or(|h| h.samples() == 0));
    }

    #[test]
    fn decisions_name_nodes_and_tunnels() {
        let nodes: HashMap<u32, String> =
            [(1, "data1".to_owned()), (12, "data12".to_owned())].into();
        let tunnels: BTreeMap<TunnelId, (String, Option<u32>)> =
            [(TunnelId(1), ("acme-hq".to_owned(), None))].into();
        assert_eq!(
            with_names(
                "migrate tunnel1 node12 -> node1: node1 is a hotspot; node7 subnode1",
                &nodes,
                &tunnels
            ),
            "migrate acme-hq data12 -> data1: data1 is a hotspot; node7 subnode1"
        );
    }

    #[test]
    fn caps_follow_rate_limits_and_unknown_tunnels_are_ignored() {
        let mut a = Advisor::new(5000, Duration::from_secs(1)).unwrap();
        let mut i = input(1, &[(1, 9000.0), (99, 100.0)], &[]);
        i.tunnels.get_mut(&TunnelId(1)).unwrap().1 = Some(500);
        a.step(Instant::now(), SystemTime::now(), &i).unwrap();
        let d = a.describe();
        // Tunnel 1 is capped at twice its 500 Mbit/s limit; tunnel 99 is not configured.
        assert_eq!(d["step"]["tunnels"], 1, "{d}");
        assert!(
            (d["step"]["used_mbit"].as_f64().unwrap() - 1000.0).abs() < 1e-6,
            "{d}"
        );
    }
}
