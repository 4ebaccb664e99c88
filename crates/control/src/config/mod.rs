//! The `protego up --config FILE` configuration: a TOML file whose keys carry the meaning
//! swanctl.conf gives them (see `docs/configuration.md` for the full reference).
//!
//! [`Config::load`] reads and validates the whole file before anything starts and produces the
//! IKE engine's [`ike::EndpointConfig`] and one [`ike::PeerConfig`] per tunnel, plus the data
//! plane's [`datapath::DataplaneConfig`]. Every error names the file, line, column and key.

mod duration;
mod inventory;
mod raw;
mod summary;
mod validate;

#[cfg(test)]
mod tests;

pub use duration::{format_duration, parse_duration};
pub use inventory::{plan, tunnel_change, ConfigPlan, StoredPsks, TunnelChange};
pub use validate::filter::{MAX_OBJECT_BYTES, MAX_PER_DIRECTION, MAX_WEIGHT};

use crate::error::{ConfigError, Error};
use ids::TenantId;
use std::net::IpAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Default path of the control socket (`[gateway] control_socket`).
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/protego/protego.sock";

/// Default path of the embedded file store (`[store] path`).
pub const DEFAULT_STORE_PATH: &str = "/var/lib/protego/state.redb";

/// Where the control plane keeps the state that must survive a restart (`[store]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// The embedded file store (redb) at this path; the default.
    File {
        /// The database file (relative paths are resolved against the configuration file's
        /// directory).
        path: PathBuf,
    },
    /// Kept in memory only: nothing survives a restart (tests, throw-away demos).
    Memory,
    /// An etcd cluster shared by the control nodes (the distributed form).
    Etcd(crate::store::EtcdOptions),
}

/// Default key prefix in etcd (`[store] prefix`).
pub const DEFAULT_ETCD_PREFIX: &str = "/protego";
/// Default bound of one etcd request (`[store] timeout`).
pub const DEFAULT_ETCD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
/// Default bound of opening the etcd store at start (`[store] connect_timeout`), if `timeout`
/// is not longer.
pub const DEFAULT_ETCD_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl StoreConfig {
    /// Opens the configured store.
    pub fn open(&self) -> Result<Box<dyn crate::store::Store>, crate::store::StoreError> {
        Ok(match self {
            Self::File { path } => Box::new(crate::store::FileStore::open(path)?),
            Self::Memory => Box::new(crate::store::MemoryStore::default()),
            Self::Etcd(options) => Box::new(crate::store::EtcdStore::connect(options)?),
        })
    }
}

/// How the binary formats its log lines (`[gateway] log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines with `key=value` fields.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Node-wide settings of `[gateway]` that the control plane and the binary use directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    /// Addresses the IKE and NAT-T sockets listen on.
    pub listen: Vec<IpAddr>,
    /// Path of the Unix socket for `protego status`.
    pub control_socket: PathBuf,
    /// Log format.
    pub log_format: LogFormat,
    /// Directory for the (dangerous) key log, if enabled.
    pub key_log: Option<PathBuf>,
    /// IKE port (500).
    pub ike_port: u16,
    /// NAT-T port (4500).
    pub natt_port: u16,
    /// CPU fairness between tenants (`cpu_fairness`, default off).
    pub cpu_fairness: datapath::CpuFairness,
}

/// `[cluster]`: how a control node of the distributed form meets its data and steer nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// This control node's name (its certificate's CN).
    pub name: String,
    /// Where data and steer nodes open their gRPC sessions (TCP, mutual TLS).
    pub grpc: std::net::SocketAddr,
    /// Where steer nodes send IKE inside Geneve (UDP, usually port 6081).
    pub geneve: std::net::SocketAddr,
    /// The CA certificate (PEM) that signs every node's certificate.
    pub ca: PathBuf,
    /// This node's certificate (PEM, `OU=control`).
    pub cert: PathBuf,
    /// This node's private key (PKCS#8 PEM, mode 0600).
    pub key: PathBuf,
    /// How often data and steer nodes report their load.
    pub report_interval: std::time::Duration,
    /// How long a node may take to acknowledge a directive before it counts as failed.
    pub directive_timeout: std::time::Duration,
    /// The TTL of the active control node's etcd lease (whole seconds): an etcd outage
    /// shorter than about half of it leaves the active node in charge; a longer one makes it
    /// stop (a crashed active node is replaced in about half a second whatever the TTL: the
    /// standby probes it).
    pub lease: std::time::Duration,
    /// A data node's capacity in Mbit/s, the unit of the capacity advisor
    /// (`protego ctl capacity`).
    pub node_capacity_mbit: u32,
    /// `[cluster.autoscale]`: the elastic provisioning model and what it may do.
    pub autoscale: AutoscaleConfig,
    /// `[cluster.dispatch]`: how VXLAN from the cloud hosts reaches the data nodes.
    pub dispatch: ClusterDispatch,
    /// Each `[[attachment]]`'s steer node (`steer`), by attachment name: the attachment's
    /// `port` in [`Config::dataplane`] is then `Interface(name)` of an interface of that steer
    /// node (`[steer] ports` there), never opened here.
    pub attachment_steers: std::collections::BTreeMap<String, String>,
}

/// How the cloud hosts' VXLAN reaches the data nodes (`[cluster.dispatch] mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DispatchMode {
    /// The hosts send to the steer nodes' VTEP, which relay each frame to the data node of
    /// its tunnel.
    #[default]
    Steer,
    /// Self-dispatch (issue 19): the hosts send to the data nodes' own VTEPs (`[data] vtep`),
    /// each VM to the owner of its virtual MAC; no dispatcher on the way.
    SelfDispatch,
}

impl DispatchMode {
    /// The mode as the file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Steer => "steer",
            Self::SelfDispatch => "self",
        }
    }
}

/// `[cluster.dispatch]` (see docs/configuration.md and docs/architecture.md, "Self-dispatch").
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterDispatch {
    /// Steer or self.
    pub mode: DispatchMode,
    /// `K`: the virtual MACs of each VNet.
    pub vmacs: u32,
    /// Algorithm 3: how often an owner refreshes the hosts' learnt entries of its virtual
    /// MACs.
    pub announce_interval: std::time::Duration,
    /// The ring (Algorithm 5): `T_L` (`load_interval`), `T_M` (`move_interval`), `L_D`
    /// (`load_difference`), `|W|` (`move_vmacs`), and `linger`: a node that gave a virtual MAC
    /// away sends its late frames on to the new owner until none came for that long.
    pub ring: dispatch::Params,
}

impl Default for ClusterDispatch {
    /// Steer mode; for self mode 1024 virtual MACs per VNet, announcements every 10 s (the
    /// kernel ages learnt entries out after 300 s), and the paper's ring: `T_L` = 1.33 s,
    /// `T_M` = 4 s, `L_D` = 0.10, `|W|` = 4, with 1 s of forwarding after a move.
    fn default() -> Self {
        Self {
            mode: DispatchMode::Steer,
            vmacs: DEFAULT_VMACS,
            announce_interval: std::time::Duration::from_secs(10),
            ring: dispatch::Params::paper(),
        }
    }
}

/// Default `[cluster.dispatch] vmacs`: well above the VMs a host group holds, so that each
/// node's share stays close to even when some VMs send far more than others.
pub const DEFAULT_VMACS: u32 = 1024;

/// Whether the autoscaler carries its decisions out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoscaleMode {
    /// Decisions are shown (`protego ctl capacity`), not carried out.
    #[default]
    Advise,
    /// Decisions are carried out: tunnels are migrated, nodes parked and unparked, and
    /// started and stopped through the node provider.
    Act,
}

impl AutoscaleMode {
    /// The mode as the file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Advise => "advise",
            Self::Act => "act",
        }
    }
}

/// `[cluster.autoscale]` (see docs/configuration.md and docs/provisioning.md).
#[derive(Debug, Clone, PartialEq)]
pub struct AutoscaleConfig {
    /// Advise or act.
    pub mode: AutoscaleMode,
    /// τ: how often the model steps (a new usage sample per tunnel each step).
    pub interval: std::time::Duration,
    /// How often tunnels are consolidated by Best Fit Decreasing.
    pub consolidation_interval: std::time::Duration,
    /// T_H: the hotspot threshold and fill limit, a fraction of a node in `(0, 1]`.
    pub hotspot_threshold: f64,
    /// ε: the tolerated probability that the aggregate exceeds the reserve, in `[0, 1)`.
    pub epsilon: f64,
    /// How long a started data node takes to register (the model's start latency).
    pub start_latency: std::time::Duration,
    /// The fewest data nodes kept reserved (active + inactive + starting).
    pub min_nodes: u32,
    /// Reserved nodes tolerated above what the model requires before one is stopped
    /// (hysteresis: a start takes `start_latency`).
    pub stop_slack: u32,
    /// How tunnels are sized for placement (`"adaptive"`, the default: each at its
    /// measurement with a calibrated headroom its node shares, see `provision::forecast`;
    /// `"envelope:2"`: the higher of the last two measurements; `"measured"`: the last one, as
    /// the paper does).
    pub sizing: provision::Sizing,
    /// Give a node back as soon as its tunnels fit on the others, not at the next
    /// consolidation (Protego's; the paper waits).
    pub drain: bool,
    /// G*: the guarantee `"adaptive"` sizing aims for, in `[0.75, 1)`: its calibrator aims at
    /// `provision::forecast::SATURATED_PER_VIOLATION · (1 − G*)` = `2 · (1 − G*)` of the steps
    /// with a saturated data node (capped at one half, hence the lower bound)
    /// (`provision::PlannerConfig::guarantee_target`; the other sizings ignore it).
    pub guarantee_target: f64,
    /// Samples each tunnel's usage histogram keeps (it covers `window · interval`).
    pub window: usize,
    /// `[cluster.autoscale.local]`: the `local` node provider, if configured.
    pub local: Option<LocalProviderConfig>,
}

impl Default for AutoscaleConfig {
    /// Advise mode with the paper's §7.4 parameters: τ = 10 s (the paper's is a minute; a
    /// plan of 10 000 tunnels takes about 0.15 s), 10-minute consolidation, T_H = 0.9,
    /// ε = 0.05, 3-minute starts, one node at least, no provider; and Protego's two changes
    /// to the paper's algorithm (docs/provisioning.md, `provision::Defaults::PROTEGO`):
    /// adaptive sizing and drain.
    fn default() -> Self {
        Self {
            mode: AutoscaleMode::Advise,
            interval: std::time::Duration::from_secs(10),
            consolidation_interval: std::time::Duration::from_secs(600),
            hotspot_threshold: 0.9,
            epsilon: 0.05,
            start_latency: std::time::Duration::from_secs(180),
            min_nodes: 1,
            stop_slack: 0,
            sizing: provision::Defaults::PROTEGO.sizing,
            drain: provision::Defaults::PROTEGO.drain,
            guarantee_target: provision::PlannerConfig::default().guarantee_target,
            window: provision::DEFAULT_WINDOW,
            local: None,
        }
    }
}

/// `[cluster.autoscale.local]`: runs `protego data` processes on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalProviderConfig {
    /// The `protego` executable (`None`: the running one).
    pub command: Option<PathBuf>,
    /// Where the provider keeps a pid file and a log per node.
    pub run_dir: PathBuf,
    /// How long a stopped node may take to exit after SIGTERM before it is killed.
    pub stop_timeout: std::time::Duration,
    /// The data nodes it may start, in order.
    pub nodes: Vec<LocalNodeConfig>,
}

/// One `[[cluster.autoscale.local.node]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalNodeConfig {
    /// The data node's configuration file (`protego data -c FILE`).
    pub config: PathBuf,
    /// The network namespace to run it in (`ip netns exec NAME`), if any.
    pub netns: Option<String>,
}

/// Where a tunnel's decrypted traffic goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelInside {
    /// Into the named VNet of the tunnel's tenant.
    Vnet(String),
    /// Into the node's TUN device.
    Tun,
}

/// One validated `[[tunnel]]`.
#[derive(Clone)]
pub struct Tunnel {
    /// The IKE engine's view of the tunnel (holds the PSK).
    pub peer: ike::PeerConfig,
    /// The tenant it belongs to.
    pub tenant: TenantId,
    /// Where its traffic goes.
    pub inside: TunnelInside,
    /// The IKE proposals as written (after `default` expansion), for summaries.
    pub proposals: Vec<String>,
    /// The ESP proposals as written (after `default` expansion), for summaries.
    pub esp_proposals: Vec<String>,
    /// The 1-based line of its `[[tunnel]]` header.
    pub line: usize,
    /// Its rate limit in Mbit/s (`rate_limit`), enforced by the steer nodes of the distributed
    /// form (`protego up` does not limit).
    pub rate_limit_mbit: Option<u32>,
}

impl std::fmt::Debug for Tunnel {
    // Hand-written so that the PSK never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.peer;
        f.debug_struct("Tunnel")
            .field("id", &p.id)
            .field("name", &p.name)
            .field("tenant", &self.tenant)
            .field("inside", &self.inside)
            .field("local_addrs", &p.local_addrs)
            .field("remote_addrs", &p.remote_addrs)
            .field("local_id", &p.local_id)
            .field("remote_id", &p.remote_id)
            .field("psk", &"<redacted>")
            .field("proposals", &self.proposals)
            .field("esp_proposals", &self.esp_proposals)
            .field("local_ts", &p.local_ts)
            .field("remote_ts", &p.remote_ts)
            .field("ike_rekey_time", &p.ike_rekey_time)
            .field("ike_over_time", &p.ike_over_time)
            .field("child_rekey_time", &p.child_rekey_time)
            .field("child_life_time", &p.child_life_time)
            .field("rand_time", &p.rand_time)
            .field("dpd_delay", &p.dpd_delay)
            .field("dpd_action", &p.dpd_action)
            .field("start_action", &p.start_action)
            .field("replay_window", &p.replay_window)
            .field("resource_sas", &p.resource_sas)
            .field("rate_limit_mbit", &self.rate_limit_mbit)
            .finish()
    }
}

/// `[api]`: the HTTP API and web console's listener (docs/api.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// `listen`: the address and port.
    pub listen: std::net::SocketAddr,
    /// `cert_file` and `key_file` (PEM); None only with `tls = false` on a loopback address.
    pub tls: Option<ApiTls>,
    /// `client_ca_file`: client certificates signed by this CA identify operators and
    /// tenants by their subject OU (`operator`, `tenant:NAME`).
    pub client_ca_file: Option<PathBuf>,
    /// `tokens_file`: the bearer tokens' SHA-256 hashes, one `NAME ROLE sha256:HEX` per line
    /// (`protego token add`).
    pub tokens_file: Option<PathBuf>,
}

/// `[api] cert_file` and `key_file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTls {
    /// The server's certificate chain (PEM), leaf first.
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
}

/// A whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// The text of that file (its node-wide sections frame an applied inventory, see
    /// [`Config::with_inventory`]).
    pub(crate) text: std::sync::Arc<str>,
    /// `[gateway]` settings.
    pub gateway: Gateway,
    /// The IKE engine's node-wide settings.
    pub endpoint: ike::EndpointConfig,
    /// Tenant names in file order.
    pub tenants: Vec<TenantId>,
    /// Each tenant's `cpu_weight` (1 unless set), in the order of `tenants`.
    pub cpu_weights: Vec<u16>,
    /// Tunnels in file order. Ids are assigned in file order (1, 2, ...) when a file is read;
    /// a configuration applied to a running node keeps the ids of tunnels that keep their
    /// names ([`Config::keep_ids`]).
    pub tunnels: Vec<Tunnel>,
    /// The data plane's configuration.
    pub dataplane: datapath::DataplaneConfig,
    /// `[store]`.
    pub store: StoreConfig,
    /// `[store] encryption_key_file` and `accept_cleartext`: how the records are sealed
    /// ([`crate::store::SealedStore`]), whatever the backend.
    pub store_encryption: crate::store::EncryptionOptions,
    /// `[cluster]`: present on the control nodes of the distributed form (`protego control`).
    pub cluster: Option<ClusterConfig>,
    /// `[[filter]]`: the tenants' eBPF programs, each loaded and verified (issue 18).
    pub filters: Vec<datapath::FilterConfig>,
    /// `[metrics]`: where the node serves Prometheus metrics (absent: it does not).
    pub metrics: Option<metrics::MetricsConfig>,
    /// `[api]`: where the node serves its HTTP API and web console (absent: it does not).
    pub api: Option<ApiConfig>,
    /// Things that are allowed but worth an operator's attention (world-readable PSK files, key
    /// log enabled). The binary prints or logs them.
    pub warnings: Vec<String>,
}

impl Config {
    /// Reads and validates `path`. PSK files named with relative paths are looked up relative
    /// to the configuration file's directory.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_owned(),
            line: 0,
            column: 0,
            key: None,
            section: None,
            message: format!("cannot read the configuration file: {e}"),
            source_line: None,
            span_len: 0,
        })?;
        Self::parse(&text, path)
    }

    /// Validates configuration `text` as if read from `path` (used for error messages and to
    /// resolve relative PSK file paths).
    pub fn parse(text: &str, path: &Path) -> Result<Self, Error> {
        let source = Source::new(path, text);
        let raw: raw::RawFile =
            toml::from_str(text).map_err(|e| Error::Config(source.toml_error(&e)))?;
        validate::validate(&source, raw).map_err(Error::Config)
    }

    /// What the data path's CPU charge and fairness use: `[gateway] cpu_fairness` and every
    /// tenant's `cpu_weight`.
    pub fn cpu_fairness(&self) -> datapath::CpuFairnessConfig {
        datapath::CpuFairnessConfig {
            mode: self.gateway.cpu_fairness,
            weights: self
                .tenants
                .iter()
                .cloned()
                .zip(self.cpu_weights.iter().copied())
                .collect(),
        }
    }

    /// The tunnel with this id.
    pub fn tunnel(&self, id: ike::TunnelId) -> Option<&Tunnel> {
        self.tunnels.iter().find(|t| t.peer.id == id)
    }

    /// The tunnel called `name`.
    pub fn tunnel_named(&self, name: &str) -> Option<&Tunnel> {
        self.tunnels.iter().find(|t| t.peer.name == name)
    }
}

/// The text being validated, for turning byte spans into line/column locations.
pub(crate) struct Source<'a> {
    pub(crate) file: &'a Path,
    pub(crate) text: &'a str,
    /// Where each line starts, found at the first lookup: every tunnel records its line, and
    /// counting newlines from the top for each made 10 000 tunnels take 25 s.
    line_starts: std::cell::OnceCell<Vec<usize>>,
}

impl<'a> Source<'a> {
    /// `text`, read from `file`.
    pub(crate) fn new(file: &'a Path, text: &'a str) -> Self {
        Self {
            file,
            text,
            line_starts: std::cell::OnceCell::new(),
        }
    }

    /// 1-based line and column (in characters) of byte `offset`.
    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(self.text, offset.min(self.text.len()));
        let starts = self.line_starts.get_or_init(|| {
            std::iter::once(0)
                .chain(self.text.match_indices('\n').map(|(i, _)| i + 1))
                .collect()
        });
        // Lines starting at or before `offset`: its line's number.
        let line = starts.partition_point(|&s| s <= offset);
        let line_start = starts[line - 1];
        let column = self.text[line_start..offset].chars().count() + 1;
        (line, column)
    }

    /// The full text of the line containing byte `offset` (without its newline).
    fn line_text(&self, offset: usize) -> &str {
        let offset = floor_char_boundary(self.text, offset.min(self.text.len()));
        let start = self.text[..offset].rfind('\n').map_or(0, |i| i + 1);
        let end = self.text[offset..]
            .find('\n')
            .map_or(self.text.len(), |i| offset + i);
        self.text[start..end].trim_end_matches('\r')
    }

    /// An error located at `span`.
    pub(crate) fn error(
        &self,
        span: Range<usize>,
        section: Option<String>,
        key: Option<&str>,
        message: impl Into<String>,
    ) -> Box<ConfigError> {
        let (line, column) = self.line_col(span.start);
        let line_text = self.line_text(span.start);
        // Caret length: the span's characters up to the end of its first line.
        let rest_of_line = line_text.chars().count().saturating_sub(column - 1);
        let start = floor_char_boundary(self.text, span.start.min(self.text.len()));
        let end = floor_char_boundary(self.text, span.end.min(self.text.len())).max(start);
        let span_chars = self.text[start..end]
            .chars()
            .take_while(|c| *c != '\n')
            .count();
        Box::new(ConfigError {
            file: self.file.to_owned(),
            line,
            column,
            key: key.map(str::to_owned),
            section,
            message: message.into(),
            source_line: Some(line_text.to_owned()),
            span_len: span_chars.clamp(1, rest_of_line.max(1)),
        })
    }

    /// Converts a TOML syntax or shape error, recovering the key and table from the text.
    fn toml_error(&self, e: &toml::de::Error) -> Box<ConfigError> {
        let message = e.message().trim().to_owned();
        let Some(span) = e.span() else {
            return Box::new(ConfigError {
                file: self.file.to_owned(),
                line: 0,
                column: 0,
                key: None,
                section: None,
                message,
                source_line: None,
                span_len: 0,
            });
        };
        let key = self.key_at(span.start);
        let section = self.section_at(span.start);
        self.error(span, section, key.as_deref(), friendlier(&message))
    }

    /// The key assigned on the line containing `offset` (`key = value`), if any.
    fn key_at(&self, offset: usize) -> Option<String> {
        let line = self.line_text(offset).trim_start();
        let (key, _) = line.split_once('=')?;
        let key = key.trim().trim_matches('"');
        let valid = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
        valid.then(|| key.to_owned())
    }

    /// The table header (`[gateway]`, `[[tunnel]] #2`) in force at `offset`.
    pub(crate) fn section_at(&self, offset: usize) -> Option<String> {
        let offset = floor_char_boundary(self.text, offset.min(self.text.len()));
        let before = &self.text[..offset];
        let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        let mut current = None;
        for line in before.lines() {
            let t = line.trim();
            if let Some(name) = t
                .strip_prefix("[[")
                .and_then(|r| r.split_once("]]"))
                .map(|(n, _)| n.trim())
            {
                let n = counts.entry(name.to_owned()).or_insert(0);
                *n += 1;
                current = Some(format!("[[{name}]] #{n}"));
            } else if let Some(name) = t
                .strip_prefix('[')
                .and_then(|r| r.split_once(']'))
                .map(|(n, _)| n.trim())
            {
                current = Some(format!("[{name}]"));
            }
        }
        current
    }
}

/// Rewords serde's messages for operators: Rust type names become words, and an unknown key
/// gets a "did you mean" for the closest known one instead of the full list.
fn friendlier(message: &str) -> String {
    let message = message
        .replace("expected i64", "expected an integer")
        .replace("expected f64", "expected a number");
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message;
    };
    let Some((unknown, expected)) = rest.split_once("`, expected ") else {
        return message;
    };
    let candidates: Vec<&str> = expected
        .trim_start_matches("one of ")
        .split(", ")
        .map(|c| c.trim_matches('`'))
        .filter(|c| !c.is_empty())
        .collect();
    let best = candidates
        .iter()
        .map(|c| (edit_distance(unknown, c), *c))
        .min()
        .filter(|(d, c)| *d <= 3.max(c.len() / 4));
    match best {
        Some((_, c)) => format!("unknown key `{unknown}`; did you mean `{c}`?"),
        None => format!(
            "unknown key `{unknown}`; known keys here: {}",
            candidates.join(", ")
        ),
    }
}

/// Levenshtein distance between two short ASCII-ish strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// The largest char boundary not above `i`.
fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}
