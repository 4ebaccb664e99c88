//! The leadership an [`EtcdStore`](super::EtcdStore)'s writes can be fenced with: the leader's
//! [`Term`] and the [`Fence`] its transactions check. The election that hands them out runs
//! elsewhere (the `cluster` crate's `election`, documented there); the store only checks them.

use etcd_client::{Compare, CompareOp};
use std::fmt;
use std::time::Duration;

/// The default TTL of the leader's etcd lease: the shortest etcd grants (the election's docs
/// give the etcd settings it needs). The configuration's `lease` defaults to it.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(1);

/// A leader's term: the etcd revision that created its leader key. Each new leader has a
/// higher term than every earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term(i64);

impl Term {
    /// The term of a leader key created at etcd revision `revision` (positive).
    pub fn from_revision(revision: i64) -> Term {
        Term(revision)
    }

    /// The etcd revision at which the leader key of this term was created (positive).
    pub fn revision(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a leader's fenced etcd transactions must check: that `key` still holds `name` as
/// created in `term`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The leader key, `<prefix>/leader`.
    pub key: String,
    /// The leader's name (the key's value).
    pub name: String,
    /// The term (the key's create revision).
    pub term: Term,
}

impl Fence {
    /// The comparisons to add to a transaction's guard: it then applies only while this term
    /// lasts.
    pub fn compares(&self) -> [Compare; 2] {
        [
            Compare::create_revision(self.key.clone(), CompareOp::Equal, self.term.0),
            Compare::value(self.key.clone(), CompareOp::Equal, self.name.clone()),
        ]
    }
}
