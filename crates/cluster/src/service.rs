//! The control node's gRPC service: one `Session` stream per data or steer node.
//!
//! The node is identified by its TLS client certificate (verified against the cluster CA by
//! the TLS layer): its Hello must carry the certificate's CN as `name` and its OU as `role`,
//! or the session ends with PERMISSION_DENIED. Then control sends Welcome and the node's
//! whole configuration; afterwards directives, each answered by an Ack. Reports and events
//! from the node go to the [`Cluster`]. Anything that may wait on other nodes runs on the
//! blocking pool, never on the runtime's threads.

use crate::link::{NodeLink, SessionLink};
use crate::manager::{
    AttachmentTraffic, Cluster, FilterUsage, NodeLoad, PortInfo, Registration, Role, MAX_INSTALLED,
};
use rpc::certs::NodeRole;
use rpc::pb;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

/// How long a node has to send its Hello after opening the stream.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The `Cluster` gRPC service of a control node.
#[derive(Debug, Clone)]
pub struct ControlService {
    cluster: Arc<Cluster>,
    term: u64,
}

impl ControlService {
    /// Serves `cluster`'s sessions; `term` is this control node's leadership term.
    pub fn new(cluster: Arc<Cluster>, term: u64) -> Self {
        Self { cluster, term }
    }
}

/// The node's answer stream.
type SessionStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ControlMessage, Status>> + Send>>;

/// Checks a Hello against the certificate's identity; returns the node's role and Geneve
/// address.
pub(crate) fn check_hello(
    hello: &pb::Hello,
    cert_name: &str,
    cert_role: NodeRole,
) -> Result<(Role, SocketAddr), Status> {
    let role = match (pb::Role::try_from(hello.role), cert_role) {
        (Ok(pb::Role::Data), NodeRole::Data) => Role::Data,
        (Ok(pb::Role::Steer), NodeRole::Steer) => Role::Steer,
        (r, c) => {
            return Err(Status::permission_denied(format!(
                "Hello claims role {r:?} but the certificate of {cert_name:?} says {c}"
            )))
        }
    };
    if hello.name != cert_name {
        return Err(Status::permission_denied(format!(
            "Hello claims name {:?} but the certificate says {cert_name:?}",
            hello.name
        )));
    }
    let geneve: SocketAddr = hello.geneve.parse().map_err(|_| {
        Status::invalid_argument(format!("hello.geneve: invalid address {:?}", hello.geneve))
    })?;
    if geneve.ip().is_unspecified() || geneve.port() == 0 {
        return Err(Status::invalid_argument(format!(
            "hello.geneve: {geneve} is not an address other nodes can reach"
        )));
    }
    Ok((role, geneve))
}

/// A data node's VTEP address from its Hello: None when it names none (a node that cannot
/// take part in self-dispatch), an error for one that is not a unicast address.
fn hello_vtep(hello: &pb::Hello) -> Result<Option<std::net::IpAddr>, Status> {
    if hello.vtep.is_empty() {
        return Ok(None);
    }
    match hello.vtep.parse::<std::net::IpAddr>() {
        Ok(ip) if !ip.is_unspecified() && !ip.is_multicast() => Ok(Some(ip)),
        _ => Err(Status::invalid_argument(format!(
            "hello.vtep: {:?} is not a unicast address",
            hello.vtep
        ))),
    }
}

/// A steer node's customer-facing ports from its Hello, checked (errors name the field); a
/// data node has none (any it lists are ignored).
fn hello_ports(hello: &pb::Hello, role: Role) -> Result<Vec<PortInfo>, Status> {
    if role != Role::Steer {
        return Ok(Vec::new());
    }
    let mut ports: Vec<PortInfo> = Vec::with_capacity(hello.ports.len());
    for (i, p) in hello.ports.iter().enumerate() {
        let p = rpc::convert::steer_port_from_pb(p)
            .map_err(|e| Status::invalid_argument(format!("hello.ports[{i}].{e}")))?;
        if let Some(j) = ports
            .iter()
            .position(|q| q.id == p.id.0 || q.interface == p.interface)
        {
            return Err(Status::invalid_argument(format!(
                "hello.ports[{i}]: port {} ({}) repeats hello.ports[{j}]'s id or interface",
                p.id.0, p.interface
            )));
        }
        ports.push(PortInfo {
            id: p.id.0,
            interface: p.interface,
            mac: p.mac,
        });
    }
    Ok(ports)
}

/// True if node `id` is a data node.
fn link_is_data(cluster: &Cluster, id: u32) -> bool {
    cluster.role_of(id) == Some(Role::Data)
}

/// A fetching node's snapshot stream.
type RoutesStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::RoutesChunk, Status>> + Send>>;

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ControlService {
    type SessionStream = SessionStream;
    type FetchRoutesStream = RoutesStream;

    /// The master table's snapshot in chunks of [`crate::manager::CHUNK_LEN`], to data nodes
    /// only (by their certificate).
    async fn fetch_routes(
        &self,
        request: Request<pb::RoutesRequest>,
    ) -> Result<Response<Self::FetchRoutesStream>, Status> {
        let identity = rpc::peer_identity(&request)
            .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))?;
        if identity.role != NodeRole::Data {
            return Err(Status::permission_denied(format!(
                "{} is a {} node: only data nodes fetch the routes",
                identity.name, identity.role
            )));
        }
        let held = request.into_inner();
        let cluster = Arc::clone(&self.cluster);
        let (at, bytes) = tokio::task::spawn_blocking(move || cluster.route_snapshot())
            .await
            .map_err(|_| Status::internal("snapshot not written"))?
            .map_err(|e| Status::internal(e.to_string()))?;
        info!(node = %identity.name, held = %format_args!("{}.{}", held.epoch, held.seq), at = %at, bytes = bytes.len(), "route snapshot sent");
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut offset = 0;
            loop {
                let end = (offset + crate::manager::CHUNK_LEN).min(bytes.len());
                let chunk = pb::RoutesChunk {
                    epoch: at.epoch,
                    seq: at.seq,
                    bytes: bytes[offset..end].to_vec(),
                    last: end == bytes.len(),
                };
                if tx.send(Ok(chunk)).await.is_err() || end == bytes.len() {
                    return;
                }
                offset = end;
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn session(
        &self,
        request: Request<Streaming<pb::NodeMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let remote = request.remote_addr();
        let identity = rpc::peer_identity(&request)
            .map_err(|e| Status::unauthenticated(format!("client certificate: {e}")))?;
        let (cert_name, cert_role) = (identity.name, identity.role);
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Hello within 10 s"))??;
        let hello = match first.and_then(|m| m.msg) {
            Some(pb::node_message::Msg::Hello(h)) => h,
            _ => return Err(Status::invalid_argument("the first message must be Hello")),
        };
        let (role, geneve) = match check_hello(&hello, &cert_name, cert_role) {
            Ok(r) => r,
            Err(status) => {
                warn!(?remote, node = %cert_name, error = %status.message(), "node refused");
                return Err(status);
            }
        };
        if hello.installed.len() > MAX_INSTALLED {
            return Err(Status::invalid_argument(format!(
                "hello.installed: {} CHILD_SAs, at most {MAX_INSTALLED}",
                hello.installed.len()
            )));
        }
        let mut installed = Vec::with_capacity(hello.installed.len());
        for (i, sa) in hello.installed.iter().enumerate() {
            installed.push(
                rpc::convert::installed_from_pb(sa)
                    .map_err(|e| Status::invalid_argument(format!("hello.installed[{i}]: {e}")))?,
            );
        }
        let ports = hello_ports(&hello, role)?;
        if hello.ce_macs.len() > MAX_INSTALLED {
            return Err(Status::invalid_argument(format!(
                "hello.ce_macs: {} CE MACs, at most {MAX_INSTALLED}",
                hello.ce_macs.len()
            )));
        }
        let mut ce_macs = Vec::with_capacity(hello.ce_macs.len());
        for (i, m) in hello.ce_macs.iter().enumerate() {
            ce_macs.push(
                rpc::convert::ce_mac_from_pb(m)
                    .map_err(|e| Status::invalid_argument(format!("hello.ce_macs[{i}]: {e}")))?,
            );
        }
        let vtep = hello_vtep(&hello)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let link = Arc::new(SessionLink::new(tx));
        let id = self.cluster.node_id(&hello.name);
        link.send_message(pb::control_message::Msg::Welcome(pb::Welcome {
            node_id: id,
            term: self.term,
            report_interval_ms: self.cluster.settings().report_interval.as_millis() as u32,
            control_name: self.cluster.settings().name.clone(),
        }))
        .map_err(|_| Status::unavailable("session closed"))?;
        let dyn_link: Arc<dyn NodeLink> = link.clone();
        {
            let cluster = Arc::clone(&self.cluster);
            let registration = Registration {
                name: hello.name.clone(),
                role,
                geneve,
                boot_id: hello.boot_id,
                workers: hello.workers,
                installed,
                ports,
                ce_macs,
                vtep,
                routes: routebook::RouteVersion {
                    epoch: hello.routes_epoch,
                    seq: hello.routes_seq,
                },
            };
            let l = Arc::clone(&dyn_link);
            tokio::task::spawn_blocking(move || {
                cluster.register(registration, l);
            })
            .await
            .map_err(|_| Status::internal("registration failed"))?;
        }
        info!(?remote, node = %hello.name, id, role = ?role, "session open");
        let cluster = Arc::clone(&self.cluster);
        let name = hello.name.clone();
        tokio::spawn(async move {
            let end = loop {
                match inbound.message().await {
                    Ok(Some(m)) => handle(&cluster, id, &name, &link, m).await,
                    Ok(None) => break None,
                    Err(status) => break Some(status),
                }
            };
            match &end {
                Some(status) => warn!(node = %name, error = %status.message(), "session failed"),
                None => debug!(node = %name, "session closed by the node"),
            }
            link.close(None);
            let l = Arc::clone(&dyn_link);
            let _ = tokio::task::spawn_blocking(move || cluster.session_ended(id, &l)).await;
        });
        Ok(Response::new(Box::pin(UnboundedReceiverStream::new(rx))))
    }
}

async fn handle(
    cluster: &Arc<Cluster>,
    id: u32,
    name: &str,
    link: &Arc<SessionLink>,
    message: pb::NodeMessage,
) {
    match message.msg {
        Some(pb::node_message::Msg::Ack(ack)) => link.complete(ack),
        Some(pb::node_message::Msg::Report(r)) => {
            let routes = routebook::RouteVersion {
                epoch: r.routes_epoch,
                seq: r.routes_seq,
            };
            if link_is_data(cluster, id) {
                cluster.filters_reported(id, filter_usage(name, &r));
                cluster.traffic_reported(&r.tunnels);
            }
            let load = NodeLoad {
                interval_ms: r.interval_ms,
                utilization: r.utilization.clamp(0.0, 1.0),
                tunnel_bytes: r
                    .tunnels
                    .iter()
                    .map(|t| (t.tunnel, t.bytes_in.saturating_add(t.bytes_out)))
                    .collect(),
                packets: r
                    .tunnels
                    .iter()
                    .map(|t| t.packets_in.saturating_add(t.packets_out))
                    .fold(0, u64::saturating_add),
                drops: r.drops.into_iter().collect(),
                rate_dropped: r
                    .tunnels
                    .iter()
                    .filter(|t| t.rate_dropped > 0)
                    .map(|t| (t.tunnel, t.rate_dropped))
                    .collect(),
                rate_usage: r
                    .tunnels
                    .iter()
                    .map(|t| {
                        let usage = |admitted_bytes, dropped_bytes| steer::Usage {
                            admitted_bytes,
                            dropped_bytes,
                        };
                        (
                            t.tunnel,
                            steer::TunnelUsage {
                                inbound: usage(t.bytes_in, t.rate_dropped_bytes_in),
                                outbound: usage(t.bytes_out, t.rate_dropped_bytes_out),
                            },
                        )
                    })
                    .collect(),
                attachments: r
                    .attachments
                    .iter()
                    .map(|a| AttachmentTraffic {
                        attachment: a.attachment,
                        port: a.port,
                        s_tag: u16::try_from(a.s_tag).unwrap_or(u16::MAX),
                        c_tag: u16::try_from(a.c_tag).unwrap_or(u16::MAX),
                        from_ce_frames: a.from_ce_frames,
                        from_ce_bytes: a.from_ce_bytes,
                        to_ce_frames: a.to_ce_frames,
                        to_ce_bytes: a.to_ce_bytes,
                        dropped: a.dropped,
                    })
                    .collect(),
                vmac_packets: r
                    .vmac_packets
                    .iter()
                    .filter_map(|p| Some((p.vni, u16::try_from(p.vmac).ok()?, p.packets)))
                    .collect(),
            };
            cluster.report(id, load);
            if link_is_data(cluster, id) {
                // Off the runtime's workers: the routes lock may be held while the master
                // serialises a snapshot (for a fetch, or for a compaction before it writes to
                // the store), which must not stall every session's acknowledgements.
                let c = Arc::clone(cluster);
                let _ = tokio::task::spawn_blocking(move || c.routes_reported(id, routes)).await;
            }
        }
        Some(pb::node_message::Msg::Event(e)) => {
            // Not awaited: handling a steer node's verdict waits for the steer nodes' answers,
            // which arrive on this very stream.
            let cluster = Arc::clone(cluster);
            let name = name.to_owned();
            drop(tokio::task::spawn_blocking(move || {
                cluster.event(id, &name, e)
            }));
        }
        Some(pb::node_message::Msg::Hello(_)) | None => {
            warn!(
                node = name,
                "unexpected message in an open session; ignored"
            );
        }
    }
}

/// A data node's report of its filters and tenants, checked (an entry the node got wrong is
/// left out and logged).
fn filter_usage(node: &str, r: &pb::Report) -> FilterUsage {
    fn keep<T, U>(
        node: &str,
        what: &str,
        items: &[T],
        f: impl Fn(&T) -> Result<U, rpc::convert::ConvertError>,
    ) -> Vec<U> {
        items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| {
                f(item)
                    .map_err(|e| warn!(node, error = %e.context(format_args!("report.{what}[{i}]")), "report entry ignored"))
                    .ok()
            })
            .collect()
    }
    FilterUsage {
        programs: keep(
            node,
            "filters",
            &r.filters,
            rpc::convert::filter_usage_from_pb,
        ),
        maps: keep(
            node,
            "filter_maps",
            &r.filter_maps,
            rpc::convert::filter_map_info_from_pb,
        ),
        tenants: keep(
            node,
            "tenants",
            &r.tenants,
            rpc::convert::tenant_cpu_from_pb,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steer_nodes_ports_are_checked_and_a_data_nodes_ignored() {
        let port = |id, interface: &str, mac: Vec<u8>| pb::Port {
            id,
            interface: interface.into(),
            mac,
        };
        let mac = vec![2, 0, 0, 0, 0, 1];
        let hello = |ports| pb::Hello {
            ports,
            ..pb::Hello::default()
        };
        let ok = hello(vec![
            port(1, "eth2", mac.clone()),
            port(2, "eth3", mac.clone()),
        ]);
        let ports = hello_ports(&ok, Role::Steer).expect("valid");
        assert_eq!(
            ports[1],
            PortInfo {
                id: 2,
                interface: "eth3".into(),
                mac: [2, 0, 0, 0, 0, 1],
            }
        );
        assert!(hello_ports(&ok, Role::Data).expect("ignored").is_empty());
        for (bad, says) in [
            (vec![port(1, "eth2", vec![1; 6])], "hello.ports[0].mac"),
            (vec![port(0, "eth2", mac.clone())], "hello.ports[0].id"),
            (
                vec![port(1, "eth2", mac.clone()), port(1, "eth3", mac.clone())],
                "hello.ports[1]: port 1 (eth3) repeats",
            ),
        ] {
            let e = hello_ports(&hello(bad), Role::Steer).expect_err(says);
            assert!(e.message().starts_with(says), "{}", e.message());
        }
    }
}
