//! Conversions between the protocol's messages ([`pb`]) and Protego's own types.
//!
//! `*_to_pb` functions build a message from a value that is valid by construction and cannot
//! fail (except [`rate_limit_to_pb`], for a limit the wire cannot express). `*_from_pb`
//! functions check every field of a received message - SPI ranges, 24-bit VNIs, address
//! families, port and address ranges, transform ids and key lengths - and return a
//! [`ConvertError`] naming the first bad field; they never panic, whatever the input.
//!
//! Field paths in errors start at the converted message (`local`, `vnets[2].vni`); a caller
//! converting a part of a larger message adds where it sits with [`ConvertError::context`],
//! e.g. `child_from_pb(sa).map_err(|e| e.context("install_child"))` reports
//! `install_child.local: invalid socket address "x"`.
//!
//! Addresses travel as strings: `"ip:port"` or `"[v6]:port"` for socket addresses (an IPv6
//! scope id as `%n`; the flow label is not carried), `"prefix/len"` for routes.
//!
//! # Keys
//! [`child_to_pb`] copies a CHILD_SA's keys into the message's `Vec<u8>`s (prost's type);
//! [`pb::ChildSa`] wipes them when dropped, so drop the message (or the `Directive` holding
//! it) as soon as it is sent. [`child_from_pb`] takes the message by value and moves the
//! keys into [`Zeroizing`] buffers without copying them. Neither can reach the copies in
//! tonic's encode and decode buffers.

use crate::certs::NodeRole;
use crate::pb;
use crypto::transform::{EncrId, IntegId, KeId};
use crypto::{DhGroup, Encr, Integ};
use datapath::{Inside, InstalledChild, Route, TunnelBinding, VnetConfig};
use ike::{ChildKeys, ChildSaInfo, IkeSpis, TrafficSelector, TunnelId};
use ipnet::IpNet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use steer::{AddrRange, NodeId, PortRange, RateLimit, SelectorEntry, SpiEntry, TunnelLimit};
use wire::vxlan::Vni;
use wire::{EspSpi, IkeSpi};
use zeroize::Zeroizing;

#[cfg(test)]
mod tests;

/// A message field that does not hold an acceptable value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConvertError {
    /// Path of the field from the converted message, e.g. `routes[1].prefix`.
    pub field: String,
    /// What is wrong with its value.
    pub reason: String,
}

impl ConvertError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConvertError {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same error with `parent` (a field name, or `name[index]`) prefixed to its path.
    pub fn context(mut self, parent: impl fmt::Display) -> Self {
        self.field = if self.field.is_empty() {
            parent.to_string()
        } else if self.field.starts_with('[') {
            format!("{parent}{}", self.field)
        } else {
            format!("{parent}.{}", self.field)
        };
        self
    }
}

type Result<T> = std::result::Result<T, ConvertError>;

fn err<T>(field: impl Into<String>, reason: impl Into<String>) -> Result<T> {
    Err(ConvertError::new(field, reason))
}

/// Converts every item of a repeated field, naming the failing one `field[i]`.
fn each<T, U>(field: &str, items: &[T], f: impl Fn(&T) -> Result<U>) -> Result<Vec<U>> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| f(item).map_err(|e| e.context(format_args!("{field}[{i}]"))))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Scalars

/// True for an address a packet can be sent to and come from: not unspecified, multicast or
/// the IPv4 broadcast address.
fn is_unicast(ip: IpAddr) -> bool {
    !ip.is_unspecified() && !ip.is_multicast() && ip != IpAddr::V4(Ipv4Addr::BROADCAST)
}

fn ip_from_pb(field: &str, s: &str) -> Result<IpAddr> {
    s.parse()
        .or_else(|_| err(field, format!("invalid IP address {s:?}")))
}

fn unicast_from_pb(field: &str, s: &str) -> Result<IpAddr> {
    let ip = ip_from_pb(field, s)?;
    if !is_unicast(ip) {
        return err(field, format!("{ip} is not a unicast address"));
    }
    Ok(ip)
}

/// A socket address as the protocol writes it: `ip:port`, `[v6]:port` (`[v6%scope]:port` with
/// a scope id).
pub fn socket_addr_to_pb(addr: SocketAddr) -> String {
    addr.to_string()
}

/// Parses a socket address field (`field` names it in the error): `ip:port` or `[v6]:port`,
/// with a unicast address and a port other than 0 (every address in the protocol is one
/// packets are sent to or from).
pub fn socket_addr_from_pb(field: &str, s: &str) -> Result<SocketAddr> {
    let addr: SocketAddr = s.parse().or_else(|_| {
        err(
            field,
            format!("invalid socket address {s:?}: expected ip:port or [ipv6]:port"),
        )
    })?;
    if !is_unicast(addr.ip()) {
        return err(field, format!("{} is not a unicast address", addr.ip()));
    }
    if addr.port() == 0 {
        return err(field, format!("{s:?}: port 0"));
    }
    Ok(addr)
}

/// An ESP SPI's value on the wire.
pub fn esp_spi_to_pb(spi: EspSpi) -> u32 {
    spi.0
}

/// Checks an ESP SPI field: 0 is never used and 1 to 255 are reserved (RFC 4303 §2.1).
pub fn esp_spi_from_pb(field: &str, spi: u32) -> Result<EspSpi> {
    if spi <= 255 {
        return err(
            field,
            format!("SPI {spi}: 0 is never used and 1 to 255 are reserved (RFC 4303 §2.1)"),
        );
    }
    Ok(EspSpi(spi))
}

/// Checks a VNI field: 24 bits.
pub fn vni_from_pb(field: &str, vni: u32) -> Result<Vni> {
    Vni::new(vni).ok_or_else(|| {
        ConvertError::new(
            field,
            format!("VNI {vni} does not fit in 24 bits (at most {})", Vni::MAX),
        )
    })
}

fn ike_spi_from_pb(field: &str, spi: u64) -> Result<IkeSpi> {
    if spi == 0 {
        return err(field, "0: an established IKE SA has both SPIs");
    }
    Ok(IkeSpi(spi))
}

fn port_from_pb(field: &str, port: u32) -> Result<u16> {
    u16::try_from(port).or_else(|_| err(field, format!("port {port} is above 65535")))
}

fn ip_proto_from_pb(field: &str, proto: u32) -> Result<u8> {
    u8::try_from(proto).or_else(|_| err(field, format!("IP protocol {proto} is above 255")))
}

fn transform_id(field: &str, id: u32) -> Result<u16> {
    u16::try_from(id).or_else(|_| err(field, format!("transform id {id} is above 65535")))
}

fn index_from_pb(field: &str, index: u32) -> Result<usize> {
    usize::try_from(index).or_else(|_| err(field, format!("index {index} is out of range")))
}

fn name_from_pb(field: &str, name: &str) -> Result<String> {
    if name.is_empty() {
        return err(field, "empty");
    }
    Ok(name.to_owned())
}

/// The protocol's role of a node in its Hello: data and steer nodes only (control nodes do not
/// open sessions).
pub fn role_to_pb(role: NodeRole) -> Option<pb::Role> {
    match role {
        NodeRole::Data => Some(pb::Role::Data),
        NodeRole::Steer => Some(pb::Role::Steer),
        NodeRole::Control => None,
    }
}

/// Checks a role field (`pb::Hello::role`): data or steer.
pub fn role_from_pb(field: &str, role: i32) -> Result<NodeRole> {
    match pb::Role::try_from(role) {
        Ok(pb::Role::Data) => Ok(NodeRole::Data),
        Ok(pb::Role::Steer) => Ok(NodeRole::Steer),
        Ok(pb::Role::Unspecified) => err(field, "unspecified: expected data or steer"),
        Err(_) => err(
            field,
            format!("unknown role {role}: expected data or steer"),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// IKE: traffic selectors and CHILD_SAs

/// A traffic selector as the protocol writes it.
pub fn traffic_selector_to_pb(ts: &TrafficSelector) -> pb::TrafficSelector {
    pb::TrafficSelector {
        ip_proto: u32::from(ts.ip_proto),
        start_port: u32::from(ts.start_port),
        end_port: u32::from(ts.end_port),
        start: ts.start.to_string(),
        end: ts.end.to_string(),
    }
}

/// Checks a traffic selector: protocol up to 255, ports up to 65535 with start not above end
/// (except 65535-0, RFC 7296's OPAQUE), both addresses of one family with start not above end.
pub fn traffic_selector_from_pb(ts: &pb::TrafficSelector) -> Result<TrafficSelector> {
    let ip_proto = ip_proto_from_pb("ip_proto", ts.ip_proto)?;
    let start_port = port_from_pb("start_port", ts.start_port)?;
    let end_port = port_from_pb("end_port", ts.end_port)?;
    let opaque = start_port == u16::MAX && end_port == 0;
    if start_port > end_port && !opaque {
        return err(
            "end_port",
            format!(
                "port range {start_port}-{end_port} is reversed (only 65535-0, OPAQUE, may be)"
            ),
        );
    }
    let start = ip_from_pb("start", &ts.start)?;
    let end = ip_from_pb("end", &ts.end)?;
    if start.is_ipv4() != end.is_ipv4() {
        return err(
            "end",
            format!("{end} is not of the address family of start {start}"),
        );
    }
    if start > end {
        return err("end", format!("{end} is below start {start}"));
    }
    Ok(TrafficSelector {
        ip_proto,
        start_port,
        end_port,
        start,
        end,
    })
}

/// A CHILD_SA pair as the protocol writes it, keys included: drop the message as soon as it
/// is sent (see the module docs).
pub fn child_to_pb(info: &ChildSaInfo) -> pb::ChildSa {
    let (encr, key_bits) = info.encr.id();
    pb::ChildSa {
        tunnel: info.tunnel.0,
        ike_initiator_spi: info.ike.initiator.0,
        ike_responder_spi: info.ike.responder.0,
        inbound_spi: info.inbound_spi.0,
        outbound_spi: info.outbound_spi.0,
        encr: u32::from(encr.0),
        encr_key_bits: key_bits.map_or(0, u32::from),
        integ: info.integ.map(|i| u32::from(i.id().0)),
        esn: info.esn,
        pfs: info.pfs.map(|g| u32::from(g.id().0)),
        inbound_encr_key: info.keys.inbound_encr.to_vec(),
        inbound_integ_key: info.keys.inbound_integ.to_vec(),
        outbound_encr_key: info.keys.outbound_encr.to_vec(),
        outbound_integ_key: info.keys.outbound_integ.to_vec(),
        local_ts: info.local_ts.iter().map(traffic_selector_to_pb).collect(),
        remote_ts: info.remote_ts.iter().map(traffic_selector_to_pb).collect(),
        local: socket_addr_to_pb(info.local),
        remote: socket_addr_to_pb(info.remote),
        replay_window: info.replay_window,
        replaces: info.replaces.map(|s| s.0),
        outbound_active: info.outbound_active,
        proposal: info.proposal.clone(),
    }
}

/// The selectors (at least one each) and the outer addresses (one family) of a CHILD_SA.
fn selectors_and_addresses(
    local_ts: &[pb::TrafficSelector],
    remote_ts: &[pb::TrafficSelector],
    local: &str,
    remote: &str,
) -> Result<(
    Vec<TrafficSelector>,
    Vec<TrafficSelector>,
    SocketAddr,
    SocketAddr,
)> {
    let local_ts = each("local_ts", local_ts, traffic_selector_from_pb)?;
    let remote_ts = each("remote_ts", remote_ts, traffic_selector_from_pb)?;
    if local_ts.is_empty() {
        return err("local_ts", "no traffic selector");
    }
    if remote_ts.is_empty() {
        return err("remote_ts", "no traffic selector");
    }
    let local = socket_addr_from_pb("local", local)?;
    let remote = socket_addr_from_pb("remote", remote)?;
    if local.is_ipv4() != remote.is_ipv4() {
        return err(
            "remote",
            format!("{remote} is not of the address family of local {local}"),
        );
    }
    Ok((local_ts, remote_ts, local, remote))
}

/// A CHILD_SA a data node holds, without keys (its Hello).
pub fn installed_to_pb(c: &InstalledChild) -> pb::InstalledSa {
    pb::InstalledSa {
        tunnel: c.tunnel.0,
        ike_initiator_spi: c.ike.initiator.0,
        ike_responder_spi: c.ike.responder.0,
        inbound_spi: c.inbound_spi.0,
        outbound_spi: c.outbound_spi.0,
        local: socket_addr_to_pb(c.local),
        remote: socket_addr_to_pb(c.remote),
        local_ts: c.local_ts.iter().map(traffic_selector_to_pb).collect(),
        remote_ts: c.remote_ts.iter().map(traffic_selector_to_pb).collect(),
        sending: c.sending,
    }
}

/// Checks a held CHILD_SA as [`child_from_pb`] checks its fields (keys aside).
pub fn installed_from_pb(sa: &pb::InstalledSa) -> Result<InstalledChild> {
    let ike = IkeSpis {
        initiator: ike_spi_from_pb("ike_initiator_spi", sa.ike_initiator_spi)?,
        responder: ike_spi_from_pb("ike_responder_spi", sa.ike_responder_spi)?,
    };
    let (local_ts, remote_ts, local, remote) =
        selectors_and_addresses(&sa.local_ts, &sa.remote_ts, &sa.local, &sa.remote)?;
    Ok(InstalledChild {
        tunnel: TunnelId(sa.tunnel),
        ike,
        inbound_spi: esp_spi_from_pb("inbound_spi", sa.inbound_spi)?,
        outbound_spi: esp_spi_from_pb("outbound_spi", sa.outbound_spi)?,
        local,
        remote,
        local_ts,
        remote_ts,
        sending: sa.sending,
    })
}

/// Checks a CHILD_SA pair and takes its keys (moved, not copied, into [`Zeroizing`] buffers):
/// both IKE SPIs set; both ESP SPIs (and `replaces`) outside the reserved range; transforms
/// Protego supports, an integrity transform exactly when the cipher is not AEAD; every key as
/// long as its transform takes (encryption keys with their salt); at least one traffic selector
/// on each side; local and remote unicast socket addresses of one family.
///
/// `encr_key_bits` is 0 for a cipher without a key length attribute (ChaCha20-Poly1305). The
/// replay window is taken as it is (the data path bounds it).
pub fn child_from_pb(mut sa: pb::ChildSa) -> Result<ChildSaInfo> {
    // The keys first, into buffers that wipe themselves whatever is wrong below.
    let keys = ChildKeys {
        inbound_encr: Zeroizing::new(std::mem::take(&mut sa.inbound_encr_key)),
        inbound_integ: Zeroizing::new(std::mem::take(&mut sa.inbound_integ_key)),
        outbound_encr: Zeroizing::new(std::mem::take(&mut sa.outbound_encr_key)),
        outbound_integ: Zeroizing::new(std::mem::take(&mut sa.outbound_integ_key)),
    };
    let ike = IkeSpis {
        initiator: ike_spi_from_pb("ike_initiator_spi", sa.ike_initiator_spi)?,
        responder: ike_spi_from_pb("ike_responder_spi", sa.ike_responder_spi)?,
    };
    let inbound_spi = esp_spi_from_pb("inbound_spi", sa.inbound_spi)?;
    let outbound_spi = esp_spi_from_pb("outbound_spi", sa.outbound_spi)?;

    let encr_id = EncrId(transform_id("encr", sa.encr)?);
    let key_bits = match sa.encr_key_bits {
        0 => None,
        bits => Some(
            u16::try_from(bits)
                .or_else(|_| err("encr_key_bits", format!("{bits} bits is out of range")))?,
        ),
    };
    let encr = Encr::from_id(encr_id, key_bits).ok_or_else(|| {
        let with = match key_bits {
            Some(bits) => format!("a {bits}-bit key"),
            None => "no key length".to_owned(),
        };
        ConvertError::new(
            "encr",
            format!(
                "unsupported encryption transform {encr_id} with {with} (AES-GCM-16 and AES-CBC \
                 take 128 or 256 bits, ChaCha20-Poly1305 none)"
            ),
        )
    })?;
    let integ = match sa.integ {
        None => None,
        Some(id) => {
            let integ_id = IntegId(transform_id("integ", id)?);
            Some(Integ::from_id(integ_id).ok_or_else(|| {
                ConvertError::new(
                    "integ",
                    format!("unsupported integrity transform {integ_id}"),
                )
            })?)
        }
    };
    match (encr.is_aead(), integ) {
        (true, Some(i)) => {
            return err(
                "integ",
                format!(
                    "{} is an AEAD cipher and takes no integrity transform, not {}",
                    encr.name(),
                    i.name()
                ),
            )
        }
        (false, None) => {
            return err(
                "integ",
                format!("{} needs an integrity transform", encr.name()),
            )
        }
        _ => {}
    }
    let pfs = match sa.pfs {
        None => None,
        Some(id) => {
            let ke = KeId(transform_id("pfs", id)?);
            Some(DhGroup::from_id(ke).ok_or_else(|| {
                ConvertError::new("pfs", format!("unsupported key exchange group {ke}"))
            })?)
        }
    };
    let integ_len = integ.map_or(0, Integ::key_len);
    for (field, key, len) in [
        ("inbound_encr_key", &keys.inbound_encr, encr.keymat_len()),
        ("outbound_encr_key", &keys.outbound_encr, encr.keymat_len()),
        ("inbound_integ_key", &keys.inbound_integ, integ_len),
        ("outbound_integ_key", &keys.outbound_integ, integ_len),
    ] {
        if key.len() != len {
            return err(
                field,
                format!(
                    "{} bytes, but {}{} takes {len}",
                    key.len(),
                    encr.name(),
                    integ.map_or(String::new(), |i| format!(" with {}", i.name()))
                ),
            );
        }
    }
    let (local_ts, remote_ts, local, remote) =
        selectors_and_addresses(&sa.local_ts, &sa.remote_ts, &sa.local, &sa.remote)?;
    let replaces = match sa.replaces {
        None => None,
        Some(spi) => Some(esp_spi_from_pb("replaces", spi)?),
    };
    if replaces == Some(inbound_spi) {
        return err("replaces", "a CHILD_SA cannot replace itself");
    }
    Ok(ChildSaInfo {
        tunnel: TunnelId(sa.tunnel),
        ike,
        inbound_spi,
        outbound_spi,
        encr,
        integ,
        esn: sa.esn,
        pfs,
        keys,
        local_ts,
        remote_ts,
        local,
        remote,
        replay_window: sa.replay_window,
        replaces,
        outbound_active: sa.outbound_active,
        proposal: std::mem::take(&mut sa.proposal),
    })
}

// ---------------------------------------------------------------------------------------------
// Data nodes: VNets and tunnel bindings

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
        tenant: vnet.tenant.clone(),
        name: vnet.name.clone(),
        vni: vnet.vni,
        gateway_ips: vnet.gateway_ips.iter().map(IpAddr::to_string).collect(),
        routes: vnet.routes.iter().map(route_to_pb).collect(),
    }
}

/// Checks a VNet and completes it with the data node's own VTEP address `vtep`: tenant and
/// name set; the VNI within 24 bits; one or two unicast gateway addresses, at most one per IP
/// version; valid routes to hosts of `vtep`'s address family.
pub fn vnet_from_pb(vnet: &pb::Vnet, vtep: IpAddr) -> Result<VnetConfig> {
    if !is_unicast(vtep) {
        return err("vtep", format!("{vtep} is not a unicast address"));
    }
    let tenant = name_from_pb("tenant", &vnet.tenant)?;
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
    Ok(VnetConfig {
        tenant,
        name,
        vni,
        gateway_ips,
        vtep,
        routes,
    })
}

/// A tunnel binding as the protocol writes it.
pub fn tunnel_binding_to_pb(binding: &TunnelBinding) -> pb::TunnelBinding {
    pb::TunnelBinding {
        tunnel: binding.tunnel.0,
        name: binding.name.clone(),
        tenant: binding.tenant.clone(),
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
        tenant: name_from_pb("tenant", &binding.tenant)?,
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

// ---------------------------------------------------------------------------------------------
// Steer nodes

/// An SPI steering entry as the protocol writes it.
pub fn steer_spi_to_pb(spi: EspSpi, entry: &SpiEntry) -> pb::SteerSpi {
    pb::SteerSpi {
        spi: spi.0,
        node: entry.node.0,
        tunnel: entry.tunnel.0,
    }
}

/// Checks an SPI steering entry: the SPI outside the reserved range.
pub fn steer_spi_from_pb(entry: &pb::SteerSpi) -> Result<(EspSpi, SpiEntry)> {
    Ok((
        esp_spi_from_pb("spi", entry.spi)?,
        SpiEntry {
            node: NodeId(entry.node),
            tunnel: steer::TunnelId(entry.tunnel),
        },
    ))
}

/// An outbound steering rule as the protocol writes it.
pub fn selector_to_pb(entry: &SelectorEntry) -> pb::Selector {
    let s = &entry.selector;
    pb::Selector {
        dst_start: s.dst.start().to_string(),
        dst_end: s.dst.end().to_string(),
        src_start: s.src.start().to_string(),
        src_end: s.src.end().to_string(),
        proto: u32::from(s.proto),
        sport_start: u32::from(s.sport.start()),
        sport_end: u32::from(s.sport.end()),
        dport_start: u32::from(s.dport.start()),
        dport_end: u32::from(s.dport.end()),
        tunnel: entry.tunnel.0,
        node: entry.node.0,
    }
}

fn addr_range_from_pb(prefix: &str, start: &str, end: &str) -> Result<AddrRange> {
    let start_field = format!("{prefix}_start");
    let end_field = format!("{prefix}_end");
    let start = ip_from_pb(&start_field, start)?;
    let end = ip_from_pb(&end_field, end)?;
    AddrRange::new(start, end).map_err(|e| ConvertError::new(end_field, e.to_string()))
}

fn port_range_from_pb(prefix: &str, start: u32, end: u32) -> Result<PortRange> {
    let start = port_from_pb(&format!("{prefix}_start"), start)?;
    let end_field = format!("{prefix}_end");
    let end = port_from_pb(&end_field, end)?;
    PortRange::new(start, end).map_err(|e| ConvertError::new(end_field, e.to_string()))
}

/// Checks an outbound steering rule: destination and source address ranges of one family,
/// start not above end; protocol up to 255; port ranges within 0-65535, start not above end.
pub fn selector_from_pb(selector: &pb::Selector) -> Result<SelectorEntry> {
    let dst = addr_range_from_pb("dst", &selector.dst_start, &selector.dst_end)?;
    let src = addr_range_from_pb("src", &selector.src_start, &selector.src_end)?;
    if dst.is_ipv4() != src.is_ipv4() {
        return err(
            "src_start",
            format!(
                "{} is not of the destination {}'s address family",
                src.start(),
                dst.start()
            ),
        );
    }
    Ok(SelectorEntry {
        selector: steer::Selector {
            dst,
            src,
            proto: ip_proto_from_pb("proto", selector.proto)?,
            sport: port_range_from_pb("sport", selector.sport_start, selector.sport_end)?,
            dport: port_range_from_pb("dport", selector.dport_start, selector.dport_end)?,
        },
        tunnel: steer::TunnelId(selector.tunnel),
        node: NodeId(selector.node),
    })
}

/// The outbound steering rule of one pair of a CHILD_SA's negotiated traffic selectors
/// (`local` from its `local_ts`, `remote` from its `remote_ts`), sent on `tunnel` by the data
/// node `node`: the destination is the remote selector, the source the local one, the
/// protocol the one they share (one of 0, "any", yields the other).
///
/// Fails (naming `local` or `remote`) for a pair that cannot be steered: different address
/// families, different non-zero protocols, or OPAQUE ports (65535-0).
pub fn selector_entry(
    local: &TrafficSelector,
    remote: &TrafficSelector,
    tunnel: steer::TunnelId,
    node: NodeId,
) -> Result<SelectorEntry> {
    let proto = match (local.ip_proto, remote.ip_proto) {
        (0, p) | (p, 0) => p,
        (l, r) if l == r => l,
        (l, r) => {
            return err(
                "remote",
                format!("IP protocol {r} differs from the local selector's {l}"),
            )
        }
    };
    if local.start.is_ipv4() != remote.start.is_ipv4() {
        return err(
            "remote",
            format!(
                "{} is not of the local selector {}'s address family",
                remote.start, local.start
            ),
        );
    }
    let range = |field: &str, ts: &TrafficSelector| -> Result<(AddrRange, PortRange)> {
        Ok((
            AddrRange::new(ts.start, ts.end)
                .map_err(|e| ConvertError::new(field, e.to_string()))?,
            PortRange::new(ts.start_port, ts.end_port)
                .map_err(|e| ConvertError::new(field, e.to_string()))?,
        ))
    };
    let (src, sport) = range("local", local)?;
    let (dst, dport) = range("remote", remote)?;
    Ok(SelectorEntry {
        selector: steer::Selector {
            dst,
            src,
            proto,
            sport,
            dport,
        },
        tunnel,
        node,
    })
}

/// One VNI's outbound steering rules ([`pb::VniSelectors`]), checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VniSelectors {
    /// The VNI.
    pub vni: Vni,
    /// Its rules in priority order (empty: remove the VNI).
    pub selectors: Vec<SelectorEntry>,
    /// The data nodes that answer ARP and ND for the VNI's gateway addresses.
    pub neighbour_nodes: Vec<NodeId>,
    /// The gateway's own addresses in the VNet: IP packets to them go to the neighbour nodes.
    pub gateway_ips: Vec<IpAddr>,
}

/// One VNI's outbound steering rules as the protocol writes them.
pub fn vni_selectors_to_pb(vni: &VniSelectors) -> pb::VniSelectors {
    pb::VniSelectors {
        vni: vni.vni.get(),
        selectors: vni.selectors.iter().map(selector_to_pb).collect(),
        neighbour_nodes: vni.neighbour_nodes.iter().map(|n| n.0).collect(),
        gateway_ips: vni.gateway_ips.iter().map(IpAddr::to_string).collect(),
    }
}

/// Checks one VNI's outbound steering rules: the VNI within 24 bits, every rule as
/// [`selector_from_pb`] checks it, unicast gateway addresses.
pub fn vni_selectors_from_pb(vni: &pb::VniSelectors) -> Result<VniSelectors> {
    Ok(VniSelectors {
        vni: vni_from_pb("vni", vni.vni)?,
        selectors: each("selectors", &vni.selectors, selector_from_pb)?,
        neighbour_nodes: vni.neighbour_nodes.iter().copied().map(NodeId).collect(),
        gateway_ips: each("gateway_ips", &vni.gateway_ips, |s| unicast_from_pb("", s))?,
    })
}

/// A tunnel's rate limit at a steer node (each direction's) as the protocol writes it; `None`
/// is no limit (zero rate on the wire). The outbound fields stay zero when outbound is the same
/// as inbound.
///
/// A limit of 0 bit/s (which in [`RateLimit`] blocks the tunnel) has no encoding - zero means
/// no limit on the wire - and neither has a burst of 0 bytes (which admits nothing): both are
/// errors.
pub fn rate_limit_to_pb(
    tunnel: steer::TunnelId,
    limit: Option<TunnelLimit>,
) -> Result<pb::RateLimit> {
    let Some(l) = limit else {
        return Ok(pb::RateLimit {
            tunnel: tunnel.0,
            ..pb::RateLimit::default()
        });
    };
    for (prefix, d) in [("", l.inbound), ("outbound_", l.outbound)] {
        if d.bits_per_second == 0 {
            return err(
                format!("{prefix}bits_per_second"),
                "0 (blocked) has no encoding: zero means no limit",
            );
        }
        check_limit(prefix, d.bits_per_second, d.burst_bytes)?;
    }
    let (out_bps, out_burst) = if l.outbound == l.inbound {
        (0, 0)
    } else {
        (l.outbound.bits_per_second, l.outbound.burst_bytes)
    };
    Ok(pb::RateLimit {
        tunnel: tunnel.0,
        bits_per_second: l.inbound.bits_per_second,
        burst_bytes: l.inbound.burst_bytes,
        outbound_bits_per_second: out_bps,
        outbound_burst_bytes: out_burst,
        fallback_bits_per_second: 0,
    })
}

/// A steer node's share of a tunnel's limit with its fallback (`None`: no limit), as
/// [`rate_limit_to_pb`] writes it.
pub fn share_to_pb(tunnel: steer::TunnelId, share: Option<steer::Share>) -> Result<pb::RateLimit> {
    let mut r = rate_limit_to_pb(tunnel, share.map(|s| s.limit))?;
    r.fallback_bits_per_second = share.map_or(0, |s| s.fallback_bits_per_second);
    Ok(r)
}

/// Checks a steer node's share of a tunnel's limit and its fallback (see
/// [`rate_limit_from_pb`]; a fallback needs a limit).
pub fn share_from_pb(limit: &pb::RateLimit) -> Result<(steer::TunnelId, Option<steer::Share>)> {
    let (tunnel, l) = rate_limit_from_pb(limit)?;
    Ok((
        tunnel,
        l.map(|limit_each_way| steer::Share {
            limit: limit_each_way,
            fallback_bits_per_second: limit.fallback_bits_per_second,
        }),
    ))
}

/// Checks one direction's rate and burst (`prefix` names the direction's fields).
fn check_limit(prefix: &str, bits_per_second: u64, burst_bytes: u64) -> Result<()> {
    match (bits_per_second, burst_bytes) {
        (0, 0) => Ok(()),
        (0, _) => err(
            format!("{prefix}burst_bytes"),
            format!("{burst_bytes} with no limit (0 bit/s): expected 0"),
        ),
        (_, 0) => err(
            format!("{prefix}burst_bytes"),
            "0 admits no packet: expected at least the largest packet's size",
        ),
        _ => Ok(()),
    }
}

/// Checks a tunnel's rate limit at a steer node: no limit (`None`) when the rate is 0, and then
/// every other field 0 too; otherwise a burst of at least one byte, and the outbound fields
/// either both 0 (outbound as inbound) or a rate with a burst of at least one byte.
pub fn rate_limit_from_pb(limit: &pb::RateLimit) -> Result<(steer::TunnelId, Option<TunnelLimit>)> {
    check_limit("", limit.bits_per_second, limit.burst_bytes)?;
    check_limit(
        "outbound_",
        limit.outbound_bits_per_second,
        limit.outbound_burst_bytes,
    )?;
    let tunnel = steer::TunnelId(limit.tunnel);
    if limit.bits_per_second == 0 {
        if limit.outbound_bits_per_second != 0 {
            return err(
                "outbound_bits_per_second",
                "an outbound limit without an inbound one (bits_per_second 0: no limit)",
            );
        }
        if limit.fallback_bits_per_second != 0 {
            return err(
                "fallback_bits_per_second",
                "a fallback without a limit (bits_per_second 0: no limit)",
            );
        }
        return Ok((tunnel, None));
    }
    let inbound = RateLimit::new(limit.bits_per_second, limit.burst_bytes);
    let outbound = match limit.outbound_bits_per_second {
        0 => inbound,
        bps => RateLimit::new(bps, limit.outbound_burst_bytes),
    };
    Ok((tunnel, Some(TunnelLimit { inbound, outbound })))
}
