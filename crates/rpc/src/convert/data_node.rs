//! Data nodes: VNets, routes and tunnel bindings, a data node's whole inside configuration.

use super::*;

/// A VNet route as the protocol writes it (`prefix: "10.1.0.0/24"`).
pub fn route_to_pb(route: &Route) -> pb::Route {
    pb::Route {
        prefix: format!("{}/{}", route.prefix, route.len),
        host: route.host.to_string(),
    }
}

/// Checks a route: `prefix` is `address/length` with the length within the address and no
/// host bits set; `host` a unicast address.
pub fn route_from_pb(route: &pb::Route) -> Result<Route> {
    let bad_prefix = || {
        ConvertError::new(
            "prefix",
            format!("invalid prefix {:?}: expected ADDRESS/LENGTH", route.prefix),
        )
    };
    let (addr, len) = route.prefix.split_once('/').ok_or_else(bad_prefix)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad_prefix())?;
    let len: u8 = len.parse().map_err(|_| bad_prefix())?;
    let Ok(net) = IpNet::new(addr, len) else {
        let width = if addr.is_ipv4() { 32 } else { 128 };
        return err(
            "prefix",
            format!(
                "{:?}: length {len} is longer than the address ({width} bits)",
                route.prefix
            ),
        );
    };
    if net.network() != addr {
        return err("prefix", format!("{:?}: host bits are set", route.prefix));
    }
    let host = unicast_from_pb("host", &route.host)?;
    Ok(Route {
        prefix: net.addr(),
        len: net.prefix_len(),
        host,
    })
}

/// A VNet as the protocol writes it (its `vtep` is the data node's own: not sent).
pub fn vnet_to_pb(vnet: &VnetConfig) -> pb::Vnet {
    pb::Vnet {
        tenant: vnet.tenant.to_string(),
        name: vnet.name.clone(),
        vni: vnet.vni,
        gateway_ips: vnet.gateway_ips.iter().map(IpAddr::to_string).collect(),
        routes: vnet.routes.iter().map(route_to_pb).collect(),
        router_mac: vnet.router_mac.map(|m| m.to_vec()),
    }
}

/// Checks a VNet and completes it with the data node's own VTEP address `vtep`: tenant and
/// name set; the VNI within 24 bits; one or two unicast gateway addresses, at most one per IP
/// version; valid routes to hosts of `vtep`'s address family; a router MAC, if any, of six
/// bytes and unicast.
pub fn vnet_from_pb(vnet: &pb::Vnet, vtep: IpAddr) -> Result<VnetConfig> {
    if !is_unicast(vtep) {
        return err("vtep", format!("{vtep} is not a unicast address"));
    }
    let tenant = tenant_from_pb("tenant", &vnet.tenant)?;
    let name = name_from_pb("name", &vnet.name)?;
    let vni = vni_from_pb("vni", vnet.vni)?.get();
    let gateway_ips = each("gateway_ips", &vnet.gateway_ips, |s| unicast_from_pb("", s))?;
    match gateway_ips.as_slice() {
        [] => return err("gateway_ips", "the VNet needs a gateway address"),
        [_] => {}
        [a, b] if a.is_ipv4() != b.is_ipv4() => {}
        _ => return err("gateway_ips", "at most one IPv4 and one IPv6 address"),
    }
    let routes = each("routes", &vnet.routes, |r| {
        let route = route_from_pb(r)?;
        if route.host.is_ipv4() != vtep.is_ipv4() {
            return err(
                "host",
                format!(
                    "{} is not of the address family of this node's VTEP {vtep}",
                    route.host
                ),
            );
        }
        Ok(route)
    })?;
    let router_mac = match &vnet.router_mac {
        None => None,
        Some(b) => match <[u8; 6]>::try_from(b.as_slice()) {
            Ok(m) if m[0] & 0x01 == 0 && m != [0; 6] => Some(m),
            _ => return err("router_mac", "not a unicast MAC address of six bytes"),
        },
    };
    Ok(VnetConfig {
        tenant,
        name,
        vni,
        gateway_ips,
        vtep,
        routes,
        router_mac,
    })
}

/// A tunnel binding as the protocol writes it.
pub fn tunnel_binding_to_pb(binding: &TunnelBinding) -> pb::TunnelBinding {
    pb::TunnelBinding {
        tunnel: binding.tunnel.0,
        name: binding.name.clone(),
        tenant: binding.tenant.to_string(),
        vnet: match binding.inside {
            // No list of VNets has 2^32 entries; an index beyond u32 (impossible) would arrive
            // as u32::MAX and be refused as out of range.
            Inside::Vnet(index) => Some(u32::try_from(index).unwrap_or(u32::MAX)),
            Inside::Tun => None,
        },
    }
}

/// Checks a tunnel binding on its own: name and tenant set. Whether its VNet index exists is
/// checked by [`data_config_from_pb`].
pub fn tunnel_binding_from_pb(binding: &pb::TunnelBinding) -> Result<TunnelBinding> {
    Ok(TunnelBinding {
        tunnel: TunnelId(binding.tunnel),
        name: name_from_pb("name", &binding.name)?,
        tenant: tenant_from_pb("tenant", &binding.tenant)?,
        inside: match binding.vnet {
            Some(index) => Inside::Vnet(index_from_pb("vnet", index)?),
            None => Inside::Tun,
        },
    })
}

/// A data node's inside configuration as the protocol writes it.
pub fn data_config_to_pb(vnets: &[VnetConfig], tunnels: &[TunnelBinding]) -> pb::DataConfig {
    pb::DataConfig {
        vnets: vnets.iter().map(vnet_to_pb).collect(),
        tunnels: tunnels.iter().map(tunnel_binding_to_pb).collect(),
    }
}

/// Checks a data node's inside configuration and completes its VNets with the node's VTEP
/// address `vtep`: every VNet and binding as [`vnet_from_pb`] and [`tunnel_binding_from_pb`]
/// check them; no VNI, tenant/name pair or tunnel twice; each binding's VNet index exists and
/// the VNet belongs to the binding's tenant. Returns the VNets and the bindings, whose VNet
/// indexes are into the VNets.
pub fn data_config_from_pb(
    config: &pb::DataConfig,
    vtep: IpAddr,
) -> Result<(Vec<VnetConfig>, Vec<TunnelBinding>)> {
    let vnets = each("vnets", &config.vnets, |v| vnet_from_pb(v, vtep))?;
    for (i, v) in vnets.iter().enumerate() {
        if let Some(j) = vnets[..i].iter().position(|o| o.vni == v.vni) {
            return err(
                format!("vnets[{i}].vni"),
                format!("VNI {} is also vnets[{j}]'s", v.vni),
            );
        }
        if let Some(j) = vnets[..i]
            .iter()
            .position(|o| o.tenant == v.tenant && o.name == v.name)
        {
            return err(
                format!("vnets[{i}].name"),
                format!("{}/{} is also vnets[{j}]", v.tenant, v.name),
            );
        }
    }
    let tunnels = each("tunnels", &config.tunnels, tunnel_binding_from_pb)?;
    for (i, t) in tunnels.iter().enumerate() {
        if let Some(j) = tunnels[..i].iter().position(|o| o.tunnel == t.tunnel) {
            return err(
                format!("tunnels[{i}].tunnel"),
                format!("tunnel {} is also bound by tunnels[{j}]", t.tunnel.0),
            );
        }
        if let Inside::Vnet(index) = t.inside {
            let Some(vnet) = vnets.get(index) else {
                return err(
                    format!("tunnels[{i}].vnet"),
                    format!("VNet index {index} does not exist ({} VNets)", vnets.len()),
                );
            };
            if vnet.tenant != t.tenant {
                return err(
                    format!("tunnels[{i}].vnet"),
                    format!(
                        "VNet {}/{} is not of the tunnel's tenant {}",
                        vnet.tenant, vnet.name, t.tenant
                    ),
                );
            }
        }
    }
    Ok((vnets, tunnels))
}
