//! `protego up`: one gateway node in one process. Start-up order: configuration (validated
//! whole), logging, signal handler, data plane, control loop, status socket. SIGINT/SIGTERM
//! stop them in reverse order; the control loop first deletes every IKE SA so that peers
//! receive a DELETE (RFC 7296 §1.4.1), waiting at most [`SHUTDOWN_GRACE`] for their answers.

use control::config::LogFormat;
use control::status::TunnelDirectory;
use control::{Config, ControlPlane, Responder, StatusServer};
use dataplane::{DataPath, Dataplane};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tracing::{error, info, warn};

/// How long the control loop waits for peers to answer our DELETEs on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// Messages the data plane may queue for the control loop before it starts dropping IKE
/// datagrams (a flood must not grow memory without bound).
const CONTROL_QUEUE: usize = 8192;
/// How often the main thread checks that the control loop is still alive.
const WATCHDOG: Duration = Duration::from_millis(500);

/// Why `protego up` could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpError {
    /// `--log-level` (or RUST_LOG) is not a valid filter.
    #[error("invalid log filter {filter:?}: {reason}")]
    LogFilter {
        /// The filter text.
        filter: String,
        /// The parser's complaint.
        reason: String,
    },
    /// A logger was already installed (cannot happen in the binary).
    #[error("cannot install the logger: {0}")]
    Logger(String),
    /// SIGINT/SIGTERM could not be hooked.
    #[error("cannot install the signal handler: {0}")]
    Signal(#[from] ctrlc::Error),
    /// Sockets, TUN device or threads of the data plane failed.
    #[error("cannot start the data plane: {0}")]
    Dataplane(#[from] dataplane::DataplaneError),
    /// The control loop or the status socket failed.
    #[error(transparent)]
    Control(#[from] control::Error),
    /// The state store could not be opened (nothing was started).
    #[error("cannot open the state store: {0}")]
    Store(#[from] control::store::StoreError),
    /// `[metrics] listen` could not be served.
    #[error(transparent)]
    Metrics(#[from] metrics::MetricsError),
    /// `[api] listen` could not be served.
    #[error(transparent)]
    Api(#[from] api::ApiError),
    /// The control loop ended on its own (its log says why).
    #[error("the control loop stopped unexpectedly")]
    ControlDied,
}

/// Runs the node until a signal arrives.
pub(crate) fn run(path: &Path, log_level: &str, discard_applied: bool) -> ExitCode {
    let config = match load_and_log(path, log_level) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match serve(config, discard_applied) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "protego stopped");
            ExitCode::FAILURE
        }
    }
}

/// Loads the gateway configuration (errors to stderr with their excerpt), installs the
/// logger from its `log_format`, and logs its warnings.
pub(crate) fn load_and_log(path: &Path, log_level: &str) -> Result<Config, ExitCode> {
    let config = Config::load(path).map_err(|e| {
        crate::report_error(&e);
        ExitCode::FAILURE
    })?;
    if let Err(e) = init_logging(config.gateway.log_format, log_level) {
        eprintln!("error: {e}");
        return Err(ExitCode::FAILURE);
    }
    for w in &config.warnings {
        warn!(config = %path.display(), "{w}");
    }
    Ok(config)
}

/// Installs the logger: `level` (or RUST_LOG) as the filter, text or JSON lines on stderr.
pub(crate) fn init_logging(format: LogFormat, level: &str) -> Result<(), UpError> {
    use tracing_subscriber::EnvFilter;
    let text = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => level.to_owned(),
    };
    let filter = EnvFilter::try_new(&text).map_err(|e| UpError::LogFilter {
        filter: text.clone(),
        reason: e.to_string(),
    })?;
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let result = match format {
        LogFormat::Text => builder.with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
    };
    result.map_err(|e| UpError::Logger(e.to_string()))
}

fn serve(config: Config, discard_applied: bool) -> Result<(), UpError> {
    // Hook the signals first so that one arriving during start-up is not lost.
    let (signal_tx, signal_rx) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = signal_tx.try_send(());
    })?;

    // The store first: a second instance on the same file stops here, before any socket.
    // It may hold tenants, VNets and tunnels applied with `protego ctl apply`.
    // Records are sealed with `[store] encryption_key_file`'s key (without one, a warning says
    // that they are in clear).
    let mut store: Box<dyn control::store::Store> = Box::new(control::store::SealedStore::open(
        config.store.open()?,
        &config.store_encryption,
    )?);
    let (mut config, _) = control::applied::effective(config, &mut *store, discard_applied)?;
    // The filters loaded with `protego ctl filter`, if any, in place of the file's.
    let settings = control::filters::effective(&mut config, &mut *store, discard_applied)?;
    let config = &config;
    let (to_control, from_dataplane) = crossbeam_channel::bounded(CONTROL_QUEUE);
    let dp = Dataplane::start(config.dataplane.clone(), to_control)?;
    if let Err(e) = dp.set_cpu_fairness(&config.cpu_fairness()) {
        dp.shutdown();
        return Err(e.into());
    }
    // Tenant filters run before the first tunnel is up.
    if let Err(e) = dp.set_filters(&config.filters) {
        dp.shutdown();
        return Err(e.into());
    }
    // With the tenants' map settings (`protego ctl filter map update`) written again.
    control::filters::write_settings(&*dp, &settings);
    let datapath: Arc<dyn DataPath> = dp.clone();
    // The per-VM overlay routes live beside a file store (a memory store keeps none). They
    // are restored before IKE starts: an SA established earlier would carry packets to moved
    // VMs by the VNet's prefixes until the restore (seconds at 16 M entries) is done.
    let routes = match &config.store {
        control::config::StoreConfig::File { path } => {
            let routes = control::routes::RouteStore::beside(path);
            match routes.restore(&*datapath) {
                Ok(r) => {
                    info!(file = %routes.path().display(), snapshot = r.snapshot, journal = r.journal, skipped = r.skipped, ignored = r.ignored, "per-VM routes restored");
                    Some(Arc::new(routes))
                }
                Err(e) => {
                    dp.shutdown();
                    return Err(e.into());
                }
            }
        }
        _ => None,
    };
    let control = match ControlPlane::start(config, Arc::clone(&datapath), from_dataplane, store) {
        Ok(c) => c,
        Err(e) => {
            dp.shutdown();
            return Err(e.into());
        }
    };
    let mut responder = Responder::new(
        control.handle(),
        Arc::clone(&datapath),
        TunnelDirectory::from_config(config),
    );
    if let Some(routes) = routes {
        responder = responder.with_routes(routes);
    }
    let responder = Arc::new(responder);
    let server = match StatusServer::start(
        &config.gateway.control_socket,
        Arc::clone(&responder) as Arc<dyn control::status::RequestHandler>,
    ) {
        Ok(s) => s,
        Err(e) => {
            let _ = control.shutdown(Duration::ZERO);
            dp.shutdown();
            return Err(e.into());
        }
    };
    let node = metrics::host_name();
    let listeners = config
        .metrics
        .map(|m| metrics::MetricsServer::start(m.listen, &node, Arc::clone(&responder) as _))
        .transpose()
        .map_err(UpError::from)
        .and_then(|metrics| {
            let api = (config.api.as_ref())
                .map(|a| api::ApiServer::start(config, a, &node, Arc::clone(&responder) as _))
                .transpose()?;
            Ok((metrics, api))
        });
    let (metrics, api) = match listeners {
        Ok(l) => l,
        Err(e) => {
            server.shutdown();
            let _ = control.shutdown(Duration::ZERO);
            dp.shutdown();
            return Err(e);
        }
    };
    info!(
        config = %config.path.display(),
        tunnels = config.tunnels.len(),
        socket = %server.path().display(),
        "protego is up"
    );

    let outcome = loop {
        match signal_rx.recv_timeout(WATCHDOG) {
            Ok(()) => break Ok(()),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) if control.is_running() => {}
            Err(_) => break Err(UpError::ControlDied),
        }
    };
    info!("shutting down");
    drop(api);
    drop(metrics);
    server.shutdown();
    if let Err(e) = control.shutdown(SHUTDOWN_GRACE) {
        warn!(error = %e, "control loop did not stop cleanly");
    }
    drop(datapath);
    dp.shutdown();
    info!("stopped");
    outcome
}
