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
use ids::{InvalidName, TenantId};
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

mod attachment;
mod child_sa;
mod data_node;
mod dispatch;
mod filters;
mod routes;
mod steer_node;
pub use attachment::*;
pub use child_sa::*;
pub use data_node::*;
pub use dispatch::*;
pub use filters::*;
pub use routes::*;
pub use steer_node::*;

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

/// Checks a tenant field: a tenant name as the configuration allows it (`ids::TenantId`).
fn tenant_from_pb(field: &str, name: &str) -> Result<TenantId> {
    TenantId::new(name).map_err(|e| match e {
        InvalidName::Empty => ConvertError::new(field, "empty"),
        e => ConvertError::new(field, e.to_string()),
    })
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
