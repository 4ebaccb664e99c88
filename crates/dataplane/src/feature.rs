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
//! shown in `DataplaneStats::drops` beside the fixed reasons.
//!
//! Configuration goes through the data plane's registry and is published with the SA tables
//! ([`FeatureTable`] in [`crate::tables::Tables`]): workers read it once per batch. When no
//! tenant has a chain the packet path checks one flag per packet and nothing else. A packet
//! whose tenant has a chain is copied into the worker's [`Held`] buffer and its chain runs at
//! the end of the pass, before the packet goes on to the seal or encap stage (so a tunnel's
//! packets keep their order: all of them take the same way).

use crate::api::{DataplaneError, Inside};
use crate::stats::DropReason;
use esp::Unaccepted;
use ike::TunnelId;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wire::EspSpi;

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
    /// The tunnel the packet came out of (inbound) or goes into (outbound; chosen by the
    /// CHILD_SA's selectors before the chain runs).
    pub tunnel: TunnelId,
    /// Which way it goes.
    pub direction: Direction,
    /// The inside interface it comes from or goes to.
    pub inside: Inside,
}

/// One stage of a feature chain. Stages are shared by every worker (`Send + Sync`): keep
/// per-packet state in atomics or per-CPU structures, never behind a lock taken per packet.
pub trait Feature: Send + Sync {
    /// The stage's name (logs).
    fn name(&self) -> &'static str;

    /// The reasons the stage drops packets for, as shown in `DataplaneStats::drops`
    /// ([`FeatureBatch::drop_packet`] takes an index into this list). They must differ from
    /// the data plane's own reasons and from other stages' reasons. A stage that names none
    /// gets one counter named after the stage.
    fn drop_reasons(&self) -> &'static [&'static str] {
        &[]
    }

    /// Processes a batch of one tenant's packets of one direction.
    fn process(&self, batch: &mut FeatureBatch<'_>);

    /// Called once per lane batch in which the stage saw packets, after the batch was handed
    /// to the output stage: `seen` of the batch's `packets` went through this stage, and the
    /// worker spent `busy` on the whole batch (receive to hand-over). A CPU-charging stage
    /// charges the tenant its share here. By default nothing.
    fn batch_done(&self, tenant: &str, seen: usize, packets: u64, busy: Duration) {
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
    tenant: Arc<str>,
    direction: Direction,
    stages: Vec<StageRun>,
}

/// A stage and the counters of its drop reasons (same order).
type StageRun = (Arc<dyn Feature>, Vec<Arc<AtomicU64>>);

/// Node-wide counters of the feature stages' drop reasons, by name; a name keeps its counter
/// when chains are replaced.
#[derive(Default)]
pub(crate) struct FeatureDrops(Mutex<Vec<(&'static str, Arc<AtomicU64>)>>);

impl FeatureDrops {
    fn counters(&self) -> std::sync::MutexGuard<'_, Vec<(&'static str, Arc<AtomicU64>)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves `chain`'s drop reasons to counters (creating those not seen before) for
    /// `tenant` and `direction`. Errors: a reason that is one of the data plane's own, or
    /// that two stages of the chain both name.
    pub(crate) fn prepare(
        &self,
        tenant: &str,
        direction: Direction,
        chain: &FeatureChain,
    ) -> Result<ChainRun, DataplaneError> {
        let mut names: Vec<&'static str> = Vec::new();
        let mut stages = Vec::with_capacity(chain.stages.len());
        let mut counters = self.counters();
        for stage in &chain.stages {
            let fallback = [stage.name()];
            let reasons = match stage.drop_reasons() {
                [] => &fallback[..],
                r => r,
            };
            let mut slots = Vec::with_capacity(reasons.len());
            for &name in reasons {
                if DropReason::ALL.iter().any(|d| d.name() == name) || names.contains(&name) {
                    return Err(DataplaneError::Config {
                        field: format!("feature_chain.{}", stage.name()),
                        reason: format!("drop reason {name:?} is already in use"),
                    });
                }
                names.push(name);
                let slot = match counters.iter().find(|(n, _)| *n == name) {
                    Some((_, c)) => Arc::clone(c),
                    None => {
                        let c = Arc::new(AtomicU64::new(0));
                        counters.push((name, Arc::clone(&c)));
                        c
                    }
                };
                slots.push(slot);
            }
            stages.push((Arc::clone(stage), slots));
        }
        Ok(ChainRun {
            tenant: Arc::from(tenant),
            direction,
            stages,
        })
    }

    /// Name and value of every feature drop reason, in the order they were first configured.
    pub(crate) fn snapshot(&self) -> Vec<(String, u64)> {
        self.counters()
            .iter()
            .map(|(n, c)| ((*n).to_owned(), c.load(Ordering::Relaxed)))
            .collect()
    }
}

/// The chains as the control side edits them: per tenant, inbound and outbound.
#[derive(Default)]
pub(crate) struct ChainConfig(HashMap<String, [Option<Arc<ChainRun>>; 2]>);

impl ChainConfig {
    /// Sets (None: clears) `tenant`'s chain for `direction`.
    pub(crate) fn set(&mut self, tenant: &str, direction: Direction, run: Option<ChainRun>) {
        let entry = self.0.entry(tenant.to_owned()).or_default();
        entry[direction.index()] = run.map(Arc::new);
        if entry.iter().all(Option::is_none) {
            self.0.remove(tenant);
        }
    }

    /// The published form for tunnels bound as `bindings` ((tunnel, tenant) pairs).
    pub(crate) fn table<'a>(
        &self,
        bindings: impl Iterator<Item = (TunnelId, &'a str)>,
    ) -> FeatureTable {
        let mut by_tunnel = FxHashMap::default();
        if !self.0.is_empty() {
            for (tunnel, tenant) in bindings {
                if let Some(pair) = self.0.get(tenant) {
                    by_tunnel.insert(tunnel, pair.clone());
                }
            }
        }
        FeatureTable { by_tunnel }
    }
}

/// The published chains, resolved per tunnel (through its tenant) when the snapshot is built.
#[derive(Default)]
pub(crate) struct FeatureTable {
    by_tunnel: FxHashMap<TunnelId, [Option<Arc<ChainRun>>; 2]>,
}

impl FeatureTable {
    /// The chain of `tunnel`'s tenant for `direction`, if it has one. Costs one branch when
    /// no tenant has a chain.
    #[inline]
    pub(crate) fn chain(&self, tunnel: TunnelId, direction: Direction) -> Option<&Arc<ChainRun>> {
        if self.by_tunnel.is_empty() {
            return None;
        }
        self.by_tunnel.get(&tunnel)?[direction.index()].as_ref()
    }
}

/// How a held packet goes on once its chain let it through.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resume {
    /// Decrypted: to the inside interface, then accepted by the replay window.
    Inbound {
        /// Inbound SPI of the CHILD_SA that opened it.
        spi: EspSpi,
        /// What the replay window decides on.
        packet: Unaccepted,
        /// Where the ESP packet arrived.
        local: SocketAddr,
        /// Where it came from.
        src: SocketAddr,
    },
    /// To be sealed with the CHILD_SA of this inbound SPI.
    Outbound {
        /// Inbound SPI of the chosen CHILD_SA (the key of `Tables::by_spi`).
        spi: EspSpi,
    },
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
    /// How it goes on.
    pub(crate) resume: Resume,
}

/// A worker's packets held for their chains during one pass over a batch, copied out of the
/// receive batch (one copy per packet of a tenant with a chain; nothing for the others). The
/// buffer is allocated the first time a packet is held, sized for a whole receive batch.
pub(crate) struct Held {
    capacity: usize,
    buf: Vec<u8>,
    packets: Vec<HeldPacket>,
    chains: Vec<Arc<ChainRun>>,
    live: Vec<usize>,
    /// Chains that ran in the current lane batch, with the packets each saw.
    ran: Vec<(Arc<ChainRun>, usize)>,
}

impl Held {
    /// Room for `capacity` bytes of packets (a receive batch; allocated on first use).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            buf: Vec::new(),
            packets: Vec::new(),
            chains: Vec::new(),
            live: Vec::new(),
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
        resume: Resume,
    ) -> bool {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(self.capacity);
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
            resume,
        });
        true
    }

    /// Runs every held packet's chain, stage by stage over the packets of each chain; counts
    /// the drops. Then [`drain`](Self::drain) hands the packets on.
    pub(crate) fn run(&mut self, now: Instant) {
        for (ci, chain) in self.chains.iter().enumerate() {
            let mut seen = 0;
            for (si, (stage, _)) in chain.stages.iter().enumerate() {
                self.live.clear();
                self.live.extend(
                    self.packets
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| p.chain == ci && p.dropped.is_none())
                        .map(|(i, _)| i),
                );
                if self.live.is_empty() {
                    break;
                }
                if si == 0 {
                    seen = self.live.len();
                }
                let mut batch = FeatureBatch {
                    tenant: &chain.tenant,
                    direction: chain.direction,
                    now,
                    stage: si,
                    buf: &mut self.buf,
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
        for p in &self.packets {
            if let Some((stage, reason)) = p.dropped {
                let slots = &self.chains[p.chain].stages[stage].1;
                if let Some(c) = slots.get(reason.min(slots.len().saturating_sub(1))) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// The held packets in the order they were held: (packet, bytes, dropped by its chain).
    /// Empties the buffer.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(&HeldPacket, &mut [u8], bool)) {
        for p in &self.packets {
            let bytes = &mut self.buf[p.start..p.start + p.len];
            f(p, bytes, p.dropped.is_some());
        }
        self.packets.clear();
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
    tenant: &'a str,
    direction: Direction,
    now: Instant,
    stage: usize,
    buf: &'a mut [u8],
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
    pub fn tenant(&self) -> &str {
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
}
