//! Changing the tenants, VNets and tunnels of a running node (`protego ctl apply -f FILE`).
//!
//! The node-wide sections (`[gateway]`, `[store]`, `[cluster]`) are fixed for the life of a
//! process; the *inventory* (`[[tenant]]`, `[[vnet]]`, `[[tunnel]]`) can be replaced while it
//! runs. [`Config::with_inventory`] validates a new inventory whole against the running node's
//! own sections, [`Config::keep_ids`] gives every tunnel that keeps its name the id it had
//! (ids key the stored IKE SAs, the data path's SAs and the steering tables), and [`plan`] says
//! what an apply changes.

use super::raw::{RawFile, RawInventory};
use super::{validate, Config, Source, Tunnel};
use crate::error::{ConfigError, Error};
use ike::TunnelId;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use zeroize::Zeroizing;

/// PSKs by tunnel name, as the store keeps them with an applied configuration (secret: its
/// `Debug` prints the names only).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoredPsks(BTreeMap<String, Zeroizing<Vec<u8>>>);

impl StoredPsks {
    /// None yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The PSK of the tunnel called `name`.
    pub fn get(&self, name: &str) -> Option<&Zeroizing<Vec<u8>>> {
        self.0.get(name)
    }

    /// Sets the PSK of the tunnel called `name`.
    pub fn insert(&mut self, name: String, psk: Zeroizing<Vec<u8>>) {
        self.0.insert(name, psk);
    }

    /// Every (tunnel name, PSK), by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Zeroizing<Vec<u8>>)> {
        self.0.iter()
    }
}

impl FromIterator<(String, Zeroizing<Vec<u8>>)> for StoredPsks {
    fn from_iter<I: IntoIterator<Item = (String, Zeroizing<Vec<u8>>)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl std::fmt::Debug for StoredPsks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Config {
    /// This node's configuration with the tenants, VNets and tunnels of `text` (read from
    /// `path`) instead of its own, validated whole as if they were written in this node's file:
    /// the same rules, the same `[gateway]` (listen addresses, ports). `[gateway]`, `[store]`
    /// and `[cluster]` tables in `text` are ignored (they change only with a restart); so `text`
    /// may be a whole configuration file or only its tenants, VNets and tunnels.
    ///
    /// PSK files named with relative paths are looked up relative to `path`'s directory; with
    /// `psks` the PSKs are taken from there by tunnel name instead (a configuration restored
    /// from the store). Tunnel ids are assigned in file order; see [`Config::keep_ids`].
    pub fn with_inventory(
        &self,
        text: &str,
        path: &Path,
        psks: Option<&StoredPsks>,
    ) -> Result<Config, Error> {
        let source = Source::new(path, text);
        let inventory: RawInventory =
            toml::from_str(text).map_err(|e| Error::Config(source.toml_error(&e)))?;
        let node_source = Source::new(&self.path, &self.text);
        let node: RawFile =
            toml::from_str(&self.text).map_err(|e| Error::Config(node_source.toml_error(&e)))?;
        let mut gateway = node.gateway;
        // Node-wide warnings were given when the node started.
        gateway.get_mut().key_log = None;
        let raw = RawFile {
            gateway,
            tenant: inventory.tenant,
            vnet: inventory.vnet,
            tunnel: inventory.tunnel,
            attachment: Vec::new(),
            filter: Vec::new(),
            store: None,
            cluster: None,
            metrics: None,
            api: None,
        };
        let checked = validate::validate_with(&source, raw, psks).map_err(Error::Config)?;
        let mut out = self.clone();
        out.tenants = checked.tenants;
        out.tunnels = checked.tunnels;
        out.dataplane.vnets = checked.dataplane.vnets;
        out.dataplane.tunnels = checked.dataplane.tunnels;
        if out.dataplane.tun_name.is_none() && checked.dataplane.tun_name.is_some() {
            return Err(Error::Config(Box::new(ConfigError {
                file: path.to_owned(),
                line: out
                    .tunnels
                    .iter()
                    .find(|t| t.inside == super::TunnelInside::Tun)
                    .map_or(0, |t| t.line),
                column: 1,
                key: Some("inside".into()),
                section: None,
                message: "the running node opened no TUN device (no tunnel had inside = \"tun\" \
                          when it started): put the TUN tunnel in the configuration file and \
                          restart with --discard-applied"
                    .into(),
                source_line: None,
                span_len: 0,
            })));
        }
        // Attachments are node-wide (their interfaces are opened at start): each must keep
        // its VNet.
        if let Some(a) = out.dataplane.attachments.iter().find(|a| {
            !out.dataplane
                .vnets
                .iter()
                .any(|v| v.tenant == a.tenant && v.name == a.vnet)
        }) {
            return Err(Error::Config(Box::new(ConfigError {
                file: path.to_owned(),
                line: 0,
                column: 1,
                key: Some("vnet".into()),
                section: Some(format!("[[attachment]] {:?}", a.name)),
                message: format!(
                    "attachment {:?} of the running node needs vnet {:?} of tenant {:?}, which \
                     this configuration removes (attachments change only with a restart)",
                    a.name,
                    a.vnet,
                    a.tenant.as_str()
                ),
                source_line: None,
                span_len: 0,
            })));
        }
        // Filters are the node's too (they change only with a restart): each must keep its
        // tenant.
        if let Some(f) = out
            .filters
            .iter()
            .find(|f| !out.tenants.contains(&f.tenant))
        {
            return Err(Error::Config(Box::new(ConfigError {
                file: path.to_owned(),
                line: 0,
                column: 1,
                key: Some("tenant".into()),
                section: Some("[[filter]]".into()),
                message: format!(
                    "tenant {:?} runs the filter {} of {} ({}), and this configuration removes \
                     the tenant (unload it first with `protego ctl filter unload`)",
                    f.tenant.as_str(),
                    f.section,
                    f.object_name,
                    f.direction
                ),
                source_line: None,
                span_len: 0,
            })));
        }
        out.warnings = checked.warnings;
        Ok(out)
    }

    /// Gives every tunnel the id `ids` holds for its name, and the others fresh ids from
    /// `next_id` on (which advances). Ids are never reused while a node runs, so that the SAs
    /// of a removed tunnel cannot be taken for those of a new one.
    pub fn keep_ids(&mut self, ids: &BTreeMap<String, TunnelId>, next_id: &mut u32) {
        let mut renamed: HashMap<TunnelId, TunnelId> = HashMap::new();
        for t in &mut self.tunnels {
            let id = match ids.get(&t.peer.name) {
                Some(id) => *id,
                None => {
                    let id = TunnelId(*next_id);
                    *next_id = next_id.saturating_add(1);
                    id
                }
            };
            renamed.insert(t.peer.id, id);
            t.peer.id = id;
        }
        for b in &mut self.dataplane.tunnels {
            if let Some(id) = renamed.get(&b.tunnel) {
                b.tunnel = *id;
            }
        }
    }

    /// Every tunnel's id by name.
    pub fn tunnel_ids(&self) -> BTreeMap<String, TunnelId> {
        self.tunnels
            .iter()
            .map(|t| (t.peer.name.clone(), t.peer.id))
            .collect()
    }

    /// The first id no tunnel of this configuration uses (at least 1).
    pub fn next_free_id(&self) -> u32 {
        self.tunnels
            .iter()
            .map(|t| t.peer.id.0.saturating_add(1))
            .max()
            .unwrap_or(1)
            .max(1)
    }
}

/// What applying a configuration changes, by name (VNets as `tenant/vnet`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConfigPlan {
    /// Tenants that are new.
    pub tenants_added: Vec<ids::TenantId>,
    /// Tenants that are gone.
    pub tenants_removed: Vec<ids::TenantId>,
    /// VNets that are new.
    pub vnets_added: Vec<String>,
    /// VNets whose VNI, gateway addresses, VTEP or routes change (their tunnels' SAs follow
    /// at once, without a rekey).
    pub vnets_changed: Vec<String>,
    /// VNets that are gone.
    pub vnets_removed: Vec<String>,
    /// Tunnels that are new (initiated now if `start_action = "start"`).
    pub tunnels_added: Vec<String>,
    /// Tunnels that are gone (their SAs are deleted, the peer is told).
    pub tunnels_removed: Vec<String>,
    /// Tunnels whose addresses, identities, PSK, proposals, traffic selectors, tenant or
    /// inside change: their SAs are deleted (the peer is told) and negotiated again.
    pub tunnels_replaced: Vec<String>,
    /// Tunnels whose other settings change (lifetimes, DPD, actions, replay window, rate
    /// limit): updated in place; established SAs keep running (lifetimes apply from the next
    /// rekey).
    pub tunnels_updated: Vec<String>,
    /// Tunnels that stay as they are.
    pub tunnels_unchanged: usize,
}

impl ConfigPlan {
    /// True if applying changes nothing.
    pub fn is_empty(&self) -> bool {
        self.tenants_added.is_empty()
            && self.tenants_removed.is_empty()
            && self.vnets_added.is_empty()
            && self.vnets_changed.is_empty()
            && self.vnets_removed.is_empty()
            && self.tunnels_added.is_empty()
            && self.tunnels_removed.is_empty()
            && self.tunnels_replaced.is_empty()
            && self.tunnels_updated.is_empty()
    }
}

/// How a tunnel differs between two configurations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelChange {
    /// Nothing that matters changed.
    Same,
    /// Settings that apply in place.
    Update,
    /// Settings its SAs were negotiated with: they must go.
    Replace,
}

/// How `new` differs from `old`, the same tunnel (by name) in two configurations.
pub fn tunnel_change(old: &Tunnel, new: &Tunnel) -> TunnelChange {
    let (a, b) = (&old.peer, &new.peer);
    let negotiated = a.local_addrs == b.local_addrs
        && a.remote_addrs == b.remote_addrs
        && a.local_id == b.local_id
        && a.remote_id == b.remote_id
        && *a.psk == *b.psk
        && a.ike_proposals == b.ike_proposals
        && a.esp_proposals == b.esp_proposals
        && a.local_ts == b.local_ts
        && a.remote_ts == b.remote_ts
        && old.tenant == new.tenant
        && old.inside == new.inside;
    if !negotiated {
        return TunnelChange::Replace;
    }
    let same = a.ike_rekey_time == b.ike_rekey_time
        && a.ike_over_time == b.ike_over_time
        && a.child_rekey_time == b.child_rekey_time
        && a.child_life_time == b.child_life_time
        && a.rand_time == b.rand_time
        && a.dpd_delay == b.dpd_delay
        && a.dpd_action == b.dpd_action
        && a.start_action == b.start_action
        && a.replay_window == b.replay_window
        && a.resource_sas == b.resource_sas
        && old.rate_limit_mbit == new.rate_limit_mbit;
    if same {
        TunnelChange::Same
    } else {
        TunnelChange::Update
    }
}

/// What applying `new` over `old` changes. Tunnels are matched by name, so `new` should carry
/// `old`'s ids ([`Config::keep_ids`]).
pub fn plan(old: &Config, new: &Config) -> ConfigPlan {
    let mut p = ConfigPlan {
        tenants_added: new
            .tenants
            .iter()
            .filter(|t| !old.tenants.contains(t))
            .cloned()
            .collect(),
        tenants_removed: old
            .tenants
            .iter()
            .filter(|t| !new.tenants.contains(t))
            .cloned()
            .collect(),
        ..ConfigPlan::default()
    };
    let key = |v: &datapath::VnetConfig| format!("{}/{}", v.tenant, v.name);
    for v in &new.dataplane.vnets {
        match old
            .dataplane
            .vnets
            .iter()
            .find(|o| o.tenant == v.tenant && o.name == v.name)
        {
            None => p.vnets_added.push(key(v)),
            Some(o) if o != v => p.vnets_changed.push(key(v)),
            Some(_) => {}
        }
    }
    p.vnets_removed = old
        .dataplane
        .vnets
        .iter()
        .filter(|o| {
            !new.dataplane
                .vnets
                .iter()
                .any(|v| o.tenant == v.tenant && o.name == v.name)
        })
        .map(key)
        .collect();
    for t in &new.tunnels {
        let name = &t.peer.name;
        match old.tunnels.iter().find(|o| &o.peer.name == name) {
            None => p.tunnels_added.push(name.clone()),
            Some(o) => match tunnel_change(o, t) {
                TunnelChange::Same => p.tunnels_unchanged += 1,
                TunnelChange::Update => p.tunnels_updated.push(name.clone()),
                TunnelChange::Replace => p.tunnels_replaced.push(name.clone()),
            },
        }
    }
    p.tunnels_removed = old
        .tunnels
        .iter()
        .filter(|o| !new.tunnels.iter().any(|t| t.peer.name == o.peer.name))
        .map(|o| o.peer.name.clone())
        .collect();
    p
}
