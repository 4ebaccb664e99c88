//! IKE: traffic selectors and CHILD_SAs (keys included) between `ike` and [`pb`](crate::pb).

use super::*;

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
pub(super) fn selectors_and_addresses(
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
