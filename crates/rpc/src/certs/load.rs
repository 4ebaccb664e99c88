//! Loading and checking: a node's TLS material ([`load_tls`]), a client's toward etcd
//! ([`load_client_tls`]), the identity a peer's certificate carries ([`identity_of`]), and what a
//! certificate file says ([`describe`]).

use super::*;

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
            (None, false) if self.subject.contains("OU=operator") => {
                "HTTP API client: operator (docs/api.md)".to_owned()
            }
            (None, false) if self.subject.contains("OU=tenant:") => {
                "HTTP API client: a tenant (docs/api.md)".to_owned()
            }
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

/// Parses one DER certificate with nothing after it.
pub(super) fn parse_cert<'a>(path: &Path, der: &'a [u8]) -> Result<X509Certificate<'a>, CertError> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(invalid(path, "trailing data after the certificate")),
        Err(e) => Err(invalid(path, &format!("invalid certificate: {e}"))),
    }
}

/// The certificate must be a CA allowed to sign certificates.
pub(super) fn check_ca(path: &Path, cert: &X509Certificate<'_>) -> Result<(), CertError> {
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
pub(super) fn check_time(path: &Path, cert: &X509Certificate<'_>) -> Result<(), CertError> {
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
pub(super) fn node_identity(cert: &X509Certificate<'_>) -> Result<NodeIdentity, String> {
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
pub(super) fn single_attr<'a, 'b: 'a>(
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
pub(super) fn load_key(
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

pub(super) fn key_algorithm(cert: &X509Certificate<'_>) -> String {
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

pub(super) fn render_san(name: &GeneralName<'_>) -> String {
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
