//! A deterministic two-engine test harness: a virtual clock (a base `Instant` plus offsets),
//! seeded RNGs for both engines and for a link that can drop, duplicate, delay and reorder
//! datagrams, an optional NAT in front of node A, and bounded driving loops (the quinn `Pair`
//! idea, in miniature).

#![allow(dead_code, unreachable_pub)]

use crypto::{Rng, SeededRng};
use protego_ike::*;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use wire::EspSpi;
use zeroize::Zeroizing;

pub const A_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
pub const B_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 2));
pub const NAT_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));

/// One endpoint plus what it told its driver.
pub struct Node {
    pub ep: Endpoint,
    pub addr: IpAddr,
    pub events: Vec<Event>,
    /// Installed CHILD_SAs by inbound SPI, as a data path would hold them.
    pub children: HashMap<EspSpi, ChildSaInfo>,
    /// Datagrams this node sent (for counting keepalives etc.).
    pub sent: Vec<(SocketAddr, SocketAddr, Vec<u8>)>,
    /// Per installed CHILD_SA (inbound SPI): whether it carries outbound traffic and its install
    /// order, by the data plane's rule (`outbound_active`; when the sending SA goes, the
    /// tunnel's newest remaining one sends).
    pub sending: HashMap<EspSpi, (bool, u64)>,
    installs: u64,
}

impl Node {
    pub fn new(addr: IpAddr, seed: u64, config: EndpointConfig, now: Instant) -> Self {
        Self {
            ep: Endpoint::new(config, Box::new(SeededRng::new(seed)), now),
            addr,
            events: Vec::new(),
            children: HashMap::new(),
            sent: Vec::new(),
            sending: HashMap::new(),
            installs: 0,
        }
    }

    /// Takes over `other`'s data path state (installed CHILD_SAs and which of them send), as a
    /// standby taking over a node's address does.
    pub fn take_data_path(&mut self, other: &mut Node) {
        self.children = std::mem::take(&mut other.children);
        self.sending = std::mem::take(&mut other.sending);
        self.installs = other.installs;
    }

    /// The installed CHILD_SA this node's data path would send `tunnel`'s traffic on.
    pub fn sending_child(&self, tunnel: TunnelId) -> Option<&ChildSaInfo> {
        self.sending
            .iter()
            .filter(|(spi, (active, _))| *active && self.children[*spi].tunnel == tunnel)
            .max_by_key(|(_, (_, order))| *order)
            .map(|(spi, _)| &self.children[spi])
    }

    fn track_install(&mut self, info: &ChildSaInfo) {
        if info.outbound_active {
            if let Some(old) = info.replaces.and_then(|r| self.sending.get_mut(&r)) {
                old.0 = false;
            }
        }
        let active = info.outbound_active || self.sending_child(info.tunnel).is_none();
        self.installs += 1;
        self.sending
            .insert(info.inbound_spi, (active, self.installs));
    }

    fn track_delete(&mut self, tunnel: TunnelId, inbound: EspSpi) {
        self.sending.remove(&inbound);
        if self.sending_child(tunnel).is_none() {
            let newest = self
                .sending
                .iter_mut()
                .filter(|(spi, _)| self.children.get(*spi).is_some_and(|c| c.tunnel == tunnel))
                .max_by_key(|(_, (_, order))| *order);
            if let Some((_, s)) = newest {
                s.0 = true;
            }
        }
    }

    fn drain_events(&mut self) {
        while let Some(e) = self.ep.poll_event() {
            match &e {
                Event::ChildSaInstalled(info) => {
                    let copy = ChildSaInfo {
                        tunnel: info.tunnel,
                        ike: info.ike,
                        inbound_spi: info.inbound_spi,
                        outbound_spi: info.outbound_spi,
                        encr: info.encr,
                        integ: info.integ,
                        esn: info.esn,
                        pfs: info.pfs,
                        keys: ChildKeys {
                            inbound_encr: info.keys.inbound_encr.clone(),
                            inbound_integ: info.keys.inbound_integ.clone(),
                            outbound_encr: info.keys.outbound_encr.clone(),
                            outbound_integ: info.keys.outbound_integ.clone(),
                        },
                        local_ts: info.local_ts.clone(),
                        remote_ts: info.remote_ts.clone(),
                        local: info.local,
                        remote: info.remote,
                        replay_window: info.replay_window,
                        replaces: info.replaces,
                        outbound_active: info.outbound_active,
                        proposal: info.proposal.clone(),
                    };
                    assert!(
                        self.children.insert(info.inbound_spi, copy).is_none(),
                        "SPI installed twice"
                    );
                    self.track_install(info);
                }
                Event::ChildSaDeleted {
                    tunnel,
                    inbound_spi,
                    ..
                } => {
                    assert!(
                        self.children.remove(inbound_spi).is_some(),
                        "deleted a CHILD_SA never installed: {inbound_spi}"
                    );
                    self.track_delete(*tunnel, *inbound_spi);
                }
                _ => {}
            }
            self.events.push(e);
        }
    }

    pub fn count(&self, f: impl Fn(&Event) -> bool) -> usize {
        self.events.iter().filter(|e| f(e)).count()
    }

    pub fn established(&self) -> usize {
        self.count(|e| matches!(e, Event::IkeSaEstablished { .. }))
    }

    pub fn deleted_reasons(&self) -> Vec<DeleteReason> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::IkeSaDeleted { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }

    pub fn live_ike(&self, now: Instant) -> Vec<IkeSaStatus> {
        self.ep.status(now)
    }
}

/// A datagram on the link.
#[derive(Clone)]
struct InFlight {
    at: Instant,
    seq: u64,
    from: SocketAddr,
    to: SocketAddr,
    data: Vec<u8>,
}

/// Link behaviour, per direction symmetrical.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkConfig {
    /// Probability of losing a datagram.
    pub loss: f64,
    /// Probability of delivering a datagram twice.
    pub duplicate: f64,
    /// Extra random delay (reordering) up to this much.
    pub jitter: Duration,
    /// Base one-way delay.
    pub delay: Duration,
}

/// A NAT in front of node A: rewrites A's source to NAT_ADDR:port.
pub struct Nat {
    /// A's inner address:port -> public port.
    map: HashMap<SocketAddr, u16>,
    next_port: u16,
}

pub struct Pair {
    pub a: Node,
    pub b: Node,
    pub now: Instant,
    pub start: Instant,
    pub link: LinkConfig,
    /// When false, every datagram is dropped.
    pub up: bool,
    pub nat: Option<Nat>,
    link_rng: SeededRng,
    flight: Vec<InFlight>,
    seq: u64,
    pub delivered: usize,
    /// Check after every event that neither side sends on a rekeyed CHILD_SA the other has not
    /// installed yet (its packets would be dropped). On by default.
    pub check_sending: bool,
}

pub fn ike(s: &str) -> IkeProposal {
    IkeProposal::parse(s).expect("valid IKE proposal")
}

pub fn esp(s: &str) -> EspProposal {
    EspProposal::parse(s).expect("valid ESP proposal")
}

pub fn ts(s: &str) -> TrafficSelector {
    TrafficSelector::parse(s).expect("valid selector")
}

/// A tunnel configuration between A and B with sensible test defaults.
pub fn peer(id: u32, local: IpAddr, remote: IpAddr, local_id: &str, remote_id: &str) -> PeerConfig {
    PeerConfig {
        id: TunnelId(id),
        name: format!("t{id}"),
        local_addrs: vec![local],
        remote_addrs: vec![remote],
        local_id: Identity::parse(local_id).expect("id"),
        remote_id: Identity::parse(remote_id).expect("id"),
        psk: Zeroizing::new(b"correct horse battery staple".to_vec()),
        ike_proposals: vec![ike("aes256gcm16-prfsha256-x25519")],
        esp_proposals: vec![esp("aes256gcm16")],
        local_ts: vec![],
        remote_ts: vec![],
        ike_rekey_time: Duration::ZERO,
        ike_over_time: Duration::ZERO,
        child_rekey_time: Duration::ZERO,
        child_life_time: Duration::ZERO,
        rand_time: Duration::ZERO,
        dpd_delay: None,
        dpd_action: DpdAction::Clear,
        start_action: StartAction::None,
        replay_window: 64,
        resource_sas: protego_ike::DEFAULT_RESOURCE_SAS,
    }
}

/// The A side of the default tunnel (hq.example, 10.1.0.0/24 <-> 10.2.0.0/24).
pub fn cfg_a() -> PeerConfig {
    let mut p = peer(1, A_ADDR, B_ADDR, "hq.example", "gw.example");
    p.local_ts = vec![ts("10.1.0.0/24")];
    p.remote_ts = vec![ts("10.2.0.0/24")];
    p
}

/// The B side of the default tunnel.
pub fn cfg_b() -> PeerConfig {
    let mut p = peer(1, B_ADDR, A_ADDR, "gw.example", "hq.example");
    p.local_ts = vec![ts("10.2.0.0/24")];
    p.remote_ts = vec![ts("10.1.0.0/24")];
    p
}

impl Pair {
    pub fn new(seed: u64, ca: EndpointConfig, cb: EndpointConfig) -> Self {
        let start = Instant::now();
        Self {
            a: Node::new(A_ADDR, seed.wrapping_mul(3).wrapping_add(1), ca, start),
            b: Node::new(B_ADDR, seed.wrapping_mul(7).wrapping_add(2), cb, start),
            now: start,
            start,
            link: LinkConfig {
                delay: Duration::from_millis(5),
                ..Default::default()
            },
            up: true,
            nat: None,
            link_rng: SeededRng::new(seed ^ 0x5eed),
            flight: Vec::new(),
            seq: 0,
            delivered: 0,
            check_sending: true,
        }
    }

    /// A pair with default endpoint configs and the given tunnel configurations.
    pub fn with_configs(seed: u64, a: PeerConfig, b: PeerConfig) -> Self {
        let mut p = Self::new(seed, EndpointConfig::default(), EndpointConfig::default());
        p.a.ep.add_peer(p.now, a).expect("config a");
        p.b.ep.add_peer(p.now, b).expect("config b");
        p
    }

    /// A pair with default endpoint configs and the default tunnel on both sides.
    pub fn with_tunnel(seed: u64) -> Self {
        let mut p = Self::new(seed, EndpointConfig::default(), EndpointConfig::default());
        p.a.ep.add_peer(p.now, cfg_a()).expect("config a");
        p.b.ep.add_peer(p.now, cfg_b()).expect("config b");
        p
    }

    /// The default tunnel with CHILD_SA rekeys every 2 minutes (±30 s, hard lifetime 400 s)
    /// and IKE SA rekeys every 500 s, retransmitting up to 10 times, not initiated yet: for
    /// long runs over a bad link, where consistency, not giving up, is what is tested.
    pub fn with_rekeying_tunnel(seed: u64) -> Self {
        let (mut a, mut b) = (cfg_a(), cfg_b());
        for c in [&mut a, &mut b] {
            c.child_rekey_time = Duration::from_secs(120);
            c.child_life_time = Duration::from_secs(400);
            c.rand_time = Duration::from_secs(30);
            c.ike_rekey_time = Duration::from_secs(500);
        }
        let e = EndpointConfig {
            retransmit_tries: 10,
            ..Default::default()
        };
        let mut p = Pair::new(seed, e.clone(), e);
        p.a.ep.add_peer(p.now, a).expect("a");
        p.b.ep.add_peer(p.now, b).expect("b");
        p
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        (self.link_rng.next_u32() as f64 / u32::MAX as f64) < p
    }

    fn collect(&mut self) {
        let mut buf = Vec::new();
        for which in 0..2 {
            loop {
                let node = if which == 0 { &mut self.a } else { &mut self.b };
                let Some(t) = node.ep.poll_transmit(&mut buf) else {
                    break;
                };
                assert_eq!(t.size, buf.len());
                let mut from = t.local;
                if from.ip().is_unspecified() {
                    from.set_ip(node.addr);
                }
                node.sent.push((from, t.remote, buf.clone()));
                let data = buf.clone();
                if which == 0 {
                    if let Some(nat) = &mut self.nat {
                        let port = *nat.map.entry(from).or_insert_with(|| {
                            nat.next_port += 1;
                            nat.next_port
                        });
                        from = SocketAddr::new(NAT_ADDR, port);
                    }
                }
                self.send(from, t.remote, data);
            }
        }
        self.a.drain_events();
        self.b.drain_events();
        if self.check_sending {
            self.assert_sending_decryptable();
        }
    }

    /// Neither side's data path sends on a CHILD_SA created by a rekey that the other side has
    /// not installed (a CHILD_SA of IKE_AUTH or a new one is exempt: nothing flows before it is
    /// up on both sides). Only while both sides still have the tunnel.
    pub fn assert_sending_decryptable(&self) {
        for (name, from, to) in [("A", &self.a, &self.b), ("B", &self.b, &self.a)] {
            let tunnels: Vec<TunnelId> = from.children.values().map(|c| c.tunnel).collect();
            for tunnel in tunnels {
                let Some(c) = from.sending_child(tunnel) else {
                    continue;
                };
                let peer_up = to.children.values().any(|p| p.tunnel == tunnel);
                if c.replaces.is_some() && peer_up {
                    assert!(
                        to.children.contains_key(&c.outbound_spi),
                        "{name} sends on {} (its SA {}) at {:?}, which the peer has not installed; \
                         peer has {:?}",
                        c.outbound_spi,
                        c.inbound_spi,
                        self.now - self.start,
                        to.children.keys().collect::<Vec<_>>()
                    );
                }
            }
        }
    }

    fn send(&mut self, from: SocketAddr, to: SocketAddr, data: Vec<u8>) {
        if !self.up || self.chance(self.link.loss) {
            return;
        }
        let copies = if self.chance(self.link.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let jitter_ms = self.link.jitter.as_millis() as u64;
            let extra = if jitter_ms > 0 {
                self.link_rng.next_u64() % (jitter_ms + 1)
            } else {
                0
            };
            self.seq += 1;
            self.flight.push(InFlight {
                at: self.now + self.link.delay + Duration::from_millis(extra),
                seq: self.seq,
                from,
                to,
                data: data.clone(),
            });
        }
    }

    fn deliver(&mut self, d: InFlight) {
        self.delivered += 1;
        let mut to = d.to;
        if to.ip() == NAT_ADDR {
            let Some(nat) = &self.nat else { return };
            let Some((inner, _)) = nat.map.iter().find(|(_, p)| **p == to.port()) else {
                return;
            };
            to = *inner;
        }
        let t = (self.now - self.start).as_secs_f64();
        if to.ip() == self.a.addr {
            let _s = tracing::info_span!("A", t).entered();
            self.a.ep.handle_datagram(self.now, to, d.from, &d.data);
        } else if to.ip() == self.b.addr {
            let _s = tracing::info_span!("B", t).entered();
            self.b.ep.handle_datagram(self.now, to, d.from, &d.data);
        }
    }

    /// Puts node A behind a NAT.
    pub fn enable_nat(&mut self) {
        self.nat = Some(Nat {
            map: HashMap::new(),
            next_port: 30000,
        });
    }

    /// The NAT forgets its mappings (rebinding: A appears from new ports).
    pub fn rebind_nat(&mut self) {
        if let Some(nat) = &mut self.nat {
            nat.map.clear();
            nat.next_port += 100;
        }
    }

    /// Processes everything due at or before `limit`; returns false if nothing is scheduled
    /// before it.
    fn step(&mut self, limit: Instant) -> bool {
        self.collect();
        let next_flight = self.flight.iter().map(|f| f.at).min();
        let ta = self.a.ep.poll_timeout();
        let tb = self.b.ep.poll_timeout();
        let Some(next) = [next_flight, ta, tb].into_iter().flatten().min() else {
            return false;
        };
        if next > limit {
            return false;
        }
        if next > self.now {
            self.now = next;
        }
        // Deliver in (time, sequence) order; jitter reorders by time.
        let mut due: Vec<InFlight> = Vec::new();
        self.flight.retain(|f| {
            if f.at <= next {
                due.push(f.clone());
                false
            } else {
                true
            }
        });
        due.sort_by_key(|f| (f.at, f.seq));
        for d in due {
            self.deliver(d);
            self.collect();
        }
        let t = (self.now - self.start).as_secs_f64();
        if self.a.ep.poll_timeout().is_some_and(|t| t <= self.now) {
            let _s = tracing::info_span!("A", t).entered();
            self.a.ep.handle_timeout(self.now);
        }
        if self.b.ep.poll_timeout().is_some_and(|t| t <= self.now) {
            let _s = tracing::info_span!("B", t).entered();
            self.b.ep.handle_timeout(self.now);
        }
        self.collect();
        true
    }

    /// Runs the simulation for `d` of virtual time (bounded number of steps).
    pub fn run_for(&mut self, d: Duration) {
        let limit = self.now + d;
        let mut steps = 0;
        while self.step(limit) {
            steps += 1;
            assert!(steps < 1_000_000, "simulation does not settle");
        }
        self.now = limit;
        self.collect();
    }

    /// Runs until `cond` holds (checked after every step) or `max` passes; returns whether it held.
    pub fn run_until(&mut self, max: Duration, mut cond: impl FnMut(&Pair) -> bool) -> bool {
        let limit = self.now + max;
        let mut steps = 0;
        loop {
            if cond(self) {
                return true;
            }
            if !self.step(limit) {
                self.now = limit;
                self.collect();
                return cond(self);
            }
            steps += 1;
            assert!(steps < 1_000_000, "simulation does not settle");
        }
    }

    /// Initiates the default tunnel from A and runs until both sides are established with a
    /// CHILD_SA (or 60 s pass).
    pub fn connect(&mut self) {
        self.a.ep.initiate(self.now, TunnelId(1)).expect("initiate");
        let ok = self.run_until(Duration::from_secs(60), |p| {
            p.a.children.len() == 1 && p.b.children.len() == 1
        });
        assert!(
            ok,
            "tunnel did not come up; A events {:?}\nB events {:?}",
            self.a.events, self.b.events
        );
    }

    /// Asserts that the installed CHILD_SAs of both sides pair up with mirrored keys.
    pub fn assert_children_consistent(&self) {
        assert_eq!(
            self.a.children.len(),
            self.b.children.len(),
            "A {:?} B {:?}",
            self.a.children.keys(),
            self.b.children.keys()
        );
        for (spi, ca) in &self.a.children {
            let cb = self
                .b
                .children
                .get(&ca.outbound_spi)
                .unwrap_or_else(|| panic!("B lacks the pair of A's {spi}"));
            assert_eq!(cb.outbound_spi, *spi);
            assert_eq!(ca.keys.outbound_encr, cb.keys.inbound_encr);
            assert_eq!(ca.keys.inbound_encr, cb.keys.outbound_encr);
            assert_eq!(ca.keys.outbound_integ, cb.keys.inbound_integ);
            assert_eq!(ca.keys.inbound_integ, cb.keys.outbound_integ);
            assert_ne!(ca.keys.inbound_encr, ca.keys.outbound_encr);
            assert_eq!(ca.encr, cb.encr);
            assert_eq!(ca.integ, cb.integ);
            assert_eq!(ca.esn, cb.esn);
            assert_eq!(ca.local_ts, cb.remote_ts);
            assert_eq!(ca.remote_ts, cb.local_ts);
        }
    }

    /// The live (not deleting) IKE SAs of both sides agree on their SPIs.
    pub fn assert_one_ike_sa(&self) {
        let a: Vec<IkeSaStatus> = self.a.ep.status(self.now);
        let b: Vec<IkeSaStatus> = self.b.ep.status(self.now);
        assert_eq!(a.len(), 1, "A has {a:?}");
        assert_eq!(b.len(), 1, "B has {b:?}");
        assert_eq!(a[0].ike, b[0].ike);
        assert_eq!(a[0].state, IkeSaState::Established);
        assert_eq!(b[0].state, IkeSaState::Established);
    }
}

// ---- reading what the engines sent (SK payloads opened with the key log's keys) ----

/// The SK keys of one IKE SA, from the engine's key log line
/// (`SPIi,SPIr,SK_ei,SK_er,"encr",SK_ai,SK_ar,"integ"`).
pub struct SkKeys {
    pub initiator: crypto::SaCipher,
    pub responder: crypto::SaCipher,
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

pub fn keys_from_log(line: &str) -> SkKeys {
    let f: Vec<&str> = line.split(',').collect();
    assert!(
        f[4].contains("AES-GCM-256"),
        "harness default proposal: {line}"
    );
    SkKeys {
        initiator: crypto::SaCipher::new(crypto::Encr::AesGcm16_256, &unhex(f[2]), None)
            .expect("SK_ei"),
        responder: crypto::SaCipher::new(crypto::Encr::AesGcm16_256, &unhex(f[3]), None)
            .expect("SK_er"),
    }
}

/// Decrypts an SK-protected message: (header, first inner payload type, inner chain bytes).
pub fn open(
    cipher: &crypto::SaCipher,
    data: &[u8],
) -> Option<(wire::ike::Header, wire::ike::PayloadType, Vec<u8>)> {
    let m = wire::ike::Message::parse(data).ok()?;
    let enc = m.encrypted?;
    let body = &data[enc.body.clone()];
    let (iv_len, icv_len) = (cipher.iv_len(), cipher.icv_len());
    let mut pt = body[iv_len..body.len() - icv_len].to_vec();
    cipher
        .open_in_place(
            &body[..iv_len],
            &data[..enc.body.start],
            &mut pt,
            &body[body.len() - icv_len..],
        )
        .ok()?;
    let inner = wire::ike::strip_padding(&pt).ok()?.to_vec();
    Some((m.header, enc.next_inner, inner))
}

/// A pair whose A side logs its IKE keys (to read the messages both sides send), with the
/// default tunnel on both sides as `edit` adjusts it (A's, B's), connected; and those keys.
pub fn connected_with_keys(
    seed: u64,
    edit: impl FnOnce(&mut PeerConfig, &mut PeerConfig),
) -> (Pair, SkKeys) {
    let ea = EndpointConfig {
        key_log: true,
        ..Default::default()
    };
    let mut p = Pair::new(seed, ea, EndpointConfig::default());
    let (mut a, mut b) = (cfg_a(), cfg_b());
    edit(&mut a, &mut b);
    p.a.ep.add_peer(p.now, a).expect("a");
    p.b.ep.add_peer(p.now, b).expect("b");
    p.connect();
    let line =
        p.a.events
            .iter()
            .find_map(|e| match e {
                Event::KeyLog { line, .. } => Some(line.clone()),
                _ => None,
            })
            .expect("key log line");
    (p, keys_from_log(&line))
}
