//! The HTTP API with per-tenant access and the web console of `[api] listen` (docs/api.md).
//!
//! The API is a second front to the control socket's [`RequestHandler`]: each route turns
//! into the same [`control::status::Request`] that `protego ctl` sends, so the socket and the
//! API cannot disagree. What the API adds is who may ask: every request under `/api/v1/` is
//! authenticated (a bearer token of `tokens_file`, or a client certificate signed by
//! `client_ca_file`) and authorised: an operator sees everything, a tenant only its own
//! tunnels, attachments, filters and metrics, and another tenant's object is answered `404`
//! exactly as a missing one ([`routes`]).
//!
//! One thread runs the listener on a single-threaded runtime (TLS with rustls on aws-lc-rs,
//! HTTP/1.1 with hyper and axum); the handler's calls, which may wait for the control loop or
//! for a migration, run on its blocking threads. The same thread samples the tunnels' traffic
//! for the console's charts ([`history`]).

mod auth;
mod history;
mod openapi;
mod routes;
mod tls;
mod view;

pub use auth::{certificate_principal, new_token, Principal, Role, TokenFile, Tokens, Via};
pub use openapi::OPENAPI;
pub use routes::route_table;

use control::config::{ApiConfig, Config};
use control::status::RequestHandler;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// What the API serves: the control socket's requests and the node's metrics.
pub trait Backend: RequestHandler + metrics::Source {}

impl<T: RequestHandler + metrics::Source> Backend for T {}

/// Why the API could not start.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The address could not be bound.
    #[error("[api] listen = \"{addr}\": cannot listen: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// A certificate, key or CA file is unusable.
    #[error("[api] {}: {reason}", path.display())]
    Tls {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The tokens file is unusable.
    #[error("[api] tokens_file: {0}")]
    Tokens(String),
    /// The serving thread or its runtime could not be started.
    #[error("cannot start the API listener: {0}")]
    Start(std::io::Error),
}

/// Longest request body: a whole configuration for `apply`, or a filter object in Base64
/// (the control socket's line limit).
const MAX_BODY: usize = 16 * 1024 * 1024;
/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 256;
/// How long a client may take for its TLS handshake and for a request's headers.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Threads for the handler's calls (each may wait up to a migration's 45 s).
const BLOCKING_THREADS: usize = 8;

/// The state every route shares.
pub(crate) struct Api {
    backend: Arc<dyn Backend>,
    tokens: Option<Tokens>,
    /// The `node` label of the metrics.
    node: String,
    /// The node's configuration file: `apply` reads relative `psk_file`s from its directory.
    config_path: PathBuf,
    /// The configured L2 attachments (fixed until a restart).
    attachments: Vec<datapath::AttachmentConfig>,
    history: history::History,
}

/// A running API listener; stops when dropped.
pub struct ApiServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl ApiServer {
    /// Binds `config.api` (which must be set) and serves the API and the console for
    /// `backend`; `node` labels the metrics.
    pub fn start(
        config: &Config,
        api: &ApiConfig,
        node: &str,
        backend: Arc<dyn Backend>,
    ) -> Result<Self, ApiError> {
        let tls = tls::server_config(api)?;
        let tokens = api
            .tokens_file
            .as_deref()
            .map(Tokens::open)
            .transpose()
            .map_err(ApiError::Tokens)?;
        let state = Arc::new(Api {
            backend,
            tokens,
            node: node.to_owned(),
            config_path: config.path.clone(),
            attachments: config.dataplane.attachments.clone(),
            history: history::History::default(),
        });
        let router = routes::router(Arc::clone(&state));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let served = metrics::serve_on_thread(
            api.listen,
            "protego-api",
            BLOCKING_THREADS,
            move |listener| async move {
                tokio::spawn(history::sample(Arc::clone(&state), stopped.clone()));
                serve(listener, tls, router, stopped).await;
            },
        );
        let (addr, thread) = served.map_err(|e| match e {
            metrics::ServingError::Bind(source) => ApiError::Bind {
                addr: api.listen,
                source,
            },
            metrics::ServingError::Start(e) => ApiError::Start(e),
        })?;
        tracing::info!(%addr, tls = api.tls.is_some(), client_certificates = api.client_ca_file.is_some(), tokens = api.tokens_file.is_some(), "serving the HTTP API and web console");
        Ok(Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a connection brings to its requests: the principal of its client certificate, if
/// it presented one that names a role, and the reason one was refused otherwise.
#[derive(Debug, Clone, Default)]
pub(crate) struct Connection {
    pub(crate) certificate: Option<Result<Principal, String>>,
}

/// Accepts connections until `stopped`, each served on a task of its own.
async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: axum::Router,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (tcp, peer) = tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "API accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let router = router.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match acceptor {
                None => connection(tcp, Connection::default(), router).await,
                Some(acceptor) => {
                    let tls =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "API TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "API TLS handshake timed out");
                                return;
                            }
                        };
                    let certificate = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|leaf| certificate_principal(leaf));
                    connection(tls, Connection { certificate }, router).await;
                }
            }
        });
    }
}

/// Serves HTTP/1.1 requests on one connection.
async fn connection<I>(io: I, info: Connection, router: axum::Router)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(
        router.layer(axum::Extension(Arc::new(info))),
    );
    let served = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "API connection ended with an error");
    }
}

#[cfg(test)]
mod tests;
