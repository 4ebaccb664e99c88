//! Metrics of a Protego node in the Prometheus text format (OpenMetrics 1.0, as
//! `prometheus-client` writes it), and the HTTP listener of `[metrics] listen` that serves them
//! at `/metrics`.
//!
//! Every role has a [`Source`]: at each scrape it reads the node's figures *then* (nothing is
//! kept between scrapes, so there is no second copy of a counter to go stale) and writes them
//! as metric families through [`Families`], which puts the node's `node` label first on every
//! series. A source that cannot read part of its figures (the control loop did not answer, say)
//! writes what it has and returns an error: the scrape still answers, with `protego_up 0` and
//! the reason in the log (the scrape-health metric the users of IPsec exporters ask for).
//! The families each role exports are listed in docs/operations.md ("Metrics").

mod server;

pub use server::{MetricsError, MetricsServer};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex, PoisonError};

/// `[metrics]`: where a node serves its metrics (every role's configuration file has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsConfig {
    /// `listen`: the address and port of the HTTP listener.
    pub listen: std::net::SocketAddr,
}

impl MetricsConfig {
    /// Parses `listen`: an address and a port (`"0.0.0.0:9180"`, `"[::1]:9180"`); the error
    /// says what is expected.
    pub fn parse(listen: &str) -> Result<Self, String> {
        listen
            .trim()
            .parse::<std::net::SocketAddr>()
            .map(|listen| Self { listen })
            .map_err(|_| {
                format!(
                    "must be an address and port, e.g. \"0.0.0.0:9180\" or \"[::1]:9180\" (got {listen:?})"
                )
            })
    }
}

/// This machine's host name (the `node` label of a single-process gateway), or `localhost`
/// if the kernel does not say.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Series labels: (name, value) pairs after the node's own `node` label.
pub type Labels<'a> = [(&'a str, &'a str)];

/// A node's figures, read at each scrape.
pub trait Source: Send + Sync + 'static {
    /// Writes the node's metric families. On a failure to *read* figures, writes what it
    /// has and returns the reason ([`Collect::Unavailable`]).
    fn collect(&self, out: &mut Families<'_, '_>) -> Result<(), Collect>;
}

/// Why a collection ended early.
#[derive(Debug, thiserror::Error)]
pub enum Collect {
    /// Some figures could not be read (the scrape reports `protego_up 0`).
    #[error("{0}")]
    Unavailable(String),
    /// Writing the text failed.
    #[error("formatting the exposition failed")]
    Format(#[from] std::fmt::Error),
}

/// A histogram's state: its sum, count and per-bucket counts (not cumulative) by upper
/// bound, the last bound being `f64::INFINITY`.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
    /// (upper bound, observations in the bucket), ascending.
    pub buckets: Vec<(f64, u64)>,
}

/// The families of one scrape, written in order. Each method writes one family (its `HELP`
/// and `TYPE` lines, then its samples); family names follow the Prometheus conventions (a
/// counter's name is given without `_total`: the format adds it).
pub struct Families<'e, 'n> {
    encoder: DescriptorEncoder<'e>,
    node: &'n str,
    /// Only the series labelled `tenant = this` are written (a tenant's view).
    tenant: Option<&'n str>,
}

impl<'e, 'n> Families<'e, 'n> {
    /// Families written through `encoder`, every series labelled `node = node`; with `tenant`,
    /// only the series labelled with that tenant.
    fn new(encoder: DescriptorEncoder<'e>, node: &'n str, tenant: Option<&'n str>) -> Self {
        Self {
            encoder,
            node,
            tenant,
        }
    }

    /// The node's name (the `node` label).
    pub fn node(&self) -> &str {
        self.node
    }

    /// One family of `kind`: its descriptor, then each sample's labels (after `node`) and
    /// value, written by `write`.
    fn family<'l, T: 'l>(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        samples: impl IntoIterator<Item = (&'l Labels<'l>, T)>,
        write: impl Fn(&mut MetricEncoder<'_>, T) -> std::fmt::Result,
    ) -> std::fmt::Result {
        let node = [("node", self.node)];
        let tenant = self.tenant;
        let mut family = self.encoder.encode_descriptor(name, help, None, kind)?;
        for (labels, value) in samples {
            if keeps(tenant, labels) {
                write(&mut family.encode_family(&(&node[..], labels))?, value)?;
            }
        }
        Ok(())
    }

    /// A counter family (the samples are named `NAME_total`).
    pub fn counter<'l, V: EncodeCounterValue + 'l>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (&'l Labels<'l>, V)>,
    ) -> std::fmt::Result {
        self.family(name, help, MetricType::Counter, samples, |m, v| {
            m.encode_counter::<NoLabelSet, _, u64>(&v, None)
        })
    }

    /// A gauge family.
    pub fn gauge<'l, V: EncodeGaugeValue + 'l>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (&'l Labels<'l>, V)>,
    ) -> std::fmt::Result {
        self.family(name, help, MetricType::Gauge, samples, |m, v| {
            m.encode_gauge(&v)
        })
    }

    /// An info family (samples `NAME_info 1` whose labels are the information).
    pub fn info<'l>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = &'l Labels<'l>>,
    ) -> std::fmt::Result {
        let node = [("node", self.node)];
        let tenant = self.tenant;
        let mut family = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Info)?;
        for labels in samples {
            if keeps(tenant, labels) {
                family.encode_info(&(&node[..], labels))?;
            }
        }
        Ok(())
    }

    /// A histogram family.
    pub fn histogram<'l>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (&'l Labels<'l>, &'l Histogram)>,
    ) -> std::fmt::Result {
        self.family(name, help, MetricType::Histogram, samples, |m, h| {
            m.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
        })
    }
}

/// Whether a series with `labels` is written for `tenant` (every series without one).
fn keeps(tenant: Option<&str>, labels: &Labels<'_>) -> bool {
    tenant.is_none_or(|t| labels.iter().any(|&(k, v)| k == "tenant" && v == t))
}

/// Renders one scrape of `source`: its families, then `protego_up` (1 when everything could be
/// read) and `protego_scrape_duration_seconds`, then `# EOF`. Returns the text and the
/// reason a part was missing, if one was.
pub fn render(source: &Arc<dyn Source>, node: &str) -> (String, Option<String>) {
    render_sized(source, node, 64 * 1024)
}

/// [`render`] into a buffer of `capacity` bytes to start with (the last scrape's size: a
/// text of tens of megabytes grown by doubling costs page faults and copies).
pub fn render_sized(
    source: &Arc<dyn Source>,
    node: &str,
    capacity: usize,
) -> (String, Option<String>) {
    render_filtered(source, node, capacity, None)
}

/// [`render`] of only the series labelled `tenant = tenant` (what the HTTP API gives a tenant:
/// its tunnels, filters and CPU, nothing node-wide), plus the scrape-health families.
pub fn render_for_tenant(
    source: &Arc<dyn Source>,
    node: &str,
    tenant: &str,
) -> (String, Option<String>) {
    render_filtered(source, node, 64 * 1024, Some(tenant))
}

fn render_filtered(
    source: &Arc<dyn Source>,
    node: &str,
    capacity: usize,
    tenant: Option<&str>,
) -> (String, Option<String>) {
    let started = std::time::Instant::now();
    let missing = Arc::new(Mutex::new(None));
    let mut text = String::with_capacity(capacity);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        source: Arc::clone(source),
        node: node.to_owned(),
        tenant: tenant.map(str::to_owned),
        missing: Arc::clone(&missing),
    }));
    let formatted = prometheus_client::encoding::text::encode_registry(&mut text, &registry);
    drop(registry);
    let mut missing = missing
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    if formatted.is_err() && missing.is_none() {
        missing = Some("the exposition could not be formatted".to_owned());
    }
    let mut health = Registry::default();
    health.register_collector(Box::new(Health {
        node: node.to_owned(),
        up: u32::from(missing.is_none()),
        elapsed: started.elapsed().as_secs_f64(),
    }));
    // Writing into a String does not fail; an error here would be the encoder's.
    let _ = prometheus_client::encoding::text::encode_registry(&mut text, &health);
    let _ = prometheus_client::encoding::text::encode_eof(&mut text);
    (text, missing)
}

/// One scrape's source, run inside the registry's encoding; keeps the reason a part of the
/// figures was missing.
struct Scrape {
    source: Arc<dyn Source>,
    node: String,
    tenant: Option<String>,
    missing: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Collector for Scrape {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let mut families = Families::new(encoder, &self.node, self.tenant.as_deref());
        match self.source.collect(&mut families) {
            Ok(()) => Ok(()),
            Err(Collect::Unavailable(reason)) => {
                *self.missing.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
                Ok(())
            }
            Err(Collect::Format(e)) => Err(e),
        }
    }
}

/// The scrape-health families, written after the source's.
#[derive(Debug)]
struct Health {
    node: String,
    up: u32,
    elapsed: f64,
}

impl Collector for Health {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let mut f = Families::new(encoder, &self.node, None);
        f.gauge(
            "protego_up",
            "1 if this scrape could read all of the node's figures, 0 if some were missing (the log says why).",
            [(&[][..], self.up)],
        )?;
        f.gauge(
            "protego_scrape_duration_seconds",
            "Time this scrape took to read and format the node's figures.",
            [(&[][..], self.elapsed)],
        )
    }
}

#[cfg(test)]
mod tests;
