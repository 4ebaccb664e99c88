//! [`EtcdStore`]: the distributed backend, for control nodes that share their IKE state through
//! an [etcd](https://etcd.io) v3 cluster; see its docs for the layout, the requests, and what
//! is left to the operator.

use super::etcd_access::{explain, token_refused};
use super::{Change, EtcdAccess, Snapshot, Store, StoreError};
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tracing::debug;
use zeroize::Zeroizing;

/// The schema version this build reads and writes.
pub(super) const SCHEMA_VERSION: u64 = 1;
/// The pause before a request to open the store is sent again, the first time.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause before a request to open the store is sent again.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// How many snapshots [`Store::ike_sas`] reads per request.
pub(super) const PAGE: i64 = 512;

mod connect;
mod ops;
mod routes;
pub use routes::{EtcdMedium, MAX_CHUNK};
/// The largest response accepted (a page of [`PAGE`] snapshots of up to 128 KiB each).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Options of the etcd backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client URLs, e.g. `["http://127.0.0.1:2379"]` (several for a cluster).
    pub endpoints: Vec<String>,
    /// Key prefix of this Protego cluster, e.g. `/protego/prod` (no trailing slash needed).
    pub prefix: String,
    /// Upper bound of each request (a commit, a page of a read), reconnecting included.
    pub timeout: Duration,
    /// Upper bound of opening the store ([`EtcdStore::connect`]): the first connection (TCP,
    /// TLS handshake, authentication) and writing or checking the schema key, tried again with
    /// backoff within this time. Longer than [`EtcdOptions::timeout`]: a node that starts
    /// while etcd, or the machine, is slow should wait for it rather than fail.
    pub connect_timeout: Duration,
    /// TLS and authentication ([`EtcdAccess::default`]: plain `http://`, no user).
    pub access: EtcdAccess,
}

/// The etcd store: the IKE state of one Protego cluster, under one key prefix in an
/// [etcd](https://etcd.io) v3 cluster (etcd 3.4 or newer) shared by its control nodes.
///
/// # Layout (schema version 1)
///
/// Every key of one Protego cluster lies under its prefix `P` (e.g. `/protego/prod`; a trailing
/// `/` is ignored), so several clusters can share one etcd without seeing each other's state:
///
/// - `P/schema`: the schema version as decimal text, `1`. The first store to connect to an empty
///   prefix writes it. A prefix with a newer version is refused ([`StoreError::RemoteSchema`]),
///   and so is one that holds keys but no valid schema key ([`StoreError::RemoteCorrupt`]): it
///   is another program's data, or damaged.
/// - `P/ike_sas/<SPI as 16 lowercase hex digits>`: one snapshot per IKE SA, the bytes as the
///   engine produced them. Fixed-width hex keys sort as the SPIs do, so a range read returns
///   the SAs in ascending SPI order.
/// - `P/config`: the configuration last applied with `protego ctl apply`
///   ([`crate::applied::AppliedConfig`], with the tunnels' PSKs), absent until the first apply.
///   A node reads it once, when it becomes the active control node.
/// - `P/filters`: the tenants' filters loaded with `protego ctl filter`
///   ([`crate::filters::FilterRecord`]), absent until the first load.
///
/// # Requests
///
/// - [`Store::commit`] is **one** etcd transaction (`Txn`) holding a put or delete per changed
///   SA (the last change of each SPI in the batch, which has the batch's effect; likewise for
///   `P/config` and `P/filters`), guarded by `P/schema` still being `1`, by the fence (the leader key, if the
///   store is [fenced](EtcdStore::fenced)) and by each written key's modification revision as
///   this store last saw it (read or written; 0 for a key it believes absent): etcd applies all
///   of it or none of it, and answers only once a quorum of its members has written it to their
///   logs (etcd fsyncs its log). If only a key's revision differs (an earlier commit of ours was
///   applied after all, or this store never read the key), the store reads the keys' revisions
///   and commits once more. An empty batch sends nothing.
/// - [`Store::ike_sas`] is a linearizable range read of `P/ike_sas/`, in pages of 512
///   keys that all read the same revision, so it sees exactly the state after one commit.
/// - Opening the store is bounded by [`EtcdOptions::connect_timeout`]: a connection that
///   fails is tried again after a pause that doubles (from 50 ms to 1 s), so a node started
///   while etcd is starting, or slow to make its first TLS handshake and authenticate, waits
///   for it. Every request after that (a commit, each page of a read, and the reconnecting it
///   may need) is bounded by [`EtcdOptions::timeout`]: a store whose etcd is down, partitioned or without a leader
///   fails within that time instead of hanging. Requests are sent with etcd's "require leader"
///   flag, so a member cut off from its quorum fails them at once. A request whose connection
///   fails (refused, reset, a member without a leader) is sent again on a new connection and
///   to the next endpoint, each endpoint at most twice; with several endpoints, one that does
///   not answer within its share of the remaining time (the time left divided by the endpoints
///   left to try) is skipped and its connection closed, as it may be stuck. So the store
///   carries on while a member is down, and works again once etcd is back, without being
///   reopened. Sending a request again is safe: a commit puts the same values again.
///
/// # Failed and ambiguous commits
///
/// A commit that never reached etcd (e.g. the connection was refused), or that etcd answered
/// with an error, applied nothing. A commit whose connection broke, or that timed out, after it
/// was sent is ambiguous, as with any remote database: etcd may have applied it, or may still
/// apply it. The control loop treats it as failed (it holds the datagrams and commits again),
/// which is safe: the same or newer states are written again, and a state written whose
/// datagrams were never sent is what a crash between commit and send leaves anyway. Should
/// etcd apply the ambiguous commit *after* a newer one (it sat in a member that was cut off),
/// its revision guards fail and it changes nothing: an older state never replaces a newer
/// one.
///
/// # Limits of etcd
///
/// etcd refuses a transaction with more than `--max-txn-ops` operations or comparisons
/// (default 128; a commit compares each written key, the schema and the fence, so up to about
/// 125 keys fit) or a request larger than `--max-request-bytes` (default 1.5 MiB). A batch that changes more SAs,
/// or more snapshot bytes, than that fails as a whole, with an error naming the setting; run
/// etcd with limits above the largest batch the control loop commits (e.g. when many SAs are
/// rekeyed in one round). etcd also keeps old revisions until they are compacted: run it with
/// `--auto-compaction-retention` and defragment it now and then, as etcd's documentation says.
///
/// # Security
///
/// Snapshots hold keys (see the [`store` module](super)): anyone who can read `P/` in etcd, or
/// etcd's data directory, its backups or its network traffic, can decrypt and forge the traffic
/// of every SA stored there (unless the store is sealed with an encryption key), and deleted
/// snapshots stay in etcd's history until it is compacted.
///
/// [`EtcdOptions::access`] secures the connections ([`EtcdAccess`]): with `https://` endpoints
/// the client verifies etcd's certificate against a CA of its own choosing (never the system's
/// roots) and may present a client certificate (etcd's `--client-cert-auth`); with a user, it
/// authenticates to etcd with its password and authenticates again whenever etcd says the
/// token expired or predates a change of users and roles (the request is sent again on a new
/// connection, which authenticates anew). A refusal fails [`EtcdStore::connect`] with an error
/// saying so: `TLS handshake refused by etcd` (etcd wants a client certificate it trusts; with
/// TLS 1.3 etcd may only close the connection, so the store then makes a TLS handshake of its
/// own to read etcd's alert), `TLS handshake refused: etcd's certificate does not verify`,
/// `authentication failed`, or `permission denied` (the user's role does not reach the
/// prefix). Plain `http://` is for an etcd reached over a path protected otherwise (loopback,
/// or IPsec).
///
/// Operators should run etcd with TLS on client and peer URLs, client certificates and
/// authentication, give the Protego nodes a user whose role may read and write their prefix
/// only, and protect etcd's data directory and backups like private keys (docs/operations.md,
/// "Securing etcd"). The snapshots' bytes, the client's private key and the password also pass
/// through gRPC's and rustls' buffers, which are not wiped after use.
///
/// # Threads
///
/// The [`Store`] methods block the calling thread on a private single-threaded Tokio runtime.
/// Called from inside an async runtime they fail (blocking there would stall it), and the store
/// must not be dropped there either.
pub struct EtcdStore {
    runtime: DetachedRuntime,
    clients: Mutex<Clients>,
    endpoints: Vec<String>,
    timeout: Duration,
    /// How each client connects: the timeout, "require leader", TLS and the etcd user.
    connect_options: ConnectOptions,
    keys: Keys,
    describe: String,
    /// The leadership every commit requires (the distributed form's active control node).
    fence: Option<super::Fence>,
    /// The modification revision this store last saw for each key it wrote or read (0: known
    /// absent). Every put or delete is guarded by it, so a commit that timed out and reaches
    /// etcd late, after a newer one, changes nothing (see [`EtcdStore::commit`]).
    revisions: Mutex<HashMap<String, i64>>,
}

/// A Tokio runtime that is shut down in the background when dropped: a plain drop waits for
/// its blocking tasks (the resolver's `getaddrinfo` calls), which with an unreachable DNS
/// server could hold the caller far beyond the configured timeout.
pub struct DetachedRuntime(std::mem::ManuallyDrop<tokio::runtime::Runtime>);

impl DetachedRuntime {
    /// Wraps `runtime`.
    pub fn new(runtime: tokio::runtime::Runtime) -> Self {
        Self(std::mem::ManuallyDrop::new(runtime))
    }
}

impl std::ops::Deref for DetachedRuntime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        &self.0
    }
}

impl Drop for DetachedRuntime {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here, and never used again.
        let runtime = unsafe { std::mem::ManuallyDrop::take(&mut self.0) };
        runtime.shutdown_background();
    }
}

/// One client per endpoint (each with its own connection), opened when first needed.
struct Clients {
    /// By endpoint, as in [`EtcdStore::endpoints`]; `None` until opened, and again after a
    /// failure.
    by_endpoint: Vec<Option<Client>>,
    /// The endpoint tried first: the one that answered last.
    current: usize,
}

/// What bounds one round of requests ([`EtcdStore::send`]): a deadline, and the setting it
/// comes from, for the messages.
struct Budget {
    deadline: std::time::Instant,
    /// The setting's value.
    length: Duration,
    /// The setting's name: `timeout` or `connect_timeout`.
    setting: &'static str,
    /// Whether a failure that may pass is tried again until the deadline (opening the store).
    retry: bool,
}

/// Why a round of requests failed.
struct Failure {
    /// Each endpoint's last failure, for a [`StoreError`]'s detail.
    detail: String,
    /// Whether sending again cannot help: etcd's own answer (a refused user, a permission),
    /// or a call from inside an async runtime.
    last: bool,
}

/// The keys of one prefix.
struct Keys {
    /// `P/schema`.
    schema: String,
    /// `P/ike_sas/`: the start of the IKE SAs' range, and the start of each of their keys.
    ike_sas: String,
    /// `P/ike_sas0` (`0` follows `/`): the end of the IKE SAs' range.
    ike_sas_end: String,
    /// `P/config`: the configuration applied with `protego ctl apply`.
    config: String,
    /// `P/filters`: the filters loaded with `protego ctl filter`.
    filters: String,
    /// `P/`: the start of the prefix's range.
    all: String,
    /// `P0`: the end of the prefix's range.
    all_end: String,
}

impl Keys {
    fn new(prefix: &str) -> Self {
        Keys {
            schema: format!("{prefix}/schema"),
            ike_sas: format!("{prefix}/ike_sas/"),
            ike_sas_end: format!("{prefix}/ike_sas0"),
            config: format!("{prefix}/config"),
            filters: format!("{prefix}/filters"),
            all: format!("{prefix}/"),
            all_end: format!("{prefix}0"),
        }
    }

    fn ike_sa(&self, spi: u64) -> String {
        format!("{}{spi:016x}", self.ike_sas)
    }
}

impl EtcdStore {
    /// The value of one key (`P/config`, `P/filters`), noting its revision for the guards.
    fn read_one(&self, key: &str) -> Result<Option<Snapshot>, StoreError> {
        let response = self
            .call(|mut client| {
                let key = key.to_owned();
                async move { client.get(key, None).await }
            })
            .map_err(|detail| self.read_error(detail))?;
        let kv = response.kvs().first();
        self.revisions().insert(
            key.to_owned(),
            kv.map_or(0, etcd_client::KeyValue::mod_revision),
        );
        Ok(kv.map(|kv| Zeroizing::new(kv.value().to_vec())))
    }

    /// Makes every commit conditional on `fence`: the election's leader key still names this
    /// node in the same term ([`super::Fence::compares`]). A deposed leader's commit
    /// then fails whole and writes nothing, whatever its own view of its role.
    pub fn fenced(mut self, fence: super::Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Runs one request, bounded by the timeout; the error is the cause, for a [`StoreError`]'s
    /// detail.
    ///
    /// Starts with the endpoint that answered last. A connection that fails (refused, reset,
    /// or a member without a leader) is dropped and the request is sent again, to the next
    /// endpoint, each endpoint at most twice (once on its old connection, once on a new one);
    /// so a member that is down, or a connection a restarted etcd left stale, costs nothing
    /// but a retry. While other endpoints are left to try, an endpoint gets an equal share of
    /// the remaining time; one that does not answer within it is dropped for this request, its
    /// connection closed (it may be stuck), and the request goes to the next. Every request
    /// this store sends can be repeated: a commit writes the same values again.
    fn call<T, F, Fut>(&self, request: F) -> Result<T, String>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_until(std::time::Instant::now() + self.timeout, request)
    }

    /// [`EtcdStore::call`] with a deadline of its own (to bound several requests together).
    fn call_until<T, F, Fut>(&self, deadline: std::time::Instant, request: F) -> Result<T, String>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.call_within(&self.budget(deadline), request)
    }

    /// The budget of requests bounded by the timeout, until `deadline`: sent once.
    fn budget(&self, deadline: std::time::Instant) -> Budget {
        Budget {
            deadline,
            length: self.timeout,
            setting: "timeout",
            retry: false,
        }
    }

    /// Sends `request` as [`EtcdStore::call`] does, within `budget`. A budget that retries
    /// (opening the store) sends it again, while the failure may pass (etcd not listening yet, a
    /// connection reset, a member without a leader, no answer in an endpoint's share of the
    /// time), after a pause that doubles from [`FIRST_RETRY_PAUSE`] to [`MAX_RETRY_PAUSE`],
    /// until the budget runs out.
    fn call_within<T, F, Fut>(&self, budget: &Budget, request: F) -> Result<T, String>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut pause = FIRST_RETRY_PAUSE;
        loop {
            match self.send(budget, &request) {
                Ok(answer) => return Ok(answer),
                Err(failure)
                    if budget.retry
                        && !failure.last
                        && std::time::Instant::now() + pause < budget.deadline =>
                {
                    debug!(store = %self.describe, failure = %failure.detail, pause = ?pause, "etcd not reached yet, trying again");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                }
                Err(failure) => return Err(failure.detail),
            }
        }
    }

    /// The value of the schema key, if there is one.
    fn read_schema(&self, budget: &Budget) -> Result<Option<Vec<u8>>, String> {
        let key = self.keys.schema.clone();
        let mut response = self.call_within(budget, |mut client| {
            let key = key.clone();
            async move { client.get(key, None).await }
        })?;
        Ok(response
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| kv.into_key_value().1))
    }

    /// One round of [`EtcdStore::call`] over the endpoints, within `budget`.
    fn send<T, F, Fut>(&self, budget: &Budget, request: &F) -> Result<T, Failure>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        use tokio::time::{timeout_at, Instant};
        if tokio::runtime::Handle::try_current().is_ok() {
            // Blocking on the store's runtime there would panic.
            let refusal = "called from inside an async runtime; the etcd store blocks, call it \
                           from a plain thread";
            return Err(Failure {
                detail: refusal.into(),
                last: true,
            });
        }
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let clients = &mut *clients;
        let count = self.endpoints.len();
        let options = &self.connect_options;
        // The last failure of each endpoint.
        let mut failures: Vec<Option<String>> = vec![None; count];
        let mut tried = vec![false; count];
        let mut timed_out = vec![false; count];
        let first = clients.current;
        let (length, setting) = (budget.length, budget.setting);
        let attempts = async {
            let deadline = Instant::from_std(budget.deadline);
            for attempt in 0..2 * count {
                let i = (first + attempt) % count;
                let now = Instant::now();
                if timed_out[i] || now >= deadline {
                    continue;
                }
                let untried = tried.iter().filter(|t| !**t).count();
                let share = (deadline - now) / u32::try_from(untried.max(1)).unwrap_or(1);
                let give_up = now + share;
                tried[i] = true;
                let too_slow = || {
                    if untried > 1 {
                        format!(
                            "no answer within {}ms (its share of the {length:?} {setting})",
                            share.as_millis(),
                        )
                    } else {
                        format!("no answer within the {length:?} {setting}")
                    }
                };
                let client = match &clients.by_endpoint[i] {
                    Some(client) => client.clone(),
                    // Lazy: this sends nothing, the request below connects (with a user, it
                    // authenticates first).
                    None => {
                        let endpoint = [&self.endpoints[i]];
                        let connect = Client::connect(endpoint, Some(options.clone()));
                        match timeout_at(give_up, connect).await {
                            Ok(Ok(client)) => clients.by_endpoint[i].insert(client).clone(),
                            Ok(Err(e)) if !retryable(&e) => {
                                // etcd refused the user or password: so would every member.
                                failures[i] = Some(cause(&e));
                                return Err(true);
                            }
                            Ok(Err(e)) => {
                                failures[i] = Some(cause(&e));
                                continue;
                            }
                            Err(_) => {
                                failures[i] = Some(too_slow());
                                timed_out[i] = true;
                                continue;
                            }
                        }
                    }
                };
                match timeout_at(give_up, request(client)).await {
                    Ok(Ok(answer)) => {
                        clients.current = i;
                        return Ok(answer);
                    }
                    Ok(Err(e)) if !retryable(&e) => {
                        // etcd's own answer: the same from any member.
                        clients.current = i;
                        failures[i] = Some(cause(&e));
                        return Err(true);
                    }
                    Ok(Err(e)) => {
                        clients.by_endpoint[i] = None;
                        failures[i] = Some(cause(&e));
                    }
                    Err(_) => {
                        // The connection may be stuck (e.g. a peer that vanished without
                        // closing it): a new one is opened next time, and the next call starts
                        // elsewhere.
                        clients.by_endpoint[i] = None;
                        clients.current = (i + 1) % count;
                        failures[i] = Some(too_slow());
                        timed_out[i] = true;
                    }
                }
            }
            Err(false)
        };
        // The timers are made inside the runtime, which they need.
        let outcome = self.runtime.block_on(attempts);
        outcome.map_err(|last| {
            let mut text = String::new();
            for (endpoint, failure) in self.endpoints.iter().zip(failures) {
                if let Some(failure) = failure {
                    if !text.is_empty() {
                        text.push_str("; ");
                    }
                    text.push_str(&format!("{endpoint}: {}", explain(failure)));
                }
            }
            if text.is_empty() {
                // The time ran out before a request could be sent.
                text = format!("no answer within the {length:?} {setting}");
            }
            Failure { detail: text, last }
        })
    }

    /// How many tasks the client's runtime holds (connections, balancers), to check that
    /// reconnecting does not pile them up.
    #[cfg(test)]
    pub(super) fn alive_tasks(&self) -> usize {
        self.runtime.metrics().num_alive_tasks()
    }

    /// The transaction that applies `ops` to `keys` (in the same order): guarded by the schema
    /// version, the fence (if any), and each key's modification revision as this store last
    /// saw it (0: absent), so that it applies only over the state this store wrote or read.
    pub(super) fn txn(&self, keys: &[&str], ops: Vec<TxnOp>) -> Txn {
        let mut guard = vec![Compare::value(
            self.keys.schema.clone(),
            CompareOp::Equal,
            SCHEMA_VERSION.to_string(),
        )];
        if let Some(fence) = &self.fence {
            guard.extend(fence.compares());
        }
        let known = self.revisions();
        guard.extend(keys.iter().map(|key| {
            let revision = known.get(*key).copied().unwrap_or(0);
            Compare::mod_revision(*key, CompareOp::Equal, revision)
        }));
        Txn::new().when(guard).and_then(ops)
    }

    fn revisions(&self) -> MutexGuard<'_, HashMap<String, i64>> {
        self.revisions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the modification revisions of `keys` (one linearizable transaction) and records
    /// them; true if any differed from what this store knew.
    fn learn_revisions(
        &self,
        keys: &[&str],
        deadline: std::time::Instant,
    ) -> Result<bool, StoreError> {
        let gets: Vec<TxnOp> = keys.iter().map(|key| TxnOp::get(*key, None)).collect();
        let txn = Txn::new().and_then(gets);
        let response = self
            .call_until(deadline, |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .map_err(|detail| {
                self.write_error(format!(
                    "nothing written: a key changed, and reading it failed: {detail}"
                ))
            })?;
        let mut found: HashMap<String, i64> = HashMap::new();
        for op in response.op_responses() {
            if let etcd_client::TxnOpResponse::Get(get) = op {
                for kv in get.kvs() {
                    found.insert(
                        String::from_utf8_lossy(kv.key()).into_owned(),
                        kv.mod_revision(),
                    );
                }
            }
        }
        let mut known = self.revisions();
        let mut changed = false;
        for key in keys {
            let now = found.get(*key).copied().unwrap_or(0);
            if known.get(*key).copied().unwrap_or(0) != now {
                changed = true;
            }
            known.insert((*key).to_owned(), now);
        }
        Ok(changed)
    }

    /// The SPI of an IKE SA's key.
    fn spi_of(&self, key: &[u8]) -> Result<u64, StoreError> {
        key.strip_prefix(self.keys.ike_sas.as_bytes())
            .filter(|hex| {
                hex.len() == 16
                    && hex
                        .iter()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
            })
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .ok_or_else(|| {
                self.corrupt(format!(
                    "unexpected key {:?} (IKE SA keys are {}<16 lowercase hex digits>)",
                    String::from_utf8_lossy(key),
                    self.keys.ike_sas
                ))
            })
    }

    fn schema_error(&self, found: u64) -> StoreError {
        StoreError::RemoteSchema {
            store: self.describe.clone(),
            found,
            supported: SCHEMA_VERSION,
        }
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::RemoteCorrupt {
            store: self.describe.clone(),
            detail,
        }
    }

    fn write_error(&self, detail: String) -> StoreError {
        StoreError::Write {
            store: self.describe.clone(),
            detail,
        }
    }

    fn read_error(&self, detail: String) -> StoreError {
        StoreError::Read {
            store: self.describe.clone(),
            detail,
        }
    }
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("store", &self.describe)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Why a schema key is not the one this build writes.
enum Mismatch {
    /// There is none.
    Missing,
    /// A newer version.
    Newer(u64),
    /// Not a version this build ever wrote, nor a newer one.
    Invalid(String),
}

/// Checks the value of the schema key.
fn schema_version(value: Option<&[u8]>) -> Result<(), Mismatch> {
    let value = value.ok_or(Mismatch::Missing)?;
    let text = std::str::from_utf8(value).unwrap_or_default();
    match text.parse::<u64>() {
        Ok(SCHEMA_VERSION) if text == "1" => Ok(()),
        Ok(found) if found > SCHEMA_VERSION && text == found.to_string() => {
            Err(Mismatch::Newer(found))
        }
        _ => Err(Mismatch::Invalid(
            String::from_utf8_lossy(value).into_owned(),
        )),
    }
}

/// An etcd client error as one line: the gRPC status code and message, and the root cause
/// (e.g. `Unavailable: tcp connect error: Connection refused (os error 111)`).
fn cause(e: &etcd_client::Error) -> String {
    use std::error::Error as _;
    let (mut text, mut source) = match e {
        etcd_client::Error::GRpcStatus(status) if status.message().is_empty() => {
            (format!("{:?}", status.code()), status.source())
        }
        etcd_client::Error::GRpcStatus(status) => (
            format!("{:?}: {}", status.code(), status.message()),
            status.source(),
        ),
        etcd_client::Error::TransportError(e) => (e.to_string(), e.source()),
        other => (other.to_string(), None),
    };
    // The intermediate layers (tonic's, hyper's) only repeat what failed.
    let mut root = None;
    while let Some(e) = source {
        root = Some(e);
        source = e.source();
    }
    if let Some(root) = root.map(|e| e.to_string()) {
        if !text.contains(&root) {
            text.push_str(": ");
            text.push_str(&root);
        }
    }
    text
}

/// Whether a request that failed so may succeed when sent again, on a new connection or to
/// another member: the connection failed, or the member could not serve it now (no leader,
/// leader changed, its proposal timed out).
fn retryable(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        // A token etcd no longer accepts: a new connection authenticates again.
        etcd_client::Error::GRpcStatus(status) if token_refused(status.message()) => true,
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
        ),
        _ => false,
    }
}

/// Adds the etcd setting to raise when etcd refused a transaction for its size.
fn limit_hint(detail: String, count: usize, bytes: usize) -> String {
    if detail.contains("too many operations in txn request") {
        format!(
            "{detail} (this commit changes {count} IKE SAs; raise etcd's --max-txn-ops above the \
             largest batch)"
        )
    } else if detail.contains("request is too large")
        || detail.contains("received message larger than max")
    {
        format!(
            "{detail} (this commit writes {bytes} snapshot bytes; raise etcd's \
             --max-request-bytes)"
        )
    } else {
        detail
    }
}
