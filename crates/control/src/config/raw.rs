//! The configuration file as TOML gives it to us: every table with `deny_unknown_fields` and
//! every value that can be wrong wrapped in [`Spanned`], so that validation can point at the line
//! and column of the offending key. Nothing here checks meaning; `validate` does.

use super::duration::parse_duration;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::time::Duration;
use toml::Spanned;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
    pub(crate) gateway: Spanned<RawGateway>,
    #[serde(default)]
    pub(crate) tenant: Vec<Spanned<RawTenant>>,
    #[serde(default)]
    pub(crate) vnet: Vec<Spanned<RawVnet>>,
    #[serde(default)]
    pub(crate) tunnel: Vec<Spanned<RawTunnel>>,
    #[serde(default)]
    pub(crate) attachment: Vec<Spanned<RawAttachment>>,
    #[serde(default)]
    pub(crate) filter: Vec<Spanned<RawFilter>>,
    pub(crate) store: Option<Spanned<RawStore>>,
    pub(crate) cluster: Option<Spanned<RawCluster>>,
    pub(crate) metrics: Option<Spanned<RawMetrics>>,
    pub(crate) api: Option<Spanned<RawApi>>,
}

/// `[api]`: the HTTP API and web console (docs/api.md).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApi {
    pub(crate) listen: Spanned<String>,
    #[serde(default)]
    pub(crate) tls: Option<Spanned<bool>>,
    #[serde(default)]
    pub(crate) cert_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) key_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) client_ca_file: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) tokens_file: Option<Spanned<String>>,
}

/// `[metrics]`: where the node serves its Prometheus metrics.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    pub(crate) listen: Spanned<String>,
}

/// A file given to `protego ctl apply`: the tenants, VNets and tunnels; node-wide tables may
/// be present (a whole configuration file) and are ignored, and so are `[[filter]]` tables
/// (filters change only with a restart).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawInventory {
    #[serde(default)]
    pub(crate) tenant: Vec<Spanned<RawTenant>>,
    #[serde(default)]
    pub(crate) vnet: Vec<Spanned<RawVnet>>,
    #[serde(default)]
    pub(crate) tunnel: Vec<Spanned<RawTunnel>>,
    #[serde(default, rename = "gateway")]
    pub(crate) _gateway: Option<toml::Value>,
    #[serde(default, rename = "store")]
    pub(crate) _store: Option<toml::Value>,
    #[serde(default, rename = "cluster")]
    pub(crate) _cluster: Option<toml::Value>,
    #[serde(default, rename = "attachment")]
    pub(crate) _attachment: Option<toml::Value>,
    #[serde(default, rename = "filter")]
    pub(crate) _filter: Option<toml::Value>,
    #[serde(default, rename = "metrics")]
    pub(crate) _metrics: Option<toml::Value>,
    #[serde(default, rename = "api")]
    pub(crate) _api: Option<toml::Value>,
}

/// `[cluster]`: the control node's side of the distributed form.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCluster {
    pub(crate) name: Spanned<String>,
    pub(crate) grpc: Spanned<String>,
    pub(crate) geneve: Spanned<String>,
    pub(crate) ca: Spanned<String>,
    pub(crate) cert: Spanned<String>,
    pub(crate) key: Spanned<String>,
    pub(crate) report_interval: Option<Spanned<DurationValue>>,
    pub(crate) directive_timeout: Option<Spanned<DurationValue>>,
    pub(crate) lease: Option<Spanned<DurationValue>>,
    pub(crate) node_capacity_mbit: Option<Spanned<i64>>,
    pub(crate) autoscale: Option<RawAutoscale>,
    pub(crate) dispatch: Option<RawDispatch>,
}

/// `[cluster.dispatch]`: self-dispatch and the ring.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDispatch {
    pub(crate) mode: Option<Spanned<String>>,
    pub(crate) vmacs: Option<Spanned<i64>>,
    pub(crate) announce_interval: Option<Spanned<DurationValue>>,
    pub(crate) linger: Option<Spanned<DurationValue>>,
    pub(crate) load_interval: Option<Spanned<DurationValue>>,
    pub(crate) move_interval: Option<Spanned<DurationValue>>,
    pub(crate) load_difference: Option<Spanned<f64>>,
    pub(crate) move_vmacs: Option<Spanned<i64>>,
}

/// `[cluster.autoscale]`: the elastic provisioning model and what it may do.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAutoscale {
    pub(crate) mode: Option<Spanned<String>>,
    pub(crate) interval: Option<Spanned<DurationValue>>,
    pub(crate) consolidation_interval: Option<Spanned<DurationValue>>,
    pub(crate) hotspot_threshold: Option<Spanned<f64>>,
    pub(crate) epsilon: Option<Spanned<f64>>,
    pub(crate) start_latency: Option<Spanned<DurationValue>>,
    pub(crate) min_nodes: Option<Spanned<i64>>,
    pub(crate) stop_slack: Option<Spanned<i64>>,
    pub(crate) sizing: Option<Spanned<String>>,
    pub(crate) drain: Option<bool>,
    pub(crate) guarantee_target: Option<Spanned<f64>>,
    pub(crate) window: Option<Spanned<i64>>,
    pub(crate) local: Option<RawLocalProvider>,
}

/// `[cluster.autoscale.local]`: the `local` node provider.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLocalProvider {
    pub(crate) command: Option<Spanned<String>>,
    pub(crate) run_dir: Spanned<String>,
    pub(crate) stop_timeout: Option<Spanned<DurationValue>>,
    #[serde(default)]
    pub(crate) node: Vec<Spanned<RawLocalNode>>,
}

/// One `[[cluster.autoscale.local.node]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLocalNode {
    pub(crate) config: Spanned<String>,
    pub(crate) netns: Option<Spanned<String>>,
}

/// `[store]`: where the control plane keeps its durable state.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    pub(crate) backend: Option<Spanned<String>>,
    pub(crate) encryption_key_file: Option<Spanned<String>>,
    pub(crate) accept_cleartext: Option<Spanned<bool>>,
    pub(crate) path: Option<Spanned<String>>,
    pub(crate) endpoints: Option<Spanned<StringList>>,
    pub(crate) prefix: Option<Spanned<String>>,
    pub(crate) timeout: Option<Spanned<DurationValue>>,
    pub(crate) connect_timeout: Option<Spanned<DurationValue>>,
    pub(crate) ca: Option<Spanned<String>>,
    pub(crate) cert: Option<Spanned<String>>,
    pub(crate) key: Option<Spanned<String>>,
    pub(crate) username: Option<Spanned<String>>,
    pub(crate) password_file: Option<Spanned<String>>,
}

/// `[gateway]`: node-wide settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawGateway {
    pub(crate) listen: Spanned<StringList>,
    pub(crate) control_socket: Option<Spanned<String>>,
    pub(crate) log_format: Option<Spanned<String>>,
    pub(crate) key_log: Option<Spanned<String>>,
    pub(crate) ike_port: Option<Spanned<i64>>,
    pub(crate) natt_port: Option<Spanned<i64>>,
    pub(crate) vxlan_port: Option<Spanned<i64>>,
    pub(crate) tun_name: Option<Spanned<String>>,
    pub(crate) batch: Option<Spanned<i64>>,
    pub(crate) workers: Option<Spanned<i64>>,
    pub(crate) cpus: Option<Spanned<Vec<i64>>>,
    pub(crate) pin_workers: Option<Spanned<bool>>,
    pub(crate) busy_poll: Option<Spanned<DurationValue>>,
    pub(crate) busy_poll_budget: Option<Spanned<i64>>,
    pub(crate) xdp: Option<Spanned<String>>,
    pub(crate) retransmit_timeout: Option<Spanned<DurationValue>>,
    pub(crate) retransmit_base: Option<Spanned<f64>>,
    pub(crate) retransmit_tries: Option<Spanned<i64>>,
    pub(crate) cookie_threshold: Option<Spanned<i64>>,
    pub(crate) half_open_timeout: Option<Spanned<DurationValue>>,
    pub(crate) keep_alive: Option<Spanned<DurationValue>>,
    pub(crate) cpu_fairness: Option<Spanned<String>>,
    pub(crate) cpu_fairness_kernel: Option<Spanned<bool>>,
}

/// `[[tenant]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenant {
    pub(crate) name: Spanned<String>,
    pub(crate) cpu_weight: Option<Spanned<i64>>,
}

/// `[[vnet]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawVnet {
    pub(crate) tenant: Spanned<String>,
    pub(crate) name: Spanned<String>,
    pub(crate) vni: Spanned<i64>,
    pub(crate) gateway_ip: Spanned<StringList>,
    pub(crate) vtep: Spanned<String>,
    #[serde(default)]
    pub(crate) routes: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    pub(crate) router_mac: Option<Spanned<String>>,
}

/// One entry of a VNet's `routes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub(crate) prefix: Spanned<String>,
    pub(crate) host: Spanned<String>,
}

/// `[[tunnel]]`: one swanctl connection with its single child, flattened.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTunnel {
    pub(crate) name: Spanned<String>,
    pub(crate) tenant: Spanned<String>,
    pub(crate) vnet: Option<Spanned<String>>,
    pub(crate) inside: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) remote_addrs: Option<Spanned<StringList>>,
    #[serde(default)]
    pub(crate) local_addrs: Option<Spanned<StringList>>,
    pub(crate) local_id: Spanned<String>,
    pub(crate) remote_id: Spanned<String>,
    pub(crate) psk_file: Spanned<String>,
    pub(crate) proposals: Option<Spanned<StringList>>,
    pub(crate) esp_proposals: Option<Spanned<StringList>>,
    pub(crate) local_ts: Spanned<StringList>,
    pub(crate) remote_ts: Spanned<StringList>,
    pub(crate) start_action: Option<Spanned<String>>,
    pub(crate) dpd_action: Option<Spanned<String>>,
    pub(crate) rekey_time: Option<Spanned<DurationValue>>,
    pub(crate) child_rekey_time: Option<Spanned<DurationValue>>,
    pub(crate) life_time: Option<Spanned<DurationValue>>,
    pub(crate) rand_time: Option<Spanned<DurationValue>>,
    pub(crate) over_time: Option<Spanned<DurationValue>>,
    pub(crate) dpd_delay: Option<Spanned<DurationValue>>,
    pub(crate) replay_window: Option<Spanned<i64>>,
    pub(crate) resource_sas: Option<Spanned<i64>>,
    pub(crate) rate_limit: Option<Spanned<i64>>,
}

/// `[[attachment]]`: a customer attached at L2 over Q-in-Q or one VLAN tag (issue 16 §1).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAttachment {
    pub(crate) name: Spanned<String>,
    pub(crate) tenant: Spanned<String>,
    pub(crate) vnet: Spanned<String>,
    pub(crate) interface: Spanned<String>,
    /// The steer node owning `interface` (the distributed form only).
    pub(crate) steer: Option<Spanned<String>>,
    pub(crate) kind: Spanned<String>,
    pub(crate) s_tag: Option<Spanned<i64>>,
    pub(crate) c_tag: Spanned<i64>,
    pub(crate) gateway_ip: Spanned<String>,
    pub(crate) ce_ip: Option<Spanned<String>>,
    pub(crate) routes: Option<Spanned<StringList>>,
}

/// `[[filter]]`: a tenant's eBPF program run on its traffic (issue 18).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFilter {
    pub(crate) tenant: Spanned<String>,
    pub(crate) direction: Spanned<String>,
    pub(crate) object: Spanned<String>,
    pub(crate) section: Option<Spanned<String>>,
    pub(crate) weight: Option<Spanned<i64>>,
}

/// A list of strings written either as a TOML array or as one comma-separated string, the way
/// swanctl.conf writes lists (`remote_addrs = 192.0.2.1, 192.0.2.2`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct StringList(pub(crate) Vec<String>);

impl<'de> Deserialize<'de> for StringList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor;

        impl<'de> Visitor<'de> for ListVisitor {
            type Value = StringList;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string (comma-separated for several values) or an array of strings")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<StringList, E> {
                Ok(StringList(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect(),
                ))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StringList, A::Error> {
                let mut out = Vec::new();
                while let Some(item) = seq.next_element::<String>()? {
                    // An array item may itself be a comma list; swanctl accepts both spellings.
                    out.extend(
                        item.split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned),
                    );
                }
                Ok(StringList(out))
            }
        }

        deserializer.deserialize_any(ListVisitor)
    }
}

/// A time value in swanctl syntax: an integer with an optional unit `s`, `m`, `h` or `d`
/// (`"30s"`, `"5m"`, `"4h"`, `"2d"`, `"90"`), or a bare TOML integer meaning seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DurationValue(pub(crate) Duration);

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;

        impl Visitor<'_> for DurationVisitor {
            type Value = DurationValue;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a time such as \"30s\", \"5m\", \"4h\", \"2d\" or a number of seconds")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<DurationValue, E> {
                parse_duration(v).map(DurationValue).map_err(E::custom)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<DurationValue, E> {
                u64::try_from(v)
                    .map(|s| DurationValue(Duration::from_secs(s)))
                    .map_err(|_| E::custom(format!("a time cannot be negative ({v})")))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<DurationValue, E> {
                Ok(DurationValue(Duration::from_secs(v)))
            }
        }

        deserializer.deserialize_any(DurationVisitor)
    }
}
