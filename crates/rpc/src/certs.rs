//! Certificates for mutual TLS between Protego's processes (`protego control`, `protego data`,
//! `protego steer`, which talk gRPC to each other): a development CA, node certificates, and
//! loading and checking them for the TLS layer ([`load_tls`]).
//!
//! # Files
//! A certificate directory holds:
//! - `ca.pem`: the CA certificate (one PEM `CERTIFICATE` block), the trust anchor every node
//!   gets;
//! - `ca.key`: the CA's private key (PKCS#8 PEM `PRIVATE KEY`, mode 0600), needed only to issue
//!   certificates: keep it off the nodes;
//! - `<node>.pem` and `<node>.key` (mode 0600): a node's certificate and private key.
//!
//! # What a node certificate says
//! - subject `CN=<node name>, OU=<role>`, the role one of `control`, `data`, `steer`
//!   ([`NodeRole`]): once the TLS handshake has verified the peer's chain, [`identity_of`] reads
//!   both from the peer's certificate so the receiver can decide what that role may do;
//! - an ECDSA P-256 key, signed ECDSA-with-SHA256 by the CA;
//! - keyUsage digitalSignature; extendedKeyUsage serverAuth and clientAuth (every node is both
//!   a client and a server); basicConstraints CA:FALSE;
//! - subjectAltName: the IP addresses and DNS names peers use to reach the node (TLS clients
//!   match the server name against these, never against the CN);
//! - validity: one year by default ([`DEFAULT_NODE_DAYS`]), never past the CA's.
//!
//! The CA is `CN=<CA name>` with basicConstraints CA:TRUE, pathlen 0 (it signs node
//! certificates only), keyUsage keyCertSign and cRLSign, valid ten years by default.
//!
//! The CA made here is for development and tests: production deployments should use their own
//! PKI, issuing certificates with the same subject layout and extended key usages, which
//! [`load_tls`] accepts alike.
//!
//! Private keys are kept in [`Zeroizing`] buffers and are never logged or printed; a key file
//! that other users may read is refused.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use zeroize::Zeroizing;

mod pem;
use pem::{pem_decode, pem_encode};

#[cfg(test)]
mod tests;

/// File name of the CA certificate in a certificate directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA private key in a certificate directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// Common name of the CA when none is given.
pub const DEFAULT_CA_NAME: &str = "Protego development CA";
/// Validity of a new CA, in days (about ten years).
pub const DEFAULT_CA_DAYS: u32 = 3650;
/// Validity of a new node certificate, in days.
pub const DEFAULT_NODE_DAYS: u32 = 365;
/// The longest validity accepted, in days (about a hundred years).
pub const MAX_DAYS: u32 = 36_500;

/// New certificates start this much in the past, so that a peer whose clock is a little behind
/// accepts them at once.
const BACKDATE: Duration = Duration::from_secs(300);
/// Upper bound of a CN (RFC 5280 ub-common-name); also bounds node names.
const MAX_NAME_LEN: usize = 64;
/// Certificate and key files larger than this are refused unread.
const MAX_FILE_LEN: u64 = 1 << 20;
/// PEM label of certificates.
const CERT_LABEL: &str = "CERTIFICATE";
/// PEM label of PKCS#8 private keys.
const KEY_LABEL: &str = "PRIVATE KEY";
const SECONDS_PER_DAY: u64 = 86_400;

/// What went wrong with a certificate, a key, or their files. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The file does not exist.
    #[error("{}: not found", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The file exists but could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file or directory could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file would overwrite an existing CA.
    #[error("{} already exists: refusing to overwrite the CA", path.display())]
    Exists {
        /// The existing file.
        path: PathBuf,
    },
    /// The file is not PEM, or lacks the expected PEM block.
    #[error("{}: not PEM: {reason}", path.display())]
    NotPem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file is PEM, but its certificate or key does not parse or is not acceptable.
    #[error("{}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A private key file is accessible to other users.
    #[error(
        "{}: private key is accessible to other users (mode {mode:04o}); refused: restrict it \
         with chmod 600",
        path.display()
    )]
    InsecureKey {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The private key does not belong to the certificate.
    #[error("{}: private key does not match the certificate {}", key.display(), cert.display())]
    KeyMismatch {
        /// The key file.
        key: PathBuf,
        /// The certificate file.
        cert: PathBuf,
    },
    /// The certificate's validity ended.
    #[error("{}: certificate expired at {not_after}", path.display())]
    Expired {
        /// The certificate file.
        path: PathBuf,
        /// End of its validity (RFC 3339).
        not_after: String,
    },
    /// The certificate's validity has not started yet.
    #[error("{}: certificate not valid before {not_before}", path.display())]
    NotYetValid {
        /// The certificate file.
        path: PathBuf,
        /// Start of its validity (RFC 3339).
        not_before: String,
    },
    /// The certificate was not issued by the CA.
    #[error("{}: not signed by the CA in {}", path.display(), ca.display())]
    NotSignedByCa {
        /// The certificate file.
        path: PathBuf,
        /// The CA certificate file.
        ca: PathBuf,
    },
    /// The request (a name, a SAN, a validity) is not acceptable; nothing was written.
    #[error("{0}")]
    Request(String),
    /// A peer's certificate (DER, from a TLS handshake) lacks a usable identity.
    #[error("peer certificate: {0}")]
    Peer(String),
    /// Key generation or signing failed.
    #[error("cannot {what}: {reason}")]
    Generate {
        /// What was being made.
        what: &'static str,
        /// The library's reason.
        reason: String,
    },
}

/// The role of a node, carried in its certificate as the subject's `OU`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeRole {
    /// `protego control`: the control plane.
    Control,
    /// `protego data`: a data plane node.
    Data,
    /// `protego steer`: a traffic steering node.
    Steer,
}

impl NodeRole {
    /// Every role.
    pub const ALL: [NodeRole; 3] = [NodeRole::Control, NodeRole::Data, NodeRole::Steer];

    /// The role's name as written in certificates (`OU=<name>`) and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeRole::Control => "control",
            NodeRole::Data => "data",
            NodeRole::Steer => "steer",
        }
    }
}

impl fmt::Display for NodeRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for NodeRole {
    type Err = CertError;

    fn from_str(s: &str) -> Result<Self, CertError> {
        NodeRole::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                CertError::Request(format!(
                    "unknown role {s:?}: expected control, data or steer"
                ))
            })
    }
}

/// A subject alternative name: how peers address a node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SubjectAltName {
    /// An IP address (`--ip`).
    Ip(IpAddr),
    /// A DNS name (`--dns`).
    Dns(String),
}

impl fmt::Display for SubjectAltName {
    /// `IP:ADDRESS` or `DNS:NAME`, as OpenSSL writes them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubjectAltName::Ip(ip) => write!(f, "IP:{ip}"),
            SubjectAltName::Dns(name) => write!(f, "DNS:{name}"),
        }
    }
}

/// The validity period of a new certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Start (stored with one-second precision).
    pub not_before: SystemTime,
    /// End (stored with one-second precision).
    pub not_after: SystemTime,
}

impl Validity {
    /// From five minutes ago (to tolerate peers whose clock is slightly behind) to `days` days
    /// from now; `days` must be 1 to [`MAX_DAYS`].
    pub fn days_from_now(days: u32) -> Result<Self, CertError> {
        if !(1..=MAX_DAYS).contains(&days) {
            return Err(CertError::Request(format!(
                "validity of {days} days: expected 1 to {MAX_DAYS}"
            )));
        }
        let now = SystemTime::now();
        let not_after = now
            .checked_add(Duration::from_secs(u64::from(days) * SECONDS_PER_DAY))
            .ok_or_else(|| CertError::Request(format!("validity of {days} days overflows")))?;
        Ok(Validity {
            not_before: now.checked_sub(BACKDATE).unwrap_or(now),
            not_after,
        })
    }
}

/// Options of [`generate_ca_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaOptions {
    /// The CA's common name.
    pub name: String,
    /// Validity in days, 1 to [`MAX_DAYS`].
    pub days: u32,
    /// Replace an existing `ca.pem`/`ca.key` (certificates the old CA issued stop verifying).
    pub force: bool,
}

impl CaOptions {
    /// A CA named `name`, valid [`DEFAULT_CA_DAYS`] days, not overwriting an existing one.
    pub fn new(name: impl Into<String>) -> Self {
        CaOptions {
            name: name.into(),
            days: DEFAULT_CA_DAYS,
            force: false,
        }
    }
}

impl Default for CaOptions {
    fn default() -> Self {
        CaOptions::new(DEFAULT_CA_NAME)
    }
}

/// A CA able to issue node certificates: its certificate and private key, loaded from or
/// written to a certificate directory. `Debug` omits the key.
pub struct CertAuthority {
    dir: PathBuf,
    name: String,
    cert_der: Vec<u8>,
    key: Zeroizing<KeyPair>,
    not_after: SystemTime,
}

impl fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertAuthority")
            .field("dir", &self.dir)
            .field("name", &self.name)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl CertAuthority {
    /// Loads `dir/ca.pem` and `dir/ca.key`, checking that the certificate is a CA within its
    /// validity, that the key matches it, and that the key file is private.
    pub fn load(dir: &Path) -> Result<Self, CertError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let cert_der = read_pem(&cert_path, CERT_LABEL, false)?;
        let cert = parse_cert(&cert_path, &cert_der)?;
        check_ca(&cert_path, &cert)?;
        check_time(&cert_path, &cert)?;
        let name = single_attr(cert.subject().iter_common_name(), "CN")
            .map_err(|reason| invalid(&cert_path, &reason))?
            .ok_or_else(|| invalid(&cert_path, "the CA's subject has no CN"))?;
        let not_after = SystemTime::from(cert.validity().not_after.to_datetime());
        let key = load_key(&key_path, &cert_path, &cert)?;
        let cert_der = cert_der.to_vec();
        Ok(CertAuthority {
            dir: dir.to_owned(),
            name,
            cert_der,
            key,
            not_after,
        })
    }

    /// The CA's common name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The CA certificate file (`DIR/ca.pem`).
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join(CA_CERT_FILE)
    }

    /// The CA key file (`DIR/ca.key`).
    pub fn key_path(&self) -> PathBuf {
        self.dir.join(CA_KEY_FILE)
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// End of the CA's validity.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }
}

/// Creates a CA named `name` valid [`DEFAULT_CA_DAYS`] days in `dir` (created, mode 0700, if
/// missing): `ca.pem` and `ca.key` (mode 0600). Refuses to overwrite an existing CA.
pub fn generate_ca(dir: &Path, name: &str) -> Result<CertAuthority, CertError> {
    generate_ca_with(dir, &CaOptions::new(name))
}

/// Creates a CA in `dir` as [`generate_ca`] does, with the validity and overwrite policy of
/// `options`.
pub fn generate_ca_with(dir: &Path, options: &CaOptions) -> Result<CertAuthority, CertError> {
    check_ca_name(&options.name)?;
    let validity = Validity::days_from_now(options.days)?;
    let cert_path = dir.join(CA_CERT_FILE);
    let key_path = dir.join(CA_KEY_FILE);
    if !options.force {
        for path in [&cert_path, &key_path] {
            if path.symlink_metadata().is_ok() {
                return Err(CertError::Exists { path: path.clone() });
            }
        }
    }
    make_dir(dir)?;

    let key = new_key()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, options.name.as_str());
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = OffsetDateTime::from(validity.not_before);
    params.not_after = OffsetDateTime::from(validity.not_after);
    let cert = params
        .self_signed(&*key)
        .map_err(|e| generate_error("sign the CA certificate", e))?;

    let key_pem = pem_encode(KEY_LABEL, &Zeroizing::new(key.serialize_der()));
    write_atomic(&key_path, key_pem.as_bytes(), 0o600)?;
    write_atomic(
        &cert_path,
        pem_encode(CERT_LABEL, cert.der()).as_bytes(),
        0o644,
    )?;
    Ok(CertAuthority {
        dir: dir.to_owned(),
        name: options.name.clone(),
        cert_der: cert.der().to_vec(),
        key,
        not_after: truncate_to_seconds(validity.not_after),
    })
}

/// What a node certificate is made for: see [`issue_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRequest {
    /// The node's name: the certificate's CN and the files' stem. 1 to 64 of `A-Z a-z 0-9 . _ -`,
    /// starting with a letter or digit; `ca` is reserved.
    pub name: String,
    /// The node's role (the certificate's OU).
    pub role: NodeRole,
    /// Addresses and names peers reach the node by.
    pub sans: Vec<SubjectAltName>,
    /// Validity; must end no later than the CA's.
    pub validity: Validity,
}

impl NodeRequest {
    /// A certificate for `name` in `role`, no SANs, valid [`DEFAULT_NODE_DAYS`] days from now.
    pub fn new(name: impl Into<String>, role: NodeRole) -> Result<Self, CertError> {
        Ok(NodeRequest {
            name: name.into(),
            role,
            sans: Vec::new(),
            validity: Validity::days_from_now(DEFAULT_NODE_DAYS)?,
        })
    }
}

/// A node certificate written by [`issue`] or [`issue_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCert {
    /// `DIR/<name>.pem`.
    pub cert_path: PathBuf,
    /// `DIR/<name>.key` (mode 0600).
    pub key_path: PathBuf,
    /// End of the certificate's validity.
    pub not_after: SystemTime,
}

/// Issues a certificate for node `node_name` in `role`, valid [`DEFAULT_NODE_DAYS`] days, with
/// the given SANs, signed by `ca`: writes `dir/<node_name>.pem` and `dir/<node_name>.key`
/// (mode 0600), replacing earlier ones (renewal).
pub fn issue(
    dir: &Path,
    ca: &CertAuthority,
    node_name: &str,
    role: NodeRole,
    sans: &[SubjectAltName],
) -> Result<IssuedCert, CertError> {
    let mut request = NodeRequest::new(node_name, role)?;
    request.sans = sans.to_vec();
    issue_with(dir, ca, &request)
}

/// Issues a node certificate as `request` says, signed by `ca`, into `dir` (created, mode 0700,
/// if missing) as [`issue`] does.
pub fn issue_with(
    dir: &Path,
    ca: &CertAuthority,
    request: &NodeRequest,
) -> Result<IssuedCert, CertError> {
    check_node_name(&request.name)?;
    let Validity {
        not_before,
        not_after,
    } = request.validity;
    if not_before < SystemTime::UNIX_EPOCH {
        return Err(CertError::Request(
            "the validity must start after 1970".into(),
        ));
    }
    if not_after <= not_before {
        return Err(CertError::Request(
            "the validity must end after it starts".into(),
        ));
    }
    if truncate_to_seconds(not_after) > ca.not_after {
        return Err(CertError::Request(format!(
            "the certificate would outlive the CA, which expires at {}: ask for fewer days",
            rfc3339(ca.not_after)
        )));
    }
    let mut sans = Vec::with_capacity(request.sans.len());
    for san in &request.sans {
        sans.push(match san {
            SubjectAltName::Ip(ip) => SanType::IpAddress(*ip),
            SubjectAltName::Dns(name) => {
                check_dns_name(name)?;
                SanType::DnsName(
                    name.clone().try_into().map_err(|_| {
                        CertError::Request(format!("DNS name {name:?} is not ASCII"))
                    })?,
                )
            }
        });
    }
    make_dir(dir)?;

    let key = new_key()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, request.name.as_str());
    dn.push(DnType::OrganizationalUnitName, request.role.as_str());
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.subject_alt_names = sans;
    params.use_authority_key_identifier_extension = true;
    params.not_before = OffsetDateTime::from(not_before);
    params.not_after = OffsetDateTime::from(not_after);
    let issuer = Issuer::from_ca_cert_der(&ca.cert_der.as_slice().into(), &*ca.key)
        .map_err(|e| generate_error("read the CA certificate", e))?;
    let cert = params
        .signed_by(&*key, &issuer)
        .map_err(|e| generate_error("sign the node certificate", e))?;

    let cert_path = dir.join(format!("{}.pem", request.name));
    let key_path = dir.join(format!("{}.key", request.name));
    let key_pem = pem_encode(KEY_LABEL, &Zeroizing::new(key.serialize_der()));
    write_atomic(&key_path, key_pem.as_bytes(), 0o600)?;
    write_atomic(
        &cert_path,
        pem_encode(CERT_LABEL, cert.der()).as_bytes(),
        0o644,
    )?;
    Ok(IssuedCert {
        cert_path,
        key_path,
        not_after: truncate_to_seconds(not_after),
    })
}

/// A node's validated TLS material, as a TLS layer takes it: the CA certificate to trust for
/// peers, the node's certificate and private key, and the identity the certificate carries.
/// `Debug` omits the key.
pub struct NodeTls {
    ca_der: Vec<u8>,
    cert_der: Vec<u8>,
    key_der: Zeroizing<Vec<u8>>,
    name: String,
    role: NodeRole,
    not_after: SystemTime,
}

impl fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTls")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl NodeTls {
    /// The CA certificate (the trust anchor for peers), DER.
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    /// The node's certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The node's private key, PKCS#8 DER. Secret: never log it.
    pub fn key_der(&self) -> &Zeroizing<Vec<u8>> {
        &self.key_der
    }

    /// The CA certificate, PEM (for TLS libraries that take PEM).
    pub fn ca_pem(&self) -> String {
        pem_encode(CERT_LABEL, &self.ca_der).to_string()
    }

    /// The node's certificate, PEM.
    pub fn cert_pem(&self) -> String {
        pem_encode(CERT_LABEL, &self.cert_der).to_string()
    }

    /// The node's private key, PKCS#8 PEM. Secret: never log it.
    pub fn key_pem(&self) -> Zeroizing<String> {
        pem_encode(KEY_LABEL, &self.key_der)
    }

    /// The node's name (its certificate's CN).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's role (its certificate's OU).
    pub fn role(&self) -> NodeRole {
        self.role
    }

    /// End of the node certificate's validity.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }
}

/// Reads and validates a node's TLS files: the CA certificate `ca_path` (a CA within its
/// validity), the node certificate `cert_path` (signed by that CA, within its validity, with
/// extendedKeyUsage serverAuth and clientAuth, subject `CN=<name>, OU=<role>`), and the private
/// key `key_path` (PKCS#8, not accessible to other users, matching the certificate).
///
/// Each file holds exactly one PEM block of its kind (`CERTIFICATE`, or PKCS#8 `PRIVATE KEY`);
/// certificate chains are not supported.
pub fn load_tls(ca_path: &Path, cert_path: &Path, key_path: &Path) -> Result<NodeTls, CertError> {
    let ca_der = read_pem(ca_path, CERT_LABEL, false)?;
    let ca = parse_cert(ca_path, &ca_der)?;
    check_ca(ca_path, &ca)?;
    check_time(ca_path, &ca)?;

    let cert_der = read_pem(cert_path, CERT_LABEL, false)?;
    let cert = parse_cert(cert_path, &cert_der)?;
    if cert.issuer().as_raw() != ca.subject().as_raw()
        || cert.verify_signature(Some(ca.public_key())).is_err()
    {
        return Err(CertError::NotSignedByCa {
            path: cert_path.to_owned(),
            ca: ca_path.to_owned(),
        });
    }
    check_time(cert_path, &cert)?;
    let identity = node_identity(&cert).map_err(|reason| invalid(cert_path, &reason))?;
    let key = load_key(key_path, cert_path, &cert)?;
    let key_der = Zeroizing::new(key.serialize_der());
    Ok(NodeTls {
        ca_der: ca_der.to_vec(),
        cert_der: cert_der.to_vec(),
        key_der,
        name: identity.name,
        role: identity.role,
        not_after: SystemTime::from(cert.validity().not_after.to_datetime()),
    })
}

/// TLS material of a client of a service outside Protego's own PKI (the etcd store): the CA
/// certificate the service's certificate must chain to and, optionally, a client certificate
/// and its private key. `Debug` omits the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    ca_der: Vec<u8>,
    identity: Option<(Vec<u8>, Zeroizing<Vec<u8>>)>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_certificate", &self.identity.is_some())
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// The CA certificate, DER.
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    /// The client certificate, DER, and its private key, PKCS#8 DER (secret: never log it), if
    /// there are.
    pub fn identity_der(&self) -> Option<(&[u8], &Zeroizing<Vec<u8>>)> {
        self.identity
            .as_ref()
            .map(|(cert, key)| (cert.as_slice(), key))
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        pem_encode(CERT_LABEL, &self.ca_der).to_string()
    }

    /// The client certificate, PEM, if there is one.
    pub fn cert_pem(&self) -> Option<String> {
        let (cert, _) = self.identity.as_ref()?;
        Some(pem_encode(CERT_LABEL, cert).to_string())
    }

    /// The client's private key, PKCS#8 PEM, if there is one. Secret: never log it.
    pub fn key_pem(&self) -> Option<Zeroizing<String>> {
        let (_, key) = self.identity.as_ref()?;
        Some(pem_encode(KEY_LABEL, key))
    }
}

/// Reads the TLS files of a client of a service outside Protego's PKI (the etcd store): the
/// CA certificate `ca_path` (a CA within its validity) and, if `identity` names them, a client
/// certificate (within its validity) and its private key (PKCS#8, not accessible to other
/// users, matching the certificate).
///
/// Unlike [`load_tls`], the client certificate's subject is not checked (the service decides
/// what it means), and it need not be signed by `ca_path`'s CA (the service may trust another
/// CA for its clients). Each file holds exactly one PEM block of its kind; chains are not
/// supported.
pub fn load_client_tls(
    ca_path: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientTls, CertError> {
    let ca_der = read_pem(ca_path, CERT_LABEL, false)?;
    let ca = parse_cert(ca_path, &ca_der)?;
    check_ca(ca_path, &ca)?;
    check_time(ca_path, &ca)?;
    let identity = match identity {
        None => None,
        Some((cert_path, key_path)) => {
            let cert_der = read_pem(cert_path, CERT_LABEL, false)?;
            let cert = parse_cert(cert_path, &cert_der)?;
            if cert.is_ca() {
                return Err(invalid(
                    cert_path,
                    "a CA certificate, not a client certificate",
                ));
            }
            check_time(cert_path, &cert)?;
            let key = load_key(key_path, cert_path, &cert)?;
            Some((cert_der.to_vec(), Zeroizing::new(key.serialize_der())))
        }
    };
    Ok(ClientTls {
        ca_der: ca_der.to_vec(),
        identity,
    })
}

/// Who a node certificate names: see [`identity_of`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeIdentity {
    /// The node's name (CN).
    pub name: String,
    /// The node's role (OU).
    pub role: NodeRole,
}

/// Reads the identity (`CN=<name>, OU=<role>`) of a peer's certificate, DER, and checks that it
/// is a node certificate (not a CA, extendedKeyUsage serverAuth and clientAuth). It does not
/// verify the chain or the validity: call it on a certificate the TLS handshake verified.
pub fn identity_of(cert_der: &[u8]) -> Result<NodeIdentity, CertError> {
    let cert = match x509_parser::parse_x509_certificate(cert_der) {
        Ok(([], cert)) => cert,
        Ok(_) => {
            return Err(CertError::Peer(
                "trailing data after the certificate".into(),
            ))
        }
        Err(e) => return Err(CertError::Peer(format!("invalid certificate: {e}"))),
    };
    node_identity(&cert).map_err(CertError::Peer)
}

/// A certificate's content, for `protego certs show`; its `Display` is the text shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The file.
    pub path: PathBuf,
    /// The subject, e.g. `CN=node1, OU=control`.
    pub subject: String,
    /// The role (OU) of a node certificate, if it names one.
    pub role: Option<NodeRole>,
    /// The issuer.
    pub issuer: String,
    /// The serial number, hexadecimal bytes separated by colons.
    pub serial: String,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// Subject alternative names; others than IP and DNS are shown as `other`.
    pub sans: Vec<String>,
    /// Whether it is a CA certificate (basicConstraints CA:TRUE).
    pub is_ca: bool,
    /// keyUsage bits by name, empty if absent.
    pub key_usage: Vec<&'static str>,
    /// extendedKeyUsage purposes by name, empty if absent.
    pub extended_key_usage: Vec<String>,
    /// The public key's algorithm, e.g. `ECDSA P-256`.
    pub key_algorithm: String,
}

/// Reads the certificate in `path` (one PEM `CERTIFICATE` block) and describes it; a private
/// key file is refused without showing anything of it.
pub fn describe(path: &Path) -> Result<CertInfo, CertError> {
    let der = read_pem(path, CERT_LABEL, false)?;
    let cert = parse_cert(path, &der)?;
    let role = single_attr(cert.subject().iter_organizational_unit(), "OU")
        .ok()
        .flatten()
        .and_then(|ou| ou.parse().ok());
    let sans = match cert.subject_alternative_name() {
        Ok(Some(ext)) => ext.value.general_names.iter().map(render_san).collect(),
        Ok(None) => Vec::new(),
        Err(e) => return Err(invalid(path, &format!("bad subjectAltName: {e}"))),
    };
    let key_usage = match cert.key_usage() {
        Ok(Some(ext)) => {
            let ku = ext.value;
            [
                (ku.digital_signature(), "digitalSignature"),
                (ku.non_repudiation(), "nonRepudiation"),
                (ku.key_encipherment(), "keyEncipherment"),
                (ku.data_encipherment(), "dataEncipherment"),
                (ku.key_agreement(), "keyAgreement"),
                (ku.key_cert_sign(), "keyCertSign"),
                (ku.crl_sign(), "cRLSign"),
                (ku.encipher_only(), "encipherOnly"),
                (ku.decipher_only(), "decipherOnly"),
            ]
            .into_iter()
            .filter_map(|(set, name)| set.then_some(name))
            .collect()
        }
        Ok(None) => Vec::new(),
        Err(e) => return Err(invalid(path, &format!("bad keyUsage: {e}"))),
    };
    let extended_key_usage = match cert.extended_key_usage() {
        Ok(Some(ext)) => {
            let eku = ext.value;
            let mut names: Vec<String> = [
                (eku.any, "any"),
                (eku.server_auth, "serverAuth"),
                (eku.client_auth, "clientAuth"),
                (eku.code_signing, "codeSigning"),
                (eku.email_protection, "emailProtection"),
                (eku.time_stamping, "timeStamping"),
                (eku.ocsp_signing, "OCSPSigning"),
            ]
            .into_iter()
            .filter(|(set, _)| *set)
            .map(|(_, name)| name.to_owned())
            .collect();
            names.extend(eku.other.iter().map(|oid| oid.to_id_string()));
            names
        }
        Ok(None) => Vec::new(),
        Err(e) => return Err(invalid(path, &format!("bad extendedKeyUsage: {e}"))),
    };
    Ok(CertInfo {
        path: path.to_owned(),
        subject: cert.subject().to_string(),
        role,
        issuer: cert.issuer().to_string(),
        serial: cert.raw_serial_as_string(),
        not_before: SystemTime::from(cert.validity().not_before.to_datetime()),
        not_after: SystemTime::from(cert.validity().not_after.to_datetime()),
        sans,
        is_ca: cert.is_ca(),
        key_usage,
        extended_key_usage,
        key_algorithm: key_algorithm(&cert),
    })
}

impl fmt::Display for CertInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |items: &[String]| {
            if items.is_empty() {
                "none".to_owned()
            } else {
                items.join(", ")
            }
        };
        writeln!(f, "file:        {}", self.path.display())?;
        writeln!(f, "subject:     {}", self.subject)?;
        let role = match (self.role, self.is_ca) {
            (_, true) => "none (CA certificate)".to_owned(),
            (Some(role), false) => role.to_string(),
            (None, false) => "none (no OU=control, OU=data or OU=steer)".to_owned(),
        };
        writeln!(f, "role:        {role}")?;
        writeln!(f, "issuer:      {}", self.issuer)?;
        writeln!(f, "serial:      {}", self.serial)?;
        let now = SystemTime::now();
        let state = if now < self.not_before {
            "NOT YET VALID".to_owned()
        } else {
            match self.not_after.duration_since(now) {
                Ok(left) => format!("valid, {} days left", left.as_secs() / SECONDS_PER_DAY),
                Err(_) => "EXPIRED".to_owned(),
            }
        };
        writeln!(
            f,
            "validity:    {} to {} ({state})",
            rfc3339(self.not_before),
            rfc3339(self.not_after)
        )?;
        writeln!(f, "SANs:        {}", list(&self.sans))?;
        let key_usage: Vec<String> = self.key_usage.iter().map(|s| s.to_string()).collect();
        writeln!(f, "key usage:   {}", list(&key_usage))?;
        writeln!(f, "ext. usage:  {}", list(&self.extended_key_usage))?;
        writeln!(f, "CA:          {}", if self.is_ca { "yes" } else { "no" })?;
        writeln!(f, "public key:  {}", self.key_algorithm)
    }
}

// ---------------------------------------------------------------------------------------------
// Checks

fn invalid(path: &Path, reason: &str) -> CertError {
    CertError::Invalid {
        path: path.to_owned(),
        reason: reason.to_owned(),
    }
}

fn generate_error(what: &'static str, e: rcgen::Error) -> CertError {
    CertError::Generate {
        what,
        reason: e.to_string(),
    }
}

/// Parses one DER certificate with nothing after it.
fn parse_cert<'a>(path: &Path, der: &'a [u8]) -> Result<X509Certificate<'a>, CertError> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(invalid(path, "trailing data after the certificate")),
        Err(e) => Err(invalid(path, &format!("invalid certificate: {e}"))),
    }
}

/// The certificate must be a CA allowed to sign certificates.
fn check_ca(path: &Path, cert: &X509Certificate<'_>) -> Result<(), CertError> {
    match cert.basic_constraints() {
        Ok(Some(bc)) if bc.value.ca => {}
        Ok(_) => {
            return Err(invalid(
                path,
                "not a CA certificate (no basicConstraints CA:TRUE)",
            ))
        }
        Err(e) => return Err(invalid(path, &format!("bad basicConstraints: {e}"))),
    }
    match cert.key_usage() {
        Ok(Some(ku)) if !ku.value.key_cert_sign() => Err(invalid(
            path,
            "the CA's keyUsage does not allow keyCertSign",
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(invalid(path, &format!("bad keyUsage: {e}"))),
    }
}

/// The certificate must be within its validity now.
fn check_time(path: &Path, cert: &X509Certificate<'_>) -> Result<(), CertError> {
    let now = OffsetDateTime::now_utc();
    let validity = cert.validity();
    let not_before = validity.not_before.to_datetime();
    let not_after = validity.not_after.to_datetime();
    if now < not_before {
        return Err(CertError::NotYetValid {
            path: path.to_owned(),
            not_before: rfc3339(SystemTime::from(not_before)),
        });
    }
    if now > not_after {
        return Err(CertError::Expired {
            path: path.to_owned(),
            not_after: rfc3339(SystemTime::from(not_after)),
        });
    }
    Ok(())
}

/// The identity of a node certificate, with the checks that make it one; the error is the
/// reason, without the file.
fn node_identity(cert: &X509Certificate<'_>) -> Result<NodeIdentity, String> {
    if cert.is_ca() {
        return Err("a CA certificate, not a node certificate".into());
    }
    match cert.extended_key_usage() {
        Ok(Some(eku)) if eku.value.server_auth && eku.value.client_auth => {}
        Ok(_) => {
            return Err(
                "lacks extendedKeyUsage serverAuth and clientAuth (a node is both a TLS client \
                 and server)"
                    .into(),
            )
        }
        Err(e) => return Err(format!("bad extendedKeyUsage: {e}")),
    }
    if let Ok(Some(ku)) = cert.key_usage() {
        if !ku.value.digital_signature() {
            return Err("keyUsage lacks digitalSignature".into());
        }
    }
    let name = single_attr(cert.subject().iter_common_name(), "CN")?
        .ok_or("the subject has no CN (the node name)")?;
    let role = single_attr(cert.subject().iter_organizational_unit(), "OU")?
        .ok_or("the subject has no OU with the node's role (control, data or steer)")?;
    let role = role.parse().map_err(|_| {
        format!("the subject's OU {role:?} is not a role: expected control, data or steer")
    })?;
    Ok(NodeIdentity { name, role })
}

/// The value of an attribute the subject must hold at most once; the error is the reason.
fn single_attr<'a, 'b: 'a>(
    mut values: impl Iterator<Item = &'a x509_parser::x509::AttributeTypeAndValue<'b>>,
    what: &str,
) -> Result<Option<String>, String> {
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("the subject has more than one {what}"));
    }
    first
        .as_str()
        .map(|s| Some(s.to_owned()))
        .map_err(|_| format!("the subject's {what} is not a string"))
}

/// Reads a PKCS#8 key from a private file and checks it matches `cert`.
fn load_key(
    key_path: &Path,
    cert_path: &Path,
    cert: &X509Certificate<'_>,
) -> Result<Zeroizing<KeyPair>, CertError> {
    let der = read_pem(key_path, KEY_LABEL, true)?;
    let key = KeyPair::try_from(der.as_slice())
        .map(Zeroizing::new)
        .map_err(|_| invalid(key_path, "not a usable PKCS#8 private key"))?;
    if key.public_key_raw() != cert.public_key().subject_public_key.data.as_ref() {
        return Err(CertError::KeyMismatch {
            key: key_path.to_owned(),
            cert: cert_path.to_owned(),
        });
    }
    Ok(key)
}

fn check_ca_name(name: &str) -> Result<(), CertError> {
    if name.trim().is_empty() || name.chars().count() > MAX_NAME_LEN {
        return Err(CertError::Request(format!(
            "CA name {name:?}: expected 1 to {MAX_NAME_LEN} characters"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(CertError::Request(format!(
            "CA name {name:?} contains control characters"
        )));
    }
    Ok(())
}

/// A node name is a file stem too: keep it to a portable, path-free alphabet.
fn check_node_name(name: &str) -> Result<(), CertError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    let starts_well = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > MAX_NAME_LEN || !starts_well || !name.chars().all(ok_char) {
        return Err(CertError::Request(format!(
            "node name {name:?}: expected 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 . _ -, starting \
             with a letter or digit"
        )));
    }
    if name.eq_ignore_ascii_case("ca") {
        return Err(CertError::Request(
            "node name \"ca\" is reserved for the CA's files".into(),
        ));
    }
    Ok(())
}

/// A host name (RFC 1123 labels); no wildcards.
fn check_dns_name(name: &str) -> Result<(), CertError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() || trimmed.len() > 253 || !trimmed.split('.').all(label_ok) {
        return Err(CertError::Request(format!(
            "DNS name {name:?}: expected labels of A-Z a-z 0-9 and inner -, separated by dots"
        )));
    }
    Ok(())
}

fn new_key() -> Result<Zeroizing<KeyPair>, CertError> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map(Zeroizing::new)
        .map_err(|e| generate_error("generate an ECDSA P-256 key", e))
}

fn key_algorithm(cert: &X509Certificate<'_>) -> String {
    use x509_parser::public_key::PublicKey;
    let spki = cert.public_key();
    match spki.parsed() {
        Ok(PublicKey::EC(_)) => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|oid| match oid.to_id_string().as_str() {
                    "1.2.840.10045.3.1.7" => "P-256".to_owned(),
                    "1.3.132.0.34" => "P-384".to_owned(),
                    "1.3.132.0.35" => "P-521".to_owned(),
                    other => other.to_owned(),
                })
                .unwrap_or_else(|| "unknown curve".to_owned());
            format!("ECDSA {curve}")
        }
        Ok(PublicKey::RSA(rsa)) => format!("RSA ({} bits)", rsa.key_size()),
        Ok(_) => spki.algorithm.algorithm.to_id_string(),
        Err(_) => "unparsable".to_owned(),
    }
}

fn render_san(name: &GeneralName<'_>) -> String {
    match name {
        GeneralName::DNSName(dns) => format!("DNS:{dns}"),
        GeneralName::IPAddress(bytes) => match bytes.len() {
            4 => {
                let mut a = [0u8; 4];
                a.copy_from_slice(bytes);
                format!("IP:{}", IpAddr::from(a))
            }
            16 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(bytes);
                format!("IP:{}", IpAddr::from(a))
            }
            _ => "IP:<malformed>".to_owned(),
        },
        GeneralName::URI(uri) => format!("URI:{uri}"),
        GeneralName::RFC822Name(mail) => format!("email:{mail}"),
        _ => "other".to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Time

/// Drops sub-second precision, as certificates store it.
fn truncate_to_seconds(t: SystemTime) -> SystemTime {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => SystemTime::UNIX_EPOCH + Duration::from_secs(d.as_secs()),
        Err(_) => t,
    }
}

/// A time as certificates show it, RFC 3339 in UTC to the second: `2026-03-10T12:00:00Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let t = OffsetDateTime::from(truncate_to_seconds(t));
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| format!("{t}"))
}

// ---------------------------------------------------------------------------------------------
// Files

/// Creates `dir` (and its parents) with mode 0700 if missing.
fn make_dir(dir: &Path) -> Result<(), CertError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| CertError::Write {
            path: dir.to_owned(),
            source,
        })
}

/// Writes `contents` to `path` through a temporary file in the same directory, created with
/// `mode`, then renamed over `path`: a reader never sees half a file, and a key is never
/// readable by others, not even for a moment.
fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    let err = |source| CertError::Write {
        path: path.to_owned(),
        source,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp{}", std::process::id()));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    if let Some(dir) = path.parent() {
        // Best effort: make the rename durable.
        if let Ok(d) = File::open(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        }) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Reads `path` (a private key file if `secret`: then refused if other users may access it or
/// its group may write it) and returns the DER of its one PEM block labelled `label`.
fn read_pem(path: &Path, label: &str, secret: bool) -> Result<Zeroizing<Vec<u8>>, CertError> {
    let file = File::open(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => CertError::Missing {
            path: path.to_owned(),
        },
        _ => CertError::Read {
            path: path.to_owned(),
            source,
        },
    })?;
    let read_err = |source| CertError::Read {
        path: path.to_owned(),
        source,
    };
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(invalid(path, "not a regular file"));
    }
    if secret {
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o027 != 0 {
            return Err(CertError::InsecureKey {
                path: path.to_owned(),
                mode,
            });
        }
    }
    if meta.len() > MAX_FILE_LEN {
        return Err(invalid(
            path,
            &format!("larger than {MAX_FILE_LEN} bytes: not a certificate or key"),
        ));
    }
    // Room for the whole file up front, so that reading never reallocates (and never leaves an
    // unzeroized copy of a key behind).
    let mut text = Zeroizing::new(Vec::with_capacity(meta.len() as usize + 1));
    file.take(MAX_FILE_LEN + 1)
        .read_to_end(&mut text)
        .map_err(read_err)?;
    let not_pem = |reason: String| CertError::NotPem {
        path: path.to_owned(),
        reason,
    };
    let text = std::str::from_utf8(&text)
        .map_err(|_| not_pem("not text (a DER file? convert it to PEM)".into()))?;
    let blocks = pem_decode(text).map_err(not_pem)?;
    let mut found = blocks.into_iter().filter(|b| b.label == label);
    let (Some(block), None) = (found.next(), found.next()) else {
        let labels: Vec<String> = pem_decode(text)
            .unwrap_or_default()
            .into_iter()
            .map(|b| b.label)
            .collect();
        let count = labels.iter().filter(|l| *l == label).count();
        return Err(if count > 1 {
            invalid(
                path,
                &format!("{count} {label} blocks: expected exactly one (chains are not supported)"),
            )
        } else if label == KEY_LABEL {
            not_pem(format!(
                "no PKCS#8 `-----BEGIN {label}-----` block (found: {}); convert a key with \
                 `openssl pkcs8 -topk8 -nocrypt`",
                labels.join(", ")
            ))
        } else {
            not_pem(format!(
                "no `-----BEGIN {label}-----` block (found: {})",
                labels.join(", ")
            ))
        });
    };
    Ok(block.der)
}
