//! Where the per-VM overlay routes survive a restart (issue 16 §2): not one store record per
//! VM, but a snapshot and a journal of the changes since, kept by a [`RouteMedium`]: two files
//! next to the state store for `protego up` ([`FileMedium`], `[store] path`, e.g.
//! `/var/lib/protego/state.redb.routes` and `….routes.log`, described below), or chunks and
//! records in etcd for the cluster's control nodes ([`crate::store::EtcdMedium`], its layout
//! documented there). The logic (generations, replay, compaction) is the same over both.
//!
//! - the **snapshot**: a header (`PGRTGEN1`, the generation, its complement) and the data
//!   path's compact binary form of every entry (`overlay::snapshot`: about 13 bytes per IPv4
//!   entry, a hash over the whole), replaced atomically (written to a temporary file, synced,
//!   renamed over the old one, the directory synced);
//! - the **journal** of the single changes since: a header line naming the snapshot's
//!   generation, then `+ tenant,vnet,address,host` and `- tenant,vnet,address` lines,
//!   appended and synced before `ctl route add|del` answers.
//!
//! A bulk load (`ctl route load`), every [`COMPACT_AFTER`] journal lines and
//! [`RouteStore::compact`] write the snapshot of the next generation, then a new journal of
//! that generation (created, synced, its directory synced). At start the snapshot is
//! restored and the journal replayed if it is of the snapshot's generation; the journal of
//! the generation before (a compaction stopped after the rename) is already in the snapshot
//! and is ignored. A last journal line without its newline is a write a crash cut short,
//! never answered: ignored, and cut off before anything is appended after it; a damaged
//! complete last line is skipped with a warning, a damaged line before it stops the start.
//! A line whose VNet is no longer configured is skipped with a warning, as are the
//! snapshot's entries of such VNets; the result is written as the new snapshot, the files
//! found kept beside it as `….routes.prev` and `….routes.log.prev`.
//!
//! The change is applied to the data path first and recorded after: a crash in between
//! loses a change the operator saw no answer for.

use crate::error::Error;
use datapath::{DataPath, RouteChange, RouteChangeReport, VmRoute};
use ids::TenantId;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

mod file;
mod medium;

pub use file::FileMedium;
pub use medium::{JournalRead, MediumError, RouteMedium, WriteSnapshot};

/// Journal lines after which a new snapshot is written.
pub const COMPACT_AFTER: usize = 100_000;

/// A change recorded in the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// `route add`.
    Add(VmRoute),
    /// `route del`.
    Del {
        /// The VNet's tenant.
        tenant: TenantId,
        /// The VNet's name.
        vnet: String,
        /// The VM's address.
        address: IpAddr,
    },
}

impl Recorded {
    /// The journal line (without its newline).
    pub fn line(&self) -> String {
        match self {
            Recorded::Add(r) => format!("+ {},{},{},{}", r.tenant, r.vnet, r.address, r.host),
            Recorded::Del {
                tenant,
                vnet,
                address,
            } => format!("- {tenant},{vnet},{address}"),
        }
    }

    /// Parses a journal line (`n`: its 1-based number, for errors).
    pub fn parse(n: usize, line: &str) -> Result<Self, String> {
        if let Some(rest) = line.strip_prefix("+ ") {
            let r = overlay::routes::parse_line(n, rest).map_err(|e| e.to_string())?;
            let tenant = TenantId::new(&r.tenant).map_err(|e| format!("line {n}: {e}"))?;
            return Ok(Recorded::Add(VmRoute {
                tenant,
                vnet: r.vnet.into_owned(),
                address: r.address,
                host: r.host,
            }));
        }
        if let Some(rest) = line.strip_prefix("- ") {
            let f: Vec<&str> = rest.split(',').map(str::trim).collect();
            let [tenant, vnet, address] = f[..] else {
                return Err(format!("line {n}: expected tenant,vnet,address"));
            };
            let tenant = TenantId::new(tenant).map_err(|e| format!("line {n}: {e}"))?;
            ids::check_name(vnet).map_err(|e| format!("line {n}: {e}"))?;
            let address = address
                .parse()
                .map_err(|_| format!("line {n}: {address:?} is not an IP address"))?;
            return Ok(Recorded::Del {
                tenant,
                vnet: vnet.to_owned(),
                address,
            });
        }
        Err(format!("line {n}: neither `+ ` nor `- `"))
    }

    /// The data path's change.
    pub fn change(&self) -> RouteChange {
        match self.clone() {
            Recorded::Add(r) => RouteChange::Add(r),
            Recorded::Del {
                tenant,
                vnet,
                address,
            } => RouteChange::Del {
                tenant,
                vnet,
                address,
            },
        }
    }
}

/// What [`RouteStore::restore`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    /// Entries of the snapshot restored.
    pub snapshot: usize,
    /// Journal lines replayed.
    pub journal: usize,
    /// Snapshot entries and journal lines skipped (VNet gone, bad line).
    pub skipped: usize,
    /// Journal lines not replayed because the snapshot already holds them (a compaction
    /// stopped between writing the snapshot and emptying the journal), plus a torn last line.
    pub ignored: usize,
}

/// The snapshot and journal of one node's per-VM routes, on a [`RouteMedium`] (by default any,
/// boxed).
#[derive(Debug)]
pub struct RouteStore<M: RouteMedium = Box<dyn RouteMedium>> {
    /// The medium's snapshot place, for messages.
    snapshot: PathBuf,
    /// The medium's journal place, for messages.
    journal: PathBuf,
    /// The medium and the journal's state; held while a change is applied and recorded, so
    /// changes are recorded in the order they were applied.
    state: Mutex<Journal<M>>,
}

#[derive(Debug)]
struct Journal<M> {
    medium: M,
    /// The generation of the snapshot stored; None before [`RouteStore::restore`].
    generation: Option<u64>,
    /// Change lines since the snapshot.
    lines: usize,
}

impl RouteStore {
    /// The store on the files beside the state store file `state` (`state` + `.routes` and
    /// `.routes.log`, see [`FileMedium`]).
    pub fn beside(state: &Path) -> Self {
        Self::new(Box::new(FileMedium::beside(state)))
    }
}

impl<M: RouteMedium> RouteStore<M> {
    /// The store on `medium`.
    pub fn new(medium: M) -> Self {
        Self {
            snapshot: PathBuf::from(medium.snapshot_at()),
            journal: PathBuf::from(medium.journal_at()),
            state: Mutex::new(Journal {
                medium,
                generation: None,
                lines: 0,
            }),
        }
    }

    /// The snapshot's place (a file's path, or an etcd key).
    pub fn path(&self) -> &Path {
        &self.snapshot
    }

    fn err(path: &Path, reason: impl std::fmt::Display) -> Error {
        Error::RouteStore {
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }

    /// Restores the snapshot and replays the journal into `dp`, then writes them as one new
    /// snapshot. Nothing stored is an empty table. The journal is replayed only if it is the
    /// snapshot's (same generation); the journal of the generation before is already in the
    /// snapshot and is ignored; any other is refused.
    pub fn restore(&self, dp: &dyn DataPath) -> Result<Restored, Error> {
        let mut j = self.lock();
        let mut out = Restored::default();
        let generation = match j.medium.read_snapshot().map_err(medium_err)? {
            Some((generation, body)) => {
                let r = dp
                    .change_routes(RouteChange::Restore(Arc::from(body)))
                    .map_err(|e| Self::err(&self.snapshot, e))?;
                out.snapshot = r.added;
                out.skipped += r.skipped;
                generation
            }
            None => 0,
        };
        if let Some(text) = j.medium.read_journal(generation).map_err(medium_err)? {
            if text.torn {
                tracing::warn!(journal = %self.journal.display(), "route journal: a last line cut short (never answered) is ignored");
                out.ignored += 1;
            }
            if text.lines.is_empty() || text.generation == generation {
                let count = text.lines.len();
                for (i, (n, line)) in text.lines.into_iter().enumerate() {
                    let change = match Recorded::parse(n, &line) {
                        Ok(r) => r.change(),
                        // Only the last line can be damaged by a crash; damage before it
                        // is something else, and the evidence is kept.
                        Err(e) if i + 1 < count => {
                            return Err(Self::err(
                                &self.journal,
                                format!("{e}: a damaged line before the last one (the files are left as they are: fix or remove the line, then start again)"),
                            ))
                        }
                        Err(e) => {
                            tracing::warn!(journal = %self.journal.display(), error = %e, "damaged last route journal line skipped");
                            out.skipped += 1;
                            continue;
                        }
                    };
                    match dp.change_routes(change) {
                        Ok(_) => out.journal += 1,
                        Err(e) => {
                            tracing::warn!(journal = %self.journal.display(), line = n, error = %e, "route journal line skipped");
                            out.skipped += 1;
                        }
                    }
                }
            } else if text.generation.checked_add(1) == Some(generation) {
                tracing::info!(journal = %self.journal.display(), lines = text.lines.len(), "route journal of the previous snapshot ignored (the snapshot holds it)");
                out.ignored += text.lines.len();
            } else {
                return Err(Self::err(
                    &self.journal,
                    format!(
                        "journal of generation {} does not belong to snapshot generation {generation}",
                        text.generation
                    ),
                ));
            }
        }
        j.generation = Some(generation);
        j.medium.keep_previous().map_err(medium_err)?;
        self.compact_locked(dp, &mut j)?;
        Ok(out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Journal<M>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn not_restored(&self) -> Error {
        Self::err(
            &self.snapshot,
            "the route store is used before it was restored",
        )
    }

    /// Applies a single change to `dp` and records it in the journal.
    pub fn apply(&self, dp: &dyn DataPath, change: Recorded) -> Result<RouteChangeReport, Error> {
        let mut j = self.lock();
        let Some(generation) = j.generation else {
            return Err(self.not_restored());
        };
        let report = dp.change_routes(change.change())?;
        j.medium
            .append(generation, &change.line())
            .map_err(|e| not_persisted(medium_err(e)))?;
        j.lines += 1;
        if j.lines >= COMPACT_AFTER {
            // The change is in the journal: a failed compaction loses nothing, it is retried
            // after the next change.
            if let Err(e) = self.compact_locked(dp, &mut j) {
                tracing::warn!(error = %e, "route store not compacted; the journal keeps growing");
            }
        }
        Ok(report)
    }

    /// Applies a route file's text to `dp` (validated whole by it) and writes a new snapshot.
    pub fn load(&self, dp: &dyn DataPath, text: Arc<str>) -> Result<RouteChangeReport, Error> {
        let mut j = self.lock();
        if j.generation.is_none() {
            return Err(self.not_restored());
        }
        let report = dp.change_routes(RouteChange::Load(text))?;
        let before = j.generation;
        match self.compact_locked(dp, &mut j) {
            Ok(_) => Ok(report),
            // The snapshot holding the load was written; only the new journal was not (the
            // next change writes it).
            Err(e) if j.generation != before => {
                tracing::warn!(error = %e, "route journal not started after a load");
                Ok(report)
            }
            Err(e) => Err(not_persisted(e)),
        }
    }

    /// Writes `dp`'s routes as a new snapshot and empties the journal; returns the entries
    /// written. Call it after VNets were removed from the data path: their entries are then
    /// in neither file, and do not come back at the next start when a VNet of the same name
    /// is configured again.
    pub fn compact(&self, dp: &dyn DataPath) -> Result<usize, Error> {
        let mut j = self.lock();
        if j.generation.is_none() {
            return Err(self.not_restored());
        }
        self.compact_locked(dp, &mut j)
    }

    /// Writes `dp`'s routes as the snapshot of the next generation (atomically), then a new
    /// empty journal of that generation. A crash between the two leaves the journal of the
    /// generation before, which the next start ignores (the snapshot holds its changes).
    fn compact_locked(&self, dp: &dyn DataPath, j: &mut Journal<M>) -> Result<usize, Error> {
        let generation = j.generation.ok_or_else(|| self.not_restored())? + 1;
        let n = j
            .medium
            .write_snapshot(generation, &mut |w| {
                dp.write_routes(w).map_err(|e| e.to_string())
            })
            .map_err(medium_err)?;
        // The snapshot holds every journalled change now: the journal stored is stale.
        j.generation = Some(generation);
        j.lines = 0;
        j.medium.start_journal(generation).map_err(medium_err)?;
        Ok(n)
    }
}

/// A medium's error as the store's.
fn medium_err(e: MediumError) -> Error {
    Error::RouteStore {
        path: PathBuf::from(e.at),
        reason: e.reason,
    }
}

/// A route store error after the data path took the change.
fn not_persisted(e: Error) -> Error {
    match e {
        Error::RouteStore { path, reason } => Error::NotPersisted { path, reason },
        other => other,
    }
}

#[cfg(test)]
mod media_tests;
#[cfg(test)]
mod tests;
