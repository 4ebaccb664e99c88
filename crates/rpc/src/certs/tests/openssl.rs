//! Interop with openssl: it verifies and reads our certificates, and we load its.

use super::*;

/// `Some("openssl")` if openssl is installed; otherwise the test `test` fails under `make test`
/// and in CI, and skips elsewhere (see `testreq`).
fn openssl(test: &str) -> Option<&'static str> {
    testreq::program(test, "openssl").then_some("openssl")
}

fn run_openssl(args: &[&str], dir: &Path) -> String {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn openssl_verifies_and_reads_our_certificates() {
    let Some(_) = openssl("openssl_verifies_and_reads_our_certificates") else {
        return;
    };
    let (dir, _, _) = setup();
    let out = run_openssl(&["verify", "-CAfile", "ca.pem", "node1.pem"], &dir.0);
    assert_eq!(out.trim(), "node1.pem: OK");
    // Also as TLS server and client certificates.
    for purpose in ["sslserver", "sslclient"] {
        run_openssl(
            &[
                "verify",
                "-purpose",
                purpose,
                "-CAfile",
                "ca.pem",
                "node1.pem",
            ],
            &dir.0,
        );
    }

    let text = run_openssl(&["x509", "-noout", "-text", "-in", "node1.pem"], &dir.0);
    for expect in [
        "Subject: CN = node1, OU = control",
        "Issuer: CN = Test CA",
        "TLS Web Server Authentication, TLS Web Client Authentication",
        "IP Address:127.0.0.1, IP Address:0:0:0:0:0:0:0:1, DNS:localhost",
        "Digital Signature",
        "CA:FALSE",
        "ASN1 OID: prime256v1",
        "ecdsa-with-SHA256",
        "X509v3 Authority Key Identifier",
    ] {
        assert!(text.contains(expect), "{expect:?} not in\n{text}");
    }
    let ca_text = run_openssl(&["x509", "-noout", "-text", "-in", "ca.pem"], &dir.0);
    for expect in [
        "X509v3 Basic Constraints: critical",
        "CA:TRUE, pathlen:0",
        "Certificate Sign, CRL Sign",
    ] {
        assert!(ca_text.contains(expect), "{expect:?} not in\n{ca_text}");
    }
    // The key files are plain PKCS#8 that OpenSSL reads, and match their certificates.
    for stem in ["ca", "node1"] {
        let from_key = run_openssl(&["pkey", "-pubout", "-in", &format!("{stem}.key")], &dir.0);
        let from_cert = run_openssl(
            &["x509", "-noout", "-pubkey", "-in", &format!("{stem}.pem")],
            &dir.0,
        );
        assert_eq!(from_key, from_cert, "{stem}");
    }
}

#[test]
fn certificates_made_by_openssl_load() {
    let Some(_) = openssl("certificates_made_by_openssl_load") else {
        return;
    };
    let dir = Scratch::new();
    std::fs::create_dir_all(&dir.0).unwrap();
    let d = &dir.0;
    run_openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "30",
            "-subj",
            "/O=Example/CN=Their CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        d,
    );
    run_openssl(
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "gw.key",
            "-out",
            "gw.csr",
            "-subj",
            "/CN=gw-7/OU=data",
        ],
        d,
    );
    std::fs::write(
        d.join("ext.cnf"),
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
         extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:10.0.0.7,DNS:gw-7.example\n",
    )
    .unwrap();
    run_openssl(
        &[
            "x509",
            "-req",
            "-in",
            "gw.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "7",
            "-extfile",
            "ext.cnf",
            "-out",
            "gw.pem",
        ],
        d,
    );
    chmod(&d.join("gw.key"), 0o600);
    let tls = load_tls(&d.join("ca.pem"), &d.join("gw.pem"), &d.join("gw.key")).unwrap();
    assert_eq!((tls.name(), tls.role()), ("gw-7", NodeRole::Data));
    let info = describe(&d.join("gw.pem")).unwrap();
    assert_eq!(info.sans, ["IP:10.0.0.7", "DNS:gw-7.example"]);
    // Our tooling issues from their CA too (the CA key is PKCS#8).
    chmod(&d.join("ca.key"), 0o600);
    let ca = CertAuthority::load(d).unwrap();
    assert_eq!(ca.name(), "Their CA");
    let mut request = NodeRequest::new("ctl", NodeRole::Control).unwrap();
    request.validity = Validity::days_from_now(7).unwrap();
    let ours = issue_with(d, &ca, &request).unwrap();
    load_tls(&d.join("ca.pem"), &ours.cert_path, &ours.key_path).unwrap();
    run_openssl(&["verify", "-CAfile", "ca.pem", "ctl.pem"], d);
}
