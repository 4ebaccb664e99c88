//! A data node's copy of the per-VM routes following the control node's master table (issue 16
//! §2, docs/architecture.md "Per-VM routes in the cluster"): single changes applied in order
//! of their numbers, a gap refused, the snapshot fetched and restored when control announces
//! a bulk change or the node fell behind, with the changes that arrive during the fetch kept
//! and applied after it. No I/O: the data node's session and fetch thread drive it.

use crate::link::Answer;
use datapath::{DataPath, RouteChange};
use routebook::RouteVersion;
use std::sync::Arc;

/// The version a node without routes reports (control's epochs are never 0).
#[cfg(test)]
pub(crate) const NO_ROUTES: RouteVersion = RouteVersion { epoch: 0, seq: 0 };

/// Changes kept while a fetch is under way, at most (a node further behind fetches again).
const MAX_BUFFERED: usize = 100_000;

/// The follower's state.
#[derive(Debug, Default)]
pub(crate) struct RouteFollower {
    /// The version of the table the data path holds.
    version: RouteVersion,
    /// A fetch is needed or under way.
    fetching: bool,
    /// The latest version control announced (`routes_changed`) during a fetch.
    announced: Option<RouteVersion>,
    /// Single changes received during the fetch: (epoch, first seq, changes).
    buffered: Vec<(u64, u64, Vec<RouteChange>)>,
    /// Changes in `buffered`.
    buffered_len: usize,
}

impl RouteFollower {
    /// The version held.
    pub(crate) fn version(&self) -> RouteVersion {
        self.version
    }

    /// True while the node must fetch (or is fetching) the snapshot.
    pub(crate) fn fetching(&self) -> bool {
        self.fetching
    }

    /// Single changes `changes`, numbered from `first_seq` in `epoch`. Applied in order when
    /// they follow the version held (changes already held are skipped); kept during a fetch,
    /// and answered [`Answer::Kept`] (not applied yet: control must not count them as held);
    /// otherwise refused as a gap, and the node must fetch ([`Self::fetching`]).
    pub(crate) fn changes(
        &mut self,
        dp: &dyn DataPath,
        epoch: u64,
        first_seq: u64,
        changes: Vec<RouteChange>,
    ) -> Result<Answer, String> {
        if self.fetching {
            if self.buffered_len + changes.len() > MAX_BUFFERED {
                self.buffered.clear();
                self.buffered_len = 0;
                self.announced = Some(RouteVersion {
                    epoch,
                    seq: first_seq
                        .saturating_add(changes.len() as u64)
                        .saturating_sub(1),
                });
            } else {
                self.buffered_len += changes.len();
                self.buffered.push((epoch, first_seq, changes));
            }
            return Ok(Answer::Kept);
        }
        self.apply(dp, epoch, first_seq, changes)
            .map(|()| Answer::Applied)
            .map_err(|e| {
                self.fetching = true;
                format!("{e}; fetching the table (at {})", self.version)
            })
    }

    /// Applies changes that follow the version held; a gap or a change the data path refuses
    /// is an error (the changes before it are applied and counted).
    fn apply(
        &mut self,
        dp: &dyn DataPath,
        epoch: u64,
        first_seq: u64,
        changes: Vec<RouteChange>,
    ) -> Result<(), String> {
        if first_seq == 0 || epoch != self.version.epoch || first_seq > self.version.seq + 1 {
            return Err(format!(
                "gap: the routes are at {}, the changes start at {epoch}.{first_seq}",
                self.version
            ));
        }
        let skip = (self.version.seq + 1 - first_seq) as usize;
        for (i, change) in changes.into_iter().enumerate().skip(skip) {
            let seq = first_seq + i as u64;
            dp.change_routes(change)
                .map_err(|e| format!("route change {epoch}.{seq} refused: {e}"))?;
            self.version.seq = seq;
        }
        Ok(())
    }

    /// Control announced the table at `at` after a bulk change: a node at another version
    /// must fetch ([`Self::fetching`]).
    pub(crate) fn announced(&mut self, at: RouteVersion) {
        if self.fetching {
            self.announced = Some(self.announced.map_or(at, |a| a.max(at)));
        } else if at != self.version {
            self.fetching = true;
        }
    }

    /// The snapshot `bytes` of the table at `at` was fetched: the table becomes it, published
    /// at once (`RouteChange::Replace`: entries it lacks go), then the changes kept during the fetch that
    /// follow it are applied. Another fetch is needed ([`Self::fetching`]) if a change kept
    /// did not follow, or control announced a later bulk change meanwhile.
    ///
    /// The same as [`Self::replace_table`] then [`Self::restored_after`]; a data node calls
    /// those two apart, so that the follower is not locked while the table is replaced
    /// (seconds at 16 M entries) and the changes control sends meanwhile are kept and
    /// answered as kept, not left waiting.
    #[cfg(test)]
    pub(crate) fn restored(
        &mut self,
        dp: &dyn DataPath,
        at: RouteVersion,
        bytes: Arc<[u8]>,
    ) -> Result<(), String> {
        Self::replace_table(dp, at, bytes)?;
        self.restored_after(dp, at)
    }

    /// Makes the data path's table the snapshot `bytes` of the table at `at`. Needs no
    /// follower: while a fetch is under way the follower only keeps changes, so nothing else
    /// changes the table meanwhile.
    pub(crate) fn replace_table(
        dp: &dyn DataPath,
        at: RouteVersion,
        bytes: Arc<[u8]>,
    ) -> Result<(), String> {
        let report = dp
            .change_routes(RouteChange::Replace(bytes))
            .map_err(|e| format!("route snapshot {at} not restored: {e}"))?;
        // The master holds the configured VNets' entries only: one left out here (a VNet not
        // configured on this node yet, the table's limit) is a difference, not a version.
        if report.skipped > 0 {
            return Err(format!(
                "route snapshot {at}: {} entries not taken; fetching again",
                report.skipped
            ));
        }
        Ok(())
    }

    /// The table was replaced by the snapshot of the table at `at` ([`Self::replace_table`]):
    /// the follower holds `at`, and applies the changes it kept during the fetch that follow
    /// it.
    pub(crate) fn restored_after(
        &mut self,
        dp: &dyn DataPath,
        at: RouteVersion,
    ) -> Result<(), String> {
        self.version = at;
        self.fetching = false;
        self.buffered_len = 0;
        let mut again = false;
        for (epoch, first, changes) in std::mem::take(&mut self.buffered) {
            if epoch != at.epoch
                || first.saturating_add(changes.len() as u64) <= at.seq.saturating_add(1)
            {
                continue;
            }
            if let Err(e) = self.apply(dp, epoch, first, changes) {
                tracing::warn!(error = %e, "route changes kept during the fetch do not follow it");
                again = true;
                break;
            }
        }
        if let Some(a) = self.announced.take() {
            again |= a.epoch != self.version.epoch || a.seq > self.version.seq;
        }
        self.fetching = again;
        Ok(())
    }
}

#[cfg(test)]
impl RouteFollower {
    /// A follower holding the table at `at` (tests).
    pub(crate) fn at(at: RouteVersion) -> Self {
        Self {
            version: at,
            ..Self::default()
        }
    }
}

#[cfg(test)]
#[path = "route_follow_tests.rs"]
pub(crate) mod tests;
