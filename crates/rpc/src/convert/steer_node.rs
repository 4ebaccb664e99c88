//! Steer nodes: SPI and selector entries, per-VNI selectors, rate limits and shares.

use super::*;

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

/// An outbound steering rule as the protocol writes it. An entry without a tunnel (an
/// attachment's prefix) is written with tunnel 0 and `attachment` 0: use
/// [`attachment_selector_to_pb`] to name the attachment.
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
        tunnel: entry.tunnel.map_or(0, |t| t.0),
        node: entry.node.0,
        attachment: entry.tunnel.is_none().then_some(0),
    }
}

/// One of attachment `attachment`'s prefixes steered to its serving data node (`entry`'s
/// tunnel is ignored: the rule has none), as the protocol writes it.
pub fn attachment_selector_to_pb(
    entry: &SelectorEntry,
    attachment: steer::AttachmentId,
) -> pb::Selector {
    pb::Selector {
        tunnel: 0,
        attachment: Some(attachment.0),
        ..selector_to_pb(entry)
    }
}

pub(super) fn addr_range_from_pb(prefix: &str, start: &str, end: &str) -> Result<AddrRange> {
    let start_field = format!("{prefix}_start");
    let end_field = format!("{prefix}_end");
    let start = ip_from_pb(&start_field, start)?;
    let end = ip_from_pb(&end_field, end)?;
    AddrRange::new(start, end).map_err(|e| ConvertError::new(end_field, e.to_string()))
}

pub(super) fn port_range_from_pb(prefix: &str, start: u32, end: u32) -> Result<PortRange> {
    let start = port_from_pb(&format!("{prefix}_start"), start)?;
    let end_field = format!("{prefix}_end");
    let end = port_from_pb(&end_field, end)?;
    PortRange::new(start, end).map_err(|e| ConvertError::new(end_field, e.to_string()))
}

/// Checks an outbound steering rule: destination and source address ranges of one family,
/// start not above end; protocol up to 255; port ranges within 0-65535, start not above end;
/// an attachment's rule (`attachment` present) with tunnel 0, and then no tunnel.
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
        tunnel: match selector.attachment {
            None => Some(steer::TunnelId(selector.tunnel)),
            Some(_) if selector.tunnel == 0 => None,
            Some(a) => {
                return err(
                    "tunnel",
                    format!(
                        "{} in a rule of attachment {a}: expected 0 (an attachment's prefix has no tunnel)",
                        selector.tunnel
                    ),
                )
            }
        },
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
        tunnel: Some(tunnel),
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
pub(super) fn check_limit(prefix: &str, bits_per_second: u64, burst_bytes: u64) -> Result<()> {
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
