//! The error type of the steering crate: invalid table entries and invalid configuration,
//! each naming what was wrong. Per-packet decisions never fail; they return `Option`s.

use std::net::IpAddr;

use wire::vxlan::Vni;
use wire::EspSpi;

use crate::ids::TunnelId;

/// Everything the steering crate rejects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SteerError {
    /// An SPI in the reserved range 0..=255 (RFC 4303 §2.1: "The set of SPI values in the
    /// range 1 through 255 are reserved"; 0 is never sent) cannot be steered.
    #[error("spi {spi}: values 0..=255 are reserved (RFC 4303 §2.1) and cannot be steered")]
    ReservedSpi {
        /// The rejected SPI.
        spi: EspSpi,
    },
    /// An address range whose ends are of different families.
    #[error("address range {start}..={end}: start and end are of different address families")]
    AddressFamilyMismatch {
        /// First address.
        start: IpAddr,
        /// Last address.
        end: IpAddr,
    },
    /// An address range whose start lies above its end.
    #[error("address range {start}..={end}: start is above end")]
    InvertedAddressRange {
        /// First address.
        start: IpAddr,
        /// Last address.
        end: IpAddr,
    },
    /// A prefix length longer than the address.
    #[error("prefix {addr}/{len}: length exceeds the address width")]
    InvalidPrefix {
        /// The address.
        addr: IpAddr,
        /// The prefix length.
        len: u8,
    },
    /// A port range whose start lies above its end (the IKEv2 "OPAQUE" encoding, start 65535
    /// and end 0, is not steerable: a steer node always sees the ports of whole packets).
    #[error("port range {start}..={end}: start is above end")]
    InvertedPortRange {
        /// First port.
        start: u16,
        /// Last port.
        end: u16,
    },
    /// A selector whose source and destination ranges are of different address families: it
    /// could never match a packet.
    #[error("vni {vni}, selector {index} ({}): source and destination are of different address families", tunnel.map_or_else(|| "an attachment's".to_string(), |t| format!("of {t}")))]
    SelectorFamilyMismatch {
        /// The VNI whose table was being set.
        vni: Vni,
        /// Position of the selector in the list given.
        index: usize,
        /// The selector's tunnel (None: an attachment's prefix).
        tunnel: Option<TunnelId>,
    },
    /// A pair of traffic selectors naming two different IP protocols: their intersection is
    /// empty.
    #[error("traffic selectors name different IP protocols: local {local}, remote {remote}")]
    ProtocolMismatch {
        /// The local selector's protocol.
        local: u8,
        /// The remote selector's protocol.
        remote: u8,
    },
    /// More selectors for one VNI than the table can number (`u32::MAX`).
    #[error("vni {vni}: {count} selectors exceed the table's limit")]
    TooManySelectors {
        /// The VNI whose table was being set.
        vni: Vni,
        /// How many selectors were given.
        count: usize,
    },
    /// A VLAN id outside 1..=4094 in a port table key (IEEE 802.1Q reserves 0 and 4095; an
    /// S-tag of 0 means "single 802.1Q tag" and is allowed there only).
    #[error("{port}: {which} {vid} is not a VLAN id (1..=4094)")]
    InvalidVlanId {
        /// The port of the key.
        port: crate::ids::PortId,
        /// "s_tag" or "c_tag".
        which: &'static str,
        /// The rejected id.
        vid: u16,
    },
    /// A health monitor configuration field out of range.
    #[error("health config: {field} {reason}")]
    InvalidHealthConfig {
        /// The field's name in [`crate::HealthConfig`].
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
}
