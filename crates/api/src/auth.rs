//! Who is asking: bearer tokens (kept as SHA-256 hashes in `[api] tokens_file`) and client
//! certificates (their subject OU names the principal), and the two kinds of principal.
//!
//! A token is `pgo_` and 256 random bits in unpadded Base64url. With that much entropy a
//! single SHA-256 is as hard to invert as any slow password hash (those protect passwords a
//! person can guess), and it keeps a request's check to one hash.

use aws_lc_rs::digest;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use base64ct::{Base64UrlUnpadded, Encoding};
use ids::TenantId;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// Every token starts with this, so that a leaked one is recognised by secret scanners.
pub(crate) const TOKEN_PREFIX: &str = "pgo_";
/// Random bytes in a token.
const TOKEN_BYTES: usize = 32;
/// Longest principal name (a token's or a certificate's).
const MAX_NAME: usize = 64;

/// What a principal may see and do (docs/api.md, "Principals").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Everything.
    Operator,
    /// Only this tenant's objects.
    Tenant(TenantId),
}

impl Role {
    /// Parses `operator` or `tenant:NAME`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            None if text == "operator" => Ok(Role::Operator),
            Some(("tenant", t)) => TenantId::new(t)
                .map(Role::Tenant)
                .map_err(|e| format!("tenant {t:?}: {e}")),
            _ => Err(format!(
                "role {text:?}: expected `operator` or `tenant:NAME`"
            )),
        }
    }

    /// The tenant this role is limited to, if any.
    pub fn tenant(&self) -> Option<&TenantId> {
        match self {
            Role::Operator => None,
            Role::Tenant(t) => Some(t),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Operator => f.write_str("operator"),
            Role::Tenant(t) => write!(f, "tenant:{t}"),
        }
    }
}

/// How a principal proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A bearer token of the tokens file.
    Token,
    /// A client certificate signed by `[api] client_ca_file`.
    Certificate,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's or the certificate's (CN) name, for logs.
    pub name: String,
    /// What it may see and do.
    pub role: Role,
    /// How it authenticated.
    pub via: Via,
}

impl Principal {
    /// Whether the principal may see `tenant`'s objects.
    pub fn sees(&self, tenant: &str) -> bool {
        self.role.tenant().is_none_or(|t| t.as_str() == tenant)
    }
}

/// Checks a principal name: 1 to 64 of `A-Z a-z 0-9 . _ - @`.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@');
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(ok) {
        return Err(format!(
            "name {name:?}: expected 1 to {MAX_NAME} of A-Z a-z 0-9 . _ - @"
        ));
    }
    Ok(())
}

/// One line of the tokens file.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenEntry {
    /// The token's name (unique in the file).
    pub name: String,
    /// What its bearer may do.
    pub role: Role,
    /// SHA-256 of the token.
    hash: [u8; 32],
}

impl fmt::Debug for TokenEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenEntry")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// The SHA-256 of a token.
fn hash(token: &str) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, token.as_bytes());
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A new token: [`TOKEN_PREFIX`] and 256 random bits.
pub fn new_token() -> Result<String, String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "the system's random number generator failed".to_owned())?;
    Ok(format!(
        "{TOKEN_PREFIX}{}",
        Base64UrlUnpadded::encode_string(&bytes)
    ))
}

/// The tokens file: `NAME ROLE sha256:HEX` per line, `#` comments, blank lines ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenFile {
    entries: Vec<TokenEntry>,
}

impl TokenFile {
    /// Parses the file's text; an error names the line.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut file = TokenFile::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = |e: String| format!("line {}: {e}", n + 1);
            let words: Vec<&str> = line.split_whitespace().collect();
            let [name, role, digest] = words[..] else {
                return Err(at("expected `NAME ROLE sha256:HEX`".into()));
            };
            check_name(name).map_err(at)?;
            let role = Role::parse(role).map_err(at)?;
            let hex_digest = digest
                .strip_prefix("sha256:")
                .ok_or_else(|| at(format!("{digest:?}: expected sha256:HEX")))?;
            let mut hash = [0u8; 32];
            hex::decode_to_slice(hex_digest, &mut hash)
                .map_err(|_| at("the hash is not 64 hex digits".into()))?;
            if file.entries.iter().any(|e| e.name == name) {
                return Err(at(format!("a second token named {name:?}")));
            }
            file.entries.push(TokenEntry {
                name: name.to_owned(),
                role,
                hash,
            });
        }
        Ok(file)
    }

    /// Reads and parses `path`; a missing file is an empty one. A file that others than its
    /// owner may write is refused: whoever can write it can give themselves an operator's
    /// token.
    pub fn load(path: &Path) -> Result<Self, String> {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode();
            if mode & 0o022 != 0 {
                return Err(format!(
                    "{}: writable by its group or others (mode {:o}): anyone who can write it \
                     can add a token; `chmod go-w` it",
                    path.display(),
                    mode & 0o777
                ));
            }
        }
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# Protego API tokens (docs/api.md): NAME ROLE sha256:HASH; made by `protego token add`\n",
        );
        for e in &self.entries {
            out.push_str(&format!(
                "{} {} sha256:{}\n",
                e.name,
                e.role,
                hex::encode(e.hash)
            ));
        }
        out
    }

    /// Writes the file: a temporary file of mode 0600 beside it, renamed over it.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let err = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err)?;
        f.write_all(self.render().as_bytes()).map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// The entries, in file order.
    pub fn entries(&self) -> &[TokenEntry] {
        &self.entries
    }

    /// Makes a token for `name` with `role` and adds its hash; returns the token (shown once).
    pub fn add(&mut self, name: &str, role: Role) -> Result<String, String> {
        check_name(name)?;
        if self.entries.iter().any(|e| e.name == name) {
            return Err(format!(
                "a token named {name:?} exists: revoke it first, or choose another name"
            ));
        }
        let token = new_token()?;
        self.entries.push(TokenEntry {
            name: name.to_owned(),
            role,
            hash: hash(&token),
        });
        Ok(token)
    }

    /// Removes the token named `name`; false if there is none.
    pub fn revoke(&mut self, name: &str) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.name != name);
        self.entries.len() != before
    }

    /// The entry whose hash is the token's. Every entry is compared in constant time, so the
    /// time taken says nothing of which entry (if any) matched.
    pub fn find(&self, token: &str) -> Option<&TokenEntry> {
        let h = hash(token);
        let mut found = None;
        for e in &self.entries {
            #[allow(deprecated)]
            let same = aws_lc_rs::constant_time::verify_slices_are_equal(&e.hash, &h).is_ok();
            if same && found.is_none() {
                found = Some(e);
            }
        }
        found
    }
}

/// The tokens file as the server reads it: parsed again when it changes (its modification
/// time, size, inode or mode), so that `protego token add` and `revoke` take effect at the next
/// request. While the file cannot be read or parsed, no token is accepted (a revocation must
/// never be undone by a broken file); the error says why.
#[derive(Debug)]
pub struct Tokens {
    path: PathBuf,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    stamp: Option<Stamp>,
    file: Result<Arc<TokenFile>, String>,
}

impl Tokens {
    /// Reads `path` (it must be readable now: a typo in the configuration fails the start).
    pub fn open(path: &Path) -> Result<Self, String> {
        let file = TokenFile::load(path)?;
        Ok(Self {
            path: path.to_owned(),
            state: Mutex::new(Loaded {
                stamp: stamp(path),
                file: Ok(Arc::new(file)),
            }),
        })
    }

    /// The current set, read again if the file changed.
    pub fn current(&self) -> Result<Arc<TokenFile>, String> {
        let now = stamp(&self.path);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if now != state.stamp {
            state.stamp = now;
            state.file = TokenFile::load(&self.path).map(Arc::new);
            match &state.file {
                Ok(f) => {
                    tracing::info!(file = %self.path.display(), tokens = f.entries.len(), "API tokens file read again")
                }
                Err(e) => {
                    tracing::error!(error = %e, "API tokens file unusable: no token is accepted until it is fixed")
                }
            }
        }
        state.file.clone()
    }

    /// The principal of a bearer token.
    pub fn authenticate(&self, token: &str) -> Result<Option<Principal>, String> {
        let file = self.current()?;
        Ok(file.find(token).map(|e| Principal {
            name: e.name.clone(),
            role: e.role.clone(),
            via: Via::Token,
        }))
    }
}

/// What tells a changed file: modification time, size, inode, mode.
type Stamp = (std::time::SystemTime, u64, u64, u32);

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino(), m.mode()))
}

/// The principal a client certificate (DER, already verified against the CA) names: subject
/// OU `operator` (named by the CN) or `tenant:NAME`. Other OUs (the nodes' `control`, `data`,
/// `steer`) name none.
pub fn certificate_principal(der: &[u8]) -> Result<Principal, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("unreadable client certificate: {e}"))?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .ok_or("the client certificate has no subject CN")?;
    check_name(cn)?;
    for ou in subject.iter_organizational_unit() {
        let Ok(ou) = ou.as_str() else { continue };
        if let Ok(role) = Role::parse(ou) {
            return Ok(Principal {
                name: cn.to_owned(),
                role,
                via: Via::Certificate,
            });
        }
    }
    Err(format!(
        "the client certificate of {cn:?} names no API role (subject OU `operator` or `tenant:NAME`)"
    ))
}
