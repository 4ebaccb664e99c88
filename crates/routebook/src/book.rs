//! The pure part of the per-VM routes: one copy of the table ([`Routes`]), the operations that
//! change it ([`Op`]), and the book of VNets ([`RouteBook`]) that numbers them, validates a
//! [`RouteChange`] against them and applies it through an [`Apply`]: the data plane's two
//! published copies or the control node's one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use datapath::{DataplaneError, RouteChange, RouteChangeReport, RouteStats, VnetRouteStats};
use ids::TenantId;
use overlay::{Family, Key, OverlayError, OverlayTable, Value, VnetId, Vni};
use rustc_hash::FxHashMap;

/// One copy of the per-VM routes: the table and, per VNet, its entries by host (the hosts of
/// a VNet's entries are accepted as VXLAN senders in it, as the hosts of its prefix routes
/// are) and its entry counts.
#[derive(Clone, Default)]
pub struct Routes {
    table: OverlayTable,
    /// Entries of each (VNet, host) pair.
    hosts: FxHashMap<(VnetId, IpAddr), u32>,
    /// IPv4 and IPv6 entries of each VNet.
    counts: FxHashMap<VnetId, [usize; 2]>,
    /// Entries the last operation applied to this copy could not insert, and the first
    /// reason (read after applying, to report the change as failed).
    failed: Option<(usize, OverlayError)>,
    /// Operations applied to this copy since it was made.
    applied: u64,
    /// The limit of entries set ([`Op::Limit`]), kept across [`Op::Replace`].
    limit: Option<usize>,
}

/// Where the entries of a bulk operation come from: read once per copy it is applied to.
pub trait Source: Send + Sync {
    /// Entries expected (IPv4, IPv6), to reserve room.
    fn size(&self) -> (usize, usize);
    /// Calls `f` with every entry.
    fn each(&self, f: &mut dyn FnMut(Key, IpAddr));
}

/// A change of a copy of the routes. Every operation is idempotent: applied twice, it leaves
/// what it left once.
pub enum Op {
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
    /// Makes the table these entries: every entry removed, the configured VNets (number,
    /// VNI) kept, then the entries inserted.
    Replace(Arc<dyn Source>, Vec<(VnetId, Vni)>),
    /// Limits the entries of the table (tests: makes inserts fail); None: no limit.
    Limit(Option<usize>),
}

impl Op {
    /// True for [`Op::Bulk`] and [`Op::Replace`].
    pub fn is_bulk(&self) -> bool {
        matches!(self, Op::Bulk(_) | Op::Replace(..))
    }
}

impl Routes {
    /// The host of `dst` in VNet `vnet` by its exact entry.
    #[inline]
    pub fn exact(&self, vnet: VnetId, dst: IpAddr) -> Option<IpAddr> {
        if self.table.is_empty() {
            return None;
        }
        self.table.get(&Key::new(vnet, dst)).map(|v| v.host)
    }

    /// True if there are no per-VM entries (the lookup stage then asks the prefixes only).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Looks up every key of `keys` (at most `overlay::BATCH` per prefetched group), writing
    /// to `out`; nothing when the table is empty.
    #[inline]
    pub fn exact_batch(&self, keys: &[Key], out: &mut [Option<Value>]) {
        if self.table.is_empty() {
            out.fill(None);
            return;
        }
        if self.table.get_batch(keys, out).is_err() {
            out.fill(None);
        }
    }

    /// True if some entry of VNet `vnet` points at `host`.
    #[inline]
    pub fn has_host(&self, vnet: VnetId, host: IpAddr) -> bool {
        !self.hosts.is_empty() && self.hosts.contains_key(&(vnet, host))
    }

    /// Entries of `vnet`, (IPv4, IPv6).
    pub fn count(&self, vnet: VnetId) -> [usize; 2] {
        self.counts.get(&vnet).copied().unwrap_or_default()
    }

    /// Entries, all VNets.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Entries of `family`.
    pub fn len_of(&self, family: Family) -> usize {
        self.table.len_of(family)
    }

    /// What the last operation applied to this copy could not insert: how many entries and
    /// the first reason.
    pub fn failed(&self) -> Option<&(usize, OverlayError)> {
        self.failed.as_ref()
    }

    /// Operations applied to this copy since it was made (a change of it shows as a change of
    /// this count).
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Bytes of this copy: its table and its index of hosts.
    pub fn memory_bytes(&self) -> usize {
        self.table.memory_bytes()
            + self.hosts.capacity() * (std::mem::size_of::<((VnetId, IpAddr), u32)>() + 1)
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
            // The book checked the entry; only the table's room can fail here.
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

    /// Applies `op` to this copy; [`Self::failed`] says afterwards what it could not insert.
    pub fn apply(&mut self, op: &Op) {
        self.failed = None;
        self.applied += 1;
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
            Op::Replace(source, vnets) => {
                // The copy's old table goes first: three tables at once are not needed.
                self.table = OverlayTable::new();
                self.table.set_max_entries(self.limit);
                for (vnet, vni) in vnets {
                    if let Err(e) = self.table.set_vnet(*vnet, *vni) {
                        tracing::error!(%vnet, error = %e, "overlay VNet not set");
                    }
                }
                self.hosts.clear();
                self.counts.clear();
                self.apply_bulk(source.as_ref());
            }
            Op::Bulk(source) => self.apply_bulk(source.as_ref()),
            Op::Limit(max) => {
                self.limit = *max;
                self.table.set_max_entries(*max)
            }
        }
    }

    /// Inserts every entry of `source`.
    fn apply_bulk(&mut self, source: &dyn Source) {
        {
            {
                let (v4, v6) = source.size();
                if let Err(e) = self.table.reserve(v4, v6) {
                    tracing::warn!(error = %e, "no room reserved for a bulk load; the table grows as it goes");
                }
                source.each(&mut |key, host| self.insert(key, host));
            }
        }
    }
}

fn family(a: IpAddr) -> usize {
    usize::from(a.is_ipv6())
}

/// A configured VNet as the per-VM routes see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteVnet {
    /// Its tenant.
    pub tenant: TenantId,
    /// Its name.
    pub name: String,
    /// Its number in the table.
    pub id: VnetId,
    /// Its VNI.
    pub vni: Vni,
    /// Its VTEP is IPv6 (its hosts must be too: VXLAN leaves from the VTEP's socket).
    pub vtep_v6: bool,
}

/// Where a [`RouteBook`] applies the operations of a change: the data plane's two published
/// copies (it publishes each operation before the next) or the control node's one copy.
pub trait Apply {
    /// Calls `f` with the routes as they are now (the published copy).
    fn read<R>(&self, f: impl FnOnce(&Routes) -> R) -> R;
    /// Applies `op` (to every copy, published when this returns) and returns what it could
    /// not insert in any copy: how many entries and the first reason. A bulk operation is
    /// applied alone (nothing else pending with it).
    fn apply(&mut self, op: Op) -> Option<(usize, OverlayError)>;
}

/// One copy, applied in place: the control node's master table, and tests.
impl Apply for Routes {
    fn read<R>(&self, f: impl FnOnce(&Routes) -> R) -> R {
        f(self)
    }

    fn apply(&mut self, op: Op) -> Option<(usize, OverlayError)> {
        Routes::apply(self, &op);
        self.failed.clone()
    }
}

/// The configured VNets and the number of every VNet seen: what a route change is checked
/// against, and what names the snapshot's VNets.
#[derive(Debug, Clone, Default)]
pub struct RouteBook {
    /// The number of every (tenant, VNet name) seen, kept for the book's life.
    ids: HashMap<(TenantId, String), VnetId>,
    /// The configured VNets, in configuration order.
    vnets: Vec<RouteVnet>,
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

impl RouteBook {
    /// A book with no VNet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of VNet (`tenant`, `name`), given on first sight.
    pub fn vnet_id(&mut self, tenant: &TenantId, name: &str) -> VnetId {
        let next = VnetId(self.ids.len() as u32);
        *self
            .ids
            .entry((tenant.clone(), name.to_owned()))
            .or_insert(next)
    }

    /// The number VNet (`tenant`, `name`) has or would get, without giving it one.
    pub fn peek_id(&self, tenant: &TenantId, name: &str) -> VnetId {
        self.ids
            .get(&(tenant.clone(), name.to_owned()))
            .copied()
            .unwrap_or(VnetId(self.ids.len() as u32))
    }

    /// The configured VNets, in configuration order.
    pub fn vnets(&self) -> &[RouteVnet] {
        &self.vnets
    }

    /// The configured VNets changed (in configuration order, with their numbers and VNIs).
    /// Returns the operations that bring the routes along, to apply in order: VNets no longer
    /// configured lose their entries, as do those whose VTEP changed address family; the
    /// others get their VNIs.
    pub fn set_vnets(&mut self, vnets: Vec<RouteVnet>) -> Vec<Op> {
        let mut ops = Vec::new();
        for old in &self.vnets {
            // Gone, or its VTEP changed address family: its entries' hosts can no longer be
            // reached from its socket (an entry's host is of its VTEP's family), so they go.
            if !vnets
                .iter()
                .any(|v| v.id == old.id && v.vtep_v6 == old.vtep_v6)
            {
                ops.push(Op::RemoveVnet(old.id));
            }
        }
        for v in &vnets {
            let same = self
                .vnets
                .iter()
                .any(|old| old.id == v.id && old.vni == v.vni && old.vtep_v6 == v.vtep_v6);
            if !same {
                ops.push(Op::SetVnet(v.id, v.vni));
            }
        }
        self.vnets = vnets;
        ops
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

    /// Validates `change` whole against the configured VNets, then applies it through `to`
    /// (nothing is applied when it is refused). An `Add` whose insert fails is undone; a
    /// `Load` some of whose entries could not be inserted keeps the others and says how many
    /// failed; a `Restore` counts the entries it could not insert as skipped.
    pub fn change<A: Apply>(
        &self,
        change: RouteChange,
        to: &mut A,
    ) -> Result<RouteChangeReport, DataplaneError> {
        let mut report = RouteChangeReport::default();
        let replace = matches!(change, RouteChange::Replace(_));
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
                let old = to.read(|t| t.exact(vnet, r.address));
                if old.is_some() {
                    report.replaced = 1;
                } else {
                    report.added = 1;
                }
                if let Some((_, e)) = to.apply(Op::Insert(key, r.host)) {
                    // A copy whose insert failed is unchanged: put the other one back too.
                    to.apply(match old {
                        Some(host) => Op::Insert(key, host),
                        None => Op::Remove(key),
                    });
                    return Err(route_err(None, None, format!("entry not added: {e}")));
                }
                Ok(report)
            }
            RouteChange::Del {
                tenant,
                vnet,
                address,
            } => {
                let vnet = self.configured_or_err(tenant.as_str(), &vnet)?.id;
                if to.read(|t| t.exact(vnet, address)).is_none() {
                    return Err(route_err(
                        None,
                        Some("address"),
                        format!("no entry for {address} in that VNet"),
                    ));
                }
                report.removed = 1;
                to.apply(Op::Remove(Key::new(vnet, address)));
                Ok(report)
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
                let before = to.read(Routes::len);
                let failed = to.apply(Op::Bulk(Arc::new(FileSource {
                    text,
                    vnets,
                    size: (v4, v6),
                })));
                if let Some((n, e)) = failed {
                    return Err(route_err(
                        None,
                        None,
                        format!(
                            "{n} entries of the file not added ({e}); the others are in the table"
                        ),
                    ));
                }
                report.added = to.read(Routes::len).saturating_sub(before);
                report.replaced = (v4 + v6).saturating_sub(report.added);
                Ok(report)
            }
            RouteChange::Restore(bytes) | RouteChange::Replace(bytes) => {
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
                let op = if replace {
                    let vnets = self.vnets.iter().map(|v| (v.id, v.vni)).collect();
                    Op::Replace(Arc::new(source), vnets)
                } else {
                    Op::Bulk(Arc::new(source))
                };
                let failed = match to.apply(op) {
                    Some((n, e)) => {
                        tracing::error!(entries = n, error = %e, "snapshot entries not restored");
                        n
                    }
                    None => 0,
                };
                report.added = (v4 + v6).saturating_sub(failed);
                report.skipped = skipped + failed;
                Ok(report)
            }
        }
    }

    /// Writes the compact snapshot of every entry of `routes` in a configured VNet (see
    /// `overlay::snapshot`; the VNets by name, in configuration order, the entries in the
    /// table's order); returns the entries written.
    pub fn write_snapshot(
        &self,
        routes: &Routes,
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
        let entries = routes
            .table
            .iter()
            .filter_map(|(k, v)| Some((*index.get(&k.vnet)?, k.addr, v.host)));
        let count = routes
            .table
            .iter()
            .filter(|(k, _)| index.contains_key(&k.vnet))
            .count();
        overlay::write_snapshot(out, &names, count, entries)
            .map_err(|e| route_err(None, None, format!("cannot write the route snapshot: {e}")))
    }

    /// Entries per configured VNet, hosts, and the memory of `copies` copies of `routes`.
    pub fn stats(&self, routes: &Routes, copies: usize) -> RouteStats {
        RouteStats {
            vnets: self
                .vnets
                .iter()
                .map(|v| {
                    let [v4, v6] = routes.count(v.id);
                    VnetRouteStats {
                        tenant: v.tenant.as_str().to_owned(),
                        vnet: v.name.clone(),
                        v4,
                        v6,
                    }
                })
                .collect(),
            entries: routes.table.len(),
            hosts: routes.table.hosts(),
            memory_bytes: copies * routes.memory_bytes(),
        }
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
