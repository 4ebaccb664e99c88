//! The listener's TLS: the server certificate of `[api] cert_file`/`key_file`, and, with
//! `client_ca_file`, client certificates signed by that CA (asked for, not required: a
//! browser or script without one authenticates with a token instead).

use crate::ApiError;
use control::config::{ApiConfig, ApiTls};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, ApiError> {
    let bad = |reason: String| ApiError::Tls {
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// The server's TLS configuration, or None for `tls = false`.
pub(crate) fn server_config(
    config: &ApiConfig,
) -> Result<Option<Arc<rustls::ServerConfig>>, ApiError> {
    let Some(ApiTls {
        cert_file,
        key_file,
    }) = &config.tls
    else {
        return Ok(None);
    };
    let chain = certificates(cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| ApiError::Tls {
        path: key_file.clone(),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| ApiError::Tls {
            path: cert_file.clone(),
            reason: e.to_string(),
        })?;
    let builder = match &config.client_ca_file {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in certificates(ca)? {
                roots.add(c).map_err(|e| ApiError::Tls {
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| ApiError::Tls {
                    path: ca.clone(),
                    reason: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut server = builder
        .with_single_cert(chain, key)
        .map_err(|e| ApiError::Tls {
            path: cert_file.clone(),
            reason: format!("the certificate and key do not make a TLS identity: {e}"),
        })?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Arc::new(server)))
}
