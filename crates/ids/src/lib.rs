//! The identifiers every Protego crate shares, each defined once: a tunnel ([`TunnelId`]), a
//! node of the cluster ([`NodeId`]), a tenant ([`TenantId`]), a customer attachment
//! ([`AttachmentId`]) and a customer-facing port ([`PortId`]).
//!
//! Numbers are assigned by the control node (tunnels in configuration order, nodes as they
//! join) and mean the same in the IKE engine, the data plane, the steering tables, the
//! provisioning model and the cluster protocol. A tenant is named by the operator; the name is
//! checked once, where it enters (configuration, API, the network), so a [`TenantId`] is valid
//! by construction and the crates that receive one never check it again.

use core::fmt;
use std::sync::Arc;

/// A configured tunnel (a swanctl "connection"), numbered by the control node.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct TunnelId(pub u32);

impl fmt::Debug for TunnelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tunnel{}", self.0)
    }
}

impl fmt::Display for TunnelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A node of the cluster as the control node numbers it: a data node (the Protego paper's
/// GPN) in the steering tables and the provisioning model, or a steer node where the control
/// node divides rate limits. Small and `Copy`: the steering tables return it per packet, and
/// the I/O layer maps it to the node's address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodeId(pub u32);

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A customer attachment (a `[[attachment]]` table: a customer's edge router on one VLAN or
/// Q-in-Q tag pair of a port), numbered by the control node like tunnels.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct AttachmentId(pub u32);

impl fmt::Debug for AttachmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attachment{}", self.0)
    }
}

impl fmt::Display for AttachmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A customer-facing port of the cluster: one interface of one steer node where customers'
/// edge routers are attached, numbered by the control node. It travels in the Geneve port
/// option (`wire::geneve::ProtegoOption::Port`) between steer and data nodes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PortId(pub u32);

impl fmt::Debug for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port{}", self.0)
    }
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The longest tenant name.
pub const TENANT_MAX_LEN: usize = 64;

/// A tenant, by the name the operator gave it: 1 to [`TENANT_MAX_LEN`] ASCII letters, digits,
/// `-`, `_` and `.`. Cheap to clone (shared).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(Arc<str>);

/// Why a string is not a name (of a tenant, or of anything else the operator names by the same
/// rule: VNets, tunnels).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    /// The name is empty.
    #[error("must not be empty")]
    Empty,
    /// Too long or a character outside the allowed set.
    #[error("{0:?} is not a valid name (up to 64 characters: letters, digits, - _ .)")]
    Invalid(String),
}

/// Checks a name by the rule of tenant names: 1 to [`TENANT_MAX_LEN`] ASCII letters, digits,
/// `-`, `_` and `.`.
pub fn check_name(name: &str) -> Result<(), InvalidName> {
    if name.is_empty() {
        return Err(InvalidName::Empty);
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.len() > TENANT_MAX_LEN || !name.chars().all(allowed) {
        return Err(InvalidName::Invalid(name.to_owned()));
    }
    Ok(())
}

impl TenantId {
    /// Checks `name` ([`check_name`]) and makes it a tenant id.
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        check_name(name)?;
        Ok(Self(name.into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for TenantId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for TenantId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for TenantId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<String> for TenantId {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<&str> for TenantId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl std::str::FromStr for TenantId {
    type Err = InvalidName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl serde::Serialize for TenantId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for TenantId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Self::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_are_checked_once() {
        for ok in ["acme", "a", "Acme-Corp_2.eu", &"x".repeat(TENANT_MAX_LEN)] {
            let t = TenantId::new(ok).expect(ok);
            assert_eq!(t.as_str(), ok);
            assert_eq!(t.to_string(), ok);
        }
        assert_eq!(TenantId::new(""), Err(InvalidName::Empty));
        for bad in ["a b", "ä", "a/b", &"x".repeat(TENANT_MAX_LEN + 1), "a\n"] {
            assert_eq!(
                TenantId::new(bad),
                Err(InvalidName::Invalid(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tenant_serde_checks_the_name() {
        let t: TenantId = serde_json::from_str("\"acme\"").expect("valid");
        assert_eq!(serde_json::to_string(&t).expect("serialize"), "\"acme\"");
        let err = serde_json::from_str::<TenantId>("\"no good\"").expect_err("invalid");
        assert!(err.to_string().contains("not a valid name"), "{err}");
    }

    #[test]
    fn ids_print_as_the_crates_log_them() {
        assert_eq!(format!("{:?}", NodeId(3)), "node3");
        assert_eq!(NodeId(3).to_string(), "node3");
        assert_eq!(format!("{:?}", TunnelId(7)), "tunnel7");
        assert_eq!(TunnelId(7).to_string(), "tunnel7");
    }
}
