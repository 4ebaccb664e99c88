//! Customer attachments in the distributed form (issue 16): a steer node's ports, the
//! attachments every data node holds, the CE MACs passed between them, and a port's tag pairs
//! at its steer node.

use super::*;
use datapath::{AttachmentConfig, AttachmentPort, AttachmentTags};
use steer::{AttachEntry, AttachmentId, PortId, PortKey};

/// A steer node's customer-facing port as its Hello announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteerPort {
    /// The steer node's id for it (the Geneve port option).
    pub id: PortId,
    /// The interface's name there.
    pub interface: String,
    /// The interface's MAC.
    pub mac: [u8; 6],
}

/// A port as the protocol writes it.
pub fn steer_port_to_pb(port: &SteerPort) -> pb::Port {
    pb::Port {
        id: port.id.0,
        interface: port.interface.clone(),
        mac: port.mac.to_vec(),
    }
}

/// A MAC field: six bytes, unicast, not all zero.
fn unicast_mac_from_pb(field: &str, bytes: &[u8]) -> Result<[u8; 6]> {
    match <[u8; 6]>::try_from(bytes) {
        Ok(m) if m[0] & 0x01 == 0 && m != [0; 6] => Ok(m),
        _ => err(field, "not a unicast MAC address of six bytes"),
    }
}

/// Checks a port: an id other than 0, an interface name, a unicast MAC of six bytes.
pub fn steer_port_from_pb(port: &pb::Port) -> Result<SteerPort> {
    if port.id == 0 {
        return err("id", "0 is no port id (ids start at 1)");
    }
    Ok(SteerPort {
        id: PortId(port.id),
        interface: name_from_pb("interface", &port.interface)?,
        mac: unicast_mac_from_pb("mac", &port.mac)?,
    })
}

/// A VLAN id field: 1..=4094 (`zero_ok`: 0 too, a single-tag attachment's S-tag).
fn vid_from_pb(field: &str, vid: u32, zero_ok: bool) -> Result<u16> {
    match u16::try_from(vid) {
        Ok(0) if zero_ok => Ok(0),
        Ok(v @ 1..=4094) => Ok(v),
        _ => err(field, format!("{vid} is not a VLAN id (1..=4094)")),
    }
}

/// A port's tag pair and the data node serving it, as the protocol writes it.
pub fn port_tag_to_pb(key: PortKey, entry: AttachEntry) -> pb::PortTag {
    pb::PortTag {
        port: key.port.0,
        s_tag: u32::from(key.s_tag),
        c_tag: u32::from(key.c_tag),
        node: entry.node.0,
        attachment: entry.attachment.0,
        vni: entry.vni.map(|v| v.get()),
    }
}

/// Checks a port's tag pair: VLAN ids (S-tag 0 for a single tag), and its serving node.
pub fn port_tag_from_pb(tag: &pb::PortTag) -> Result<(PortKey, AttachEntry)> {
    let key = port_key(tag.port, tag.s_tag, tag.c_tag)?;
    let vni = match tag.vni {
        Some(v) => Some(Vni::new(v).ok_or_else(|| {
            ConvertError::new("port_tag.vni", format!("VNI {v} is above 2^24 - 1"))
        })?),
        None => None,
    };
    Ok((
        key,
        AttachEntry {
            node: NodeId(tag.node),
            attachment: AttachmentId(tag.attachment),
            vni,
        },
    ))
}

/// A tag pair to forget, as the protocol writes it.
pub fn remove_port_tag_to_pb(key: PortKey) -> pb::RemovePortTag {
    pb::RemovePortTag {
        port: key.port.0,
        s_tag: u32::from(key.s_tag),
        c_tag: u32::from(key.c_tag),
    }
}

/// Checks a tag pair to forget (as [`port_tag_from_pb`] checks its key).
pub fn remove_port_tag_from_pb(tag: &pb::RemovePortTag) -> Result<PortKey> {
    port_key(tag.port, tag.s_tag, tag.c_tag)
}

fn port_key(port: u32, s_tag: u32, c_tag: u32) -> Result<PortKey> {
    if port == 0 {
        return err("port", "0 is no port id (ids start at 1)");
    }
    let s_tag = vid_from_pb("s_tag", s_tag, true)?;
    let c_tag = vid_from_pb("c_tag", c_tag, false)?;
    PortKey::new(PortId(port), s_tag, c_tag).map_err(|e| ConvertError::new("c_tag", e.to_string()))
}

/// An attachment on a steer node's port as the protocol writes it; `None` for one on a local
/// interface (the embedded form, which the protocol does not carry).
pub fn attachment_to_pb(a: &AttachmentConfig) -> Option<pb::Attachment> {
    let AttachmentPort::Steer { geneve, port, mac } = &a.port else {
        return None;
    };
    let (s_tag, c_tag) = match a.tags {
        AttachmentTags::QinQ { s_tag, c_tag } => (Some(u32::from(s_tag)), c_tag),
        AttachmentTags::Vlan { c_tag } => (None, c_tag),
    };
    Some(pb::Attachment {
        name: a.name.clone(),
        tenant: a.tenant.as_str().to_owned(),
        vnet: a.vnet.clone(),
        steer_geneve: socket_addr_to_pb(*geneve),
        port: *port,
        port_mac: mac.to_vec(),
        s_tag,
        c_tag: u32::from(c_tag),
        gateway_ip: a.gateway_ip.to_string(),
        ce_ip: a.ce_ip.map(|ip| ip.to_string()),
        routes: a.routes.iter().map(|(p, l)| format!("{p}/{l}")).collect(),
        ce_mac: a.ce_mac.map(|m| m.to_vec()),
    })
}

/// Checks a prefix field, "ADDRESS/LENGTH" without host bits.
fn prefix_from_pb(field: &str, text: &str) -> Result<(IpAddr, u8)> {
    let bad = || {
        ConvertError::new(
            field,
            format!("invalid prefix {text:?}: expected ADDRESS/LENGTH"),
        )
    };
    let (addr, len) = text.split_once('/').ok_or_else(bad)?;
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let len: u8 = len.parse().map_err(|_| bad())?;
    let net = IpNet::new(addr, len).map_err(|_| bad())?;
    if net.network() != addr {
        return err(field, format!("{text:?}: host bits are set"));
    }
    Ok((addr, len))
}

/// Checks an attachment: a name, tenant and VNet; the steer node's Geneve address, a port id
/// other than 0 and the port's unicast MAC; VLAN ids; unicast gateway and CE addresses of one
/// family, routes of that family without host bits; a CE MAC, if any, unicast of six bytes.
pub fn attachment_from_pb(a: &pb::Attachment) -> Result<AttachmentConfig> {
    let name = name_from_pb("name", &a.name)?;
    let tenant = tenant_from_pb("tenant", &a.tenant)?;
    let vnet = name_from_pb("vnet", &a.vnet)?;
    let geneve = socket_addr_from_pb("steer_geneve", &a.steer_geneve)?;
    if a.port == 0 {
        return err("port", "0 is no port id (ids start at 1)");
    }
    let mac = unicast_mac_from_pb("port_mac", &a.port_mac)?;
    let c_tag = vid_from_pb("c_tag", a.c_tag, false)?;
    let tags = match a.s_tag {
        None => AttachmentTags::Vlan { c_tag },
        Some(s) => AttachmentTags::QinQ {
            s_tag: vid_from_pb("s_tag", s, false)?,
            c_tag,
        },
    };
    let gateway_ip = unicast_from_pb("gateway_ip", &a.gateway_ip)?;
    let ce_ip = a
        .ce_ip
        .as_deref()
        .map(|s| unicast_from_pb("ce_ip", s))
        .transpose()?;
    if let Some(ce) = ce_ip {
        if ce.is_ipv4() != gateway_ip.is_ipv4() {
            return err(
                "ce_ip",
                format!("{ce} is not of gateway_ip {gateway_ip}'s address family"),
            );
        }
        if ce == gateway_ip {
            return err("ce_ip", format!("{ce} is the gateway's address"));
        }
    }
    let routes = each("routes", &a.routes, |r| {
        let (p, l) = prefix_from_pb("", r)?;
        if p.is_ipv4() != gateway_ip.is_ipv4() {
            return err(
                "",
                format!("{r} is not of gateway_ip {gateway_ip}'s address family"),
            );
        }
        Ok((p, l))
    })?;
    let ce_mac = a
        .ce_mac
        .as_deref()
        .map(|m| unicast_mac_from_pb("ce_mac", m))
        .transpose()?;
    Ok(AttachmentConfig {
        name,
        tenant,
        vnet,
        port: AttachmentPort::Steer {
            geneve,
            port: a.port,
            mac,
        },
        tags,
        gateway_ip,
        ce_ip,
        routes,
        ce_mac,
    })
}

/// Every attachment (an embedded one, which the protocol does not carry, is left out).
pub fn attachments_to_pb(attachments: &[AttachmentConfig]) -> pb::Attachments {
    pb::Attachments {
        attachments: attachments.iter().filter_map(attachment_to_pb).collect(),
    }
}

/// Checks every attachment ([`attachment_from_pb`]) and that no two share a name, or a port's
/// tag pair.
pub fn attachments_from_pb(a: &pb::Attachments) -> Result<Vec<AttachmentConfig>> {
    let out = each("attachments", &a.attachments, attachment_from_pb)?;
    for (i, x) in out.iter().enumerate() {
        for (j, y) in out[..i].iter().enumerate() {
            if x.name == y.name {
                return err(
                    format!("attachments[{i}].name"),
                    format!("{:?} is also attachments[{j}]'s name", x.name),
                );
            }
            if x.port == y.port && x.tags == y.tags {
                return err(
                    format!("attachments[{i}].c_tag"),
                    format!("the tags of attachments[{j}] on the same port"),
                );
            }
        }
    }
    Ok(out)
}

/// An attachment's CE MAC as the protocol writes it.
pub fn ce_mac_to_pb(attachment: &str, mac: [u8; 6]) -> pb::CeMac {
    pb::CeMac {
        attachment: attachment.to_owned(),
        mac: mac.to_vec(),
    }
}

/// Checks an attachment's CE MAC: a name, a unicast MAC of six bytes.
pub fn ce_mac_from_pb(m: &pb::CeMac) -> Result<(String, [u8; 6])> {
    Ok((
        name_from_pb("attachment", &m.attachment)?,
        unicast_mac_from_pb("mac", &m.mac)?,
    ))
}
