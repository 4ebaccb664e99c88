//! Tests of `[store]`'s etcd TLS and authentication keys: what a valid set gives, and that each
//! mistake is reported at its line with its key.

use crate::config::{Config, StoreConfig};
use crate::error::Error;
use rpc::certs::{self, NodeRole};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A directory with a CA (`ca.pem`), a client certificate (`node.pem`, `node.key`), a
/// password file (`etcd.password`, mode 0600) and one readable by the group
/// (`open.password`); removed on drop.
struct Files(PathBuf);

impl Files {
    fn new() -> Files {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "protego-etcd-config-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let ca = certs::generate_ca(&dir, "etcd test CA").unwrap();
        certs::issue(&dir, &ca, "node", NodeRole::Control, &[]).unwrap();
        for (name, mode) in [("etcd.password", 0o600), ("open.password", 0o640)] {
            let path = dir.join(name);
            std::fs::write(&path, "pw\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        Files(dir)
    }

    fn parse(&self, store: &str) -> Result<Config, Error> {
        let text = format!("{GATEWAY}\n[store]\n{store}");
        Config::parse(&text, &self.0.join("protego.toml"))
    }

    /// Expects `store`'s error at the line holding `at`, naming `key`, saying `says`.
    fn refused(&self, store: &str, at: &str, key: &str, says: &str) {
        let err = match self.parse(store) {
            Ok(_) => panic!("accepted; expected an error about {key}:\n{store}"),
            Err(Error::Config(e)) => e,
            Err(other) => panic!("unexpected error kind: {other}"),
        };
        let text = format!("{GATEWAY}\n[store]\n{store}");
        let line = text
            .lines()
            .position(|l| l.contains(at))
            .expect("the line is in the text")
            + 1;
        let shown = err.to_string();
        assert_eq!(err.line, line, "wrong line in: {shown}");
        assert_eq!(err.key.as_deref(), Some(key), "wrong key in: {shown}");
        assert!(shown.contains(&format!("protego.toml:{line}:")), "{shown}");
        assert!(shown.contains(says), "{says:?} missing in: {shown}");
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const GATEWAY: &str = "[gateway]\nlisten = [\"198.51.100.1\"]\n";
const HTTPS: &str = "backend = \"etcd\"\nendpoints = [\"https://10.0.0.1:2379\"]\n";
const HTTP: &str = "backend = \"etcd\"\nendpoints = [\"http://10.0.0.1:2379\"]\n";

#[test]
fn tls_and_user_are_read_relative_to_the_file() {
    let files = Files::new();
    let store = format!(
        "{HTTPS}ca = \"ca.pem\"\ncert = \"node.pem\"\nkey = \"node.key\"\nusername = \
         \"protego\"\npassword_file = \"etcd.password\"\n"
    );
    let StoreConfig::Etcd(options) = files.parse(&store).unwrap().store else {
        panic!("not the etcd store");
    };
    let tls = options.access.tls.as_ref().expect("TLS");
    assert!(tls.cert_pem().is_some() && tls.key_pem().is_some());
    let user = options.access.user.as_ref().expect("a user");
    assert_eq!(user.name, "protego");
    assert_eq!(user.password.as_str(), "pw");
    assert_eq!(
        options.access.describe(),
        "TLS, client certificate, user \"protego\""
    );
    // Neither the key nor the password shows in Debug.
    let debug = format!("{options:?}");
    assert!(
        !debug.contains("pw\"") && !debug.contains("PRIVATE"),
        "{debug}"
    );

    // TLS without a client certificate, absolute paths.
    let ca = files.0.join("ca.pem");
    let store = format!("{HTTPS}ca = {:?}\n", ca.display().to_string());
    let StoreConfig::Etcd(options) = files.parse(&store).unwrap().store else {
        panic!("not the etcd store");
    };
    assert!(options.access.tls.unwrap().cert_pem().is_none());
    assert!(options.access.user.is_none());
}

#[test]
fn tls_and_user_mistakes_name_their_key() {
    let f = Files::new();
    f.refused(HTTPS, "endpoints =", "ca", "https:// endpoints need `ca`");
    f.refused(
        "backend = \"etcd\"\nendpoints = [\"https://a:2379\", \"http://b:2379\"]\nca = \"ca.pem\"\n",
        "endpoints =",
        "endpoints",
        "mixes http:// and https://",
    );
    f.refused(
        &format!("{HTTPS}ca = \"ca.pem\"\ncert = \"node.pem\"\n"),
        "cert =",
        "cert",
        "add `key`",
    );
    f.refused(
        &format!("{HTTPS}ca = \"ca.pem\"\nkey = \"node.key\"\n"),
        "key =",
        "key",
        "add `cert`",
    );
    f.refused(
        &format!("{HTTP}ca = \"ca.pem\"\n"),
        "ca =",
        "ca",
        "need https:// endpoints",
    );
    f.refused(
        &format!("{HTTPS}ca = \"missing.pem\"\n"),
        "ca =",
        "ca",
        "missing.pem: not found",
    );
    f.refused(
        &format!("{HTTPS}ca = \"node.pem\"\n"),
        "ca =",
        "ca",
        "not a CA certificate",
    );
    std::fs::set_permissions(f.0.join("node.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    f.refused(
        &format!("{HTTPS}ca = \"ca.pem\"\ncert = \"node.pem\"\nkey = \"node.key\"\n"),
        "key =",
        "key",
        "accessible to other users",
    );
    f.refused(
        &format!("{HTTP}username = \"protego\"\n"),
        "username =",
        "username",
        "needs `password_file`",
    );
    f.refused(
        &format!("{HTTP}password_file = \"etcd.password\"\n"),
        "password_file =",
        "password_file",
        "add `username`",
    );
    f.refused(
        &format!(
            "{HTTPS}ca = \"ca.pem\"\nusername = \"protego\"\npassword_file = \"open.password\"\n"
        ),
        "password_file =",
        "password_file",
        "accessible to other users (mode 0640)",
    );
    f.refused(
        &format!(
            "{HTTPS}ca = \"ca.pem\"\nusername = \"protego\"\npassword_file = \"none.password\"\n"
        ),
        "password_file =",
        "password_file",
        "cannot read",
    );
    f.refused(
        &format!("{HTTPS}ca = \"ca.pem\"\nusername = \"\"\npassword_file = \"etcd.password\"\n"),
        "username =",
        "username",
        "must be an etcd user name",
    );
    f.refused(
        &format!("{HTTP}username = \"protego\"\npassword_file = \"etcd.password\"\n"),
        "username =",
        "username",
        "needs https:// endpoints",
    );
    f.refused(
        "backend = \"file\"\nusername = \"protego\"\n",
        "username =",
        "username",
        "only the \"etcd\" backend",
    );
    assert!(Path::new(&f.0).join("ca.pem").exists());
}
