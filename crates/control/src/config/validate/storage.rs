//! The `[store]` section: backend, file, etcd endpoints and access, encryption at rest.

use super::*;

impl Validator<'_, '_> {
    /// `[store] encryption_key_file` (relative to the configuration file's directory, as
    /// `psk_file`) and `accept_cleartext`, for every backend. The key file itself is read when
    /// the store is opened ([`crate::store::SealedStore::open`]).
    pub(super) fn store_encryption(
        &self,
        raw: Option<&Spanned<RawStore>>,
    ) -> Result<crate::store::EncryptionOptions, Box<ConfigError>> {
        const S: &str = "store";
        let Some(raw) = raw.map(Spanned::get_ref) else {
            return Ok(crate::store::EncryptionOptions::default());
        };
        let key_file = match &raw.encryption_key_file {
            Some(p) if p.get_ref().trim().is_empty() => {
                return Err(self.err(p.span(), S, "encryption_key_file", "must not be empty"));
            }
            Some(p) => {
                let path = Path::new(p.get_ref());
                Some(match self.src.file.parent() {
                    Some(dir) if path.is_relative() => dir.join(path),
                    _ => path.to_owned(),
                })
            }
            None => None,
        };
        let accept_cleartext = match &raw.accept_cleartext {
            Some(a) if *a.get_ref() && key_file.is_none() => {
                return Err(self.err(
                    a.span(),
                    S,
                    "accept_cleartext",
                    "only means something with encryption_key_file (without a key file every \
                     record is in clear)",
                ));
            }
            Some(a) => *a.get_ref(),
            None => false,
        };
        Ok(crate::store::EncryptionOptions {
            key_file,
            accept_cleartext,
        })
    }

    /// `[store]`: the file backend by default.
    pub(super) fn store(
        &self,
        raw: Option<&Spanned<RawStore>>,
    ) -> Result<StoreConfig, Box<ConfigError>> {
        const S: &str = "store";
        let Some(raw) = raw.map(Spanned::get_ref) else {
            return Ok(StoreConfig::File {
                path: PathBuf::from(DEFAULT_STORE_PATH),
            });
        };
        let backend = raw
            .backend
            .as_ref()
            .map_or("file", |b| b.get_ref().as_str());
        // Keys that belong to another backend are refused, not ignored.
        let refuse = |key: &str, span: Option<Range<usize>>, owner: &str| match span {
            Some(span) => Err(self.err(
                span,
                S,
                key,
                format!("only the \"{owner}\" backend has a {key}"),
            )),
            None => Ok(()),
        };
        let file_keys = raw.path.as_ref().map(Spanned::span);
        let etcd_keys = [
            ("endpoints", raw.endpoints.as_ref().map(Spanned::span)),
            ("prefix", raw.prefix.as_ref().map(Spanned::span)),
            ("timeout", raw.timeout.as_ref().map(Spanned::span)),
            (
                "connect_timeout",
                raw.connect_timeout.as_ref().map(Spanned::span),
            ),
            ("ca", raw.ca.as_ref().map(Spanned::span)),
            ("cert", raw.cert.as_ref().map(Spanned::span)),
            ("key", raw.key.as_ref().map(Spanned::span)),
            ("username", raw.username.as_ref().map(Spanned::span)),
            (
                "password_file",
                raw.password_file.as_ref().map(Spanned::span),
            ),
        ];
        match backend {
            "file" => {
                for (key, span) in etcd_keys {
                    refuse(key, span, "etcd")?;
                }
                let path = match &raw.path {
                    Some(p) if p.get_ref().trim().is_empty() => {
                        return Err(self.err(p.span(), S, "path", "must not be empty"));
                    }
                    Some(p) => {
                        let path = Path::new(p.get_ref());
                        match self.src.file.parent() {
                            Some(dir) if path.is_relative() => dir.join(path),
                            _ => path.to_owned(),
                        }
                    }
                    None => PathBuf::from(DEFAULT_STORE_PATH),
                };
                Ok(StoreConfig::File { path })
            }
            "memory" => {
                refuse("path", file_keys, "file")?;
                for (key, span) in etcd_keys {
                    refuse(key, span, "etcd")?;
                }
                Ok(StoreConfig::Memory)
            }
            "etcd" => {
                refuse("path", file_keys, "file")?;
                self.etcd(raw).map(StoreConfig::Etcd)
            }
            other => {
                let span = raw.backend.as_ref().map_or(0..0, Spanned::span);
                Err(self.err(
                    span,
                    S,
                    "backend",
                    format!(
                        "unknown store backend {other:?} (use \"file\", \"etcd\" or \"memory\")"
                    ),
                ))
            }
        }
    }

    /// The etcd backend's keys: `endpoints` (required, http:// or https:// URLs), `prefix`,
    /// `timeout`, `connect_timeout`, and TLS and authentication (`etcd_access.rs`).
    pub(super) fn etcd(&self, raw: &RawStore) -> Result<EtcdOptions, Box<ConfigError>> {
        const S: &str = "store";
        let Some(list) = &raw.endpoints else {
            let span = raw.backend.as_ref().map_or(0..0, Spanned::span);
            return Err(self.err(
                span,
                S,
                "endpoints",
                "the etcd backend needs endpoints, e.g. [\"http://127.0.0.1:2379\"]",
            ));
        };
        let mut endpoints = Vec::new();
        for e in list.get_ref().0.iter() {
            let url = e.trim();
            let host = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"));
            if host.is_none_or(|h| h.is_empty() || h.contains('/')) {
                return Err(self.err(
                    list.span(),
                    S,
                    "endpoints",
                    format!(
                        "{url:?} is not an etcd client URL (http://HOST:PORT or https://HOST:PORT)"
                    ),
                ));
            }
            endpoints.push(url.to_owned());
        }
        if endpoints.is_empty() {
            return Err(self.err(
                list.span(),
                S,
                "endpoints",
                "at least one endpoint is required",
            ));
        }
        let prefix = match &raw.prefix {
            Some(p) => {
                let v = p.get_ref().trim_end_matches('/');
                if !v.starts_with('/') || v.len() < 2 || v.contains("//") {
                    return Err(self.err(
                        p.span(),
                        S,
                        "prefix",
                        "must be an absolute key path such as \"/protego/prod\"",
                    ));
                }
                v.to_owned()
            }
            None => DEFAULT_ETCD_PREFIX.to_owned(),
        };
        let timeout = match &raw.timeout {
            Some(t) if t.get_ref().0.is_zero() => {
                return Err(self.err(t.span(), S, "timeout", "must be more than 0"));
            }
            Some(t) => t.get_ref().0,
            None => DEFAULT_ETCD_TIMEOUT,
        };
        // Opening the store sends requests too: it gets at least `timeout`.
        let connect_timeout = match &raw.connect_timeout {
            Some(t) if t.get_ref().0.is_zero() => {
                return Err(self.err(t.span(), S, "connect_timeout", "must be more than 0"));
            }
            Some(t) if t.get_ref().0 < timeout => {
                return Err(self.err(
                    t.span(),
                    S,
                    "connect_timeout",
                    format!(
                        "must not be shorter than timeout ({}): opening the store sends requests \
                         too",
                        crate::config::format_duration(timeout)
                    ),
                ));
            }
            Some(t) => t.get_ref().0,
            None => DEFAULT_ETCD_CONNECT_TIMEOUT.max(timeout),
        };
        let https = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if https > 0 && https < endpoints.len() {
            return Err(self.err(
                list.span(),
                S,
                "endpoints",
                "mixes http:// and https:// URLs: use https:// for every endpoint",
            ));
        }
        let access = self.etcd_access(raw, https > 0, list.span())?;
        Ok(EtcdOptions {
            endpoints,
            prefix,
            timeout,
            connect_timeout,
            access,
        })
    }
}
