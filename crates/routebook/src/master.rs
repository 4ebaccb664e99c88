//! The control node's master table of per-VM routes (docs/architecture.md, "Per-VM routes in
//! the cluster"): one copy, the source the data nodes follow. Every applied change is numbered
//! ([`RouteVersion`]); the single changes since the last snapshot (or bulk change) are kept,
//! so that a data node a few changes behind is brought along by replaying them, and any other
//! fetches the snapshot.

use datapath::{DataplaneError, RouteChange, RouteChangeReport, RouteStats};
use ids::TenantId;
use overlay::VnetId;

use crate::book::{Apply, Op, RouteBook, RouteVnet, Routes};

/// The version of a route table: `epoch` names the master's history (a new one when the master
/// starts from its store), `seq` counts the changes applied in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteVersion {
    /// The master's history.
    pub epoch: u64,
    /// Changes applied in that history.
    pub seq: u64,
}

impl std::fmt::Display for RouteVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.epoch, self.seq)
    }
}

/// How a table at some version catches up with the master ([`RouteMaster::replay`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Replay<'a> {
    /// It is current.
    Current,
    /// Apply these single changes, in order (numbered `seq`, the first one past the table's).
    Changes(Vec<&'a (u64, RouteChange)>),
    /// It must fetch the snapshot: another epoch, older than the changes kept, or ahead of the
    /// master (a master that crashed after telling the nodes a change, before storing it).
    Fetch,
}

/// Single changes kept for replay by default (a node further behind fetches the snapshot).
pub const KEEP_CHANGES: usize = 100_000;

/// The single-copy master table: the book of VNets, the routes, the version, and the single
/// changes since the last snapshot or bulk change (at most a limit, the oldest dropped first).
pub struct RouteMaster {
    book: RouteBook,
    routes: Routes,
    version: RouteVersion,
    /// The seq of the last snapshot written or bulk change applied: `since[i]` is change
    /// `base + 1 + i`.
    base: u64,
    since: std::collections::VecDeque<(u64, RouteChange)>,
    /// The most single changes kept.
    keep: usize,
}

impl RouteMaster {
    /// An empty table at version `{epoch, 0}`.
    pub fn new(epoch: u64) -> Self {
        Self {
            book: RouteBook::new(),
            routes: Routes::default(),
            version: RouteVersion { epoch, seq: 0 },
            base: 0,
            since: std::collections::VecDeque::new(),
            keep: KEEP_CHANGES,
        }
    }

    /// Keeps at most `changes` single changes for replay ([`KEEP_CHANGES`] by default).
    pub fn with_replay_limit(mut self, changes: usize) -> Self {
        self.keep = changes;
        self.trim();
        self
    }

    /// Drops the oldest changes kept beyond the limit.
    fn trim(&mut self) {
        while self.since.len() > self.keep {
            self.since.pop_front();
            self.base += 1;
        }
    }

    /// The version of the table.
    pub fn version(&self) -> RouteVersion {
        self.version
    }

    /// Renumbers the table as version `at` (a master restored from a store that recorded its
    /// version: its nodes' versions keep meaning the same table). The changes kept for replay
    /// are dropped.
    pub fn set_version(&mut self, at: RouteVersion) {
        self.version = at;
        self.base = at.seq;
        self.since.clear();
    }

    /// The book of VNets.
    pub fn book(&self) -> &RouteBook {
        &self.book
    }

    /// The routes (one copy).
    pub fn routes(&self) -> &Routes {
        &self.routes
    }

    /// The number of VNet (`tenant`, `name`), given on first sight (as the data nodes do:
    /// numbers are local, snapshots and changes name VNets).
    pub fn vnet_id(&mut self, tenant: &TenantId, name: &str) -> VnetId {
        self.book.vnet_id(tenant, name)
    }

    /// The configured VNets changed: VNets gone (or whose VTEP changed address family) lose
    /// their entries. A change that drops entries is numbered as a bulk change (the changes
    /// kept for replay go), and returns true: a data node's table at the version before, or a
    /// snapshot of it still on its way to a node, holds the entries, so one version must not
    /// name both tables; the nodes are told to fetch. A change that drops none keeps the
    /// version (every data node applies the same configuration itself).
    pub fn set_vnets(&mut self, vnets: Vec<RouteVnet>) -> bool {
        let mut dropped = false;
        for op in self.book.set_vnets(vnets) {
            if let Op::RemoveVnet(id) = op {
                dropped |= self.routes.count(id) != [0, 0];
            }
            self.routes.apply(&op);
        }
        if dropped {
            self.version.seq += 1;
            self.base = self.version.seq;
            self.since.clear();
        }
        dropped
    }

    /// The configured VNets changed, given as the data nodes get them (`DataConfig`'s VNets,
    /// in configuration order, so that snapshots list them in the data nodes' order): numbers
    /// them, checks each VNI (`vnets[i].vni`, nothing changes on an error), then
    /// [`Self::set_vnets`] (returning what it returns: true when entries were dropped under a
    /// new version).
    pub fn set_vnet_configs(
        &mut self,
        vnets: &[datapath::VnetConfig],
    ) -> Result<bool, DataplaneError> {
        let mut checked = Vec::with_capacity(vnets.len());
        for (i, v) in vnets.iter().enumerate() {
            let vni = overlay::Vni::new(v.vni).ok_or_else(|| DataplaneError::Config {
                field: format!("vnets[{i}].vni"),
                reason: format!("{} does not fit in 24 bits", v.vni),
            })?;
            checked.push((v, vni));
        }
        let vnets = checked
            .into_iter()
            .map(|(v, vni)| RouteVnet {
                tenant: v.tenant.clone(),
                name: v.name.clone(),
                id: self.book.vnet_id(&v.tenant, &v.name),
                vni,
                vtep_v6: v.vtep.is_ipv6(),
            })
            .collect();
        Ok(self.set_vnets(vnets))
    }

    /// Applies `change`, validated whole first as a data node validates it (the same errors,
    /// naming line and field). A single change that applies is numbered and kept for replay;
    /// a bulk change (`Load`, `Restore`) that changed the table is numbered (even when it
    /// also fails: some entries were inserted) and drops the changes kept, since a node behind
    /// it must fetch the snapshot. A refused change is not numbered.
    pub fn change(
        &mut self,
        change: RouteChange,
    ) -> Result<(RouteVersion, RouteChangeReport), DataplaneError> {
        let bulk = matches!(
            change,
            RouteChange::Load(_) | RouteChange::Restore(_) | RouteChange::Replace(_)
        );
        if bulk {
            let before = self.routes.applied();
            let result = self.book.change(change, &mut self.routes);
            if self.routes.applied() != before {
                self.version.seq += 1;
                self.base = self.version.seq;
                self.since.clear();
            }
            return result.map(|r| (self.version, r));
        }
        let report = self.book.change(change.clone(), &mut self.routes)?;
        self.version.seq += 1;
        self.since.push_back((self.version.seq, change));
        self.trim();
        Ok((self.version, report))
    }

    /// How a table at version `at` catches up (see [`Replay`]).
    pub fn replay(&self, at: RouteVersion) -> Replay<'_> {
        if at == self.version {
            return Replay::Current;
        }
        if at.epoch != self.version.epoch || at.seq < self.base || at.seq > self.version.seq {
            return Replay::Fetch;
        }
        let from = (at.seq - self.base) as usize;
        if from > self.since.len() {
            return Replay::Fetch;
        }
        Replay::Changes(self.since.range(from..).collect())
    }

    /// Writes the snapshot of the table (`overlay::snapshot`, byte for byte what a data node
    /// holding the same table writes); returns its version and the entries written. The
    /// changes kept for replay are dropped: a node behind this version fetches it.
    pub fn write_snapshot(
        &mut self,
        out: &mut dyn std::io::Write,
    ) -> Result<(RouteVersion, usize), DataplaneError> {
        let n = self.book.write_snapshot(&self.routes, out)?;
        self.base = self.version.seq;
        self.since.clear();
        Ok((self.version, n))
    }

    /// Writes the snapshot as [`Self::write_snapshot`] does, keeping the changes for replay.
    pub fn peek_snapshot(&self, out: &mut dyn std::io::Write) -> Result<usize, DataplaneError> {
        self.book.write_snapshot(&self.routes, out)
    }

    /// Single changes kept for replay.
    pub fn kept(&self) -> usize {
        self.since.len()
    }

    /// Entries per configured VNet, hosts, memory (one copy).
    pub fn stats(&self) -> RouteStats {
        self.book.stats(&self.routes, 1)
    }

    /// Limits the entries of the table (inserts past it fail, as a data node's do when it
    /// runs out of room); None: no limit but memory. Not a numbered change.
    pub fn limit(&mut self, max: Option<usize>) {
        Apply::apply(&mut self.routes, Op::Limit(max));
    }
}

#[cfg(test)]
mod tests;
