//! The node's side: a [`ClusterClient`] over a mutually authenticated channel to the control
//! node.

use crate::certs::NodeTls;
use crate::error::{chain, tls_failure, RpcError};
use crate::pb::cluster_client::ClusterClient;
use crate::tls::{client_identity_tls, control_verifier, ensure_crypto_provider};
use crate::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, MAX_MESSAGE_LEN};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Connects to the control node at `endpoint` (`"https://host:port"`, the host a name or an
/// IP address, `[v6]` in brackets) with this node's certificate, within `timeout` (TCP and TLS
/// together), and returns a client for the `Cluster` service.
///
/// The server must present a certificate from the CA of `tls`, naming `server_name` (a DNS
/// name or an IP address) in its subjectAltNames, of role `control` (see
/// [`crate::tls::control_verifier`]); otherwise this fails with [`RpcError::Tls`].
///
/// With TLS 1.3 the client finishes its side of the handshake before the server has checked
/// the client's certificate: when the server refuses it, this may succeed and the first call
/// fail instead, with a status whose causes hold the TLS alert ([`crate::tls_failure`]).
///
/// The channel sends HTTP/2 keepalives ([`KEEPALIVE_INTERVAL`], [`KEEPALIVE_TIMEOUT`]) so that
/// a session to a control node that vanished fails instead of hanging; it does not reconnect
/// by itself in a way the session would survive: open a new session after a failure.
pub async fn connect(
    endpoint: &str,
    tls: &NodeTls,
    server_name: &str,
    timeout: Duration,
) -> Result<ClusterClient<Channel>, RpcError> {
    ensure_crypto_provider();
    let invalid = |reason: String| RpcError::InvalidEndpoint {
        endpoint: endpoint.to_owned(),
        reason,
    };
    let target = Endpoint::from_shared(endpoint.to_owned()).map_err(|e| invalid(chain(&e)))?;
    let uri = target.uri();
    if uri.scheme_str() != Some("https") {
        return Err(invalid("expected https://host:port".into()));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid("no host".into()));
    }
    if uri.port_u16().is_none() {
        return Err(invalid("no port".into()));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(invalid("expected no path or query".into()));
    }
    let target = target
        .connect_timeout(timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .tls_config_with_verifier(
            client_identity_tls(tls, server_name)?,
            control_verifier(tls)?,
        )
        .map_err(|e| RpcError::TlsConfig { reason: chain(&e) })?;
    let channel = match tokio::time::timeout(timeout, target.connect()).await {
        Err(_) => {
            return Err(RpcError::Timeout {
                endpoint: endpoint.to_owned(),
                timeout,
            })
        }
        Ok(Err(e)) => {
            return Err(match tls_failure(&e) {
                Some(reason) => RpcError::Tls {
                    endpoint: endpoint.to_owned(),
                    reason,
                },
                None => RpcError::Connect {
                    endpoint: endpoint.to_owned(),
                    reason: chain(&e),
                },
            })
        }
        Ok(Ok(channel)) => channel,
    };
    Ok(ClusterClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_LEN)
        .max_encoding_message_size(MAX_MESSAGE_LEN))
}
