//! Data nodes: self-dispatch's table (issue 19), who owns each virtual MAC of the dispatched
//! VNets as one node is to see it.

use super::*;
use datapath::{DispatchConfig, VnetOwners};
use std::time::Duration;

/// A node's self-dispatch table as the protocol writes it.
pub fn dispatch_to_pb(d: &DispatchConfig) -> pb::DispatchTable {
    let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX);
    pb::DispatchTable {
        vmacs: d.vmacs,
        announce_interval_ms: ms(d.announce_interval),
        linger_ms: ms(d.linger),
        vnets: d
            .vnets
            .iter()
            .map(|v| pb::DispatchVnet {
                vni: v.vni,
                nodes: v.nodes.iter().map(IpAddr::to_string).collect(),
                owners: v.owners.iter().map(|&o| u32::from(o)).collect(),
            })
            .collect(),
    }
}

/// Checks a self-dispatch table: `vmacs` within `1..=65536`; positive periods; per VNet a
/// 24-bit VNI (each once), unicast node addresses (each once, at most 65536), and exactly
/// `vmacs` owners, each an index into `nodes`.
pub fn dispatch_from_pb(d: &pb::DispatchTable) -> Result<DispatchConfig> {
    if !(1..=::dispatch::MAX_VMACS).contains(&d.vmacs) {
        return err(
            "vmacs",
            format!(
                "{} virtual MACs: between 1 and {}",
                d.vmacs,
                ::dispatch::MAX_VMACS
            ),
        );
    }
    if d.announce_interval_ms == 0 {
        return err("announce_interval_ms", "must be above 0");
    }
    let mut seen = std::collections::BTreeSet::new();
    let vnets = each("vnets", &d.vnets, |v| {
        if Vni::new(v.vni).is_none() {
            return err("vni", format!("{} is not a 24-bit VNI", v.vni));
        }
        let nodes = v
            .nodes
            .iter()
            .enumerate()
            .map(|(i, s)| unicast_from_pb(&format!("nodes[{i}]"), s))
            .collect::<Result<Vec<IpAddr>>>()?;
        if nodes.is_empty() || nodes.len() > usize::from(u16::MAX) {
            return err(
                "nodes",
                format!("{} nodes: between 1 and {}", nodes.len(), u16::MAX),
            );
        }
        let distinct: std::collections::BTreeSet<_> = nodes.iter().collect();
        if distinct.len() != nodes.len() {
            return err("nodes", "a node is listed twice");
        }
        if v.owners.len() != d.vmacs as usize {
            return err(
                "owners",
                format!("{} owners for {} virtual MACs", v.owners.len(), d.vmacs),
            );
        }
        let owners = v
            .owners
            .iter()
            .enumerate()
            .map(|(i, &o)| {
                u16::try_from(o)
                    .ok()
                    .filter(|&o| usize::from(o) < nodes.len())
                    .ok_or_else(|| {
                        ConvertError::new(
                            format!("owners[{i}]"),
                            format!("{o} is not an index into the {} nodes", nodes.len()),
                        )
                    })
            })
            .collect::<Result<Vec<u16>>>()?;
        Ok(VnetOwners {
            vni: v.vni,
            nodes,
            owners,
        })
    })?;
    for (i, v) in vnets.iter().enumerate() {
        if !seen.insert(v.vni) {
            return err(
                format!("vnets[{i}].vni"),
                format!("VNI {} is listed twice", v.vni),
            );
        }
    }
    Ok(DispatchConfig {
        vmacs: d.vmacs,
        announce_interval: Duration::from_millis(u64::from(d.announce_interval_ms)),
        linger: Duration::from_millis(u64::from(d.linger_ms)),
        vnets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> DispatchConfig {
        DispatchConfig {
            vmacs: 4,
            announce_interval: Duration::from_secs(10),
            linger: Duration::from_millis(1500),
            vnets: vec![VnetOwners {
                vni: 1001,
                nodes: vec!["10.0.0.21".parse().unwrap(), "fd00::22".parse().unwrap()],
                owners: vec![0, 0, 1, 1],
            }],
        }
    }

    #[test]
    fn a_table_goes_through_unchanged() {
        assert_eq!(
            dispatch_from_pb(&dispatch_to_pb(&table())).unwrap(),
            table()
        );
    }

    #[test]
    fn a_bad_table_is_refused_naming_the_field() {
        type Change = Box<dyn Fn(&mut pb::DispatchTable)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|t| t.vmacs = 0), "vmacs"),
            (Box::new(|t| t.vmacs = 70_000), "vmacs"),
            (
                Box::new(|t| t.announce_interval_ms = 0),
                "announce_interval_ms",
            ),
            (Box::new(|t| t.vnets[0].vni = 1 << 24), "vnets[0].vni"),
            (
                Box::new(|t| t.vnets[0].nodes[1] = "224.0.0.1".into()),
                "vnets[0].nodes[1]",
            ),
            (
                Box::new(|t| t.vnets[0].nodes[1] = "10.0.0.21".into()),
                "vnets[0].nodes",
            ),
            (Box::new(|t| t.vnets[0].nodes.clear()), "vnets[0]"),
            (
                Box::new(|t| t.vnets[0].owners.pop().map(drop).unwrap_or(())),
                "vnets[0].owners",
            ),
            (Box::new(|t| t.vnets[0].owners[2] = 2), "vnets[0].owners[2]"),
            (
                Box::new(|t| t.vnets.push(t.vnets[0].clone())),
                "vnets[1].vni",
            ),
        ];
        for (change, field) in cases {
            let mut t = dispatch_to_pb(&table());
            change(&mut t);
            let e = dispatch_from_pb(&t).unwrap_err();
            assert!(e.field.starts_with(field), "{field}: {e}");
        }
    }
}
