//! The per-tenant feature chain: an ordered list of [`Feature`] stages configured per tenant and
//! per direction, run over batches of inner IP packets between decryption and the inside
//! interface (inbound) and between the inside interface and encryption (outbound). Empty by
//! default; ACL, policing, NAT, tenant filters and CPU charging are stages added through this
//! interface without touching the input, crypto or output stages (docs/architecture.md,
//! "The pipeline").
//!
//! A stage sees a [`FeatureBatch`]: packets of one tenant and one direction, with per-packet
//! metadata ([`PacketMeta`]). It may rewrite packets in place (same length) and drop packets
//! with a counted reason: each stage names its reasons ([`Feature::drop_reasons`]) and they are
//! shown in `DataplaneStats::drops` beside the fixed reasons, per tenant: `<tenant>/<reason>`
//! (two tenants whose stages drop for the same reason have two counters; the ACL and policer
//! of the next issues report per tenant).
//!
//! Configuration goes through the data plane's registry and is published with the SA tables
//! ([`FeatureTable`] in [`crate::tables::Tables`]): workers read it once per batch. When no
//! tenant has a chain the packet path checks one flag per packet and nothing else. A packet
//! whose tenant has a chain is copied into the worker's [`Held`] buffer and its chain runs at
//! the end of the pass, before the packet goes on to the seal or encap stage (so a tunnel's
//! packets keep their order: all of them take the same way).
//!
//! Inbound, the tenant is the tunnel's that opened the packet. Outbound, the chain runs before
//! the CHILD_SA is chosen (the seal stage chooses on the packet as the chain left it, so a
//! stage that rewrites addresses, such as a source NAT, is checked against the selectors): the
//! tenant is the VNet's for a packet from a VNet; for a packet read from the TUN device it is
//! the tenant of the tunnels bound to the TUN when they all belong to one tenant. When TUN
//! tunnels of several tenants share the device, the device alone does not tell the tenant: a
//! first choice on the packet as read names it, the tenant's chain runs, and the seal stage
//! chooses again on the result, among the TUN tunnels, keeping the packet only if that choice
//! is a tunnel of the same tenant (else `tun_no_tunnel`).

use crate::stats::DropReason;
use datapath::{DataplaneError, Inside};
use ids::TenantId;
use ike::TunnelId;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Which way packets cross the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Decrypted, toward the VNet or the TUN device.
    Inbound,
    /// From the VNet or the TUN device, before encryption.
    Outbound,
}

impl Direction {
    fn index(self) -> usize {
        match self {
            Direction::Inbound => 0,
            Direction::Outbound => 1,
        }
    }
}

/// What a stage knows about one packet besides its bytes (its tenant is the batch's,
/// [`FeatureBatch::tenant`]: a batch holds one tenant's packets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketMeta {
    /// The tunnel the packet came out of (inbound). None outbound: the seal stage chooses the
    /// CHILD_SA (and so the tunnel) after the chain, on the packet as the chain left it.
    pub tunnel: Option<TunnelId>,
    /// Which way it goes.
    pub direction: Direction,
    /// The inside interface it comes from (outbound) or goes to (inbound).
    pub inside: Inside,
}

/// One stage of a feature chain. Stages are shared by every worker (`Send + Sync`): keep
/// per-packet state in atomics or per-CPU structures, never behind a lock taken per packet.
pub trait Feature: Send + Sync {
    /// The stage's name (logs).
    fn name(&self) -> &'static str;

    /// The reasons the stage drops packets for, as shown in `DataplaneStats::drops`
    /// ([`FeatureBatch::drop_packet`] takes an index into this list) under
    /// `<tenant>/<reason>`. They must differ from the data plane's own reasons and from the
    /// reasons of the other stages of the same chain. A stage that names none gets one counter
    /// named after the stage.
    fn drop_reasons(&self) -> &'static [&'static str] {
        &[]
    }

    /// Processes a batch of one tenant's packets of one direction.
    fn process(&self, batch: &mut FeatureBatch<'_>);

    /// Called once per lane batch in which the stage saw packets, after the batch was handed
    /// to the output stage: `seen` of the batch's `packets` went through this stage, and the
    /// worker spent `busy` on the whole batch (receive to hand-over). A CPU-charging stage
    /// charges the tenant its share here. By default nothing.
    fn batch_done(&self, tenant: &TenantId, seen: usize, packets: u64, busy: Duration) {
        let _ = (tenant, seen, packets, busy);
    }
}

/// An ordered list of stages, as configured for one tenant and direction.
#[derive(Clone, Default)]
pub struct FeatureChain {
    stages: Vec<Arc<dyn Feature>>,
}

impl std::fmt::Debug for FeatureChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.stages.iter().map(|s| s.name()))
            .finish()
    }
}

impl FeatureChain {
    /// An empty chain (packets pass untouched).
    pub fn new() -> Self {
        Self::default()
    }

    /// The chain with `stage` appended (it runs after the stages already in it).
    pub fn with(mut self, stage: Arc<dyn Feature>) -> Self {
        self.stages.push(stage);
        self
    }

    /// True if the chain has no stage.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// Number of stages.
    pub fn len(&self) -> usize {
        self.stages.len()
    }
}

/// A chain ready to run: its stages with their drop counters resolved.
pub(crate) struct ChainRun {
    tenant: TenantId,
    direction: Direction,
    stages: Vec<StageRun>,
}

impl ChainRun {
    /// The chain's tenant.
    pub(crate) fn tenant(&self) -> &TenantId {
        &self.tenant
    }
}

/// A stage and the counters of its drop reasons (same order).
type StageRun = (Arc<dyn Feature>, Vec<Arc<AtomicU64>>);

/// Counters of the feature stages' drop reasons, by tenant and reason name; a (tenant, name)
/// keeps its counter when chains are replaced.
#[derive(Default)]
pub(crate) struct FeatureDrops(Mutex<Vec<(String, Arc<AtomicU64>)>>);

impl FeatureDrops {
    fn counters(&self) -> std::sync::MutexGuard<'_, Vec<(String, Arc<AtomicU64>)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves `chain`'s drop reasons to `tenant`'s counters for `direction`. The whole chain
    /// is checked before any counter is created (a refused chain leaves no name behind).
    /// Errors: a reason that is one of the data plane's own, or that two stages of the chain
    /// both name.
    pub(crate) fn prepare(
        &self,
        tenant: &TenantId,
        direction: Direction,
        chain: &FeatureChain,
    ) -> Result<ChainRun, DataplaneError> {
        let reasons = |stage: &Arc<dyn Feature>| -> Vec<&'static str> {
            match stage.drop_reasons() {
                [] => vec![stage.name()],
                r => r.to_vec(),
            }
        };
        let mut names: Vec<&'static str> = Vec::new();
        for stage in &chain.stages {
            for name in reasons(stage) {
                if DropReason::ALL.iter().any(|d| d.name() == name) || names.contains(&name) {
                    return Err(DataplaneError::Config {
                        field: format!("feature_chain.{}", stage.name()),
                        reason: format!("drop reason {name:?} is already in use"),
                    });
                }
                names.push(name);
            }
        }
        let mut counters = self.counters();
        let stages = chain
            .stages
            .iter()
            .map(|stage| {
                let slots = reasons(stage)
                    .into_iter()
                    .map(|name| {
                        let key = format!("{tenant}/{name}");
                        match counters.iter().find(|(n, _)| *n == key) {
                            Some((_, c)) => Arc::clone(c),
                            None => {
                                let c = Arc::new(AtomicU64::new(0));
                                counters.push((key, Arc::clone(&c)));
                                c
                            }
                        }
                    })
                    .collect();
                (Arc::clone(stage), slots)
            })
            .collect();
        Ok(ChainRun {
            tenant: tenant.clone(),
            direction,
            stages,
        })
    }

    /// Name (`<tenant>/<reason>`) and value of every feature drop reason, in the order they
    /// were first configured.
    pub(crate) fn snapshot(&self) -> Vec<(String, u64)> {
        self.counters()
            .iter()
            .map(|(n, c)| (n.clone(), c.load(Ordering::Relaxed)))
            .collect()
    }
}

/// The chains as the control side edits them: per tenant, inbound and outbound.
#[derive(Default)]
pub(crate) struct ChainConfig(HashMap<TenantId, [Option<Arc<ChainRun>>; 2]>);

impl ChainConfig {
    /// Sets (None: clears) `tenant`'s chain for `direction`.
    pub(crate) fn set(&mut self, tenant: &TenantId, direction: Direction, run: Option<ChainRun>) {
        let entry = self.0.entry(tenant.clone()).or_default();
        entry[direction.index()] = run.map(Arc::new);
        if entry.iter().all(Option::is_none) {
            self.0.remove(tenant);
        }
    }

    /// The published form for VNets of tenants `vnets` (by VNet index) and tunnels bound as
    /// `bindings` ((tunnel, tenant, bound to the TUN device) triples).
    pub(crate) fn table<'a>(
        &self,
        vnets: impl Iterator<Item = &'a str>,
        bindings: impl Iterator<Item = (TunnelId, &'a str, bool)>,
    ) -> FeatureTable {
        if self.0.is_empty() {
            return FeatureTable::default();
        }
        let out = Direction::Outbound.index();
        let inbound = Direction::Inbound.index();
        let (vnet_in, vnet_out) = vnets
            .map(|tenant| {
                let pair = self.0.get(tenant);
                (
                    pair.and_then(|p| p[inbound].clone()),
                    pair.and_then(|p| p[out].clone()),
                )
            })
            .unzip();
        let mut by_tunnel = FxHashMap::default();
        let mut tun_tenants: Vec<&str> = Vec::new();
        for (tunnel, tenant, tun) in bindings {
            if tun && !tun_tenants.contains(&tenant) {
                tun_tenants.push(tenant);
            }
            if let Some(pair) = self.0.get(tenant) {
                by_tunnel.insert(tunnel, pair.clone());
            }
        }
        let tun_out = match tun_tenants[..] {
            [] => TunChain::None,
            [tenant] => match self.0.get(tenant).and_then(|pair| pair[out].clone()) {
                Some(run) => TunChain::One(run),
                None => TunChain::None,
            },
            _ => TunChain::ByTunnel,
        };
        FeatureTable {
            any: true,
            by_tunnel,
            vnet_in,
            vnet_out,
            tun_out,
        }
    }
}

/// The outbound chain of packets read from the TUN device.
#[derive(Default)]
pub(crate) enum TunChain {
    /// None runs.
    #[default]
    None,
    /// The TUN tunnels all belong to one tenant, which has this chain.
    One(Arc<ChainRun>),
    /// The TUN tunnels belong to several tenants: a first choice of CHILD_SA names the tenant
    /// ([`FeatureTable::chain`] of its tunnel).
    ByTunnel,
}

/// The published chains: by tunnel (through its tenant), by VNet index (its tenant's, for the
/// packets of its attachments' CEs and toward them) and for the TUN device, resolved when the
/// snapshot is built.
#[derive(Default)]
pub(crate) struct FeatureTable {
    /// Some tenant has a chain.
    any: bool,
    by_tunnel: FxHashMap<TunnelId, [Option<Arc<ChainRun>>; 2]>,
    vnet_in: Vec<Option<Arc<ChainRun>>>,
    vnet_out: Vec<Option<Arc<ChainRun>>>,
    tun_out: TunChain,
}

impl FeatureTable {
    /// The chain of `tunnel`'s tenant for `direction`, if it has one. Costs one branch when
    /// no tenant has a chain.
    #[inline]
    pub(crate) fn chain(&self, tunnel: TunnelId, direction: Direction) -> Option<&Arc<ChainRun>> {
        if !self.any {
            return None;
        }
        self.by_tunnel.get(&tunnel)?[direction.index()].as_ref()
    }

    /// The outbound chain of VNet `index`'s tenant, if it has one. Costs one branch when no
    /// tenant has a chain.
    #[inline]
    pub(crate) fn vnet_outbound(&self, index: usize) -> Option<&Arc<ChainRun>> {
        if !self.any {
            return None;
        }
        self.vnet_out.get(index)?.as_ref()
    }

    /// The inbound chain of VNet `index`'s tenant (what its attachments' CEs send toward its
    /// VMs runs it), if it has one. Costs one branch when no tenant has a chain.
    #[inline]
    pub(crate) fn vnet_inbound(&self, index: usize) -> Option<&Arc<ChainRun>> {
        if !self.any {
            return None;
        }
        self.vnet_in.get(index)?.as_ref()
    }

    /// The outbound chain of packets read from the TUN device.
    #[inline]
    pub(crate) fn tun_outbound(&self) -> &TunChain {
        &self.tun_out
    }
}

/// A packet held for its chain.
pub(crate) struct HeldPacket {
    start: usize,
    len: usize,
    meta: PacketMeta,
    /// Index into [`Held::chains`].
    chain: usize,
    /// (stage, reason) that dropped it.
    dropped: Option<(usize, usize)>,
    /// A stage sent it back the way it came ([`FeatureBatch::reflect`]).
    reflected: bool,
}

/// What became of a held packet in its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Let through: it goes on as it would have without the chain.
    Pass,
    /// Dropped by a stage (counted).
    Dropped,
    /// Sent back the way it came ([`FeatureBatch::reflect`]).
    Reflected,
}

/// Bytes beyond the held packets' own that stages may add in one pass by lengthening
/// packets ([`FeatureBatch::replace`]); reserved with the buffer, so growth never moves it.
pub(crate) const GROWTH_BUDGET: usize = 256 * 1024;

/// A worker's packets held for their chains during one pass over a batch, copied out of the
/// receive batch (one copy per packet of a tenant with a chain; nothing for the others). The
/// buffer is allocated the first time a packet is held, sized for the largest input a lane
/// delivers in one batch (a receive batch, or a TUN read batch with a split super-packet).
///
/// The copy is what lets the stages before the chain stay per packet: they hand the graph
/// a slice of the receive batch without its place in it, and in a relay lane the same
/// frames are read by two passes.
pub(crate) struct Held<R> {
    capacity: usize,
    buf: Vec<u8>,
    packets: Vec<HeldPacket>,
    /// How each packet goes on once its chain let it through (same order as `packets`).
    resumes: Vec<R>,
    chains: Vec<Arc<ChainRun>>,
    live: Vec<usize>,
    /// Drops of the current run: (chain, stage, reason) and how many (one counter add per
    /// reason per run).
    tally: Vec<((usize, usize, usize), u64)>,
    /// Chains that ran in the current lane batch, with the packets each saw.
    ran: Vec<(Arc<ChainRun>, usize)>,
}

impl<R> Held<R> {
    /// Room for `capacity` bytes of packets (allocated on first use).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            buf: Vec::new(),
            packets: Vec::new(),
            resumes: Vec::new(),
            chains: Vec::new(),
            live: Vec::new(),
            tally: Vec::new(),
            ran: Vec::new(),
        }
    }

    /// True if no packet is held.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// Holds a copy of `pkt` for `chain`; false (nothing held) if the buffer is full.
    pub(crate) fn hold(
        &mut self,
        chain: &Arc<ChainRun>,
        pkt: &[u8],
        meta: PacketMeta,
        resume: R,
    ) -> bool {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(self.capacity + GROWTH_BUDGET);
        }
        if self.buf.len() + pkt.len() > self.capacity {
            return false;
        }
        let chain = match self.chains.iter().position(|c| Arc::ptr_eq(c, chain)) {
            Some(i) => i,
            None => {
                self.chains.push(Arc::clone(chain));
                self.chains.len() - 1
            }
        };
        let start = self.buf.len();
        self.buf.extend_from_slice(pkt);
        self.packets.push(HeldPacket {
            start,
            len: pkt.len(),
            meta,
            chain,
            dropped: None,
            reflected: false,
        });
        self.resumes.push(resume);
        true
    }

    /// Runs every held packet's chain, stage by stage over the packets of each chain; counts
    /// the drops. `before` is told of each chain about to run and how many packets it sees
    /// (the CPU charge begins the chain's tenant's run there). Then [`drain`](Self::drain) hands the packets on.
    pub(crate) fn run(
        &mut self,
        now: Instant,
        worker: usize,
        mut before: impl FnMut(&ChainRun, usize),
    ) {
        for (ci, chain) in self.chains.iter().enumerate() {
            let mut seen = 0;
            for (si, (stage, _)) in chain.stages.iter().enumerate() {
                self.live.clear();
                self.live.extend(
                    self.packets
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| p.chain == ci && p.dropped.is_none() && !p.reflected)
                        .map(|(i, _)| i),
                );
                if self.live.is_empty() {
                    break;
                }
                if si == 0 {
                    seen = self.live.len();
                    before(chain, seen);
                }
                let mut batch = FeatureBatch {
                    tenant: &chain.tenant,
                    direction: chain.direction,
                    now,
                    stage: si,
                    buf: &mut self.buf,
                    limit: self.capacity + GROWTH_BUDGET,
                    worker,
                    packets: &mut self.packets,
                    live: &self.live,
                };
                stage.process(&mut batch);
            }
            if seen > 0 {
                match self.ran.iter_mut().find(|(c, _)| Arc::ptr_eq(c, chain)) {
                    Some((_, n)) => *n += seen,
                    None => self.ran.push((Arc::clone(chain), seen)),
                }
            }
        }
        self.tally.clear();
        for p in &self.packets {
            if let Some((stage, reason)) = p.dropped {
                let key = (p.chain, stage, reason);
                match self.tally.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, n)) => *n += 1,
                    None => self.tally.push((key, 1)),
                }
            }
        }
        for &((chain, stage, reason), n) in &self.tally {
            let slots = &self.chains[chain].stages[stage].1;
            if let Some(c) = slots.get(reason.min(slots.len().saturating_sub(1))) {
                c.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// The held packets in the order they were held: (how it goes on, the chain that ran,
    /// bytes as the chain left them, what became of it). Empties the buffer.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(R, &Arc<ChainRun>, &mut [u8], Fate)) {
        for (p, resume) in self.packets.drain(..).zip(self.resumes.drain(..)) {
            let bytes = &mut self.buf[p.start..p.start + p.len];
            let fate = match (p.dropped, p.reflected) {
                (Some(_), _) => Fate::Dropped,
                (None, true) => Fate::Reflected,
                (None, false) => Fate::Pass,
            };
            f(resume, &self.chains[p.chain], bytes, fate);
        }
        self.buf.clear();
        self.chains.clear();
    }

    /// Tells the stages of the chains that ran in the lane batch just finished (`packets`
    /// packets, `busy` on the worker) what they saw.
    pub(crate) fn batch_done(&mut self, packets: u64, busy: Duration) {
        for (chain, seen) in self.ran.drain(..) {
            for (stage, _) in &chain.stages {
                stage.batch_done(&chain.tenant, seen, packets, busy);
            }
        }
    }
}

/// The packets of one tenant and direction that a stage processes: indexes `0..len()` name the
/// packets its earlier stages let through, in arrival order.
pub struct FeatureBatch<'a> {
    tenant: &'a TenantId,
    direction: Direction,
    now: Instant,
    stage: usize,
    buf: &'a mut Vec<u8>,
    /// How long `buf` may grow ([`FeatureBatch::replace`]); within its reserved capacity.
    limit: usize,
    worker: usize,
    packets: &'a mut [HeldPacket],
    live: &'a [usize],
}

impl std::fmt::Debug for FeatureBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureBatch")
            .field("tenant", &self.tenant)
            .field("direction", &self.direction)
            .field("packets", &self.live.len())
            .finish_non_exhaustive()
    }
}

impl FeatureBatch<'_> {
    /// The tenant all the packets belong to.
    pub fn tenant(&self) -> &TenantId {
        self.tenant
    }

    /// Their direction.
    pub fn direction(&self) -> Direction {
        self.direction
    }

    /// When the worker began the lane batch (read once per batch).
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Number of packets.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// True if there is no packet.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The metadata of packet `i`.
    pub fn meta(&self, i: usize) -> &PacketMeta {
        &self.packets[self.live[i]].meta
    }

    /// Packet `i` (a whole IPv4 or IPv6 packet).
    pub fn packet(&self, i: usize) -> &[u8] {
        let p = &self.packets[self.live[i]];
        &self.buf[p.start..p.start + p.len]
    }

    /// Packet `i`, writable in place (a stage that changes addresses or ports fixes the
    /// checksums it affects).
    pub fn packet_mut(&mut self, i: usize) -> &mut [u8] {
        let p = &self.packets[self.live[i]];
        &mut self.buf[p.start..p.start + p.len]
    }

    /// Drops packet `i` for `reason`, an index into the stage's
    /// [`drop_reasons`](Feature::drop_reasons) (beyond it: the last reason). Later stages do
    /// not see it.
    pub fn drop_packet(&mut self, i: usize, reason: usize) {
        let p = &mut self.packets[self.live[i]];
        if p.dropped.is_none() {
            p.dropped = Some((self.stage, reason));
        }
    }

    /// True if packet `i` was dropped by this stage.
    pub fn is_dropped(&self, i: usize) -> bool {
        self.packets[self.live[i]].dropped.is_some()
    }

    /// The data plane worker running the batch (0-based, below the configured workers): a
    /// stage may keep per-worker state indexed by it.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// Replaces packet `i` by `bytes`, which may be shorter or longer (a stage that adds or
    /// removes headers). False, and the packet unchanged, if the batch has no room left for
    /// the longer packet (256 KiB per pass beyond the packets' own).
    pub fn replace(&mut self, i: usize, bytes: &[u8]) -> bool {
        let p = &mut self.packets[self.live[i]];
        if bytes.len() <= p.len {
            self.buf[p.start..p.start + bytes.len()].copy_from_slice(bytes);
        } else {
            if self.buf.len() + bytes.len() > self.limit {
                return false;
            }
            p.start = self.buf.len();
            self.buf.extend_from_slice(bytes);
        }
        p.len = bytes.len();
        true
    }

    /// Sends packet `i` back the way it came, as the stage left it (XDP's `XDP_TX`): a
    /// decrypted packet into the tunnels of its VNet (or the TUN device's), a packet from the
    /// VNet back into it, from a CE back to the CE. Later stages do not see it.
    pub fn reflect(&mut self, i: usize) {
        let p = &mut self.packets[self.live[i]];
        if p.dropped.is_none() {
            p.reflected = true;
        }
    }

    /// True if packet `i` was sent back by this stage.
    pub fn is_reflected(&self, i: usize) -> bool {
        self.packets[self.live[i]].reflected
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drops every packet for its first reason.
    struct DropAll(&'static [&'static str]);

    impl Feature for DropAll {
        fn name(&self) -> &'static str {
            "drop_all"
        }

        fn drop_reasons(&self) -> &'static [&'static str] {
            self.0
        }

        fn process(&self, batch: &mut FeatureBatch<'_>) {
            for i in 0..batch.len() {
                batch.drop_packet(i, 0);
            }
        }
    }

    fn config(drops: &FeatureDrops, tenants: &[&str]) -> ChainConfig {
        let mut c = ChainConfig::default();
        for t in tenants {
            let t = TenantId::new(t).expect("tenant");
            let chain = FeatureChain::new().with(Arc::new(DropAll(&["x"])));
            let run = drops
                .prepare(&t, Direction::Outbound, &chain)
                .expect("chain");
            c.set(&t, Direction::Outbound, Some(run));
        }
        c
    }

    #[test]
    fn the_tun_chain_is_the_tenant_of_its_tunnels_or_found_per_tunnel() {
        let drops = FeatureDrops::default();
        let c = config(&drops, &["a"]);
        let vnets = || ["a", "b"].into_iter();
        // One tenant on the TUN: its chain, before any choice.
        let t = c.table(vnets(), [(TunnelId(1), "a", true)].into_iter());
        assert!(matches!(t.tun_outbound(), TunChain::One(r) if r.tenant == "a"));
        assert!(t.vnet_outbound(0).is_some() && t.vnet_outbound(1).is_none());
        assert!(t.vnet_inbound(0).is_none(), "no inbound chain yet");
        // An inbound chain of tenant a: its VNets' (for their CEs' packets) and its tunnels'.
        let mut with_in = config(&drops, &["a"]);
        let a = TenantId::new("a").expect("tenant");
        let chain = FeatureChain::new().with(Arc::new(DropAll(&["x"])));
        let run = drops
            .prepare(&a, Direction::Inbound, &chain)
            .expect("chain");
        with_in.set(&a, Direction::Inbound, Some(run));
        let t = with_in.table(vnets(), [(TunnelId(1), "a", false)].into_iter());
        assert!(t.vnet_inbound(0).is_some() && t.vnet_inbound(1).is_none());
        assert!(t.chain(TunnelId(1), Direction::Inbound).is_some());
        // The TUN tenant has no chain.
        let t = c.table(vnets(), [(TunnelId(2), "b", true)].into_iter());
        assert!(matches!(t.tun_outbound(), TunChain::None));
        // Two tenants share the TUN: found through the first choice's tunnel.
        let t = c.table(
            vnets(),
            [(TunnelId(1), "a", true), (TunnelId(2), "b", true)].into_iter(),
        );
        assert!(matches!(t.tun_outbound(), TunChain::ByTunnel));
        assert!(t.chain(TunnelId(1), Direction::Outbound).is_some());
        assert!(t.chain(TunnelId(2), Direction::Outbound).is_none());
    }

    #[test]
    fn drops_are_added_per_reason_once_and_a_full_hold_refuses() {
        let drops = FeatureDrops::default();
        let chain = FeatureChain::new().with(Arc::new(DropAll(&["x", "y"])));
        let run = Arc::new(
            drops
                .prepare(
                    &TenantId::new("a").expect("tenant"),
                    Direction::Inbound,
                    &chain,
                )
                .expect("chain"),
        );
        let meta = PacketMeta {
            tunnel: Some(TunnelId(1)),
            direction: Direction::Inbound,
            inside: Inside::Tun,
        };
        let mut held: Held<u8> = Held::new(10);
        for i in 0..3 {
            assert!(held.hold(&run, &[i; 3], meta.clone(), i));
        }
        assert!(!held.hold(&run, &[9; 3], meta, 9), "10 bytes hold three");
        held.run(Instant::now(), 0, |_, _| {});
        let mut seen = Vec::new();
        held.drain(|r, _, pkt, fate| seen.push((r, pkt[0], fate == Fate::Dropped)));
        assert_eq!(seen, vec![(0, 0, true), (1, 1, true), (2, 2, true)]);
        assert_eq!(
            drops.snapshot(),
            vec![("a/x".to_owned(), 3), ("a/y".to_owned(), 0)]
        );
        assert!(held.is_empty());
    }
}
