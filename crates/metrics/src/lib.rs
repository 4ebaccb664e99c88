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

pub use server::{serve_on_thread, MetricsError, MetricsServer, ServingError};

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
        let v = *self;
        // Whole numbers (timestamps above all) as the integer and `.0`, which is what `dtoa`
        // writes for them below 2^53, without its search for the shortest digits; `-0.0`
        // keeps its sign through `dtoa`.
        if v.fract() == 0.0 && v.abs() < WHOLE_BELOW && !(v == 0.0 && v.is_sign_negative()) {
            out.push_str(itoa::Buffer::new().format(v as i64));
            out.push_str(".0");
            return;
        }
        out.push_str(dtoa::Buffer::new().format(v));
    }
}

/// Whole `f64` values below this are written as integers (every integer below 2^53 is exact).
const WHOLE_BELOW: f64 = 9_007_199_254_740_992.0;

impl Value for f32 {
    fn write(&self, out: &mut String) {
        f64::from(*self).write(out);
    }
}

/// Appends `value` with `\`, `"` and newlines escaped (a label value's escaping).
fn push_escaped(out: &mut String, value: &str) {
    if !needs_escaping(value.as_bytes()) {
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

/// Whether `bytes` holds a `\`, `"` or newline. Label values almost never do, and every
/// series has several, so this looks at eight bytes at a time: a word XORed with a byte
/// repeated has a zero byte exactly where that byte was, and `(x - 0x01..) & !x & 0x80..`
/// is non-zero exactly when `x` has a zero byte.
fn needs_escaping(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS != 0;
    let has = |word: u64, byte: u8| has_zero_byte(word ^ (ONES * u64::from(byte)));
    let mut words = bytes.chunks_exact(8);
    for chunk in &mut words {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        let word = u64::from_ne_bytes(word);
        if has(word, b'\\') | has(word, b'"') | has(word, b'\n') {
            return true;
        }
    }
    (words.remainder().iter()).any(|b| matches!(b, b'\\' | b'"' | b'\n'))
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

    /// The start of a family's series up to the `node` label, written once per family:
    /// `NAME_SUFFIX{FIRST,node=".."` (`first`: a histogram bucket's `le`, written first as
    /// `prometheus-client` does).
    fn head(&self, name: &str, suffix: &str, first: Option<&str>) -> String {
        let mut head = String::with_capacity(name.len() + suffix.len() + self.node.len() + 32);
        head.push_str(name);
        head.push_str(suffix);
        head.push('{');
        if let Some(first) = first {
            head.push_str(first);
            head.push(',');
        }
        head.push_str(&self.node);
        head
    }

    /// One sample: the series (`head`, then its labels), a space, the value, a newline.
    fn sample<L: SeriesLabels + ?Sized, V: Value>(&mut self, head: &str, labels: &L, value: &V) {
        let out = &mut *self.out;
        out.push_str(head);
        labels.write(out);
        out.push_str("} ");
        value.write(out);
        out.push('\n');
    }

    /// A counter family (the samples are named `NAME_total`).
    pub fn counter<L: SeriesLabels, V: Value>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, V)>,
    ) -> std::fmt::Result {
        self.family(name, help, "counter", "_total", samples);
        Ok(())
    }

    /// A gauge family.
    pub fn gauge<L: SeriesLabels, V: Value>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, V)>,
    ) -> std::fmt::Result {
        self.family(name, help, "gauge", "", samples);
        Ok(())
    }

    /// An info family (samples `NAME_info 1` whose labels are the information).
    pub fn info<L: SeriesLabels>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = L>,
    ) -> std::fmt::Result {
        let samples = samples.into_iter().map(|labels| (labels, 1u32));
        self.family(name, help, "info", "_info", samples);
        Ok(())
    }

    /// A family of one sample per series, named `NAME_SUFFIX`.
    fn family<L: SeriesLabels, V: Value>(
        &mut self,
        name: &str,
        help: &str,
        kind: &str,
        suffix: &str,
        samples: impl IntoIterator<Item = (L, V)>,
    ) {
        self.descriptor(name, help, kind);
        let head = self.head(name, suffix, None);
        for (labels, value) in samples {
            if labels.kept(self.tenant) {
                self.sample(&head, &labels, &value);
            }
        }
    }

    /// `labels` escaped once, for series that several families write with the same labels
    /// (a tunnel's `tenant` and `tunnel`): each series then copies one run of bytes instead
    /// of gathering and checking every value again. The set belongs to these families (it
    /// remembers whether their tenant's view keeps it).
    pub fn label_set(&self, labels: &Labels<'_>) -> LabelSet {
        let mut text =
            String::with_capacity(labels.iter().map(|(k, v)| k.len() + v.len() + 4).sum());
        labels.write(&mut text);
        LabelSet {
            text,
            kept: labels.kept(self.tenant),
        }
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
            if !labels.kept(self.tenant) {
                continue;
            }
            self.sample(&self.head(name, "_sum", None), labels, &h.sum);
            self.sample(&self.head(name, "_count", None), labels, &h.count);
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
                self.sample(&self.head(name, "_bucket", Some(&le)), labels, &cumulative);
            }
        }
        Ok(())
    }
}

/// A series' labels after `node`: (name, value) pairs, or a [`LabelSet`] escaped before.
pub trait SeriesLabels {
    /// Whether the series is written for `tenant`'s view (`None`: every series is); a series
    /// without a `tenant` label is not.
    fn kept(&self, tenant: Option<&str>) -> bool;
    /// Appends `,NAME="VALUE"` for each label, values escaped.
    fn write(&self, out: &mut String);
}

impl SeriesLabels for Labels<'_> {
    fn kept(&self, tenant: Option<&str>) -> bool {
        tenant.is_none_or(|t| self.iter().any(|&(k, v)| k == "tenant" && v == t))
    }

    fn write(&self, out: &mut String) {
        for (key, value) in self {
            out.push(',');
            out.push_str(key);
            out.push_str("=\"");
            push_escaped(out, value);
            out.push('"');
        }
    }
}

impl<T: SeriesLabels + ?Sized> SeriesLabels for &T {
    fn kept(&self, tenant: Option<&str>) -> bool {
        (**self).kept(tenant)
    }

    fn write(&self, out: &mut String) {
        (**self).write(out);
    }
}

/// A label set followed by more labels (a tunnel's labels with a `direction`), written
/// without building a new set.
impl SeriesLabels for (&LabelSet, &Labels<'_>) {
    fn kept(&self, tenant: Option<&str>) -> bool {
        self.0.kept || self.1.kept(tenant)
    }

    fn write(&self, out: &mut String) {
        self.0.write(out);
        self.1.write(out);
    }
}

/// Labels escaped once by [`Families::label_set`].
#[derive(Debug, Clone)]
pub struct LabelSet {
    /// `,NAME="VALUE"...`, escaped.
    text: String,
    /// Whether the view of the families that made it keeps its series.
    kept: bool,
}

impl SeriesLabels for LabelSet {
    fn kept(&self, _: Option<&str>) -> bool {
        self.kept
    }

    fn write(&self, out: &mut String) {
        out.push_str(&self.text);
    }
}

/// Renders one scrape of `source`: its families, then `protego_up` (1 when everything could be
/// read) and `protego_scrape_duration_seconds`, then `# EOF`. Returns the text and the
/// reason a part was missing, if one was.
pub fn render(source: &Arc<dyn Source>, node: &str) -> (String, Option<String>) {
    let mut text = String::with_capacity(64 * 1024);
    let missing = render_into(source, node, None, &mut text);
    (text, missing)
}

/// [`render`] of only the series labelled `tenant = tenant` (what the HTTP API gives a tenant:
/// its tunnels, filters and CPU, nothing node-wide), plus the scrape-health families.
pub fn render_for_tenant(
    source: &Arc<dyn Source>,
    node: &str,
    tenant: &str,
) -> (String, Option<String>) {
    let mut text = String::with_capacity(64 * 1024);
    let missing = render_into(source, node, Some(tenant), &mut text);
    (text, missing)
}

/// [`render`] (or, with `tenant`, [`render_for_tenant`]) into `text`, emptied first: the
/// listener passes the last scrape's buffer, since a text of tens of megabytes allocated
/// anew costs page faults on every scrape and grown by doubling costs copies. Returns the
/// reason a part was missing, if one was.
pub fn render_into(
    source: &Arc<dyn Source>,
    node: &str,
    tenant: Option<&str>,
    text: &mut String,
) -> Option<String> {
    let started = std::time::Instant::now();
    text.clear();
    let missing = match source.collect(&mut Families::new(text, node, tenant)) {
        Ok(()) => None,
        Err(Collect::Unavailable(reason)) => Some(reason),
        Err(Collect::Format(_)) => Some("the exposition could not be formatted".to_owned()),
    };
    let mut health = Families::new(text, node, None);
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
    missing
}

#[cfg(test)]
mod tests;
