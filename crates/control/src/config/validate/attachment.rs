//! Validation of `[[attachment]]` tables (issue 16 §1): a customer's edge router (CE) attached
//! at L2 on one of the gateway's interfaces, told apart by an IEEE 802.1ad S-tag and 802.1Q
//! C-tag (`kind = "qinq"`) or by one 802.1Q tag (`kind = "vlan"`). The VNet must be one of the
//! attachment's tenant; a tag pair is used once per interface.
//!
//! The distributed form (`[cluster]`) names the steer node whose port `interface` is
//! (`steer`, required there and refused without): the control node opens and checks no
//! interface of its own, a tag pair is used once per interface of a steer node, and since
//! `protego ctl migrate NAME` moves a tunnel or an attachment, an attachment's name differs
//! from every tunnel's (in both forms, so that a file moves between them unchanged).

use super::{parse_prefix, CheckedVnet, Validator};
use crate::config::raw::RawAttachment;
use crate::error::ConfigError;
use datapath::{AttachmentConfig, AttachmentPort, AttachmentTags};
use ids::TenantId;
use std::net::IpAddr;
use toml::Spanned;

/// Longest interface name Linux accepts (IFNAMSIZ less the terminating NUL).
const MAX_INTERFACE_NAME: usize = 15;

/// A validated attachment with the line it was defined on (for duplicate messages).
pub(super) struct CheckedAttachment {
    pub(super) config: AttachmentConfig,
    /// The steer node owning the interface (the distributed form).
    pub(super) steer: Option<String>,
    pub(super) line: usize,
}

impl Validator<'_, '_> {
    /// Validates one `[[attachment]]` against the tenants, VNets, the tunnels' names (with
    /// their lines) and the attachments before it; `cluster`: the distributed form.
    pub(super) fn attachment(
        &self,
        a: &Spanned<RawAttachment>,
        tenants: &[(TenantId, usize)],
        vnets: &[CheckedVnet],
        done: &[CheckedAttachment],
        tunnels: &[(&str, usize)],
        cluster: bool,
    ) -> Result<CheckedAttachment, Box<ConfigError>> {
        let a = a.get_ref();
        let name = a.name.get_ref().clone();
        let section = format!("[[attachment]] {name:?}");
        let s = section.as_str();
        self.check_name(&a.name, s)?;
        if let Some(other) = done.iter().find(|o| o.config.name == name) {
            return Err(self.err(
                a.name.span(),
                s,
                "name",
                format!(
                    "attachment {name:?} is already defined on line {}",
                    other.line
                ),
            ));
        }
        if let Some((_, line)) = tunnels.iter().find(|(t, _)| *t == name) {
            return Err(self.err(
                a.name.span(),
                s,
                "name",
                format!(
                    "{name:?} is also the name of the tunnel on line {line} (`protego ctl \
                     migrate NAME` moves either: give the attachment another name)"
                ),
            ));
        }
        let steer = match (&a.steer, cluster) {
            (Some(st), true) => {
                let n = st.get_ref();
                if n.is_empty()
                    || n.len() > 64
                    || !n
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
                {
                    return Err(self.err(
                        st.span(),
                        s,
                        "steer",
                        format!(
                            "{n:?} is not a steer node's name (1 to 64 letters, digits, '-', \
                             '_' or '.')"
                        ),
                    ));
                }
                Some(n.clone())
            }
            (None, true) => {
                return Err(self.err(
                    a.name.span(),
                    s,
                    "steer",
                    "a [cluster] control node needs steer = \"<steer node name>\": the steer \
                     node whose port `interface` is (listed in its [steer] ports)",
                ))
            }
            (Some(st), false) => {
                return Err(self.err(
                    st.span(),
                    s,
                    "steer",
                    "steer is for the distributed form ([cluster]); `protego up` serves the \
                     attachment on its own interface: remove the key",
                ))
            }
            (None, false) => None,
        };
        let tenant = self.tenant_ref(&a.tenant, tenants, s)?;
        let vnet = a.vnet.get_ref();
        if !vnets
            .iter()
            .any(|v| v.config.tenant == tenant && v.config.name == *vnet)
        {
            let message = match vnets.iter().find(|v| v.config.name == *vnet) {
                Some(v) => format!(
                    "vnet {vnet:?} belongs to tenant {:?}, not {:?}",
                    v.config.tenant.as_str(),
                    tenant.as_str()
                ),
                None => format!("unknown vnet {vnet:?} of tenant {:?}", tenant.as_str()),
            };
            return Err(self.err(a.vnet.span(), s, "vnet", message));
        }
        let interface = a.interface.get_ref();
        if interface.is_empty()
            || interface.len() > MAX_INTERFACE_NAME
            || interface
                .chars()
                .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
        {
            return Err(self.err(
                a.interface.span(),
                s,
                "interface",
                format!(
                    "{interface:?} is not a network interface name (1 to {MAX_INTERFACE_NAME} \
                     characters, no '/', ':' or spaces)"
                ),
            ));
        }
        let c_tag = self.vlan_id(&a.c_tag, s, "c_tag")?;
        let tags = match a.kind.get_ref().as_str() {
            "qinq" => {
                let Some(s_tag) = &a.s_tag else {
                    return Err(self.err(
                        a.kind.span(),
                        s,
                        "s_tag",
                        "kind = \"qinq\" needs s_tag (the 802.1ad outer tag)",
                    ));
                };
                AttachmentTags::QinQ {
                    s_tag: self.vlan_id(s_tag, s, "s_tag")?,
                    c_tag,
                }
            }
            "vlan" => {
                if let Some(s_tag) = &a.s_tag {
                    return Err(self.err(
                        s_tag.span(),
                        s,
                        "s_tag",
                        "kind = \"vlan\" has a single 802.1Q tag (c_tag); s_tag is for \"qinq\"",
                    ));
                }
                AttachmentTags::Vlan { c_tag }
            }
            other => {
                return Err(self.err(
                    a.kind.span(),
                    s,
                    "kind",
                    format!("{other:?} is not an attachment kind (\"qinq\" or \"vlan\")"),
                ))
            }
        };
        if let Some(other) = done.iter().find(|o| {
            matches!(&o.config.port, AttachmentPort::Interface(i) if i == interface)
                && o.steer == steer
                && o.config.tags == tags
        }) {
            let at = a.s_tag.as_ref().map_or(a.c_tag.span(), Spanned::span);
            return Err(self.err(
                at,
                s,
                if a.s_tag.is_some() { "s_tag" } else { "c_tag" },
                format!(
                    "{} on {interface}{} is already attachment {:?} (line {})",
                    describe(tags),
                    steer
                        .as_ref()
                        .map_or(String::new(), |st| format!(" of steer node {st:?}")),
                    other.config.name,
                    other.line
                ),
            ));
        }
        let gateway_ip = self.ip(&a.gateway_ip, s, "gateway_ip")?;
        let ce_ip = match &a.ce_ip {
            Some(c) => {
                let ip = self.ip(c, s, "ce_ip")?;
                if ip.is_ipv4() != gateway_ip.is_ipv4() {
                    return Err(self.err(
                        c.span(),
                        s,
                        "ce_ip",
                        format!("{ip} is not of the IP version of gateway_ip {gateway_ip}"),
                    ));
                }
                if ip == gateway_ip {
                    return Err(self.err(c.span(), s, "ce_ip", "ce_ip is gateway_ip"));
                }
                Some(ip)
            }
            None => None,
        };
        let mut routes: Vec<(IpAddr, u8)> = Vec::new();
        if let Some(list) = &a.routes {
            for text in &list.get_ref().0 {
                let net = parse_prefix(text).map_err(|m| self.err(list.span(), s, "routes", m))?;
                let r = (net.addr(), net.prefix_len());
                if routes.contains(&r) {
                    return Err(self.err(
                        list.span(),
                        s,
                        "routes",
                        format!("{}/{} is listed twice", r.0, r.1),
                    ));
                }
                routes.push(r);
            }
        }
        if let Some(ip) = ce_ip {
            let host = (ip, if ip.is_ipv4() { 32 } else { 128 });
            if !routes.contains(&host) {
                routes.push(host);
            }
        }
        if routes.is_empty() {
            return Err(self.err(
                a.name.span(),
                s,
                "routes",
                "an attachment needs routes (the prefixes behind the CE) or ce_ip",
            ));
        }
        // Two CEs of one VNet behind the same addresses would leave the way to them to the
        // order of the attachments: refused.
        for other in done
            .iter()
            .filter(|o| o.config.tenant == tenant && o.config.vnet == *vnet)
        {
            if let Some((mine, theirs)) = overlap(&routes, &other.config.routes) {
                let at = a.routes.as_ref().map_or(a.name.span(), Spanned::span);
                return Err(self.err(
                    at,
                    s,
                    "routes",
                    format!(
                        "{}/{} overlaps {}/{} of attachment {:?} (line {}) in the same vnet",
                        mine.0, mine.1, theirs.0, theirs.1, other.config.name, other.line
                    ),
                ));
            }
        }
        Ok(CheckedAttachment {
            config: AttachmentConfig {
                name,
                tenant,
                vnet: vnet.clone(),
                port: AttachmentPort::Interface(interface.clone()),
                tags,
                gateway_ip,
                ce_ip,
                routes,
                ce_mac: None,
            },
            steer,
            line: self.line(&a.name.span()),
        })
    }

    /// A VLAN id, 1..=4094 (0 only marks priority, 4095 is reserved: IEEE 802.1Q §9.6).
    fn vlan_id(
        &self,
        value: &Spanned<i64>,
        section: &str,
        key: &str,
    ) -> Result<u16, Box<ConfigError>> {
        let v = *value.get_ref();
        u16::try_from(v)
            .ok()
            .filter(|v| (1..=4094).contains(v))
            .ok_or_else(|| {
                self.err(
                    value.span(),
                    section,
                    key,
                    format!("{v} is not a VLAN id (1..=4094)"),
                )
            })
    }
}

/// The first pair of prefixes of `a` and `b` that share addresses.
fn overlap(a: &[(IpAddr, u8)], b: &[(IpAddr, u8)]) -> Option<((IpAddr, u8), (IpAddr, u8))> {
    let net = |&(ip, len): &(IpAddr, u8)| ipnet::IpNet::new(ip, len).ok();
    a.iter().find_map(|x| {
        let nx = net(x)?;
        b.iter().find_map(|y| {
            let ny = net(y)?;
            (nx.contains(&ny.network()) || ny.contains(&nx.network())).then_some((*x, *y))
        })
    })
}

/// The tags as an operator writes them.
fn describe(tags: AttachmentTags) -> String {
    match tags {
        AttachmentTags::QinQ { s_tag, c_tag } => format!("s_tag {s_tag} / c_tag {c_tag}"),
        AttachmentTags::Vlan { c_tag } => format!("VLAN {c_tag}"),
    }
}
