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

mod files;
mod issue;
mod load;
use files::*;
pub use issue::*;
pub use load::*;

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
