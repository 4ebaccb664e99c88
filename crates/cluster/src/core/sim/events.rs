//! The simulation's events: what nodes, the control loop, the operator and the autoscaler
//! do, one seeded choice at a time.

use super::*;

impl World {
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
            m.attachments.clear();
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
                ports: ports_of(name, role),
                vtep: (role == Role::Data)
                    .then(|| format!("10.0.0.{}", 20 + id).parse().expect("an address")),
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
        m.attachments.clear();
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
            replaces: None,
        };
        self.record(format!(
            "control installs {} on tunnel {} (outbound_active {outbound_active})",
            child.inbound_spi, tunnel.0
        ));
        self.last_install.insert(tunnel, self.offset);
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
                if self.core.handle_install_answer(&child, ok, now) != Some(node) {
                    self.fail(&format!(
                        "the answer of {}'s install on {name} was not taken for {name}",
                        child.inbound_spi
                    ));
                }
                self.deliver();
                // A late duplicate of the answer (or of its opposite) changes nothing.
                let roll = self.dup_rng.next_u64() % 100;
                if roll < 5 {
                    let again = roll < 2;
                    self.record(format!(
                        "{name}'s answer to {} comes again (ok {again})",
                        child.inbound_spi
                    ));
                    let ignored = self.core.ignored_answers();
                    if self
                        .core
                        .handle_install_answer(&child, again, now)
                        .is_some()
                        || self.core.ignored_answers() != ignored + 1
                        || !self.core.poll_outbox().is_empty()
                    {
                        self.fail("a duplicate install answer was taken");
                    }
                    self.stats.duplicates += 1;
                }
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
                m.attachments.clear();
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
        self.reported_lost.remove(&c.inbound_spi);
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
        let to = format!("data{}", self.attachment_rng.next_u64() % 4);
        let before = self.core.attachments().get(&1).and_then(|a| a.node);
        let r = self.core.handle_migrate_attachment("att1", &to);
        let moved = r.as_ref().is_ok_and(|(_, n)| before != Some(*n));
        self.stats.attachment_moves += u64::from(moved);
        self.record(format!(
            "migrate attachment att1 to {to}: {:?}",
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
            let tunnel = self.random_tunnel();
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
        let now = self.now();
        self.core.handle_attachments(attachments(), now);
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
        // Reported to the control loop, which rekeys their tunnels: the core need not hold
        // them.
        self.reported_lost.extend(lost.iter().copied());
        let tunnels: BTreeSet<TunnelId> = known
            .iter()
            .filter(|k| lost.contains(&k.inbound_spi))
            .map(|k| k.tunnel)
            .collect();
        self.rekeys.extend(tunnels);
    }
}
