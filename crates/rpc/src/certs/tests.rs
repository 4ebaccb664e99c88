//! Tests of the certificate tooling: generation, [`load_tls`] on good files and on each kind of
//! bad one, PEM encoding, and interoperability with OpenSSL in both directions.

use super::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

mod openssl;
mod pem;

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "protego-certs-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn localhost() -> Vec<SubjectAltName> {
    vec![
        SubjectAltName::Ip("127.0.0.1".parse().unwrap()),
        SubjectAltName::Ip("::1".parse().unwrap()),
        SubjectAltName::Dns("localhost".into()),
    ]
}

/// A CA and one node certificate (`node1`, role control) in a fresh directory.
fn setup() -> (Scratch, CertAuthority, IssuedCert) {
    let dir = Scratch::new();
    let ca = generate_ca(&dir.0, "Test CA").unwrap();
    let node = issue(&dir.0, &ca, "node1", NodeRole::Control, &localhost()).unwrap();
    (dir, ca, node)
}

/// The PEM body lines (base64) of a key file: none may ever appear in a message.
fn secret_lines(key_path: &Path) -> Vec<String> {
    std::fs::read_to_string(key_path)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::to_owned)
        .collect()
}

fn assert_no_secret(message: &str, key_path: &Path) {
    for line in secret_lines(key_path) {
        assert!(!message.contains(&line), "key material in {message:?}");
    }
}

#[test]
fn generates_a_ca_and_a_node_certificate_that_load() {
    let (dir, ca, node) = setup();
    assert_eq!(ca.name(), "Test CA");
    assert_eq!(mode(&dir.0), 0o700, "certificate directory private");
    assert_eq!(mode(&dir.path("ca.key")), 0o600);
    assert_eq!(mode(&dir.path("node1.key")), 0o600);
    assert_eq!(node.cert_path, dir.path("node1.pem"));
    assert_eq!(node.key_path, dir.path("node1.key"));
    let days = node
        .not_after
        .duration_since(SystemTime::now())
        .unwrap()
        .as_secs()
        / SECONDS_PER_DAY;
    assert!((364..=365).contains(&days), "{days} days");
    // No temporary files left behind.
    let mut names: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["ca.key", "ca.pem", "node1.key", "node1.pem"]);

    let tls = load_tls(&dir.path("ca.pem"), &node.cert_path, &node.key_path).unwrap();
    assert_eq!(tls.name(), "node1");
    assert_eq!(tls.role(), NodeRole::Control);
    assert_eq!(tls.ca_der(), ca.cert_der());
    assert_eq!(tls.not_after(), node.not_after);
    // The key is PKCS#8 and signs for the certificate's public key.
    let key = KeyPair::try_from(tls.key_der().as_slice()).unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(tls.cert_der()).unwrap();
    assert_eq!(
        key.public_key_raw(),
        cert.public_key().subject_public_key.data.as_ref()
    );
    assert_eq!(
        tls.cert_pem(),
        std::fs::read_to_string(&node.cert_path).unwrap()
    );
    assert_eq!(
        tls.key_pem().as_str(),
        std::fs::read_to_string(&node.key_path).unwrap()
    );
    assert_eq!(
        tls.ca_pem(),
        std::fs::read_to_string(dir.path("ca.pem")).unwrap()
    );
    // Debug shows the identity, never the key.
    let debug = format!("{tls:?} {ca:?}");
    assert!(
        debug.contains("node1") && debug.contains("Control"),
        "{debug}"
    );
    assert_no_secret(&debug, &node.key_path);
    assert_no_secret(&debug, &dir.path("ca.key"));

    assert_eq!(
        identity_of(tls.cert_der()).unwrap(),
        NodeIdentity {
            name: "node1".into(),
            role: NodeRole::Control
        }
    );
    assert!(matches!(identity_of(tls.ca_der()), Err(CertError::Peer(_))));
    assert!(matches!(identity_of(b"junk"), Err(CertError::Peer(_))));
}

#[test]
fn a_loaded_ca_issues_for_every_role() {
    let (dir, _, _) = setup();
    let ca = CertAuthority::load(&dir.0).unwrap();
    assert_eq!(ca.name(), "Test CA");
    assert_eq!(ca.cert_path(), dir.path("ca.pem"));
    assert_eq!(ca.key_path(), dir.path("ca.key"));
    for role in NodeRole::ALL {
        let name = format!("n-{role}");
        let node = issue(&dir.0, &ca, &name, role, &[]).unwrap();
        let tls = load_tls(&ca.cert_path(), &node.cert_path, &node.key_path).unwrap();
        assert_eq!((tls.name(), tls.role()), (name.as_str(), role));
        assert_eq!(role.as_str().parse::<NodeRole>().unwrap(), role);
    }
    assert!("admin".parse::<NodeRole>().is_err());
    // Re-issuing replaces the files (renewal), still private.
    chmod(&dir.path("node1.key"), 0o644);
    issue(&dir.0, &ca, "node1", NodeRole::Data, &[]).unwrap();
    assert_eq!(mode(&dir.path("node1.key")), 0o600);
    let tls = load_tls(
        &dir.path("ca.pem"),
        &dir.path("node1.pem"),
        &dir.path("node1.key"),
    )
    .unwrap();
    assert_eq!(tls.role(), NodeRole::Data);
}

#[test]
fn an_existing_ca_is_kept_unless_forced() {
    let (dir, _, node) = setup();
    let before = std::fs::read(dir.path("ca.pem")).unwrap();
    let err = generate_ca(&dir.0, "Other").unwrap_err();
    assert!(matches!(err, CertError::Exists { ref path } if *path == dir.path("ca.pem")));
    assert!(err.to_string().contains("refusing to overwrite"), "{err}");
    assert_eq!(std::fs::read(dir.path("ca.pem")).unwrap(), before);
    // Only the key left: still refused.
    let lone = Scratch::new();
    std::fs::create_dir_all(&lone.0).unwrap();
    std::fs::copy(dir.path("ca.key"), lone.path("ca.key")).unwrap();
    assert!(matches!(
        generate_ca(&lone.0, "X"),
        Err(CertError::Exists { ref path }) if *path == lone.path("ca.key")
    ));

    let options = CaOptions {
        force: true,
        days: 30,
        ..CaOptions::new("Replacement")
    };
    let ca = generate_ca_with(&dir.0, &options).unwrap();
    assert_eq!(ca.name(), "Replacement");
    assert_ne!(std::fs::read(dir.path("ca.pem")).unwrap(), before);
    // What the old CA issued no longer verifies.
    let err = load_tls(&dir.path("ca.pem"), &node.cert_path, &node.key_path).unwrap_err();
    assert!(matches!(err, CertError::NotSignedByCa { .. }), "{err}");
    // A node certificate cannot outlive its 30-day CA.
    let err = issue(&dir.0, &ca, "node2", NodeRole::Data, &[]).unwrap_err();
    assert!(err.to_string().contains("outlive the CA"), "{err}");
}

#[test]
fn a_key_of_another_node_is_refused() {
    let (dir, ca, node1) = setup();
    let node2 = issue(&dir.0, &ca, "node2", NodeRole::Data, &[]).unwrap();
    let err = load_tls(&dir.path("ca.pem"), &node1.cert_path, &node2.key_path).unwrap_err();
    assert!(
        matches!(err, CertError::KeyMismatch { ref key, ref cert }
            if *key == node2.key_path && *cert == node1.cert_path),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("node2.key") && msg.contains("does not match"),
        "{msg}"
    );
    assert_no_secret(&msg, &node2.key_path);
    // The CA key is checked against the CA certificate likewise.
    std::fs::copy(&node2.key_path, dir.path("ca.key")).unwrap();
    assert!(matches!(
        CertAuthority::load(&dir.0),
        Err(CertError::KeyMismatch { .. })
    ));
}

#[test]
fn a_certificate_of_another_ca_is_refused() {
    let (dir, _, _) = setup();
    let other = Scratch::new();
    let other_ca = generate_ca(&other.0, "Test CA").unwrap();
    let stranger = issue(&other.0, &other_ca, "node1", NodeRole::Control, &[]).unwrap();
    let err = load_tls(&dir.path("ca.pem"), &stranger.cert_path, &stranger.key_path).unwrap_err();
    assert!(
        matches!(err, CertError::NotSignedByCa { ref path, ref ca }
            if *path == stranger.cert_path && *ca == dir.path("ca.pem")),
        "{err}"
    );
    assert!(err.to_string().contains("not signed by the CA"), "{err}");
    // A node certificate is not a CA.
    let err = load_tls(
        &dir.path("node1.pem"),
        &dir.path("node1.pem"),
        &dir.path("node1.key"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("not a CA certificate"), "{err}");
}

#[test]
fn an_expired_or_future_certificate_is_refused() {
    let (dir, ca, _) = setup();
    let day = Duration::from_secs(SECONDS_PER_DAY);
    let now = SystemTime::now();
    let mut request = NodeRequest::new("old", NodeRole::Steer).unwrap();
    request.validity = Validity {
        not_before: now - 10 * day,
        not_after: now - day,
    };
    let old = issue_with(&dir.0, &ca, &request).unwrap();
    let err = load_tls(&dir.path("ca.pem"), &old.cert_path, &old.key_path).unwrap_err();
    assert!(matches!(err, CertError::Expired { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("old.pem: certificate expired at 20"),
        "{err}"
    );
    assert!(describe(&old.cert_path)
        .unwrap()
        .to_string()
        .contains("(EXPIRED)"));

    request.name = "future".into();
    request.validity = Validity {
        not_before: now + day,
        not_after: now + 2 * day,
    };
    let future = issue_with(&dir.0, &ca, &request).unwrap();
    let err = load_tls(&dir.path("ca.pem"), &future.cert_path, &future.key_path).unwrap_err();
    assert!(matches!(err, CertError::NotYetValid { .. }), "{err}");

    request.validity = Validity {
        not_before: now,
        not_after: now,
    };
    assert!(matches!(
        issue_with(&dir.0, &ca, &request),
        Err(CertError::Request(_))
    ));
}

#[test]
fn a_key_other_users_may_read_is_refused() {
    let (dir, _, node) = setup();
    for bad in [0o644, 0o604, 0o660, 0o666, 0o601] {
        chmod(&node.key_path, bad);
        let err = load_tls(&dir.path("ca.pem"), &node.cert_path, &node.key_path).unwrap_err();
        assert!(
            matches!(err, CertError::InsecureKey { mode, .. } if mode == bad),
            "{bad:o}: {err}"
        );
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }
    // Owner-only and group-readable keys are fine.
    for good in [0o600, 0o400, 0o640, 0o440] {
        chmod(&node.key_path, good);
        load_tls(&dir.path("ca.pem"), &node.cert_path, &node.key_path).unwrap();
    }
    chmod(&dir.path("ca.key"), 0o644);
    assert!(matches!(
        CertAuthority::load(&dir.0),
        Err(CertError::InsecureKey { .. })
    ));
}

#[test]
fn missing_and_malformed_files_are_named() {
    let (dir, _, node) = setup();
    let ca = dir.path("ca.pem");
    let check = |cert: &Path, key: &Path, expect: &str| {
        let err = load_tls(&ca, cert, key).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(expect), "{msg:?} lacks {expect:?}");
        assert_no_secret(&msg, &node.key_path);
        err
    };

    let err = check(&dir.path("nope.pem"), &node.key_path, "nope.pem: not found");
    assert!(matches!(err, CertError::Missing { .. }));
    check(
        &node.cert_path,
        &dir.path("nope.key"),
        "nope.key: not found",
    );

    let garbage = dir.path("garbage.pem");
    std::fs::write(&garbage, "hello, world\n").unwrap();
    let err = check(
        &garbage,
        &node.key_path,
        "garbage.pem: not PEM: no PEM block found",
    );
    assert!(matches!(err, CertError::NotPem { .. }));

    std::fs::write(&garbage, [0x30u8, 0x82, 0xff, 0xfe, 0x00]).unwrap();
    check(&garbage, &node.key_path, "not text");

    let pem = std::fs::read_to_string(&node.cert_path).unwrap();
    let truncated: String = pem.lines().take(4).map(|l| format!("{l}\n")).collect();
    std::fs::write(&garbage, &truncated).unwrap();
    check(&garbage, &node.key_path, "BEGIN CERTIFICATE without END");

    let mut lines: Vec<&str> = pem.lines().collect();
    let body = lines.len() - 2;
    let short = &lines[body][..lines[body].len() - 1];
    let short = short.to_owned();
    lines[body] = &short;
    std::fs::write(&garbage, lines.join("\n")).unwrap();
    check(&garbage, &node.key_path, "truncated base64");

    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let err = check(&garbage, &node.key_path, "garbage.pem: invalid certificate");
    assert!(matches!(err, CertError::Invalid { .. }));

    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\naGVsbG8*d29ybGQ=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    check(&garbage, &node.key_path, "line 2: invalid base64 character");

    // Two certificates: chains are not supported.
    std::fs::write(&garbage, format!("{pem}{pem}")).unwrap();
    check(&garbage, &node.key_path, "2 CERTIFICATE blocks");

    // Key and certificate swapped: named, and the key not shown.
    chmod(&garbage, 0o600);
    std::fs::copy(&node.key_path, &garbage).unwrap();
    check(
        &garbage,
        &node.cert_path,
        "garbage.pem: not PEM: no `-----BEGIN CERTIFICATE-----` block (found: PRIVATE KEY)",
    );
    let cert_as_key = dir.path("cert-as.key");
    std::fs::copy(&node.cert_path, &cert_as_key).unwrap();
    chmod(&cert_as_key, 0o600);
    let err = check(
        &node.cert_path,
        &cert_as_key,
        "no PKCS#8 `-----BEGIN PRIVATE KEY-----` block",
    );
    assert!(matches!(err, CertError::NotPem { .. }));
    let err = describe(&node.key_path).unwrap_err();
    assert_no_secret(&err.to_string(), &node.key_path);

    // A garbage key.
    let bad_key = dir.path("bad.key");
    std::fs::write(
        &bad_key,
        "-----BEGIN PRIVATE KEY-----\naGVsbG8gd29ybGQ=\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    chmod(&bad_key, 0o600);
    check(
        &node.cert_path,
        &bad_key,
        "bad.key: not a usable PKCS#8 private key",
    );
    // An encrypted key.
    std::fs::write(
        &bad_key,
        "-----BEGIN PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n\naGVsbG8gd29ybGQ=\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    check(&node.cert_path, &bad_key, "encrypted key");
    // A directory.
    check(&dir.0, &node.key_path, "not a regular file");
}

/// Signs `params` for a fresh key with the CA, as another tool might; returns the files.
fn sign_custom(
    dir: &Scratch,
    ca: &CertAuthority,
    stem: &str,
    params: CertificateParams,
) -> (PathBuf, PathBuf) {
    let key = new_key().unwrap();
    let issuer = Issuer::from_ca_cert_der(&ca.cert_der.as_slice().into(), &*ca.key).unwrap();
    let cert = params.signed_by(&*key, &issuer).unwrap();
    let cert_path = dir.path(&format!("{stem}.pem"));
    let key_path = dir.path(&format!("{stem}.key"));
    write_atomic(
        &cert_path,
        pem_encode(CERT_LABEL, cert.der()).as_bytes(),
        0o644,
    )
    .unwrap();
    write_atomic(
        &key_path,
        pem_encode(KEY_LABEL, &key.serialize_der()).as_bytes(),
        0o600,
    )
    .unwrap();
    (cert_path, key_path)
}

fn node_params(
    cn: &str,
    ou: Option<&str>,
    ekus: Vec<ExtendedKeyUsagePurpose>,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    if let Some(ou) = ou {
        dn.push(DnType::OrganizationalUnitName, ou);
    }
    params.distinguished_name = dn;
    params.extended_key_usages = ekus;
    params.not_before = OffsetDateTime::now_utc() - time::Duration::hours(1);
    params.not_after = OffsetDateTime::now_utc() + time::Duration::days(1);
    params
}

#[test]
fn node_certificates_need_both_usages_and_a_role() {
    let (dir, ca, _) = setup();
    let both = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cases = [
        (
            "server-only",
            node_params("a", Some("data"), vec![ExtendedKeyUsagePurpose::ServerAuth]),
            "lacks extendedKeyUsage serverAuth and clientAuth",
        ),
        (
            "no-eku",
            node_params("a", Some("data"), vec![]),
            "lacks extendedKeyUsage",
        ),
        (
            "no-role",
            node_params("a", None, both.clone()),
            "no OU with the node's role",
        ),
        (
            "bad-role",
            node_params("a", Some("admin"), both.clone()),
            "OU \"admin\" is not a role",
        ),
        (
            "no-cn",
            {
                let mut p = node_params("a", Some("data"), both.clone());
                p.distinguished_name.remove(DnType::CommonName);
                p
            },
            "no CN",
        ),
    ];
    for (stem, params, expect) in cases {
        let (cert, key) = sign_custom(&dir, &ca, stem, params);
        let err = load_tls(&dir.path("ca.pem"), &cert, &key).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, CertError::Invalid { .. }) && msg.contains(expect),
            "{stem}: {msg}"
        );
        assert!(msg.contains(&format!("{stem}.pem")), "{msg}");
    }
    let (cert, key) = sign_custom(&dir, &ca, "fine", node_params("fine", Some("steer"), both));
    let tls = load_tls(&dir.path("ca.pem"), &cert, &key).unwrap();
    assert_eq!(tls.role(), NodeRole::Steer);
}

#[test]
fn requests_are_checked_before_anything_is_written() {
    let (dir, ca, _) = setup();
    for name in [
        "",
        "ca",
        "CA",
        "../evil",
        "a/b",
        ".hidden",
        "-x",
        "sp ace",
        &"x".repeat(65),
    ] {
        let err = issue(&dir.0, &ca, name, NodeRole::Data, &[]).unwrap_err();
        assert!(matches!(err, CertError::Request(_)), "{name:?}: {err}");
    }
    for dns in [
        "",
        "bad_name",
        "-a.example",
        "a..b",
        "*.example",
        "ünï.example",
    ] {
        let err = issue(
            &dir.0,
            &ca,
            "n",
            NodeRole::Data,
            &[SubjectAltName::Dns(dns.into())],
        )
        .unwrap_err();
        assert!(matches!(err, CertError::Request(_)), "{dns:?}: {err}");
    }
    assert!(!dir.path("n.pem").exists() && !dir.path("n.key").exists());
    assert!(!dir.0.join("..").join("evil.pem").exists());
    for days in [0, MAX_DAYS + 1] {
        assert!(matches!(
            Validity::days_from_now(days),
            Err(CertError::Request(_))
        ));
    }
    let empty = Scratch::new();
    assert!(matches!(
        generate_ca(&empty.0, "  "),
        Err(CertError::Request(_))
    ));
    assert!(matches!(
        generate_ca(&empty.0, "a\nb"),
        Err(CertError::Request(_))
    ));
    assert!(!empty.0.exists(), "nothing created on a bad request");
}

#[test]
fn describe_shows_the_identity_and_no_key() {
    let (dir, _, node) = setup();
    let info = describe(&node.cert_path).unwrap();
    assert_eq!(info.subject, "CN=node1, OU=control");
    assert_eq!(info.role, Some(NodeRole::Control));
    assert_eq!(info.issuer, "CN=Test CA");
    assert_eq!(info.sans, ["IP:127.0.0.1", "IP:::1", "DNS:localhost"]);
    assert!(!info.is_ca);
    assert_eq!(info.key_usage, ["digitalSignature"]);
    assert_eq!(info.extended_key_usage, ["serverAuth", "clientAuth"]);
    assert_eq!(info.key_algorithm, "ECDSA P-256");
    let text = info.to_string();
    for expect in [
        "subject:     CN=node1, OU=control",
        "role:        control",
        "SANs:        IP:127.0.0.1, IP:::1, DNS:localhost",
        "(valid, 36",
        "ext. usage:  serverAuth, clientAuth",
        "CA:          no",
    ] {
        assert!(text.contains(expect), "{expect:?} not in\n{text}");
    }
    let ca = describe(&dir.path("ca.pem")).unwrap();
    assert!(ca.is_ca);
    assert_eq!(ca.key_usage, ["keyCertSign", "cRLSign"]);
    assert!(ca
        .to_string()
        .contains("role:        none (CA certificate)"));
    let days = ca
        .not_after
        .duration_since(SystemTime::now())
        .unwrap()
        .as_secs()
        / SECONDS_PER_DAY;
    assert!((3649..=3650).contains(&days), "{days}");
}
