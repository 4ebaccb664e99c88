//! Opening an [`EtcdStore`]: checking the options, the first connection (TCP, TLS handshake,
//! authentication) and the schema key, all within [`EtcdOptions::connect_timeout`] and tried
//! again with backoff within it; and what to tell the operator when it fails.

use super::{
    schema_version, Budget, Clients, DetachedRuntime, EtcdOptions, EtcdStore, Keys, Mismatch,
    SCHEMA_VERSION,
};
use crate::store::etcd_access::explain;
use crate::store::StoreError;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

impl EtcdStore {
    /// Connects, bounded by [`EtcdOptions::connect_timeout`] (see the type's "Requests"); fails
    /// with a clear [`StoreError`] naming the endpoints if etcd cannot be reached by then.
    ///
    /// Writes the schema key if the prefix is empty; fails with [`StoreError::RemoteSchema`] if
    /// the prefix was written with a newer schema, with [`StoreError::RemoteCorrupt`] if it holds
    /// keys but no valid schema key, and with [`StoreError::Connect`] if the options are invalid
    /// (no endpoints, `https://` endpoints without TLS or `http://` ones with it, an empty
    /// prefix, a zero timeout or connect_timeout), etcd refuses the node (TLS, user, permissions: see the type's
    /// "Security") or does not answer in time.
    pub fn connect(options: &EtcdOptions) -> Result<EtcdStore, StoreError> {
        let prefix = options.prefix.trim_end_matches('/');
        let describe = format!("etcd {} prefix {prefix}", options.endpoints.join(","));
        let refuse = |detail: String| StoreError::Connect {
            store: describe.clone(),
            detail,
        };
        if options.endpoints.is_empty() {
            return Err(refuse("no endpoints configured".into()));
        }
        options
            .access
            .check_endpoints(&options.endpoints)
            .map_err(refuse)?;
        if let Some(url) = options.endpoints.iter().find(|u| u.trim().is_empty()) {
            return Err(refuse(format!("empty endpoint {url:?}")));
        }
        if prefix.is_empty() {
            return Err(refuse(
                "the key prefix must not be empty (use e.g. /protego/<cluster>)".into(),
            ));
        }
        if options.timeout.is_zero() {
            return Err(refuse("the timeout must not be zero".into()));
        }
        if options.connect_timeout.is_zero() {
            return Err(refuse("the connect_timeout must not be zero".into()));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| refuse(format!("cannot start the client's runtime: {e}")))?;
        let store = EtcdStore {
            runtime: DetachedRuntime::new(runtime),
            clients: Mutex::new(Clients {
                by_endpoint: vec![None; options.endpoints.len()],
                current: 0,
            }),
            endpoints: options.endpoints.clone(),
            timeout: options.timeout,
            connect_options: options
                .access
                .connect_options(options.connect_timeout)
                .with_require_leader(true),
            keys: Keys::new(prefix),
            describe,
            fence: None,
            revisions: Mutex::new(HashMap::new()),
        };
        match store.init_schema(options.connect_timeout) {
            Ok(()) => Ok(store),
            Err(StoreError::Connect { store, detail }) => Err(StoreError::Connect {
                detail: connect_hint(options, detail),
                store,
            }),
            Err(e) => Err(e),
        }
    }

    /// Writes the schema key into an empty prefix, or checks the one there: the first requests,
    /// which connect (and authenticate). Together they are bounded by `connect_timeout`.
    fn init_schema(&self, connect_timeout: Duration) -> Result<(), StoreError> {
        let budget = Budget {
            deadline: Instant::now() + connect_timeout,
            length: connect_timeout,
            setting: "connect_timeout",
            retry: true,
        };
        let connect_error = |detail| StoreError::Connect {
            store: self.describe.clone(),
            detail,
        };
        // Nothing under `P/` (every key's create revision is 0 only if there is none).
        let empty = Compare::create_revision(self.keys.all.clone(), CompareOp::Equal, 0)
            .with_range(self.keys.all_end.clone());
        let txn = Txn::new().when([empty]).and_then([TxnOp::put(
            self.keys.schema.clone(),
            SCHEMA_VERSION.to_string(),
            None,
        )]);
        let created = self
            .call_within(&budget, |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .map_err(connect_error)?
            .succeeded();
        if created {
            return Ok(());
        }
        let found = self.read_schema(&budget).map_err(connect_error)?;
        match schema_version(found.as_deref()) {
            Ok(()) => Ok(()),
            Err(Mismatch::Newer(found)) => Err(self.schema_error(found)),
            Err(Mismatch::Missing) => Err(self.corrupt(format!(
                "it holds keys under {} but no schema key {} (another program's data?)",
                self.keys.all, self.keys.schema
            ))),
            Err(Mismatch::Invalid(value)) => Err(self.corrupt(format!(
                "invalid schema version {value:?} in {}",
                self.keys.schema
            ))),
        }
    }
}

/// `detail` (why connecting failed), with what the operator should know: that etcd's
/// authentication is on but no user is configured, or why etcd refused the TLS handshake if it
/// closed the connection and a handshake of our own shows it did (with TLS 1.3 etcd checks the
/// client's certificate after the client finished its side, and the alert it sends is lost
/// under HTTP/2: the client only sees the connection closed).
fn connect_hint(options: &EtcdOptions, detail: String) -> String {
    if options.access.user.is_none() && detail.contains("permission denied") {
        return format!(
            "{detail}; no etcd user is configured (username, password_file): with \
             authentication on, etcd takes the client certificate's CN as the user"
        );
    }
    let Some(tls) = options.access.tls.as_ref() else {
        return detail;
    };
    if !super::super::etcd_access::closed_connection(&detail) {
        return detail;
    }
    // The probes share the connect timeout.
    let each = options.connect_timeout / u32::try_from(options.endpoints.len()).unwrap_or(u32::MAX);
    let refusals: Vec<String> = options
        .endpoints
        .iter()
        .filter_map(|endpoint| {
            let alert = super::super::etcd_access::probe_tls(endpoint, tls, each)?;
            Some(format!("{endpoint}: {}", explain(alert)))
        })
        .collect();
    if refusals.is_empty() {
        detail
    } else {
        format!(
            "{} (the request failed with: {detail})",
            refusals.join("; ")
        )
    }
}
