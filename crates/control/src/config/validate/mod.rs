//! Turns the raw file into a [`Config`], checking everything before anything starts: references
//! between tables, duplicates, addresses, identities, proposals, selectors, lifetimes and PSK
//! files. The first error found is returned, located at the offending key. Tunnel tables are
//! checked in `tunnel.rs`.

mod etcd_access;
mod tunnel;

use super::raw::{
    RawAutoscale, RawCluster, RawFile, RawGateway, RawLocalProvider, RawStore, RawVnet, StringList,
};
use super::{
    AutoscaleConfig, AutoscaleMode, ClusterConfig, Config, Gateway, LocalNodeConfig,
    LocalProviderConfig, LogFormat, Source, StoreConfig, StoredPsks, Tunnel, TunnelInside,
    DEFAULT_CONTROL_SOCKET, DEFAULT_ETCD_PREFIX, DEFAULT_ETCD_TIMEOUT, DEFAULT_STORE_PATH,
};
use crate::error::ConfigError;
use crate::store::EtcdOptions;
use datapath::{DataplaneConfig, Inside, Route, TunnelBinding, VnetConfig};
use ipnet::IpNet;
use std::net::IpAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// What `proposals = "default"` (and an absent `proposals`) stands for: modern AEAD first, then
/// AES-CBC with HMAC-SHA2, each with the strongest key exchange groups we implement.
pub(crate) const DEFAULT_IKE_PROPOSALS: &[&str] = &[
    "aes256gcm16-aes128gcm16-chacha20poly1305-prfsha256-prfsha384-prfsha512-x25519-ecp256-ecp384-modp2048",
    "aes256-aes128-sha256-sha384-sha512-x25519-ecp256-ecp384-modp2048",
];

/// What `esp_proposals = "default"` (and an absent `esp_proposals`) stands for (no PFS, as
/// strongSwan's default).
pub(crate) const DEFAULT_ESP_PROPOSALS: &[&str] = &[
    "aes256gcm16-aes128gcm16-chacha20poly1305",
    "aes256-aes128-sha256-sha384-sha512",
];

const DEFAULT_IKE_PORT: u16 = 500;
const DEFAULT_NATT_PORT: u16 = 4500;
const DEFAULT_VXLAN_PORT: u16 = 4789;
const DEFAULT_BATCH: usize = 32;
const DEFAULT_TUN_NAME: &str = "protego0";
const DEFAULT_IKE_REKEY: Duration = Duration::from_secs(4 * 3600);
const DEFAULT_CHILD_REKEY: Duration = Duration::from_secs(3600);
const DEFAULT_REPLAY_WINDOW: u32 = esp::DEFAULT_REPLAY_WINDOW;
/// Largest VXLAN network identifier (24 bits, RFC 7348 §5).
const MAX_VNI: i64 = (1 << 24) - 1;

/// Validates the whole file.
pub(crate) fn validate(src: &Source<'_>, raw: RawFile) -> Result<Config, Box<ConfigError>> {
    validate_with(src, raw, None)
}

/// [`validate`], with the tunnels' PSKs taken from `psks` (by tunnel name) instead of their
/// `psk_file`s: a configuration applied earlier, restored from the store.
pub(crate) fn validate_with(
    src: &Source<'_>,
    raw: RawFile,
    psks: Option<&StoredPsks>,
) -> Result<Config, Box<ConfigError>> {
    let mut v = Validator {
        src,
        warnings: Vec::new(),
        psks,
    };
    let (gateway, endpoint, extra) = v.gateway(&raw.gateway)?;
    let store = v.store(raw.store.as_ref())?;
    let store_encryption = v.store_encryption(raw.store.as_ref())?;
    let cluster = raw.cluster.as_ref().map(|c| v.cluster(c)).transpose()?;
    let tenants = v.tenants(&raw)?;
    let vnets = v.vnets(&raw, &tenants)?;
    let mut tunnels = Vec::with_capacity(raw.tunnel.len());
    for (index, t) in raw.tunnel.iter().enumerate() {
        let tunnel = v.tunnel(index, t, &gateway, &tenants, &vnets, &tunnels)?;
        tunnels.push(tunnel);
    }
    let mut bindings = Vec::with_capacity(tunnels.len());
    for t in &tunnels {
        let inside = match &t.tunnel.inside {
            TunnelInside::Tun => Inside::Tun,
            TunnelInside::Vnet(name) => {
                let index = vnets
                    .iter()
                    .position(|n| n.config.tenant == t.tunnel.tenant && &n.config.name == name)
                    .expect("validate::tunnel resolved the vnet of its own tenant");
                Inside::Vnet(index)
            }
        };
        bindings.push(TunnelBinding {
            tunnel: t.tunnel.peer.id,
            name: t.tunnel.peer.name.clone(),
            tenant: t.tunnel.tenant.clone(),
            inside,
        });
    }
    let any_tun = tunnels.iter().any(|t| t.tunnel.inside == TunnelInside::Tun);
    if let Some(key) = &gateway.key_log {
        v.warnings.push(format!(
            "key_log is enabled: IKE and ESP keys of every tunnel will be written to {} \
             (anyone who can read it can decrypt the traffic; for debugging only)",
            key.display()
        ));
    }
    let dataplane = DataplaneConfig {
        listen: gateway.listen.clone(),
        ike_port: gateway.ike_port,
        natt_port: gateway.natt_port,
        vxlan_port: extra.vxlan_port,
        vnets: vnets.into_iter().map(|n| n.config).collect(),
        tunnels: bindings,
        tun_name: any_tun.then_some(extra.tun_name),
        batch: extra.batch,
        workers: extra.workers,
        cpus: extra.cpus,
        pin_workers: extra.pin_workers,
        busy_poll: extra.busy_poll,
        relay: None,
    };
    Ok(Config {
        path: src.file.to_owned(),
        text: src.text.into(),
        gateway,
        endpoint,
        tenants: tenants.into_iter().map(|(name, _)| name).collect(),
        tunnels: tunnels.into_iter().map(|t| t.tunnel).collect(),
        dataplane,
        store,
        store_encryption,
        cluster,
        warnings: v.warnings,
    })
}

/// Default `[cluster] report_interval` (the paper's τ).
const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// Default `[cluster] directive_timeout`.
const DEFAULT_DIRECTIVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Default capacity of a data node for the capacity advisor, Mbit/s (the paper's 5 Gbit/s).
const DEFAULT_NODE_CAPACITY_MBIT: u32 = 5000;
/// How long a stopped local data node may take to exit before SIGKILL.
const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Most data plane workers a configuration may ask for.
const MAX_WORKERS: usize = 1024;
/// Default busy polling of the data plane workers after traffic.
const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(0);
/// The longest busy polling a configuration may ask for.
const MAX_BUSY_POLL: Duration = Duration::from_millis(10);
/// CPU numbers Linux can address in an affinity mask (CPU_SETSIZE).
const MAX_CPU: usize = 1024;

/// Gateway settings that only the data plane needs.
struct DataplaneExtra {
    vxlan_port: u16,
    tun_name: String,
    batch: usize,
    workers: usize,
    cpus: Vec<usize>,
    pin_workers: bool,
    busy_poll: Duration,
}

/// A validated VNet with the line it was defined on (for duplicate messages).
struct CheckedVnet {
    config: VnetConfig,
    line: usize,
}

/// A validated tunnel with the spans later checks point at.
struct CheckedTunnel {
    tunnel: Tunnel,
    remote_ts_line: usize,
}

struct Validator<'s, 'a> {
    src: &'s Source<'a>,
    warnings: Vec<String>,
    /// PSKs by tunnel name, used instead of reading `psk_file` (see [`validate_with`]).
    psks: Option<&'s StoredPsks>,
}

impl Validator<'_, '_> {
    fn err(
        &self,
        span: Range<usize>,
        section: &str,
        key: &str,
        message: impl Into<String>,
    ) -> Box<ConfigError> {
        self.src
            .error(span, Some(section.to_owned()), Some(key), message)
    }

    /// `[store] encryption_key_file` (relative to the configuration file's directory, as
    /// `psk_file`) and `accept_cleartext`, for every backend. The key file itself is read when
    /// the store is opened ([`crate::store::SealedStore::open`]).
    fn store_encryption(
        &self,
        raw: Option<&Spanned<RawStore>>,
    ) -> Result<crate::store::EncryptionOptions, Box<ConfigError>> {
        const S: &str = "store";
        let Some(raw) = raw.map(Spanned::get_ref) else {
            return Ok(crate::store::EncryptionOptions::default());
        };
        let key_file = match &raw.encryption_key_file {
            Some(p) if p.get_ref().trim().is_empty() => {
                return Err(self.err(p.span(), S, "encryption_key_file", "must not be empty"));
            }
            Some(p) => {
                let path = Path::new(p.get_ref());
                Some(match self.src.file.parent() {
                    Some(dir) if path.is_relative() => dir.join(path),
                    _ => path.to_owned(),
                })
            }
            None => None,
        };
        let accept_cleartext = match &raw.accept_cleartext {
            Some(a) if *a.get_ref() && key_file.is_none() => {
                return Err(self.err(
                    a.span(),
                    S,
                    "accept_cleartext",
                    "only means something with encryption_key_file (without a key file every \
                     record is in clear)",
                ));
            }
            Some(a) => *a.get_ref(),
            None => false,
        };
        Ok(crate::store::EncryptionOptions {
            key_file,
            accept_cleartext,
        })
    }

    /// `[store]`: the file backend by default.
    fn store(&self, raw: Option<&Spanned<RawStore>>) -> Result<StoreConfig, Box<ConfigError>> {
        const S: &str = "store";
        let Some(raw) = raw.map(Spanned::get_ref) else {
            return Ok(StoreConfig::File {
                path: PathBuf::from(DEFAULT_STORE_PATH),
            });
        };
        let backend = raw
            .backend
            .as_ref()
            .map_or("file", |b| b.get_ref().as_str());
        // Keys that belong to another backend are refused, not ignored.
        let refuse = |key: &str, span: Option<Range<usize>>, owner: &str| match span {
            Some(span) => Err(self.err(
                span,
                S,
                key,
                format!("only the \"{owner}\" backend has a {key}"),
            )),
            None => Ok(()),
        };
        let file_keys = raw.path.as_ref().map(Spanned::span);
        let etcd_keys = [
            ("endpoints", raw.endpoints.as_ref().map(Spanned::span)),
            ("prefix", raw.prefix.as_ref().map(Spanned::span)),
            ("timeout", raw.timeout.as_ref().map(Spanned::span)),
            ("ca", raw.ca.as_ref().map(Spanned::span)),
            ("cert", raw.cert.as_ref().map(Spanned::span)),
            ("key", raw.key.as_ref().map(Spanned::span)),
            ("username", raw.username.as_ref().map(Spanned::span)),
            (
                "password_file",
                raw.password_file.as_ref().map(Spanned::span),
            ),
        ];
        match backend {
            "file" => {
                for (key, span) in etcd_keys {
                    refuse(key, span, "etcd")?;
                }
                let path = match &raw.path {
                    Some(p) if p.get_ref().trim().is_empty() => {
                        return Err(self.err(p.span(), S, "path", "must not be empty"));
                    }
                    Some(p) => {
                        let path = Path::new(p.get_ref());
                        match self.src.file.parent() {
                            Some(dir) if path.is_relative() => dir.join(path),
                            _ => path.to_owned(),
                        }
                    }
                    None => PathBuf::from(DEFAULT_STORE_PATH),
                };
                Ok(StoreConfig::File { path })
            }
            "memory" => {
                refuse("path", file_keys, "file")?;
                for (key, span) in etcd_keys {
                    refuse(key, span, "etcd")?;
                }
                Ok(StoreConfig::Memory)
            }
            "etcd" => {
                refuse("path", file_keys, "file")?;
                self.etcd(raw).map(StoreConfig::Etcd)
            }
            other => {
                let span = raw.backend.as_ref().map_or(0..0, Spanned::span);
                Err(self.err(
                    span,
                    S,
                    "backend",
                    format!(
                        "unknown store backend {other:?} (use \"file\", \"etcd\" or \"memory\")"
                    ),
                ))
            }
        }
    }

    /// The etcd backend's keys: `endpoints` (required, http:// or https:// URLs), `prefix`,
    /// `timeout`, and TLS and authentication (`etcd_access.rs`).
    fn etcd(&self, raw: &RawStore) -> Result<EtcdOptions, Box<ConfigError>> {
        const S: &str = "store";
        let Some(list) = &raw.endpoints else {
            let span = raw.backend.as_ref().map_or(0..0, Spanned::span);
            return Err(self.err(
                span,
                S,
                "endpoints",
                "the etcd backend needs endpoints, e.g. [\"http://127.0.0.1:2379\"]",
            ));
        };
        let mut endpoints = Vec::new();
        for e in list.get_ref().0.iter() {
            let url = e.trim();
            let host = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"));
            if host.is_none_or(|h| h.is_empty() || h.contains('/')) {
                return Err(self.err(
                    list.span(),
                    S,
                    "endpoints",
                    format!(
                        "{url:?} is not an etcd client URL (http://HOST:PORT or https://HOST:PORT)"
                    ),
                ));
            }
            endpoints.push(url.to_owned());
        }
        if endpoints.is_empty() {
            return Err(self.err(
                list.span(),
                S,
                "endpoints",
                "at least one endpoint is required",
            ));
        }
        let prefix = match &raw.prefix {
            Some(p) => {
                let v = p.get_ref().trim_end_matches('/');
                if !v.starts_with('/') || v.len() < 2 || v.contains("//") {
                    return Err(self.err(
                        p.span(),
                        S,
                        "prefix",
                        "must be an absolute key path such as \"/protego/prod\"",
                    ));
                }
                v.to_owned()
            }
            None => DEFAULT_ETCD_PREFIX.to_owned(),
        };
        let timeout = match &raw.timeout {
            Some(t) if t.get_ref().0.is_zero() => {
                return Err(self.err(t.span(), S, "timeout", "must be more than 0"));
            }
            Some(t) => t.get_ref().0,
            None => DEFAULT_ETCD_TIMEOUT,
        };
        let https = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if https > 0 && https < endpoints.len() {
            return Err(self.err(
                list.span(),
                S,
                "endpoints",
                "mixes http:// and https:// URLs: use https:// for every endpoint",
            ));
        }
        let access = self.etcd_access(raw, https > 0, list.span())?;
        Ok(EtcdOptions {
            endpoints,
            prefix,
            timeout,
            access,
        })
    }

    fn line(&self, span: &Range<usize>) -> usize {
        self.src.line_col(span.start).0
    }

    fn gateway(
        &mut self,
        g: &Spanned<RawGateway>,
    ) -> Result<(Gateway, ike::EndpointConfig, DataplaneExtra), Box<ConfigError>> {
        const S: &str = "[gateway]";
        let g = g.get_ref();

        let mut listen: Vec<IpAddr> = Vec::new();
        for text in &g.listen.get_ref().0 {
            let addr: IpAddr = text.parse().map_err(|_| {
                self.err(
                    g.listen.span(),
                    S,
                    "listen",
                    format!("{text:?} is not an IP address"),
                )
            })?;
            if addr.is_unspecified() || addr.is_multicast() {
                return Err(self.err(
                    g.listen.span(),
                    S,
                    "listen",
                    format!("{addr} is not a unicast address; list the concrete addresses peers connect to"),
                ));
            }
            if listen.contains(&addr) {
                return Err(self.err(
                    g.listen.span(),
                    S,
                    "listen",
                    format!("{addr} is listed twice"),
                ));
            }
            listen.push(addr);
        }
        if listen.is_empty() {
            return Err(self.err(
                g.listen.span(),
                S,
                "listen",
                "at least one address is required",
            ));
        }

        let control_socket = match &g.control_socket {
            Some(p) if p.get_ref().trim().is_empty() => {
                return Err(self.err(p.span(), S, "control_socket", "must not be empty"));
            }
            Some(p) => PathBuf::from(p.get_ref()),
            None => PathBuf::from(DEFAULT_CONTROL_SOCKET),
        };
        let log_format = match &g.log_format {
            None => LogFormat::Text,
            Some(f) => match f.get_ref().as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => {
                    return Err(self.err(
                        f.span(),
                        S,
                        "log_format",
                        format!("unknown log format {other:?} (use \"text\" or \"json\")"),
                    ));
                }
            },
        };
        let key_log = match &g.key_log {
            Some(p) if p.get_ref().trim().is_empty() => {
                return Err(self.err(
                    p.span(),
                    S,
                    "key_log",
                    "must not be empty (omit the key to disable)",
                ));
            }
            Some(p) => Some(self.relative_path(p.get_ref())),
            None => None,
        };
        let ike_port = self.port(g.ike_port.as_ref(), "ike_port", DEFAULT_IKE_PORT)?;
        let natt_port = self.port(g.natt_port.as_ref(), "natt_port", DEFAULT_NATT_PORT)?;
        let vxlan_port = self.port(g.vxlan_port.as_ref(), "vxlan_port", DEFAULT_VXLAN_PORT)?;
        if ike_port == natt_port {
            let span = g
                .natt_port
                .as_ref()
                .or(g.ike_port.as_ref())
                .map_or(0..0, Spanned::span);
            return Err(self.err(
                span,
                S,
                "natt_port",
                format!("must differ from ike_port ({ike_port})"),
            ));
        }
        let tun_name = match &g.tun_name {
            None => DEFAULT_TUN_NAME.to_owned(),
            Some(n) => {
                let name = n.get_ref();
                // IFNAMSIZ is 16 including the terminating NUL.
                let ok = !name.is_empty()
                    && name.len() < 16
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                if !ok {
                    return Err(self.err(
                        n.span(),
                        S,
                        "tun_name",
                        format!("{name:?} is not a valid interface name (1-15 characters: letters, digits, - _ .)"),
                    ));
                }
                name.clone()
            }
        };
        let batch = match &g.batch {
            None => DEFAULT_BATCH,
            Some(b) => usize::try_from(*b.get_ref())
                .ok()
                .filter(|n| (1..=1024).contains(n))
                .ok_or_else(|| self.err(b.span(), S, "batch", "must be between 1 and 1024"))?,
        };
        let workers = match &g.workers {
            // 0: one worker per CPU the process may run on (the data plane counts them).
            None => 0,
            Some(w) => usize::try_from(*w.get_ref())
                .ok()
                .filter(|n| (1..=MAX_WORKERS).contains(n))
                .ok_or_else(|| {
                    self.err(
                        w.span(),
                        S,
                        "workers",
                        format!("must be between 1 and {MAX_WORKERS}"),
                    )
                })?,
        };
        let cpus = match &g.cpus {
            None => Vec::new(),
            Some(list) => {
                if list.get_ref().is_empty() {
                    return Err(self.err(
                        list.span(),
                        S,
                        "cpus",
                        "must list at least one CPU (leave it out for all CPUs; pin_workers = false to not pin)",
                    ));
                }
                let mut cpus = Vec::with_capacity(list.get_ref().len());
                for c in list.get_ref() {
                    let cpu = usize::try_from(*c)
                        .ok()
                        .filter(|c| *c < MAX_CPU)
                        .ok_or_else(|| {
                            self.err(
                                list.span(),
                                S,
                                "cpus",
                                format!("{c} is not a CPU number (0..{MAX_CPU})"),
                            )
                        })?;
                    if cpus.contains(&cpu) {
                        return Err(self.err(
                            list.span(),
                            S,
                            "cpus",
                            format!("CPU {cpu} is listed twice"),
                        ));
                    }
                    cpus.push(cpu);
                }
                cpus
            }
        };
        let pin_workers = g.pin_workers.as_ref().is_none_or(|p| *p.get_ref());
        let busy_poll = match &g.busy_poll {
            None => DEFAULT_BUSY_POLL,
            Some(b) if b.get_ref().0 > MAX_BUSY_POLL => {
                return Err(self.err(
                    b.span(),
                    S,
                    "busy_poll",
                    format!("must be at most {}ms", MAX_BUSY_POLL.as_millis()),
                ))
            }
            Some(b) => b.get_ref().0,
        };

        let mut endpoint = ike::EndpointConfig {
            key_log: key_log.is_some(),
            ..Default::default()
        };
        if let Some(t) = &g.retransmit_timeout {
            if t.get_ref().0.is_zero() {
                return Err(self.err(t.span(), S, "retransmit_timeout", "must be at least 1s"));
            }
            endpoint.retransmit_timeout = t.get_ref().0;
        }
        if let Some(b) = &g.retransmit_base {
            let base = *b.get_ref();
            if !(1.0..=10.0).contains(&base) {
                return Err(self.err(
                    b.span(),
                    S,
                    "retransmit_base",
                    "must be between 1.0 and 10.0",
                ));
            }
            endpoint.retransmit_base = base;
        }
        if let Some(t) = &g.retransmit_tries {
            endpoint.retransmit_tries = u32::try_from(*t.get_ref())
                .ok()
                .filter(|n| *n <= 100)
                .ok_or_else(|| {
                    self.err(t.span(), S, "retransmit_tries", "must be between 0 and 100")
                })?;
        }
        if let Some(c) = &g.cookie_threshold {
            endpoint.cookie_threshold = usize::try_from(*c.get_ref())
                .map_err(|_| self.err(c.span(), S, "cookie_threshold", "must not be negative"))?;
        }
        if let Some(t) = &g.half_open_timeout {
            if t.get_ref().0.is_zero() {
                return Err(self.err(t.span(), S, "half_open_timeout", "must be at least 1s"));
            }
            endpoint.half_open_timeout = t.get_ref().0;
        }
        if let Some(t) = &g.keep_alive {
            if t.get_ref().0.is_zero() {
                return Err(self.err(t.span(), S, "keep_alive", "must be at least 1s"));
            }
            endpoint.nat_keepalive = t.get_ref().0;
        }

        let gateway = Gateway {
            listen,
            control_socket,
            log_format,
            key_log,
            ike_port,
            natt_port,
        };
        Ok((
            gateway,
            endpoint,
            DataplaneExtra {
                vxlan_port,
                tun_name,
                batch,
                workers,
                cpus,
                pin_workers,
                busy_poll,
            },
        ))
    }

    fn port(
        &self,
        value: Option<&Spanned<i64>>,
        key: &str,
        default: u16,
    ) -> Result<u16, Box<ConfigError>> {
        match value {
            None => Ok(default),
            Some(p) => u16::try_from(*p.get_ref())
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| {
                    self.err(
                        p.span(),
                        "[gateway]",
                        key,
                        "must be a port number between 1 and 65535",
                    )
                }),
        }
    }

    /// `[cluster]`: every key checked; addresses must be explicit (not a wildcard) because
    /// nodes are told to reach them.
    fn cluster(&self, raw: &Spanned<RawCluster>) -> Result<ClusterConfig, Box<ConfigError>> {
        const S: &str = "cluster";
        let c = raw.get_ref();
        self.check_name(&c.name, "[cluster]")?;
        let socket = |value: &Spanned<String>, key: &str| {
            value
                .get_ref()
                .trim()
                .parse::<std::net::SocketAddr>()
                .ok()
                .filter(|a| !a.ip().is_unspecified() && a.port() != 0)
                .ok_or_else(|| {
                    self.err(
                        value.span(),
                        S,
                        key,
                        "must be an address and port the other nodes can reach, e.g. \"10.0.0.1:7300\" or \"[fd00::1]:7300\"",
                    )
                })
        };
        let file = |value: &Spanned<String>, key: &str| {
            if value.get_ref().trim().is_empty() {
                return Err(self.err(value.span(), S, key, "must not be empty"));
            }
            Ok(self.relative_path(value.get_ref().trim()))
        };
        let interval = |value: &Option<Spanned<super::raw::DurationValue>>,
                        key: &str,
                        default: Duration,
                        range: std::ops::RangeInclusive<Duration>| {
            self.duration_in(value, S, key, default, range)
        };
        let report_interval = interval(
            &c.report_interval,
            "report_interval",
            DEFAULT_REPORT_INTERVAL,
            Duration::from_millis(100)..=Duration::from_secs(60),
        )?;
        Ok(ClusterConfig {
            name: c.name.get_ref().clone(),
            grpc: socket(&c.grpc, "grpc")?,
            geneve: socket(&c.geneve, "geneve")?,
            ca: file(&c.ca, "ca")?,
            cert: file(&c.cert, "cert")?,
            key: file(&c.key, "key")?,
            report_interval,
            directive_timeout: interval(
                &c.directive_timeout,
                "directive_timeout",
                DEFAULT_DIRECTIVE_TIMEOUT,
                Duration::from_millis(100)..=Duration::from_secs(30),
            )?,
            lease: match &c.lease {
                Some(d) if d.get_ref().0.subsec_nanos() != 0 => {
                    return Err(self.err(
                        d.span(),
                        S,
                        "lease",
                        "must be whole seconds (etcd grants leases in seconds)",
                    ))
                }
                other => interval(
                    other,
                    "lease",
                    crate::store::DEFAULT_LEASE_TTL,
                    Duration::from_secs(1)..=Duration::from_secs(60),
                )?,
            },
            node_capacity_mbit: match &c.node_capacity_mbit {
                None => DEFAULT_NODE_CAPACITY_MBIT,
                Some(v) => u32::try_from(*v.get_ref())
                    .ok()
                    .filter(|m| (1..=10_000_000).contains(m))
                    .ok_or_else(|| {
                        self.err(
                            v.span(),
                            S,
                            "node_capacity_mbit",
                            "must be between 1 and 10000000 (Mbit/s)",
                        )
                    })?,
            },
            autoscale: self.autoscale(c.autoscale.as_ref(), report_interval)?,
        })
    }

    /// A duration key of `section`: `default` when absent, else within `range`.
    fn duration_in(
        &self,
        value: &Option<Spanned<super::raw::DurationValue>>,
        section: &str,
        key: &str,
        default: Duration,
        range: std::ops::RangeInclusive<Duration>,
    ) -> Result<Duration, Box<ConfigError>> {
        match value {
            None => Ok(default),
            Some(d) if range.contains(&d.get_ref().0) => Ok(d.get_ref().0),
            Some(d) => Err(self.err(
                d.span(),
                section,
                key,
                format!(
                    "must be between {} and {}",
                    super::format_duration(*range.start()),
                    super::format_duration(*range.end())
                ),
            )),
        }
    }

    /// `[cluster.autoscale]`: the model's parameters, the mode and the provider. τ defaults
    /// to the report interval `report`, at least 10 s.
    fn autoscale(
        &self,
        raw: Option<&RawAutoscale>,
        report: Duration,
    ) -> Result<AutoscaleConfig, Box<ConfigError>> {
        const S: &str = "cluster.autoscale";
        let defaults = AutoscaleConfig::default();
        let defaults = AutoscaleConfig {
            interval: report.max(defaults.interval),
            ..AutoscaleConfig::default()
        };
        let Some(raw) = raw else {
            return Ok(defaults);
        };
        let duration = |value: &Option<Spanned<super::raw::DurationValue>>,
                        key: &str,
                        default: Duration,
                        range: std::ops::RangeInclusive<Duration>| {
            self.duration_in(value, S, key, default, range)
        };
        let fraction = |value: &Option<Spanned<f64>>,
                        key: &str,
                        default: f64,
                        ok: fn(f64) -> bool,
                        what: &str| match value {
            None => Ok(default),
            Some(v) if ok(*v.get_ref()) => Ok(*v.get_ref()),
            Some(v) => Err(self.err(v.span(), S, key, format!("must be {what}"))),
        };
        let mode = match &raw.mode {
            None => AutoscaleMode::Advise,
            Some(m) => match m.get_ref().as_str() {
                "advise" => AutoscaleMode::Advise,
                "act" => AutoscaleMode::Act,
                _ => {
                    return Err(self.err(
                        m.span(),
                        S,
                        "mode",
                        "must be \"advise\" (show decisions) or \"act\" (carry them out)",
                    ))
                }
            },
        };
        let local = match &raw.local {
            None => None,
            Some(l) => Some(self.local_provider(l)?),
        };
        Ok(AutoscaleConfig {
            mode,
            interval: duration(
                &raw.interval,
                "interval",
                defaults.interval,
                Duration::from_secs(1)..=Duration::from_secs(3600),
            )?,
            consolidation_interval: duration(
                &raw.consolidation_interval,
                "consolidation_interval",
                defaults.consolidation_interval,
                Duration::from_secs(1)..=Duration::from_secs(86_400),
            )?,
            hotspot_threshold: fraction(
                &raw.hotspot_threshold,
                "hotspot_threshold",
                defaults.hotspot_threshold,
                |v| v > 0.0 && v <= 1.0,
                "a fraction of a node above 0 and at most 1 (e.g. 0.9)",
            )?,
            epsilon: fraction(
                &raw.epsilon,
                "epsilon",
                defaults.epsilon,
                |v| (0.0..1.0).contains(&v),
                "a probability at least 0 and below 1 (e.g. 0.05)",
            )?,
            start_latency: duration(
                &raw.start_latency,
                "start_latency",
                defaults.start_latency,
                Duration::from_secs(1)..=Duration::from_secs(3600),
            )?,
            min_nodes: match &raw.min_nodes {
                None => defaults.min_nodes,
                Some(v) => u32::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| (1..=10_000).contains(n))
                    .ok_or_else(|| {
                        self.err(v.span(), S, "min_nodes", "must be between 1 and 10000")
                    })?,
            },
            sizing: match &raw.sizing {
                None => defaults.sizing,
                Some(v) => match v.get_ref().parse() {
                    Ok(provision::Sizing::Envelope { steps }) if steps > 1000 => {
                        return Err(self.err(
                            v.span(),
                            S,
                            "sizing",
                            "envelope:N: N must be at most 1000 measurements",
                        ))
                    }
                    Ok(sizing) => sizing,
                    Err(e) => return Err(self.err(v.span(), S, "sizing", e)),
                },
            },
            drain: raw.drain.unwrap_or(defaults.drain),
            window: match &raw.window {
                None => defaults.window,
                Some(v) => usize::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| (10..=100_000).contains(n))
                    .ok_or_else(|| {
                        self.err(
                            v.span(),
                            S,
                            "window",
                            "must be between 10 and 100000 samples",
                        )
                    })?,
            },
            stop_slack: match &raw.stop_slack {
                None => defaults.stop_slack,
                Some(v) => u32::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| *n <= 10_000)
                    .ok_or_else(|| {
                        self.err(v.span(), S, "stop_slack", "must be between 0 and 10000")
                    })?,
            },
            local,
        })
    }

    /// `[cluster.autoscale.local]`.
    fn local_provider(
        &self,
        l: &RawLocalProvider,
    ) -> Result<LocalProviderConfig, Box<ConfigError>> {
        const S: &str = "cluster.autoscale.local";
        let path = |value: &Spanned<String>, section: &str, key: &str| {
            if value.get_ref().trim().is_empty() {
                return Err(self.err(value.span(), section, key, "must not be empty"));
            }
            Ok(self.relative_path(value.get_ref().trim()))
        };
        let mut nodes: Vec<LocalNodeConfig> = Vec::with_capacity(l.node.len());
        for n in &l.node {
            const N: &str = "[cluster.autoscale.local.node]";
            let config = path(&n.get_ref().config, N, "config")?;
            if nodes.iter().any(|o| o.config == config) {
                return Err(self.err(
                    n.get_ref().config.span(),
                    N,
                    "config",
                    "lists the same data node twice",
                ));
            }
            let netns = match &n.get_ref().netns {
                None => None,
                Some(ns) => {
                    let name = ns.get_ref().trim();
                    let ok = !name.is_empty()
                        && name.len() <= 64
                        && name != "."
                        && name != ".."
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                    if !ok {
                        return Err(self.err(
                            ns.span(),
                            N,
                            "netns",
                            "must be a network namespace name (letters, digits, '-', '_', '.'; at most 64)",
                        ));
                    }
                    Some(name.to_owned())
                }
            };
            nodes.push(LocalNodeConfig { config, netns });
        }
        Ok(LocalProviderConfig {
            command: l
                .command
                .as_ref()
                .map(|c| path(c, S, "command"))
                .transpose()?,
            run_dir: path(&l.run_dir, S, "run_dir")?,
            stop_timeout: match &l.stop_timeout {
                None => DEFAULT_STOP_TIMEOUT,
                Some(d)
                    if (Duration::from_millis(100)..=Duration::from_secs(300))
                        .contains(&d.get_ref().0) =>
                {
                    d.get_ref().0
                }
                Some(d) => {
                    return Err(self.err(
                        d.span(),
                        S,
                        "stop_timeout",
                        "must be between 100ms and 5m",
                    ))
                }
            },
            nodes,
        })
    }

    /// A path from the file, relative to the file's directory unless absolute.
    fn relative_path(&self, text: &str) -> PathBuf {
        let p = Path::new(text);
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.src
                .file
                .parent()
                .unwrap_or_else(|| Path::new("."))
                .join(p)
        }
    }

    /// Tenant names with the line each was defined on.
    fn tenants(&self, raw: &RawFile) -> Result<Vec<(String, usize)>, Box<ConfigError>> {
        let mut out: Vec<(String, usize)> = Vec::new();
        for t in &raw.tenant {
            let name = &t.get_ref().name;
            let section = "[[tenant]]";
            self.check_name(name, section)?;
            if let Some((_, line)) = out.iter().find(|(n, _)| n == name.get_ref()) {
                return Err(self.err(
                    name.span(),
                    section,
                    "name",
                    format!(
                        "tenant {:?} is already defined on line {line}",
                        name.get_ref()
                    ),
                ));
            }
            out.push((name.get_ref().clone(), self.line(&name.span())));
        }
        Ok(out)
    }

    fn check_name(&self, name: &Spanned<String>, section: &str) -> Result<(), Box<ConfigError>> {
        let n = name.get_ref();
        if n.is_empty() {
            return Err(self.err(name.span(), section, "name", "must not be empty"));
        }
        if n.len() > 64
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(self.err(
                name.span(),
                section,
                "name",
                format!("{n:?} is not a valid name (up to 64 characters: letters, digits, - _ .)"),
            ));
        }
        Ok(())
    }

    fn tenant_ref(
        &self,
        tenant: &Spanned<String>,
        tenants: &[(String, usize)],
        section: &str,
    ) -> Result<(), Box<ConfigError>> {
        if tenants.iter().any(|(n, _)| n == tenant.get_ref()) {
            return Ok(());
        }
        let known: Vec<&str> = tenants.iter().map(|(n, _)| n.as_str()).collect();
        let hint = if known.is_empty() {
            "no [[tenant]] is defined".to_owned()
        } else {
            format!("defined tenants: {}", known.join(", "))
        };
        Err(self.err(
            tenant.span(),
            section,
            "tenant",
            format!("unknown tenant {:?} ({hint})", tenant.get_ref()),
        ))
    }

    fn vnets(
        &self,
        raw: &RawFile,
        tenants: &[(String, usize)],
    ) -> Result<Vec<CheckedVnet>, Box<ConfigError>> {
        let mut out: Vec<CheckedVnet> = Vec::new();
        for n in &raw.vnet {
            let vnet = self.vnet(n.get_ref(), tenants, &out)?;
            out.push(vnet);
        }
        Ok(out)
    }

    fn vnet(
        &self,
        n: &RawVnet,
        tenants: &[(String, usize)],
        done: &[CheckedVnet],
    ) -> Result<CheckedVnet, Box<ConfigError>> {
        let section = format!("[[vnet]] {:?}", n.name.get_ref());
        let s = section.as_str();
        self.check_name(&n.name, s)?;
        self.tenant_ref(&n.tenant, tenants, s)?;
        if let Some(other) = done
            .iter()
            .find(|o| o.config.tenant == *n.tenant.get_ref() && o.config.name == *n.name.get_ref())
        {
            return Err(self.err(
                n.name.span(),
                s,
                "name",
                format!(
                    "vnet {:?} of tenant {:?} is already defined on line {}",
                    n.name.get_ref(),
                    n.tenant.get_ref(),
                    other.line
                ),
            ));
        }
        let vni = *n.vni.get_ref();
        if !(0..=MAX_VNI).contains(&vni) {
            return Err(self.err(
                n.vni.span(),
                s,
                "vni",
                format!("{vni} is not a 24-bit VNI (0..={MAX_VNI})"),
            ));
        }
        let vni = u32::try_from(vni).expect("checked to be within 24 bits");
        if let Some(other) = done.iter().find(|o| o.config.vni == vni) {
            return Err(self.err(
                n.vni.span(),
                s,
                "vni",
                format!(
                    "VNI {vni} is already used by vnet {:?} of tenant {:?} on line {}",
                    other.config.name, other.config.tenant, other.line
                ),
            ));
        }
        let gateway_ips = self.gateway_ips(&n.gateway_ip, s)?;
        let vtep = self.ip(&n.vtep, s, "vtep")?;
        let mut routes: Vec<Route> = Vec::with_capacity(n.routes.len());
        for r in &n.routes {
            let r = r.get_ref();
            let net = parse_prefix(r.prefix.get_ref())
                .map_err(|m| self.err(r.prefix.span(), s, "routes.prefix", m))?;
            let (prefix, len) = (net.addr(), net.prefix_len());
            let host = self.ip(&r.host, s, "routes.host")?;
            if host.is_ipv4() != vtep.is_ipv4() {
                return Err(self.err(
                    r.host.span(),
                    s,
                    "routes.host",
                    format!("{host} is not of the same IP version as the vtep {vtep}"),
                ));
            }
            if routes.iter().any(|o| o.prefix == prefix && o.len == len) {
                return Err(self.err(
                    r.prefix.span(),
                    s,
                    "routes.prefix",
                    format!("{prefix}/{len} is listed twice in this vnet"),
                ));
            }
            routes.push(Route { prefix, len, host });
        }
        Ok(CheckedVnet {
            config: VnetConfig {
                tenant: n.tenant.get_ref().clone(),
                name: n.name.get_ref().clone(),
                vni,
                gateway_ips,
                vtep,
                routes,
            },
            line: self.line(&n.name.span()),
        })
    }

    fn ip(
        &self,
        value: &Spanned<String>,
        section: &str,
        key: &str,
    ) -> Result<IpAddr, Box<ConfigError>> {
        self.unicast(value.get_ref(), value.span(), section, key)
    }

    /// `text` as a unicast IP address; errors point at `span`.
    fn unicast(
        &self,
        text: &str,
        span: Range<usize>,
        section: &str,
        key: &str,
    ) -> Result<IpAddr, Box<ConfigError>> {
        let addr: IpAddr = text.trim().parse().map_err(|_| {
            self.err(
                span.clone(),
                section,
                key,
                format!("{text:?} is not an IP address"),
            )
        })?;
        if addr.is_unspecified() || addr.is_multicast() {
            return Err(self.err(
                span,
                section,
                key,
                format!("{addr} is not a unicast address"),
            ));
        }
        Ok(addr)
    }

    /// A VNet's `gateway_ip`: one address, or one per IP version for a dual-stack VNet.
    fn gateway_ips(
        &self,
        value: &Spanned<StringList>,
        section: &str,
    ) -> Result<Vec<IpAddr>, Box<ConfigError>> {
        const KEY: &str = "gateway_ip";
        let mut out: Vec<IpAddr> = Vec::new();
        for text in &value.get_ref().0 {
            let addr = self.unicast(text, value.span(), section, KEY)?;
            if let Some(other) = out.iter().find(|o| o.is_ipv4() == addr.is_ipv4()) {
                return Err(self.err(
                    value.span(),
                    section,
                    KEY,
                    format!("{other} and {addr}: at most one gateway address per IP version"),
                ));
            }
            out.push(addr);
        }
        if out.is_empty() {
            return Err(self.err(value.span(), section, KEY, "a gateway address is required"));
        }
        Ok(out)
    }
}

/// Parses `ADDRESS/LEN`, rejecting host bits, as `ip route` does.
fn parse_prefix(text: &str) -> Result<IpNet, String> {
    let (addr, len) = text.trim().split_once('/').ok_or_else(|| {
        format!("{text:?} is not a prefix (expected ADDRESS/LENGTH, e.g. 10.2.0.0/24)")
    })?;
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| format!("{text:?}: {addr:?} is not an IP address"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let net = len
        .parse()
        .ok()
        .and_then(|len| IpNet::new(addr, len).ok())
        .ok_or_else(|| format!("{text:?}: prefix length must be 0..={max}"))?;
    if net.network() != addr {
        return Err(format!(
            "{text:?} has host bits set beyond the /{} prefix",
            net.prefix_len()
        ));
    }
    Ok(net)
}
