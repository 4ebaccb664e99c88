//! Tests of the etcd store against an etcd secured as docs/operations.md says
//! ([`Secured`]): TLS with client certificates required (`--client-cert-auth`), authentication
//! on, and a `protego` user whose role may read and write `/protego/t/` only. The right
//! credentials work; a client without a certificate, with a wrong password, or without a user
//! gets nothing; the user reads nothing outside its prefix. That expired auth tokens are
//! renewed, for the store and the election alike, is tested with the election (the `cluster`
//! crate's `election` tests).

use super::{EtcdAccess, EtcdOptions, EtcdStore, Store, StoreError};
use crate::testing::{put, Secured, PASSWORD, PREFIX, ROOT_PASSWORD, TIMEOUT};
use rpc::certs;
use std::time::Instant;

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
