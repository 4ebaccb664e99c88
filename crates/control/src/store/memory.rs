//! [`MemoryStore`]: the in-memory backend, for tests.

use super::{Change, Snapshot, Store, StoreError};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// An in-memory store, for tests: nothing survives the process.
///
/// Clones share one state, so a test can hand one clone to a control plane, drop that control
/// plane (a crash), and hand another clone to a new control plane to check what it restores.
/// [`MemoryStore::fail_commits`] makes commits fail, to test a control loop whose store is
/// down.
#[derive(Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Mutex<Shared>>,
}

#[derive(Default)]
struct Shared {
    ike_sas: BTreeMap<u64, Snapshot>,
    config: Option<Snapshot>,
    filters: Option<Snapshot>,
    fail_commits: bool,
    fail_reads: bool,
    commits: u64,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// While `fail` is true, every non-empty [`Store::commit`] (on any clone) fails with
    /// [`StoreError::Write`] and changes nothing.
    pub fn fail_commits(&self, fail: bool) {
        self.lock().fail_commits = fail;
    }

    /// While `fail` is true, [`Store::ike_sas`] (on any clone) fails with [`StoreError::Read`].
    pub fn fail_reads(&self, fail: bool) {
        self.lock().fail_reads = fail;
    }

    /// How many non-empty commits succeeded so far (on all clones).
    pub fn commits(&self) -> u64 {
        self.lock().commits
    }

    /// The stored snapshot of the IKE SA with own SPI `spi`, if any.
    pub fn ike_sa(&self, spi: u64) -> Option<Snapshot> {
        self.lock().ike_sas.get(&spi).cloned()
    }

    // A test that panicked while holding the lock leaves a consistent map: every change is
    // applied under one lock, after the failure check.
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Store for MemoryStore {
    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut shared = self.lock();
        if shared.fail_commits {
            return Err(StoreError::Write {
                store: self.describe(),
                detail: "failure injected by MemoryStore::fail_commits".into(),
            });
        }
        for change in changes {
            match change {
                Change::PutIkeSa { spi, snapshot } => {
                    shared.ike_sas.insert(*spi, snapshot.clone());
                }
                Change::DeleteIkeSa { spi } => {
                    shared.ike_sas.remove(spi);
                }
                Change::PutConfig { record } => shared.config = Some(record.clone()),
                Change::DeleteConfig => shared.config = None,
                Change::PutFilters { record } => shared.filters = Some(record.clone()),
                Change::DeleteFilters => shared.filters = None,
            }
        }
        shared.commits += 1;
        Ok(())
    }

    fn ike_sas(&self) -> Result<Vec<(u64, Snapshot)>, StoreError> {
        let shared = self.lock();
        if shared.fail_reads {
            return Err(StoreError::Read {
                store: "memory".into(),
                detail: "reads made to fail (test)".into(),
            });
        }
        Ok(shared
            .ike_sas
            .iter()
            .map(|(spi, snapshot)| (*spi, snapshot.clone()))
            .collect())
    }

    fn applied_config(&self) -> Result<Option<Snapshot>, StoreError> {
        let shared = self.lock();
        if shared.fail_reads {
            return Err(StoreError::Read {
                store: "memory".into(),
                detail: "reads made to fail (test)".into(),
            });
        }
        Ok(shared.config.clone())
    }

    fn filters(&self) -> Result<Option<Snapshot>, StoreError> {
        let shared = self.lock();
        if shared.fail_reads {
            return Err(StoreError::Read {
                store: "memory".into(),
                detail: "reads made to fail (test)".into(),
            });
        }
        Ok(shared.filters.clone())
    }

    fn describe(&self) -> String {
        "memory".into()
    }

    fn at_rest(&self) -> bool {
        false
    }

    fn read_ike_sa(&self, spi: u64) -> Result<Option<Snapshot>, StoreError> {
        let shared = self.lock();
        if shared.fail_reads {
            return Err(StoreError::Read {
                store: "memory".into(),
                detail: "reads made to fail (test)".into(),
            });
        }
        Ok(shared.ike_sas.get(&spi).cloned())
    }
}

impl fmt::Debug for MemoryStore {
    /// Prints how many SAs are stored, never their snapshots.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = self.lock();
        f.debug_struct("MemoryStore")
            .field("ike_sas", &shared.ike_sas.len())
            .field("fail_commits", &shared.fail_commits)
            .field("commits", &shared.commits)
            .finish()
    }
}
