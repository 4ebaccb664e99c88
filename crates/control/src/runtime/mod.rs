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

mod persist;

pub use persist::StoreStats;

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
    Status(Sender<(Vec<IkeSaStatus>, IkeStats)>),
    StoreStats(Sender<StoreStats>),
    RotateStoreKey(Sender<Result<crate::store::KeyRotation, crate::store::StoreError>>),
    Initiate(TunnelId, Sender<Result<(), CommandFailure>>),
    Terminate(TunnelId, Sender<Result<(), CommandFailure>>),
    RekeyChild(TunnelId, Sender<Result<(), CommandFailure>>),
    RekeyIke(TunnelId, Sender<Result<(), CommandFailure>>),
    Apply(Box<ApplyRequest>, Sender<Result<ApplyOutcome, Error>>),
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

/// A cloneable handle for talking to a running control loop (status server, signal handler).
#[derive(Clone)]
pub struct ControlHandle {
    commands: Sender<Command>,
}

impl ControlHandle {
    /// The engine's current IKE SA table.
    pub fn ike_status(&self) -> Result<Vec<IkeSaStatus>, Error> {
        self.ike_report().map(|(sas, _)| sas)
    }

    /// The engine's IKE SA table and its counters of dropped IKE datagrams, read together.
    pub fn ike_report(&self) -> Result<(Vec<IkeSaStatus>, IkeStats), Error> {
        let (tx, rx) = bounded(1);
        self.commands
            .send(Command::Status(tx))
            .map_err(|_| Error::ControlStopped)?;
        rx.recv_timeout(COMMAND_TIMEOUT)
            .map_err(|_| Error::ControlStopped)
    }

    /// The state store's figures (backend, commits, latency, failures).
    pub fn store_stats(&self) -> Result<StoreStats, Error> {
        let (tx, rx) = bounded(1);
        self.commands
            .send(Command::StoreStats(tx))
            .map_err(|_| Error::ControlStopped)?;
        rx.recv_timeout(COMMAND_TIMEOUT)
            .map_err(|_| Error::ControlStopped)
    }

    /// Makes a new store encryption key current (`protego ctl store rotate-key`: the key file's
    /// last key if the operator appended one, else a generated one): new records are sealed with it at once, and the records under older keys
    /// are re-encrypted in the background (`protego status` shows the progress).
    pub fn rotate_store_key(&self) -> Result<crate::store::KeyRotation, Error> {
        let (tx, rx) = bounded(1);
        self.commands
            .send(Command::RotateStoreKey(tx))
            .map_err(|_| Error::ControlStopped)?;
        rx.recv_timeout(COMMAND_TIMEOUT)
            .map_err(|_| Error::ControlStopped)?
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
        let (tx, rx) = bounded(1);
        self.commands
            .send(Command::Apply(Box::new(request), tx))
            .map_err(|_| Error::ControlStopped)?;
        rx.recv_timeout(APPLY_TIMEOUT)
            .map_err(|_| Error::ControlStopped)?
    }

    fn request(
        &self,
        name: &'static str,
        tunnel: TunnelId,
        command: impl FnOnce(Sender<Result<(), CommandFailure>>) -> Command,
    ) -> Result<(), Error> {
        let (tx, rx) = bounded(1);
        self.commands
            .send(command(tx))
            .map_err(|_| Error::ControlStopped)?;
        match rx.recv_timeout(COMMAND_TIMEOUT) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(CommandFailure::ShuttingDown)) => Err(Error::ShuttingDown),
            Ok(Err(CommandFailure::Engine(source))) => Err(Error::Command {
                command: name,
                tunnel,
                source,
            }),
            Err(_) => Err(Error::ControlStopped),
        }
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
    tenant: String,
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

impl Driver {
    fn run(&mut self, data: &Receiver<ToControl>, commands: &Receiver<Command>) {
        let now = Instant::now();
        info!(store = %self.persist.describe(), "IKE state store");
        // The data path says which restored CHILD_SAs it no longer holds (all of them when it
        // restarted with this process; in the distributed form, those no data node kept).
        let restored = std::mem::take(&mut self.restored);
        let lost = self.datapath.reconcile(&restored);
        if !restored.is_empty() {
            info!(
                restored = restored.len(),
                kept = restored.len().saturating_sub(lost.len()),
                rekeyed = lost.len(),
                "restored CHILD_SAs reconciled with the data path"
            );
        }
        for spi in lost {
            if let Err(e) = self.endpoint.rekey_child(now, spi) {
                warn!(spi_in = %spi, error = %e, "cannot rekey a restored CHILD_SA");
            }
        }
        self.on_timeout(now);
        self.drain();
        self.start_tunnels(now);
        let mut data_open = true;
        loop {
            let now = Instant::now();
            if let Some(deadline) = self.shutdown_deadline {
                if now >= deadline || self.endpoint.status(now).is_empty() {
                    break;
                }
            }
            let wake = [
                self.endpoint.poll_timeout(),
                self.shutdown_deadline,
                self.persist.retry_at(),
                self.persist.reseal_at(),
            ]
            .into_iter()
            .flatten()
            .min();
            let mut select = Select::new();
            let data_index = data_open.then(|| select.recv(data));
            let command_index = select.recv(commands);
            let ready = match wake {
                Some(at) => select.ready_deadline(at).ok(),
                None => Some(select.ready()),
            };
            let now = Instant::now();
            match ready {
                Some(i) if Some(i) == data_index => match data.try_recv() {
                    Ok(message) => self.on_data(now, message),
                    Err(crossbeam_channel::TryRecvError::Empty) => {}
                    Err(crossbeam_channel::TryRecvError::Disconnected) => {
                        data_open = false;
                        if self.shutdown_deadline.is_none() {
                            error!("data plane channel closed; stopping the control loop");
                            break;
                        }
                    }
                },
                Some(i) if i == command_index => match commands.try_recv() {
                    Ok(command) => {
                        self.on_command(now, command);
                        if self.aborted {
                            return;
                        }
                    }
                    Err(crossbeam_channel::TryRecvError::Empty) => {}
                    Err(crossbeam_channel::TryRecvError::Disconnected) => {
                        // Every handle is gone: nobody can stop us any more, so stop now.
                        self.begin_shutdown(now, Duration::ZERO);
                    }
                },
                _ => {}
            }
            let now = Instant::now();
            self.on_timeout(now);
            self.drain();
            self.restart_dead(now);
            // Every datagram of the round has left: re-encrypt a few records now, if due and
            // no IKE datagram is waiting (the wait is bounded, see `persist`).
            self.persist.reseal(Instant::now(), !data.is_empty());
        }
        if self.shutdown_deadline.is_some() {
            self.forget_all();
        }
        debug!("control loop stopped");
    }

    /// After a shutdown: every peer was told its IKE SAs are deleted (answered or not), so none
    /// may come back at the next start.
    fn forget_all(&mut self) {
        let now = Instant::now();
        let changes = self.endpoint.take_state_changes(now);
        self.persist.save(now, changes, |_| String::new());
        match self.persist.load() {
            Ok(records) => {
                if !self
                    .persist
                    .forget(now, records.into_iter().map(|(spi, _)| spi))
                {
                    warn!("cannot clear the stored IKE SAs at shutdown; they will be restored (and fail) at the next start");
                }
            }
            Err(e) => warn!(error = %e, "cannot clear the stored IKE SAs at shutdown"),
        }
    }

    /// Runs the engine's timers if they are due.
    fn on_timeout(&mut self, now: Instant) {
        if self.endpoint.poll_timeout().is_some_and(|t| t <= now) {
            self.endpoint.handle_timeout(now);
        }
    }

    fn on_data(&mut self, now: Instant, message: ToControl) {
        match message {
            ToControl::Ike(d) => self
                .endpoint
                .handle_datagram(now, d.local, d.remote, &d.data),
            ToControl::RekeyNeeded(spi) => {
                if self.shutdown_deadline.is_some() {
                    return;
                }
                info!(spi_in = %spi, "data plane asks for a CHILD_SA rekey");
                if let Err(e) = self.endpoint.rekey_child(now, spi) {
                    warn!(spi_in = %spi, error = %e, "cannot rekey CHILD_SA");
                }
            }
            ToControl::PeerAddressSeen {
                inbound_spi,
                local,
                remote,
            } => {
                debug!(spi_in = %inbound_spi, %remote, "authenticated ESP from a new peer address");
                self.endpoint
                    .peer_address_seen(now, inbound_spi, local, remote);
            }
        }
    }

    fn on_command(&mut self, now: Instant, command: Command) {
        match command {
            Command::Status(reply) => {
                let _ = reply.send((self.endpoint.status(now), self.endpoint.stats().clone()));
            }
            Command::StoreStats(reply) => {
                let _ = reply.send(self.persist.stats());
            }
            Command::RotateStoreKey(reply) => {
                let _ = reply.send(self.persist.rotate_key());
            }
            Command::Initiate(tunnel, reply) => {
                let result = if self.shutdown_deadline.is_some() {
                    Err(CommandFailure::ShuttingDown)
                } else {
                    self.endpoint
                        .initiate(now, tunnel)
                        .map_err(CommandFailure::Engine)
                };
                let _ = reply.send(result);
            }
            Command::Terminate(tunnel, reply) => {
                self.restart.retain(|t| *t != tunnel);
                let _ = reply.send(
                    self.endpoint
                        .terminate(now, tunnel)
                        .map_err(CommandFailure::Engine),
                );
            }
            Command::RekeyChild(tunnel, reply) => {
                let result = if self.shutdown_deadline.is_some() {
                    Err(CommandFailure::ShuttingDown)
                } else {
                    self.rekey_tunnel_child(now, tunnel)
                        .map_err(CommandFailure::Engine)
                };
                let _ = reply.send(result);
            }
            Command::RekeyIke(tunnel, reply) => {
                let result = if self.shutdown_deadline.is_some() {
                    Err(CommandFailure::ShuttingDown)
                } else {
                    self.endpoint
                        .rekey_ike(now, tunnel)
                        .map_err(CommandFailure::Engine)
                };
                let _ = reply.send(result);
            }
            Command::Apply(request, reply) => {
                let _ = reply.send(self.apply(now, *request));
            }
            Command::Shutdown { grace } => self.begin_shutdown(now, grace),
            Command::Abort => self.aborted = true,
        }
    }

    /// Carries out an apply (see [`ControlHandle::apply`]).
    fn apply(&mut self, now: Instant, request: ApplyRequest) -> Result<ApplyOutcome, Error> {
        use crate::config::TunnelChange;
        if self.shutdown_deadline.is_some() {
            return Err(Error::ShuttingDown);
        }
        let ApplyRequest {
            text,
            source,
            dry_run,
        } = request;
        let mut new = self.config.with_inventory(&text, &source, None)?;
        // A tunnel that moves to another tenant or inside is a new tunnel under its old name
        // (a fresh id): its SAs must never carry traffic into the new place, not even while
        // their DELETE is under way.
        let mut ids = self.config.tunnel_ids();
        for t in &new.tunnels {
            if self
                .config
                .tunnel_named(&t.peer.name)
                .is_some_and(|o| o.tenant != t.tenant || o.inside != t.inside)
            {
                ids.remove(&t.peer.name);
            }
        }
        let mut next_id = self.next_id;
        new.keep_ids(&ids, &mut next_id);
        let plan = crate::config::plan(&self.config, &new);
        if dry_run || plan.is_empty() {
            return Ok(ApplyOutcome {
                plan,
                generation: self.generation,
                config: new,
            });
        }
        self.datapath
            .check_inside(&new.dataplane.vnets, &new.dataplane.tunnels)
            .map_err(|e| {
                Error::Apply(format!("the data path refuses its VNets and tunnels: {e}"))
            })?;
        // What goes: removed tunnels, and the old ids of moved ones (deleted with their peers);
        // replaced ones keep their id but lose their SAs (negotiated again).
        let mut retired: Vec<(TunnelId, String)> = Vec::new();
        let mut replaced: Vec<TunnelId> = Vec::new();
        for old in &self.config.tunnels {
            match new.tunnel_named(&old.peer.name) {
                Some(t) if t.peer.id != old.peer.id => {
                    retired.push((old.peer.id, old.peer.name.clone()))
                }
                Some(t) if crate::config::tunnel_change(old, t) == TunnelChange::Replace => {
                    replaced.push(old.peer.id)
                }
                Some(_) => {}
                None => retired.push((old.peer.id, old.peer.name.clone())),
            }
        }
        // Their IKE SAs leave the store in the same commit as the new configuration: a node
        // that takes over right after must not restore an SA negotiated with the old settings
        // (an old PSK) under the new ones.
        let doomed: Vec<u64> = self
            .endpoint
            .status(now)
            .iter()
            .filter(|s| {
                s.tunnel.is_some_and(|t| {
                    replaced.contains(&t) || retired.iter().any(|(id, _)| *id == t)
                })
            })
            .map(|s| s.local_spi().0)
            .collect();
        let generation = self.generation + 1;
        let record = crate::applied::AppliedConfig::new(&new, text, source, generation, next_id);
        let mut changes = vec![crate::store::Change::PutConfig {
            record: record.encode(),
        }];
        changes.extend(
            doomed
                .iter()
                .map(|&spi| crate::store::Change::DeleteIkeSa { spi }),
        );
        self.persist.commit_config(&changes, &doomed).map_err(|e| {
            Error::Apply(format!(
                "cannot write it to the store: {e} (nothing changed here; if the store applied \
                 it after all, a restart would run it: apply again)"
            ))
        })?;
        for (id, name) in &retired {
            self.restart.retain(|t| t != id);
            if let Err(e) = self.endpoint.remove_peer(now, *id) {
                warn!(tunnel = %name, error = %e, "cannot remove the tunnel from the IKE engine");
            }
            if let Some(info) = self.tunnels.get_mut(id) {
                info.removed = true;
            }
        }
        for t in &new.tunnels {
            let id = t.peer.id;
            let name = &t.peer.name;
            let old = self.config.tunnel_named(name);
            let what = match old.map(|o| (o.peer.id == id, crate::config::tunnel_change(o, t))) {
                Some((true, TunnelChange::Same)) => continue,
                Some((true, TunnelChange::Update)) => "tunnel settings updated in place",
                Some((true, TunnelChange::Replace)) => {
                    self.restart.retain(|r| *r != id);
                    if let Err(e) = self.endpoint.terminate(now, id) {
                        warn!(tunnel = %name, error = %e, "cannot delete the SAs of a changed tunnel");
                    }
                    "tunnel changed; its SAs are deleted and negotiated again"
                }
                Some((false, _)) => {
                    "tunnel moved to another tenant or inside; its SAs are deleted and it starts anew"
                }
                None => "tunnel added",
            };
            if let Err(e) = self.endpoint.add_peer(now, t.peer.clone()) {
                error!(tunnel = %name, error = %e, "IKE engine refused the tunnel's new configuration");
            }
            self.tunnels.insert(id, TunnelInfo::of(t));
            // The old IKE SA is still being deleted, which keeps the engine from starting the
            // tunnel on its own: start the new one now (a dead old peer address must not
            // delay it by a whole retransmission budget).
            if old.is_some_and(|o| o.peer.id == id)
                && replaced.contains(&id)
                && t.peer.start_action == StartAction::Start
            {
                if let Err(e) = self.endpoint.initiate(now, id) {
                    warn!(tunnel = %name, error = %e, "cannot initiate the changed tunnel");
                }
            }
            info!(tunnel = %name, tenant = %t.tenant, "{what}");
        }
        for (_, name) in &retired {
            if new.tunnel_named(name).is_none() {
                info!(tunnel = %name, "tunnel removed by apply; deleting its SAs");
            }
        }
        self.drain();
        if let Err(e) = self
            .datapath
            .set_inside(new.dataplane.vnets.clone(), new.dataplane.tunnels.clone())
        {
            error!(error = %e, "data path refused VNets and tunnels it had accepted; traffic of changed tunnels may not flow");
        }
        // Tunnels removed by an earlier apply whose SAs are gone by now.
        let status = self.endpoint.status(now);
        self.tunnels
            .retain(|id, t| !t.removed || status.iter().any(|s| s.tunnel == Some(*id)));
        info!(
            generation,
            tenants_added = plan.tenants_added.len(),
            tenants_removed = plan.tenants_removed.len(),
            vnets_added = plan.vnets_added.len(),
            vnets_changed = plan.vnets_changed.len(),
            vnets_removed = plan.vnets_removed.len(),
            tunnels_added = plan.tunnels_added.len(),
            tunnels_removed = plan.tunnels_removed.len(),
            tunnels_replaced = plan.tunnels_replaced.len(),
            tunnels_updated = plan.tunnels_updated.len(),
            "configuration applied"
        );
        self.config = new.clone();
        self.next_id = next_id;
        self.generation = generation;
        Ok(ApplyOutcome {
            plan,
            generation,
            config: new,
        })
    }

    /// Rekeys the tunnel's CHILD_SA: the oldest one of its newest established IKE SA. A tunnel
    /// carries one CHILD_SA; while a rekey of it is under way (ours or the peer's) the oldest is
    /// the one being replaced, and the engine leaves it alone, as swanctl does with a CHILD_SA
    /// that is already rekeying (rekeying its successor before the peer's DELETE of the old
    /// one would only be postponed).
    fn rekey_tunnel_child(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), ike::Error> {
        let current = self
            .endpoint
            .status(now)
            .into_iter()
            .filter(|s| s.tunnel == Some(tunnel) && s.state == ike::IkeSaState::Established)
            .max_by_key(|s| std::cmp::Reverse(s.age_secs))
            .and_then(|s| s.children.first().map(|c| c.inbound_spi))
            .ok_or(ike::Error::NotEstablished(tunnel))?;
        self.endpoint.rekey_child(now, current)
    }

    /// Terminates every tunnel that has an IKE SA, so that peers get a DELETE, and arms the
    /// deadline after which the loop ends regardless of answers.
    fn begin_shutdown(&mut self, now: Instant, grace: Duration) {
        if self.shutdown_deadline.is_some() {
            return;
        }
        self.shutdown_deadline = Some(now + grace);
        self.restart.clear();
        let mut with_sa: Vec<TunnelId> = self
            .endpoint
            .status(now)
            .iter()
            .filter_map(|s| s.tunnel)
            .collect();
        with_sa.sort_unstable();
        with_sa.dedup();
        info!(
            tunnels = with_sa.len(),
            grace_ms = grace.as_millis(),
            "deleting IKE SAs before stopping"
        );
        for tunnel in with_sa {
            if let Err(e) = self.endpoint.terminate(now, tunnel) {
                debug!(tunnel = %self.name(Some(tunnel)), error = %e, "terminate on shutdown");
            }
        }
        self.drain();
    }

    /// Initiates `start_action = "start"` tunnels the engine has not initiated on its own.
    fn start_tunnels(&mut self, now: Instant) {
        let status = self.endpoint.status(now);
        let mut to_start: Vec<TunnelId> = self
            .tunnels
            .iter()
            .filter(|(id, t)| {
                !t.removed
                    && t.start_action == StartAction::Start
                    && !status.iter().any(|s| s.tunnel == Some(**id))
            })
            .map(|(id, _)| *id)
            .collect();
        to_start.sort_unstable();
        for tunnel in to_start {
            if let Err(e) = self.endpoint.initiate(now, tunnel) {
                warn!(tunnel = %self.name(Some(tunnel)), error = %e, "cannot initiate");
            }
        }
        self.drain();
    }

    /// Re-initiates tunnels whose IKE SA died of a DPD timeout under `dpd_action = "restart"`,
    /// unless the engine already did.
    fn restart_dead(&mut self, now: Instant) {
        if self.restart.is_empty() || self.shutdown_deadline.is_some() {
            return;
        }
        let status = self.endpoint.status(now);
        for tunnel in std::mem::take(&mut self.restart) {
            if status.iter().any(|s| s.tunnel == Some(tunnel)) {
                continue;
            }
            info!(tunnel = %self.name(Some(tunnel)), tenant = %self.tenant(Some(tunnel)), "re-initiating after DPD timeout");
            if let Err(e) = self.endpoint.initiate(now, tunnel) {
                warn!(tunnel = %self.name(Some(tunnel)), error = %e, "cannot re-initiate");
            }
        }
        self.drain();
    }

    /// Applies every pending event, then sends every pending datagram, until the engine has
    /// nothing more to say. Events first: a CHILD_SA must be in the data path before the
    /// message that lets the peer use it leaves (our CREATE_CHILD_SA response, or anything
    /// sent after we processed the peer's response); otherwise the peer's first packets on it
    /// can arrive before it is installed. Removals cannot cut traffic short by coming first:
    /// the data path keeps a removed SA's inbound half for a grace period.
    /// Drains the engine: events first (SAs reach the data path), then the state changes
    /// (committed to the store), then the datagrams, which leave only once their state is
    /// durable; while the store fails they are held (see `persist`).
    fn drain(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(event) = self.endpoint.poll_event() {
                progressed = true;
                self.on_event(event);
            }
            let now = Instant::now();
            let changes = self.endpoint.take_state_changes(now);
            let tunnels = &self.tunnels;
            let name = |t: Option<TunnelId>| {
                t.and_then(|t| tunnels.get(&t))
                    .map_or_else(String::new, |i| i.name.clone())
            };
            let durable = self.persist.save(now, changes, name);
            if durable && self.persist.holding() {
                for h in self.persist.release() {
                    self.send(h.local, h.remote, &h.data);
                }
            }
            while let Some(t) = self.endpoint.poll_transmit(&mut self.buf) {
                progressed = true;
                let Some(payload) = self.buf.get(..t.size) else {
                    error!(
                        size = t.size,
                        buffer = self.buf.len(),
                        "engine reported a datagram larger than its buffer"
                    );
                    continue;
                };
                if durable {
                    self.send(t.local, t.remote, payload);
                } else {
                    self.persist.hold(Held {
                        local: t.local,
                        remote: t.remote,
                        data: payload.to_vec(),
                    });
                }
            }
            if !progressed {
                break;
            }
        }
    }

    fn send(&self, local: std::net::SocketAddr, remote: std::net::SocketAddr, data: &[u8]) {
        if let Err(e) = self.datapath.send_ike(local, remote, data) {
            debug!(%local, %remote, error = %e, "IKE send failed");
        }
    }

    fn name(&self, tunnel: Option<TunnelId>) -> &str {
        tunnel
            .and_then(|t| self.tunnels.get(&t))
            .map_or("-", |t| t.name.as_str())
    }

    fn tenant(&self, tunnel: Option<TunnelId>) -> &str {
        tunnel
            .and_then(|t| self.tunnels.get(&t))
            .map_or("-", |t| t.tenant.as_str())
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::IkeSaConnecting {
                tunnel,
                ike,
                remote,
            } => {
                info!(
                    tunnel = %self.name(tunnel), tenant = %self.tenant(tunnel),
                    ispi = %ike.initiator, rspi = %ike.responder, remote = %remote,
                    "IKE_SA connecting"
                );
            }
            Event::IkeSaEstablished {
                tunnel,
                ike,
                proposal,
                local,
                remote,
            } => {
                let t = Some(tunnel);
                info!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    ispi = %ike.initiator, rspi = %ike.responder,
                    local = %local, remote = %remote, proposal = %proposal,
                    "IKE_SA established"
                );
            }
            Event::IkeSaRekeyed { tunnel, old, new } => {
                let t = Some(tunnel);
                info!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    ispi = %new.initiator, rspi = %new.responder,
                    old_ispi = %old.initiator, old_rspi = %old.responder,
                    "IKE_SA rekeyed"
                );
            }
            Event::IkeSaDeleted {
                tunnel,
                ike,
                reason,
            } => self.on_ike_deleted(tunnel, ike, reason),
            Event::ChildSaInstalled(child) => {
                let t = Some(child.tunnel);
                let local_ts = join_ts(&child.local_ts);
                let remote_ts = join_ts(&child.remote_ts);
                if let Some(keylog) = self.keylog.as_mut() {
                    keylog.write_child(&child);
                }
                if let Some(old) = child.replaces {
                    info!(
                        tunnel = %self.name(t), tenant = %self.tenant(t),
                        ispi = %child.ike.initiator, rspi = %child.ike.responder,
                        spi_in = %child.inbound_spi, spi_out = %child.outbound_spi, old_spi_in = %old,
                        proposal = %child.proposal, local_ts = %local_ts, remote_ts = %remote_ts,
                        "CHILD_SA rekeyed"
                    );
                } else {
                    info!(
                        tunnel = %self.name(t), tenant = %self.tenant(t),
                        ispi = %child.ike.initiator, rspi = %child.ike.responder,
                        spi_in = %child.inbound_spi, spi_out = %child.outbound_spi,
                        proposal = %child.proposal, local_ts = %local_ts, remote_ts = %remote_ts,
                        "CHILD_SA installed"
                    );
                }
                if let Err(e) = self.datapath.install_child(&child) {
                    error!(
                        tunnel = %self.name(t), tenant = %self.tenant(t),
                        spi_in = %child.inbound_spi, spi_out = %child.outbound_spi, error = %e,
                        "data plane refused the CHILD_SA; traffic of this tunnel will not flow"
                    );
                }
            }
            Event::ChildSaDeleted {
                tunnel,
                inbound_spi,
                outbound_spi,
                reason,
            } => {
                let t = Some(tunnel);
                info!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    spi_in = %inbound_spi, spi_out = %outbound_spi, reason = %reason_name(reason),
                    "CHILD_SA deleted"
                );
                self.datapath
                    .remove_child(tunnel, inbound_spi, outbound_spi);
            }
            Event::PeerAddressChanged {
                tunnel,
                ike,
                local,
                remote,
            } => {
                let t = Some(tunnel);
                info!(
                    tunnel = %self.name(t), tenant = %self.tenant(t),
                    ispi = %ike.initiator, rspi = %ike.responder, local = %local, remote = %remote,
                    "peer address changed"
                );
                self.datapath.update_peer(tunnel, ike, local, remote);
            }
            Event::KeyLog { ike, line } => match self.keylog.as_mut() {
                Some(keylog) => keylog.write_ike(&line),
                None => {
                    debug!(ispi = %ike.initiator, "engine emitted a key log line without a key log")
                }
            },
        }
    }

    fn on_ike_deleted(&mut self, tunnel: Option<TunnelId>, ike: IkeSpis, reason: DeleteReason) {
        let (name, tenant) = (self.name(tunnel).to_owned(), self.tenant(tunnel).to_owned());
        let why = reason_name(reason);
        match reason {
            DeleteReason::DpdTimeout => warn!(
                tunnel = %name, tenant = %tenant, ispi = %ike.initiator, rspi = %ike.responder, reason = %why,
                "DPD timeout: peer is dead, IKE_SA deleted"
            ),
            DeleteReason::RetransmitLimit
            | DeleteReason::AuthFailed
            | DeleteReason::NegotiationFailed
            | DeleteReason::Expired => warn!(
                tunnel = %name, tenant = %tenant, ispi = %ike.initiator, rspi = %ike.responder, reason = %why,
                "IKE_SA deleted"
            ),
            DeleteReason::PeerRequest | DeleteReason::LocalRequest | DeleteReason::Rekeyed => {
                info!(
                    tunnel = %name, tenant = %tenant, ispi = %ike.initiator, rspi = %ike.responder, reason = %why,
                    "IKE_SA deleted"
                )
            }
        }
        if let Some(t) = tunnel {
            let restart = self
                .tunnels
                .get(&t)
                .is_some_and(|i| i.dpd_action == DpdAction::Restart);
            if reason == DeleteReason::DpdTimeout && restart && !self.restart.contains(&t) {
                self.restart.push(t);
            }
        }
    }
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
