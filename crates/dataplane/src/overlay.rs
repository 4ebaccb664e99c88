//! The inside configuration the packet path reads: the VNets (each with its neighbour cache),
//! the indexes that find the VNet of a received VXLAN datagram, and the tunnel bindings. It
//! is part of the published SA table snapshot ([`crate::tables::Tables::overlay`]), so
//! [`DataPath::set_inside`](crate::DataPath::set_inside) replaces it at run time while the
//! workers run: a batch sees either the old or the new configuration, never a mix. A VNet
//! whose configuration (and place in the list) did not change keeps its neighbour cache.
//!
//! The VTEP socket sets are opened at start (one per distinct VTEP address of the starting
//! VNets, plus in relay mode the node's VTEP address, `RelayConfig::vtep`); a VNet given
//! later must use one of them.

use crate::vnet::Vnet;
use datapath::{DataplaneError, Inside, TunnelBinding, VnetConfig};
use ike::TunnelId;
use overlay::VnetId;
use rustc_hash::FxHashMap;
use std::net::IpAddr;
use std::sync::Arc;
use wire::vxlan::Vni;

/// What the inside configuration is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules<'a> {
    /// Addresses of the VTEP socket sets, by VTEP index.
    pub(crate) vteps: &'a [IpAddr],
    /// The VXLAN port (hosts are addressed on it).
    pub(crate) vxlan_port: u16,
    /// A TUN device is configured.
    pub(crate) tun: bool,
    /// Relay mode: VXLAN arrives through steer nodes, told apart by VNI alone.
    pub(crate) relay: bool,
}

/// VNets and tunnel bindings as the packet path sees them.
#[derive(Default)]
pub(crate) struct Overlay {
    /// VNets, by index ([`Inside::Vnet`] and `Tables::vnet_out` use it).
    pub(crate) vnets: Vec<Arc<Vnet>>,
    /// (VTEP index, VNI) -> VNet index, for VXLAN received on a VTEP socket.
    pub(crate) by_vtep: FxHashMap<(usize, Vni), usize>,
    /// VNI -> VNet index, for VXLAN relayed by a steer node (relay mode only: VNIs are
    /// unique there).
    pub(crate) by_vni: FxHashMap<Vni, usize>,
    /// Tunnel bindings.
    pub(crate) tunnels: Vec<TunnelBinding>,
    /// The configuration each VNet was built from (to keep unchanged VNets on a change).
    configs: Vec<VnetConfig>,
}

fn config_err(field: impl Into<String>, reason: impl Into<String>) -> DataplaneError {
    DataplaneError::Config {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Overlay {
    /// Validates `vnets` and `tunnels` whole (errors name the field, e.g. `vnets[2].vtep`,
    /// `tunnels[0].inside`) and builds the overlay, reusing the VNets of `previous` whose
    /// configuration and index are unchanged (their neighbour caches survive).
    /// `key` gives each VNet its number in the per-VM route table.
    pub(crate) fn build(
        vnets: &[VnetConfig],
        tunnels: Vec<TunnelBinding>,
        rules: Rules<'_>,
        previous: Option<&Overlay>,
        key: &mut dyn FnMut(&VnetConfig) -> VnetId,
    ) -> Result<Self, DataplaneError> {
        validate(vnets, &tunnels, rules)?;
        let mut built = Vec::with_capacity(vnets.len());
        let mut by_vtep = FxHashMap::with_capacity_and_hasher(vnets.len(), Default::default());
        let mut by_vni = FxHashMap::default();
        for (i, cfg) in vnets.iter().enumerate() {
            let Some(vtep) = rules.vteps.iter().position(|v| *v == cfg.vtep) else {
                return Err(config_err(
                    format!("vnets[{i}].vtep"),
                    format!(
                        "no VTEP on {} (VTEP sockets are opened at start, on: {})",
                        cfg.vtep,
                        list(rules.vteps)
                    ),
                ));
            };
            let kept = previous.and_then(|p| {
                (p.configs.get(i) == Some(cfg))
                    .then(|| p.vnets.get(i))
                    .flatten()
                    .filter(|v| v.vtep == vtep)
            });
            let vnet = match kept {
                Some(v) => Arc::clone(v),
                None => Arc::new(Vnet::new(i, cfg, vtep, key(cfg))?),
            };
            by_vtep.insert((vtep, vnet.vni), i);
            if rules.relay {
                by_vni.insert(vnet.vni, i);
            }
            built.push(vnet);
        }
        Ok(Self {
            vnets: built,
            by_vtep,
            by_vni,
            tunnels,
            configs: vnets.to_vec(),
        })
    }

    /// The binding of `tunnel`, if it is bound.
    pub(crate) fn binding(&self, tunnel: TunnelId) -> Option<&TunnelBinding> {
        self.tunnels.iter().find(|b| b.tunnel == tunnel)
    }
}

fn list(addrs: &[IpAddr]) -> String {
    if addrs.is_empty() {
        return "none".into();
    }
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The checks across VNets and bindings (each VNet's own fields are checked by
/// [`Vnet::new`]).
fn validate(
    vnets: &[VnetConfig],
    tunnels: &[TunnelBinding],
    rules: Rules<'_>,
) -> Result<(), DataplaneError> {
    for (i, v) in vnets.iter().enumerate() {
        if vnets[..i]
            .iter()
            .any(|o| o.vni == v.vni && o.vtep == v.vtep)
        {
            return Err(config_err(
                format!("vnets[{i}].vni"),
                format!("VNI {} is used twice on VTEP {}", v.vni, v.vtep),
            ));
        }
        if rules.relay && vnets[..i].iter().any(|o| o.vni == v.vni) {
            return Err(config_err(
                format!("vnets[{i}].vni"),
                format!(
                    "VNI {} is used twice (in relay mode VXLAN from steer nodes is told apart by VNI alone)",
                    v.vni
                ),
            ));
        }
        if vnets[..i]
            .iter()
            .any(|o| o.tenant == v.tenant && o.name == v.name)
        {
            return Err(config_err(
                format!("vnets[{i}].name"),
                format!("{}/{} is defined twice", v.tenant, v.name),
            ));
        }
        if v.vtep.is_unspecified() || v.vtep.is_multicast() {
            return Err(config_err(
                format!("vnets[{i}].vtep"),
                format!("{} is not a unicast address", v.vtep),
            ));
        }
    }
    if !vnets.is_empty() && rules.vxlan_port == 0 {
        return Err(config_err(
            "vxlan_port",
            "must not be 0 (hosts are addressed on it)",
        ));
    }
    for (i, t) in tunnels.iter().enumerate() {
        if tunnels[..i].iter().any(|o| o.tunnel == t.tunnel) {
            return Err(config_err(
                format!("tunnels[{i}].tunnel"),
                format!("{:?} is bound twice", t.tunnel),
            ));
        }
        match &t.inside {
            Inside::Vnet(v) => {
                let Some(vnet) = vnets.get(*v) else {
                    return Err(config_err(
                        format!("tunnels[{i}].inside"),
                        format!("VNet index {v} does not exist"),
                    ));
                };
                if vnet.tenant != t.tenant {
                    return Err(config_err(
                        format!("tunnels[{i}].inside"),
                        format!(
                            "VNet {} belongs to tenant {}, not {}",
                            vnet.name, vnet.tenant, t.tenant
                        ),
                    ));
                }
            }
            Inside::Tun => {
                if !rules.tun {
                    return Err(config_err(
                        format!("tunnels[{i}].inside"),
                        "inside = tun needs tun_name",
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use datapath::Route;

    fn build(
        vnets: &[VnetConfig],
        tunnels: Vec<TunnelBinding>,
        rules: Rules<'_>,
        previous: Option<&Overlay>,
    ) -> Result<Overlay, DataplaneError> {
        Overlay::build(vnets, tunnels, rules, previous, &mut |_| VnetId(0))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn vnet(tenant: &str, name: &str, vni: u32, vtep: &str) -> VnetConfig {
        VnetConfig {
            tenant: ids::TenantId::new(tenant).expect("tenant"),
            name: name.into(),
            vni,
            gateway_ips: vec![ip("10.0.0.1")],
            vtep: ip(vtep),
            routes: vec![Route {
                prefix: ip("10.0.0.0"),
                len: 24,
                host: ip("192.0.2.10"),
            }],
            router_mac: None,
        }
    }

    fn bind(tunnel: u32, tenant: &str, inside: Inside) -> TunnelBinding {
        TunnelBinding {
            tunnel: TunnelId(tunnel),
            name: format!("t{tunnel}"),
            tenant: ids::TenantId::new(tenant).expect("tenant"),
            inside,
        }
    }

    fn rules(vteps: &[IpAddr], relay: bool) -> Rules<'_> {
        Rules {
            vteps,
            vxlan_port: 4789,
            tun: false,
            relay,
        }
    }

    fn field(r: Result<Overlay, DataplaneError>) -> String {
        match r {
            Err(DataplaneError::Config { field, .. }) => field,
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn unchanged_vnets_keep_their_state_and_changed_ones_are_rebuilt() {
        let vteps = [ip("192.0.2.1")];
        let a = vnet("x", "a", 1, "192.0.2.1");
        let b = vnet("y", "b", 2, "192.0.2.1");
        let first = build(
            &[a.clone(), b.clone()],
            vec![bind(1, "x", Inside::Vnet(0))],
            rules(&vteps, true),
            None,
        )
        .expect("valid");
        let mut b2 = b.clone();
        b2.routes[0].len = 16;
        let second = build(
            &[a.clone(), b2],
            vec![bind(1, "x", Inside::Vnet(0))],
            rules(&vteps, true),
            Some(&first),
        )
        .expect("valid");
        assert!(Arc::ptr_eq(&first.vnets[0], &second.vnets[0]), "kept");
        assert!(!Arc::ptr_eq(&first.vnets[1], &second.vnets[1]), "rebuilt");
        // The same VNet at another index is rebuilt (its index is part of it).
        let third = build(&[b, a], vec![], rules(&vteps, true), Some(&second)).expect("valid");
        assert!(!Arc::ptr_eq(&second.vnets[0], &third.vnets[1]));
        assert_eq!(third.by_vni.get(&Vni::new(1).expect("vni")), Some(&1));
        assert_eq!(third.by_vtep.get(&(0, Vni::new(2).expect("vni"))), Some(&0));
        assert!(third.binding(TunnelId(1)).is_none());
    }

    #[test]
    fn errors_name_the_field() {
        let vteps = [ip("192.0.2.1"), ip("192.0.2.2")];
        let a = vnet("x", "a", 1, "192.0.2.1");
        // A VTEP without sockets.
        let far = vnet("x", "far", 3, "192.0.2.9");
        assert_eq!(
            field(build(&[a.clone(), far], vec![], rules(&vteps, false), None)),
            "vnets[1].vtep"
        );
        // The same VNI on two VTEPs: fine without relay, refused in relay mode.
        let other = vnet("x", "other", 1, "192.0.2.2");
        assert!(build(
            &[a.clone(), other.clone()],
            vec![],
            rules(&vteps, false),
            None
        )
        .is_ok());
        assert_eq!(
            field(build(
                &[a.clone(), other],
                vec![],
                rules(&vteps, true),
                None
            )),
            "vnets[1].vni"
        );
        // Another tenant's VNet, a missing VNet, TUN without a device, a tunnel bound twice.
        for (tunnels, want) in [
            (vec![bind(1, "z", Inside::Vnet(0))], "tunnels[0].inside"),
            (vec![bind(1, "x", Inside::Vnet(4))], "tunnels[0].inside"),
            (vec![bind(1, "x", Inside::Tun)], "tunnels[0].inside"),
            (
                vec![bind(1, "x", Inside::Vnet(0)), bind(1, "x", Inside::Vnet(0))],
                "tunnels[1].tunnel",
            ),
        ] {
            assert_eq!(
                field(build(
                    std::slice::from_ref(&a),
                    tunnels,
                    rules(&vteps, true),
                    None
                )),
                want
            );
        }
        // Each VNet's own fields (Vnet::new).
        let mut bad = a.clone();
        bad.vni = 1 << 24;
        assert_eq!(
            field(build(&[bad], vec![], rules(&vteps, true), None)),
            "vnets[0].vni"
        );
        let mut no_port = rules(&vteps, true);
        no_port.vxlan_port = 0;
        assert_eq!(field(build(&[a], vec![], no_port, None)), "vxlan_port");
    }
}
