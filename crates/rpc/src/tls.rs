//! Mutual TLS from a node's certificate files ([`NodeTls`], loaded and checked by
//! [`crate::certs::load_tls`]): tonic's server and client configurations, the client's check
//! that the server is a control node, and reading the peer's identity from its certificate.
//!
//! rustls runs on aws-lc-rs: building a server or a connection installs its provider as the
//! process-wide default unless another one was installed first.
//!
//! The CA is the only trust anchor on both sides. The node's private key is handed to tonic
//! as PEM; tonic keeps its own copy (a plain `Vec<u8>`, not zeroized) for as long as the
//! configuration lives, and rustls keeps the parsed key for as long as the server or channel
//! does.

use crate::certs::{identity_of, NodeIdentity, NodeRole, NodeTls};
use crate::error::{chain, RpcError};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, OtherError, RootCertStore, SignatureScheme};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Longest a TLS handshake may take, on either side, before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The role of the nodes that serve the cluster protocol, which [`crate::connect`] requires of
/// the server's certificate.
pub const SERVER_ROLE: NodeRole = NodeRole::Control;

/// Makes aws-lc-rs rustls' process-wide provider unless one is installed already. tonic's
/// server configuration uses the process-wide provider and rustls cannot choose one by
/// itself if another crate in the process enables a second provider, so install ours first.
pub(crate) fn ensure_crypto_provider() {
    // An error means a provider is installed already: keep it.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// The server side: the node's certificate and key, and a client certificate required, signed
/// by the CA (a client without one, or with one from another CA, fails the handshake).
pub fn server_tls(tls: &NodeTls) -> ServerTlsConfig {
    ServerTlsConfig::new()
        .identity(identity(tls))
        .client_ca_root(Certificate::from_pem(tls.ca_pem()))
        .client_auth_optional(false)
        .timeout(HANDSHAKE_TIMEOUT)
}

/// The client side: the CA as the only trust root, the node's certificate and key as its
/// identity, and `server_name` (a DNS name or an IP address) as the name the server's
/// certificate must carry in its subjectAltNames.
///
/// This checks the server's chain and name only. [`crate::connect`] also checks that the
/// server is a control node ([`control_verifier`]): prefer it.
pub fn client_tls(tls: &NodeTls, server_name: &str) -> Result<ClientTlsConfig, RpcError> {
    Ok(client_identity_tls(tls, server_name)?.ca_certificate(Certificate::from_pem(tls.ca_pem())))
}

/// [`client_tls`] without trust roots, for use with a custom verifier.
pub(crate) fn client_identity_tls(
    tls: &NodeTls,
    server_name: &str,
) -> Result<ClientTlsConfig, RpcError> {
    check_server_name(server_name)?;
    Ok(ClientTlsConfig::new()
        .identity(identity(tls))
        .domain_name(server_name)
        .timeout(HANDSHAKE_TIMEOUT))
}

/// A server name rustls accepts: a DNS name or an IP address.
pub(crate) fn check_server_name(name: &str) -> Result<(), RpcError> {
    ServerName::try_from(name)
        .map(|_| ())
        .map_err(|_| RpcError::InvalidServerName {
            name: name.to_owned(),
        })
}

fn identity(tls: &NodeTls) -> Identity {
    let key = tls.key_pem();
    Identity::from_pem(tls.cert_pem(), key.as_bytes())
}

/// A server certificate verifier for nodes: the chain must lead to the CA of `tls`, the
/// certificate must name the server name (subjectAltName) and be valid now, and it must be a
/// node certificate of role [`SERVER_ROLE`] (`OU=control`).
pub fn control_verifier(tls: &NodeTls) -> Result<Arc<dyn ServerCertVerifier>, RpcError> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(tls.ca_der().to_vec()))
        .map_err(|e| RpcError::TlsConfig {
            reason: format!("the CA certificate: {e}"),
        })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| RpcError::TlsConfig {
            reason: format!("server certificate verifier: {}", chain(&e)),
        })?;
    Ok(Arc::new(RoleVerifier {
        inner,
        role: SERVER_ROLE,
    }))
}

/// WebPKI verification, then the role in the certificate's OU.
#[derive(Debug)]
struct RoleVerifier {
    inner: Arc<WebPkiServerVerifier>,
    role: NodeRole,
}

/// Why a verified server certificate was still refused.
#[derive(Debug, thiserror::Error)]
enum RoleError {
    #[error("the server's certificate is not a node certificate: {0}")]
    NotANode(String),
    #[error("the server's certificate is for {name} in role {found}, not a {expected} node")]
    WrongRole {
        name: String,
        found: NodeRole,
        expected: NodeRole,
    },
}

impl ServerCertVerifier for RoleVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let refuse = |e: RoleError| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
        };
        let identity = identity_of(end_entity.as_ref()).map_err(|e| {
            refuse(RoleError::NotANode(match e {
                crate::certs::CertError::Peer(reason) => reason,
                other => other.to_string(),
            }))
        })?;
        if identity.role != self.role {
            return Err(refuse(RoleError::WrongRole {
                name: identity.name,
                found: identity.role,
                expected: self.role,
            }));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Who the peer of a call is, from the leaf certificate its TLS handshake presented and the
/// server verified (tonic's [`tonic::Request::peer_certs`]): its name (CN) and role (OU).
///
/// Fails if the connection carries no client certificate (not TLS, or a server configured
/// without [`server_tls`]) or if the certificate is not a node certificate.
pub fn peer_identity<T>(request: &tonic::Request<T>) -> Result<NodeIdentity, RpcError> {
    let certs = request.peer_certs().ok_or_else(|| RpcError::PeerIdentity {
        reason: "the connection carries no client certificate".into(),
    })?;
    let leaf = certs.first().ok_or_else(|| RpcError::PeerIdentity {
        reason: "the client presented an empty certificate chain".into(),
    })?;
    identity_from_der(leaf.as_ref())
}

/// The name (CN) and role (OU) of a node certificate, DER (the peer's leaf certificate, as the
/// TLS handshake verified it: this does not check the chain or the validity). Uses
/// [`crate::certs::identity_of`], which also requires a node certificate's extensions.
pub fn identity_from_der(der: &[u8]) -> Result<NodeIdentity, RpcError> {
    identity_of(der).map_err(|e| RpcError::PeerIdentity {
        reason: match e {
            crate::certs::CertError::Peer(reason) => reason,
            other => other.to_string(),
        },
    })
}
