//! The per-VM overlay routes (issue 16 §2): the exact-match table (VNet, VM address) -> host
//! VTEP of the `overlay` crate, beside each VNet's prefix routes (an exact entry wins), and
//! its publication to the workers while they forward.
//!
//! Publication is left-right (the `left-right` crate): two copies of [`Routes`]. Workers read
//! one copy, entered once per batch ([`RouteReader::enter`]: an epoch counter of their own,
//! no lock, no shared cache line written). The writer ([`RouteWriter`], one, behind a mutex in
//! `Shared`) applies a change to the other copy, swaps the pointer readers load, waits until
//! every worker that was inside the old copy has finished its batch, then replays the change
//! on it. A batch therefore sees the table before a change or after it, never a part of it;
//! a change is visible to every batch that starts after the swap (so a moved VM's next packet
//! goes to its new host); and a packet is never looked up in a copy being changed. Memory is
//! twice the table (2 × 15 bytes per IPv4 entry at the table's reserved load factor).
//!
//! A bulk load is one operation over the route file's text: the writer parses and resolves
//! the whole file first (a bad line changes nothing), then the operation inserts the entries
//! into one copy and is published; the other copy, once readers left it, becomes a memory
//! copy of the new one (a second publish, right away, so that the next single change does
//! not wait for it). Single changes are replayed, as left-right does.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use datapath::{DataplaneError, RouteChange, RouteChangeReport, RouteStats, VnetRouteStats};
use ids::TenantId;
use left_right::{Absorb, ReadGuard, ReadHandle, ReadHandleFactory, WriteHandle};
#[cfg(test)]
use overlay::Family;
use overlay::{Key, OverlayError, OverlayTable, Value, VnetId, Vni};
use rustc_hash::FxHashMap;

/// One copy of the per-VM routes: the table and, per VNet, its entries by host (the hosts of
/// a VNet's entries are accepted as VXLAN senders in it, as the hosts of its prefix routes
/// are) and its entry counts.
#[derive(Clone, Default)]
pub(crate) struct Routes {
    table: OverlayTable,
    /// Entries of each (VNet, host) pair.
    hosts: FxHashMap<(VnetId, IpAddr), u32>,
    /// IPv4 and IPv6 entries of each VNet.
    counts: FxHashMap<VnetId, [usize; 2]>,
    /// Entries the last operation applied to this copy could not insert, and the first
    /// reason (the writer reads it after publishing, to report the change as failed).
    failed: Option<(usize, OverlayError)>,
}

/// Where the entries of a bulk operation come from: read twice, once per copy.
pub(crate) trait Source: Send + Sync {
    /// Entries expected (IPv4, IPv6), to reserve room.
    fn size(&self) -> (usize, usize);
    /// Calls `f` with every entry.
    fn each(&self, f: &mut dyn FnMut(Key, IpAddr));
}

/// A change of both copies, applied to one and later replayed on the other.
pub(crate) enum Op {
    /// Gives a VNet its VNI (it may then have entries).
    SetVnet(VnetId, Vni),
    /// Removes a VNet and its entries.
    RemoveVnet(VnetId),
    /// Adds or replaces an entry.
    Insert(Key, IpAddr),
    /// Removes an entry.
    Remove(Key),
    /// Adds or replaces many entries.
    Bulk(Arc<dyn Source>),
    /// Limits the entries of the table (tests: makes inserts fail).
    #[cfg(test)]
    Limit(Option<usize>),
}

impl Routes {
    /// The host of `dst` in VNet `vnet` by its exact entry.
    #[inline]
    pub(crate) fn exact(&self, vnet: VnetId, dst: IpAddr) -> Option<IpAddr> {
        if self.table.is_empty() {
            return None;
        }
        self.table.get(&Key::new(vnet, dst)).map(|v| v.host)
    }

    /// True if there are no per-VM entries (the lookup stage then asks the prefixes only).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Looks up every key of `keys` (at most `overlay::BATCH` per prefetched group), writing
    /// to `out`; nothing when the table is empty.
    pub(crate) fn exact_batch(&self, keys: &[Key], out: &mut [Option<Value>]) {
        if self.table.is_empty() {
            out.fill(None);
            return;
        }
        if self.table.get_batch(keys, out).is_err() {
            out.fill(None);
        }
    }

    /// True if some entry of VNet `vnet` points at `host`.
    pub(crate) fn has_host(&self, vnet: VnetId, host: IpAddr) -> bool {
        !self.hosts.is_empty() && self.hosts.contains_key(&(vnet, host))
    }

    /// Entries of `vnet`, (IPv4, IPv6).
    fn count(&self, vnet: VnetId) -> [usize; 2] {
        self.counts.get(&vnet).copied().unwrap_or_default()
    }

    fn insert(&mut self, key: Key, host: IpAddr) {
        match self.table.insert(key, host) {
            Ok(old) => {
                match old {
                    Some(old) => self.unref(key.vnet, old.host),
                    None => self.counts.entry(key.vnet).or_default()[family(key.addr)] += 1,
                }
                *self.hosts.entry((key.vnet, host)).or_default() += 1;
            }
            // The writer checked the entry; only the table's room can fail here.
            Err(e) => match &mut self.failed {
                Some((n, _)) => *n += 1,
                None => self.failed = Some((1, e)),
            },
        }
    }

    fn remove(&mut self, key: &Key) {
        if let Some(old) = self.table.remove(key) {
            self.unref(key.vnet, old.host);
            if let Some(c) = self.counts.get_mut(&key.vnet) {
                c[family(key.addr)] = c[family(key.addr)].saturating_sub(1);
            }
        }
    }

    fn unref(&mut self, vnet: VnetId, host: IpAddr) {
        if let Some(n) = self.hosts.get_mut(&(vnet, host)) {
            *n -= 1;
            if *n == 0 {
                self.hosts.remove(&(vnet, host));
            }
        }
    }

    fn apply(&mut self, op: &Op) {
        self.failed = None;
        match op {
            Op::SetVnet(vnet, vni) => {
                if let Err(e) = self.table.set_vnet(*vnet, *vni) {
                    tracing::error!(%vnet, error = %e, "overlay VNet not set");
                }
            }
            Op::RemoveVnet(vnet) => {
                self.table.remove_vnet(*vnet);
                self.hosts.retain(|(v, _), _| v != vnet);
                self.counts.remove(vnet);
            }
            Op::Insert(key, host) => self.insert(*key, *host),
            Op::Remove(key) => self.remove(key),
            Op::Bulk(source) => {
                let (v4, v6) = source.size();
                if let Err(e) = self.table.reserve(v4, v6) {
                    tracing::warn!(error = %e, "no room reserved for a bulk load; the table grows as it goes");
                }
                source.each(&mut |key, host| self.insert(key, host));
            }
            #[cfg(test)]
            Op::Limit(max) => self.table.set_max_entries(*max),
        }
    }
}

fn family(a: IpAddr) -> usize {
    usize::from(a.is_ipv6())
}

impl Absorb<Op> for Routes {
    fn absorb_first(&mut self, op: &mut Op, _other: &Self) {
        self.apply(op);
    }

    /// A bulk change is not replayed but copied: `other` holds it and every change before it,
    /// and a copy of the table is a memory copy where a replay parses and inserts again. The
    /// writer publishes a bulk change alone (nothing appended with it, published at once:
    /// [`RouteWriter::append_bulk`]), so `other` holds nothing after it either; were a change
    /// published with it, `other` would hold that one too and it would be replayed on top,
    /// which every other operation allows (each is idempotent).
    fn absorb_second(&mut self, op: Op, other: &Self) {
        match op {
            Op::Bulk(_) => {
                // Free this copy first: three copies of a large table at once are not needed.
                *self = Routes::default();
                *self = other.clone();
            }
            op => self.apply(&op),
        }
    }

    fn sync_with(&mut self, first: &Self) {
        self.clone_from(first);
    }
}

/// A worker's handle on the published routes.
pub(crate) struct RouteReader(ReadHandle<Routes>);

/// The routes a batch reads: valid until dropped (drop it when the batch is done, or the
/// writer waits).
pub(crate) type RouteGuard<'a> = ReadGuard<'a, Routes>;

/// An empty table, for the (never expected) case that the writer is gone.
static EMPTY: std::sync::LazyLock<Routes> = std::sync::LazyLock::new(Routes::default);

impl RouteReader {
    /// Enters the current copy for one batch.
    pub(crate) fn enter(&self) -> Option<RouteGuard<'_>> {
        self.0.enter()
    }

    /// The empty table (a reader whose writer is gone reads this).
    pub(crate) fn empty() -> &'static Routes {
        &EMPTY
    }
}

/// Makes [`RouteReader`]s (shared by the threads), and holds the statistics of the last
/// publication.
pub(crate) struct RouteReaders {
    factory: ReadHandleFactory<Routes>,
    stats: Arc<Mutex<Arc<RouteStats>>>,
}

impl RouteReaders {
    /// A reader for one worker thread.
    pub(crate) fn reader(&self) -> RouteReader {
        RouteReader(self.factory.handle())
    }

    /// Entries per configured VNet, hosts and memory, as of the last change (never waits for
    /// one in progress, a bulk load included: the lock is held only to swap an `Arc`).
    pub(crate) fn stats(&self) -> Arc<RouteStats> {
        Arc::clone(&self.stats.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The one writer of the routes: the VNets' numbers and the changes.
pub(crate) struct RouteWriter {
    w: WriteHandle<Routes, Op>,
    /// The number of every (tenant, VNet name) seen, kept for the process's life.
    ids: HashMap<(TenantId, String), VnetId>,
    /// The configured VNets, in configuration order.
    vnets: Vec<RouteVnet>,
    /// Where the statistics are left after each publication, for [`RouteReaders::stats`].
    stats: Arc<Mutex<Arc<RouteStats>>>,
}

/// A configured VNet as the per-VM routes see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteVnet {
    /// Its tenant.
    pub(crate) tenant: TenantId,
    /// Its name.
    pub(crate) name: String,
    /// Its number in the table.
    pub(crate) id: VnetId,
    /// Its VNI.
    pub(crate) vni: Vni,
    /// Its VTEP is IPv6 (its hosts must be too: VXLAN leaves from the VTEP's socket).
    pub(crate) vtep_v6: bool,
}

/// The configured VNets by tenant and name, for resolving route files: a map, as a file's
/// every line is looked up (no allocation per lookup).
#[derive(Clone)]
struct Names(FxHashMap<String, FxHashMap<String, RouteVnet>>);

impl Names {
    fn new(vnets: &[RouteVnet]) -> Self {
        let mut m: FxHashMap<String, FxHashMap<String, RouteVnet>> = FxHashMap::default();
        for v in vnets {
            m.entry(v.tenant.as_str().to_owned())
                .or_default()
                .insert(v.name.clone(), v.clone());
        }
        Self(m)
    }

    fn find(&self, tenant: &str, vnet: &str) -> Option<&RouteVnet> {
        self.0.get(tenant)?.get(vnet)
    }

    fn get(&self, tenant: &str, vnet: &str) -> Option<VnetId> {
        self.find(tenant, vnet).map(|v| v.id)
    }
}

/// A route file's entries, resolved to VNet numbers (the file's text, parsed on each read:
/// no list of parsed entries is held).
struct FileSource {
    text: Arc<str>,
    vnets: Names,
    size: (usize, usize),
}

impl Source for FileSource {
    fn size(&self) -> (usize, usize) {
        self.size
    }

    fn each(&self, f: &mut dyn FnMut(Key, IpAddr)) {
        let lookup = |t: &str, v: &str| self.vnets.get(t, v);
        for (key, host) in overlay::resolve_routes(&self.text, lookup).flatten() {
            f(key, host);
        }
    }
}

/// A snapshot's entries of the VNets still configured (read again on each pass: no list of
/// entries is held).
struct SnapshotSource {
    bytes: Arc<[u8]>,
    /// The number of each of the snapshot's VNets and whether its VTEP is IPv6, None for one
    /// no longer configured.
    ids: Vec<Option<(VnetId, bool)>>,
    size: (usize, usize),
}

impl SnapshotSource {
    /// Calls `f` with each usable entry, and `skip` for each other one.
    fn scan(&self, f: &mut dyn FnMut(Key, IpAddr), skip: &mut dyn FnMut()) {
        let Ok(snap) = overlay::read_snapshot(&self.bytes) else {
            return;
        };
        for (vnet, addr, host) in snap.entries().flatten() {
            match self.ids.get(vnet as usize).copied().flatten() {
                Some((id, v6)) if unicast(addr) && unicast(host) && host.is_ipv6() == v6 => {
                    f(Key::new(id, addr), host)
                }
                _ => skip(),
            }
        }
    }
}

impl Source for SnapshotSource {
    fn size(&self) -> (usize, usize) {
        self.size
    }

    fn each(&self, f: &mut dyn FnMut(Key, IpAddr)) {
        self.scan(f, &mut || {});
    }
}

fn route_err(line: Option<usize>, field: Option<&'static str>, reason: String) -> DataplaneError {
    DataplaneError::Route {
        line,
        field,
        reason,
    }
}

impl RouteWriter {
    /// An empty table, its writer and the factory of its readers.
    pub(crate) fn new() -> (Self, RouteReaders) {
        let (mut w, r) = left_right::new_from_empty::<Routes, Op>(Routes::default());
        // Out of `left-right`'s first mode, which applies an appended operation to the write
        // copy with `absorb_second` and would turn a bulk change into a copy of the empty
        // other one.
        w.publish();
        let stats = Arc::new(Mutex::new(Arc::new(RouteStats::default())));
        let readers = RouteReaders {
            factory: r.factory(),
            stats: Arc::clone(&stats),
        };
        (
            Self {
                w,
                ids: HashMap::new(),
                vnets: Vec::new(),
                stats,
            },
            readers,
        )
    }

    /// The number of VNet (`tenant`, `name`), given on first sight.
    pub(crate) fn vnet_id(&mut self, tenant: &TenantId, name: &str) -> VnetId {
        let next = VnetId(self.ids.len() as u32);
        *self
            .ids
            .entry((tenant.clone(), name.to_owned()))
            .or_insert(next)
    }

    /// The number VNet (`tenant`, `name`) has or would get, without giving it one.
    pub(crate) fn peek_id(&self, tenant: &TenantId, name: &str) -> VnetId {
        self.ids
            .get(&(tenant.clone(), name.to_owned()))
            .copied()
            .unwrap_or(VnetId(self.ids.len() as u32))
    }

    /// The configured VNets changed (in configuration order, with their numbers and VNIs):
    /// VNets no longer configured lose their entries, as do those whose VTEP changed address
    /// family; the others get their VNIs.
    pub(crate) fn set_vnets(&mut self, vnets: Vec<RouteVnet>) {
        for old in &self.vnets {
            // Gone, or its VTEP changed address family: its entries' hosts can no longer be
            // reached from its socket (an entry's host is of its VTEP's family), so they go.
            if !vnets
                .iter()
                .any(|v| v.id == old.id && v.vtep_v6 == old.vtep_v6)
            {
                self.w.append(Op::RemoveVnet(old.id));
            }
        }
        for v in &vnets {
            let same = self
                .vnets
                .iter()
                .any(|old| old.id == v.id && old.vni == v.vni && old.vtep_v6 == v.vtep_v6);
            if !same {
                self.w.append(Op::SetVnet(v.id, v.vni));
            }
        }
        self.vnets = vnets;
        self.publish();
    }

    /// Publishes what was appended, and replays it on the other copy at once so the next
    /// change finds both copies current.
    fn publish(&mut self) {
        self.w.publish();
        self.w.publish();
        self.leave_stats();
    }

    /// Leaves the statistics of the published copy for [`RouteReaders::stats`] (a scan of
    /// the configured VNets, the rest is counters).
    fn leave_stats(&self) {
        let stats = Arc::new(self.stats());
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner) = stats;
    }

    /// Appends a bulk change, alone: nothing may be pending with it, and the caller publishes
    /// it next (see `absorb_second`).
    fn append_bulk(&mut self, source: Arc<dyn Source>) {
        debug_assert!(
            !self.w.has_pending_operations(),
            "a bulk change is published alone"
        );
        self.w.append(Op::Bulk(source));
    }

    /// Publishes what was appended as [`Self::publish`] does, and returns what the change
    /// could not insert in either copy.
    fn publish_checked(&mut self) -> Option<(usize, OverlayError)> {
        // The first publication swaps in the copy that applied the change, the second the
        // copy that replayed it (or copied it, for a bulk change).
        self.w.publish();
        let first = self.read(|t| t.failed.clone());
        self.w.publish();
        let second = self.read(|t| t.failed.clone());
        self.leave_stats();
        first.or(second)
    }

    /// Entries limit of both copies (tests).
    #[cfg(test)]
    pub(crate) fn limit(&mut self, max: Option<usize>) {
        self.w.append(Op::Limit(max));
        self.publish();
    }

    /// A configured VNet.
    fn configured(&self, tenant: &str, vnet: &str) -> Option<&RouteVnet> {
        self.vnets
            .iter()
            .find(|v| v.tenant.as_str() == tenant && v.name == vnet)
    }

    fn configured_or_err(&self, tenant: &str, vnet: &str) -> Result<&RouteVnet, DataplaneError> {
        self.configured(tenant, vnet).ok_or_else(|| {
            route_err(
                None,
                Some("vnet"),
                format!("no VNet {vnet:?} of tenant {tenant:?} is configured"),
            )
        })
    }

    /// Applies `change` (validated whole first).
    pub(crate) fn change(
        &mut self,
        change: RouteChange,
    ) -> Result<RouteChangeReport, DataplaneError> {
        let mut report = RouteChangeReport::default();
        match change {
            RouteChange::Add(r) => {
                let v = self.configured_or_err(r.tenant.as_str(), &r.vnet)?;
                let vnet = v.id;
                for (field, a) in [("address", r.address), ("host", r.host)] {
                    if !unicast(a) {
                        return Err(route_err(
                            None,
                            Some(field),
                            format!("{a} is not a unicast address"),
                        ));
                    }
                }
                check_family(v, r.host).map_err(|reason| route_err(None, Some("host"), reason))?;
                let key = Key::new(vnet, r.address);
                let old = self.read(|t| t.exact(vnet, r.address));
                if old.is_some() {
                    report.replaced = 1;
                } else {
                    report.added = 1;
                }
                self.w.append(Op::Insert(key, r.host));
                if let Some((_, e)) = self.publish_checked() {
                    // A copy whose insert failed is unchanged: put the other one back too.
                    self.w.append(match old {
                        Some(host) => Op::Insert(key, host),
                        None => Op::Remove(key),
                    });
                    self.publish();
                    return Err(route_err(None, None, format!("entry not added: {e}")));
                }
                return Ok(report);
            }
            RouteChange::Del {
                tenant,
                vnet,
                address,
            } => {
                let vnet = self.configured_or_err(tenant.as_str(), &vnet)?.id;
                if self.read(|t| t.exact(vnet, address)).is_none() {
                    return Err(route_err(
                        None,
                        Some("address"),
                        format!("no entry for {address} in that VNet"),
                    ));
                }
                report.removed = 1;
                self.w.append(Op::Remove(Key::new(vnet, address)));
            }
            RouteChange::Load(text) => {
                let vnets = Names::new(&self.vnets);
                let (mut v4, mut v6) = (0, 0);
                for entry in overlay::parse_routes(&text) {
                    let r = entry.map_err(|e| {
                        route_err(
                            Some(e.line),
                            e.field.map(|f| f.name()),
                            e.problem.to_string(),
                        )
                    })?;
                    let Some(v) = vnets.find(&r.tenant, &r.vnet) else {
                        return Err(route_err(
                            Some(r.line),
                            Some("vnet"),
                            format!(
                                "no VNet {:?} of tenant {:?} is configured",
                                r.vnet, r.tenant
                            ),
                        ));
                    };
                    check_family(v, r.host)
                        .map_err(|reason| route_err(Some(r.line), Some("host"), reason))?;
                    if r.address.is_ipv6() {
                        v6 += 1;
                    } else {
                        v4 += 1;
                    }
                }
                // Added: the growth of the table; replaced: the other lines (a file naming
                // an address twice counts the second as replacing the first).
                let before = self.read(|t| t.table.len());
                self.append_bulk(Arc::new(FileSource {
                    text,
                    vnets,
                    size: (v4, v6),
                }));
                if let Some((n, e)) = self.publish_checked() {
                    return Err(route_err(
                        None,
                        None,
                        format!(
                            "{n} entries of the file not added ({e}); the others are in the table"
                        ),
                    ));
                }
                report.added = self.read(|t| t.table.len()).saturating_sub(before);
                report.replaced = (v4 + v6).saturating_sub(report.added);
                return Ok(report);
            }
            RouteChange::Restore(bytes) => {
                let snap = overlay::read_snapshot(&bytes)
                    .map_err(|e| route_err(None, None, e.to_string()))?;
                let ids: Vec<Option<(VnetId, bool)>> = snap
                    .vnets
                    .iter()
                    .map(|(t, v)| self.configured(t, v).map(|v| (v.id, v.vtep_v6)))
                    .collect();
                // Checked whole (structure, hash) above; read again into each copy.
                let mut source = SnapshotSource {
                    bytes: Arc::clone(&bytes),
                    ids,
                    size: (0, 0),
                };
                let (mut v4, mut v6, mut skipped) = (0, 0, 0);
                source.scan(
                    &mut |k, _| {
                        if k.addr.is_ipv6() {
                            v6 += 1;
                        } else {
                            v4 += 1;
                        }
                    },
                    &mut || skipped += 1,
                );
                source.size = (v4, v6);
                self.append_bulk(Arc::new(source));
                let failed = match self.publish_checked() {
                    Some((n, e)) => {
                        tracing::error!(entries = n, error = %e, "snapshot entries not restored");
                        n
                    }
                    None => 0,
                };
                report.added = (v4 + v6).saturating_sub(failed);
                report.skipped = skipped + failed;
                return Ok(report);
            }
        }
        self.publish();
        Ok(report)
    }

    /// Reads the published copy (the writer's own read handle).
    fn read<R>(&self, f: impl FnOnce(&Routes) -> R) -> R {
        match self.w.enter() {
            Some(g) => f(&g),
            None => f(RouteReader::empty()),
        }
    }

    /// Writes the compact snapshot of every entry of a configured VNet (see
    /// `overlay::snapshot`); returns the entries written.
    pub(crate) fn write_snapshot(
        &self,
        out: &mut dyn std::io::Write,
    ) -> Result<usize, DataplaneError> {
        let names: Vec<(&str, &str)> = self
            .vnets
            .iter()
            .map(|v| (v.tenant.as_str(), v.name.as_str()))
            .collect();
        let index: FxHashMap<VnetId, u32> = self
            .vnets
            .iter()
            .enumerate()
            .map(|(i, v)| (v.id, i as u32))
            .collect();
        self.read(|t| {
            let entries = t
                .table
                .iter()
                .filter_map(|(k, v)| Some((*index.get(&k.vnet)?, k.addr, v.host)));
            let count = t
                .table
                .iter()
                .filter(|(k, _)| index.contains_key(&k.vnet))
                .count();
            overlay::write_snapshot(out, &names, count, entries)
                .map_err(|e| route_err(None, None, format!("cannot write the route snapshot: {e}")))
        })
    }

    /// Entries per configured VNet, hosts and memory (both copies).
    pub(crate) fn stats(&self) -> RouteStats {
        self.read(|t| RouteStats {
            vnets: self
                .vnets
                .iter()
                .map(|v| {
                    let [v4, v6] = t.count(v.id);
                    VnetRouteStats {
                        tenant: v.tenant.as_str().to_owned(),
                        vnet: v.name.clone(),
                        v4,
                        v6,
                    }
                })
                .collect(),
            entries: t.table.len(),
            hosts: t.table.hosts(),
            memory_bytes: 2
                * (t.table.memory_bytes()
                    + t.hosts.capacity() * (std::mem::size_of::<((VnetId, IpAddr), u32)>() + 1)),
        })
    }

    /// Entries of `family` (tests).
    #[cfg(test)]
    pub(crate) fn len_of(&self, family: Family) -> usize {
        self.read(|t| t.table.len_of(family))
    }
}

/// Checks that `host` is of the address family of `vnet`'s VTEP, whose socket sends to it.
fn check_family(vnet: &RouteVnet, host: IpAddr) -> Result<(), String> {
    if host.is_ipv6() == vnet.vtep_v6 {
        return Ok(());
    }
    let family = if vnet.vtep_v6 { "IPv6" } else { "IPv4" };
    Err(format!(
        "host {host} is not of the address family of VNet {}/{}'s VTEP ({family})",
        vnet.tenant, vnet.name
    ))
}

/// Whether `a` can be a VM's or a host's unicast address (as the route file parser checks).
fn unicast(a: IpAddr) -> bool {
    !(a.is_unspecified() || a.is_multicast() || matches!(a, IpAddr::V4(v4) if v4.is_broadcast()))
}

#[cfg(test)]
mod tests;
