//! The node side of a session, shared by data and steer nodes: connect to a control node
//! (trying each configured one in turn, with backoff), say Hello, apply the directives in
//! the order they come and answer each, send a report every interval and events as they
//! happen. Packet forwarding never depends on the session: when it breaks, the node keeps
//! forwarding with the tables it has and reconnects.

use crate::link::Answer;
use crate::node_config::ControlEndpoint;
use rpc::certs::NodeTls;
use rpc::pb;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, info, warn};

/// First wait before reconnecting; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Longest wait between connection attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(150);
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A failed connection attempt is logged as a warning once per this many in a row.
const REPEAT_WARNING: u64 = 100;
/// Messages queued toward control before the session counts as stuck.
const OUTGOING_QUEUE: usize = 1024;

/// What a node does with its session.
pub trait Applier: Send + Sync + 'static {
    /// The Hello to open a session with (boot id, installed state).
    fn hello(&self) -> pb::Hello;
    /// A session was welcomed by the control node `welcome.control_name`.
    fn welcomed(&self, welcome: &pb::Welcome);
    /// Applies one directive (or keeps it to apply later: [`Answer::Kept`]); `Err` names why
    /// nothing changed.
    fn apply(&self, op: pb::directive::Op) -> Result<Answer, String>;
    /// The report for the interval since the last one.
    fn report(&self) -> pb::Report;
    /// The session with control has been down for [`CONTROL_LOST_INTERVALS`] report
    /// intervals (and no new one was welcomed meanwhile): control counts the node as lost.
    fn control_lost(&self) {}
}

/// After this many report intervals without a session, a node counts as lost to control
/// ([`Applier::control_lost`]).
pub const CONTROL_LOST_INTERVALS: u32 = 2;

/// Runs sessions until `stop` is set: `events` are sent to the control node of the current
/// session (events while there is none are dropped: the node repeats what matters).
pub async fn run(
    endpoints: Vec<ControlEndpoint>,
    tls: Arc<NodeTls>,
    applier: Arc<dyn Applier>,
    mut events: mpsc::UnboundedReceiver<pb::NodeEvent>,
    stop: Arc<AtomicBool>,
) {
    let mut backoff = MIN_BACKOFF;
    let mut next = 0usize;
    // Counts welcomed sessions: a loss timer that finds it moved on does nothing.
    let sessions = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Failed attempts in a row: the first is a warning, then one in REPEAT_WARNING (the
    // others at debug), so that a long control outage does not flood the log.
    let mut failures = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let endpoint = &endpoints[next % endpoints.len()];
        next += 1;
        let started = Instant::now();
        let mut welcomed = None;
        let result = session(
            endpoint,
            &tls,
            &applier,
            &mut events,
            &stop,
            (&mut welcomed, &sessions),
        )
        .await;
        if let Some(interval) = welcomed {
            // The session was up: tell the applier once it has been down long enough (unless
            // another one was welcomed meanwhile).
            let generation = sessions.load(Ordering::SeqCst);
            let (sessions, applier) = (Arc::clone(&sessions), Arc::clone(&applier));
            tokio::spawn(async move {
                tokio::time::sleep(interval * CONTROL_LOST_INTERVALS).await;
                if sessions.load(Ordering::SeqCst) == generation {
                    warn!(
                        intervals = CONTROL_LOST_INTERVALS,
                        "no session with control for two report intervals"
                    );
                    let _ = tokio::task::spawn_blocking(move || applier.control_lost()).await;
                }
            });
        }
        if started.elapsed() > Duration::from_secs(10) {
            backoff = MIN_BACKOFF;
            failures = 0;
        }
        match result {
            Ok(()) => {
                info!(control = %endpoint.name, "session ended");
                failures = 0;
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(REPEAT_WARNING) {
                    warn!(control = %endpoint.name, address = %endpoint.address, error = %e, attempts = failures, "session with control failed");
                } else {
                    debug!(control = %endpoint.name, address = %endpoint.address, error = %e, attempts = failures, "session with control failed");
                }
            }
        }
        // Drain events that piled up without a session.
        while events.try_recv().is_ok() {}
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

async fn session(
    endpoint: &ControlEndpoint,
    tls: &NodeTls,
    applier: &Arc<dyn Applier>,
    events: &mut mpsc::UnboundedReceiver<pb::NodeEvent>,
    stop: &AtomicBool,
    (welcomed, sessions): (&mut Option<Duration>, &std::sync::atomic::AtomicU64),
) -> Result<(), String> {
    let url = format!("https://{}", endpoint.address);
    let mut client = rpc::connect(&url, tls, &endpoint.name, CONNECT_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let (out, out_rx) = mpsc::channel::<pb::NodeMessage>(OUTGOING_QUEUE);
    let send = |msg: pb::node_message::Msg| {
        let out = out.clone();
        async move {
            out.send(pb::NodeMessage { msg: Some(msg) })
                .await
                .map_err(|_| "session closed".to_owned())
        }
    };
    send(pb::node_message::Msg::Hello(applier.hello())).await?;
    let response = client
        .session(ReceiverStream::new(out_rx))
        .await
        .map_err(|s| format!("{}: {}", code_name(s.code()), s.message()))?;
    let mut inbound = response.into_inner();
    let first = inbound
        .message()
        .await
        .map_err(|s| format!("{}: {}", code_name(s.code()), s.message()))?;
    let welcome = match first.and_then(|m| m.msg) {
        Some(pb::control_message::Msg::Welcome(w)) => w,
        _ => return Err("control did not answer with Welcome".into()),
    };
    info!(control = %welcome.control_name, node_id = welcome.node_id, term = welcome.term, "registered with control");
    let interval = Duration::from_millis(u64::from(welcome.report_interval_ms).clamp(100, 60_000));
    *welcomed = Some(interval);
    sessions.fetch_add(1, Ordering::SeqCst);
    applier.welcomed(&welcome);
    let mut reports = tokio::time::interval(interval);
    reports.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    reports.tick().await;
    let mut stop_check = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            message = inbound.message() => {
                let message = message.map_err(|s| format!("{}: {}", code_name(s.code()), s.message()))?;
                let Some(message) = message else { return Ok(()) };
                match message.msg {
                    Some(pb::control_message::Msg::Directive(d)) => {
                        let id = d.id;
                        let result = match d.op {
                            Some(op) => {
                                let applier = Arc::clone(applier);
                                tokio::task::spawn_blocking(move || applier.apply(op))
                                    .await
                                    .unwrap_or_else(|_| Err("the directive's handler panicked".into()))
                            }
                            None => Err("directive without an operation".into()),
                        };
                        if let Err(e) = &result {
                            warn!(directive = id, error = %e, "directive rejected");
                        }
                        let ack = match result {
                            Ok(Answer::Applied) => pb::Ack { id, ..pb::Ack::default() },
                            Ok(Answer::Kept) => pb::Ack { id, kept: true, ..pb::Ack::default() },
                            Ok(Answer::FilterMap(m)) => pb::Ack { id, filter_map: Some(*m), ..pb::Ack::default() },
                            Err(error) => pb::Ack { id, error, ..pb::Ack::default() },
                        };
                        send(pb::node_message::Msg::Ack(ack)).await?;
                    }
                    Some(pb::control_message::Msg::Welcome(_)) | None => {
                        debug!("unexpected message from control; ignored");
                    }
                }
            }
            _ = reports.tick() => {
                let applier = Arc::clone(applier);
                if let Ok(report) = tokio::task::spawn_blocking(move || applier.report()).await {
                    send(pb::node_message::Msg::Report(report)).await?;
                }
            }
            event = events.recv() => {
                match event {
                    Some(e) => send(pb::node_message::Msg::Event(e)).await?,
                    None => return Ok(()),
                }
            }
            _ = stop_check.tick() => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
        }
    }
}

fn code_name(code: tonic::Code) -> String {
    format!("{code:?}")
}

/// A node's running session with control: its runtime, and the thread that turns the
/// forwarder's own events into session events.
pub struct Agent {
    stop: Arc<AtomicBool>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Agent {
    /// Starts the session of node `role` (for thread names) with `applier`, and a thread
    /// that passes each of `events` through `convert` (`None`: not for control) to the
    /// session.
    pub fn start<E: Send + 'static>(
        role: &str,
        endpoints: Vec<ControlEndpoint>,
        tls: Arc<NodeTls>,
        applier: Arc<dyn Applier>,
        events: crossbeam_channel::Receiver<E>,
        convert: fn(E) -> Option<pb::node_event::Event>,
    ) -> std::io::Result<Agent> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("protego-{role}-agent"))
            .enable_all()
            .build()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name(format!("protego-{role}-events"))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(e) = events.recv_timeout(Duration::from_millis(200)) else {
                            continue;
                        };
                        let Some(event) = convert(e) else { continue };
                        if events_tx
                            .send(pb::NodeEvent { event: Some(event) })
                            .is_err()
                        {
                            return;
                        }
                    }
                })?;
        }
        runtime.spawn(run(endpoints, tls, applier, events_rx, Arc::clone(&stop)));
        Ok(Agent {
            stop,
            runtime: Some(runtime),
        })
    }

    /// Ends the session (without waiting for the runtime's blocking tasks).
    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
