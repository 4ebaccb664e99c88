//! The control node's side: a tonic server for a [`Cluster`] implementation, with mutual TLS.

use crate::certs::{NodeIdentity, NodeRole, NodeTls};
use crate::error::{chain, RpcError};
use crate::pb::cluster_server::{Cluster, ClusterServer};
use crate::tls::{ensure_crypto_provider, server_tls};
use crate::{pb, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
use std::future::Future;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

/// Largest message either side decodes or encodes, in bytes (tonic's default of 4 MiB is too
/// small for the whole steering table of a large cluster).
pub const MAX_MESSAGE_LEN: usize = 64 << 20;

/// A tonic server builder with mutual TLS from `tls` ([`crate::tls::server_tls`]) and HTTP/2
/// keepalives ([`KEEPALIVE_INTERVAL`], [`KEEPALIVE_TIMEOUT`]), for callers that add services
/// of their own; [`serve`] is the whole thing.
pub fn server(tls: &NodeTls) -> Result<Server, RpcError> {
    ensure_crypto_provider();
    Ok(Server::builder()
        .tls_config(server_tls(tls))
        .map_err(|e| RpcError::TlsConfig { reason: chain(&e) })?
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT)))
}

/// Serves `service` on `addr` with mutual TLS from `tls` until `shutdown` completes, then
/// stops accepting connections and returns once every open call has ended.
///
/// Session streams last as long as the nodes stay connected: on shutdown the service must end
/// them itself (close the streams it returned, e.g. on the same signal), or this waits for the
/// nodes to go away. Inside a call, [`crate::peer_identity`] says which node is calling.
pub async fn serve<S, F>(
    addr: SocketAddr,
    tls: &NodeTls,
    service: S,
    shutdown: F,
) -> Result<(), RpcError>
where
    S: Cluster,
    F: Future<Output = ()> + Send,
{
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| RpcError::Bind { addr, source })?;
    serve_on(listener, tls, service, shutdown).await
}

/// [`serve`] on a socket already bound (e.g. to port 0, to learn the port first).
pub async fn serve_on<S, F>(
    listener: TcpListener,
    tls: &NodeTls,
    service: S,
    shutdown: F,
) -> Result<(), RpcError>
where
    S: Cluster,
    F: Future<Output = ()> + Send,
{
    let addr = listener.local_addr().map_err(|e| RpcError::Serve {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        reason: format!("the listening socket has no address: {e}"),
    })?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = ClusterServer::new(service)
        .max_decoding_message_size(MAX_MESSAGE_LEN)
        .max_encoding_message_size(MAX_MESSAGE_LEN);
    server(tls)?
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| RpcError::Serve {
            addr,
            reason: chain(&e),
        })
}

/// Checks a session's first message against the caller's certificate (the proto's rule:
/// `name` and `role` must equal the certificate's CN and OU), returning the node's role, or
/// the `PERMISSION_DENIED` status that ends the session.
pub fn verify_hello(peer: &NodeIdentity, hello: &pb::Hello) -> Result<NodeRole, tonic::Status> {
    let denied = |what: String| {
        tonic::Status::permission_denied(format!(
            "Hello from the holder of the certificate for {} ({}): {what}",
            peer.name, peer.role
        ))
    };
    if hello.name != peer.name {
        return Err(denied(format!(
            "name {:?} is not the certificate's CN",
            hello.name
        )));
    }
    let role = match pb::Role::try_from(hello.role) {
        Ok(pb::Role::Data) => NodeRole::Data,
        Ok(pb::Role::Steer) => NodeRole::Steer,
        Ok(pb::Role::Unspecified) => return Err(denied("no role".into())),
        Err(_) => return Err(denied(format!("unknown role {}", hello.role))),
    };
    if role != peer.role {
        return Err(denied(format!(
            "role {role} is not the certificate's OU {}",
            peer.role
        )));
    }
    Ok(role)
}
