//! The control plane's durable store: what a restarted control node needs to carry on every IKE
//! SA without re-authenticating with its peers.
//!
//! # What is stored
//!
//! One snapshot per IKE SA, keyed by the SA's own (local) SPI. A snapshot is an opaque blob the
//! IKE engine produces; this module never looks inside. It holds the SA's keys, message IDs and
//! CHILD_SAs with their keys: **whoever reads a snapshot can decrypt and forge that SA's
//! traffic**. Snapshots are handed around in [`zeroize::Zeroizing`] buffers ([`Snapshot`]), and
//! [`Change`]'s `Debug` prints their length only.
//!
//! # Contract
//!
//! - [`Store::commit`] applies a batch of [`Change`]s **all or nothing**, and returns only once
//!   they are **durable** (for the file backend: fsync'd), so the control loop writes an SA's new
//!   state before the IKE message that depends on it leaves. A commit that fails must be taken
//!   as *not known to be durable*: the caller must not send what depended on it, and retries
//!   with the states it still wants stored. The file and memory backends then applied nothing;
//!   etcd may have applied a commit whose answer was lost (a timeout or a broken connection
//!   after sending). The retry writes the same or newer states, and "stored but not sent" is
//!   also what a crash between commit and send leaves. A timed-out commit that etcd applies
//!   *after* a newer one changes nothing: every etcd write is guarded by the key's revision as
//!   the store last saw it. An empty batch is a no-op that touches no disk. Backends may limit
//!   the size of one batch (etcd: 128 guarded keys and about 1.5 MiB by default); the control
//!   loop commits at most 64 changes at a time.
//! - [`Store::ike_sas`] returns every stored snapshot in ascending SPI order, as the last
//!   successful commit left them; a restarted control plane restores from it.
//! - [`Store::applied_config`] returns the configuration last applied with `protego ctl apply`
//!   (tenants, VNets, tunnels and their PSKs: as secret as the snapshots), which a restarted or
//!   newly elected control node runs instead of its file's tenants, VNets and tunnels.
//! - Backends are interchangeable: the trait carries no backend type, so the control plane works
//!   the same over [`FileStore`] (an embedded database in one local file), [`MemoryStore`] (for
//!   tests) and [`EtcdStore`] (replicated).
//! - [`EtcdStore`] keeps the state in etcd, shared by several control nodes (see its docs).
//!
//! # Encryption at rest
//!
//! `protego up` and `protego control` put [`SealedStore`] over whichever backend they use: with
//! `[store] encryption_key_file` (keys read by `keyring`, format documented there) it seals
//! every record with AES-256-GCM-SIV (a versioned header with the key id, a random nonce per record,
//! the record's identity `ike_sa/<SPI>` or `config` as associated data) before the backend sees
//! it, so the redb file and etcd hold no key material and no PSK. It opens records after reading
//! them; a record under an unknown key id, one that fails authentication, or one in clear while a
//! key file is set (unless `accept_cleartext`) is an error, never data the control plane runs.
//! [`Store::rotate_key`] makes a newer key of the key file current (or adds one), and [`Store::reseal`]
//! re-encrypts the older records a few at a time through [`Store::commit`]. Without a key file
//! records are written in clear, as the backends store them, and a warning says so at start.
//!
//! # Protecting the file
//!
//! [`FileStore`] creates its file with mode 0600 and missing parent directories with mode 0700,
//! and tightens an existing file that other users could read. Without encryption the file must
//! be protected, and backed up, like a private key: a copy of it decrypts all traffic, captured
//! before or after, of every SA it holds, and lets its holder pose as this gateway on those SAs
//! until they are rekeyed; with encryption the key file takes that role (keep it apart from the
//! store and its backups). Losing either costs every peer a new IKE_SA_INIT and IKE_AUTH after a
//! restart. A deleted or replaced snapshot may linger in the file's free pages until they are
//! reused, so the file as a whole, not only its live entries, is secret. Only one
//! process may have the file open at a time (the second open fails with
//! [`StoreError::Locked`]).

mod etcd;
mod etcd_access;
mod fence;
mod file;
mod keyring;
mod memory;
mod sealed;

#[cfg(test)]
pub(crate) mod etcd_tests;
#[cfg(test)]
mod etcd_tls_tests;
#[cfg(test)]
mod sealed_tests;
#[cfg(test)]
pub(crate) mod tests;

pub use etcd::DetachedRuntime;
pub use etcd::{EtcdMedium, EtcdOptions, EtcdStore, MAX_CHUNK};
pub use etcd_access::{explain as explain_etcd_error, token_refused};
pub use etcd_access::{read_password_file, EtcdAccess, EtcdUser};
pub use fence::{Fence, Term, DEFAULT_LEASE_TTL};
pub use file::FileStore;
#[cfg(test)]
pub(crate) use keyring::tests::{key_line, write_key_file};
pub use memory::MemoryStore;
#[cfg(test)]
pub(crate) use sealed::key_id_of as sealed_key_id;
pub use sealed::SealedStore;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use zeroize::Zeroizing;

/// An IKE SA's snapshot as the engine produced it (secret: it holds the SA's keys); wiped
/// when dropped.
pub type Snapshot = Zeroizing<Vec<u8>>;

/// One change to the stored state; the changes of one [`Store::commit`] apply all or nothing.
#[derive(Clone)]
pub enum Change {
    /// Stores (or replaces) the snapshot of the IKE SA whose own (local) SPI is `spi`.
    PutIkeSa {
        /// The IKE SA's own (local) SPI.
        spi: u64,
        /// The engine's snapshot of the SA (secret: it holds the SA's keys).
        snapshot: Zeroizing<Vec<u8>>,
    },
    /// Forgets that IKE SA (nothing happens if it is not stored).
    DeleteIkeSa {
        /// The IKE SA's own (local) SPI.
        spi: u64,
    },
    /// Stores (or replaces) the configuration applied with `protego ctl apply`: tenants, VNets
    /// and tunnels with their PSKs (secret), see [`crate::applied`].
    PutConfig {
        /// The encoded [`crate::applied::AppliedConfig`].
        record: Zeroizing<Vec<u8>>,
    },
    /// Forgets the applied configuration (the configuration file's tenants, VNets and tunnels
    /// count again at the next start).
    DeleteConfig,
    /// Stores (or replaces) the tenants' filters loaded with `protego ctl filter`: every
    /// program's place and object, see [`crate::filters`].
    PutFilters {
        /// The encoded [`crate::filters::FilterRecord`].
        record: Zeroizing<Vec<u8>>,
    },
    /// Forgets the stored filters (the configuration file's `[[filter]]` tables count again at
    /// the next start).
    DeleteFilters,
}

impl fmt::Debug for Change {
    /// Prints the SPI and the snapshot's length, never its bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::PutIkeSa { spi, snapshot } => f
                .debug_struct("PutIkeSa")
                .field("spi", &format_args!("{spi:016x}"))
                .field("snapshot", &format_args!("<{} bytes>", snapshot.len()))
                .finish(),
            Change::DeleteIkeSa { spi } => f
                .debug_struct("DeleteIkeSa")
                .field("spi", &format_args!("{spi:016x}"))
                .finish(),
            Change::PutConfig { record } => f
                .debug_struct("PutConfig")
                .field("record", &format_args!("<{} bytes>", record.len()))
                .finish(),
            Change::DeleteConfig => f.write_str("DeleteConfig"),
            Change::PutFilters { record } => f
                .debug_struct("PutFilters")
                .field("record", &format_args!("<{} bytes>", record.len()))
                .finish(),
            Change::DeleteFilters => f.write_str("DeleteFilters"),
        }
    }
}

/// Durable storage of the control plane's state.
pub trait Store: Send {
    /// Applies `changes` atomically; returns only once they are durable (fsync'd for the file
    /// backend). An empty slice is a no-op and must not touch the disk. On an error nothing of
    /// `changes` was applied.
    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError>;

    /// Every stored IKE SA snapshot, in ascending SPI order.
    fn ike_sas(&self) -> Result<Vec<(u64, Snapshot)>, StoreError>;

    /// The stored applied configuration ([`Change::PutConfig`]), if any.
    fn applied_config(&self) -> Result<Option<Snapshot>, StoreError>;

    /// The stored filter set ([`Change::PutFilters`]), if any.
    fn filters(&self) -> Result<Option<Snapshot>, StoreError>;

    /// What the store is, for logs and `protego status`: e.g.
    /// `file /var/lib/protego/state.redb`, `memory`.
    fn describe(&self) -> String;

    /// Whether records outlive the process (on disk or in etcd): only then are keys in clear
    /// at rest, and worth a warning. [`MemoryStore`] keeps nothing.
    fn at_rest(&self) -> bool {
        true
    }

    /// The stored snapshot of the IKE SA with own SPI `spi`, if any. The default reads every
    /// snapshot; the backends read only this one.
    fn read_ike_sa(&self, spi: u64) -> Result<Option<Snapshot>, StoreError> {
        Ok(self
            .ike_sas()?
            .into_iter()
            .find_map(|(s, snapshot)| (s == spi).then_some(snapshot)))
    }

    /// How the records are encrypted ([`SealedStore`]); `None` for a bare backend.
    fn encryption(&self) -> Option<EncryptionStatus> {
        None
    }

    /// Re-encrypts up to `max` records that are not under the current key (after a rotation, or
    /// records in clear), through [`Store::commit`]; returns how many it dealt with, 0 once none
    /// is left. A bare backend has nothing to do.
    fn reseal(&mut self, max: usize) -> Result<usize, StoreError> {
        let _ = max;
        Ok(0)
    }

    /// Makes a new key current (`protego ctl store rotate-key`): the key file's last key if the
    /// operator appended one, else a generated one appended to the file. New writes use it at
    /// once, and [`Store::reseal`] moves the older records to it. A bare backend, or a
    /// [`SealedStore`] without a key file, fails with [`StoreError::NotEncrypted`].
    fn rotate_key(&mut self) -> Result<KeyRotation, StoreError> {
        Err(StoreError::NotEncrypted {
            store: self.describe(),
        })
    }
}

impl<S: Store + ?Sized> Store for Box<S> {
    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        (**self).commit(changes)
    }

    fn ike_sas(&self) -> Result<Vec<(u64, Snapshot)>, StoreError> {
        (**self).ike_sas()
    }

    fn filters(&self) -> Result<Option<Snapshot>, StoreError> {
        (**self).filters()
    }

    fn applied_config(&self) -> Result<Option<Snapshot>, StoreError> {
        (**self).applied_config()
    }

    fn describe(&self) -> String {
        (**self).describe()
    }

    fn at_rest(&self) -> bool {
        (**self).at_rest()
    }

    fn read_ike_sa(&self, spi: u64) -> Result<Option<Snapshot>, StoreError> {
        (**self).read_ike_sa(spi)
    }

    fn encryption(&self) -> Option<EncryptionStatus> {
        (**self).encryption()
    }

    fn reseal(&mut self, max: usize) -> Result<usize, StoreError> {
        (**self).reseal(max)
    }

    fn rotate_key(&mut self) -> Result<KeyRotation, StoreError> {
        (**self).rotate_key()
    }
}

/// `[store] encryption_key_file` and `accept_cleartext`: how [`SealedStore`] seals the records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncryptionOptions {
    /// The key file (see the `keyring` format in the module docs); `None`: records in clear.
    pub key_file: Option<PathBuf>,
    /// Read records stored in clear although a key file is set (once, to encrypt a store
    /// written without one); they are then re-encrypted in the background.
    pub accept_cleartext: bool,
}

/// How the records are encrypted, for `protego status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EncryptionStatus {
    /// The key file; `None`: records are written in clear.
    pub key_file: Option<PathBuf>,
    /// The id of the key new records are sealed with.
    pub current_key: Option<u32>,
    /// The ids of every key loaded.
    pub keys: Vec<u32>,
    /// How many records lie under each key id (`clear`: not encrypted), as far as this node
    /// read and wrote them (it reads every record when it starts).
    pub records: BTreeMap<String, u64>,
    /// Records not under the current key yet (being re-encrypted in the background). An older
    /// key may be removed from the key file, on every node, once this is 0 and `records` no
    /// longer names it.
    pub reencrypt_pending: u64,
    /// Records re-encrypted since the start.
    pub reencrypted: u64,
    /// Whether records in clear are accepted (`[store] accept_cleartext`).
    pub accept_cleartext: bool,
    /// Why the last re-encryption failed, while it fails.
    #[serde(default)]
    pub error: Option<String>,
}

/// The outcome of [`Store::rotate_key`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyRotation {
    /// The new current key's id.
    pub key_id: u32,
    /// The key file it is in.
    pub key_file: PathBuf,
    /// True if the key was generated and appended to the key file (no newer key was in it);
    /// false if it is the key the operator added to the file beforehand.
    #[serde(default)]
    pub generated: bool,
    /// Records under older keys, to re-encrypt.
    pub reencrypt_pending: u64,
}

/// Why the store failed. Each variant names the file, or for errors after the open, the store
/// as [`Store::describe`] puts it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file (or a missing parent directory) could not be created, opened or inspected.
    #[error("state store {path}: cannot open: {source}", path = path.display())]
    Open {
        /// The file, or the directory that could not be created.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file's permissions let other users read it, and could not be tightened to 0600.
    #[error(
        "state store {path} has mode {mode:04o} and holds keys; cannot tighten it to 0600: {source}",
        path = path.display()
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another process (or another store in this process) has the file open.
    #[error(
        "state store {path} is locked: another process (or another store in this process) has it open",
        path = path.display()
    )]
    Locked {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a valid state store (not a database, damaged, or another program's).
    #[error("state store {path} is not a valid Protego state file: {detail}", path = path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The file was written with a schema this version does not know (by a newer Protego).
    #[error(
        "state store {path} has schema version {found}; this Protego supports version {supported} \
         (was it written by a newer Protego?)",
        path = path.display()
    )]
    Schema {
        /// The file.
        path: PathBuf,
        /// The schema version in the file.
        found: u64,
        /// The schema version this build reads and writes.
        supported: u64,
    },
    /// A commit failed; nothing of it was applied.
    #[error("state store {store}: commit failed: {detail}")]
    Write {
        /// The store, as [`Store::describe`] puts it.
        store: String,
        /// What failed.
        detail: String,
    },
    /// Reading the stored state failed.
    #[error("state store {store}: read failed: {detail}")]
    Read {
        /// The store, as [`Store::describe`] puts it.
        store: String,
        /// What failed.
        detail: String,
    },
    /// A remote store could not be reached in time, or its options are invalid.
    #[error("state store {store}: cannot connect: {detail}")]
    Connect {
        /// The store, as [`Store::describe`] puts it.
        store: String,
        /// What failed.
        detail: String,
    },
    /// A remote store was written with a schema this version does not know (by a newer
    /// Protego).
    #[error(
        "state store {store} has schema version {found}; this Protego supports version \
         {supported} (was it written by a newer Protego?)"
    )]
    RemoteSchema {
        /// The store, as [`Store::describe`] puts it.
        store: String,
        /// The schema version in the store.
        found: u64,
        /// The schema version this build reads and writes.
        supported: u64,
    },
    /// The encryption key file cannot be used (`line` 0: the whole file).
    #[error(
        "state store encryption key file {path}{at}: {detail}",
        path = path.display(),
        at = if *line > 0 { format!(":{line}") } else { String::new() }
    )]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// The offending line (1-based), or 0.
        line: usize,
        /// What is wrong (never the key).
        detail: String,
    },
    /// A record is sealed with a key id the key file does not hold (or no key file is set).
    #[error(
        "state store {store}: record {record} is sealed with key id {key_id}, {missing}",
        missing = if key_file.is_empty() {
            "but [store] has no encryption_key_file".to_owned()
        } else {
            format!(
                "which the key file {key_file} does not hold: add that key's line (from the key \
                 file of the node that made it current) to {key_file}; every control node's key \
                 file must hold every key in use (docs/operations.md, \"Encrypting the store\")"
            )
        }
    )]
    UnknownKey {
        /// The store, as [`Store::describe`] puts it.
        store: String,
        /// The record (`ike_sa/<SPI>` or `config`).
        record: String,
        /// The key id in the record.
        key_id: u32,
        /// The key file (empty: none configured).
        key_file: String,
    },
    /// A sealed record cannot be opened: damaged, altered, moved or truncated, or sealed under
    /// another key with the same id.
    #[error("state store {store}: record {record} cannot be opened: {detail}")]
    Unsealed {
        /// The store, as [`Store::describe`] puts it.
        store: String,
        /// The record (`ike_sa/<SPI>` or `config`).
        record: String,
        /// What failed.
        detail: String,
    },
    /// A record is in clear although a key file is configured, and `accept_cleartext` is off.
    #[error(
        "state store {store}: record {record} is stored in clear, but [store] \
         encryption_key_file is set: refused (whoever can write the store could have planted \
         it). If this store was written before the key file was configured, start once with \
         [store] accept_cleartext = true to encrypt it"
    )]
    Cleartext {
        /// The store, as [`Store::describe`] puts it.
        store: String,
        /// The record (`ike_sa/<SPI>` or `config`).
        record: String,
    },
    /// A key rotation was asked of a store without a key file.
    #[error(
        "state store {store} is not encrypted: set [store] encryption_key_file to encrypt it \
         (then keys can be rotated)"
    )]
    NotEncrypted {
        /// The store, as [`Store::describe`] puts it.
        store: String,
    },
    /// A remote store holds data that is not a Protego state store's (another program's, or
    /// damaged).
    #[error("state store {store} is not a valid Protego state store: {detail}")]
    RemoteCorrupt {
        /// The store, as [`Store::describe`] puts it.
        store: String,
        /// What was wrong.
        detail: String,
    },
}
