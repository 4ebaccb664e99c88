//! The shell's side of tenant filters and CPU fairness (issue 18, distributed form): the
//! control node ships the whole filter set and the fairness mode and weights to every data
//! node, and reads the filters' counters and the tenants' CPU from the nodes' reports.
//!
//! Every data node gets every tenant's filters, not only the nodes serving the tenant's
//! tunnels now: a tunnel moves to another node by a rekey (a migration, a drain, a failover)
//! that must not wait for programs to be verified and compiled there, and a node that runs
//! no traffic of a tenant spends nothing on its filters but their memory.
//!
//! A set travels as one `stage_filter_object` per object the node does not hold yet (each at
//! most 1 MiB, so no message grows with the number of tenants), then one `set_filters` naming
//! the objects by SHA-256. The node applies directives in order, so a node that registers
//! gets the set right after its inside configuration and before any CHILD_SA placed on it.
//!
//! Map contents are per data node, as a per-CPU map's are per CPU: `filter map update` and
//! `delete` go to every live data node, `dump` answers each node's entries by name. A node
//! that registers (a new one, a restarted one) gets the tenants' map settings (the updates the
//! control node's store keeps, `control::filters`) written into its maps right after its
//! filter set; what the programs wrote themselves starts as the objects declare it.

use super::{Cluster, Shell};
use crate::core::Role;
use crate::link::{each_answer, Ack, Answer, LinkError};
use datapath::{
    CpuFairnessConfig, DataplaneError, FilterConfig, FilterMapAnswer, FilterMapNode, FilterMapOp,
    FilterMapReport, FilterMapSetting, FilterProgramReport, FilterReport, TenantStats,
};
use ids::TenantId;
use rpc::convert::ObjectDigest;
use rpc::pb;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use tracing::{info, warn};

/// What one data node last reported of its filters and tenants.
#[derive(Debug, Clone, Default)]
pub struct FilterUsage {
    /// Each running filter's counters (cumulative on the node).
    pub programs: Vec<FilterProgramReport>,
    /// Its filters' maps.
    pub maps: Vec<FilterMapReport>,
    /// The CPU charged to each tenant (cumulative on the node).
    pub tenants: Vec<TenantStats>,
}

/// The filter set and fairness as the data nodes get them, and what they report.
#[derive(Default)]
pub(super) struct FilterShip {
    /// The running set.
    filters: Vec<FilterConfig>,
    /// Its objects (each once) and its message.
    objects: rpc::convert::FilterObjects,
    set: pb::Filters,
    /// The fairness mode and weights.
    fairness: CpuFairnessConfig,
    /// The tenants' map settings, written into the maps of each node that registers.
    settings: Vec<FilterMapSetting>,
    /// Per data node: the objects sent on its current session (it holds them until a set
    /// leaves them out).
    held: HashMap<u32, HashSet<ObjectDigest>>,
    /// Per data node: its last report.
    reports: HashMap<u32, FilterUsage>,
}

impl FilterShip {
    /// Makes `filters` the running set.
    fn replace(&mut self, filters: &[FilterConfig]) -> Vec<FilterConfig> {
        let (objects, set) = rpc::convert::filters_to_pb(filters);
        self.objects = objects;
        self.set = set;
        std::mem::replace(&mut self.filters, filters.to_vec())
    }
}

/// How long a data node may take to take a filter set: it verifies and compiles every
/// program of it (far longer than a usual directive, for a large set).
const FILTER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// The answers a shipment waits for: (node, name, answer).
type Waiting = Vec<(u32, String, Ack)>;

impl Cluster {
    /// The data nodes with an open session: (id, name).
    fn data_sessions(sh: &Shell) -> Vec<(u32, String)> {
        let mut nodes: Vec<(u32, String)> = sh
            .core
            .nodes()
            .iter()
            .filter(|(id, n)| {
                n.role == Role::Data
                    && n.session_open
                    && sh.links.get(id).is_some_and(|l| !l.is_closed())
            })
            .map(|(id, n)| (*id, n.name.clone()))
            .collect();
        nodes.sort_by(|a, b| a.1.cmp(&b.1));
        nodes
    }

    /// Queues the running filter set to data node `id` (the objects it does not hold, then
    /// the set); returns the answers to wait for.
    fn queue_filters(sh: &mut Shell, id: u32) -> Result<Vec<Ack>, LinkError> {
        let link = Arc::clone(sh.links.get(&id).ok_or(LinkError::Closed)?);
        let ship = &mut sh.filters;
        let held = ship.held.entry(id).or_default();
        let mut acks = Vec::new();
        for (digest, object) in &ship.objects {
            if held.contains(digest) {
                continue;
            }
            let op =
                pb::directive::Op::StageFilterObject(rpc::convert::filter_object_to_pb(object));
            acks.push(link.submit(op)?);
            held.insert(*digest);
        }
        acks.push(link.submit(pb::directive::Op::SetFilters(ship.set.clone()))?);
        // Once the set is taken the node keeps only what it names.
        held.retain(|d| ship.objects.iter().any(|(o, _)| o == d));
        Ok(acks)
    }

    /// Queues the fairness mode and weights to data node `id`.
    fn queue_fairness(sh: &Shell, id: u32) -> Result<Ack, LinkError> {
        let link = sh.links.get(&id).ok_or(LinkError::Closed)?;
        link.submit(pb::directive::Op::SetCpuFairness(
            rpc::convert::cpu_fairness_to_pb(&sh.filters.fairness),
        ))
    }

    /// A data node registered (its session is new: it may hold other objects, or none):
    /// queues its fairness and filters right after its inside configuration, before anything
    /// can be placed on it. Not waited for (its answers come once the registration
    /// returned); a refusal is logged, and makes the next shipment resend every object.
    pub(super) fn filters_on_hello(&self, sh: &mut Shell, id: u32, name: &str) {
        sh.filters.held.remove(&id);
        sh.filters.reports.remove(&id);
        // Not current until it answers (nothing is placed on it while another node can take
        // it): a node that refuses the set would run its tenants' tunnels without their filters.
        sh.core
            .set_filters_current(id, sh.filters.filters.is_empty());
        let deadline = self.filter_deadline();
        let node = name.to_owned();
        match Self::queue_fairness(sh, id) {
            Ok(ack) => ack.on_answer(deadline, move |a| {
                if let Err(e) = a {
                    warn!(node = %node, error = %e, "data node did not take the CPU fairness mode and weights");
                }
            }),
            Err(e) => warn!(node = %name, error = %e, "cannot send the CPU fairness mode"),
        }
        // Also an empty set: a node may hold filters another control node sent it.
        match Self::queue_filters(sh, id) {
            Ok(acks) => {
                let state = Arc::clone(&self.state);
                let node = name.to_owned();
                let filters = sh.filters.filters.len();
                // The set's answer comes after its objects' (the node answers in order).
                if let Some(last) = acks.into_iter().last() {
                    last.on_answer(deadline, move |a| match a {
                        Ok(_) => {
                            info!(node = %node, filters, "data node runs the tenant filters");
                            let mut sh = state.lock().unwrap_or_else(|e| e.into_inner());
                            sh.core.set_filters_current(id, true);
                        }
                        // Still verifying: it takes its directives in order, so a tunnel placed
                        // on it now is installed after the set.
                        Err(LinkError::Timeout(_)) => {
                            warn!(node = %node, "data node has not answered the tenant filters yet; taken as current (it applies its directives in order)");
                            let mut sh = state.lock().unwrap_or_else(|e| e.into_inner());
                            sh.core.set_filters_current(id, true);
                        }
                        Err(e) => {
                            warn!(node = %node, error = %e, "data node did not take the tenant filters; nothing new is placed on it while another node can take it");
                            let mut sh = state.lock().unwrap_or_else(|e| e.into_inner());
                            sh.filters.held.remove(&id);
                            sh.core.set_filters_current(id, false);
                        }
                    });
                }
            }
            Err(e) => warn!(node = %name, error = %e, "cannot send the tenant filters"),
        }
        self.queue_settings(sh, id, name);
    }

    /// Queues the tenants' map settings to data node `id`, after its filter set: each as an
    /// update of its key. Not waited for; a node that refuses one (its set refused, or a
    /// per-CPU value that does not fit its workers) is logged.
    fn queue_settings(&self, sh: &Shell, id: u32, name: &str) {
        let Some(link) = sh.links.get(&id) else {
            return;
        };
        let deadline = self.filter_deadline();
        for s in &sh.filters.settings {
            let op = FilterMapOp::Update {
                key: s.key.clone(),
                value: s.value.clone(),
                flags: 0,
            };
            let request = rpc::convert::filter_map_request_to_pb(&s.tenant, &s.map, &op);
            let (node, tenant, map) = (name.to_owned(), s.tenant.clone(), s.map.clone());
            match link.submit(pb::directive::Op::FilterMap(request)) {
                Ok(ack) => ack.on_answer(deadline, move |a| {
                    if let Err(e) = a {
                        warn!(node = %node, tenant = %tenant, map = %map, error = %e, "data node did not take a tenant's map setting");
                    }
                }),
                Err(e) => {
                    warn!(node = %name, error = %e, "cannot send the tenants' map settings");
                    return;
                }
            }
        }
    }

    /// Keeps `settings` for the data nodes that register from now on (those registered
    /// have them: each update went to every live node).
    pub(super) fn cluster_keep_filter_settings(&self, settings: &[FilterMapSetting]) {
        self.state().filters.settings = settings.to_vec();
    }

    /// When a filter set's (or the fairness') answers are due.
    fn filter_deadline(&self) -> std::time::Instant {
        std::time::Instant::now() + self.settings.directive_timeout.max(FILTER_TIMEOUT)
    }

    /// Waits for `waiting` and returns the failures by node name (a node whose session closed
    /// meanwhile is not one: it gets the current set when it registers again).
    fn failures(
        &self,
        waiting: Waiting,
        deadline: std::time::Instant,
    ) -> Vec<(u32, String, String)> {
        let (who, acks): (Vec<(u32, String)>, Vec<Ack>) = waiting
            .into_iter()
            .map(|(id, name, ack)| ((id, name), ack))
            .unzip();
        let mut failed: BTreeMap<u32, (String, String)> = BTreeMap::new();
        each_answer(&acks, deadline, |i, answer| {
            let (id, name) = &who[i];
            match answer {
                Ok(_) | Err(LinkError::Closed) => {}
                Err(e) => {
                    failed
                        .entry(*id)
                        .or_insert_with(|| (name.clone(), reason(&e)));
                }
            }
        });
        failed
            .into_iter()
            .map(|(id, (name, why))| (id, name, why))
            .collect()
    }

    /// Sends `filters` to every data node with a session (see [`DataPath::set_filters`]).
    fn ship_filters(&self, filters: &[FilterConfig]) -> (Vec<FilterConfig>, Waiting) {
        let mut sh = self.state();
        let old = sh.filters.replace(filters);
        let mut waiting = Vec::new();
        for (id, name) in Self::data_sessions(&sh) {
            match Self::queue_filters(&mut sh, id) {
                Ok(acks) => waiting.extend(acks.into_iter().map(|a| (id, name.clone(), a))),
                Err(e) => debug_closed(&name, &e),
            }
        }
        (old, waiting)
    }

    /// Every data node with a session gets `filters`, and has answered when this returns. A
    /// node that refuses (a program its data plane does not verify) or does not answer fails
    /// the call with its reason; the nodes then get the previous set back. A node without a
    /// session gets the set when it registers.
    pub(super) fn cluster_set_filters(
        &self,
        filters: &[FilterConfig],
    ) -> Result<(), DataplaneError> {
        let (old, waiting) = self.ship_filters(filters);
        let nodes: HashSet<u32> = waiting.iter().map(|w| w.0).collect();
        let failed = self.failures(waiting, self.filter_deadline());
        if failed.is_empty() {
            let mut sh = self.state();
            for id in &nodes {
                sh.core.set_filters_current(*id, true);
            }
            drop(sh);
            info!(
                filters = filters.len(),
                nodes = nodes.len(),
                "tenant filters sent to the data nodes"
            );
            return Ok(());
        }
        {
            let mut sh = self.state();
            for (id, _, _) in &failed {
                sh.filters.held.remove(id);
            }
        }
        // The nodes that took the new set get the old one back; one that refuses it too runs
        // neither as far as control knows.
        let (_, back) = self.ship_filters(&old);
        let sent_back: HashSet<u32> = back.iter().map(|w| w.0).collect();
        let refused = self.failures(back, self.filter_deadline());
        let mut sh = self.state();
        for id in &sent_back {
            sh.core.set_filters_current(*id, true);
        }
        for (id, name, why) in &refused {
            warn!(node = %name, error = %why, "data node did not take the previous tenant filters back; nothing new is placed on it while another node can take it");
            sh.filters.held.remove(id);
            sh.core.set_filters_current(*id, false);
        }
        drop(sh);
        Err(DataplaneError::Nodes {
            failures: failed.into_iter().map(|(_, n, w)| (n, w)).collect(),
        })
    }

    /// Every data node with a session gets the fairness mode and weights, and has answered
    /// (within `directive_timeout`) when this returns; a node that refuses (one whose
    /// time-stamp counter cannot be used) fails the call with its reason. Nodes registering later get them at registration.
    pub(super) fn cluster_set_cpu_fairness(
        &self,
        fairness: &CpuFairnessConfig,
    ) -> Result<(), DataplaneError> {
        let mut waiting = Vec::new();
        {
            let mut sh = self.state();
            sh.filters.fairness = fairness.clone();
            for (id, name) in Self::data_sessions(&sh) {
                match Self::queue_fairness(&sh, id) {
                    Ok(a) => waiting.push((id, name, a)),
                    Err(e) => debug_closed(&name, &e),
                }
            }
        }
        // Within the usual directive timeout: an apply calls this from the control loop.
        let failed = self.failures(waiting, self.deadline());
        if failed.is_empty() {
            return Ok(());
        }
        Err(DataplaneError::Nodes {
            failures: failed.into_iter().map(|(_, n, w)| (n, w)).collect(),
        })
    }

    /// A data node's report of its filters and tenants.
    pub fn filters_reported(&self, id: u32, usage: FilterUsage) {
        let mut sh = self.state();
        if sh.core.node(id).is_some_and(|n| n.role == Role::Data) {
            sh.filters.reports.insert(id, usage);
        }
    }

    /// The reports of the data nodes with a session.
    fn live_reports(sh: &Shell) -> Vec<&FilterUsage> {
        Self::data_sessions(sh)
            .iter()
            .filter_map(|(id, _)| sh.filters.reports.get(id))
            .collect()
    }

    /// The running filters (of `tenant`, or all) with their counters summed over the data
    /// nodes' last reports, and their maps (each once; `entries` summed over the nodes).
    pub(super) fn cluster_filter_report(&self, tenant: Option<&TenantId>) -> FilterReport {
        let sh = self.state();
        let reports = Self::live_reports(&sh);
        let programs = sh
            .filters
            .filters
            .iter()
            .filter(|f| tenant.is_none_or(|t| *t == f.tenant))
            .map(|f| {
                let mut p = FilterProgramReport {
                    tenant: f.tenant.clone(),
                    direction: f.direction,
                    section: f.section.clone(),
                    object_name: f.object_name.clone(),
                    weight: f.weight,
                    instructions: 0,
                    counters: datapath::FilterCounters::default(),
                };
                for r in reports.iter().flat_map(|u| &u.programs).filter(|r| {
                    r.tenant == f.tenant && r.direction == f.direction && r.section == f.section
                }) {
                    p.instructions = p.instructions.max(r.instructions);
                    add_counters(&mut p.counters, &r.counters);
                }
                p
            })
            .collect();
        let mut maps: Vec<FilterMapReport> = Vec::new();
        for m in reports
            .iter()
            .flat_map(|u| &u.maps)
            .filter(|m| tenant.is_none_or(|t| *t == m.tenant))
        {
            match maps.iter_mut().find(|k| {
                k.tenant == m.tenant && k.object_name == m.object_name && k.name == m.name
            }) {
                Some(k) => {
                    k.entries = k.entries.saturating_add(m.entries);
                    k.copies = k.copies.max(m.copies);
                }
                None => maps.push(m.clone()),
            }
        }
        maps.sort_by(|a, b| {
            (&a.tenant, &a.object_name, &a.name).cmp(&(&b.tenant, &b.object_name, &b.name))
        });
        FilterReport { programs, maps }
    }

    /// The CPU charged to each tenant, summed over the data nodes' last reports (tokens too:
    /// each node's workers hold their own buckets).
    pub(super) fn cluster_tenant_stats(&self) -> Vec<TenantStats> {
        let sh = self.state();
        let mut by_tenant: BTreeMap<String, TenantStats> = BTreeMap::new();
        for t in Self::live_reports(&sh).iter().flat_map(|u| &u.tenants) {
            let e = by_tenant
                .entry(t.tenant.as_str().to_owned())
                .or_insert_with(|| TenantStats {
                    tenant: t.tenant.clone(),
                    cpu_weight: t.cpu_weight,
                    cpu_ns: 0,
                    packets: 0,
                    fair_drops: 0,
                    tokens_ns: None,
                    recent_cpu_ns: 0,
                });
            e.cpu_ns = e.cpu_ns.saturating_add(t.cpu_ns);
            e.recent_cpu_ns = e.recent_cpu_ns.saturating_add(t.recent_cpu_ns);
            e.packets = e.packets.saturating_add(t.packets);
            e.fair_drops = e.fair_drops.saturating_add(t.fair_drops);
            if let Some(tokens) = t.tokens_ns {
                e.tokens_ns = Some(e.tokens_ns.unwrap_or(0).saturating_add(tokens));
            }
        }
        by_tenant.into_values().collect()
    }

    /// Reads or changes map `map` of `tenant`'s filters on every data node with a session
    /// (each holds its own copy). A dump answers each node's entries by name; an update or
    /// delete is applied on every node, and a node that refuses fails the call with its
    /// reason (the others applied it: the error names those too).
    pub(super) fn cluster_filter_map(
        &self,
        tenant: &TenantId,
        map: &str,
        op: FilterMapOp,
    ) -> Result<FilterMapAnswer, DataplaneError> {
        let request = rpc::convert::filter_map_request_to_pb(tenant, map, &op);
        let mut waiting = Vec::new();
        {
            let sh = self.state();
            for (id, name) in Self::data_sessions(&sh) {
                if let Some(link) = sh.links.get(&id) {
                    match link.submit(pb::directive::Op::FilterMap(request.clone())) {
                        Ok(a) => waiting.push((name, a)),
                        Err(e) => debug_closed(&name, &e),
                    }
                }
            }
        }
        if waiting.is_empty() {
            return Err(DataplaneError::FilterMap {
                map: map.to_owned(),
                reason: "no data node has a session with this control node".into(),
            });
        }
        let (names, acks): (Vec<String>, Vec<Ack>) = waiting.into_iter().unzip();
        let mut answers: Vec<(String, FilterMapAnswer)> = Vec::new();
        let mut failures: Vec<(String, String)> = Vec::new();
        each_answer(&acks, self.deadline(), |i, answer| {
            let name = names[i].clone();
            match answer {
                Ok(Answer::FilterMap(r)) => match rpc::convert::filter_map_answer_from_pb(*r) {
                    Ok(a) => answers.push((name, a)),
                    Err(e) => failures.push((name, format!("unreadable answer: {e}"))),
                },
                Ok(_) => failures.push((name, "answered without the map".into())),
                Err(LinkError::Closed) => {}
                Err(e) => failures.push((name, reason(&e))),
            }
        });
        answers.sort_by(|a, b| a.0.cmp(&b.0));
        failures.sort();
        if !failures.is_empty() {
            if !matches!(op, FilterMapOp::Dump) && !answers.is_empty() {
                let applied: Vec<&str> = answers.iter().map(|a| a.0.as_str()).collect();
                failures.push((
                    applied.join(", "),
                    "applied the change (it is not undone)".into(),
                ));
            }
            return Err(DataplaneError::Nodes { failures });
        }
        let Some((_, first)) = answers.first() else {
            return Err(DataplaneError::FilterMap {
                map: map.to_owned(),
                reason: "every data node's session closed before it answered".into(),
            });
        };
        let mut info = first.map.clone();
        info.entries = answers.iter().map(|(_, a)| a.map.entries).sum();
        Ok(FilterMapAnswer {
            map: info,
            entries: Vec::new(),
            nodes: answers
                .into_iter()
                .map(|(node, a)| FilterMapNode {
                    node,
                    entries: a.entries,
                })
                .collect(),
        })
    }
}

/// A node's failure as the operator reads it.
fn reason(e: &LinkError) -> String {
    match e {
        LinkError::Refused(why) => why.clone(),
        other => other.to_string(),
    }
}

fn debug_closed(name: &str, e: &LinkError) {
    tracing::debug!(node = %name, error = %e, "data node's session closed; it gets the filters when it registers");
}

fn add_counters(sum: &mut datapath::FilterCounters, c: &datapath::FilterCounters) {
    sum.passed = sum.passed.saturating_add(c.passed);
    sum.dropped = sum.dropped.saturating_add(c.dropped);
    sum.tx = sum.tx.saturating_add(c.tx);
    sum.aborted = sum.aborted.saturating_add(c.aborted);
    sum.insn_limit = sum.insn_limit.saturating_add(c.insn_limit);
    sum.metered_insns = sum.metered_insns.saturating_add(c.metered_insns);
    sum.cpu_ns = sum.cpu_ns.saturating_add(c.cpu_ns);
}
