//! Election of the active control node: several control nodes share one etcd (the one of
//! [`EtcdStore`]), and the holder of an etcd lease on one key is the leader; the others stand
//! by and take over when the leader's lease ends (a crash) or is given back ([`Election::resign`]).
//!
//! # Protocol
//!
//! Every node runs the same loop on a thread of its own ([`Election::start`]):
//!
//! 1. It **grants a lease** with the TTL of [`ElectionOptions::ttl`], and keeps it alive on one
//!    keep-alive stream: a keep-alive every TTL/3, each answer awaited at most TTL/3 (or the
//!    request timeout, if shorter); a keep-alive without an answer closes the connection, and
//!    the node connects again (to the next endpoint) and keeps the *same* lease alive there.
//! 2. It **campaigns** for the key `P/leader` (`P` is the store's prefix, e.g.
//!    `/protego/prod/leader`) with one transaction: *if the key's create revision is 0 (there is
//!    no such key), put the node's name under it, attached to the node's lease*. The node whose
//!    transaction succeeded is the leader; the key holds its name.
//! 3. It **watches** the key from the revision it read, so it misses no change. A node that sees
//!    the key deleted (the leader's lease expired or was revoked) campaigns again at once: the
//!    first transaction etcd applies wins, the others see its put on their watch.
//!
//! A standby waits on the watch rather than polling: it learns of the deletion within one
//! network round trip of etcd applying it, at no cost while nothing happens. Its own lease,
//! kept alive whatever its role, tells it whether etcd is reachable, and lets it campaign
//! with one request.
//!
//! # Terms and fencing
//!
//! A leader's [`Term`] is the create revision of its `P/leader` key: the revision of the whole
//! etcd store at which the key was created. Every creation gets a new revision, higher than
//! every earlier one, so every new leader has a higher term than all before it. A leader that
//! loses contact with etcd but gets it back before its lease expired (so no one else could have
//! been leader meanwhile) carries on in the same term.
//!
//! A node can act on its role only after asking for it; by then a leader may have been
//! deposed (it froze after the answer, or the key was deleted by hand). Writes that must only
//! come from the current leader are therefore **fenced**: the etcd transaction that makes them
//! adds the [`Fence`] of the term they were made in ([`Election::fence`]) to its guard, i.e.
//! *`P/leader`'s create revision is the term* and *its value is this node's name*. A deposed
//! leader's transaction then fails as a whole and writes nothing, whatever its clock says,
//! since a new leader's key has another create revision. The [`EtcdStore`] of the active
//! control node is fenced so ([`EtcdStore::fenced`]): every commit's guard holds
//! [`Fence::compares`].
//!
//! # Safety: a leader steps down before its lease can expire
//!
//! etcd sets a lease's expiry to *TTL after it applies a grant or keep-alive*, measured on the
//! clock of etcd's leader. That happens after the node sent the request: so if the node sent a
//! keep-alive at `t` (on its own monotonic clock) and it was answered, the lease cannot expire
//! before `t + TTL` (real time), whatever the network delays. The node takes itself to hold the
//! lease until `t + TTL − margin` only, with a margin of TTL/5 (200 ms for 1 s), and
//! [`Election::role`] compares that deadline with the clock **at every call**, so it stops
//! answering [`Role::Leader`] at the deadline even if the election thread is stuck; the thread
//! also reports the change ([`RoleChange`]) then. A leader whose keep-alives fail for
//! longer than that (etcd down, partitioned or frozen, or this node's thread stalled) thus
//! stops believing it leads at least `margin` before etcd can delete its key, which must happen
//! before anyone else can become leader. The margin covers a difference in the rates of the
//! two machines' clocks (crystals drift by well under 0.1 %, the margin is 20 %) and the
//! scheduling delay between the deadline and the thread's report. It does not cover a caller
//! that holds on to an answer of [`Election::role`]: that is what fencing is for.
//!
//! etcd's lessor never brings back an expired lease (a keep-alive of an expired lease is
//! refused), and a change of etcd leader only lengthens leases, so neither breaks the argument.
//! The key is removed by three things only: the lease's expiry (covered above), a resign (the
//! leader stops first), and a delete by hand, which may let another node lead while this one
//! has not yet seen the deletion on its watch (milliseconds); fencing covers that case too.
//!
//! # Timing
//!
//! With the default TTL of 1 s: keep-alives every 333 ms, the leader's role valid until 800 ms
//! after its last answered keep-alive was sent. After a crash (`kill -9`) of the leader, its
//! lease expires on etcd between TTL − TTL/3 and TTL after the crash (the last keep-alive was
//! sent up to TTL/3 before it); etcd 3.4 then revokes expired leases in a sweep that runs every
//! 500 ms, which deletes the key; the standby sees the deletion on its watch and wins with one
//! transaction (a millisecond on a LAN). A standby thus takes over **0.67 to 1.5 s** after the
//! crash (about 1.1 s on average; measured on a local etcd: 0.79 to 1.47 s, mean 1.12 s), so the
//! 1 s goal holds only on average. A graceful stop ([`Election::resign`]) hands over in a few
//! milliseconds.
//!
//! A shorter takeover needs a shorter TTL, but etcd's leases have whole seconds, and **etcd
//! raises a shorter TTL to its minimum: 1.5 × its election timeout, rounded up to whole
//! seconds**. With etcd's default election timeout (1000 ms) that is 2 s, and a crash is then
//! taken over after 1.3 to 2.5 s; for 1 s leases run etcd with `--election-timeout` of at
//! most 700 ms (with the default `--heartbeat-interval` of 100 ms), which suits a cluster on
//! a LAN. The node uses the TTL etcd granted ([`Election::granted_ttl`]) and logs a warning
//! when it is longer than asked. etcd 3.4 has no option to lower its 500 ms sweep.
//!
//! # When etcd is unreachable
//!
//! Every request is bounded by [`ElectionOptions::timeout`] (each keep-alive by TTL/3 as well).
//! A node that cannot reach etcd reports [`Role::Unknown`] once its deadline passes, whether it
//! was leader or standby, and tries again: at once on the next endpoint, and every 100 ms once
//! each endpoint has failed in a row. So while etcd is down no node is leader, and once it is
//! back (and a lease has expired or survived) one is again within a few hundred milliseconds.
//!
//! # The store's prefix
//!
//! [`Election::start`] first opens an [`EtcdStore`] on the same prefix (and closes it): that
//! writes the schema key into an empty prefix, or checks the one there, so the store and the
//! election can start in either order, and an election never runs on a prefix that belongs
//! to a newer Protego or to another program. `P/leader` lies outside the store's `P/ike_sas/`.
//!
//! The election connects as the store does ([`ElectionOptions::access`], the store's
//! [`EtcdAccess`]): TLS to `https://` endpoints with the same CA and client certificate, and the
//! same etcd user, whose token is fetched again whenever etcd says it expired (every failed
//! session also reconnects, which authenticates anew). The user's role must allow read and
//! write under the prefix: the leader key, the lease attached to it, and its revocation all lie
//! there. Node names must be unique: two nodes of one name would both show as that leader.

use control::store::{explain_etcd_error, EtcdAccess, EtcdOptions, EtcdStore, StoreError};
/// The leader's term and the fence of its writes, which the store checks (defined with it).
pub use control::store::{Fence, Term};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, KeyValue, LeaseKeepAliveStream, LeaseKeeper,
    PutOptions, Txn, TxnOp, WatchOptions, WatchResponse, WatchStream,
};
use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The default lease TTL: the shortest etcd grants (see the [module docs](self) for the etcd
/// settings it needs).
pub const DEFAULT_TTL: Duration = control::store::DEFAULT_LEASE_TTL;
/// The default bound of each request to etcd.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(500);
/// Default [`ElectionOptions::connect_timeout`]: the store's default `[store] connect_timeout`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = control::config::DEFAULT_ETCD_CONNECT_TIMEOUT;
/// The longest lease TTL accepted.
const MAX_TTL: Duration = Duration::from_secs(3600);
/// The longest node name accepted, in bytes.
const MAX_NAME: usize = 256;
/// The pause before trying again once every endpoint has failed in a row.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How many role changes wait in the channel before new ones are dropped.
const CHANGES_CAPACITY: usize = 64;

/// Options of an [`Election`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionOptions {
    /// Client URLs of the etcd cluster, e.g. `["http://127.0.0.1:2379"]`.
    pub endpoints: Vec<String>,
    /// Key prefix of this Protego cluster, the same as the store's (e.g. `/protego/prod`); the
    /// leader key is `<prefix>/leader`.
    pub prefix: String,
    /// This node's name, unique among the control nodes of the cluster (the leader key's
    /// value).
    pub name: String,
    /// The lease TTL: whole seconds, at least 1 s ([`DEFAULT_TTL`]). A crashed leader is
    /// replaced between 2/3 TTL and TTL + 0.5 s after its crash.
    pub ttl: Duration,
    /// Upper bound of each request to etcd (connecting, a grant, a campaign, a resign);
    /// [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// Upper bound of [`Election::start`]'s first connection to etcd (TCP, TLS, authentication)
    /// and its check of the prefix, tried again with backoff within it (the store's
    /// `connect_timeout`); [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
    /// TLS and authentication, the same as the store's ([`EtcdAccess::default`]: plain
    /// `http://`, no user).
    pub access: EtcdAccess,
}

impl ElectionOptions {
    /// Options with the default TTL and timeout.
    pub fn new(endpoints: Vec<String>, prefix: impl Into<String>, name: impl Into<String>) -> Self {
        ElectionOptions {
            endpoints,
            prefix: prefix.into(),
            name: name.into(),
            ttl: DEFAULT_TTL,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            access: EtcdAccess::default(),
        }
    }
}

/// What this node is, as far as it knows now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// This node holds the leader key, and its lease surely has not expired.
    Leader {
        /// When this node won the term.
        since: Instant,
        /// The term, to fence its writes with ([`Election::fence`]).
        term: Term,
    },
    /// Another node leads, or no one does right now (the key is being taken over).
    Standby {
        /// The leader's name, if there is one and this node knows it.
        leader: Option<String>,
    },
    /// This node cannot tell: etcd has not answered its keep-alives in time (or it has not
    /// reached etcd yet). It must not act as leader.
    Unknown,
}

impl Role {
    /// Whether this is [`Role::Leader`].
    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader { .. })
    }
}

/// A change of this node's role, sent on [`Election::changes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleChange {
    /// The role before.
    pub previous: Role,
    /// The role now.
    pub role: Role,
}

/// Why an election could not start, or could not resign.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The options are invalid.
    #[error("leader election {election}: invalid options: {detail}")]
    Options {
        /// The election (endpoints, prefix, node).
        election: String,
        /// What is wrong.
        detail: String,
    },
    /// The store's prefix could not be checked (etcd unreachable, a newer schema, another
    /// program's keys).
    #[error("leader election {election}: {source}")]
    Store {
        /// The election (endpoints, prefix, node).
        election: String,
        /// The store's error.
        source: StoreError,
    },
    /// The election's thread or its runtime could not be started.
    #[error("leader election {election}: cannot start: {detail}")]
    Start {
        /// The election (endpoints, prefix, node).
        election: String,
        /// What failed.
        detail: String,
    },
    /// The lease could not be revoked; other nodes take over when it expires.
    #[error(
        "leader election {election}: cannot revoke the lease (it expires by itself within \
         {ttl:?}): {detail}"
    )]
    Resign {
        /// The election (endpoints, prefix, node).
        election: String,
        /// The lease's TTL.
        ttl: Duration,
        /// What failed.
        detail: String,
    },
}

/// The election of one control node; see the [module docs](self).
///
/// Dropping it stops its thread at once, **without** revoking the lease (like a crash: the
/// other nodes take over when the lease expires); call [`Election::resign`] on a graceful stop.
pub struct Election {
    shared: Arc<Shared>,
    changes: Receiver<RoleChange>,
    thread: Option<JoinHandle<Result<(), String>>>,
    key: String,
    name: String,
    describe: String,
    ttl: Duration,
}

impl Election {
    /// Checks the options and the store's prefix (see the [module docs](self)), starts the
    /// election's thread, and waits until this node knows its role, at most
    /// [`ElectionOptions::timeout`]; if it does not by then, [`Election::role`] answers
    /// [`Role::Unknown`] and the thread keeps trying.
    ///
    /// Fails if the options are invalid, if etcd cannot be reached within the timeout, or if
    /// the prefix belongs to a newer Protego or another program. Call it from a plain thread,
    /// not from inside an async runtime.
    pub fn start(options: &ElectionOptions) -> Result<Election, ElectionError> {
        let prefix = options.prefix.trim_end_matches('/');
        let describe = format!(
            "etcd {} prefix {prefix} node {:?}",
            options.endpoints.join(","),
            options.name
        );
        let invalid = |detail: &str| ElectionError::Options {
            election: describe.clone(),
            detail: detail.to_owned(),
        };
        if options.name.is_empty() || options.name.len() > MAX_NAME {
            return Err(invalid(&format!(
                "the node name must have 1 to {MAX_NAME} bytes"
            )));
        }
        if options.name.chars().any(char::is_control) {
            return Err(invalid("the node name must not hold control characters"));
        }
        if options.ttl < Duration::from_secs(1)
            || options.ttl > MAX_TTL
            || options.ttl.subsec_nanos() != 0
        {
            return Err(invalid(&format!(
                "the lease TTL must be whole seconds from 1 s to {MAX_TTL:?} (etcd's leases \
                 have whole seconds), not {:?}",
                options.ttl
            )));
        }
        if options.timeout.is_zero() {
            return Err(invalid("the timeout must not be zero"));
        }
        if options.connect_timeout.is_zero() {
            return Err(invalid("the connect_timeout must not be zero"));
        }
        // Checks the endpoints and the prefix as the store does, and writes or checks the
        // schema key.
        let store = EtcdStore::connect(&EtcdOptions {
            endpoints: options.endpoints.clone(),
            prefix: prefix.to_owned(),
            timeout: options.timeout,
            connect_timeout: options.connect_timeout.max(options.timeout),
            access: options.access.clone(),
        })
        .map_err(|source| ElectionError::Store {
            election: describe.clone(),
            source,
        })?;
        drop(store);

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ElectionError::Start {
                election: describe.clone(),
                detail: format!("cannot start the client's runtime: {e}"),
            })?;
        let key = format!("{prefix}/leader");
        let shared = Arc::new(Shared {
            published: Mutex::new(Published {
                role: Role::Unknown,
                valid_until: None,
                notified: Role::Unknown,
                granted_ttl: None,
            }),
            signal: Mutex::new(Signal::default()),
        });
        let (changes_tx, changes) = crossbeam_channel::bounded(CHANGES_CAPACITY);
        let (ready_tx, ready) = crossbeam_channel::bounded(1);
        let worker = Worker {
            endpoints: options.endpoints.clone(),
            key: key.clone(),
            name: options.name.clone(),
            ttl: options.ttl,
            timeout: options.timeout,
            connect_options: options
                .access
                .connect_options(options.timeout)
                .with_require_leader(true),
            shared: shared.clone(),
            changes: changes_tx,
            ready: ready_tx,
            next: 0,
            client: None,
            lease: None,
            holder: Holder::Unknown,
            warned_ttl: false,
        };
        let thread = std::thread::Builder::new()
            .name("protego-election".into())
            .spawn(move || {
                let runtime = control::store::DetachedRuntime::new(runtime);
                runtime.block_on(worker.run())
            })
            .map_err(|e| ElectionError::Start {
                election: describe.clone(),
                detail: format!("cannot start thread protego-election: {e}"),
            })?;
        let election = Election {
            shared,
            changes,
            thread: Some(thread),
            key,
            name: options.name.clone(),
            describe,
            ttl: options.ttl,
        };
        // Either a role is known, or the time is up (the thread carries on).
        let _ = ready.recv_timeout(options.timeout);
        Ok(election)
    }

    /// This node's role now. A leader's answer is computed from its lease's deadline at each
    /// call, so it turns to [`Role::Unknown`] on time even if the election thread is stuck.
    pub fn role(&self) -> Role {
        self.shared.published().effective(Instant::now())
    }

    /// Whether this node is the leader now (see [`Election::role`]).
    pub fn is_leader(&self) -> bool {
        self.role().is_leader()
    }

    /// Wakes the control loop on every change of role. The message says what changed, but a
    /// full channel (more than 64 unread changes) drops new ones, and a leader's role may
    /// have timed out since: always act on [`Election::role`]. The channel disconnects when
    /// the election stops.
    pub fn changes(&self) -> &Receiver<RoleChange> {
        &self.changes
    }

    /// What this node's fenced writes must check, if it is the leader now.
    pub fn fence(&self) -> Option<Fence> {
        match self.role() {
            Role::Leader { term, .. } => Some(Fence {
                key: self.key.clone(),
                name: self.name.clone(),
                term,
            }),
            Role::Standby { .. } | Role::Unknown => None,
        }
    }

    /// The lease TTL etcd granted (longer than asked if etcd's minimum is; see the
    /// [module docs](self)); `None` before the first grant.
    pub fn granted_ttl(&self) -> Option<Duration> {
        self.shared.published().granted_ttl
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Stops the election for a graceful stop: this node stops being leader at once, then its
    /// lease is revoked, which deletes its leader key, so a standby takes over within
    /// milliseconds instead of waiting for the lease to expire. Bounded by the timeout; if the
    /// revoke fails, the lease expires by itself within its TTL.
    pub fn resign(mut self) -> Result<(), ElectionError> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.shared.signal(|s| {
            s.stop.get_or_insert(Stop::Resign);
        });
        let outcome = match thread.join() {
            Ok(outcome) => outcome,
            Err(_) => Err("the election thread panicked".into()),
        };
        outcome.map_err(|detail| ElectionError::Resign {
            election: self.describe.clone(),
            ttl: self.ttl,
            detail,
        })
    }

    /// Simulates a frozen or cut-off node: its thread stops talking to etcd (as if killed),
    /// but this handle still answers [`Election::role`], which must turn to
    /// [`Role::Unknown`] before any other node becomes leader.
    #[cfg(test)]
    pub(crate) fn freeze(&self) {
        self.shared.signal(|s| s.frozen = true);
    }
}

impl Drop for Election {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.shared.signal(|s| {
                s.stop.get_or_insert(Stop::Abandon);
            });
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("election", &self.describe)
            .field("role", &self.role())
            .finish_non_exhaustive()
    }
}

/// State shared by the handle and the thread.
struct Shared {
    published: Mutex<Published>,
    signal: Mutex<Signal>,
}

impl Shared {
    fn published(&self) -> MutexGuard<'_, Published> {
        self.published
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the signal and wakes the thread.
    fn signal(&self, change: impl FnOnce(&mut Signal)) {
        let waker = {
            let mut signal = self.signal.lock().unwrap_or_else(PoisonError::into_inner);
            change(&mut signal);
            signal.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Ready with the signal the thread must obey (those `accept` lets through).
    fn poll_signal(&self, cx: &mut Context<'_>, accept: Accept) -> Poll<Interrupt> {
        let mut signal = self.signal.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(stop) = signal.stop {
            return Poll::Ready(Interrupt::Stop(stop));
        }
        if signal.frozen && accept == Accept::All {
            return Poll::Ready(Interrupt::Freeze);
        }
        signal.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// What the handle answers.
struct Published {
    /// The role while `valid_until` lies ahead.
    role: Role,
    /// Until when the lease surely lives (its last answered keep-alive's sending plus the TTL,
    /// minus the margin); `None` without a lease.
    valid_until: Option<Instant>,
    /// The role last sent on the channel.
    notified: Role,
    /// The TTL etcd granted.
    granted_ttl: Option<Duration>,
}

impl Published {
    fn effective(&self, now: Instant) -> Role {
        match self.valid_until {
            Some(until) if now < until => self.role.clone(),
            _ => Role::Unknown,
        }
    }
}

/// What the handle asks of the thread.
#[derive(Default)]
struct Signal {
    stop: Option<Stop>,
    /// Test only: stop talking to etcd.
    frozen: bool,
    waker: Option<Waker>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Revoke the lease, then stop.
    Resign,
    /// Stop at once.
    Abandon,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interrupt {
    Stop(Stop),
    Freeze,
}

/// Which signals end a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accept {
    All,
    StopOnly,
    Nothing,
}

/// How a wait ended.
enum Waited<T> {
    Done(T),
    Interrupted(Interrupt),
    TimedOut,
}

/// Why a session with etcd ended.
#[derive(Debug)]
enum Failure {
    Interrupted(Interrupt),
    /// etcd no longer knows this node's lease (it expired or was revoked).
    LeaseGone,
    /// A request failed or was not answered in time; what, for the log.
    Etcd(String),
}

/// A wake-up of a session.
enum Event {
    KeepAlive(Result<Option<etcd_client::LeaseKeepAliveResponse>, etcd_client::Error>),
    Watch(Result<Option<WatchResponse>, etcd_client::Error>),
}

/// Who holds the leader key, as far as this node knows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Holder {
    /// Not known (not read yet, or another node won a campaign and its put is on its way).
    Unknown,
    /// No one: the key is absent.
    Nobody,
    /// This node, with its lease.
    Us { term: Term, since: Instant },
    /// Another node (or a key this node did not write).
    Other { name: String },
}

/// This node's lease.
struct Lease {
    id: i64,
    /// The TTL etcd granted.
    ttl: Duration,
    /// See [`Published::valid_until`].
    valid_until: Instant,
}

/// The election's thread.
struct Worker {
    endpoints: Vec<String>,
    key: String,
    name: String,
    /// The TTL asked for.
    ttl: Duration,
    timeout: Duration,
    /// How each connection is made: the timeout, "require leader", TLS and the etcd user.
    connect_options: ConnectOptions,
    shared: Arc<Shared>,
    changes: Sender<RoleChange>,
    /// Told once the role is known.
    ready: Sender<()>,
    /// The endpoint of the next connection.
    next: usize,
    client: Option<Client>,
    lease: Option<Lease>,
    holder: Holder,
    warned_ttl: bool,
}

#[cfg(test)]
mod tests;

mod worker;
