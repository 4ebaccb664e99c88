//! A deterministic simulation of the cluster core (in the style of `crates/ike/tests/harness`):
//! one [`ClusterCore`] on a virtual clock (a base `Instant` plus an offset), model data and
//! steer nodes that apply the directives it sends, a model of the IKE control loop that
//! installs and removes CHILD_SAs and carries out the rekeys the core asks for, and a seeded
//! RNG choosing the next event: node joins, restarts, reconnects, deaths (session end or
//! missed probes), reports, tunnels coming up and being rekeyed, migrations, drains,
//! autoscaler plans, a control takeover, rate limit changes and timer ticks. Steer nodes may
//! refuse an update and a data node's answer to an install may be lost.
//!
//! Invariants are checked as every directive is delivered and after every event (see
//! [`World::check`]): the steering against the model nodes, and the core's CHILD_SAs against
//! the model control loop's ([`World::check_control`]). A failure panics with the seed and
//! the last events; any other panic of a run names its seed too (`tests::run`).

use super::*;
use crate::capacity::Outcome;
use crypto::{Rng, SeededRng};
use dataplane::{InstalledChild, KnownChild};
use ike::{IkeSpis, TrafficSelector};
use std::collections::{BTreeSet, VecDeque};
use wire::IkeSpi;

/// The VNI of the simulated tunnels (tunnel 4 has a TUN inside: no VNI).
const VNI: u32 = 100;
/// The simulated tunnels.
const TUNNELS: [u32; 4] = [1, 2, 3, 4];
/// Events per seed.
pub(super) const EVENTS: usize = 80;

/// A data node process as the simulation holds it.
#[derive(Debug, Default)]
struct DataModel {
    /// The process runs.
    up: bool,
    /// Its session with control is open.
    session: bool,
    boot: u64,
    /// The CHILD_SAs its tables hold.
    held: HashMap<EspSpi, InstalledChild>,
    /// The attachments it holds, by name (the last `set_attachments`).
    attachments: Vec<String>,
}

/// A steer node as the simulation holds it.
#[derive(Debug, Default)]
struct SteerModel {
    up: bool,
    session: bool,
    boot: u64,
    /// Every steering update since its last whole tables was applied (it refused none).
    synced: bool,
    spis: HashMap<EspSpi, u32>,
    selectors: BTreeMap<u32, Vec<(TunnelId, u32)>>,
    /// Its port table: tag pair -> serving node.
    port_tags: BTreeMap<steer::PortKey, u32>,
    /// Per VNI, the attachments' prefixes leading its selectors.
    attachment_routes: BTreeMap<u32, Vec<AttachmentRoute>>,
}

/// The core, its nodes, the control loop, the clock.
pub(super) struct World {
    seed: u64,
    rng: SeededRng,
    /// Whether an install's answer comes twice: drawn apart from `rng`, so a seed's events
    /// stay what they were before duplicates were simulated (the regression seeds replay).
    dup_rng: SeededRng,
    /// Which data node an attachment's migration goes to: apart from `rng` for the same reason.
    attachment_rng: SeededRng,
    base: Instant,
    offset: Duration,
    pub(super) core: ClusterCore,
    data: BTreeMap<String, DataModel>,
    steer: BTreeMap<String, SteerModel>,
    /// Node ids whose session end the core was told (until the node says hello again).
    closed: BTreeSet<u32>,
    /// The control loop's CHILD_SAs per tunnel, oldest first.
    control: BTreeMap<TunnelId, Vec<NewChild>>,
    /// CHILD_SAs of the control loop a takeover's reconciliation reported lost (no data
    /// node held them): the core may not know them.
    reported_lost: BTreeSet<EspSpi>,
    /// When each tunnel first had CHILD_SAs in the control loop, none on a live data node,
    /// and a usable data node (still so after every event since).
    stranded_since: BTreeMap<TunnelId, Duration>,
    /// When the control loop last installed a CHILD_SA of each tunnel.
    last_install: BTreeMap<TunnelId, Duration>,
    /// Rekeys the core asked for, not yet carried out.
    rekeys: VecDeque<TunnelId>,
    next_spi: u32,
    /// The answer to the install in flight.
    install_answer: Option<bool>,
    /// What happened, for the failure message.
    log: Vec<String>,
    /// How often the interesting things happened.
    pub(super) stats: Stats,
}

/// Counts of what a run went through (the runs must reach what the invariants are about).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Stats {
    /// CHILD_SAs installed on a data node.
    pub(super) installed: u64,
    /// CHILD_SAs deleted from their data node after the steering moved.
    pub(super) deleted_after_steering: u64,
    /// Data nodes lost while holding CHILD_SAs.
    pub(super) failovers: u64,
    /// Migrations and drains that moved a tunnel.
    pub(super) moves: u64,
    /// Autoscaler decisions carried out.
    pub(super) plan_done: u64,
    /// Control takeovers.
    pub(super) takeovers: u64,
    /// Steering updates refused (then resynced).
    pub(super) refused: u64,
    /// Install answers fed back a second time (and ignored).
    pub(super) duplicates: u64,
    /// Port tags set at a steer node (attachments placed or moved).
    pub(super) port_tags: u64,
    /// Attachment migrations that moved it.
    pub(super) attachment_moves: u64,
}

fn ts(net: &str) -> TrafficSelector {
    TrafficSelector::parse(net).expect("a valid selector")
}

fn tunnels() -> Vec<TunnelMeta> {
    TUNNELS
        .iter()
        .map(|&t| TunnelMeta {
            id: TunnelId(t),
            name: format!("t{t}"),
            vni: (t != 4).then_some(VNI),
            rate_limit_mbit: (t % 2 == 1).then_some(100),
        })
        .collect()
}

/// The simulated attachments: "att1" on steer0's eth2 (which it announces), "att2" on steer1's
/// eth9 (which it never announces: unsteered throughout).
fn attachments() -> Vec<AttachmentMeta> {
    let meta = |name: &str, steer: &str, interface: &str, c_tag| AttachmentMeta {
        config: datapath::AttachmentConfig {
            name: name.into(),
            tenant: ids::TenantId::new("a").expect("a tenant"),
            vnet: "vnet".into(),
            port: datapath::AttachmentPort::Interface(interface.into()),
            tags: datapath::AttachmentTags::QinQ { s_tag: 100, c_tag },
            gateway_ip: "10.99.0.1".parse().expect("an address"),
            ce_ip: None,
            routes: vec![("10.99.0.0".parse().expect("an address"), 24)],
            ce_mac: None,
        },
        steer: steer.into(),
        vni: Some(VNI),
    };
    vec![
        meta("att1", "steer0", "eth2", 20),
        meta("att2", "steer1", "eth9", 30),
    ]
}

/// The ports a node announces in its Hello.
fn ports_of(name: &str, role: Role) -> Vec<PortInfo> {
    if role != Role::Steer {
        return Vec::new();
    }
    let interface = if name == "steer0" { "eth2" } else { "eth3" };
    vec![PortInfo {
        id: 1,
        interface: interface.into(),
        mac: [2, 0, 0, 0, 0, 1],
    }]
}

fn new_core() -> ClusterCore {
    ClusterCore::new(
        "10.0.0.10:6081".parse().expect("an address"),
        HashSet::new(),
        tunnels(),
        [(VNI, vec!["10.1.0.1".to_owned()])].into(),
        Duration::from_secs(5),
    )
}

impl World {
    /// A world with no nodes whose control loop runs (reconciled with nothing restored).
    pub(super) fn new(seed: u64) -> Self {
        let mut w = Self {
            seed,
            rng: SeededRng::new(seed),
            dup_rng: SeededRng::new(seed ^ 0x5eed_d0b1_e000_0000),
            attachment_rng: SeededRng::new(seed ^ 0xa77a_c4ed_0000_0000),
            base: Instant::now(),
            offset: Duration::ZERO,
            core: new_core(),
            data: BTreeMap::new(),
            steer: BTreeMap::new(),
            closed: BTreeSet::new(),
            control: TUNNELS.iter().map(|&t| (TunnelId(t), Vec::new())).collect(),
            reported_lost: BTreeSet::new(),
            stranded_since: BTreeMap::new(),
            last_install: BTreeMap::new(),
            rekeys: VecDeque::new(),
            next_spi: 0x1000,
            install_answer: None,
            log: Vec::new(),
            stats: Stats::default(),
        };
        let now = w.now();
        w.core.handle_attachments(attachments(), now);
        w.core.handle_reconcile(&[], now);
        w.deliver();
        w
    }

    fn now(&self) -> Instant {
        self.base + self.offset
    }

    fn below(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.rng.next_u64() % 100 < percent
    }

    /// Panics with the seed and the last events.
    fn fail(&self, what: &str) -> ! {
        let tail = self.log.len().saturating_sub(20);
        panic!(
            "seed {}: {what}\nlast events:\n  {}",
            self.seed,
            self.log[tail..].join("\n  ")
        );
    }

    fn id(&mut self, name: &str) -> u32 {
        self.core.node_id(name)
    }

    fn name(&self, id: u32) -> String {
        self.core
            .ids
            .iter()
            .find(|(_, i)| **i == id)
            .map(|(n, _)| n.clone())
            .unwrap_or_default()
    }

    // ---- carrying the core's outputs out ----

    /// Delivers everything the core queued, feeding back every answer, until it queues
    /// nothing more.
    fn deliver(&mut self) {
        loop {
            let out = self.core.poll_outbox();
            if out.is_empty() {
                return;
            }
            let mut failed = Vec::new();
            for o in out.send {
                let ok = self.apply(&o);
                match o.wait {
                    Await::Steer if !ok => failed.push(o.node),
                    Await::Shares(t) => self.core.handle_share_answer(t, ok),
                    Await::Resync(t) => self.core.handle_resync_answer(o.node, t, ok),
                    Await::Attachments(t) => self.core.handle_attachments_answer(t, ok),
                    Await::Install(_) => self.install_answer = Some(ok),
                    _ => {}
                }
            }
            for id in failed {
                self.core.handle_steer_failed(id);
            }
            for o in out.after_steers {
                self.stats.deleted_after_steering += 1;
                self.apply(&o);
            }
            for (tunnels, _) in out.rekeys {
                self.rekeys.extend(tunnels);
            }
        }
    }

    /// Applies one directive at its node; returns the node's answer. Checks that it goes
    /// to a node that can take it, and the steering after it.
    fn apply(&mut self, o: &Outgoing) -> bool {
        let name = self.name(o.node);
        let Some(node) = self.core.node(o.node).cloned() else {
            self.fail(&format!(
                "{:?} to unregistered node {}",
                o.directive, o.node
            ));
        };
        if self.closed.contains(&o.node) {
            self.fail(&format!(
                "{:?} to {name}, whose session the core was told ended",
                o.directive
            ));
        }
        if o.directive.for_data_node() != (node.role == Role::Data) {
            self.fail(&format!(
                "{:?} to {name}, a {:?} node",
                o.directive, node.role
            ));
        }
        let alive = |w: &Self, id: u32| w.core.node(id).is_some_and(|n| n.alive);
        match &o.directive {
            Directive::InstallChild { .. } if !node.alive => {
                self.fail(&format!("install on {name}, which is not alive"))
            }
            Directive::SetSpi { node: n, .. } if !alive(self, *n) => {
                self.fail(&format!("{:?}: steered to a node not alive", o.directive))
            }
            _ => {}
        }
        let ok = if node.role == Role::Data {
            self.apply_data(&name, &o.directive, o.wait)
        } else {
            self.apply_steer(&name, &o.directive, o.wait)
        };
        self.check_steering(false);
        ok
    }

    fn apply_data(&mut self, name: &str, d: &Directive, wait: Await) -> bool {
        let lose_answer = matches!(wait, Await::Install(_)) && self.chance(5);
        let child = match d {
            Directive::InstallChild {
                tunnel,
                inbound_spi,
            } => self
                .control
                .get(tunnel)
                .and_then(|cs| cs.iter().find(|c| c.inbound_spi == *inbound_spi))
                .cloned(),
            _ => None,
        };
        let Some(m) = self.data.get_mut(name).filter(|m| m.up && m.session) else {
            return false;
        };
        match d {
            Directive::InstallChild { .. } => {
                let Some(c) = child else {
                    return false;
                };
                // The data plane's rule: an SA installed active sends; otherwise it sends
                // if no other SA of its tunnel does here.
                let others = m.held.values_mut().filter(|h| h.tunnel == c.tunnel);
                let mut sender = false;
                for h in others {
                    if c.outbound_active {
                        h.sending = false;
                    }
                    sender |= h.sending;
                }
                let sending = c.outbound_active || !sender;
                m.held.insert(c.inbound_spi, held(&c, sending));
            }
            Directive::SetAttachments(a) => {
                m.attachments = a.iter().map(|a| a.name.clone()).collect();
            }
            Directive::RemoveChild {
                tunnel,
                inbound_spi,
                ..
            } => {
                let was = m.held.remove(inbound_spi).is_some_and(|h| h.sending);
                // When the sending SA goes, the tunnel's newest remaining one sends.
                if was {
                    if let Some(h) = m
                        .held
                        .values_mut()
                        .filter(|h| h.tunnel == *tunnel)
                        .max_by_key(|h| h.inbound_spi.0)
                    {
                        h.sending = true;
                    }
                }
            }
            _ => {}
        }
        !lose_answer
    }

    fn apply_steer(&mut self, name: &str, d: &Directive, wait: Await) -> bool {
        let refuse = wait == Await::Steer && self.chance(3);
        let Some(m) = self.steer.get_mut(name).filter(|m| m.up && m.session) else {
            return false;
        };
        if refuse {
            self.stats.refused += 1;
            m.synced = false;
            return false;
        }
        match d {
            Directive::SetSpi { spi, node, .. } => {
                m.spis.insert(*spi, *node);
            }
            Directive::RemoveSpi(spi) => {
                m.spis.remove(spi);
            }
            Directive::SetSelectors(v) => {
                m.selectors.insert(v.vni, pairs(v));
                m.attachment_routes.insert(v.vni, v.attachments.clone());
            }
            Directive::SteerTables(t) => {
                m.spis = t.spis.iter().map(|(s, n, _)| (*s, *n)).collect();
                m.selectors = t.vnis.iter().map(|v| (v.vni, pairs(v))).collect();
                m.attachment_routes = t
                    .vnis
                    .iter()
                    .map(|v| (v.vni, v.attachments.clone()))
                    .collect();
                m.port_tags = t.attachments.iter().map(|(k, e)| (*k, e.node.0)).collect();
                m.synced = true;
            }
            Directive::SetPortTag(k, e) => {
                self.stats.port_tags += 1;
                m.port_tags.insert(*k, e.node.0);
            }
            Directive::RemovePortTag(k) => {
                m.port_tags.remove(k);
            }
            _ => {}
        }
        true
    }

    // ---- invariants ----

    /// The steering: every synced steer node steers each placed CHILD_SA's SPI to its node
    /// and each tunnel's selectors to the node of its sending SA, and those nodes hold them
    /// (a data node deletes an SA only once the steering moved away). `settled`: after an
    /// event, when every directive has arrived; otherwise (between two directives) only
    /// what points at running data nodes is checked.
    fn check_steering(&self, settled: bool) {
        if !self.core.reconciled {
            return;
        }
        for (sname, s) in self
            .steer
            .iter()
            .filter(|(_, s)| s.up && s.session && s.synced)
        {
            for (spi, n) in &s.spis {
                let Some(c) = self.core.children.get(spi) else {
                    continue;
                };
                let Some(placed) = c.node else { continue };
                let holder = self.name(*n);
                let running = self.data.get(&holder).is_some_and(|m| m.up);
                if (settled || running) && *n != placed {
                    self.fail(&format!(
                        "{sname} steers {spi} to {holder}, the core placed it on {}",
                        self.name(placed)
                    ));
                }
                if running && !self.data[&holder].held.contains_key(spi) {
                    self.fail(&format!(
                        "{sname} steers {spi} to {holder}, which does not hold it"
                    ));
                }
            }
            for pairs in s.selectors.values() {
                for (t, n) in pairs {
                    let holder = self.name(*n);
                    let running = self.data.get(&holder).is_some_and(|m| m.up);
                    if !running && !settled {
                        continue;
                    }
                    let holds = running && self.data[&holder].held.values().any(|h| h.tunnel == *t);
                    if !holds {
                        self.fail(&format!(
                            "{sname} steers tunnel {}'s selectors to {holder}, which holds no SA of it",
                            t.0
                        ));
                    }
                }
            }
            // A data node steered an attachment's frames or routes holds it.
            let routes = s.attachment_routes.values().flatten().map(|r| r.node);
            for n in s.port_tags.values().copied().chain(routes) {
                let holder = self.name(n);
                let running = self.data.get(&holder).is_some_and(|m| m.up);
                if running && self.data[&holder].attachments.is_empty() {
                    self.fail(&format!(
                        "{sname} steers an attachment to {holder}, which holds none"
                    ));
                }
            }
            if settled {
                let id = self.core.known_id(sname).unwrap_or_default();
                let want: BTreeMap<steer::PortKey, u32> = self
                    .core
                    .steer_attachments(id)
                    .into_iter()
                    .map(|(k, e)| (k, e.node.0))
                    .collect();
                if s.port_tags != want {
                    self.fail(&format!(
                        "{sname}'s port tags {:?} are not the core's {want:?}",
                        s.port_tags
                    ));
                }
                let routes = self.core.vni_selectors(VNI).attachments;
                if s.attachment_routes.get(&VNI).cloned().unwrap_or_default() != routes {
                    self.fail(&format!(
                        "{sname}'s attachment routes {:?} are not the core's {routes:?}",
                        s.attachment_routes.get(&VNI)
                    ));
                }
                for (spi, c) in &self.core.children {
                    if let Some(n) = c.node {
                        if s.spis.get(spi) != Some(&n) {
                            self.fail(&format!(
                                "{sname} does not steer placed {spi} to {}",
                                self.name(n)
                            ));
                        }
                    }
                }
                let want = pairs(&self.core.vni_selectors(VNI));
                if s.selectors.get(&VNI).cloned().unwrap_or_default() != want {
                    self.fail(&format!(
                        "{sname}'s selectors {:?} are not the core's {want:?}",
                        s.selectors.get(&VNI)
                    ));
                }
            }
        }
    }

    /// The core's CHILD_SAs against the control loop's: the core holds every CHILD_SA the
    /// control loop holds (unless a takeover reported it lost) and none other, and a tunnel
    /// whose CHILD_SAs are on no live data node gets one there once a usable data node exists:
    /// at the latest at the first tick [`REKEY_RETRY`] (the pacing of its rekeys) after that
    /// node came or after the tunnel's last install attempt.
    fn check_control(&mut self) {
        for c in self.control.values().flatten() {
            if !self.core.children.contains_key(&c.inbound_spi)
                && !self.reported_lost.contains(&c.inbound_spi)
            {
                self.fail(&format!(
                    "the control loop holds {} of tunnel {}, the core forgot it",
                    c.inbound_spi, c.tunnel.0
                ));
            }
        }
        for (spi, c) in &self.core.children {
            if !self.control[&c.tunnel]
                .iter()
                .any(|x| x.inbound_spi == *spi)
            {
                self.fail(&format!(
                    "the core holds {spi} of tunnel {}, which the control loop does not",
                    c.tunnel.0
                ));
            }
        }
        let usable = self.core.nodes.iter().any(|(id, n)| {
            n.role == Role::Data
                && n.alive
                && !n.draining
                && !n.leaving
                && self
                    .data
                    .get(&self.name(*id))
                    .is_some_and(|m| m.up && m.session)
        });
        for (t, cs) in &self.control {
            let placed = self.core.children.values().any(|c| {
                c.tunnel == *t
                    && c.node
                        .is_some_and(|n| self.core.node(n).is_some_and(|n| n.alive))
            });
            if cs.is_empty() || placed || !usable {
                self.stranded_since.remove(t);
                continue;
            }
            let since = *self.stranded_since.entry(*t).or_insert(self.offset);
            // The core asked for its rekey; the control loop has yet to carry it out.
            if self.rekeys.contains(t) {
                continue;
            }
            let last = self.last_install.get(t).copied().unwrap_or_default();
            if self.offset >= since.max(last) + REKEY_RETRY {
                self.fail(&format!(
                    "tunnel {} has no CHILD_SA on a live data node since {} ms though a usable \
                     one exists (last install attempt at {} ms)",
                    t.0,
                    since.as_millis(),
                    last.as_millis()
                ));
            }
        }
    }

    /// Every invariant, after an event.
    fn check(&mut self) {
        self.check_control();
        self.check_steering(true);
        let mut senders: HashMap<TunnelId, usize> = HashMap::new();
        for (spi, c) in &self.core.children {
            if c.sending {
                *senders.entry(c.tunnel).or_default() += 1;
            }
            // The control loop fed every install's answer back within its event.
            if let Some(n) = c.installing {
                self.fail(&format!(
                    "{spi}'s install on {n} still pending after its answer"
                ));
            }
            let Some(n) = c.node else { continue };
            let node = self.core.node(n);
            if !node.is_some_and(|n| n.alive && n.role == Role::Data) {
                self.fail(&format!("{spi} placed on {n}, not a live data node"));
            }
            let holder = self.name(n);
            if !self.data[&holder].held.contains_key(spi) {
                self.fail(&format!("{spi} placed on {holder}, which does not hold it"));
            }
        }
        if let Some((t, k)) = senders.iter().find(|(_, k)| **k > 1) {
            self.fail(&format!("tunnel {} has {k} sending CHILD_SAs", t.0));
        }
        for (t, n) in &self.core.placement {
            if !self.core.node(*n).is_some_and(|n| n.role == Role::Data) {
                self.fail(&format!("tunnel {} placed on {n}, not a data node", t.0));
            }
        }
        for r in &self.core.retiring {
            if self.core.children.contains_key(&r.spi) {
                self.fail(&format!("{} both installed and retiring", r.spi));
            }
        }
        self.check_attachments();
    }

    /// Attachments: one whose port is known is served by a live data node whenever a usable
    /// one exists, one whose port is not known by none; every live data node holds the
    /// steerable ones.
    fn check_attachments(&self) {
        let usable = self
            .core
            .nodes
            .values()
            .any(|n| n.role == Role::Data && n.alive && !n.draining && !n.leaving);
        for a in self.core.attachments.values() {
            let name = &a.meta.config.name;
            let known = self.core.port_owner(a).is_some();
            match a.node {
                Some(n) if !known => self.fail(&format!("{name} served by {n} without a port")),
                Some(n)
                    if !self
                        .core
                        .node(n)
                        .is_some_and(|n| n.alive && n.role == Role::Data) =>
                {
                    self.fail(&format!("{name} served by {n}, not a live data node"))
                }
                Some(_) => {}
                None if known && usable => self.fail(&format!(
                    "{name} has a port and a usable data node, but no server"
                )),
                None => {}
            }
        }
        let want: Vec<String> = self
            .core
            .resolved_attachments()
            .into_iter()
            .map(|a| a.name)
            .collect();
        for (id, n) in &self.core.nodes {
            let holder = self.name(*id);
            let Some(m) = self.data.get(&holder).filter(|m| m.up && m.session) else {
                continue;
            };
            if n.role == Role::Data && n.alive && m.attachments != want {
                self.fail(&format!(
                    "{holder} holds attachments {:?}, not the core's {want:?}",
                    m.attachments
                ));
            }
        }
    }
}

/// What a data node reports holding of `c`.
fn held(c: &NewChild, sending: bool) -> InstalledChild {
    InstalledChild {
        tunnel: c.tunnel,
        ike: c.ike,
        inbound_spi: c.inbound_spi,
        outbound_spi: c.outbound_spi,
        local: "198.51.100.1:4500".parse().expect("an address"),
        remote: "203.0.113.5:4500".parse().expect("an address"),
        local_ts: c.local_ts.clone(),
        remote_ts: c.remote_ts.clone(),
        sending,
    }
}

/// A VNI's selectors as (tunnel, node) pairs, sorted.
fn pairs(v: &VniSelectors) -> Vec<(TunnelId, u32)> {
    let mut p: Vec<(TunnelId, u32)> = v.selectors.iter().map(|s| (s.tunnel, s.node)).collect();
    p.sort();
    p
}

mod events;
mod tests;
