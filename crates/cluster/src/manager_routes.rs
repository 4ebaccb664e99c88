//! The control node as the source of the data nodes' per-VM routes (issue 16 §2,
//! docs/architecture.md "Per-VM routes in the cluster"): the single-copy master table
//! ([`RouteMaster`]), each single change sent to every live data node (`route_changes`) and
//! answered once they applied it; a bulk change announced (`routes_changed`), the nodes then
//! fetching the snapshot (`FetchRoutes`). A node whose version is not the master's is behind:
//! the core does not choose it for new tunnels and attachments while a current node can be.
//!
//! The snapshot the route store writes through [`DataPath::write_routes`] starts with the
//! master's version (`PGRTVER1`, epoch, seq). A restored master does not take that version
//! back: it keeps the new epoch it started with, so the data nodes fetch the table once after
//! a control restart or takeover. Taking it back would let one version name two tables: the
//! store may lack a change the data nodes applied (a crash after the fan-out, before the
//! journal), and the restored master would then number its next change as the one they hold.
//!
//! Lock order: `routes`, then `state` (never the other way). The `routes` lock is held for
//! in-memory work only: a change applied to the master, a snapshot serialised (for a fetch or
//! the route store), never while waiting for a node's answer or writing to the store.
//! Serialising is the longest hold (0.73–0.96 s at 16 M entries, docs/performance.md "The
//! route snapshot in etcd"); a replay's answer is waited for on a thread of its own
//! ([`Ack::on_answer`]).

use super::{Cluster, Role, Shell};
use crate::link::{self, Answer, NodeLink};
use datapath::{DataplaneError, RouteChange, RouteChangeReport, RouteFanout, RouteStats};
use routebook::{Replay, RouteMaster, RouteVersion};
use rpc::pb;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tracing::{debug, info, warn};

/// The header of the snapshot the control node stores: magic, epoch, seq (big-endian).
const VERSION_MAGIC: &[u8; 8] = b"PGRTVER1";
const HEADER_LEN: usize = 24;

/// Reports a node may send at another version before it is told again to fetch.
pub(super) const PROMPT_AFTER_REPORTS: u32 = 3;

/// Chunks of the snapshot sent to a fetching data node, at most.
pub const CHUNK_LEN: usize = 1 << 20;

/// The master table and what the control node knows of each data node's copy.
pub(super) struct RouteSync {
    master: RouteMaster,
    /// By data node id.
    nodes: HashMap<u32, NodeRoutes>,
    /// The snapshot being served, while the table has not changed and a fetch or a store
    /// write still holds it (nodes fetching together share one; none is kept once they are
    /// done): its version, entries and bytes.
    cached: Option<(RouteVersion, usize, std::sync::Weak<[u8]>)>,
}

/// A data node's copy as control sees it.
#[derive(Debug, Clone, Copy, Default)]
struct NodeRoutes {
    /// It holds the master's table (applied every change sent since).
    current: bool,
    /// Consecutive reports that count against it: while not current, every report at another
    /// version; while current, a report at another version that is not past its last one.
    reports: u32,
    /// The version of its last report.
    last: Option<RouteVersion>,
    /// Bumped at every Hello and every prompt to fetch: the answer to a replay sent in an
    /// earlier turn changes nothing.
    turn: u64,
}

impl RouteSync {
    /// An empty master table in a new epoch.
    pub(super) fn new() -> Self {
        Self {
            master: RouteMaster::new(crate::data_node::boot_id() | 1),
            nodes: HashMap::new(),
            cached: None,
        }
    }

    /// Marks node `id` current or behind, in the core too (`state` locked after `self`).
    fn mark(&mut self, state: &Mutex<Shell>, id: u32, current: bool) {
        let n = self.nodes.entry(id).or_default();
        n.current = current;
        n.reports = 0;
        state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .core
            .set_routes_current(id, current);
    }

    /// Tells node `id` to fetch the table.
    fn prompt_fetch(&mut self, state: &Mutex<Shell>, id: u32, link: &Arc<dyn NodeLink>) {
        let v = self.master.version();
        self.mark(state, id, false);
        self.nodes.entry(id).or_default().turn += 1;
        let op = pb::directive::Op::RoutesChanged(pb::RoutesChanged {
            epoch: v.epoch,
            seq: v.seq,
        });
        if let Err(e) = link.submit(op) {
            warn!(id, error = %e, "cannot tell a data node to fetch the routes");
        }
    }

    /// The snapshot of the master table, its version and entries: the one being served if it
    /// is still held, else written now (in memory: the caller holds the lock, and does any I/O
    /// after releasing it).
    fn snapshot(&mut self) -> Result<(RouteVersion, usize, Arc<[u8]>), DataplaneError> {
        let v = self.master.version();
        if let Some((_, entries, bytes)) = self
            .cached
            .as_ref()
            .filter(|(at, _, _)| *at == v)
            .and_then(|(_, n, b)| Some((v, *n, b.upgrade()?)))
        {
            return Ok((v, entries, bytes));
        }
        let mut out = Vec::new();
        let entries = self.master.peek_snapshot(&mut out)?;
        let bytes: Arc<[u8]> = Arc::from(out);
        self.cached = Some((v, entries, Arc::downgrade(&bytes)));
        Ok((v, entries, bytes))
    }
}

impl Cluster {
    fn routes(&self) -> std::sync::MutexGuard<'_, RouteSync> {
        // Every critical section leaves the table consistent before anything can panic.
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live data nodes with a session: (id, name, link).
    fn route_targets(&self) -> Vec<(u32, String, Arc<dyn NodeLink>)> {
        let sh = self.state();
        sh.core
            .nodes()
            .iter()
            .filter(|(_, n)| n.role == Role::Data && n.session_open)
            .filter_map(|(id, n)| Some((*id, n.name.clone(), Arc::clone(sh.links.get(id)?))))
            .collect()
    }

    /// Node `id`'s session (the state lock is released on return).
    fn link(&self, id: u32) -> Option<Arc<dyn NodeLink>> {
        self.state().links.get(&id).cloned()
    }

    /// True if `link` is node `id`'s session still (the state lock is released on return).
    fn is_session(&self, id: u32, link: &Arc<dyn NodeLink>) -> bool {
        self.state()
            .links
            .get(&id)
            .is_some_and(|l| Arc::ptr_eq(l, link))
    }

    /// The master's version.
    pub fn routes_version(&self) -> RouteVersion {
        self.routes().master.version()
    }

    /// True if a node at `at` holds the master's table.
    pub(super) fn routes_current_at(&self, at: RouteVersion) -> bool {
        self.routes().master.version() == at
    }

    /// A data node registered holding the routes at `at`: current; a few changes behind in
    /// the same epoch: they are replayed; otherwise (an empty table after a start, another
    /// epoch, ahead of the master) it fetches the table. Does not wait for a replay's answer
    /// (the node's session reads answers only once the registration returned): a thread
    /// waits for it, and marks the node current when it applied the replay, unless it was
    /// told to fetch (or registered again) meanwhile; an error or no answer within the
    /// directive timeout makes it fetch.
    ///
    /// `link` is the registering session's: a registration that a newer one of the same node
    /// overtook (this one waited in `register` for steer nodes' answers meanwhile) does
    /// nothing, since its Hello's version is no longer what the node holds.
    pub(super) fn routes_hello(
        &self,
        id: u32,
        name: &str,
        at: RouteVersion,
        link: &Arc<dyn NodeLink>,
    ) {
        let mut rs = self.routes();
        if !self.is_session(id, link) {
            debug!(node = name, at = %at, "an overtaken registration's routes are not judged");
            return;
        }
        let link = Arc::clone(link);
        let turn = {
            let n = rs.nodes.entry(id).or_default();
            n.turn += 1;
            n.last = Some(at);
            n.turn
        };
        let replay = match rs.master.replay(at) {
            Replay::Current => {
                rs.mark(&self.state, id, true);
                return;
            }
            Replay::Fetch => None,
            Replay::Changes(changes) => {
                let first = changes.first().map_or(at.seq + 1, |c| c.0);
                let ops: Option<Vec<pb::RouteOp>> = changes
                    .iter()
                    .map(|(_, c)| rpc::convert::route_op_to_pb(c))
                    .collect();
                ops.map(|ops| (first, ops))
            }
        };
        let Some((first_seq, ops)) = replay else {
            info!(node = name, at = %at, master = %rs.master.version(), "data node fetches the routes");
            rs.prompt_fetch(&self.state, id, &link);
            return;
        };
        let v = rs.master.version();
        rs.mark(&self.state, id, false);
        let count = ops.len();
        let ack = link.submit(pb::directive::Op::RouteChanges(pb::RouteChanges {
            epoch: v.epoch,
            first_seq,
            ops,
        }));
        drop(rs);
        let ack = match ack {
            Ok(ack) => ack,
            Err(e) => {
                warn!(node = name, error = %e, "route replay not sent; the node fetches");
                self.routes().prompt_fetch(&self.state, id, &link);
                return;
            }
        };
        let (routes, state, name) = (
            Arc::clone(&self.routes),
            Arc::clone(&self.state),
            name.to_owned(),
        );
        ack.on_answer(self.deadline(), move |answer| {
            let mut rs = routes.lock().unwrap_or_else(|e| e.into_inner());
            if rs.nodes.get(&id).map(|n| n.turn) != Some(turn) {
                debug!(node = %name, "answer to an earlier route replay ignored");
                return;
            }
            match answer {
                Ok(Answer::Applied | Answer::FilterMap(_)) => {
                    info!(node = %name, at = %at, to = %v, changes = count, "route changes replayed to a data node");
                    rs.mark(&state, id, true);
                }
                Ok(Answer::Kept) => {
                    info!(node = %name, at = %at, "route replay kept by a fetching data node; current once it reports the master's version");
                }
                Err(e) => {
                    warn!(node = %name, error = %e, "route replay failed; the node fetches");
                    rs.prompt_fetch(&state, id, &link);
                }
            }
        });
    }

    /// A data node reported holding the routes at `at`: current when it is the master's. A
    /// node that is not current is told again to fetch every few reports. A current node is
    /// judged too: reports race with changes on their way to it, so only a few consecutive
    /// reports at another version that does not move forward (the same one again, another
    /// epoch, or ahead of the master) mark it behind and make it fetch.
    pub fn routes_reported(&self, id: u32, at: RouteVersion) {
        let mut rs = self.routes();
        let master = rs.master.version();
        let Some(n) = rs.nodes.get_mut(&id) else {
            return;
        };
        let last = n.last.replace(at);
        if at == master {
            n.reports = 0;
            if !n.current {
                debug!(id, at = %at, "data node's routes are current");
                rs.mark(&self.state, id, true);
            }
            return;
        }
        if n.current {
            // Past its last report, in the master's epoch and not ahead of it: following the
            // master, with changes still on their way.
            let following = last.is_some_and(|l| l.epoch == at.epoch && l.seq < at.seq)
                && at.epoch == master.epoch
                && at.seq < master.seq;
            n.reports = if following { 0 } else { n.reports + 1 };
            if n.reports < PROMPT_AFTER_REPORTS {
                return;
            }
            warn!(id, at = %at, master = %master, reports = n.reports, "a data node marked current reports another version; it fetches the table");
        } else {
            n.reports += 1;
            if n.reports < PROMPT_AFTER_REPORTS {
                return;
            }
        }
        if let Some(link) = self.link(id) {
            rs.prompt_fetch(&self.state, id, &link);
        }
    }

    /// The snapshot of the master table for a fetching data node: its version and bytes
    /// (shared by the nodes fetching the same version at the same time, and with a store
    /// write of it). Built with the routes lock held if no one holds it yet: in memory only,
    /// the table's serialisation (see docs/performance.md).
    pub fn route_snapshot(&self) -> Result<(RouteVersion, Arc<[u8]>), DataplaneError> {
        let (v, _, bytes) = self.routes().snapshot()?;
        Ok((v, bytes))
    }

    /// The configured VNets changed: the master's follow (entries of VNets gone go, as on
    /// every data node, which applies the same configuration itself). A change that dropped
    /// entries is a numbered bulk change: the data nodes are told to fetch (their table, or a
    /// snapshot on its way to them, may hold the entries under the version before). Called by
    /// `set_inside`; the control node calls it before restoring the route store.
    pub fn set_route_vnets(&self, vnets: &[datapath::VnetConfig]) -> Result<(), DataplaneError> {
        let mut rs = self.routes();
        // The snapshot names the VNets: any change of them is a new snapshot, if not a new
        // version.
        rs.cached = None;
        if !rs.master.set_vnet_configs(vnets)? {
            return Ok(());
        }
        let targets = self.route_targets();
        info!(version = %rs.master.version(), nodes = targets.len(), "VNets removed with their per-VM routes; data nodes fetch the table");
        for (id, _, link) in &targets {
            rs.prompt_fetch(&self.state, *id, link);
        }
        Ok(())
    }

    /// [`DataPath::change_routes`] for the cluster: the master first (validated as a data
    /// node validates), then every live data node, answered once they applied it (or kept it
    /// while fetching, or failed: the answer's `nodes` counts each).
    pub(super) fn cluster_change_routes(
        &self,
        change: RouteChange,
    ) -> Result<RouteChangeReport, DataplaneError> {
        let started = Instant::now();
        let mut change = change;
        let mut restored_at = None;
        if let RouteChange::Restore(bytes) = &change {
            if let Some((at, body)) = split_header(bytes) {
                restored_at = Some(at);
                change = RouteChange::Restore(Arc::from(body));
            }
        }
        if let Some(at) = restored_at {
            info!(stored = %at, "per-VM routes restored under a new epoch: the data nodes fetch them once");
        }
        let single = rpc::convert::route_op_to_pb(&change);
        let mut rs = self.routes();
        let before = rs.master.version();
        let result = rs.master.change(change).map(|(_, r)| r);
        let v = rs.master.version();
        if v == before {
            return result;
        }
        rs.cached = None;
        let targets = self.route_targets();
        let Some(op) = single else {
            // A bulk change: every node fetches the table.
            info!(version = %v, nodes = targets.len(), "per-VM routes changed in bulk; data nodes fetch them");
            for (id, _, link) in &targets {
                rs.prompt_fetch(&self.state, *id, link);
            }
            return result.map(|r| RouteChangeReport {
                nodes: Some(RouteFanout {
                    fetching: targets.len(),
                    ..RouteFanout::default()
                }),
                ..r
            });
        };
        let mut sent: Vec<(u32, String, Arc<dyn NodeLink>)> = Vec::new();
        let mut acks = Vec::new();
        let mut fanout = RouteFanout::default();
        for (id, name, link) in targets {
            match link.submit(pb::directive::Op::RouteChanges(pb::RouteChanges {
                epoch: v.epoch,
                first_seq: v.seq,
                ops: vec![op.clone()],
            })) {
                Ok(ack) => {
                    sent.push((id, name, link));
                    acks.push(ack);
                }
                Err(e) => {
                    warn!(node = %name, version = %v, error = %e, "route change not sent to a data node; it fetches the table");
                    fanout.failed += 1;
                    rs.prompt_fetch(&self.state, id, &link);
                }
            }
        }
        drop(rs);
        // Each answer is acted on as it comes: a node that refused or kept the change is
        // behind from then on, not once a slower node answered too.
        link::each_answer(&acks, self.deadline(), |i, answer| {
            let (id, name, link) = &sent[i];
            match answer {
                Ok(Answer::Applied | Answer::FilterMap(_)) => fanout.applied += 1,
                Ok(Answer::Kept) => {
                    debug!(node = %name, version = %v, "data node kept a route change while fetching the table");
                    fanout.fetching += 1;
                    let mut rs = self.routes();
                    // Behind until it reports the master's version, unless it already did
                    // (its fetch ended between the change and this answer); a node already
                    // behind keeps its count of reports toward the next prompt.
                    let master = rs.master.version();
                    if rs
                        .nodes
                        .get(id)
                        .is_some_and(|n| n.current && n.last != Some(master))
                    {
                        rs.mark(&self.state, *id, false);
                    }
                }
                Err(e) => {
                    warn!(node = %name, version = %v, error = %e, "data node did not apply a route change; it fetches the table");
                    fanout.failed += 1;
                    // Told on the session the change went to; a newer session registered
                    // meanwhile is judged by its own Hello.
                    if self.is_session(*id, link) {
                        self.routes().prompt_fetch(&self.state, *id, link);
                    }
                }
            }
        });
        let us = started.elapsed().as_micros() as u64;
        if fanout.fetching > 0 || fanout.failed > 0 {
            info!(version = %v, applied = fanout.applied, fetching = fanout.fetching, failed = fanout.failed, us, "route change not applied on every data node yet");
        } else {
            debug!(version = %v, applied = fanout.applied, us, "route change applied on the data nodes");
        }
        result.map(|r| RouteChangeReport {
            nodes: Some(fanout),
            ..r
        })
    }

    /// [`DataPath::write_routes`] for the cluster: the master's version, then its snapshot.
    /// The snapshot is taken with the routes lock held (shared with the fetches of the same
    /// version, or serialised in memory: [`Self::route_snapshot`]), and written to `out` (the
    /// route store: a file, or etcd chunks) after it is released, so the master's changes,
    /// registrations and reports do not wait behind the store's I/O (an operator's change
    /// through the route store still waits for the store's own lock, held while it writes).
    /// The header names the version of the bytes that follow, taken under the same lock.
    pub(super) fn cluster_write_routes(
        &self,
        out: &mut dyn std::io::Write,
    ) -> Result<usize, DataplaneError> {
        let (v, entries, bytes) = self.routes().snapshot()?;
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(VERSION_MAGIC);
        header[8..16].copy_from_slice(&v.epoch.to_be_bytes());
        header[16..].copy_from_slice(&v.seq.to_be_bytes());
        out.write_all(&header)
            .and_then(|()| out.write_all(&bytes))
            .map_err(|e| DataplaneError::Unsupported {
                operation: "write_routes",
                reason: format!("cannot write the route snapshot: {e}"),
            })?;
        Ok(entries)
    }

    /// [`DataPath::route_stats`] for the cluster: the master table (one copy).
    pub(super) fn cluster_route_stats(&self) -> RouteStats {
        self.routes().master.stats()
    }
}

/// The version and the snapshot of a stored snapshot that starts with one.
fn split_header(bytes: &[u8]) -> Option<(RouteVersion, &[u8])> {
    if bytes.len() < HEADER_LEN || &bytes[..8] != VERSION_MAGIC {
        return None;
    }
    // Epoch 0 is an empty table's: no master writes it.
    if bytes[8..16] == [0; 8] {
        return None;
    }
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[at..at + 8]);
        u64::from_be_bytes(b)
    };
    Some((
        RouteVersion {
            epoch: word(8),
            seq: word(16),
        },
        &bytes[HEADER_LEN..],
    ))
}
