//! [`RpcError`]: what can go wrong setting up, opening or serving the cluster protocol.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::time::Duration;

/// What went wrong setting up TLS, connecting, or serving. Each message names the endpoint,
/// address or certificate concerned and carries the underlying causes.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The endpoint is not an `https://host:port` URI.
    #[error("endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The expected server name is neither a DNS name nor an IP address.
    #[error(
        "TLS server name {name:?}: not a DNS name or an IP address (it must match a \
         subjectAltName of the server's certificate)"
    )]
    InvalidServerName {
        /// The name as given.
        name: String,
    },
    /// The TLS library refused the node's certificate, key or CA.
    #[error("TLS configuration: {reason}")]
    TlsConfig {
        /// The library's reason.
        reason: String,
    },
    /// The TCP connection was made but the TLS handshake failed: the server's certificate is
    /// not from the CA, does not name the expected server, is not a control node's, or the
    /// server refused this node's certificate.
    #[error("{endpoint}: TLS handshake failed: {reason}")]
    Tls {
        /// The endpoint.
        endpoint: String,
        /// The TLS library's reason.
        reason: String,
    },
    /// No connection: refused, unreachable, reset, or HTTP/2 failed.
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The causes, outermost first.
        reason: String,
    },
    /// Neither a connection nor an error within the time allowed.
    #[error("cannot connect to {endpoint}: no connection within {} ms", timeout.as_millis())]
    Timeout {
        /// The endpoint.
        endpoint: String,
        /// The time allowed.
        timeout: Duration,
    },
    /// The server's listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server failed while running.
    #[error("gRPC server on {addr}: {reason}")]
    Serve {
        /// Its listening address.
        addr: SocketAddr,
        /// The causes, outermost first.
        reason: String,
    },
    /// The peer's certificate, as the TLS layer verified it, does not identify a node: absent
    /// (no TLS, or no client certificate), or not a node certificate (`CN=<name>, OU=<role>`,
    /// extendedKeyUsage serverAuth and clientAuth).
    #[error("peer certificate: {reason}")]
    PeerIdentity {
        /// What is missing or wrong.
        reason: String,
    },
}

impl RpcError {
    /// True when the error is a TLS handshake failure (as opposed to a network failure, a
    /// timeout, or a configuration mistake).
    pub fn is_tls(&self) -> bool {
        matches!(self, RpcError::Tls { .. })
    }
}

impl From<RpcError> for tonic::Status {
    /// For a service refusing a call: an unidentified peer is `UNAUTHENTICATED`; anything
    /// else is `INTERNAL`.
    fn from(e: RpcError) -> Self {
        match e {
            RpcError::PeerIdentity { .. } => tonic::Status::unauthenticated(e.to_string()),
            _ => tonic::Status::internal(e.to_string()),
        }
    }
}

/// The TLS failure among `err` and its causes, if any: rustls' own error, or the TLS alert the
/// peer sent, as the text to show.
///
/// A call on a connection the server refused (with TLS 1.3 the client learns that the server
/// rejected its certificate only after its side of the handshake is complete, so [`connect`]
/// may succeed and the first call fail) carries it in the [`tonic::Status`]'s causes:
/// `tls_failure(&status)` tells such a refusal from other failures.
///
/// [`connect`]: crate::connect
pub fn tls_failure(err: &(dyn StdError + 'static)) -> Option<String> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(describe_tls(tls));
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            // `io::Error::source` skips the error it wraps: look inside explicitly.
            if let Some(inner) = io.get_ref() {
                if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                    return Some(describe_tls(tls));
                }
                // Once the connection carries HTTP/2, h2 keeps I/O errors as their kind and
                // text only. The TLS layer reports its failures (rustls errors, alerts from
                // the peer) as InvalidData, which socket I/O never does.
                if io.kind() == std::io::ErrorKind::InvalidData {
                    return Some(inner.to_string());
                }
            }
        }
        next = e.source();
    }
    None
}

/// rustls' message, with the text of a verifier's own error rather than its `Debug` form.
fn describe_tls(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) => {
            format!("invalid peer certificate: {}", other.0)
        }
        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer) => {
            format!("{e} (not issued by the cluster CA this node trusts)")
        }
        _ => e.to_string(),
    }
}

/// `err` and its causes as one line, outermost first, leaving out a cause whose text the
/// previous message already shows.
pub(crate) fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = e.source();
    }
    out
}
