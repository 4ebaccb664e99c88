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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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
        let bind = |source| MetricsError::Bind {
            addr: listen,
            source,
        };
        let listener = std::net::TcpListener::bind(listen).map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let addr = listener.local_addr().map_err(bind)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .max_blocking_threads(2)
            .thread_name("protego-metrics")
            .on_thread_start(yield_to_forwarding)
            .build()
            .map_err(MetricsError::Start)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let node: Arc<str> = Arc::from(node);
        let capacity = Arc::new(AtomicUsize::new(64 * 1024));
        let router = Router::new()
            .route(
                "/metrics",
                get(move || {
                    scrape(
                        Arc::clone(&source),
                        Arc::clone(&node),
                        Arc::clone(&capacity),
                    )
                }),
            )
            .route("/", get(index));
        let thread = std::thread::Builder::new()
            .name("protego-metrics".into())
            .spawn(move || {
                yield_to_forwarding();
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(%addr, error = %e, "metrics listener failed");
                            return;
                        }
                    };
                    let served = axum::serve(listener, router)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                    if let Err(e) = served {
                        tracing::error!(%addr, error = %e, "metrics listener failed");
                    }
                });
            })
            .map_err(MetricsError::Start)?;
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

/// One scrape, read and formatted off the runtime's thread into a buffer the size of the
/// last one.
async fn scrape(
    source: Arc<dyn Source>,
    node: Arc<str>,
    capacity: Arc<AtomicUsize>,
) -> axum::response::Response {
    let rendered = tokio::task::spawn_blocking(move || {
        let (text, missing) = crate::render_sized(&source, &node, capacity.load(Ordering::Relaxed));
        // A little headroom for a growing node.
        capacity.store(text.len() + text.len() / 8, Ordering::Relaxed);
        (text, missing)
    })
    .await;
    match rendered {
        Ok((text, missing)) => {
            if let Some(reason) = missing {
                tracing::warn!(%reason, "metrics scrape incomplete (protego_up 0)");
            }
            ([(header::CONTENT_TYPE, OPENMETRICS)], text).into_response()
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
