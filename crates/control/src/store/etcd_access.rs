//! How a Protego node reaches etcd safely: TLS to `https://` endpoints (a CA certificate to verify
//! etcd, and a client certificate for etcd's `--client-cert-auth`) and etcd's user/password
//! authentication. Shared by the [`EtcdStore`](super::EtcdStore), the leader election and the
//! control nodes' address book (the `cluster` crate's `election` and `peers`), so all three
//! connect alike.

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use rpc::certs::ClientTls;
use std::fmt;
use std::io::Read;
use std::path::Path;
use std::time::Duration;
use zeroize::Zeroizing;

/// The longest password file accepted, in bytes.
const MAX_PASSWORD_FILE: u64 = 4096;

/// The error etcd answers a request whose token it no longer knows (it expired, or etcd
/// restarted).
const INVALID_TOKEN: &str = "invalid auth token";
/// The error etcd answers a request whose token predates a change of users, roles or
/// permissions: the client must authenticate again.
const OLD_AUTH_REVISION: &str = "revision of auth store is old";

/// The security of the connections to etcd: TLS, and an etcd user. The default is neither
/// (plain `http://`, no authentication). `Debug` omits the key and the password (theirs do).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// TLS for `https://` endpoints; `None` with `http://` endpoints.
    pub tls: Option<ClientTls>,
    /// The etcd user the node authenticates as; `None` if etcd's authentication is off.
    pub user: Option<EtcdUser>,
}

/// An etcd user and its password (read from a file, see [`read_password_file`]). `Debug` omits
/// the password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUser {
    /// The user name.
    pub name: String,
    /// The password. Secret: never log it.
    pub password: Zeroizing<String>,
}

impl fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl EtcdAccess {
    /// Checks that the endpoints and the TLS settings agree: all `https://` with TLS, or all
    /// `http://` without; the error says what is wrong.
    pub fn check_endpoints(&self, endpoints: &[String]) -> Result<(), String> {
        let https = endpoints
            .iter()
            .filter(|u| u.starts_with("https://"))
            .count();
        if https > 0 && https < endpoints.len() {
            return Err("the endpoints mix http:// and https:// URLs: use https:// for all".into());
        }
        match (&self.tls, https > 0) {
            (None, true) => Err(
                "https:// endpoints need the CA certificate that signed etcd's certificate (ca)"
                    .into(),
            ),
            (Some(_), false) => Err(
                "TLS is configured (ca) but the endpoints are http://: use https:// URLs".into(),
            ),
            _ => Ok(()),
        }
    }

    /// The etcd client's options for these settings: connecting bounded by `timeout`, TLS if
    /// configured, and the user, whose token is fetched again whenever etcd says it expired.
    pub fn connect_options(&self, timeout: Duration) -> ConnectOptions {
        let mut options = ConnectOptions::new().with_connect_timeout(timeout);
        if let Some(tls) = &self.tls {
            let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(tls.ca_pem()));
            if let (Some(cert), Some(key)) = (tls.cert_pem(), tls.key_pem()) {
                config = config.identity(Identity::from_pem(cert, key.as_bytes()));
            }
            options = options.with_tls(config);
        }
        if let Some(user) = &self.user {
            options = options
                .with_user(user.name.clone(), user.password.as_str())
                .with_auto_token_refresh(true);
        }
        options
    }

    /// What the connections to etcd are, for messages: `TLS, client certificate, user
    /// "protego"` or `plain`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(tls) = &self.tls {
            parts.push("TLS");
            if tls.cert_pem().is_some() {
                parts.push("client certificate");
            }
        }
        let mut text = parts.join(", ");
        if let Some(user) = &self.user {
            if !text.is_empty() {
                text.push_str(", ");
            }
            text.push_str(&format!("user {:?}", user.name));
        }
        if text.is_empty() {
            text.push_str("plain");
        }
        text
    }
}

/// Reads an etcd password from `path`: the file's text without its trailing line break. Refused
/// if the file is accessible to its group or other users, empty, not UTF-8, or larger than
/// 4 KiB; the error names the file.
pub fn read_password_file(path: &Path) -> Result<Zeroizing<String>, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown} is not a regular file"));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{shown} is accessible to other users (mode {mode:04o}); refused: restrict it with \
             chmod 600"
        ));
    }
    if meta.len() > MAX_PASSWORD_FILE {
        return Err(format!(
            "{shown} is larger than {MAX_PASSWORD_FILE} bytes: not a password file"
        ));
    }
    // Room for the whole file up front, so reading never leaves an unwiped copy behind.
    let mut bytes = Zeroizing::new(Vec::with_capacity(MAX_PASSWORD_FILE as usize + 1));
    file.take(MAX_PASSWORD_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let text = std::str::from_utf8(&bytes).map_err(|_| format!("{shown} is not UTF-8 text"))?;
    let password = text.strip_suffix('\n').unwrap_or(text);
    let password = password.strip_suffix('\r').unwrap_or(password);
    if password.is_empty() {
        return Err(format!("{shown} is empty"));
    }
    Ok(Zeroizing::new(password.to_owned()))
}

/// Whether etcd refused a request for its auth token (expired, or older than a change of
/// users and roles): a new connection, which authenticates again, may succeed.
pub fn token_refused(detail: &str) -> bool {
    detail.contains(INVALID_TOKEN) || detail.contains(OLD_AUTH_REVISION)
}

/// `detail` (an etcd client error as one line) with what it means for the operator when etcd
/// refused the node's credentials: a wrong user or password, a missing permission, or a TLS
/// handshake etcd or the node refused.
pub fn explain(detail: String) -> String {
    let lower = detail.to_ascii_lowercase();
    let hint = if lower.contains("authentication failed") {
        "authentication failed: etcd refused the user name or password"
    } else if lower.contains("user name is empty") || lower.contains("user name not found") {
        "authentication failed: etcd has authentication on and no user was given (username, \
         password_file)"
    } else if lower.contains("permission denied") {
        "permission denied: etcd refused the request (the etcd user's role must grant read \
         and write under the prefix)"
    } else if lower.contains("certificaterequired")
        || lower.contains("certificate required")
        || lower.contains("bad certificate")
        || lower.contains("badcertificate")
    {
        "TLS handshake refused by etcd: it requires a client certificate it trusts (cert, key)"
    } else if lower.contains("invalid peer certificate") || lower.contains("unknownissuer") {
        "TLS handshake refused: etcd's certificate does not verify with the CA certificate (ca) \
         or does not name the endpoint's host"
    } else if lower.contains("invalid content type")
        || lower.contains("corrupt message")
        || lower.contains("invalidcontenttype")
    {
        "TLS handshake failed: is the endpoint plain http://?"
    } else {
        return detail;
    };
    format!("{hint} ({detail})")
}

/// Whether `detail` (why a request failed) is etcd closing or resetting the connection: with
/// TLS 1.3 that is how a refused handshake shows (the client finished its side before etcd
/// checked its certificate, and the alert is lost under HTTP/2).
pub(crate) fn closed_connection(detail: &str) -> bool {
    [
        "connection closed",
        "connection reset",
        "broken pipe",
        "Connection reset",
    ]
    .iter()
    .any(|text| detail.contains(text))
}

/// Makes a TLS handshake of its own with the `https://` endpoint, as the etcd client does (the
/// same CA, client certificate and ALPN), and reads once: the error if etcd refuses it (e.g.
/// `received fatal alert: CertificateRequired`), `None` if etcd accepts it or the probe cannot
/// tell (unreachable, no answer within `timeout`). Runs on a thread of its own so that a slow
/// name lookup costs the caller at most `timeout`.
pub(crate) fn probe_tls(endpoint: &str, tls: &ClientTls, timeout: Duration) -> Option<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (endpoint, tls) = (endpoint.to_owned(), tls.clone());
    std::thread::Builder::new()
        .name("etcd-tls-probe".into())
        .spawn(move || {
            let _ = tx.send(handshake(&endpoint, &tls, timeout));
        })
        .ok()?;
    rx.recv_timeout(timeout).ok().flatten()
}

/// See [`probe_tls`].
fn handshake(endpoint: &str, tls: &ClientTls, timeout: Duration) -> Option<String> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use std::net::{TcpStream, ToSocketAddrs};
    use std::sync::Arc;
    let authority = endpoint.strip_prefix("https://")?.split('/').next()?;
    let addr = authority.to_socket_addrs().ok()?.next()?;
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_owned()).ok()?;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(tls.ca_der().to_vec()))
        .ok()?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    let mut config = match tls.identity_der() {
        Some((cert, key)) => {
            let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.to_vec()));
            builder
                .with_client_auth_cert(vec![CertificateDer::from(cert.to_vec())], key)
                .ok()?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let mut connection = rustls::ClientConnection::new(Arc::new(config), name).ok()?;
    let mut socket = TcpStream::connect_timeout(&addr, timeout).ok()?;
    socket.set_read_timeout(Some(timeout)).ok()?;
    socket.set_write_timeout(Some(timeout)).ok()?;
    // Reading drives the handshake; then etcd either sends its HTTP/2 settings or an alert.
    let mut stream = rustls::Stream::new(&mut connection, &mut socket);
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Some(e.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn password_file_is_read_without_its_line_break_and_must_be_private() {
        let scratch = crate::store::keyring::tests::tempdir::Dir::new("etcd-access");
        let dir = scratch.path();
        let path = dir.join("etcd.password");
        std::fs::write(&path, "s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_password_file(&path).unwrap().as_str(), "s3cret");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read_password_file(&path).unwrap_err();
        assert!(e.contains("accessible to other users (mode 0640)"), "{e}");
        std::fs::write(&path, "\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(read_password_file(&path).unwrap_err().contains("is empty"));
        let missing = read_password_file(&dir.join("nope")).unwrap_err();
        assert!(
            missing.contains("cannot read") && missing.contains("nope"),
            "{missing}"
        );
    }

    #[test]
    fn endpoints_and_tls_must_agree() {
        let plain = EtcdAccess::default();
        let http = vec!["http://a:2379".to_owned()];
        let https = vec!["https://a:2379".to_owned()];
        let mixed = vec!["https://a:2379".to_owned(), "http://b:2379".to_owned()];
        assert!(plain.check_endpoints(&http).is_ok());
        assert!(plain.check_endpoints(&https).unwrap_err().contains("(ca)"));
        assert!(plain.check_endpoints(&mixed).unwrap_err().contains("mix"));
        assert_eq!(plain.describe(), "plain");
    }

    #[test]
    fn refusals_are_explained() {
        let auth = explain(
            "InvalidArgument: etcdserver: authentication failed, invalid user ID or password"
                .into(),
        );
        assert!(auth.starts_with("authentication failed: "), "{auth}");
        let tls = explain("transport error: received fatal alert: CertificateRequired".into());
        assert!(tls.starts_with("TLS handshake refused by etcd"), "{tls}");
        assert_eq!(explain("Unavailable".into()), "Unavailable");
        assert!(token_refused(
            "Unauthenticated: etcdserver: invalid auth token"
        ));
        assert!(!token_refused("Unavailable"));
    }
}
