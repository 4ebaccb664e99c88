//! Tests of the etcd store and the election against an etcd secured as docs/operations.md
//! says: TLS with client certificates required (`--client-cert-auth`), authentication on, and
//! a `protego` user whose role may read and write `/protego/t/` only. The right credentials
//! work; a client without a certificate, with a wrong password, or without a user gets
//! nothing; the user reads nothing outside its prefix; expired auth tokens are renewed.

use super::etcd_tests::{Etcd, ServerTls};
use super::tests::put;
use super::{EtcdAccess, EtcdOptions, EtcdStore, EtcdUser, Store, StoreError};
use crate::certs::{self, NodeRole, SubjectAltName};
use crate::election::{Election, ElectionOptions, Role};
use etcd_client::{Client, ConnectOptions, Permission, TlsOptions};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// The Protego cluster's prefix, the only one the `protego` user may touch.
const PREFIX: &str = "/protego/t";
const TIMEOUT: Duration = Duration::from_secs(2);
const ROOT_PASSWORD: &str = "root-secret";
const PASSWORD: &str = "protego-secret";

/// A secured etcd and its PKI: a CA, etcd's certificate for 127.0.0.1, and client
/// certificates `node` (for Protego) and `admin`, none named like an etcd user.
struct Secured {
    etcd: Etcd,
    dir: PathBuf,
}

impl Drop for Secured {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Secured {
    /// Starts etcd with TLS and `extra` options, and turns authentication on with a `root`
    /// user and the `protego` user and role (read and write under `/protego/t/`), using the
    /// etcd client's auth API. Puts `/outside` first, a key the user must not read.
    fn start(extra: &[&str]) -> Option<Secured> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "protego-etcd-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let ca = certs::generate_ca(&dir, "etcd test CA").unwrap();
        let loopback = [SubjectAltName::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST))];
        let server = certs::issue(&dir, &ca, "etcd", NodeRole::Control, &loopback).unwrap();
        for client in ["node", "admin"] {
            certs::issue(&dir, &ca, client, NodeRole::Control, &[]).unwrap();
        }
        let tls = ServerTls {
            ca: ca.cert_path(),
            cert: server.cert_path,
            key: server.key_path,
        };
        let Some(etcd) = Etcd::start_secured(extra, Some(tls)) else {
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        };
        let secured = Secured { etcd, dir };
        let admin = secured.access(Some("admin"), None);
        let (runtime, mut client) = secured.raw(&admin).expect("the admin connects");
        runtime.block_on(async {
            client
                .put("/outside", "not for protego", None)
                .await
                .unwrap();
            client.user_add("root", ROOT_PASSWORD, None).await.unwrap();
            client.user_grant_role("root", "root").await.unwrap();
            client.role_add("protego").await.unwrap();
            let scope = Permission::read_write(format!("{PREFIX}/")).with_prefix();
            client
                .role_grant_permission("protego", scope)
                .await
                .unwrap();
            client.user_add("protego", PASSWORD, None).await.unwrap();
            client.user_grant_role("protego", "protego").await.unwrap();
            client.auth_enable().await.unwrap();
        });
        Some(secured)
    }

    /// TLS with client certificate `cert` (none if `None`) and etcd user `user`.
    fn access(&self, cert: Option<&str>, user: Option<(&str, &str)>) -> EtcdAccess {
        let ca = self.dir.join("ca.pem");
        let identity = cert.map(|c| {
            (
                self.dir.join(format!("{c}.pem")),
                self.dir.join(format!("{c}.key")),
            )
        });
        let identity = identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
        EtcdAccess {
            tls: Some(certs::load_client_tls(&ca, identity).unwrap()),
            user: user.map(|(name, password)| EtcdUser {
                name: name.into(),
                password: Zeroizing::new(password.into()),
            }),
        }
    }

    fn options(&self, prefix: &str, access: EtcdAccess) -> EtcdOptions {
        EtcdOptions {
            endpoints: vec![self.etcd.url()],
            prefix: prefix.into(),
            timeout: TIMEOUT,
            access,
        }
    }

    /// A plain etcd client with `access`, on a runtime of its own.
    fn raw(
        &self,
        access: &EtcdAccess,
    ) -> Result<(tokio::runtime::Runtime, Client), etcd_client::Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let options = access.connect_options(TIMEOUT);
        let client = runtime.block_on(async {
            tokio::time::timeout(TIMEOUT, Client::connect([self.etcd.url()], Some(options)))
                .await
                .unwrap_or_else(|_| panic!("connecting took over {TIMEOUT:?}"))
        })?;
        Ok((runtime, client))
    }

    /// Reads `key` with `access`: the value, or the error (connecting or reading).
    fn read(&self, access: &EtcdAccess, key: &str) -> Result<Option<Vec<u8>>, String> {
        let (runtime, mut client) = self.raw(access).map_err(|e| e.to_string())?;
        runtime
            .block_on(async {
                tokio::time::timeout(TIMEOUT, client.get(key, None))
                    .await
                    .map_err(|_| "no answer".to_owned())?
                    .map_err(|e| e.to_string())
            })
            .map(|r| r.kvs().first().map(|kv| kv.value().to_vec()))
    }
}

/// Connecting fails fast, with an error that says why.
fn refused(options: &EtcdOptions, says: &str) -> String {
    let t = Instant::now();
    let err = EtcdStore::connect(options).unwrap_err();
    assert!(t.elapsed() < TIMEOUT, "took {:?}: {err}", t.elapsed());
    assert!(matches!(err, StoreError::Connect { .. }), "{err:?}");
    let text = err.to_string();
    eprintln!("refused as expected: {text}");
    assert!(text.contains(says), "{says:?} missing in: {text}");
    text
}

#[test]
fn secured_etcd_lets_in_the_right_credentials_only() {
    let Some(s) = Secured::start(&[]) else { return };
    let right = s.access(Some("node"), Some(("protego", PASSWORD)));
    let mut store = EtcdStore::connect(&s.options(PREFIX, right.clone())).unwrap();
    store.commit(&[put(7, b"ike sa state")]).unwrap();
    let stored = store.ike_sas().unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].0, 7);
    let key = format!("{PREFIX}/ike_sas/{:016x}", 7);
    assert_eq!(
        s.read(&right, &key).unwrap().as_deref(),
        Some(&b"ike sa state"[..])
    );

    // No client certificate: etcd refuses the TLS handshake.
    let no_cert = s.access(None, Some(("protego", PASSWORD)));
    refused(
        &s.options(PREFIX, no_cert.clone()),
        "TLS handshake refused by etcd",
    );
    assert!(s.read(&no_cert, &key).is_err());
    // A wrong password.
    let wrong = s.access(Some("node"), Some(("protego", "wrong")));
    refused(&s.options(PREFIX, wrong.clone()), "authentication failed");
    let e = s.read(&wrong, &key).unwrap_err();
    assert!(e.contains("authentication failed"), "{e}");
    // A certificate but no user: its CN is no etcd user.
    let anonymous = s.access(Some("node"), None);
    refused(
        &s.options(PREFIX, anonymous.clone()),
        "no etcd user is configured",
    );
    assert!(s.read(&anonymous, &key).is_err());
    // Another CA than etcd's: this node refuses etcd's certificate.
    let other = s.dir.join("other");
    certs::generate_ca(&other, "another CA").unwrap();
    let mut foreign = right.clone();
    foreign.tls = Some(
        certs::load_client_tls(
            &other.join("ca.pem"),
            Some((&s.dir.join("node.pem"), &s.dir.join("node.key"))),
        )
        .unwrap(),
    );
    refused(
        &s.options(PREFIX, foreign),
        "etcd's certificate does not verify",
    );
    // Plain gRPC to the TLS port.
    let plain = EtcdOptions {
        endpoints: vec![s.etcd.url().replace("https://", "http://")],
        ..s.options(PREFIX, EtcdAccess::default())
    };
    assert!(EtcdStore::connect(&plain).is_err());

    // The user reads and writes its prefix only.
    let e = s.read(&right, "/outside").unwrap_err();
    assert!(e.contains("permission denied"), "{e}");
    refused(&s.options("/other", right.clone()), "permission denied");
    let root = s.access(Some("admin"), Some(("root", ROOT_PASSWORD)));
    assert_eq!(
        s.read(&root, "/outside").unwrap().as_deref(),
        Some(&b"not for protego"[..])
    );
}

/// etcd forgets an idle auth token after `--auth-token-ttl` (here 1 s): the store, the
/// election and its fencing carry on, authenticating again.
#[test]
fn secured_etcd_expired_tokens_are_renewed_for_store_and_election() {
    let flags = [
        "--auth-token-ttl",
        "1",
        "--heartbeat-interval",
        "100",
        "--election-timeout",
        "500",
    ];
    let Some(s) = Secured::start(&flags) else {
        return;
    };
    let right = s.access(Some("node"), Some(("protego", PASSWORD)));
    let start = |name: &str| {
        let mut options = ElectionOptions::new(vec![s.etcd.url()], PREFIX, name);
        options.access = right.clone();
        Election::start(&options).unwrap()
    };
    let a = start("a");
    wait_until("a leads", || a.is_leader());
    let b = start("b");
    wait_until("b stands by", || {
        b.role()
            == Role::Standby {
                leader: Some("a".into()),
            }
    });
    let mut fenced = EtcdStore::connect(&s.options(PREFIX, right.clone()))
        .unwrap()
        .fenced(a.fence().unwrap());
    fenced.commit(&[put(1, b"before")]).unwrap();
    // A client that does not authenticate again shows the tokens do expire.
    let tls = right.tls.as_ref().unwrap();
    let once = ConnectOptions::new()
        .with_user("protego", PASSWORD)
        .with_tls(
            TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(tls.ca_pem()))
                .identity(etcd_client::Identity::from_pem(
                    tls.cert_pem().unwrap(),
                    tls.key_pem().unwrap().as_bytes(),
                )),
        );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut stale = runtime
        .block_on(Client::connect([s.etcd.url()], Some(once)))
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let e = runtime
        .block_on(stale.get(format!("{PREFIX}/schema"), None))
        .unwrap_err();
    assert!(e.to_string().contains("invalid auth token"), "{e}");

    // The store's and the standby's tokens are as old.
    fenced.commit(&[put(2, b"after expiry")]).unwrap();
    assert!(a.is_leader());
    a.resign().unwrap();
    wait_until("b takes over", || b.is_leader());
    let err = fenced.commit(&[put(3, b"deposed")]).unwrap_err();
    assert!(err.to_string().contains("no longer the leader"), "{err}");
    let spis: Vec<u64> = fenced
        .ike_sas()
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(spis, [1, 2]);
    drop(b);
}

/// Polls until `done`, at most 5 s.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{what}: not within 5 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
