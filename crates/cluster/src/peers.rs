//! Faster takeover of the active control node. The election ([`crate::election`]) replaces a
//! leader once its etcd lease expires: up to the lease's TTL (1 s, etcd's smallest) after its
//! last keep-alive, plus etcd's sweep of expired leases (every 500 ms in etcd 3.4). A standby
//! can do better by watching the leader itself: each control node publishes its gRPC address
//! under `P/control/<name>` ([`Peers::publish`]); a standby probes the leader's address and,
//! when it stays unreachable for a few probes, revokes the leader's lease
//! ([`Peers::revoke_leader`]). etcd then deletes `P/leader` at once and the standbys campaign.
//!
//! Safety does not depend on the probe: etcd still grants leadership to one node at a time, and
//! a leader whose lease was revoked learns it at its next keep-alive and stops acting
//! (`Election::is_leader`). A probe that is wrong (the leader is fine but the standby cannot
//! reach it) costs a needless takeover, never two active nodes.

use crate::election::ElectionError;
use control::store::{explain_etcd_error, token_refused, DetachedRuntime, EtcdOptions};
use etcd_client::Client;
use std::net::SocketAddr;
use std::time::Duration;

/// The control nodes' addresses and the leader key in etcd.
pub struct Peers {
    runtime: DetachedRuntime,
    client: Client,
    prefix: String,
    timeout: Duration,
    describe: String,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("etcd", &self.describe)
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// Connects to the store's etcd (any of its endpoints), within its connect timeout (the
    /// first connection authenticates), then with its timeout per request. Call it from a plain
    /// thread, not from inside an async runtime.
    pub fn connect(options: &EtcdOptions) -> Result<Peers, ElectionError> {
        let prefix = options.prefix.trim_end_matches('/').to_owned();
        let describe = format!("etcd {} prefix {prefix}", options.endpoints.join(","));
        let fail = |detail: String| ElectionError::Start {
            election: describe.clone(),
            detail,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail(format!("runtime: {e}")))?;
        // No per-request timeout of the client's own: it would bound authenticating too.
        // `run` bounds each request.
        let connect = options.access.connect_options(options.connect_timeout);
        let client = runtime
            .block_on(async {
                tokio::time::timeout(
                    options.connect_timeout,
                    Client::connect(options.endpoints.clone(), Some(connect)),
                )
                .await
            })
            .map_err(|_| {
                fail(format!(
                    "no etcd answered within the {:?} connect_timeout",
                    options.connect_timeout
                ))
            })?
            .map_err(|e| fail(explain_etcd_error(e.to_string())))?;
        Ok(Peers {
            runtime: DetachedRuntime::new(runtime),
            client,
            prefix,
            timeout: options.timeout,
            describe,
        })
    }

    fn member_key(&self, name: &str) -> String {
        format!("{}/control/{name}", self.prefix)
    }

    fn leader_key(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    fn failed(&self, what: &str, detail: impl std::fmt::Display) -> ElectionError {
        ElectionError::Start {
            election: self.describe.clone(),
            detail: format!("{what}: {detail}"),
        }
    }

    /// Sends `request` on the client, bounded by the timeout. If etcd no longer accepts the
    /// client's auth token (users or roles changed since it was issued), authenticates again
    /// and sends it once more.
    fn run<T, F, Fut>(&self, what: &str, request: F) -> Result<T, ElectionError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let attempts = async {
            match request(self.client.clone()).await {
                Err(etcd_client::Error::GRpcStatus(status)) if token_refused(status.message()) => {
                    self.client.refresh_token().await?;
                    request(self.client.clone()).await
                }
                other => other,
            }
        };
        self.runtime
            .block_on(async { tokio::time::timeout(self.timeout, attempts).await })
            .map_err(|_| self.failed(what, format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| self.failed(what, explain_etcd_error(e.to_string())))
    }

    /// Publishes this control node's gRPC address (where a standby probes it).
    pub fn publish(&self, name: &str, grpc: SocketAddr) -> Result<(), ElectionError> {
        let key = self.member_key(name);
        self.run("publish the control node's address", |client| {
            let key = key.clone();
            async move {
                let mut kv = client.kv_client();
                kv.put(key, grpc.to_string(), None).await.map(|_| ())
            }
        })
    }

    /// The published gRPC address of control node `name`, if any.
    pub fn address(&self, name: &str) -> Result<Option<SocketAddr>, ElectionError> {
        let key = self.member_key(name);
        let answer = self.run("read a control node's address", |client| {
            let key = key.clone();
            async move { client.kv_client().get(key, None).await }
        })?;
        Ok(answer
            .kvs()
            .first()
            .and_then(|kv| kv.value_str().ok())
            .and_then(|v| v.parse().ok()))
    }

    /// Revokes the lease of the current leader if it is still `expected` (it may have changed
    /// meanwhile: then nothing happens). Returns whether a lease was revoked.
    pub fn revoke_leader(&self, expected: &str) -> Result<bool, ElectionError> {
        let key = self.leader_key();
        let answer = self.run("read the leader key", |client| {
            let key = key.clone();
            async move { client.kv_client().get(key, None).await }
        })?;
        let Some(leader) = answer.kvs().first() else {
            return Ok(false);
        };
        if leader.value_str().ok() != Some(expected) || leader.lease() == 0 {
            return Ok(false);
        }
        let lease = leader.lease();
        self.run("revoke the leader's lease", |client| async move {
            client.lease_client().revoke(lease).await.map(|_| ())
        })?;
        Ok(true)
    }
}
