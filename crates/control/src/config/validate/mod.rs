//! Turns the raw file into a [`Config`], checking everything before anything starts: references
//! between tables, duplicates, addresses, identities, proposals, selectors, lifetimes and PSK
//! files. The first error found is returned, located at the offending key. Tunnel tables are
//! checked in `tunnel.rs`.

mod attachment;
mod cluster;
mod etcd_access;
pub(crate) mod filter;
mod gateway;
mod storage;
mod tunnel;

use super::raw::{
    RawAutoscale, RawCluster, RawDispatch, RawFile, RawGateway, RawLocalProvider, RawStore,
    RawVnet, StringList,
};
use super::{
    AutoscaleConfig, AutoscaleMode, ClusterConfig, ClusterDispatch, Config, DispatchMode, Gateway,
    LocalNodeConfig, LocalProviderConfig, LogFormat, Source, StoreConfig, StoredPsks, Tunnel,
    TunnelInside, DEFAULT_CONTROL_SOCKET, DEFAULT_ETCD_CONNECT_TIMEOUT, DEFAULT_ETCD_PREFIX,
    DEFAULT_ETCD_TIMEOUT, DEFAULT_STORE_PATH,
};
use crate::error::ConfigError;
use crate::store::EtcdOptions;
use datapath::{DataplaneConfig, Inside, Route, TunnelBinding, VnetConfig};
use ids::TenantId;
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
/// Upper bound of `resource_sas`: far more per-resource CHILD_SAs than any peer's CPUs or a
/// cluster's data nodes, low enough that a peer cannot make one IKE SA hold unbounded state.
const MAX_RESOURCE_SAS: u32 = 1024;
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
    let metrics = raw.metrics.as_ref().map(|m| v.metrics(m)).transpose()?;
    let api = raw.api.as_ref().map(|a| v.api(a)).transpose()?;
    let tenants = v.tenants(&raw)?;
    let cpu_weights = v.cpu_weights(&raw)?;
    let vnets = v.vnets(&raw, &tenants)?;
    let mut done = tunnel::Done::default();
    for (index, t) in raw.tunnel.iter().enumerate() {
        let tunnel = v.tunnel(index, t, &gateway, &tenants, &vnets, &done)?;
        done.push(tunnel);
    }
    let tunnels = done.tunnels;
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
    let mut attachments: Vec<attachment::CheckedAttachment> = Vec::new();
    let tunnel_names: Vec<(&str, usize)> = tunnels
        .iter()
        .map(|t| (t.tunnel.peer.name.as_str(), t.tunnel.line))
        .collect();
    for a in &raw.attachment {
        let checked = v.attachment(
            a,
            &tenants,
            &vnets,
            &attachments,
            &tunnel_names,
            cluster.is_some(),
        )?;
        attachments.push(checked);
    }
    let mut filters: Vec<filter::CheckedFilter> = Vec::new();
    for f in &raw.filter {
        let checked = v.filter(f, &tenants, &filters)?;
        filters.push(checked);
    }
    let mut cluster = cluster;
    if let Some(c) = cluster.as_mut() {
        c.attachment_steers = attachments
            .iter()
            .filter_map(|a| Some((a.config.name.clone(), a.steer.clone()?)))
            .collect();
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
        attachments: attachments.into_iter().map(|a| a.config).collect(),
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
        busy_poll_budget: extra.busy_poll_budget,
        xdp: extra.xdp,
        fair_kernel_gate: extra.fair_kernel_gate,
        relay: None,
        dispatch: None,
    };
    Ok(Config {
        path: src.file.to_owned(),
        text: src.text.into(),
        gateway,
        endpoint,
        tenants: tenants.into_iter().map(|(name, _)| name).collect(),
        cpu_weights,
        tunnels: tunnels.into_iter().map(|t| t.tunnel).collect(),
        dataplane,
        store,
        store_encryption,
        cluster,
        filters: filters.into_iter().map(|f| f.config).collect(),
        metrics,
        api,
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
    busy_poll_budget: u8,
    xdp: datapath::XdpMode,
    fair_kernel_gate: bool,
}

/// A validated VNet with the line it was defined on (for duplicate messages).
struct CheckedVnet {
    config: VnetConfig,
    line: usize,
}

/// A validated tunnel with the spans later checks point at.
pub(super) struct CheckedTunnel {
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

    /// `[metrics]`.
    fn metrics(
        &self,
        raw: &Spanned<super::raw::RawMetrics>,
    ) -> Result<metrics::MetricsConfig, Box<ConfigError>> {
        let listen = &raw.get_ref().listen;
        metrics::MetricsConfig::parse(listen.get_ref())
            .map_err(|message| self.err(listen.span(), "metrics", "listen", message))
    }

    /// `[api]`: TLS unless `tls = false` on a loopback address (a token must not cross a
    /// network in clear), and at least one way to authenticate.
    fn api(&self, raw: &Spanned<super::raw::RawApi>) -> Result<super::ApiConfig, Box<ConfigError>> {
        const S: &str = "api";
        let a = raw.get_ref();
        let listen = metrics::MetricsConfig::parse(a.listen.get_ref())
            .map_err(|message| self.err(a.listen.span(), S, "listen", message))?
            .listen;
        let path =
            |key: &str, p: &Option<Spanned<String>>| -> Result<Option<PathBuf>, Box<ConfigError>> {
                match p {
                    Some(p) if p.get_ref().trim().is_empty() => {
                        Err(self.err(p.span(), S, key, "must not be empty"))
                    }
                    Some(p) => Ok(Some(self.relative_path(p.get_ref()))),
                    None => Ok(None),
                }
            };
        let cert_file = path("cert_file", &a.cert_file)?;
        let key_file = path("key_file", &a.key_file)?;
        let client_ca_file = path("client_ca_file", &a.client_ca_file)?;
        let tokens_file = path("tokens_file", &a.tokens_file)?;
        let tls = match (&a.tls, cert_file, key_file) {
            (Some(t), cert, key) if !*t.get_ref() => {
                if !listen.ip().is_loopback() {
                    return Err(self.err(
                        t.span(),
                        S,
                        "tls",
                        format!(
                            "false is only allowed on a loopback address (listen is {listen}): \
                             tokens would cross the network in clear"
                        ),
                    ));
                }
                if let Some(c) = &a.client_ca_file {
                    return Err(self.err(
                        c.span(),
                        S,
                        "client_ca_file",
                        "client certificates need TLS (tls = false)",
                    ));
                }
                if cert.is_some() || key.is_some() {
                    return Err(self.err(
                        t.span(),
                        S,
                        "tls",
                        "false, yet cert_file or key_file is set: remove them or tls = false",
                    ));
                }
                None
            }
            (_, Some(cert_file), Some(key_file)) => Some(super::ApiTls {
                cert_file,
                key_file,
            }),
            (_, cert, _) => {
                let missing = if cert.is_none() {
                    "cert_file"
                } else {
                    "key_file"
                };
                return Err(self.err(
                    raw.span(),
                    S,
                    missing,
                    "is required: the API serves HTTPS (`protego certs` makes a certificate; \
                     tls = false only for a loopback address)",
                ));
            }
        };
        if tokens_file.is_none() && client_ca_file.is_none() {
            return Err(self.err(
                raw.span(),
                S,
                "tokens_file",
                "or client_ca_file is required: nobody could authenticate otherwise",
            ));
        }
        Ok(super::ApiConfig {
            listen,
            tls,
            client_ca_file,
            tokens_file,
        })
    }

    fn line(&self, span: &Range<usize>) -> usize {
        self.src.line_col(span.start).0
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

    /// Each tenant's `cpu_weight` (1 unless set), in file order.
    fn cpu_weights(&self, raw: &RawFile) -> Result<Vec<u16>, Box<ConfigError>> {
        raw.tenant
            .iter()
            .map(|t| match &t.get_ref().cpu_weight {
                None => Ok(1),
                Some(w) => u16::try_from(*w.get_ref())
                    .ok()
                    .filter(|w| *w >= 1)
                    .ok_or_else(|| {
                        self.err(
                            w.span(),
                            "[[tenant]]",
                            "cpu_weight",
                            "must be an integer from 1 to 65535",
                        )
                    }),
            })
            .collect()
    }

    /// Tenants with the line each was defined on.
    fn tenants(&self, raw: &RawFile) -> Result<Vec<(TenantId, usize)>, Box<ConfigError>> {
        let mut out: Vec<(TenantId, usize)> = Vec::new();
        for t in &raw.tenant {
            let name = &t.get_ref().name;
            let section = "[[tenant]]";
            let tenant = TenantId::new(name.get_ref())
                .map_err(|e| self.err(name.span(), section, "name", e.to_string()))?;
            if let Some((_, line)) = out.iter().find(|(n, _)| *n == tenant) {
                return Err(self.err(
                    name.span(),
                    section,
                    "name",
                    format!("tenant {tenant:?} is already defined on line {line}"),
                ));
            }
            out.push((tenant, self.line(&name.span())));
        }
        Ok(out)
    }

    /// Checks a VNet's or tunnel's name by the rule of tenant names (`ids::check_name`).
    fn check_name(&self, name: &Spanned<String>, section: &str) -> Result<(), Box<ConfigError>> {
        ids::check_name(name.get_ref())
            .map_err(|e| self.err(name.span(), section, "name", e.to_string()))
    }

    /// The defined tenant `tenant` names.
    fn tenant_ref(
        &self,
        tenant: &Spanned<String>,
        tenants: &[(TenantId, usize)],
        section: &str,
    ) -> Result<TenantId, Box<ConfigError>> {
        if let Some((t, _)) = tenants.iter().find(|(n, _)| n == tenant.get_ref()) {
            return Ok(t.clone());
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
        tenants: &[(TenantId, usize)],
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
        tenants: &[(TenantId, usize)],
        done: &[CheckedVnet],
    ) -> Result<CheckedVnet, Box<ConfigError>> {
        let section = format!("[[vnet]] {:?}", n.name.get_ref());
        let s = section.as_str();
        self.check_name(&n.name, s)?;
        let tenant = self.tenant_ref(&n.tenant, tenants, s)?;
        if let Some(other) = done
            .iter()
            .find(|o| o.config.tenant == tenant && o.config.name == *n.name.get_ref())
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
        let router_mac = match &n.router_mac {
            None => None,
            Some(m) => {
                let bad = |why: &str| self.err(m.span(), s, "router_mac", why.to_owned());
                let mac: wire::ethernet::EthernetAddress =
                    m.get_ref()
                        .parse()
                        .map_err(|e: wire::ethernet::MacParseError| {
                            bad(&format!("{:?}: {e}", m.get_ref()))
                        })?;
                if mac.is_multicast() || mac.0 == [0; 6] {
                    return Err(bad(&format!(
                        "{mac} is not a unicast MAC address (the hosts' router MAC)"
                    )));
                }
                Some(mac.0)
            }
        };
        Ok(CheckedVnet {
            config: VnetConfig {
                tenant,
                name: n.name.get_ref().clone(),
                vni,
                gateway_ips,
                vtep,
                routes,
                router_mac,
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
