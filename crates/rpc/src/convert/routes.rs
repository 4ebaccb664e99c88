//! Per-VM overlay routes in the distributed form (issue 16 §2): the single changes the control
//! node sends every data node (`RouteChanges`), and the route version nodes report.

use super::*;
use datapath::{RouteChange, VmRoute};

/// A single route change as the protocol writes it; `None` for a bulk change (a load or a
/// restore), which travels as a snapshot (`FetchRoutes`), never as an operation.
pub fn route_op_to_pb(change: &RouteChange) -> Option<pb::RouteOp> {
    let op = match change {
        RouteChange::Add(r) => pb::route_op::Op::Add(pb::RouteAdd {
            tenant: r.tenant.as_str().to_owned(),
            vnet: r.vnet.clone(),
            address: r.address.to_string(),
            host: r.host.to_string(),
        }),
        RouteChange::Del {
            tenant,
            vnet,
            address,
        } => pb::route_op::Op::Del(pb::RouteDel {
            tenant: tenant.as_str().to_owned(),
            vnet: vnet.clone(),
            address: address.to_string(),
        }),
        RouteChange::Load(_) | RouteChange::Restore(_) | RouteChange::Replace(_) => return None,
    };
    Some(pb::RouteOp { op: Some(op) })
}

/// A single route change, checked (tenant and VNet names, unicast addresses; whether the VNet
/// is configured and the host of its VTEP's family is the data path's check).
pub fn route_op_from_pb(op: &pb::RouteOp) -> Result<RouteChange> {
    match &op.op {
        Some(pb::route_op::Op::Add(a)) => Ok(RouteChange::Add(VmRoute {
            tenant: tenant_from_pb("add.tenant", &a.tenant)?,
            vnet: name_from_pb("add.vnet", &a.vnet)?,
            address: unicast_from_pb("add.address", &a.address)?,
            host: unicast_from_pb("add.host", &a.host)?,
        })),
        Some(pb::route_op::Op::Del(d)) => Ok(RouteChange::Del {
            tenant: tenant_from_pb("del.tenant", &d.tenant)?,
            vnet: name_from_pb("del.vnet", &d.vnet)?,
            address: unicast_from_pb("del.address", &d.address)?,
        }),
        None => err("op", "no operation"),
    }
}

/// The changes of a `route_changes` directive, checked (errors name the operation, e.g.
/// `ops[2].add.host`).
pub fn route_changes_from_pb(c: &pb::RouteChanges) -> Result<Vec<RouteChange>> {
    each("ops", &c.ops, route_op_from_pb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_changes_round_trip_and_bulk_ones_are_not_operations() {
        let add = RouteChange::Add(VmRoute {
            tenant: TenantId::new("acme").unwrap(),
            vnet: "prod".into(),
            address: "10.1.0.7".parse().unwrap(),
            host: "192.0.2.9".parse().unwrap(),
        });
        let del = RouteChange::Del {
            tenant: TenantId::new("acme").unwrap(),
            vnet: "prod".into(),
            address: "fd00::7".parse().unwrap(),
        };
        for c in [add, del] {
            let op = route_op_to_pb(&c).expect("a single change");
            assert_eq!(route_op_from_pb(&op), Ok(c));
        }
        assert!(route_op_to_pb(&RouteChange::Load("".into())).is_none());
        assert!(route_op_to_pb(&RouteChange::Restore(Vec::new().into())).is_none());
    }

    #[test]
    fn bad_fields_are_named() {
        let add = |tenant: &str, address: &str, host: &str| pb::RouteOp {
            op: Some(pb::route_op::Op::Add(pb::RouteAdd {
                tenant: tenant.into(),
                vnet: "prod".into(),
                address: address.into(),
                host: host.into(),
            })),
        };
        let changes = pb::RouteChanges {
            epoch: 1,
            first_seq: 1,
            ops: vec![
                add("acme", "10.1.0.7", "192.0.2.9"),
                add("acme", "10.1.0.8", "224.0.0.1"),
            ],
        };
        let e = route_changes_from_pb(&changes).unwrap_err();
        assert_eq!(e.field, "ops[1].add.host");
        let e = route_op_from_pb(&add("", "10.1.0.7", "192.0.2.9")).unwrap_err();
        assert_eq!(e.field, "add.tenant");
        let e = route_op_from_pb(&add("acme", "x", "192.0.2.9")).unwrap_err();
        assert_eq!(e.field, "add.address");
        let e = route_op_from_pb(&pb::RouteOp { op: None }).unwrap_err();
        assert_eq!(e.field, "op");
    }
}
