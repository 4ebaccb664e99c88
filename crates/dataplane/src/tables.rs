//! The SA tables the packet path reads: inbound SPI -> CHILD_SA in O(1), and per inside
//! interface the CHILD_SAs that currently carry outbound traffic (the candidates of the
//! selector-based tunnel choice, indexed by destination when the snapshot is built so that the
//! choice costs O(log n)). The control plane edits a [`Registry`] under a mutex and publishes
//! an immutable [`Tables`] snapshot; packet threads take the snapshot once per batch.
//!
//! Rekeying (RFC 7296 §2.8): a CHILD_SA installed with `replaces` and `outbound_active` takes
//! over outbound traffic at once; one installed without `outbound_active` (we answered the
//! peer's rekey) only receives until the replaced SA is removed, then the tunnel's newest SA
//! sends. The replaced SA stays in the inbound table until it is removed.
//!
//! The snapshot also carries the inside configuration ([`Overlay`]: VNets and tunnel
//! bindings) and, in relay mode, the steer nodes ([`Relays`]), so a batch sees one consistent
//! state of everything the control plane may change at run time.

use crate::attach::AttachView;
use crate::feature::{ChainConfig, ChainRun, Direction, FeatureTable};
use crate::overlay::Overlay;
use crate::pipeline::charge::{TenantBook, TenantSlot, TenantTable};
use crate::relays::Relays;
use crate::sa::SaPair;
use crate::select;
use crate::select::index::{SelectorIndex, LINEAR_MAX};
use crate::stats::ChildCounters;
use crate::vnet::vmacs::Dispatch;
use datapath::{ChildStats, Inside, InstalledChild, TunnelTraffic};
use ike::{IkeSpis, TrafficSelector, TunnelId};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;
use wire::flow::Flow;
use wire::EspSpi;

/// Map keyed by SPI (our inbound SPIs are random, so a fast non-keyed hash suffices: the
/// keys are ours, the network only probes).
pub(crate) type SpiMap<V> = FxHashMap<EspSpi, V>;

/// The mutable, shared part of a CHILD_SA pair: ESP state and counters.
pub(crate) struct ChildState {
    /// The ESP SAs.
    pub(crate) sa: SaPair,
    /// Counters.
    pub(crate) counters: ChildCounters,
    /// RekeyNeeded was sent for the outbound SA.
    pub(crate) rekey_requested: AtomicBool,
    /// The last new peer address reported to the control plane (see
    /// [`ToControl::PeerAddressSeen`](datapath::ToControl::PeerAddressSeen)). Only read
    /// when authenticated ESP arrives from an address other than the SA's.
    pub(crate) moved_reported: Mutex<Option<SocketAddr>>,
}

impl ChildState {
    /// True the first time it is called (the caller then asks the control plane to rekey).
    pub(crate) fn take_rekey_request(&self) -> bool {
        !self.rekey_requested.swap(true, Ordering::Relaxed)
    }

    /// The request could not be delivered: let a later packet ask again.
    pub(crate) fn retry_rekey_request(&self) {
        self.rekey_requested.store(false, Ordering::Relaxed);
    }

    /// True the first time it is called for `remote` (the caller then tells the control
    /// plane that the peer moved there).
    pub(crate) fn take_move_report(&self, remote: SocketAddr) -> bool {
        let mut last = self.moved_report();
        if *last == Some(remote) {
            return false;
        }
        *last = Some(remote);
        true
    }

    /// The report could not be delivered: let a later packet report the move again.
    pub(crate) fn retry_move_report(&self) {
        *self.moved_report() = None;
    }

    fn moved_report(&self) -> std::sync::MutexGuard<'_, Option<SocketAddr>> {
        self.moved_reported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// A CHILD_SA pair as the packet path sees it.
pub(crate) struct Child {
    /// Tunnel.
    pub(crate) tunnel: TunnelId,
    /// IKE SA that negotiated it.
    pub(crate) ike: IkeSpis,
    /// Inbound SPI.
    pub(crate) inbound_spi: EspSpi,
    /// Outbound SPI.
    pub(crate) outbound_spi: EspSpi,
    /// Where decrypted traffic goes.
    pub(crate) inside: Inside,
    /// Our outer address.
    pub(crate) local: SocketAddr,
    /// The peer's outer address.
    pub(crate) remote: SocketAddr,
    /// Index of the NAT-T socket on `local`.
    pub(crate) sock: usize,
    /// Negotiated local selectors.
    pub(crate) local_ts: Vec<TrafficSelector>,
    /// Negotiated remote selectors.
    pub(crate) remote_ts: Vec<TrafficSelector>,
    /// ESP state and counters (shared across address updates).
    pub(crate) state: Arc<ChildState>,
    /// The tunnel's tenant's slot (the CPU charge, [`crate::pipeline::charge`]).
    pub(crate) tenant: TenantSlot,
}

impl Child {
    /// Starts loading what the open and accept stages will read of this CHILD_SA for a packet
    /// with sequence number (low 32 bits) `seq`: its ESP state, counters and selectors (a CPU
    /// hint, see [`crate::pipeline::open::Prefetch`]).
    pub(crate) fn prefetch_open(&self, seq: u32) {
        self.state.sa.prefetch_inbound(seq);
        wire::prefetch::line((&self.state.counters as *const ChildCounters).cast());
        wire::prefetch::line(self.remote_ts.as_ptr().cast());
        wire::prefetch::line(self.local_ts.as_ptr().cast());
    }

    /// RFC 4301 §5.2 inbound check: the decrypted packet's source must be in the remote
    /// selectors and its destination in the local ones.
    pub(crate) fn admits_inbound(&self, flow: &Flow) -> bool {
        select::covers(flow, &self.remote_ts, &self.local_ts)
    }

    /// Outbound: source in the local selectors, destination in the remote ones.
    pub(crate) fn covers_outbound(&self, flow: &Flow) -> bool {
        select::covers(flow, &self.local_ts, &self.remote_ts)
    }

    fn with_addrs(&self, local: SocketAddr, remote: SocketAddr, sock: usize) -> Self {
        self.rebuilt(local, remote, sock, self.inside.clone())
    }

    fn with_inside(&self, inside: Inside, tenant: TenantSlot) -> Self {
        Self {
            tenant,
            ..self.rebuilt(self.local, self.remote, self.sock, inside)
        }
    }

    fn rebuilt(&self, local: SocketAddr, remote: SocketAddr, sock: usize, inside: Inside) -> Self {
        Self {
            tunnel: self.tunnel,
            ike: self.ike,
            inbound_spi: self.inbound_spi,
            outbound_spi: self.outbound_spi,
            inside,
            local,
            remote,
            sock,
            local_ts: self.local_ts.clone(),
            remote_ts: self.remote_ts.clone(),
            state: Arc::clone(&self.state),
            tenant: self.tenant,
        }
    }

    /// Counters for `stats()`.
    pub(crate) fn stats(&self) -> ChildStats {
        let mut s = ChildStats {
            tunnel: Some(self.tunnel),
            inbound_spi: self.inbound_spi,
            outbound_spi: self.outbound_spi,
            ..ChildStats::default()
        };
        self.state
            .sa
            .fill_stats(&mut s, self.state.counters.drops_in.load(Ordering::Relaxed));
        s
    }
}

/// The CHILD_SAs carrying outbound traffic of one inside interface, newest first, with the
/// destination index that finds the one for a packet in O(log n) (see
/// [`SelectorIndex`]). Dereferences to the list.
#[derive(Default)]
pub(crate) struct OutboundSet {
    children: Vec<Arc<Child>>,
    index: SelectorIndex,
}

impl OutboundSet {
    /// Indexes `children` (in priority order: the first that covers a packet carries it).
    pub(crate) fn new(children: Vec<Arc<Child>>) -> Self {
        let index = SelectorIndex::build(children.iter().map(|c| c.remote_ts.as_slice()));
        Self { children, index }
    }

    /// True if the choice binary-searches (false: few children, or selectors so nested that
    /// the index would be too large, and the choice scans them all).
    pub(crate) fn is_indexed(&self) -> bool {
        self.index.is_indexed()
    }
}

impl std::ops::Deref for OutboundSet {
    type Target = [Arc<Child>];

    fn deref(&self) -> &[Arc<Child>] {
        &self.children
    }
}

/// The snapshot the packet path reads.
#[derive(Default)]
pub(crate) struct Tables {
    /// Every installed CHILD_SA by inbound SPI.
    pub(crate) by_spi: SpiMap<Arc<Child>>,
    /// Per VNet (index into the config's VNets): the CHILD_SAs carrying outbound traffic,
    /// newest first, indexed.
    pub(crate) vnet_out: Vec<OutboundSet>,
    /// The same for TUN tunnels.
    pub(crate) tun_out: OutboundSet,
    /// VNets and tunnel bindings.
    pub(crate) overlay: Arc<Overlay>,
    /// Relay mode: the steer nodes (None: not in relay mode).
    pub(crate) relays: Option<Arc<Relays>>,
    /// Self-dispatch: who owns each dispatched VNet's virtual MACs (None: not configured).
    pub(crate) dispatch: Option<Arc<Dispatch>>,
    /// The tenants' feature chains (inbound by tunnel, outbound by VNet and for the TUN).
    pub(crate) features: FeatureTable,
    /// Which VNet each attachment serves, and each VNet's attachments (set by
    /// `Shared::publish`).
    pub(crate) attach: AttachView,
    /// The tenants' slots, weights and CPU counters, and the CPU fairness mode.
    pub(crate) tenants: Arc<TenantTable>,
}

impl Tables {
    /// The CHILD_SA among `candidates` whose selectors cover an outbound packet: the first in
    /// their order, found through the destination index.
    #[inline]
    pub(crate) fn select<'a>(candidates: &'a OutboundSet, flow: &Flow) -> Option<&'a Arc<Child>> {
        candidates
            .index
            .select(&candidates.children, flow, |c, f| c.covers_outbound(f))
    }
}

struct Installed {
    child: Arc<Child>,
    /// Install order (newer is larger).
    order: u64,
    /// Carries outbound traffic (false once replaced by a rekey).
    active_out: bool,
    /// Removed by the control plane: still opens inbound packets until then (late packets the
    /// peer sent before it saw the DELETE), never carries outbound traffic again.
    retired_until: Option<Instant>,
}

/// The control plane's view, edited under a lock and published as [`Tables`].
pub(crate) struct Registry {
    children: SpiMap<Installed>,
    next_order: u64,
    overlay: Arc<Overlay>,
    relays: Option<Arc<Relays>>,
    dispatch: Option<Arc<Dispatch>>,
    chains: ChainConfig,
    tenants: TenantBook,
    /// Per tunnel, the final counters of its CHILD_SAs that are gone (folded in when they
    /// leave), so that its totals never go back (`tunnel_totals`).
    retired: HashMap<TunnelId, TunnelTraffic>,
}

impl Registry {
    /// A registry without CHILD_SAs over `overlay`; `relays` in relay mode.
    pub(crate) fn new(overlay: Arc<Overlay>, relays: Option<Arc<Relays>>) -> Self {
        let mut reg = Self {
            children: SpiMap::default(),
            next_order: 0,
            overlay,
            relays,
            dispatch: None,
            chains: ChainConfig::default(),
            tenants: TenantBook::default(),
            retired: HashMap::new(),
        };
        reg.give_slots();
        reg
    }

    /// Gives every tenant of the overlay's VNets and tunnels its slot.
    fn give_slots(&mut self) {
        let o = Arc::clone(&self.overlay);
        for t in o
            .vnets
            .iter()
            .map(|v| &v.tenant)
            .chain(o.tunnels.iter().map(|b| &b.tenant))
        {
            self.tenants.slot(t);
        }
    }

    /// `tenant`'s slot (given now if it has none).
    pub(crate) fn tenant_slot(&mut self, tenant: &ids::TenantId) -> TenantSlot {
        self.tenants.slot(tenant)
    }

    /// The tenants' slots and the CPU fairness mode and weights.
    pub(crate) fn tenants(&mut self) -> &mut TenantBook {
        &mut self.tenants
    }

    /// Sets (None: clears) `tenant`'s feature chain for `direction`.
    pub(crate) fn set_chain(
        &mut self,
        tenant: &ids::TenantId,
        direction: Direction,
        run: Option<ChainRun>,
    ) {
        self.chains.set(tenant, direction, run);
    }

    /// The current VNets and tunnel bindings.
    pub(crate) fn overlay(&self) -> &Arc<Overlay> {
        &self.overlay
    }

    /// Replaces the steer nodes (relay mode).
    pub(crate) fn set_relays(&mut self, relays: Arc<Relays>) {
        self.relays = Some(relays);
    }

    /// The self-dispatch table now in use.
    pub(crate) fn dispatch(&self) -> Option<&Arc<Dispatch>> {
        self.dispatch.as_ref()
    }

    /// Replaces the self-dispatch table.
    pub(crate) fn set_dispatch(&mut self, dispatch: Arc<Dispatch>) {
        self.dispatch = Some(dispatch);
    }

    /// Replaces the VNets and tunnel bindings. Every CHILD_SA follows its tunnel's new
    /// binding; those of tunnels no longer bound are removed at once (they have nowhere to
    /// deliver). Returns how many CHILD_SAs changed their inside interface, and the removed
    /// ones (tunnel, inbound SPI).
    pub(crate) fn set_inside(&mut self, overlay: Arc<Overlay>) -> (usize, Vec<(TunnelId, EspSpi)>) {
        let mut removed = Vec::new();
        self.children.retain(|spi, i| {
            let bound = overlay.binding(i.child.tunnel).is_some();
            if !bound {
                removed.push((i.child.tunnel, *spi));
            }
            bound
        });
        // A tunnel no longer bound is gone, and its totals with it.
        self.retired.retain(|t, _| overlay.binding(*t).is_some());
        let mut rebound = 0;
        self.overlay = overlay;
        self.give_slots();
        for i in self.children.values_mut() {
            if let Some(b) = self.overlay.binding(i.child.tunnel) {
                let tenant = self.tenants.slot(&b.tenant);
                if b.inside != i.child.inside || tenant != i.child.tenant {
                    i.child = Arc::new(i.child.with_inside(b.inside.clone(), tenant));
                    rebound += 1;
                }
            }
        }
        (rebound, removed)
    }

    /// True if `spi` is installed.
    /// The live (not retired) CHILD_SAs, oldest first.
    pub(crate) fn installed(&self) -> Vec<InstalledChild> {
        let mut live: Vec<&Installed> = self
            .children
            .values()
            .filter(|i| i.retired_until.is_none())
            .collect();
        live.sort_by_key(|i| i.order);
        live.into_iter()
            .map(|i| InstalledChild {
                tunnel: i.child.tunnel,
                ike: i.child.ike,
                inbound_spi: i.child.inbound_spi,
                outbound_spi: i.child.outbound_spi,
                local: i.child.local,
                remote: i.child.remote,
                local_ts: i.child.local_ts.clone(),
                remote_ts: i.child.remote_ts.clone(),
                sending: i.active_out,
            })
            .collect()
    }

    pub(crate) fn contains(&self, spi: EspSpi) -> bool {
        self.children.contains_key(&spi)
    }

    /// Adds a CHILD_SA. With `outbound_active` it carries the tunnel's outbound traffic from now
    /// on and the `replaces` one stops; without, it only receives until the SA carrying outbound
    /// traffic is removed (unless the tunnel has none: then it sends at once).
    pub(crate) fn install(
        &mut self,
        child: Child,
        replaces: Option<EspSpi>,
        outbound_active: bool,
    ) {
        if outbound_active {
            if let Some(old) = replaces.and_then(|s| self.children.get_mut(&s)) {
                if old.child.tunnel == child.tunnel {
                    old.active_out = false;
                }
            }
        }
        let active_out = outbound_active
            || !self
                .children
                .values()
                .any(|i| i.child.tunnel == child.tunnel && i.active_out);
        if let Some(old) = self.children.get(&child.inbound_spi) {
            // A re-used SPI (after the old one's grace): the old entry goes for good.
            debug_assert!(old.retired_until.is_some(), "SPI installed twice");
            let old = Arc::clone(&old.child);
            self.keep_counts(&old);
        }
        let order = self.next_order;
        self.next_order += 1;
        self.children.insert(
            child.inbound_spi,
            Installed {
                child: Arc::new(child),
                order,
                active_out,
                retired_until: None,
            },
        );
    }

    /// Retires a CHILD_SA: it stops carrying outbound traffic at once but keeps opening
    /// inbound packets until `until` (packets the peer sent before it processed the DELETE may
    /// still be in flight; strongSwan keeps a rekeyed inbound SA 5 s for the same reason). If
    /// its tunnel is left without an outbound SA, the newest remaining live one of the tunnel
    /// carries outbound traffic again. Returns false if it was not installed (or is retired).
    pub(crate) fn retire(&mut self, tunnel: TunnelId, inbound_spi: EspSpi, until: Instant) -> bool {
        match self.children.get_mut(&inbound_spi) {
            Some(i) if i.child.tunnel == tunnel && i.retired_until.is_none() => {
                i.active_out = false;
                i.retired_until = Some(until);
            }
            _ => return false,
        }
        let live = |i: &Installed| i.child.tunnel == tunnel && i.retired_until.is_none();
        if !self.children.values().any(|i| live(i) && i.active_out) {
            if let Some(newest) = self
                .children
                .values_mut()
                .filter(|i| live(i))
                .max_by_key(|i| i.order)
            {
                newest.active_out = true;
            }
        }
        true
    }

    /// Removes the retired CHILD_SAs whose grace ended by `now`; returns them (tunnel, SPI).
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<(TunnelId, EspSpi)> {
        let gone: Vec<(TunnelId, EspSpi)> = self
            .children
            .iter()
            .filter(|(_, i)| i.retired_until.is_some_and(|t| t <= now))
            .map(|(spi, i)| (i.child.tunnel, *spi))
            .collect();
        for (_, spi) in &gone {
            if let Some(i) = self.children.remove(spi) {
                self.keep_counts(&i.child);
            }
        }
        gone
    }

    /// Moves the CHILD_SAs of `tunnel` negotiated by `ike` (all of the tunnel's if none was) to
    /// new outer addresses; `sock` is the NAT-T socket on `local`. Returns how many moved.
    pub(crate) fn update_peer(
        &mut self,
        tunnel: TunnelId,
        ike: IkeSpis,
        local: SocketAddr,
        remote: SocketAddr,
        sock: usize,
    ) -> usize {
        let any_of_ike = self
            .children
            .values()
            .any(|i| i.child.tunnel == tunnel && i.child.ike == ike);
        let mut moved = 0;
        for i in self.children.values_mut() {
            if i.child.tunnel == tunnel && (!any_of_ike || i.child.ike == ike) {
                i.child = Arc::new(i.child.with_addrs(local, remote, sock));
                moved += 1;
            }
        }
        moved
    }

    /// Builds the snapshot.
    pub(crate) fn snapshot(&self) -> Tables {
        let mut by_spi = SpiMap::default();
        by_spi.reserve(self.children.len());
        let mut active: Vec<&Installed> = Vec::new();
        for (spi, i) in &self.children {
            by_spi.insert(*spi, Arc::clone(&i.child));
            if i.active_out {
                active.push(i);
            }
        }
        active.sort_by_key(|i| std::cmp::Reverse(i.order));
        let mut vnet_out = vec![Vec::new(); self.overlay.vnets.len()];
        let mut tun_out = Vec::new();
        for i in active {
            match i.child.inside {
                Inside::Vnet(v) => {
                    if let Some(list) = vnet_out.get_mut(v) {
                        list.push(Arc::clone(&i.child));
                    }
                }
                Inside::Tun => tun_out.push(Arc::clone(&i.child)),
            }
        }
        // The outbound choice's index is built here, once per published snapshot.
        let index = |children: Vec<Arc<Child>>| {
            let n = children.len();
            let set = OutboundSet::new(children);
            if n > LINEAR_MAX && !set.is_indexed() {
                tracing::debug!(
                    children = n,
                    "outbound selectors too nested to index; scanning them"
                );
            }
            set
        };
        Tables {
            by_spi,
            vnet_out: vnet_out.into_iter().map(index).collect(),
            tun_out: index(tun_out),
            overlay: Arc::clone(&self.overlay),
            relays: self.relays.clone(),
            dispatch: self.dispatch.clone(),
            features: self.chains.table(
                self.overlay.vnets.iter().map(|v| v.tenant.as_str()),
                self.overlay
                    .tunnels
                    .iter()
                    .map(|b| (b.tunnel, b.tenant.as_str(), b.inside == Inside::Tun)),
            ),
            attach: AttachView::default(),
            tenants: Arc::new(
                self.tenants
                    .table(self.overlay.vnets.iter().map(|v| &v.tenant)),
            ),
        }
    }

    /// Adds the final counters of a CHILD_SA that leaves to its tunnel's retired totals.
    fn keep_counts(&mut self, child: &Child) {
        self.retired
            .entry(child.tunnel)
            .or_default()
            .add(TunnelTraffic::from(&child.stats()));
    }

    /// What the counters are read from: every installed CHILD_SA and the totals of the gone
    /// ones. Cheap (reference counts), so that the registry's lock is held only this long;
    /// [`Counters`] reads the counters after it is released.
    pub(crate) fn counters(&self) -> Counters {
        Counters {
            children: self
                .children
                .values()
                .map(|i| Arc::clone(&i.child))
                .collect(),
            retired: self.retired.iter().map(|(t, v)| (*t, *v)).collect(),
        }
    }

    /// Counters of every CHILD_SA, ordered by tunnel and inbound SPI.
    #[cfg(test)]
    pub(crate) fn stats(&self) -> Vec<ChildStats> {
        self.counters().children()
    }
}

/// The CHILD_SAs and retired totals [`Registry::counters`] took, read without the lock.
pub(crate) struct Counters {
    children: Vec<Arc<Child>>,
    retired: Vec<(TunnelId, TunnelTraffic)>,
}

impl Counters {
    /// Counters of every CHILD_SA, ordered by tunnel and inbound SPI.
    pub(crate) fn children(&self) -> Vec<ChildStats> {
        let mut v: Vec<ChildStats> = self.children.iter().map(|c| c.stats()).collect();
        v.sort_by_key(|s| (s.tunnel, s.inbound_spi));
        v
    }

    /// Per tunnel, the traffic of its live and gone CHILD_SAs since the data plane started (or
    /// the tunnel was bound), ordered by tunnel; `children` are [`Counters::children`].
    pub(crate) fn tunnels(&self, children: &[ChildStats]) -> Vec<(TunnelId, TunnelTraffic)> {
        let mut totals: BTreeMap<TunnelId, TunnelTraffic> = self.retired.iter().copied().collect();
        for c in children {
            if let Some(t) = c.tunnel {
                totals.entry(t).or_default().add(TunnelTraffic::from(c));
            }
        }
        totals.into_iter().collect()
    }
}

/// The published snapshot, swapped whole by the control plane.
#[derive(Default)]
pub(crate) struct Published(RwLock<Arc<Tables>>);

impl Published {
    /// The current snapshot (one read lock and one reference count per call: once per batch).
    pub(crate) fn load(&self) -> Arc<Tables> {
        Arc::clone(&self.0.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces the snapshot.
    pub(crate) fn store(&self, t: Tables) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(t);
    }
}
