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
//! [`World::check`]); a failure panics with the seed and the last events.

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
}

/// The core, its nodes, the control loop, the clock.
pub(super) struct World {
    seed: u64,
    rng: SeededRng,
    base: Instant,
    offset: Duration,
    pub(super) core: ClusterCore,
    data: BTreeMap<String, DataModel>,
    steer: BTreeMap<String, SteerModel>,
    /// Node ids whose session end the core was told (until the node says hello again).
    closed: BTreeSet<u32>,
    /// The control loop's CHILD_SAs per tunnel, oldest first.
    control: BTreeMap<TunnelId, Vec<NewChild>>,
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
            base: Instant::now(),
            offset: Duration::ZERO,
            core: new_core(),
            data: BTreeMap::new(),
            steer: BTreeMap::new(),
            closed: BTreeSet::new(),
            control: TUNNELS.iter().map(|&t| (TunnelId(t), Vec::new())).collect(),
            rekeys: VecDeque::new(),
            next_spi: 0x1000,
            install_answer: None,
            log: Vec::new(),
            stats: Stats::default(),
        };
        let now = w.now();
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
            }
            Directive::SteerTables(t) => {
                m.spis = t.spis.iter().map(|(s, n, _)| (*s, *n)).collect();
                m.selectors = t.vnis.iter().map(|v| (v.vni, pairs(v))).collect();
                m.synced = true;
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
            if settled {
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

    /// Every invariant, after an event.
    fn check(&self) {
        self.check_steering(true);
        let mut senders: HashMap<TunnelId, usize> = HashMap::new();
        for (spi, c) in &self.core.children {
            if c.sending {
                *senders.entry(c.tunnel).or_default() += 1;
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
    }

    // ---- events ----

    /// One seeded event, then the invariants.
    pub(super) fn step(&mut self) {
        let roll = self.below(100);
        match roll {
            0..=9 => self.join_data(),
            10..=13 => self.join_steer(),
            14..=18 => self.kill_data(),
            19..=20 => self.drop_data_session(),
            21..=23 => self.probe_dead(),
            24..=25 => self.probe_alive(),
            26..=27 => self.kill_steer(),
            28..=37 => self.tunnel_up(),
            38..=45 => self.peer_rekey(),
            46..=49 => self.tunnel_down(),
            50..=53 => self.migrate(),
            54..=56 => self.drain(),
            57..=58 => self.undrain(),
            59..=62 => self.plan(),
            63..=64 => self.takeover(),
            65..=66 => self.rate_limits(),
            67..=74 => self.report(),
            _ => self.tick(),
        }
        self.deliver();
        self.run_rekeys();
        self.check();
    }

    fn record(&mut self, what: String) {
        self.log
            .push(format!("[{:>6} ms] {what}", self.offset.as_millis()));
    }

    fn join_data(&mut self) {
        let k = self.below(4);
        let name = format!("data{k}");
        let m = self.data.entry(name.clone()).or_default();
        if m.up && m.session {
            return;
        }
        if !m.up {
            // A (re)started process holds nothing.
            m.up = true;
            m.boot += 1;
            m.held.clear();
        }
        m.session = true;
        let (boot, installed) = (m.boot, m.held.values().cloned().collect());
        self.hello(&name, Role::Data, boot, installed);
    }

    fn hello(&mut self, name: &str, role: Role, boot: u64, installed: Vec<InstalledChild>) {
        self.record(format!("{name} says hello (boot {boot})"));
        let id = self.id(name);
        self.closed.remove(&id);
        let now = self.now();
        self.core.handle_hello(
            Hello {
                name: name.to_owned(),
                role,
                geneve: format!("10.0.0.{}:6081", 20 + id)
                    .parse()
                    .expect("an address"),
                boot_id: boot,
                workers: 2,
                installed,
            },
            now,
        );
    }

    fn join_steer(&mut self) {
        let name = format!("steer{}", self.below(2));
        let m = self.steer.entry(name.clone()).or_default();
        if m.up {
            return;
        }
        *m = SteerModel {
            up: true,
            session: true,
            boot: m.boot + 1,
            ..SteerModel::default()
        };
        let boot = m.boot;
        self.hello(&name, Role::Steer, boot, Vec::new());
    }

    fn pick(
        &mut self,
        data: bool,
        want: impl Fn(&DataModel, &SteerModel) -> bool,
    ) -> Option<String> {
        let names: Vec<String> = if data {
            let blank = SteerModel::default();
            self.data
                .iter()
                .filter(|(_, m)| want(m, &blank))
                .map(|(n, _)| n.clone())
                .collect()
        } else {
            let blank = DataModel::default();
            self.steer
                .iter()
                .filter(|(_, m)| want(&blank, m))
                .map(|(n, _)| n.clone())
                .collect()
        };
        if names.is_empty() {
            return None;
        }
        let i = self.below(names.len());
        Some(names[i].clone())
    }

    fn kill_data(&mut self) {
        let Some(name) = self.pick(true, |m, _| m.up) else {
            return;
        };
        self.record(format!("{name} dies"));
        let m = self.data.get_mut(&name).expect("picked");
        m.up = false;
        self.stats.failovers += u64::from(!m.held.is_empty());
        let m = self.data.get_mut(&name).expect("picked");
        m.held.clear();
        let had_session = std::mem::take(&mut m.session);
        if had_session {
            self.session_ended(&name);
        }
    }

    fn session_ended(&mut self, name: &str) {
        let id = self.id(name);
        self.closed.insert(id);
        let now = self.now();
        // The link of a session that ended is closed.
        self.core.handle_link_closed(id);
        self.core.handle_session_ended(id, now);
    }

    fn drop_data_session(&mut self) {
        let Some(name) = self.pick(true, |m, _| m.up && m.session) else {
            return;
        };
        self.record(format!(
            "{name}'s session drops (the process keeps running)"
        ));
        self.data.get_mut(&name).expect("picked").session = false;
        self.session_ended(&name);
    }

    fn probe_dead(&mut self) {
        let Some(name) = self.pick(true, |m, _| m.up && m.session) else {
            return;
        };
        self.record(format!("a steer node declares {name} dead"));
        let (id, now) = (self.id(&name), self.now());
        self.core.handle_node_dead(id, now);
    }

    fn probe_alive(&mut self) {
        let Some(name) = self.pick(true, |m, _| m.up && m.session) else {
            return;
        };
        self.record(format!("a steer node sees {name} alive"));
        let (id, now) = (self.id(&name), self.now());
        self.core.handle_node_alive(id, now);
    }

    fn kill_steer(&mut self) {
        let Some(name) = self.pick(false, |_, m| m.up) else {
            return;
        };
        self.record(format!("{name} dies"));
        let m = self.steer.get_mut(&name).expect("picked");
        m.up = false;
        m.session = false;
        self.session_ended(&name);
    }

    fn report(&mut self) {
        let ids: Vec<u32> = self.core.nodes.keys().copied().collect();
        if ids.is_empty() {
            return;
        }
        let id = ids[self.below(ids.len())];
        let load = NodeLoad {
            interval_ms: 1000,
            utilization: self.below(100) as f64 / 100.0,
            ..NodeLoad::default()
        };
        self.record(format!("{} reports", self.name(id)));
        let now = self.now();
        self.core.handle_report(id, load, now);
    }

    fn tick(&mut self) {
        let ms = self.below(3000) as u64;
        self.offset += Duration::from_millis(ms);
        self.record("tick".into());
        let now = self.now();
        self.core.handle_tick(now);
    }

    fn random_tunnel(&mut self) -> TunnelId {
        TunnelId(TUNNELS[self.below(TUNNELS.len())])
    }

    /// The control loop installs a new CHILD_SA of `tunnel`, then (`replace`) removes the
    /// older ones once it is installed.
    fn install(&mut self, tunnel: TunnelId, outbound_active: bool, replace: bool) {
        self.next_spi += 1;
        let spi = self.next_spi;
        let child = NewChild {
            tunnel,
            ike: IkeSpis {
                initiator: IkeSpi(u64::from(tunnel.0)),
                responder: IkeSpi(7),
            },
            inbound_spi: EspSpi(spi),
            outbound_spi: EspSpi(spi + 0x0100_0000),
            outbound_active,
            local_ts: vec![ts("10.1.0.0/24")],
            remote_ts: vec![ts(&format!("192.168.{}.0/24", tunnel.0))],
        };
        self.record(format!(
            "control installs {} on tunnel {} (outbound_active {outbound_active})",
            child.inbound_spi, tunnel.0
        ));
        let older: Vec<NewChild> = self.control.get(&tunnel).cloned().unwrap_or_default();
        // The IKE SA holds it whatever the data path says.
        self.control.entry(tunnel).or_default().push(child.clone());
        let installed = match self.core.handle_install(child.clone()) {
            Ok(node) => {
                self.install_answer = None;
                self.deliver();
                let answer = self.install_answer.take().unwrap_or(false);
                // The shell waits for the answer without the lock: anything else may happen
                // meanwhile.
                if self.chance(30) {
                    self.meanwhile(node);
                }
                let name = self.name(node);
                let ok = answer && self.data.get(&name).is_some_and(|m| m.up && m.session);
                self.stats.installed += u64::from(ok);
                let now = self.now();
                self.core.handle_install_answer(&child, node, ok, now);
                self.deliver();
                ok
            }
            Err(_) => false,
        };
        if installed && replace {
            for old in older {
                self.remove(&old);
            }
        }
    }

    /// Something that happens while an install on `node` waits for its answer.
    fn meanwhile(&mut self, node: u32) {
        let name = self.name(node);
        self.record(format!("while the install on {name} waits:"));
        match self.below(8) {
            0 => self.tick(),
            1 => {
                let (id, now) = (node, self.now());
                self.record(format!("a steer node declares {name} dead"));
                self.core.handle_node_dead(id, now);
            }
            2 => {
                self.record(format!("{name} dies"));
                let m = self.data.get_mut(&name).expect("a data node");
                m.up = false;
                m.held.clear();
                if std::mem::take(&mut m.session) {
                    self.session_ended(&name);
                }
            }
            3 => {
                let m = self.data.get_mut(&name).expect("a data node");
                if std::mem::take(&mut m.session) {
                    self.record(format!("{name}'s session drops"));
                    self.session_ended(&name);
                }
            }
            4 => self.join_data(),
            5 => self.migrate(),
            6 => self.drain(),
            _ => self.report(),
        }
        self.deliver();
    }

    fn remove(&mut self, c: &NewChild) {
        self.record(format!(
            "control removes {} of tunnel {}",
            c.inbound_spi, c.tunnel.0
        ));
        if let Some(cs) = self.control.get_mut(&c.tunnel) {
            cs.retain(|x| x.inbound_spi != c.inbound_spi);
        }
        let now = self.now();
        self.core
            .handle_remove(c.tunnel, c.inbound_spi, c.outbound_spi, now);
        self.deliver();
    }

    fn tunnel_up(&mut self) {
        let t = self.random_tunnel();
        if self.control[&t].is_empty() {
            self.install(t, true, false);
        }
    }

    /// The peer rekeys: the new SA may send only once the old one is deleted.
    fn peer_rekey(&mut self) {
        let t = self.random_tunnel();
        if !self.control[&t].is_empty() {
            let active = self.chance(50);
            self.install(t, active, true);
        }
    }

    fn tunnel_down(&mut self) {
        let t = self.random_tunnel();
        for c in self.control[&t].clone() {
            self.remove(&c);
        }
    }

    /// Carries out the rekeys the core asked for (the control loop's task thread).
    fn run_rekeys(&mut self) {
        let mut budget = 16;
        while let Some(t) = self.rekeys.pop_front() {
            if budget == 0 {
                self.rekeys.clear();
                break;
            }
            budget -= 1;
            if !self.control[&t].is_empty() {
                self.record(format!("control rekeys tunnel {}", t.0));
                self.install(t, true, true);
                self.deliver();
                self.check();
            }
        }
    }

    fn migrate(&mut self) {
        let t = self.random_tunnel();
        let to = format!("data{}", self.below(4));
        let r = self.core.handle_migrate(&format!("t{}", t.0), &to);
        self.stats.moves += u64::from(r.is_ok());
        self.record(format!(
            "migrate tunnel {} to {to}: {:?}",
            t.0,
            r.map(|_| ())
        ));
    }

    fn drain(&mut self) {
        let name = format!("data{}", self.below(4));
        let r = self.core.handle_drain(&name);
        self.stats.moves += r.as_ref().map_or(0, |m| m.len() as u64);
        self.record(format!("drain {name}: {:?}", r.map(|m| m.len())));
    }

    fn undrain(&mut self) {
        let name = format!("data{}", self.below(4));
        let r = self.core.handle_undrain(&name);
        self.record(format!("undrain {name}: {:?}", r.map(|_| ())));
    }

    /// An autoscaler plan of a few random decisions, carried out (act mode, no provider).
    fn plan(&mut self) {
        let (input, _) = self.core.autoscale_input(false, Vec::new());
        let ids: Vec<u32> = input.nodes.iter().map(|n| n.id).collect();
        if ids.is_empty() {
            return;
        }
        let mut decisions = Vec::new();
        for _ in 0..1 + self.below(3) {
            let node = provision::NodeId(ids[self.below(ids.len())]);
            let tunnel = provision::TunnelId(self.random_tunnel().0);
            let action = match self.below(6) {
                0 => provision::Action::Activate { node },
                1 => provision::Action::Deactivate { node },
                2 => provision::Action::Place { tunnel, node },
                3 => provision::Action::Stop { node },
                _ => provision::Action::Migrate {
                    tunnel,
                    from: node,
                    to: node,
                },
            };
            decisions.push(provision::Decision {
                action,
                reason: provision::Reason::Empty,
            });
        }
        let plan = provision::Plan {
            decisions,
            consolidation: None,
            reservation: provision::Reservation {
                mean: 0.0,
                capacity: 0.0,
                capacity_nodes: 0.0,
                epsilon: 0.0,
                required: 0,
                reserved: 0,
                active: 0,
            },
            unplaced: Vec::new(),
            hotspots: Vec::new(),
        };
        let effects = self.core.handle_plan(&plan, &input, false);
        let done = effects
            .outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Done))
            .count();
        self.stats.plan_done += done as u64;
        self.record(format!(
            "autoscaler plan {:?}: {done} done",
            plan.decisions.iter().map(|d| d.action).collect::<Vec<_>>()
        ));
        if !effects.provider_calls.is_empty() {
            self.fail("a provider call without a provider");
        }
    }

    fn rate_limits(&mut self) {
        let limits: BTreeMap<TunnelId, Option<u32>> = TUNNELS
            .iter()
            .map(|&t| (TunnelId(t), self.chance(50).then_some(50 + t * 10)))
            .collect();
        self.record(format!("rate limits {limits:?}"));
        let now = self.now();
        self.core.handle_rate_limits(&limits, now);
    }

    /// A new control node takes over: every running node says hello to it with what it
    /// holds, then the control loop reconciles its restored CHILD_SAs.
    fn takeover(&mut self) {
        self.record("a new control node takes over".into());
        self.stats.takeovers += 1;
        self.core = new_core();
        self.closed.clear();
        let steers: Vec<(String, u64)> = self
            .steer
            .iter_mut()
            .filter(|(_, m)| m.up)
            .map(|(n, m)| {
                m.session = true;
                // Its tables name nodes by the old control node's ids until the new one
                // sends whole tables.
                m.synced = false;
                (n.clone(), m.boot)
            })
            .collect();
        let datas: Vec<(String, u64, Vec<InstalledChild>)> = self
            .data
            .iter_mut()
            .filter(|(_, m)| m.up)
            .map(|(n, m)| {
                m.session = true;
                (n.clone(), m.boot, m.held.values().cloned().collect())
            })
            .collect();
        // Sessions come back in any order.
        let mut hellos: Vec<(String, Role, u64, Vec<InstalledChild>)> = steers
            .into_iter()
            .map(|(n, b)| (n, Role::Steer, b, Vec::new()))
            .chain(datas.into_iter().map(|(n, b, i)| (n, Role::Data, b, i)))
            .collect();
        while !hellos.is_empty() {
            let i = self.below(hellos.len());
            let (n, role, boot, installed) = hellos.swap_remove(i);
            self.hello(&n, role, boot, installed);
            self.deliver();
        }
        let known: Vec<KnownChild> = self
            .control
            .values()
            .flatten()
            .map(|c| KnownChild {
                tunnel: c.tunnel,
                ike: c.ike,
                inbound_spi: c.inbound_spi,
                outbound_spi: c.outbound_spi,
                local_ts: c.local_ts.clone(),
                remote_ts: c.remote_ts.clone(),
            })
            .collect();
        let now = self.now();
        let lost = self.core.handle_reconcile(&known, now);
        let tunnels: BTreeSet<TunnelId> = known
            .iter()
            .filter(|k| lost.contains(&k.inbound_spi))
            .map(|k| k.tunnel)
            .collect();
        self.rekeys.extend(tunnels);
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

mod tests;
