//! Issuing: the development CA ([`generate_ca_with`]) and node certificates ([`issue_with`]),
//! with the checks of the names a request carries.

use super::*;

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
    pub(super) cert_der: Vec<u8>,
    pub(super) key: Zeroizing<KeyPair>,
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
    issue_subject(
        dir,
        ca,
        request,
        request.role.as_str(),
        &[
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    )
}

/// Issues a client certificate for the HTTP API (docs/api.md): subject CN=`name`, OU=`ou`
/// (`operator` or `tenant:NAME`), usable only as a TLS client, valid `days` days, signed by
/// `ca`; writes `dir/<name>.pem` and `dir/<name>.key` (mode 0600) as [`issue`] does.
pub fn issue_api_client(
    dir: &Path,
    ca: &CertAuthority,
    name: &str,
    ou: &str,
    days: u32,
) -> Result<IssuedCert, CertError> {
    if ou.is_empty() || ou.len() > MAX_NAME_LEN || ou.chars().any(char::is_control) {
        return Err(CertError::Request(format!(
            "OU {ou:?}: expected 1 to {MAX_NAME_LEN} printable characters"
        )));
    }
    let request = NodeRequest {
        name: name.to_owned(),
        // Not written: the OU is `ou`.
        role: NodeRole::Control,
        sans: Vec::new(),
        validity: Validity::days_from_now(days)?,
    };
    issue_subject(
        dir,
        ca,
        &request,
        ou,
        &[ExtendedKeyUsagePurpose::ClientAuth],
    )
}

/// Issues `request`'s certificate with subject OU `ou` and the extended key usages `usages`.
fn issue_subject(
    dir: &Path,
    ca: &CertAuthority,
    request: &NodeRequest,
    ou: &str,
    usages: &[ExtendedKeyUsagePurpose],
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
    dn.push(DnType::OrganizationalUnitName, ou);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usages.to_vec();
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

pub(super) fn check_ca_name(name: &str) -> Result<(), CertError> {
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
pub(super) fn check_node_name(name: &str) -> Result<(), CertError> {
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
pub(super) fn check_dns_name(name: &str) -> Result<(), CertError> {
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

pub(super) fn new_key() -> Result<Zeroizing<KeyPair>, CertError> {
    KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map(Zeroizing::new)
        .map_err(|e| generate_error("generate an ECDSA P-256 key", e))
}
