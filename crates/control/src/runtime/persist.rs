//! Durable IKE state in the control loop: every change of an IKE SA's state reaches the store
//! *before* the datagrams of the same round leave, and a restarted control plane restores the
//! stored IKE SAs.
//!
//! Each round of the loop drains the engine's events (CHILD_SAs reach the data path), then
//! [`Persister::save`] commits the engine's [`StateChange`]s in one transaction, and only then
//! are the round's datagrams sent. If the store fails, the datagrams are held (a response must
//! not leave before the state it depends on: a message ID the peer saw answered must survive a
//! restart) and the commit is retried every [`RETRY`]; forwarding is not affected, since the
//! data path does not wait for the store. The held datagrams leave once a commit succeeds.
//!
//! Re-encryption of the records under an older key ([`Persister::reseal`], after a key
//! rotation) runs apart from these rounds, in small batches after a round's datagrams have left.
//!
//! A record in the store is the engine's snapshot behind a small header with the wall-clock time
//! it was written, so a restore knows how long the SA's timers have been running meanwhile
//! ([`ike::Endpoint::restore_aged`]), and the name of its tunnel: tunnels are numbered by their
//! place in the configuration file, so a restore checks that the number still names the same
//! tunnel before it trusts the record.

use crate::error::Error;
use crate::store::{Change, Snapshot, Store, StoreError};
use ike::{StateChange, TunnelId};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tracing::{error, info, warn};
use zeroize::Zeroizing;

/// How long after a failed commit the next attempt is made.
pub(crate) const RETRY: Duration = Duration::from_secs(1);
/// Most datagrams held while the store is failing (older ones are dropped first: the peer
/// retransmits its requests and the engine its own).
const MAX_HELD: usize = 4096;
/// A commit slower than this is logged as a warning.
const SLOW_COMMIT: Duration = Duration::from_millis(200);
/// Most changes in one store commit (etcd refuses transactions of more than 128 operations by
/// default); a larger backlog (after an outage) is committed in several.
const MAX_BATCH: usize = 64;
/// How many commit latencies are kept for the percentiles.
const LATENCY_SAMPLES: usize = 1024;
/// Most records re-encrypted in one round ([`Store::reseal`], after a key rotation or to
/// encrypt records stored in clear): each is read, sealed and committed by the control loop, so
/// the work is spread out.
const RESEAL_BATCH: usize = 16;
/// The pause between two rounds of re-encryption.
const RESEAL_INTERVAL: Duration = Duration::from_millis(100);
/// How long a due round of re-encryption gives way to IKE datagrams waiting to be handled; then
/// it runs anyway, so a busy gateway still finishes re-encrypting.
const RESEAL_MAX_DEFER: Duration = Duration::from_secs(1);

/// Magic of a stored record: "Protego STate", version 1.
const MAGIC: &[u8; 4] = b"PST1";
/// Magic, write time (ms since the Unix epoch), tunnel name length.
const HEADER: usize = 4 + 8 + 2;

/// A stored record, decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    /// When it was written.
    pub(crate) at: SystemTime,
    /// The name of its tunnel when it was written ("" for none).
    pub(crate) tunnel: &'a str,
    /// The engine's snapshot.
    pub(crate) snapshot: &'a [u8],
}

/// Wraps a snapshot of `tunnel`'s IKE SA written at `at` into a stored record.
pub(crate) fn encode_record(at: SystemTime, tunnel: &str, snapshot: &[u8]) -> Zeroizing<Vec<u8>> {
    let millis = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    // Tunnel names are validated short; a longer one is cut (it then never matches).
    let name = &tunnel.as_bytes()[..tunnel.len().min(usize::from(u16::MAX))];
    let mut out = Zeroizing::new(Vec::with_capacity(HEADER + name.len() + snapshot.len()));
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&millis.to_be_bytes());
    out.extend_from_slice(&(name.len() as u16).to_be_bytes());
    out.extend_from_slice(name);
    out.extend_from_slice(snapshot);
    out
}

/// Reads a record written by [`encode_record`].
pub(crate) fn decode_record(record: &[u8]) -> Result<Record<'_>, &'static str> {
    if record.len() < HEADER || &record[..4] != MAGIC {
        return Err("not a Protego state record");
    }
    let mut millis = [0u8; 8];
    millis.copy_from_slice(&record[4..12]);
    let at = UNIX_EPOCH + Duration::from_millis(u64::from_be_bytes(millis));
    let len = usize::from(u16::from_be_bytes([record[12], record[13]]));
    let name = record
        .get(HEADER..HEADER + len)
        .ok_or("truncated state record")?;
    let tunnel = std::str::from_utf8(name).map_err(|_| "tunnel name is not UTF-8")?;
    Ok(Record {
        at,
        tunnel,
        snapshot: &record[HEADER + len..],
    })
}

/// A datagram waiting for its state to become durable.
pub(crate) struct Held {
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    pub(crate) data: Vec<u8>,
}

/// Commit figures for status and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreStats {
    /// What the store is (`file /var/lib/protego/state.redb`).
    pub backend: String,
    /// Successful commits.
    pub commits: u64,
    /// Failed commit attempts.
    pub failures: u64,
    /// IKE SA records written and deleted.
    pub records_written: u64,
    /// Median commit latency over the recent commits, in microseconds.
    pub commit_us_p50: u64,
    /// 99th percentile of the same.
    pub commit_us_p99: u64,
    /// Every successful commit's latency since the start, as a histogram (the metrics'
    /// `protego_store_commit_duration_seconds`).
    #[serde(default)]
    pub commit_latency: CommitLatency,
    /// Datagrams waiting for a commit (non-zero only while the store fails).
    pub held: usize,
    /// The last failure, while the store is failing.
    pub error: Option<String>,
    /// How the records are encrypted at rest: key file, current key, records per key.
    #[serde(default)]
    pub encryption: Option<crate::store::EncryptionStatus>,
}

/// Upper bounds of the commit latency histogram's buckets, in microseconds; one more bucket,
/// unbounded, follows.
pub const COMMIT_BUCKETS_US: [u64; 13] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// A histogram of commit latencies since the start.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CommitLatency {
    /// The latencies summed, in microseconds.
    pub sum_us: u64,
    /// Commits per bucket (not cumulative): one per bound of [`COMMIT_BUCKETS_US`], then the
    /// unbounded one.
    pub buckets: Vec<u64>,
}

impl Default for CommitLatency {
    fn default() -> Self {
        Self {
            sum_us: 0,
            buckets: vec![0; COMMIT_BUCKETS_US.len() + 1],
        }
    }
}

impl CommitLatency {
    /// Counts one commit that took `took`.
    pub fn observe(&mut self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_us = self.sum_us.saturating_add(us);
        let bucket = COMMIT_BUCKETS_US
            .iter()
            .position(|&bound| us <= bound)
            .unwrap_or(COMMIT_BUCKETS_US.len());
        if let Some(n) = self.buckets.get_mut(bucket) {
            *n += 1;
        }
    }

    /// The commits counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// The control loop's side of the store.
pub(crate) struct Persister {
    store: Box<dyn Store>,
    /// Changes not committed yet, the newest per SPI, with the round that made them.
    pending: BTreeMap<u64, (u64, Change)>,
    /// Rounds of [`Persister::save`] so far.
    round: u64,
    held: VecDeque<Held>,
    retry_at: Option<Instant>,
    error: Option<String>,
    commits: u64,
    failures: u64,
    records: u64,
    latencies: VecDeque<Duration>,
    latency: CommitLatency,
    /// IKE SAs deleted from the store with an applied configuration while they are still
    /// being deleted with their peers: their later states are not stored.
    doomed: std::collections::HashSet<u64>,
    /// When the next round of re-encryption may run; `None` once none is left.
    reseal_at: Option<Instant>,
    /// Why the last re-encryption failed, while it fails.
    reseal_error: Option<String>,
}

impl Persister {
    pub(crate) fn new(store: Box<dyn Store>) -> Self {
        Self {
            store,
            pending: BTreeMap::new(),
            round: 0,
            held: VecDeque::new(),
            retry_at: None,
            error: None,
            commits: 0,
            failures: 0,
            records: 0,
            latencies: VecDeque::new(),
            latency: CommitLatency::default(),
            doomed: std::collections::HashSet::new(),
            // Records found under an older key (or in clear) at the start are re-encrypted.
            reseal_at: Some(Instant::now()),
            reseal_error: None,
        }
    }

    /// What the store is.
    pub(crate) fn describe(&self) -> String {
        self.store.describe()
    }

    /// Every stored record (SPI, record bytes).
    pub(crate) fn load(&self) -> Result<Vec<(u64, Snapshot)>, StoreError> {
        self.store.ike_sas()
    }

    /// The stored applied configuration, if any.
    pub(crate) fn applied(&self) -> Result<Option<crate::applied::AppliedConfig>, Error> {
        let Some(bytes) = self.store.applied_config()? else {
            return Ok(None);
        };
        crate::applied::AppliedConfig::decode(&bytes)
            .map(Some)
            .map_err(|detail| Error::Applied {
                store: self.store.describe(),
                detail,
            })
    }

    /// The stored filter set, if any.
    pub(crate) fn filters(&self) -> Result<Option<crate::filters::FilterRecord>, Error> {
        let Some(bytes) = self.store.filters()? else {
            return Ok(None);
        };
        crate::filters::FilterRecord::decode(&bytes)
            .map(Some)
            .map_err(|detail| Error::Filters {
                store: self.store.describe(),
                detail,
            })
    }

    /// Commits a change of the applied configuration at once, with `changes` (the
    /// configuration and the deletion of the `doomed` IKE SAs, which the change retires),
    /// on their own: `protego ctl apply` waits for it, and nothing changes unless it is
    /// durable. From then on the doomed SAs' later states are not stored (they are being
    /// deleted; a restart must not bring them back). Counted with the other commits.
    pub(crate) fn commit_config(
        &mut self,
        changes: &[Change],
        doomed: &[u64],
    ) -> Result<(), StoreError> {
        let started = Instant::now();
        match self.store.commit(changes) {
            Ok(()) => {
                self.committed(started.elapsed(), changes.len());
                for spi in doomed {
                    self.pending.remove(spi);
                    self.doomed.insert(*spi);
                }
                Ok(())
            }
            Err(e) => {
                self.failures += 1;
                Err(e)
            }
        }
    }

    /// Queues the engine's changes (`name` gives a tunnel's name) and commits everything
    /// pending. True if nothing is left uncommitted (the round's datagrams may leave).
    pub(crate) fn save(
        &mut self,
        now: Instant,
        changes: Vec<StateChange>,
        name: impl Fn(Option<TunnelId>) -> String,
    ) -> bool {
        let wall = SystemTime::now();
        self.round += 1;
        let round = self.round;
        for change in changes {
            match change {
                StateChange::Saved { spi, .. } if self.doomed.contains(&spi.0) => {}
                StateChange::Saved {
                    spi,
                    tunnel,
                    snapshot,
                    ..
                } => {
                    let record = encode_record(wall, &name(tunnel), &snapshot);
                    self.pending.insert(
                        spi.0,
                        (
                            round,
                            Change::PutIkeSa {
                                spi: spi.0,
                                snapshot: record,
                            },
                        ),
                    );
                }
                StateChange::Removed { spi } => {
                    self.doomed.remove(&spi.0);
                    self.pending
                        .insert(spi.0, (round, Change::DeleteIkeSa { spi: spi.0 }));
                }
            }
        }
        self.commit(now)
    }

    /// Adds a new current key to the store's key file (`protego ctl store rotate-key`) and
    /// starts re-encrypting the records under older keys.
    pub(crate) fn rotate_key(&mut self) -> Result<crate::store::KeyRotation, StoreError> {
        let rotation = self.store.rotate_key()?;
        self.reseal_at = Some(Instant::now());
        Ok(rotation)
    }

    /// When the next round of re-encryption is due, while records are left to re-encrypt.
    pub(crate) fn reseal_at(&self) -> Option<Instant> {
        // While changes wait for a failing store, its retry wakes the loop instead.
        self.reseal_at
            .filter(|_| self.pending.is_empty() && self.held.is_empty())
    }

    /// One round of re-encryption, if one is due: at most [`RESEAL_BATCH`] records, committed
    /// like the loop's own changes (they never overtake a newer state: every change of the loop
    /// is already committed). The control loop calls it after a round, once the round's
    /// datagrams have left, never between a commit and the datagrams that wait for it: the
    /// store's round trips are not added to an IKE exchange. It does nothing while changes or
    /// datagrams wait for the store, nor while `busy` (IKE datagrams are waiting to be handled)
    /// unless it has been due for [`RESEAL_MAX_DEFER`]. True if it ran.
    pub(crate) fn reseal(&mut self, now: Instant, busy: bool) -> bool {
        let Some(due) = self.reseal_at() else {
            return false;
        };
        if now < due || (busy && now < due + RESEAL_MAX_DEFER) {
            return false;
        }
        match self.store.reseal(RESEAL_BATCH) {
            Ok(0) => {
                self.reseal_at = None;
                if self.reseal_error.take().is_some() {
                    info!(store = %self.store.describe(), "state store records re-encrypted");
                }
            }
            Ok(done) => {
                self.commits += 1;
                self.records += done as u64;
                self.reseal_error = None;
                self.reseal_at = Some(now + RESEAL_INTERVAL);
            }
            Err(e) => {
                let message = e.to_string();
                if self.reseal_error.as_deref() != Some(message.as_str()) {
                    warn!(store = %self.store.describe(), error = %message,
                        "cannot re-encrypt state store records; retrying");
                }
                self.reseal_error = Some(message);
                self.reseal_at = Some(now + RETRY);
            }
        }
        true
    }

    /// Forgets stored IKE SAs (ones that cannot be restored, or all of them at shutdown), in
    /// as few commits as the batch limit allows. A retry that is not due yet is not waited
    /// for: this is a last attempt.
    pub(crate) fn forget(&mut self, now: Instant, spis: impl IntoIterator<Item = u64>) -> bool {
        self.round += 1;
        for spi in spis {
            self.pending
                .insert(spi, (self.round, Change::DeleteIkeSa { spi }));
        }
        self.retry_at = None;
        self.commit(now)
    }

    fn commit(&mut self, now: Instant) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        if self.retry_at.is_some_and(|t| now < t) {
            return false;
        }
        while !self.pending.is_empty() {
            let batch = self.next_batch();
            if !self.commit_batch(now, &batch) {
                return false;
            }
            for change in &batch {
                // Only IKE SA changes are pending here (the configuration commits on its own).
                if let Change::PutIkeSa { spi, .. } | Change::DeleteIkeSa { spi } = change {
                    self.pending.remove(spi);
                }
            }
        }
        self.retry_at = None;
        if self.error.take().is_some() {
            info!(store = %self.store.describe(), held = self.held.len(), "state store works again; sending held IKE datagrams");
        }
        true
    }

    /// The next changes to commit together: whole rounds, oldest first, up to [`MAX_BATCH`]
    /// changes (a single larger round is split). The SAs one round changed together (the old
    /// and the new SA of an IKE SA rekey) so reach the store in one transaction.
    fn next_batch(&self) -> Vec<Change> {
        let mut by_round: Vec<(u64, &Change)> =
            self.pending.values().map(|(r, c)| (*r, c)).collect();
        by_round.sort_by_key(|(r, _)| *r);
        let mut batch = Vec::new();
        let mut i = 0;
        while i < by_round.len() {
            let round = by_round[i].0;
            let end = by_round[i..]
                .iter()
                .position(|(r, _)| *r != round)
                .map_or(by_round.len(), |n| i + n);
            if !batch.is_empty() && batch.len() + (end - i) > MAX_BATCH {
                break;
            }
            batch.extend(by_round[i..end].iter().map(|(_, c)| (*c).clone()));
            i = end;
            if batch.len() >= MAX_BATCH {
                break;
            }
        }
        batch.truncate(MAX_BATCH);
        batch
    }

    /// One store commit; on failure the error is recorded and a retry scheduled.
    fn commit_batch(&mut self, now: Instant, batch: &[Change]) -> bool {
        let started = Instant::now();
        match self.store.commit(batch) {
            Ok(()) => {
                let took = started.elapsed();
                if took > SLOW_COMMIT {
                    warn!(ms = took.as_millis() as u64, records = batch.len(), store = %self.store.describe(), "slow state commit");
                }
                self.committed(took, batch.len());
                true
            }
            Err(e) => {
                self.failures += 1;
                let message = e.to_string();
                if self.error.as_deref() != Some(message.as_str()) {
                    error!(store = %self.store.describe(), error = %message, pending = self.pending.len(),
                        "cannot write IKE state; holding IKE datagrams and retrying (ESP forwarding continues)");
                }
                self.error = Some(message);
                self.retry_at = Some(now + RETRY);
                false
            }
        }
    }

    /// Counts a successful commit of `records` records that took `took`.
    fn committed(&mut self, took: Duration, records: usize) {
        if self.latencies.len() == LATENCY_SAMPLES {
            self.latencies.pop_front();
        }
        self.latencies.push_back(took);
        self.latency.observe(took);
        self.commits += 1;
        self.records += records as u64;
    }

    /// When the next commit attempt is due, while one is pending.
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        self.retry_at.filter(|_| !self.pending.is_empty())
    }

    /// Holds a datagram until its state is durable.
    pub(crate) fn hold(&mut self, datagram: Held) {
        if self.held.len() == MAX_HELD {
            self.held.pop_front();
        }
        self.held.push_back(datagram);
    }

    /// True if datagrams are waiting.
    pub(crate) fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// The held datagrams, oldest first, once everything is durable.
    pub(crate) fn release(&mut self) -> Vec<Held> {
        if !self.pending.is_empty() {
            return Vec::new();
        }
        self.held.drain(..).collect()
    }

    /// Figures for status.
    pub(crate) fn stats(&self) -> StoreStats {
        let mut us: Vec<u64> = self
            .latencies
            .iter()
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .collect();
        us.sort_unstable();
        let pick = |q: f64| {
            if us.is_empty() {
                return 0;
            }
            let i = ((us.len() - 1) as f64 * q).round() as usize;
            us[i.min(us.len() - 1)]
        };
        StoreStats {
            backend: self.store.describe(),
            commits: self.commits,
            failures: self.failures,
            records_written: self.records,
            commit_us_p50: pick(0.5),
            commit_us_p99: pick(0.99),
            commit_latency: self.latency.clone(),
            held: self.held.len(),
            error: self.error.clone(),
            encryption: self.store.encryption().map(|mut e| {
                e.error.clone_from(&self.reseal_error);
                e
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use ike::IkeSpis;
    use wire::IkeSpi;

    /// A store that refuses batches larger than etcd's default limit, over a memory store.
    struct Limited {
        inner: MemoryStore,
        sizes: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl Store for Limited {
        fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
            self.sizes.lock().unwrap().push(changes.len());
            if changes.len() > 128 {
                return Err(StoreError::Write {
                    store: "limited".into(),
                    detail: "too many operations".into(),
                });
            }
            self.inner.commit(changes)
        }
        fn ike_sas(&self) -> Result<Vec<(u64, Snapshot)>, StoreError> {
            self.inner.ike_sas()
        }
        fn applied_config(&self) -> Result<Option<Snapshot>, StoreError> {
            self.inner.applied_config()
        }
        fn filters(&self) -> Result<Option<Snapshot>, StoreError> {
            self.inner.filters()
        }
        fn describe(&self) -> String {
            "limited".into()
        }
    }

    /// A persister over a [`Limited`] store: the persister, the store behind it, and the size
    /// of every commit tried.
    fn limited() -> (
        Persister,
        MemoryStore,
        std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    ) {
        let inner = MemoryStore::default();
        let sizes = std::sync::Arc::default();
        let p = Persister::new(Box::new(Limited {
            inner: inner.clone(),
            sizes: std::sync::Arc::clone(&sizes),
        }));
        (p, inner, sizes)
    }

    fn saved(spi: u64) -> StateChange {
        StateChange::Saved {
            spi: IkeSpi(spi),
            ike: IkeSpis {
                initiator: IkeSpi(spi),
                responder: IkeSpi(spi + 1),
            },
            tunnel: None,
            snapshot: Zeroizing::new(vec![spi as u8; 100]),
        }
    }

    #[test]
    fn the_changes_of_one_round_stay_in_one_commit() {
        let (mut p, inner, sizes) = limited();
        let now = Instant::now();
        inner.fail_commits(true);
        // Two rounds of 40 (say, rekeys changing an old and a new SA together) pile up.
        assert!(!p.save(now, (1..=40).map(saved).collect(), |_| String::new()));
        assert!(!p.save(now, (101..=140).map(saved).collect(), |_| String::new()));
        inner.fail_commits(false);
        assert!(p.save(now + RETRY, Vec::new(), |_| String::new()));
        let sizes = sizes.lock().unwrap().clone();
        // Not 64 + 16: a round is never split across commits unless it alone is too large.
        assert_eq!(sizes[sizes.len() - 2..], [40, 40], "{sizes:?}");
        assert_eq!(inner.ike_sas().unwrap().len(), 80);
        // Forgetting many at once (shutdown) also goes in bounded commits, at once.
        assert!(p.forget(now, (1..=40).chain(101..=140)));
        assert!(inner.ike_sas().unwrap().is_empty());
    }

    #[test]
    fn a_backlog_is_committed_in_bounded_batches() {
        let (mut p, inner, sizes) = limited();
        let now = Instant::now();
        // The store fails while 200 SAs change, as in an outage; then it works again.
        inner.fail_commits(true);
        assert!(!p.save(now, (1..=200).map(saved).collect(), |_| String::new()));
        p.hold(Held {
            local: "192.0.2.1:500".parse().unwrap(),
            remote: "192.0.2.2:500".parse().unwrap(),
            data: vec![1, 2, 3],
        });
        assert!(
            p.release().is_empty(),
            "nothing leaves while state is pending"
        );
        inner.fail_commits(false);
        assert!(
            !p.save(now, Vec::new(), |_| String::new()),
            "retry not due yet"
        );
        assert!(p.save(now + RETRY, Vec::new(), |_| String::new()));
        assert_eq!(inner.ike_sas().unwrap().len(), 200);
        let sizes = sizes.lock().unwrap().clone();
        assert!(sizes.iter().all(|&n| n <= MAX_BATCH), "{sizes:?}");
        assert_eq!(sizes[sizes.len() - 4..], [64, 64, 64, 8]);
        assert_eq!(p.release().len(), 1);
        let stats = p.stats();
        assert_eq!(
            (stats.records_written, stats.held, stats.error),
            (200, 0, None)
        );
        assert!(stats.failures >= 1);
    }

    fn key_id(record: &[u8]) -> u32 {
        crate::store::sealed_key_id(record).expect("a sealed record")
    }

    #[test]
    fn reencryption_runs_after_the_round_not_inside_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!(
            "protego-persist-reseal-test-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = dir.join("store.keys");
        let line = |id: u32, byte: &str| format!("{id} {}\n", byte.repeat(32));
        std::fs::write(&keys, line(1, "11")).unwrap();
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o600)).unwrap();
        let inner = MemoryStore::default();
        let sizes = std::sync::Arc::default();
        let limited = Limited {
            inner: inner.clone(),
            sizes: std::sync::Arc::clone(&sizes),
        };
        let options = crate::store::EncryptionOptions {
            key_file: Some(keys.clone()),
            accept_cleartext: false,
        };
        let sealed = crate::store::SealedStore::open(Box::new(limited), &options).unwrap();
        let mut p = Persister::new(Box::new(sealed));
        let start = Instant::now();
        assert!(p.save(start, (1..=20).map(saved).collect(), |_| String::new()));
        // The operator adds key 2, then rotates: 20 records are under the old key.
        std::fs::write(&keys, format!("{}{}", line(1, "11"), line(2, "22"))).unwrap();
        let rotation = p.rotate_key().unwrap();
        assert_eq!((rotation.key_id, rotation.generated), (2, false));
        let now = Instant::now();
        let commits =
            |sizes: &std::sync::Arc<std::sync::Mutex<Vec<usize>>>| sizes.lock().unwrap().len();
        // A round (an IKE exchange) commits its own change only: its datagrams must not wait
        // for re-encryption.
        let before = commits(&sizes);
        assert!(p.save(now, vec![saved(100)], |_| String::new()));
        assert_eq!(commits(&sizes) - before, 1, "only the round's own commit");
        assert_eq!(key_id(&inner.ike_sa(100).unwrap()), 2);
        assert!((1..=20).all(|spi| key_id(&inner.ike_sa(spi).unwrap()) == 1));
        // After the round: IKE datagrams waiting put it off, for a bounded time.
        assert!(p.reseal_at().is_some_and(|t| t <= now));
        assert!(!p.reseal(now, true));
        assert_eq!(commits(&sizes) - before, 1);
        let mut at = now + RESEAL_MAX_DEFER;
        assert!(p.reseal(at, true), "deferred long enough");
        assert_eq!(sizes.lock().unwrap().last(), Some(&RESEAL_BATCH));
        assert!(!p.reseal(at, false), "the next batch waits RESEAL_INTERVAL");
        while p.reseal_at().is_some() {
            at += RESEAL_INTERVAL;
            p.reseal(at, false);
        }
        assert!(sizes.lock().unwrap()[before..]
            .iter()
            .all(|&n| n <= RESEAL_BATCH));
        assert!((1..=20).all(|spi| key_id(&inner.ike_sa(spi).unwrap()) == 2));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn records_carry_their_write_time_and_tunnel() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let r = encode_record(at, "site-a", b"snapshot");
        let expected = Record {
            at,
            tunnel: "site-a",
            snapshot: b"snapshot",
        };
        assert_eq!(decode_record(&r), Ok(expected));
        assert!(decode_record(b"PST1").is_err());
        assert!(decode_record(b"XXXX1234567800snapshot").is_err());
        // A name longer than the record.
        let mut cut = encode_record(at, "site-a", b"");
        cut.truncate(HEADER + 2);
        assert!(decode_record(&cut).is_err());
    }
}
