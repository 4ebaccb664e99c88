//! The control loop: one thread that owns the sans-IO [`ike::Endpoint`] and drives it with the
//! clock, the IKE datagrams the data plane hands up ([`ToControl`]) and operator commands, then
//! carries out what the engine asks for: datagrams go out through [`DataPath::send_ike`], CHILD_SA
//! events become [`DataPath::install_child`] / [`DataPath::remove_child`] /
//! [`DataPath::update_peer`] calls, and every tunnel state change becomes one structured log line
//! (RFC 7296 §1.3 CHILD_SA creation, §1.3.2/§2.8 rekeying, §1.4 deletion, §2.4 liveness).
//!
//! The order of calls follows the engine's contract: input (`handle_datagram`, `handle_timeout`,
//! commands), then drain `poll_event` and `poll_transmit` (events first, so SAs reach the data
//! path before the messages that let the peer use them) until both are empty, then sleep until
//! `poll_timeout` or the next input.

mod apply;
mod driver;
mod events;
mod persist;

pub use persist::{CommitLatency, StoreStats, COMMIT_BUCKETS_US};

use crate::config::Config;
use crate::error::Error;
use crate::keylog::KeyLog;
use crate::status::format_ts;
use crate::store::Store;
use crossbeam_channel::{bounded, Receiver, Select, Sender};
use datapath::{DataPath, ToControl};
use ike::{
    DeleteReason, DpdAction, Endpoint, Event, IkeSaStatus, IkeSpis, IkeStats, StartAction, TunnelId,
};
use persist::{decode_record, Held, Persister};
use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};

/// How long a command waits for the control loop to answer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an apply may take: its store commit (bounded by the store's own timeout) and the
/// engine's work for every changed tunnel.
const APPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest IKE datagram the engine may write (RFC 7296 §2 recommends supporting 3000 octets;
/// fragmentation-free messages with many proposals stay well below this).
const TRANSMIT_BUFFER: usize = 65_536;

/// A request to the control loop.
enum Command {
    /// The IKE report of every tunnel, or (`Some`) of one.
    Status(Option<TunnelId>, Sender<IkeReport>),
    StoreStats(Sender<StoreStats>),
    RotateStoreKey(Sender<Result<crate::store::KeyRotation, crate::store::StoreError>>),
    Initiate(TunnelId, Sender<Result<(), CommandFailure>>),
    Terminate(TunnelId, Sender<Result<(), CommandFailure>>),
    RekeyChild(TunnelId, Sender<Result<(), CommandFailure>>),
    RekeyIke(TunnelId, Sender<Result<(), CommandFailure>>),
    AddChild(TunnelId, Sender<Result<(), CommandFailure>>),
    DeleteChild(wire::EspSpi, Sender<Result<(), CommandFailure>>),
    Apply(Box<ApplyRequest>, Sender<Result<ApplyOutcome, Error>>),
    FilterState(Sender<Result<FilterState, Error>>),
    CommitFilters(
        Vec<datapath::FilterConfig>,
        Sender<Result<FilterCommit, Error>>,
    ),
    CommitMapSetting(
        ids::TenantId,
        String,
        datapath::FilterMapOp,
        Sender<Result<Option<FilterCommit>, Error>>,
    ),
    Shutdown {
        grace: Duration,
    },
    /// Stop at once without deleting anything (a hand-over to another control node; tests
    /// of the restore).
    Abort,
}

/// Why the loop refused a command.
enum CommandFailure {
    ShuttingDown,
    Engine(ike::Error),
}

/// A new inventory for a running node (`protego ctl apply`), see [`ControlHandle::apply`].
pub struct ApplyRequest {
    /// The tenants, VNets and tunnels as a configuration file gives them (node-wide tables in
    /// it are ignored, see [`Config::with_inventory`]); stored as given.
    pub text: String,
    /// Where it was read: relative `psk_file`s are looked up in its directory; stored, for
    /// messages.
    pub source: std::path::PathBuf,
    /// Only say what would change.
    pub dry_run: bool,
}

/// What an apply did (or, dry, would do).
#[derive(Debug, Clone)]
pub struct ApplyOutcome {
    /// The changes.
    pub plan: crate::config::ConfigPlan,
    /// The stored configuration's generation after the apply (unchanged by a dry run or an
    /// apply that changes nothing).
    pub generation: u64,
    /// The configuration now running (with the tunnels' final ids).
    pub config: Config,
}

/// The running filter set and what a change of it is checked against
/// ([`ControlHandle::filter_state`]).
#[derive(Debug, Clone)]
pub struct FilterState {
    /// The filters running now.
    pub filters: Vec<datapath::FilterConfig>,
    /// The tenants running now.
    pub tenants: Vec<ids::TenantId>,
    /// The stored set's generation (0: none stored, the file's `[[filter]]` tables run).
    pub generation: u64,
}

/// A stored change of the filter set or of its map settings.
#[derive(Debug, Clone)]
pub struct FilterCommit {
    /// The stored record's generation.
    pub generation: u64,
    /// The map settings it holds.
    pub settings: Vec<datapath::FilterMapSetting>,
}

/// What the control loop knows of IKE, read in one go (`protego status`, metrics).
#[derive(Debug, Clone, Default)]
pub struct IkeReport {
    /// The engine's IKE SAs.
    pub sas: Vec<IkeSaStatus>,
    /// Its counters of dropped IKE datagrams.
    pub drops: IkeStats,
    /// Per tunnel, what happened to it since the control loop started.
    pub events: HashMap<TunnelId, crate::status::TunnelEvents>,
}

/// A cloneable handle for talking to a running control loop (status server, signal handler).
#[derive(Clone)]
pub struct ControlHandle {
    commands: Sender<Command>,
}

impl ControlHandle {
    /// The engine's current IKE SA table.
    pub fn ike_status(&self) -> Result<Vec<IkeSaStatus>, Error> {
        self.ike_report().map(|r| r.sas)
    }

    /// The engine's IKE SA table, its counters of dropped IKE datagrams and the tunnels'
    /// event counters, read together.
    pub fn ike_report(&self) -> Result<IkeReport, Error> {
        self.ike_report_of(None)
    }

    /// [`ControlHandle::ike_report`] of one tunnel (its SAs and events; the drop counters
    /// are the engine's), or of every tunnel with `None`.
    pub fn ike_report_of(&self, tunnel: Option<TunnelId>) -> Result<IkeReport, Error> {
        self.ike_report_pending(tunnel)?.wait()
    }

    /// [`ControlHandle::ike_report_of`], asked now and waited for later.
    pub fn ike_report_pending(
        &self,
        tunnel: Option<TunnelId>,
    ) -> Result<Pending<IkeReport>, Error> {
        self.ask(COMMAND_TIMEOUT, |tx| Command::Status(tunnel, tx))
    }

    /// The state store's figures (backend, commits, latency, failures).
    pub fn store_stats(&self) -> Result<StoreStats, Error> {
        self.store_stats_pending()?.wait()
    }

    /// [`ControlHandle::store_stats`], asked now and waited for later.
    pub fn store_stats_pending(&self) -> Result<Pending<StoreStats>, Error> {
        self.ask(COMMAND_TIMEOUT, Command::StoreStats)
    }

    /// Makes a new store encryption key current (`protego ctl store rotate-key`: the key file's
    /// last key if the operator appended one, else a generated one): new records are sealed with it at once, and the records under older keys
    /// are re-encrypted in the background (`protego status` shows the progress).
    pub fn rotate_store_key(&self) -> Result<crate::store::KeyRotation, Error> {
        self.ask(COMMAND_TIMEOUT, Command::RotateStoreKey)?
            .wait()?
            .map_err(Error::Store)
    }

    /// Initiates the tunnel now (`swanctl --initiate`).
    pub fn initiate(&self, tunnel: TunnelId) -> Result<(), Error> {
        self.request("initiate", tunnel, |tx| Command::Initiate(tunnel, tx))
    }

    /// Deletes the tunnel's SAs, telling the peer (`swanctl --terminate`).
    pub fn terminate(&self, tunnel: TunnelId) -> Result<(), Error> {
        self.request("terminate", tunnel, |tx| Command::Terminate(tunnel, tx))
    }

    /// Starts rekeying the tunnel's CHILD_SA now (`swanctl --rekey --child`); returns once
    /// the request is queued, not when the rekey is done.
    pub fn rekey_child(&self, tunnel: TunnelId) -> Result<(), Error> {
        self.request("rekey", tunnel, |tx| Command::RekeyChild(tunnel, tx))
    }

    /// Creates one more CHILD_SA of the tunnel beside those in use (same selectors, its own
    /// keys and sequence numbers; issue 19 §2: one per data node that serves the tunnel);
    /// returns once the request is queued.
    pub fn add_child(&self, tunnel: TunnelId) -> Result<(), Error> {
        self.request("add-child", tunnel, |tx| Command::AddChild(tunnel, tx))
    }

    /// Deletes the tunnel's CHILD_SA with this inbound SPI with the peer, leaving its other
    /// CHILD_SAs and the IKE SA; returns once the request is queued.
    pub fn delete_child(&self, tunnel: TunnelId, inbound_spi: wire::EspSpi) -> Result<(), Error> {
        self.request("delete-child", tunnel, |tx| {
            Command::DeleteChild(inbound_spi, tx)
        })
    }

    /// Starts rekeying the tunnel's IKE SA now (`swanctl --rekey --ike`); returns once the
    /// request is queued.
    pub fn rekey_ike(&self, tunnel: TunnelId) -> Result<(), Error> {
        self.request("rekey-ike", tunnel, |tx| Command::RekeyIke(tunnel, tx))
    }

    /// Replaces the running tenants, VNets and tunnels (see [`ApplyRequest`]), validated whole
    /// against this node's own `[gateway]` first: tunnels keep their ids by name, and new ones
    /// get fresh ids. The data path checks the new VNets and
    /// bindings, the store keeps the new configuration ([`crate::applied`]), and only then
    /// removed tunnels are deleted (the peers are told), changed ones updated or renegotiated
    /// (see [`crate::config::ConfigPlan`]), new ones added, and the data path's VNets and
    /// bindings replaced. On an error nothing changed.
    pub fn apply(&self, request: ApplyRequest) -> Result<ApplyOutcome, Error> {
        self.ask(APPLY_TIMEOUT, |tx| Command::Apply(Box::new(request), tx))?
            .wait()?
    }

    /// The running filter set, the running tenants and the stored set's generation.
    pub fn filter_state(&self) -> Result<FilterState, Error> {
        self.ask(COMMAND_TIMEOUT, Command::FilterState)?.wait()?
    }

    /// Makes `filters` the running set of the configuration (what `ctl apply` checks its
    /// tenants against) once the store keeps it (as the next generation, returned with the
    /// map settings that stay). The data path must already run them; on an error nothing was
    /// stored and the caller puts the data path's old set back.
    pub fn commit_filters(
        &self,
        filters: Vec<datapath::FilterConfig>,
    ) -> Result<FilterCommit, Error> {
        self.ask(APPLY_TIMEOUT, |tx| Command::CommitFilters(filters, tx))?
            .wait()?
    }

    /// Keeps the change `op` of `tenant`'s map `map`, which the data path carried out, in the
    /// stored map settings (an update, or the delete of a key an update set); None when it
    /// changes no setting.
    pub fn commit_map_setting(
        &self,
        tenant: ids::TenantId,
        map: String,
        op: datapath::FilterMapOp,
    ) -> Result<Option<FilterCommit>, Error> {
        self.ask(APPLY_TIMEOUT, |tx| {
            Command::CommitMapSetting(tenant, map, op, tx)
        })?
        .wait()?
    }

    fn request(
        &self,
        name: &'static str,
        tunnel: TunnelId,
        command: impl FnOnce(Sender<Result<(), CommandFailure>>) -> Command,
    ) -> Result<(), Error> {
        match self.ask(COMMAND_TIMEOUT, command)?.wait() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(CommandFailure::ShuttingDown)) => Err(Error::ShuttingDown),
            Ok(Err(CommandFailure::Engine(source))) => Err(Error::Command {
                command: name,
                tunnel,
                source,
            }),
            Err(e) => Err(e),
        }
    }

    /// Sends the control loop `command`, made with the sender of its answer, which is waited
    /// for at most `timeout`.
    fn ask<T>(
        &self,
        timeout: Duration,
        command: impl FnOnce(Sender<T>) -> Command,
    ) -> Result<Pending<T>, Error> {
        let (tx, rx) = bounded(1);
        self.commands
            .send(command(tx))
            .map_err(|_| Error::ControlStopped)?;
        Ok(Pending { rx, timeout })
    }
}

/// An answer of the control loop on its way: the caller may do other work before it
/// [`Pending::wait`]s (a scrape reads the data path's counters while the control loop copies
/// its SAs).
pub struct Pending<T> {
    rx: Receiver<T>,
    timeout: Duration,
}

impl<T> Pending<T> {
    /// The answer, or [`Error::ControlStopped`] if none came in time (the command's timeout
    /// from when it was sent).
    pub fn wait(self) -> Result<T, Error> {
        self.rx
            .recv_timeout(self.timeout)
            .map_err(|_| Error::ControlStopped)
    }
}

/// The running control loop.
pub struct ControlPlane {
    handle: ControlHandle,
    thread: Option<JoinHandle<()>>,
}

impl ControlPlane {
    /// Starts the control loop with the operating system's RNG. Every tunnel of `config` is
    /// added to a new IKE endpoint; the IKE SAs found in `store` are restored (see
    /// [`ControlPlane::start_with_rng`]); tunnels with `start_action = "start"` and no IKE SA are
    /// initiated.
    pub fn start(
        config: &Config,
        datapath: Arc<dyn DataPath>,
        from_dataplane: Receiver<ToControl>,
        store: Box<dyn Store>,
    ) -> Result<Self, Error> {
        Self::start_with_rng(
            config,
            datapath,
            from_dataplane,
            store,
            Box::new(crypto::SystemRng),
        )
    }

    /// As [`start`](Self::start), with a caller-chosen RNG (deterministic tests).
    ///
    /// Every IKE SA state change is committed to `store` before the datagrams that depend on
    /// it are sent. At start the stored IKE SAs are restored with their message IDs, so peers
    /// keep their IKE SAs (no new IKE_SA_INIT or IKE_AUTH). Their CHILD_SAs are rekeyed at once
    /// (CREATE_CHILD_SA over the restored IKE SA): the ESP state of the old ones (sequence
    /// numbers, replay windows) lived in the data path and did not survive, and sending again
    /// under an old key from sequence number 1 would reuse AES-GCM nonces. A record whose tunnel
    /// is no longer configured under the same name, or that cannot be read, is dropped (that
    /// peer re-authenticates).
    pub fn start_with_rng(
        config: &Config,
        datapath: Arc<dyn DataPath>,
        from_dataplane: Receiver<ToControl>,
        store: Box<dyn Store>,
        rng: Box<dyn crypto::Rng>,
    ) -> Result<Self, Error> {
        let keylog = config
            .gateway
            .key_log
            .as_deref()
            .map(KeyLog::open)
            .transpose()?;
        let (commands_tx, commands_rx) = crossbeam_channel::unbounded();
        let (ready_tx, ready_rx) = bounded::<Result<(), Error>>(1);
        let config = config.clone();
        let thread = std::thread::Builder::new()
            .name("protego-control".into())
            .spawn(move || {
                let now = Instant::now();
                let mut endpoint = Endpoint::new(config.endpoint.clone(), rng, now);
                endpoint.track_state_changes();
                for t in &config.tunnels {
                    if let Err(source) = endpoint.add_peer(now, t.peer.clone()) {
                        let _ = ready_tx.send(Err(Error::Engine {
                            tunnel: t.peer.name.clone(),
                            source,
                        }));
                        return;
                    }
                }
                let tunnels = config
                    .tunnels
                    .iter()
                    .map(|t| (t.peer.id, TunnelInfo::of(t)))
                    .collect();
                let mut persist = Persister::new(store);
                // Where ids and generations of applied configurations go on from.
                let (generation, recorded_next) = match persist.applied() {
                    Ok(record) => record.map_or((0, 1), |r| (r.generation, r.next_id)),
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let next_id = recorded_next.max(config.next_free_id());
                let restored = match restore(&mut endpoint, &mut persist, &tunnels, now) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(Error::Store(e)));
                        return;
                    }
                };
                let mut driver = Driver {
                    endpoint,
                    datapath,
                    tunnels,
                    keylog,
                    buf: Vec::with_capacity(TRANSMIT_BUFFER),
                    restart: Vec::new(),
                    events: HashMap::new(),
                    shutdown_deadline: None,
                    persist,
                    restored,
                    aborted: false,
                    next_id,
                    generation,
                    config,
                };
                let _ = ready_tx.send(Ok(()));
                driver.run(&from_dataplane, &commands_rx);
            })
            .map_err(|source| Error::Spawn {
                name: "protego-control",
                source,
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self {
                handle: ControlHandle {
                    commands: commands_tx,
                },
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                // The thread died before reporting: it panicked while setting up.
                let _ = thread.join();
                Err(Error::ControlStopped)
            }
        }
    }

    /// A handle for status queries and commands.
    pub fn handle(&self) -> ControlHandle {
        self.handle.clone()
    }

    /// True while the control loop thread runs.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the loop at once, as a crash would: no DELETE, and the store keeps every IKE SA,
    /// for the control node that takes over (the distributed form's graceful hand-over).
    pub fn hand_over(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = self.handle.commands.send(Command::Abort);
            let _ = thread.join();
        }
    }

    /// Deletes every IKE SA politely (the peers get a DELETE), waits at most `grace` for the
    /// answers, and stops the loop.
    pub fn shutdown(mut self, grace: Duration) -> Result<(), Error> {
        self.stop(grace)
    }

    fn stop(&mut self, grace: Duration) -> Result<(), Error> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        let _ = self.handle.commands.send(Command::Shutdown { grace });
        thread.join().map_err(|_| Error::ControlStopped)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.stop(Duration::ZERO);
    }
}

/// What the loop needs to know about a tunnel beyond the engine's view.
struct TunnelInfo {
    name: String,
    tenant: ids::TenantId,
    start_action: StartAction,
    dpd_action: DpdAction,
    /// No longer configured (an apply removed it); kept while its SAs are being deleted, so
    /// that their log lines and store records still carry its name.
    removed: bool,
}

impl TunnelInfo {
    fn of(t: &crate::config::Tunnel) -> Self {
        Self {
            name: t.peer.name.clone(),
            tenant: t.tenant.clone(),
            start_action: t.peer.start_action,
            dpd_action: t.peer.dpd_action,
            removed: false,
        }
    }
}

/// The state of the control loop thread.
struct Driver {
    endpoint: Endpoint,
    datapath: Arc<dyn DataPath>,
    tunnels: HashMap<TunnelId, TunnelInfo>,
    keylog: Option<KeyLog>,
    buf: Vec<u8>,
    /// Tunnels whose IKE SA died of a DPD timeout with `dpd_action = restart`.
    restart: Vec<TunnelId>,
    /// Per tunnel: establishments, rekeys, liveness checks, deletions (`IkeReport::events`).
    events: HashMap<TunnelId, crate::status::TunnelEvents>,
    /// Set once a shutdown began: the loop ends when every IKE SA is gone or at this instant.
    shutdown_deadline: Option<Instant>,
    /// The state store.
    persist: Persister,
    /// CHILD_SAs of restored IKE SAs, to reconcile with the data path at the start of the
    /// loop (those it no longer holds are rekeyed).
    restored: Vec<datapath::KnownChild>,
    /// Set by a test's abort: leave the loop now.
    aborted: bool,
    /// The configuration running now (the file's, or the last applied).
    config: Config,
    /// The id the next new tunnel gets.
    next_id: u32,
    /// The generation of the stored applied configuration (0: none).
    generation: u64,
}

/// Restores the IKE SAs kept in the store; returns their CHILD_SAs, as the restored state
/// describes them (for [`DataPath::reconcile`]: those whose ESP state did not survive are
/// rekeyed). A store that cannot be read fails the start:
/// starting without it would make every peer re-authenticate and leave its records behind to
/// come back at a later start.
fn restore(
    endpoint: &mut Endpoint,
    persist: &mut Persister,
    tunnels: &HashMap<TunnelId, TunnelInfo>,
    now: Instant,
) -> Result<Vec<datapath::KnownChild>, crate::store::StoreError> {
    let records = persist.load()?;
    let mut restored = std::collections::HashSet::new();
    let wall = std::time::SystemTime::now();
    for (spi, bytes) in records {
        let spi_text = format!("{spi:016x}");
        let record = match decode_record(&bytes) {
            Ok(r) => r,
            Err(why) => {
                warn!(spi = %spi_text, error = why, "dropping an unreadable stored IKE SA");
                persist.forget(now, [spi]);
                continue;
            }
        };
        let configured = Endpoint::snapshot_tunnel(record.snapshot)
            .ok()
            .flatten()
            .and_then(|t| tunnels.get(&t).map(|info| (t, info.name.as_str())));
        let Some((tunnel, name)) = configured.filter(|(_, name)| *name == record.tunnel) else {
            warn!(spi = %spi_text, tunnel = %record.tunnel,
                "dropping a stored IKE SA whose tunnel is no longer configured under that name; the peer will re-authenticate");
            persist.forget(now, [spi]);
            continue;
        };
        // A clock set back makes the age 0: timers then run as if no time had passed.
        let age = wall.duration_since(record.at).unwrap_or_default();
        match endpoint.restore_aged(now, record.snapshot, age) {
            Ok(ike) => {
                info!(tunnel = %name, tenant = %tunnels.get(&tunnel).map_or("-", |t| t.tenant.as_str()),
                    ispi = %ike.initiator, rspi = %ike.responder, age_ms = age.as_millis() as u64,
                    "IKE_SA restored from the store");
                restored.insert(ike);
            }
            Err(e) => {
                warn!(spi = %spi_text, tunnel = %name, error = %e, "dropping a stored IKE SA that cannot be restored");
                persist.forget(now, [spi]);
            }
        }
    }
    // One status read for all (restoring 10 000 SAs must not cost 10 000 of them).
    let children: Vec<datapath::KnownChild> = endpoint
        .status(now)
        .iter()
        .filter(|s| restored.contains(&s.ike))
        .filter_map(|s| Some((s.tunnel?, s)))
        .flat_map(|(tunnel, s)| {
            s.children.iter().map(move |c| datapath::KnownChild {
                tunnel,
                ike: s.ike,
                inbound_spi: c.inbound_spi,
                outbound_spi: c.outbound_spi,
                local_ts: c.local_ts.clone(),
                remote_ts: c.remote_ts.clone(),
            })
        })
        .collect();
    Ok(children)
}

/// The snake_case name of a delete reason, as logged.
pub fn reason_name(reason: DeleteReason) -> &'static str {
    match reason {
        DeleteReason::PeerRequest => "peer_request",
        DeleteReason::LocalRequest => "local_request",
        DeleteReason::Rekeyed => "rekeyed",
        DeleteReason::DpdTimeout => "dpd_timeout",
        DeleteReason::RetransmitLimit => "retransmit_limit",
        DeleteReason::Expired => "expired",
        DeleteReason::AuthFailed => "auth_failed",
        DeleteReason::NegotiationFailed => "negotiation_failed",
    }
}

fn join_ts(ts: &[ike::TrafficSelector]) -> String {
    ts.iter().map(format_ts).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests;
