//! Metrics of a Protego node in the Prometheus text format (OpenMetrics 1.0, byte for byte as
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

use std::fmt::Write as _;
use std::sync::Arc;

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

/// A sample's value, written as the OpenMetrics text format writes numbers (integers in
/// decimal, floats as `dtoa` writes them: `1.0`, `0.5`, `1e300`).
pub trait Value {
    /// Appends the value to `out`.
    fn write(&self, out: &mut String);
}

macro_rules! integer_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn write(&self, out: &mut String) {
                out.push_str(itoa::Buffer::new().format(*self));
            }
        }
    )*};
}
integer_value!(u32, u64, usize, i32, i64);

impl Value for f64 {
    fn write(&self, out: &mut String) {
        out.push_str(dtoa::Buffer::new().format(*self));
    }
}

impl Value for f32 {
    fn write(&self, out: &mut String) {
        f64::from(*self).write(out);
    }
}

/// Appends `value` with `\`, `"` and newlines escaped (a label value's escaping).
fn push_escaped(out: &mut String, value: &str) {
    // A fold without an early exit, which the compiler turns into vector compares: label
    // values almost never need escaping.
    let plain = !value
        .bytes()
        .fold(false, |found, b| found | matches!(b, b'\\' | b'"' | b'\n'));
    if plain {
        out.push_str(value);
        return;
    }
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// The families of one scrape, written in order. Each method writes one family (its `HELP`
/// and `TYPE` lines, then its samples); family names follow the Prometheus conventions (a
/// counter's name is given without `_total`: the format adds it).
///
/// The text is the OpenMetrics 1.0 exposition, byte for byte what `prometheus-client` 0.26
/// writes for the same families (a test holds the two to it). It is written here rather
/// than through that crate because a scrape of 10 000 tunnels is about 270 000 series: the
/// crate encodes every label through a trait object into a buffer that is copied again,
/// while this writer escapes the `node` label once per scrape and appends each series to
/// the output once (docs/performance.md, "Metrics scrapes").
pub struct Families<'o, 'n> {
    out: &'o mut String,
    /// `node="NAME"`, escaped once.
    node: String,
    node_name: &'n str,
    /// Only the series labelled `tenant = this` are written (a tenant's view).
    tenant: Option<&'n str>,
}

impl<'o, 'n> Families<'o, 'n> {
    /// Families appended to `out`, every series labelled `node = node`; with `tenant`, only
    /// the series labelled with that tenant.
    fn new(out: &'o mut String, node: &'n str, tenant: Option<&'n str>) -> Self {
        let mut label = String::from("node=\"");
        push_escaped(&mut label, node);
        label.push('"');
        Self {
            out,
            node: label,
            node_name: node,
            tenant,
        }
    }

    /// The node's name (the `node` label).
    pub fn node(&self) -> &str {
        self.node_name
    }

    /// `# HELP` and `# TYPE` of a family.
    fn descriptor(&mut self, name: &str, help: &str, kind: &str) {
        let _ = write!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
    }

    /// A series' name and labels: `NAME_SUFFIX{FIRST,node="..",LABELS}` (`first`: a
    /// histogram bucket's `le`, written first as `prometheus-client` does).
    fn series(&mut self, name: &str, suffix: &str, first: Option<&str>, labels: &Labels<'_>) {
        let out = &mut *self.out;
        out.push_str(name);
        out.push_str(suffix);
        out.push('{');
        if let Some(first) = first {
            out.push_str(first);
            out.push(',');
        }
        out.push_str(&self.node);
        for (key, value) in labels {
            out.push(',');
            out.push_str(key);
            out.push_str("=\"");
            push_escaped(out, value);
            out.push('"');
        }
        out.push('}');
    }

    /// One sample: its series, a space, the value, a newline.
    fn sample(&mut self, name: &str, suffix: &str, labels: &Labels<'_>, value: &dyn Value) {
        self.series(name, suffix, None, labels);
        self.out.push(' ');
        value.write(self.out);
        self.out.push('\n');
    }

    /// A counter family (the samples are named `NAME_total`).
    pub fn counter<'l, V: Value + 'l>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (&'l Labels<'l>, V)>,
    ) -> std::fmt::Result {
        self.descriptor(name, help, "counter");
        for (labels, value) in samples {
            if keeps(self.tenant, labels) {
                self.sample(name, "_total", labels, &value);
            }
        }
        Ok(())
    }

    /// A gauge family.
    pub fn gauge<'l, V: Value + 'l>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (&'l Labels<'l>, V)>,
    ) -> std::fmt::Result {
        self.descriptor(name, help, "gauge");
        for (labels, value) in samples {
            if keeps(self.tenant, labels) {
                self.sample(name, "", labels, &value);
            }
        }
        Ok(())
    }

    /// An info family (samples `NAME_info 1` whose labels are the information).
    pub fn info<'l>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = &'l Labels<'l>>,
    ) -> std::fmt::Result {
        self.descriptor(name, help, "info");
        for labels in samples {
            if keeps(self.tenant, labels) {
                self.sample(name, "_info", labels, &1u32);
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
        self.descriptor(name, help, "histogram");
        for (labels, h) in samples {
            if !keeps(self.tenant, labels) {
                continue;
            }
            self.sample(name, "_sum", labels, &h.sum);
            self.sample(name, "_count", labels, &h.count);
            let mut cumulative = 0u64;
            for &(bound, n) in &h.buckets {
                cumulative += n;
                let mut le = String::from("le=\"");
                if bound == f64::INFINITY {
                    le.push_str("+Inf");
                } else {
                    bound.write(&mut le);
                }
                le.push('"');
                self.series(name, "_bucket", Some(&le), labels);
                self.out.push(' ');
                cumulative.write(self.out);
                self.out.push('\n');
            }
        }
        Ok(())
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
    let mut text = String::with_capacity(capacity);
    let missing = match source.collect(&mut Families::new(&mut text, node, tenant)) {
        Ok(()) => None,
        Err(Collect::Unavailable(reason)) => Some(reason),
        Err(Collect::Format(_)) => Some("the exposition could not be formatted".to_owned()),
    };
    let mut health = Families::new(&mut text, node, None);
    // The scrape-health families, written after the source's.
    let _ = health.gauge(
        "protego_up",
        "1 if this scrape could read all of the node's figures, 0 if some were missing (the log says why).",
        [(&[][..], u32::from(missing.is_none()))],
    );
    let _ = health.gauge(
        "protego_scrape_duration_seconds",
        "Time this scrape took to read and format the node's figures.",
        [(&[][..], started.elapsed().as_secs_f64())],
    );
    text.push_str("# EOF\n");
    (text, missing)
}

#[cfg(test)]
mod tests;
