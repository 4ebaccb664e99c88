//! Helpers of the interop negotiation suite (`interop_negotiation.rs`). Here: what tshark sees
//! of IKEv2 (RFC 7296 §3) and ESP in UDP (RFC 4303, RFC 3948) in a capture, as plain structs,
//! so that the suite asserts on the wire rather than on Protego's or strongSwan's own account
//! of what they sent.

#![allow(dead_code, unreachable_pub)] // a test crate's helper module

mod gateway;
mod keylog;
mod peers;
mod rounds;

pub use gateway::*;
pub use keylog::*;
pub use peers::*;
pub use rounds::*;

use std::path::Path;

use protego_testbed::traffic::{self, Capture, Tshark};
use protego_testbed::{Result, Topology};

/// IKEv2 exchange types (RFC 7296 §3.1).
pub const IKE_SA_INIT: u8 = 34;
/// IKE_AUTH.
pub const IKE_AUTH: u8 = 35;
/// CREATE_CHILD_SA.
pub const CREATE_CHILD_SA: u8 = 36;
/// INFORMATIONAL.
pub const INFORMATIONAL: u8 = 37;

/// Payload types (RFC 7296 §3.2).
pub const PAYLOAD_SA: u8 = 33;
/// Key Exchange payload.
pub const PAYLOAD_KE: u8 = 34;
/// Notify payload.
pub const PAYLOAD_NOTIFY: u8 = 41;

/// Notify message types (RFC 7296 §3.10.1).
pub const INVALID_KE_PAYLOAD: u16 = 17;
/// COOKIE.
pub const COOKIE: u16 = 16390;
/// REKEY_SA.
pub const REKEY_SA: u16 = 16393;

/// Protocol IDs of proposals and Delete payloads (RFC 7296 §3.3.1).
pub const PROTO_IKE: u32 = 1;
/// ESP.
pub const PROTO_ESP: u32 = 3;

/// Key exchange group numbers (IANA "Transform Type 4").
pub const MODP_2048: u16 = 14;
/// 256-bit random ECP group.
pub const ECP_256: u16 = 19;
/// 384-bit random ECP group.
pub const ECP_384: u16 = 20;
/// Curve25519.
pub const X25519: u16 = 31;

/// One IKE message as tshark decoded it (payloads inside SK{} only when it could decrypt them).
#[derive(Clone, Debug, Default)]
pub struct IkeMsg {
    /// Frame number in the capture.
    pub frame: u32,
    /// Outer source address.
    pub src: String,
    /// UDP source port.
    pub sport: u16,
    /// Initiator's SPI (16 hex digits).
    pub ispi: String,
    /// Responder's SPI (16 hex digits, zeros in a first IKE_SA_INIT and its stateless answers).
    pub rspi: String,
    /// Exchange type.
    pub exchange: u8,
    /// The R flag.
    pub response: bool,
    /// Message ID as tshark prints it (`0x00000001`).
    pub mid: String,
    /// Whether tshark decrypted an Encrypted payload.
    pub decrypted: bool,
    /// Payload types, the top-level chain first (then nested proposals and transforms).
    pub payloads: Vec<u8>,
    /// FQDN identities (IDi, IDr), in order.
    pub ids: Vec<String>,
    /// Traffic selector start addresses (TSi first, then TSr).
    pub ts_start: Vec<String>,
    /// Traffic selector end addresses.
    pub ts_end: Vec<String>,
    /// Protocol IDs of the SA payload's proposals.
    pub proposal_protocols: Vec<u32>,
    /// SPIs of notifies (e.g. REKEY_SA) and of proposals, in payload order (hex, as tshark
    /// prints them).
    pub spis: Vec<String>,
    /// Notify message types, in order.
    pub notifies: Vec<u16>,
    /// Notify data (hex; `<MISSING>` for empty), parallel to `notifies`.
    pub notify_data: Vec<String>,
    /// Protocol IDs of Delete payloads.
    pub deletes: Vec<u32>,
    /// SPIs in Delete payloads (hex).
    pub delete_spis: Vec<String>,
    /// Group of the KE payload, if any.
    pub ke_group: Option<u16>,
}

impl IkeMsg {
    /// The data of the first notify of type `ty`.
    pub fn notify(&self, ty: u16) -> Option<&str> {
        self.notifies
            .iter()
            .position(|n| *n == ty)
            .and_then(|i| self.notify_data.get(i))
            .map(String::as_str)
    }

    /// Whether the responder SPI is zero.
    pub fn rspi_zero(&self) -> bool {
        self.rspi.chars().all(|c| c == '0')
    }
}

const IKE_FIELDS: &[&str] = &[
    "frame.number",
    "ip.src",
    "udp.srcport",
    "isakmp.ispi",
    "isakmp.rspi",
    "isakmp.exchangetype",
    "isakmp.flag_r",
    "isakmp.messageid",
    "isakmp.enc.decrypted",
    "isakmp.typepayload",
    "isakmp.id.data.fqdn",
    "isakmp.ts.start_ipv4",
    "isakmp.ts.end_ipv4",
    "isakmp.prop.protoid",
    "isakmp.spi",
    "isakmp.notify.msgtype",
    "isakmp.notify.data",
    "isakmp.delete.protoid",
    "isakmp.delete.spi",
    "isakmp.key_exchange.dh_group",
];

fn list(cell: Option<&String>) -> Vec<String> {
    cell.map(|c| {
        c.split(',')
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    })
    .unwrap_or_default()
}

fn numbers<T: std::str::FromStr>(cell: Option<&String>) -> Vec<T> {
    list(cell).iter().filter_map(|s| s.parse().ok()).collect()
}

fn first(cell: Option<&String>) -> String {
    list(cell).into_iter().next().unwrap_or_default()
}

/// Whether `b` repeats `a` (a retransmission): equal in everything this suite decodes. A COOKIE
/// or INVALID_KE_PAYLOAD retry differs in its payloads or KE group.
fn repeats(a: &IkeMsg, b: &IkeMsg) -> bool {
    (a.src == b.src && a.sport == b.sport && a.ispi == b.ispi && a.rspi == b.rspi)
        && (a.exchange == b.exchange && a.response == b.response && a.mid == b.mid)
        && (a.payloads == b.payloads && a.notifies == b.notifies && a.notify_data == b.notify_data)
        && (a.spis == b.spis && a.ke_group == b.ke_group)
}

/// Every IKE message in `pcap` (in capture order), decoded by `tshark`, without
/// retransmissions: the suite runs on a loaded machine where either side may retransmit.
pub fn ike_messages(tshark: &Tshark, pcap: &Path) -> Result<Vec<IkeMsg>> {
    let rows = tshark
        .clone()
        .all_occurrences()
        .fields(pcap, "isakmp", IKE_FIELDS)?;
    let all: Vec<IkeMsg> = rows
        .iter()
        .map(|r| IkeMsg {
            frame: first(r.first()).parse().unwrap_or(0),
            src: first(r.get(1)),
            sport: first(r.get(2)).parse().unwrap_or(0),
            ispi: first(r.get(3)),
            rspi: first(r.get(4)),
            exchange: first(r.get(5)).parse().unwrap_or(0),
            response: first(r.get(6)) == "1",
            mid: first(r.get(7)),
            decrypted: !first(r.get(8)).is_empty(),
            payloads: numbers(r.get(9)),
            ids: list(r.get(10)),
            ts_start: list(r.get(11)),
            ts_end: list(r.get(12)),
            proposal_protocols: numbers(r.get(13)),
            spis: list(r.get(14)),
            notifies: numbers(r.get(15)),
            notify_data: list(r.get(16)),
            deletes: numbers(r.get(17)),
            delete_spis: list(r.get(18)),
            ke_group: numbers(r.get(19)).into_iter().next(),
        })
        .collect();
    let mut distinct: Vec<IkeMsg> = Vec::with_capacity(all.len());
    for m in all {
        if !distinct.iter().any(|d| repeats(d, &m)) {
            distinct.push(m);
        }
    }
    Ok(distinct)
}

/// One ESP packet as tshark decoded it (inner fields only when it could decrypt it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EspPacket {
    /// SPI as tshark prints it (`0x1a2b3c4d`).
    pub spi: String,
    /// Outer source address.
    pub outer_src: String,
    /// Outer destination address.
    pub outer_dst: String,
    /// Inner (decrypted) source address.
    pub inner_src: Option<String>,
    /// Inner destination address.
    pub inner_dst: Option<String>,
    /// ICMP type of the inner packet.
    pub icmp_type: Option<u8>,
    /// Whether tshark verified the ICV.
    pub icv_good: bool,
}

/// Every ESP packet in `pcap`, decoded by `tshark`.
pub fn esp_packets(tshark: &Tshark, pcap: &Path) -> Result<Vec<EspPacket>> {
    let rows = tshark.clone().all_occurrences().fields(
        pcap,
        "esp",
        &["esp.spi", "ip.src", "ip.dst", "icmp.type", "esp.icv_good"],
    )?;
    Ok(rows
        .iter()
        .map(|r| {
            let src = list(r.get(1));
            let dst = list(r.get(2));
            EspPacket {
                spi: first(r.first()),
                outer_src: src.first().cloned().unwrap_or_default(),
                outer_dst: dst.first().cloned().unwrap_or_default(),
                inner_src: src.get(1).cloned(),
                inner_dst: dst.get(1).cloned(),
                icmp_type: numbers(r.get(3)).into_iter().next(),
                icv_good: matches!(first(r.get(4)).as_str(), "1" | "True"),
            }
        })
        .collect())
}

/// Captures IKE and ESP-in-UDP on the gateway's WAN interface.
pub fn wan_capture(topo: &Topology, name: &str) -> Result<Capture> {
    traffic::capture(
        &topo.gateway.ns,
        &topo.gateway.wan_if,
        "udp port 500 or udp port 4500",
        name,
    )
}

/// A readable listing of IKE messages for assertion failures.
pub fn describe(msgs: &[IkeMsg]) -> String {
    msgs.iter()
        .map(|m| {
            format!(
                "#{} {}:{} {}/{} ex={} {} mid={} payloads={:?} notifies={:?} ke={:?}",
                m.frame,
                m.src,
                m.sport,
                m.ispi,
                m.rspi,
                m.exchange,
                if m.response { "resp" } else { "req" },
                m.mid,
                m.payloads,
                m.notifies,
                m.ke_group
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
