//! The `[metrics] listen` HTTP listener: `GET /metrics` answers one scrape of the node's
//! [`Source`](crate::Source) in the Prometheus text format; `/` says where the metrics are.
//! One thread with a single-threaded runtime serves it; each scrape reads the figures on a
//! blocking thread of that runtime, never on a data-plane worker.

use crate::Source;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// The content type of the exposition (OpenMetrics 1.0 text).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound.
    #[error("[metrics] listen = \"{addr}\": cannot listen: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The serving thread or its runtime could not be started.
    #[error("cannot start the metrics listener: {0}")]
    Start(std::io::Error),
}

/// A running metrics listener; stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `listen` and serves `source`'s metrics there, every series labelled `node`.
    pub fn start(
        listen: SocketAddr,
        node: &str,
        source: Arc<dyn Source>,
    ) -> Result<Self, MetricsError> {
        let node: Arc<str> = Arc::from(node);
        let spare = Spare::default();
        let router = Router::new()
            .route(
                "/metrics",
                get(move || scrape(Arc::clone(&source), Arc::clone(&node), spare.clone())),
            )
            .route("/", get(index));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = serve_on_thread(listen, "protego-metrics", 2, move |listener| async move {
            let addr = listener.local_addr().ok();
            let served = axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!(?addr, error = %e, "metrics listener failed");
            }
        });
        let (addr, thread) = served.map_err(|e| match e {
            ServingError::Bind(source) => MetricsError::Bind {
                addr: listen,
                source,
            },
            ServingError::Start(e) => MetricsError::Start(e),
        })?;
        tracing::info!(%addr, "serving metrics at /metrics");
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

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Why [`serve_on_thread`] failed.
#[derive(Debug)]
pub enum ServingError {
    /// The address could not be bound.
    Bind(std::io::Error),
    /// The thread or its runtime could not be started.
    Start(std::io::Error),
}

/// Binds `listen` and serves it on a thread of its own, `name`, with a single-threaded tokio
/// runtime (at most `blocking` threads for blocking work, all named `name` and at a lower
/// priority than forwarding): `serve` runs there on the bound listener until it returns (its
/// owner tells it when). Returns the bound address (the port the kernel chose for port 0)
/// and the thread. The `[metrics]` and `[api]` listeners are served so.
pub fn serve_on_thread<F, Fut>(
    listen: SocketAddr,
    name: &'static str,
    blocking: usize,
    serve: F,
) -> Result<(SocketAddr, JoinHandle<()>), ServingError>
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let listener = std::net::TcpListener::bind(listen).map_err(ServingError::Bind)?;
    listener.set_nonblocking(true).map_err(ServingError::Bind)?;
    let addr = listener.local_addr().map_err(ServingError::Bind)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(blocking)
        .thread_name(name)
        .on_thread_start(yield_to_forwarding)
        .build()
        .map_err(ServingError::Start)?;
    let thread = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            yield_to_forwarding();
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => serve(listener).await,
                    Err(e) => tracing::error!(%addr, error = %e, "{name}: listener failed"),
                }
            });
        })
        .map_err(ServingError::Start)?;
    Ok((addr, thread))
}

/// Nice value of the listener's threads: a scrape's reading and formatting takes CPU time
/// only where the data plane's workers (nice 0) leave it, so that scraping thousands of
/// tunnels does not delay packets on a busy node (a scrape then takes longer instead).
const NICE: libc::c_int = 10;

/// Lowers the calling thread's scheduling priority to [`NICE`] (Linux: per thread).
fn yield_to_forwarding() {
    // SAFETY: gettid and setpriority take no pointers; on Linux PRIO_PROCESS with a thread
    // id sets that thread's nice value.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE)
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "metrics thread keeps its priority");
    }
}

/// The text buffer of the last scrape, given back when its response has been sent: the next
/// scrape writes into it instead of allocating tens of megabytes again (at 10 000 tunnels a
/// fresh buffer cost a sixth of the formatting in page faults). Holds at most one buffer, as
/// large as the largest scrape's text; a scrape while another's response is still being
/// sent allocates its own.
#[derive(Clone, Default)]
struct Spare(Arc<Mutex<Option<String>>>);

impl Spare {
    fn take(&self) -> String {
        (self.0.lock().unwrap_or_else(PoisonError::into_inner).take()).unwrap_or_default()
    }

    fn give_back(&self, text: String) {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_none_or(|s| s.capacity() < text.capacity()) {
            *slot = Some(text);
        }
    }
}

/// A scrape's text as a response body; gives the buffer back to [`Spare`] when dropped.
struct Pooled {
    text: Option<String>,
    spare: Spare,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.text.as_deref().unwrap_or_default().as_bytes()
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(text) = self.text.take() {
            self.spare.give_back(text);
        }
    }
}

/// One scrape, read and formatted off the runtime's thread into the last scrape's buffer.
async fn scrape(source: Arc<dyn Source>, node: Arc<str>, spare: Spare) -> axum::response::Response {
    let rendered = tokio::task::spawn_blocking(move || {
        let mut text = spare.take();
        let missing = crate::render_into(&source, &node, None, &mut text);
        (
            Pooled {
                text: Some(text),
                spare,
            },
            missing,
        )
    })
    .await;
    match rendered {
        Ok((text, missing)) => {
            if let Some(reason) = missing {
                tracing::warn!(%reason, "metrics scrape incomplete (protego_up 0)");
            }
            let body = axum::body::Body::from(bytes::Bytes::from_owner(text));
            ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "metrics scrape failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the scrape failed; see the node's log\n",
            )
                .into_response()
        }
    }
}

async fn index() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "Protego metrics: GET /metrics (Prometheus text format; docs/operations.md, \"Metrics\")\n",
    )
}
