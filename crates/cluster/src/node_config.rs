//! The configuration file of a data or steer node (`protego data -c FILE`,
//! `protego steer -c FILE`). Everything about tunnels and VNets comes from the control node;
//! this file says who the node is, where the control nodes are, and which addresses it uses.
//!
//! ```toml
//! [node]
//! name = "data1"                 # must be the certificate's CN
//! ca = "pki/ca.pem"              # paths relative to this file
//! cert = "pki/data1.pem"
//! key = "pki/data1.key"
//! log_format = "text"            # or "json"
//!
//! [[node.control]]               # one per control node, tried in turn
//! name = "control1"              # the control node's certificate CN
//! address = "10.255.0.10:7300"
//!
//! [data]                         # data nodes
//! geneve = "10.255.0.21:6081"    # where steer nodes send ESP and VXLAN
//! vtep = "10.255.0.21"           # source of VXLAN toward hosts (default: geneve's address)
//! workers = 0                    # 0: one per CPU
//!
//! [steer]                        # steer nodes
//! vips = ["198.51.100.1"]        # the public addresses peers use (UDP 500 and 4500)
//! vxlan = "10.255.0.1:4789"      # where cloud hosts send VXLAN (their flood entry)
//! geneve = "10.255.0.1:6081"     # where data and control nodes send relayed output
//! probe_sample = 1000            # probe 1 of N forwarded packets per data node
//! probe_interval = "10ms"        # at least one probe per interval per data node
//! probe_timeout = "30ms"         # a probe unanswered this long is missed
//! probe_misses = 3               # misses in a row that mark a data node dead
//! ports = ["eth2"]               # customer-facing ports ([[attachment]] steer = this node):
//!                                # port i of the list has id i + 1 on this node
//!
//! [metrics]                      # optional, every role
//! listen = "10.255.0.21:9180"    # Prometheus scrapes http://10.255.0.21:9180/metrics
//! ```

use control::config::{parse_duration, LogFormat};
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A node configuration error, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// TOML syntax or an unknown key.
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A value is wrong.
    #[error("{path}: {key}: {message}")]
    Value {
        /// The file.
        path: PathBuf,
        /// The key, e.g. `data.geneve`.
        key: String,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    node: RawNode,
    data: Option<RawData>,
    steer: Option<RawSteer>,
    metrics: Option<RawMetrics>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: String,
    ca: String,
    cert: String,
    key: String,
    log_format: Option<String>,
    #[serde(default)]
    control: Vec<RawControl>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawControl {
    name: String,
    address: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawData {
    geneve: String,
    vtep: Option<String>,
    workers: Option<u32>,
    batch: Option<u32>,
    natt_port: Option<u16>,
    vxlan_port: Option<u16>,
    xdp: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSteer {
    vips: Vec<String>,
    vxlan: String,
    geneve: String,
    ike_port: Option<u16>,
    natt_port: Option<u16>,
    probe_sample: Option<u32>,
    probe_interval: Option<String>,
    probe_timeout: Option<String>,
    probe_misses: Option<u32>,
    #[serde(default)]
    ports: Vec<String>,
}

/// A control node to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlEndpoint {
    /// Its certificate's CN (checked in the TLS handshake).
    pub name: String,
    /// Its gRPC address.
    pub address: SocketAddr,
}

/// `[node]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSection {
    /// This node's name.
    pub name: String,
    /// CA certificate.
    pub ca: PathBuf,
    /// This node's certificate.
    pub cert: PathBuf,
    /// This node's key.
    pub key: PathBuf,
    /// Log format.
    pub log_format: LogFormat,
    /// The control nodes, tried in turn.
    pub control: Vec<ControlEndpoint>,
}

/// `[data]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSection {
    /// Geneve address.
    pub geneve: SocketAddr,
    /// VXLAN source address toward hosts.
    pub vtep: IpAddr,
    /// Packet workers (0: one per CPU).
    pub workers: usize,
    /// Datagrams per batch.
    pub batch: usize,
    /// AF_XDP input for the Geneve and VTEP sockets (`[data] xdp`, as `[gateway] xdp`).
    pub xdp: datapath::XdpMode,
    /// NAT-T port the peers use (inner destination port of relayed ESP).
    pub natt_port: u16,
    /// VXLAN port.
    pub vxlan_port: u16,
}

/// `[steer]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SteerSection {
    /// Public addresses.
    pub vips: Vec<IpAddr>,
    /// VXLAN address hosts send to.
    pub vxlan: SocketAddr,
    /// Geneve address.
    pub geneve: SocketAddr,
    /// IKE port.
    pub ike_port: u16,
    /// NAT-T port.
    pub natt_port: u16,
    /// Probe 1 of N forwarded packets.
    pub probe_sample: u32,
    /// At least one probe per interval.
    pub probe_interval: Duration,
    /// A probe unanswered this long is missed.
    pub probe_timeout: Duration,
    /// Misses in a row that mark a node dead.
    pub probe_misses: u32,
    /// Customer-facing ports (interface names): port `i` has id `i + 1` on this node.
    pub ports: Vec<String>,
}

/// A whole node file.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// The file.
    pub path: PathBuf,
    /// `[node]`.
    pub node: NodeSection,
    /// `[data]`, if present.
    pub data: Option<DataSection>,
    /// `[steer]`, if present.
    pub steer: Option<SteerSection>,
    /// `[metrics]`: where the node serves Prometheus metrics (absent: it does not).
    pub metrics: Option<metrics::MetricsConfig>,
}

impl NodeConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, NodeConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| NodeConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Validates `text` as if read from `path` (relative paths resolve against its directory).
    pub fn parse(path: &Path, text: &str) -> Result<Self, NodeConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| NodeConfigError::Syntax {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let bad = |key: &str, message: String| NodeConfigError::Value {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        let file = |key: &str, v: &str| {
            if v.trim().is_empty() {
                return Err(bad(key, "must not be empty".into()));
            }
            let p = Path::new(v.trim());
            Ok(if p.is_absolute() {
                p.to_owned()
            } else {
                dir.join(p)
            })
        };
        let reachable = |key: &str, v: &str| {
            v.trim()
                .parse::<SocketAddr>()
                .ok()
                .filter(|a| !a.ip().is_unspecified() && a.port() != 0)
                .ok_or_else(|| {
                    bad(
                        key,
                        format!("{v:?} is not an address and port other nodes can reach (e.g. \"10.0.0.1:6081\")"),
                    )
                })
        };
        let n = &raw.node;
        if n.name.is_empty()
            || n.name.len() > 64
            || !n
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(bad(
                "node.name",
                "must be 1 to 64 letters, digits, '-', '_' or '.'".into(),
            ));
        }
        if n.control.is_empty() {
            return Err(bad(
                "node.control",
                "at least one [[node.control]] with name and address is needed".into(),
            ));
        }
        let mut control = Vec::new();
        for (i, c) in n.control.iter().enumerate() {
            if c.name.trim().is_empty() {
                return Err(bad(
                    &format!("node.control[{i}].name"),
                    "must not be empty".into(),
                ));
            }
            control.push(ControlEndpoint {
                name: c.name.trim().to_owned(),
                address: reachable(&format!("node.control[{i}].address"), &c.address)?,
            });
        }
        let log_format = match n.log_format.as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(bad(
                    "node.log_format",
                    format!("{other:?} is not \"text\" or \"json\""),
                ))
            }
        };
        let node = NodeSection {
            name: n.name.clone(),
            ca: file("node.ca", &n.ca)?,
            cert: file("node.cert", &n.cert)?,
            key: file("node.key", &n.key)?,
            log_format,
            control,
        };
        let data = match &raw.data {
            None => None,
            Some(d) => {
                let geneve = reachable("data.geneve", &d.geneve)?;
                let vtep = match &d.vtep {
                    None => geneve.ip(),
                    Some(v) => v
                        .trim()
                        .parse::<IpAddr>()
                        .ok()
                        .filter(|a| !a.is_unspecified())
                        .ok_or_else(|| {
                            bad("data.vtep", format!("{v:?} is not a unicast address"))
                        })?,
                };
                let batch = d.batch.unwrap_or(32) as usize;
                if !(1..=1024).contains(&batch) {
                    return Err(bad("data.batch", "must be between 1 and 1024".into()));
                }
                let workers = d.workers.unwrap_or(0) as usize;
                if workers > 1024 {
                    return Err(bad("data.workers", "must be at most 1024".into()));
                }
                let xdp = match &d.xdp {
                    None => datapath::XdpMode::Off,
                    Some(x) => datapath::XdpMode::from_name(x).ok_or_else(|| {
                        bad(
                            "data.xdp",
                            format!("{x:?}: must be \"off\", \"auto\", \"native\" or \"generic\""),
                        )
                    })?,
                };
                Some(DataSection {
                    geneve,
                    vtep,
                    workers,
                    batch,
                    xdp,
                    natt_port: port(d.natt_port, 4500).map_err(|m| bad("data.natt_port", m))?,
                    vxlan_port: port(d.vxlan_port, 4789).map_err(|m| bad("data.vxlan_port", m))?,
                })
            }
        };
        let steer = match &raw.steer {
            None => None,
            Some(s) => {
                if s.vips.is_empty() {
                    return Err(bad("steer.vips", "at least one address is needed".into()));
                }
                let mut vips = Vec::new();
                for v in &s.vips {
                    let ip = v
                        .trim()
                        .parse::<IpAddr>()
                        .ok()
                        .filter(|a| !a.is_unspecified() && !a.is_multicast())
                        .ok_or_else(|| {
                            bad("steer.vips", format!("{v:?} is not a unicast address"))
                        })?;
                    if vips.contains(&ip) {
                        return Err(bad("steer.vips", format!("{ip} is listed twice")));
                    }
                    vips.push(ip);
                }
                let duration = |key: &str, v: &Option<String>, default: Duration| match v {
                    None => Ok(default),
                    Some(text) => parse_duration(text)
                        .ok()
                        .filter(|d| !d.is_zero() && *d <= Duration::from_secs(10))
                        .ok_or_else(|| {
                            bad(
                                key,
                                format!("{text:?} is not a duration between 1ms and 10s"),
                            )
                        }),
                };
                let probe_sample = s.probe_sample.unwrap_or(1000);
                if probe_sample == 0 {
                    return Err(bad("steer.probe_sample", "must be at least 1".into()));
                }
                let probe_misses = s.probe_misses.unwrap_or(3);
                if !(1..=100).contains(&probe_misses) {
                    return Err(bad(
                        "steer.probe_misses",
                        "must be between 1 and 100".into(),
                    ));
                }
                let mut ports: Vec<String> = Vec::new();
                for (i, p) in s.ports.iter().enumerate() {
                    let key = format!("steer.ports[{i}]");
                    // IFNAMSIZ is 16 with the terminating NUL.
                    if p.is_empty()
                        || p.len() > 15
                        || p.contains('/')
                        || p.chars().any(|c| c.is_whitespace() || c.is_control())
                    {
                        return Err(bad(&key, format!("{p:?} is not an interface name")));
                    }
                    if let Some(j) = ports.iter().position(|q| q == p) {
                        return Err(bad(&key, format!("{p:?} repeats steer.ports[{j}]")));
                    }
                    ports.push(p.clone());
                }
                Some(SteerSection {
                    vips,
                    vxlan: reachable("steer.vxlan", &s.vxlan)?,
                    geneve: reachable("steer.geneve", &s.geneve)?,
                    ike_port: port(s.ike_port, 500).map_err(|m| bad("steer.ike_port", m))?,
                    natt_port: port(s.natt_port, 4500).map_err(|m| bad("steer.natt_port", m))?,
                    probe_sample,
                    probe_interval: duration(
                        "steer.probe_interval",
                        &s.probe_interval,
                        Duration::from_millis(10),
                    )?,
                    probe_timeout: duration(
                        "steer.probe_timeout",
                        &s.probe_timeout,
                        Duration::from_millis(30),
                    )?,
                    probe_misses,
                    ports,
                })
            }
        };
        let metrics = raw
            .metrics
            .as_ref()
            .map(|m| metrics::MetricsConfig::parse(&m.listen).map_err(|e| bad("metrics.listen", e)))
            .transpose()?;
        Ok(Self {
            path: path.to_owned(),
            node,
            data,
            steer,
            metrics,
        })
    }
}

fn port(value: Option<u16>, default: u16) -> Result<u16, String> {
    match value {
        None => Ok(default),
        Some(0) => Err("must be a port between 1 and 65535".into()),
        Some(p) => Ok(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: &str = r#"
[node]
name = "data1"
ca = "pki/ca.pem"
cert = "pki/data1.pem"
key = "/etc/protego/data1.key"
[[node.control]]
name = "control1"
address = "10.255.0.10:7300"
[data]
geneve = "10.255.0.21:6081"
"#;

    #[test]
    fn a_data_node_file() {
        let c = NodeConfig::parse(Path::new("/etc/protego/data.toml"), DATA).unwrap();
        assert_eq!(c.node.name, "data1");
        assert_eq!(c.node.ca, Path::new("/etc/protego/pki/ca.pem"));
        assert_eq!(c.node.key, Path::new("/etc/protego/data1.key"));
        assert_eq!(
            c.node.control[0].address,
            "10.255.0.10:7300".parse().unwrap()
        );
        let d = c.data.unwrap();
        assert_eq!(d.vtep, "10.255.0.21".parse::<IpAddr>().unwrap());
        assert_eq!((d.natt_port, d.vxlan_port, d.workers), (4500, 4789, 0));
        assert_eq!(d.xdp, datapath::XdpMode::Off);
        assert!(c.steer.is_none());
        let auto = DATA.replace("[data]", "[data]\nxdp = \"auto\"");
        let c = NodeConfig::parse(Path::new("d.toml"), &auto).unwrap();
        assert_eq!(c.data.unwrap().xdp, datapath::XdpMode::Auto);
    }

    #[test]
    fn a_steer_node_file() {
        let text = DATA.replace(
            "[data]\ngeneve = \"10.255.0.21:6081\"",
            "[steer]\nvips = [\"198.51.100.1\"]\nvxlan = \"10.255.0.1:4789\"\ngeneve = \"10.255.0.1:6081\"\nprobe_interval = \"5ms\"",
        );
        let c = NodeConfig::parse(Path::new("s.toml"), &text).unwrap();
        let s = c.steer.unwrap();
        assert_eq!(s.probe_interval, Duration::from_millis(5));
        assert_eq!((s.probe_sample, s.probe_misses, s.ike_port), (1000, 3, 500));
        assert!(s.ports.is_empty());
        let with_ports = text.replace("[steer]", "[steer]\nports = [\"eth2\", \"eth3\"]");
        let c = NodeConfig::parse(Path::new("s.toml"), &with_ports).unwrap();
        assert_eq!(c.steer.unwrap().ports, ["eth2", "eth3"]);
        for (ports, key) in [
            ("[\"eth2\", \"eth2\"]", "steer.ports[1]"),
            ("[\"\"]", "steer.ports[0]"),
            ("[\"eth2\", \"a-name-too-long-x\"]", "steer.ports[1]"),
        ] {
            let t = text.replace("[steer]", &format!("[steer]\nports = {ports}"));
            match NodeConfig::parse(Path::new("s.toml"), &t) {
                Err(NodeConfigError::Value { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{key}: {other:?}"),
            }
        }
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (
                DATA.replace("10.255.0.21:6081", "0.0.0.0:6081"),
                "data.geneve",
            ),
            (
                DATA.replace("name = \"data1\"", "name = \"da ta\""),
                "node.name",
            ),
            (
                DATA.replace("10.255.0.10:7300", "nowhere"),
                "node.control[0].address",
            ),
            (DATA.replace("[data]", "[data]\nbatch = 0"), "data.batch"),
            (DATA.replace("[data]", "[data]\nxdp = \"on\""), "data.xdp"),
            (DATA.replace("[data]", "[data]\nvtep = \"::\""), "data.vtep"),
        ];
        for (text, key) in cases {
            match NodeConfig::parse(Path::new("x.toml"), &text) {
                Err(NodeConfigError::Value { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{key}: {other:?}"),
            }
        }
        assert!(matches!(
            NodeConfig::parse(
                Path::new("x.toml"),
                &DATA.replace("[data]", "[data]\nspeed = 1")
            ),
            Err(NodeConfigError::Syntax { .. })
        ));
    }

    #[test]
    fn metrics_listen_is_checked() {
        let c = NodeConfig::parse(Path::new("d.toml"), DATA).unwrap();
        assert_eq!(c.metrics, None);
        let with = format!("{DATA}\n[metrics]\nlisten = \"10.255.0.21:9180\"\n");
        let c = NodeConfig::parse(Path::new("d.toml"), &with).unwrap();
        assert_eq!(
            c.metrics.map(|m| m.listen),
            Some("10.255.0.21:9180".parse().unwrap())
        );
        let bad = format!("{DATA}\n[metrics]\nlisten = \"9180\"\n");
        match NodeConfig::parse(Path::new("d.toml"), &bad) {
            Err(e @ NodeConfigError::Value { .. }) => {
                assert!(
                    e.to_string()
                        .contains("metrics.listen: must be an address and port"),
                    "{e}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
