//! Validation of `[[tunnel]]` tables: references, addresses, identities (RFC 7296 §3.5), PSK
//! files, proposals (RFC 7296 §3.3), traffic selectors (RFC 7296 §3.13.1, per tenant
//! decorrelated as RFC 4301 §4.4.1 asks of an SPD) and lifetimes.

use super::{
    CheckedTunnel, CheckedVnet, Validator, DEFAULT_CHILD_REKEY, DEFAULT_ESP_PROPOSALS,
    DEFAULT_IKE_PROPOSALS, DEFAULT_IKE_REKEY, DEFAULT_REPLAY_WINDOW, MAX_RESOURCE_SAS,
};
use crate::config::raw::{DurationValue, RawTunnel, StringList};
use crate::config::{format_duration, Gateway, Tunnel, TunnelInside};
use crate::error::ConfigError;
use ids::TenantId;
use ike::{
    DpdAction, EspProposal, Identity, IkeProposal, PeerConfig, StartAction, TrafficSelector,
    TunnelId,
};
use std::net::IpAddr;
use std::time::Duration;
use toml::Spanned;
use zeroize::Zeroizing;

/// Largest per-tunnel rate limit (`rate_limit`, Mbit/s): 1 Tbit/s.
const MAX_RATE_LIMIT_MBIT: u32 = 1_000_000;

/// The tunnels checked so far, in file order, indexed for the checks of the next one
/// against them (a name defined twice, selectors overlapping within a tenant, an identity
/// accepted twice), so that a file of 10 000 tunnels is not checked pair by pair.
#[derive(Default)]
pub(super) struct Done {
    pub(super) tunnels: Vec<CheckedTunnel>,
    by_name: std::collections::HashMap<String, usize>,
    by_tenant: std::collections::HashMap<TenantId, Vec<usize>>,
    by_remote_id: std::collections::HashMap<Identity, Vec<usize>>,
}

impl Done {
    /// Adds the next checked tunnel.
    pub(super) fn push(&mut self, t: CheckedTunnel) {
        let i = self.tunnels.len();
        let peer = &t.tunnel.peer;
        self.by_name.entry(peer.name.clone()).or_insert(i);
        self.by_tenant
            .entry(t.tunnel.tenant.clone())
            .or_default()
            .push(i);
        self.by_remote_id
            .entry(peer.remote_id.clone())
            .or_default()
            .push(i);
        self.tunnels.push(t);
    }

    /// The tunnel named `name`, if one is.
    fn named(&self, name: &str) -> Option<&CheckedTunnel> {
        self.by_name.get(name).map(|&i| &self.tunnels[i])
    }

    /// `tenant`'s tunnels, in file order.
    fn of_tenant(&self, tenant: &TenantId) -> impl Iterator<Item = &CheckedTunnel> {
        self.indexed(self.by_tenant.get(tenant))
    }

    /// The tunnels that accept `remote_id`, in file order.
    fn accepting(&self, remote_id: &Identity) -> impl Iterator<Item = &CheckedTunnel> {
        self.indexed(self.by_remote_id.get(remote_id))
    }

    fn indexed<'a>(
        &'a self,
        list: Option<&'a Vec<usize>>,
    ) -> impl Iterator<Item = &'a CheckedTunnel> {
        list.into_iter().flatten().map(|&i| &self.tunnels[i])
    }
}

impl Validator<'_, '_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tunnel(
        &mut self,
        index: usize,
        t: &Spanned<RawTunnel>,
        gateway: &Gateway,
        tenants: &[(TenantId, usize)],
        vnets: &[CheckedVnet],
        done: &Done,
    ) -> Result<CheckedTunnel, Box<ConfigError>> {
        let header_line = self.line(&t.span());
        let t = t.get_ref();
        let name = t.name.get_ref().clone();
        let section = format!("[[tunnel]] {name:?}");
        let s = section.as_str();
        self.check_name(&t.name, s)?;
        if let Some(other) = done.named(&name) {
            return Err(self.err(
                t.name.span(),
                s,
                "name",
                format!(
                    "tunnel {name:?} is already defined on line {}",
                    other.tunnel.line
                ),
            ));
        }
        let tenant = self.tenant_ref(&t.tenant, tenants, s)?;
        let inside = self.inside(t, &tenant, vnets, s)?;

        let remote_addrs = self.addresses(t.remote_addrs.as_ref(), s, "remote_addrs", true)?;
        let local_addrs = self.addresses(t.local_addrs.as_ref(), s, "local_addrs", false)?;
        if let Some(la) = &t.local_addrs {
            if let Some(a) = local_addrs.iter().find(|a| !gateway.listen.contains(a)) {
                return Err(self.err(
                    la.span(),
                    s,
                    "local_addrs",
                    format!("{a} is not one of the [gateway] listen addresses"),
                ));
            }
        }
        if let (Some(ra), false) = (&t.remote_addrs, remote_addrs.is_empty()) {
            let usable: &[IpAddr] = if local_addrs.is_empty() {
                &gateway.listen
            } else {
                &local_addrs
            };
            if let Some(a) = remote_addrs
                .iter()
                .find(|a| !usable.iter().any(|l| l.is_ipv4() == a.is_ipv4()))
            {
                return Err(self.err(
                    ra.span(),
                    s,
                    "remote_addrs",
                    format!("{a}: no local address of the same IP version to reach it from"),
                ));
            }
        }

        // swanctl's default local_addrs is "any local address": here, every listen address. The
        // engine then initiates from a concrete address, so its NAT detection hashes (RFC 7296
        // §2.23) describe the address the peer really sees.
        let local_addrs = if local_addrs.is_empty() {
            gateway.listen.clone()
        } else {
            local_addrs
        };

        let local_id = self.identity(&t.local_id, s, "local_id")?;
        let remote_id = self.identity(&t.remote_id, s, "remote_id")?;
        let psk = match self.psks {
            None => self.psk(&t.psk_file, s)?,
            Some(stored) => stored.get(&name).cloned().ok_or_else(|| {
                self.err(
                    t.psk_file.span(),
                    s,
                    "psk_file",
                    "the stored configuration holds no PSK for this tunnel",
                )
            })?,
        };

        let (proposals, ike_proposals) = self.proposals(
            t.proposals.as_ref(),
            s,
            "proposals",
            DEFAULT_IKE_PROPOSALS,
            IkeProposal::parse,
        )?;
        let (esp_texts, esp_proposals) = self.proposals(
            t.esp_proposals.as_ref(),
            s,
            "esp_proposals",
            DEFAULT_ESP_PROPOSALS,
            EspProposal::parse,
        )?;

        let local_ts = self.selectors(&t.local_ts, s, "local_ts")?;
        let remote_ts = self.selectors(&t.remote_ts, s, "remote_ts")?;

        let start_action = match &t.start_action {
            None => StartAction::None,
            Some(a) => match a.get_ref().as_str() {
                "none" => StartAction::None,
                "start" => StartAction::Start,
                "trap" => {
                    return Err(self.err(
                        a.span(),
                        s,
                        "start_action",
                        "\"trap\" is not supported (Protego installs no kernel policies); use \"start\" or \"none\"",
                    ));
                }
                other => {
                    return Err(self.err(
                        a.span(),
                        s,
                        "start_action",
                        format!("unknown start_action {other:?} (use \"none\" or \"start\")"),
                    ));
                }
            },
        };
        let dpd_action = match &t.dpd_action {
            None => DpdAction::Clear,
            Some(a) => match a.get_ref().as_str() {
                "clear" | "none" => DpdAction::Clear,
                "restart" => DpdAction::Restart,
                "trap" => {
                    return Err(self.err(
                        a.span(),
                        s,
                        "dpd_action",
                        "\"trap\" is not supported (Protego installs no kernel policies); use \"restart\" or \"clear\"",
                    ));
                }
                other => {
                    return Err(self.err(
                        a.span(),
                        s,
                        "dpd_action",
                        format!("unknown dpd_action {other:?} (use \"clear\" or \"restart\")"),
                    ));
                }
            },
        };
        if remote_addrs.is_empty() {
            if let Some(a) = t
                .start_action
                .as_ref()
                .filter(|_| start_action == StartAction::Start)
            {
                return Err(self.err(
                    a.span(),
                    s,
                    "start_action",
                    "\"start\" needs remote_addrs: there is no address to initiate to",
                ));
            }
            if let Some(a) = t
                .dpd_action
                .as_ref()
                .filter(|_| dpd_action == DpdAction::Restart)
            {
                return Err(self.err(
                    a.span(),
                    s,
                    "dpd_action",
                    "\"restart\" needs remote_addrs: there is no address to initiate to",
                ));
            }
        }

        let Lifetimes {
            ike_rekey_time,
            ike_over_time,
            child_rekey_time,
            child_life_time,
            rand_time,
        } = self.lifetimes(t, s)?;
        let dpd_delay = t
            .dpd_delay
            .as_ref()
            .map(|d| d.get_ref().0)
            .filter(|d| !d.is_zero());
        let replay_window = match &t.replay_window {
            None => DEFAULT_REPLAY_WINDOW,
            Some(w) => u32::try_from(*w.get_ref())
                .ok()
                .filter(|w| (esp::MIN_REPLAY_WINDOW..=esp::MAX_REPLAY_WINDOW).contains(w))
                .ok_or_else(|| {
                    self.err(
                        w.span(),
                        s,
                        "replay_window",
                        format!(
                            "must be between {} and {} packets (anti-replay protection cannot be disabled)",
                            esp::MIN_REPLAY_WINDOW,
                            esp::MAX_REPLAY_WINDOW
                        ),
                    )
                })?,
        };
        let resource_sas = match &t.resource_sas {
            None => ike::DEFAULT_RESOURCE_SAS,
            Some(n) => u32::try_from(*n.get_ref())
                .ok()
                .filter(|n| *n <= MAX_RESOURCE_SAS)
                .ok_or_else(|| {
                    self.err(
                        n.span(),
                        s,
                        "resource_sas",
                        format!("must be between 0 (RFC 9611 off) and {MAX_RESOURCE_SAS}"),
                    )
                })?,
        };

        let rate_limit_mbit = match &t.rate_limit {
            None => None,
            Some(r) => Some(
                u32::try_from(*r.get_ref())
                    .ok()
                    .filter(|r| (1..=MAX_RATE_LIMIT_MBIT).contains(r))
                    .ok_or_else(|| {
                        self.err(
                            r.span(),
                            s,
                            "rate_limit",
                            format!(
                                "must be between 1 and {MAX_RATE_LIMIT_MBIT} Mbit/s (leave it out for no limit)"
                            ),
                        )
                    })?,
            ),
        };

        // Two tunnels of one tenant whose remote selectors overlap make the outbound route of a
        // packet ambiguous (RFC 4301 §4.4.1 requires a decorrelated SPD, we require it per tenant).
        for other in done.of_tenant(&tenant) {
            for mine in &remote_ts {
                if let Some(theirs) = other
                    .tunnel
                    .peer
                    .remote_ts
                    .iter()
                    .find(|o| o.intersect(mine).is_some())
                {
                    return Err(self.err(
                        t.remote_ts.span(),
                        s,
                        "remote_ts",
                        format!(
                            "{} overlaps {} of tunnel {:?} (line {}) in the same tenant {tenant:?}: \
                             traffic to the overlap could not be routed to one tunnel",
                            crate::status::format_ts(mine),
                            crate::status::format_ts(theirs),
                            other.tunnel.peer.name,
                            other.remote_ts_line,
                        ),
                    ));
                }
            }
        }
        // A responder picks the tunnel of an incoming IKE SA by the peer's address and identity:
        // two tunnels that accept the same identity from the same address cannot be told apart.
        for other in done.accepting(&remote_id) {
            let same_id = other.tunnel.peer.remote_id == remote_id;
            let addrs_overlap = other.tunnel.peer.remote_addrs.is_empty()
                || remote_addrs.is_empty()
                || other
                    .tunnel
                    .peer
                    .remote_addrs
                    .iter()
                    .any(|a| remote_addrs.contains(a));
            if same_id && addrs_overlap {
                return Err(self.err(
                    t.remote_id.span(),
                    s,
                    "remote_id",
                    format!(
                        "tunnel {:?} (line {}) already accepts remote_id {:?} from the same remote_addrs; \
                         an incoming IKE SA could not be matched to one tunnel",
                        other.tunnel.peer.name,
                        other.tunnel.line,
                        t.remote_id.get_ref(),
                    ),
                ));
            }
        }

        let id = TunnelId(
            u32::try_from(index + 1)
                .map_err(|_| self.err(t.name.span(), s, "name", "too many tunnels"))?,
        );
        let peer = PeerConfig {
            id,
            name,
            local_addrs,
            remote_addrs,
            local_id,
            remote_id,
            psk,
            ike_proposals,
            esp_proposals,
            local_ts,
            remote_ts,
            ike_rekey_time,
            ike_over_time,
            child_rekey_time,
            child_life_time,
            rand_time,
            dpd_delay,
            dpd_action,
            start_action,
            replay_window,
            resource_sas,
        };
        Ok(CheckedTunnel {
            tunnel: Tunnel {
                peer,
                tenant,
                inside,
                proposals,
                esp_proposals: esp_texts,
                line: header_line,
                rate_limit_mbit,
            },
            remote_ts_line: self.line(&t.remote_ts.span()),
        })
    }

    fn inside(
        &self,
        t: &RawTunnel,
        tenant: &TenantId,
        vnets: &[CheckedVnet],
        s: &str,
    ) -> Result<TunnelInside, Box<ConfigError>> {
        match (&t.vnet, &t.inside) {
            (Some(_), Some(i)) if i.get_ref() == "tun" => Err(self.err(
                i.span(),
                s,
                "inside",
                "give either vnet = \"NAME\" or inside = \"tun\", not both",
            )),
            (None, None) => Err(self.err(
                t.name.span(),
                s,
                "vnet",
                "missing: say where decrypted traffic goes, vnet = \"NAME\" or inside = \"tun\"",
            )),
            (_, Some(i)) if i.get_ref() != "tun" && i.get_ref() != "vnet" => Err(self.err(
                i.span(),
                s,
                "inside",
                format!(
                    "unknown inside {:?} (use \"tun\", or name a vnet with vnet = \"NAME\")",
                    i.get_ref()
                ),
            )),
            (None, Some(i)) if i.get_ref() == "vnet" => Err(self.err(
                i.span(),
                s,
                "vnet",
                "inside = \"vnet\" needs vnet = \"NAME\"",
            )),
            (None, Some(_)) => Ok(TunnelInside::Tun),
            (Some(v), _) => {
                let name = v.get_ref();
                if vnets
                    .iter()
                    .any(|n| n.config.tenant == *tenant && n.config.name == *name)
                {
                    return Ok(TunnelInside::Vnet(name.clone()));
                }
                let others: Vec<&str> = vnets
                    .iter()
                    .filter(|n| n.config.name == *name)
                    .map(|n| n.config.tenant.as_str())
                    .collect();
                let message = if others.is_empty() {
                    format!("unknown vnet {name:?}")
                } else {
                    format!(
                        "vnet {name:?} belongs to tenant {:?}, not to this tunnel's tenant {tenant:?}",
                        others.join(", ")
                    )
                };
                Err(self.err(v.span(), s, "vnet", message))
            }
        }
    }

    /// A list of IP addresses; `%any` (only where `allow_any`) stands for any address.
    fn addresses(
        &self,
        list: Option<&Spanned<StringList>>,
        s: &str,
        key: &str,
        allow_any: bool,
    ) -> Result<Vec<IpAddr>, Box<ConfigError>> {
        let Some(list) = list else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for text in &list.get_ref().0 {
            if allow_any && matches!(text.as_str(), "%any" | "%any4" | "%any6" | "0.0.0.0" | "::") {
                return if list.get_ref().0.len() == 1 {
                    Ok(Vec::new())
                } else {
                    Err(self.err(
                        list.span(),
                        s,
                        key,
                        "%any cannot be combined with other addresses",
                    ))
                };
            }
            let addr: IpAddr = text.parse().map_err(|_| {
                self.err(
                    list.span(),
                    s,
                    key,
                    format!(
                        "{text:?} is not an IP address (host names and ranges are not supported)"
                    ),
                )
            })?;
            if out.contains(&addr) {
                return Err(self.err(list.span(), s, key, format!("{addr} is listed twice")));
            }
            out.push(addr);
        }
        Ok(out)
    }

    fn identity(
        &self,
        value: &Spanned<String>,
        s: &str,
        key: &str,
    ) -> Result<Identity, Box<ConfigError>> {
        let text = value.get_ref().trim();
        if text.is_empty() || text == "%any" {
            return Err(self.err(
                value.span(),
                s,
                key,
                "an explicit identity is required for PSK authentication",
            ));
        }
        Identity::parse(text).map_err(|e| self.err(value.span(), s, key, e.to_string()))
    }

    /// Reads the PSK file: trailing newlines are removed; a `0x` prefix means hex, as in
    /// swanctl's `secrets` section.
    fn psk(
        &mut self,
        file: &Spanned<String>,
        s: &str,
    ) -> Result<Zeroizing<Vec<u8>>, Box<ConfigError>> {
        let path = self.relative_path(file.get_ref());
        let raw = Zeroizing::new(std::fs::read(&path).map_err(|e| {
            self.err(
                file.span(),
                s,
                "psk_file",
                format!("cannot read PSK file {}: {e}", path.display()),
            )
        })?);
        let mut end = raw.len();
        while end > 0 && matches!(raw[end - 1], b'\n' | b'\r') {
            end -= 1;
        }
        let content = &raw[..end];
        if content.is_empty() {
            return Err(self.err(
                file.span(),
                s,
                "psk_file",
                format!("PSK file {} is empty", path.display()),
            ));
        }
        let psk = if let Some(hex_text) = content.strip_prefix(b"0x") {
            Zeroizing::new(hex::decode(hex_text).map_err(|_| {
                self.err(
                    file.span(),
                    s,
                    "psk_file",
                    format!(
                        "PSK file {} starts with 0x but is not valid hex",
                        path.display()
                    ),
                )
            })?)
        } else {
            Zeroizing::new(content.to_vec())
        };
        if psk.is_empty() {
            return Err(self.err(
                file.span(),
                s,
                "psk_file",
                format!("PSK file {} is empty", path.display()),
            ));
        }
        if let Ok(meta) = std::fs::metadata(&path) {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o004 != 0 {
                self.warnings.push(format!(
                    "PSK file {} is world-readable (mode {mode:03o}); restrict it with chmod 600",
                    path.display()
                ));
            }
        }
        Ok(psk)
    }

    /// Parses a proposal list, expanding the `default` keyword; returns the texts and values.
    fn proposals<T>(
        &self,
        list: Option<&Spanned<StringList>>,
        s: &str,
        key: &str,
        defaults: &[&str],
        parse: impl Fn(&str) -> Result<T, ike::Error>,
    ) -> Result<(Vec<String>, Vec<T>), Box<ConfigError>> {
        let span = list.map_or(0..0, Spanned::span);
        let texts: Vec<String> = match list {
            None => defaults.iter().map(|d| (*d).to_owned()).collect(),
            Some(l) => {
                let mut out = Vec::new();
                for p in &l.get_ref().0 {
                    if p == "default" {
                        out.extend(defaults.iter().map(|d| (*d).to_owned()));
                    } else {
                        out.push(p.to_lowercase());
                    }
                }
                out
            }
        };
        if texts.is_empty() {
            return Err(self.err(
                span,
                s,
                key,
                "at least one proposal is required (or \"default\")",
            ));
        }
        let mut values = Vec::with_capacity(texts.len());
        for text in &texts {
            values.push(parse(text).map_err(|e| self.err(span.clone(), s, key, e.to_string()))?);
        }
        Ok((texts, values))
    }

    fn selectors(
        &self,
        list: &Spanned<StringList>,
        s: &str,
        key: &str,
    ) -> Result<Vec<TrafficSelector>, Box<ConfigError>> {
        let mut out = Vec::new();
        for text in &list.get_ref().0 {
            if text == "dynamic" {
                return Err(self.err(
                    list.span(),
                    s,
                    key,
                    "\"dynamic\" is not supported for site-to-site tunnels; list the subnets",
                ));
            }
            out.push(
                TrafficSelector::parse(text)
                    .map_err(|e| self.err(list.span(), s, key, e.to_string()))?,
            );
        }
        if out.is_empty() {
            return Err(self.err(
                list.span(),
                s,
                key,
                "at least one traffic selector is required",
            ));
        }
        Ok(out)
    }

    /// IKE rekey time and hard lifetime margin, CHILD_SA rekey time, CHILD_SA life time and
    /// jitter, with swanctl's defaults: 4h, 10 % of the IKE rekey time, 1h, 110 % of the CHILD
    /// rekey time, and the difference of the last two.
    fn lifetimes(&self, t: &RawTunnel, s: &str) -> Result<Lifetimes, Box<ConfigError>> {
        let get = |v: &Option<Spanned<DurationValue>>| v.as_ref().map(|d| d.get_ref().0);
        let ike_rekey = get(&t.rekey_time).unwrap_or(DEFAULT_IKE_REKEY);
        let ike_over = get(&t.over_time).unwrap_or(ike_rekey / 10);
        let child_rekey = get(&t.child_rekey_time).unwrap_or(DEFAULT_CHILD_REKEY);
        let life = get(&t.life_time).unwrap_or(child_rekey + child_rekey / 10);
        if !child_rekey.is_zero() && !life.is_zero() && child_rekey >= life {
            let (span, key) = match (&t.life_time, &t.child_rekey_time) {
                (Some(l), _) => (l.span(), "life_time"),
                (None, Some(r)) => (r.span(), "child_rekey_time"),
                (None, None) => (t.name.span(), "life_time"),
            };
            return Err(self.err(
                span,
                s,
                key,
                format!(
                    "the CHILD_SA life_time ({}) must be longer than its child_rekey_time ({}), \
                     or the SA expires before it is rekeyed",
                    format_duration(life),
                    format_duration(child_rekey)
                ),
            ));
        }
        let rand = match &t.rand_time {
            Some(r) => {
                let rand = r.get_ref().0;
                let shortest = [ike_rekey, child_rekey]
                    .into_iter()
                    .filter(|d| !d.is_zero())
                    .min();
                if let Some(shortest) = shortest.filter(|m| rand >= *m) {
                    return Err(self.err(
                        r.span(),
                        s,
                        "rand_time",
                        format!(
                            "rand_time ({}) must be shorter than the rekey times it jitters ({})",
                            format_duration(rand),
                            format_duration(shortest)
                        ),
                    ));
                }
                rand
            }
            None => life.saturating_sub(child_rekey).min(child_rekey / 2),
        };
        Ok(Lifetimes {
            ike_rekey_time: ike_rekey,
            ike_over_time: ike_over,
            child_rekey_time: child_rekey,
            child_life_time: life,
            rand_time: rand,
        })
    }
}

/// The validated lifetimes of a tunnel (the `PeerConfig` fields of the same names).
struct Lifetimes {
    ike_rekey_time: Duration,
    ike_over_time: Duration,
    child_rekey_time: Duration,
    child_life_time: Duration,
    rand_time: Duration,
}
