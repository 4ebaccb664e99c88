//! `[store]`'s TLS and authentication keys of the etcd backend: `ca`, `cert`, `key`, `username`
//! and `password_file`, read and checked into an [`EtcdAccess`]. Paths are relative to the
//! configuration file's directory; each error names its key.

use super::Validator;
use crate::config::raw::RawStore;
use crate::error::ConfigError;
use crate::store::{read_password_file, EtcdAccess, EtcdUser};
use std::ops::Range;
use toml::Spanned;

const S: &str = "store";

impl Validator<'_, '_> {
    /// The TLS and authentication of the etcd backend whose endpoints (`https` if they are
    /// `https://` URLs) were given at `endpoints_span`.
    pub(super) fn etcd_access(
        &self,
        raw: &RawStore,
        https: bool,
        endpoints_span: Range<usize>,
    ) -> Result<EtcdAccess, Box<ConfigError>> {
        let path = |value: &Spanned<String>, key: &str| {
            let text = value.get_ref().trim();
            if text.is_empty() {
                return Err(self.err(value.span(), S, key, "must not be empty"));
            }
            Ok(self.relative_path(text))
        };
        let tls = if https {
            let Some(ca) = &raw.ca else {
                return Err(self.err(
                    endpoints_span,
                    S,
                    "ca",
                    "https:// endpoints need `ca`: the CA certificate that signed etcd's \
                     certificate (PEM)",
                ));
            };
            let identity = match (&raw.cert, &raw.key) {
                (Some(cert), Some(key)) => Some((path(cert, "cert")?, path(key, "key")?)),
                (Some(cert), None) => {
                    return Err(self.err(
                        cert.span(),
                        S,
                        "cert",
                        "a client certificate needs its private key: add `key`",
                    ))
                }
                (None, Some(key)) => {
                    return Err(self.err(
                        key.span(),
                        S,
                        "key",
                        "a private key needs its client certificate: add `cert`",
                    ))
                }
                (None, None) => None,
            };
            let ca_path = path(ca, "ca")?;
            let identity_paths = identity
                .as_ref()
                .map(|(cert, key)| (cert.as_path(), key.as_path()));
            let tls = rpc::certs::load_client_tls(&ca_path, identity_paths).map_err(|e| {
                // Say which key's file failed: the error names the file.
                let text = e.to_string();
                let (key, span) = match &identity {
                    Some((_, key_path)) if text.contains(&key_path.display().to_string()) => {
                        ("key", raw.key.as_ref().map(Spanned::span))
                    }
                    Some((cert_path, _)) if text.contains(&cert_path.display().to_string()) => {
                        ("cert", raw.cert.as_ref().map(Spanned::span))
                    }
                    _ => ("ca", Some(ca.span())),
                };
                self.err(span.unwrap_or_else(|| ca.span()), S, key, text)
            })?;
            Some(tls)
        } else {
            for (key, value) in [("ca", &raw.ca), ("cert", &raw.cert), ("key", &raw.key)] {
                if let Some(value) = value {
                    return Err(self.err(
                        value.span(),
                        S,
                        key,
                        "TLS settings need https:// endpoints (the endpoints are http://)",
                    ));
                }
            }
            None
        };
        let user = match (&raw.username, &raw.password_file) {
            (Some(name), Some(_)) if tls.is_none() => {
                return Err(self.err(
                    name.span(),
                    S,
                    "username",
                    "etcd authentication needs https:// endpoints: over http:// the password \
                     and etcd's token would cross the network in clear",
                ))
            }
            (Some(name), Some(file)) => {
                let text = name.get_ref();
                if text.is_empty() || text.trim() != text || text.chars().any(char::is_control) {
                    return Err(self.err(
                        name.span(),
                        S,
                        "username",
                        "must be an etcd user name: not empty, no surrounding spaces or \
                         control characters",
                    ));
                }
                let password = read_password_file(&path(file, "password_file")?)
                    .map_err(|e| self.err(file.span(), S, "password_file", e))?;
                Some(EtcdUser {
                    name: text.clone(),
                    password,
                })
            }
            (Some(name), None) => {
                return Err(self.err(
                    name.span(),
                    S,
                    "username",
                    "an etcd user needs `password_file`: the file holding its password (mode \
                     0600); the password is never written in the configuration",
                ))
            }
            (None, Some(file)) => {
                return Err(self.err(
                    file.span(),
                    S,
                    "password_file",
                    "a password needs the etcd user it belongs to: add `username`",
                ))
            }
            (None, None) => None,
        };
        Ok(EtcdAccess { tls, user })
    }
}

#[cfg(test)]
#[path = "etcd_access_tests.rs"]
mod tests;
