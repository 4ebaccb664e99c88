//! [`SealedStore`]: encryption at rest over any backend. Every record (IKE SA snapshots, the
//! applied configuration) is sealed with AES-256-GCM-SIV (RFC 8452) under a key of the key file
//! (`[store] encryption_key_file`, read by `keyring`) before the backend sees it, and
//! opened after it is read, so a copy of the redb file or a dump of etcd holds no key.
//!
//! # Record format (version 1)
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                      Magic "PSEC" (4 octets)                  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  Version (1)  |              Key ID (32 bits, big endian)     |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |               |        Nonce (12 random octets)               ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                 Ciphertext, then the 16-octet tag             ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! The associated data is the 21-octet header followed by the record's identity
//! (`ike_sa/<SPI as 16 lowercase hex digits>` or `config`), so a record moved to another SPI or
//! swapped with the configuration, or a header altered, fails to open. The nonce is drawn
//! fresh from the system's random generator for every record written.
//!
//! A key seals a record per IKE exchange for as long as it is current, billions of records
//! over the years a key may live. With random 96-bit nonces, AES-GCM must stay below 2^32
//! records per key (NIST SP 800-38D, section 8.3): a gateway writing 3000 records a second
//! reaches that in about 17 days, and one repeated nonce reveals GCM's authentication key.
//! AES-GCM-SIV is nonce-misuse resistant: it derives fresh keys from each nonce, and a repeated
//! nonce reveals only whether the two records were the same (RFC 8452, section 9), so random
//! nonces stay safe for far more records than a key will ever seal.
//!
//! # Records in clear
//!
//! Without a key file records are written in clear, as before, and a sealed record is an error
//! (the key file is missing). With a key file, a record in clear (one without the magic) is
//! refused: whoever can write the store could otherwise plant an IKE SA whose keys he chose.
//! `[store] accept_cleartext = true` lets a store written without a key file be opened once:
//! its records in clear are read, and sealed in the background ([`Store::reseal`]).

use super::keyring::KeyRing;
use super::{
    Change, EncryptionOptions, EncryptionStatus, KeyRotation, Snapshot, Store, StoreError,
};
use aws_lc_rs::aead::{Aad, Nonce, NONCE_LEN};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};
use zeroize::Zeroizing;

/// Magic of a sealed record: "Protego SEaled reCord".
pub(crate) const MAGIC: &[u8; 4] = b"PSEC";
/// The record format this build writes and reads.
pub(crate) const VERSION: u8 = 1;
/// Magic, version, key id, nonce.
pub(crate) const HEADER: usize = 4 + 1 + 4 + NONCE_LEN;
/// Length of the AES-GCM-SIV tag.
const TAG: usize = 16;

/// Which record: its identity, bound into the associated data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum RecordId {
    /// The applied configuration.
    Config,
    /// The filters loaded with `protego ctl filter`.
    Filters,
    /// The IKE SA with this own (local) SPI.
    IkeSa(u64),
    /// Chunk `index` of the per-VM route snapshot of generation `generation`
    /// ([`EtcdMedium`](super::EtcdMedium); it seals its records itself).
    RouteChunk(u64, u32),
    /// Journal record `seq` of the per-VM routes of generation `generation`
    /// ([`EtcdMedium`](super::EtcdMedium)).
    RouteLog(u64, u64),
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordId::Config => f.write_str("config"),
            RecordId::Filters => f.write_str("filters"),
            RecordId::IkeSa(spi) => write!(f, "ike_sa/{spi:016x}"),
            RecordId::RouteChunk(generation, index) => {
                write!(f, "routes/snap/{generation:016x}/{index:08x}")
            }
            RecordId::RouteLog(generation, seq) => {
                write!(f, "routes/log/{generation:016x}/{seq:016x}")
            }
        }
    }
}

/// Why a record could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpenError {
    /// Shorter than a header and a tag.
    Truncated(usize),
    /// A format version this build does not read.
    Version(u8),
    /// Sealed with a key id the key ring does not hold.
    UnknownKey(u32),
    /// Sealed, and no key file is configured.
    NoKeyFile(u32),
    /// The tag did not verify: damaged, altered, moved, or another key under the same id.
    Authentication(u32),
    /// In clear, while a key file is configured and clear records are not accepted.
    Cleartext,
}

/// Seals `plaintext` as record `id` under key `key_id` of `keys`.
pub(crate) fn seal(keys: &KeyRing, key_id: u32, id: RecordId, plaintext: &[u8]) -> Snapshot {
    let key = keys.key(key_id).expect("sealing uses a key of the ring");
    let mut nonce = [0u8; NONCE_LEN];
    aws_lc_rs::rand::fill(&mut nonce).expect("the system CSPRNG does not fail once initialised");
    let mut out = Zeroizing::new(Vec::with_capacity(HEADER + plaintext.len() + TAG));
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&key_id.to_be_bytes());
    out.extend_from_slice(&nonce);
    let aad = associated_data(&out[..HEADER], id);
    // Sized for the tag, so sealing in place never leaves a copy of the plaintext behind.
    let mut body = Zeroizing::new(Vec::with_capacity(plaintext.len() + TAG));
    body.extend_from_slice(plaintext);
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(&aad[..]),
        &mut *body,
    )
    .expect("AES-GCM-SIV seals any record shorter than 64 GiB");
    out.extend_from_slice(&body);
    out
}

/// The key id in a sealed record's header; `None` for a record in clear, or one too short to
/// hold a header.
pub(crate) fn key_id_of(record: &[u8]) -> Option<u32> {
    let id = record.strip_prefix(MAGIC)?.get(1..5)?;
    Some(u32::from_be_bytes(
        id.try_into().expect("a range of four bytes"),
    ))
}

/// What an opened record was: its plaintext, and the key that sealed it (`None`: in clear).
pub(crate) struct Opened {
    pub(crate) plaintext: Snapshot,
    pub(crate) key: Option<u32>,
}

/// Opens record `id` as the store gave it. `keys` is `None` without a key file; then records in
/// clear are read as they are. With a key file, records in clear are read only if
/// `accept_cleartext`.
pub(crate) fn open(
    keys: Option<&KeyRing>,
    accept_cleartext: bool,
    id: RecordId,
    record: &[u8],
) -> Result<Opened, OpenError> {
    if !record.starts_with(MAGIC) {
        return match keys {
            Some(_) if !accept_cleartext => Err(OpenError::Cleartext),
            _ => Ok(Opened {
                plaintext: Zeroizing::new(record.to_vec()),
                key: None,
            }),
        };
    }
    if record.len() < HEADER + TAG {
        return Err(OpenError::Truncated(record.len()));
    }
    if record[4] != VERSION {
        return Err(OpenError::Version(record[4]));
    }
    let key_id = key_id_of(record).expect("a record of a header's length has a key id");
    let keys = keys.ok_or(OpenError::NoKeyFile(key_id))?;
    let key = keys.key(key_id).ok_or(OpenError::UnknownKey(key_id))?;
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&record[9..HEADER]);
    let aad = associated_data(&record[..HEADER], id);
    let mut body = Zeroizing::new(record[HEADER..].to_vec());
    let len = key
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&aad[..]),
            &mut body[..],
        )
        .map_err(|_| OpenError::Authentication(key_id))?
        .len();
    body.truncate(len);
    Ok(Opened {
        plaintext: body,
        key: Some(key_id),
    })
}

/// The header followed by the record's identity.
fn associated_data(header: &[u8], id: RecordId) -> Vec<u8> {
    let mut aad = header.to_vec();
    aad.extend_from_slice(id.to_string().as_bytes());
    aad
}

/// The sealing layer over a backend: see the [module documentation](self).
///
/// It knows under which key every record it read or wrote lies (the control plane reads every
/// record when it starts), which is what [`Store::reseal`] re-encrypts after a rotation and what
/// [`Store::encryption`] counts.
pub struct SealedStore {
    inner: Box<dyn Store>,
    keys: Option<KeyRing>,
    accept_cleartext: bool,
    /// The key of each record as last read or written (`None`: in clear).
    records: Mutex<BTreeMap<RecordId, Option<u32>>>,
    /// Records re-encrypted so far.
    reencrypted: u64,
}

impl SealedStore {
    /// Puts the sealing layer over `inner`, with the keys of `options.key_file` (read now; the
    /// format is in `docs/configuration.md`, `[store] encryption_key_file`). Without a key file, records are written in clear and a warning
    /// says so; with `accept_cleartext`, a warning says that records in clear are read.
    pub fn open(inner: Box<dyn Store>, options: &EncryptionOptions) -> Result<Self, StoreError> {
        let keys = options.key_file.as_deref().map(KeyRing::load).transpose()?;
        match &keys {
            None if !inner.at_rest() => {}
            None => tracing::warn!(store = %inner.describe(),
                "the state store holds every IKE SA's keys and the tunnels' PSKs in clear: \
                 set [store] encryption_key_file (see docs/operations.md)"),
            Some(k) if options.accept_cleartext => tracing::warn!(store = %inner.describe(),
                key_file = %k.path().display(),
                "[store] accept_cleartext is set: records stored in clear are read and then \
                 encrypted; remove the setting once `protego status` shows none in clear"),
            Some(k) => tracing::info!(store = %inner.describe(), key_file = %k.path().display(),
                key = k.current(), "state store records are encrypted (AES-256-GCM-SIV)"),
        }
        Ok(SealedStore {
            inner,
            keys,
            accept_cleartext: options.accept_cleartext,
            records: Mutex::new(BTreeMap::new()),
            reencrypted: 0,
        })
    }

    fn records(&self) -> MutexGuard<'_, BTreeMap<RecordId, Option<u32>>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a record read from the backend and notes its key.
    fn open_record(&self, id: RecordId, record: &[u8]) -> Result<Snapshot, StoreError> {
        let opened = open(self.keys.as_ref(), self.accept_cleartext, id, record)
            .map_err(|e| self.open_error(id, e))?;
        self.records().insert(id, opened.key);
        Ok(opened.plaintext)
    }

    fn open_error(&self, id: RecordId, e: OpenError) -> StoreError {
        let store = self.inner.describe();
        let record = id.to_string();
        let key_file = || {
            self.keys
                .as_ref()
                .map_or_else(String::new, |k| k.path().display().to_string())
        };
        match e {
            OpenError::UnknownKey(key_id) => StoreError::UnknownKey {
                store,
                record,
                key_id,
                key_file: key_file(),
            },
            OpenError::NoKeyFile(key_id) => StoreError::UnknownKey {
                store,
                record,
                key_id,
                key_file: String::new(),
            },
            OpenError::Cleartext => StoreError::Cleartext { store, record },
            OpenError::Truncated(len) => StoreError::Unsealed {
                store,
                record,
                detail: format!(
                    "a sealed record of {len} bytes is shorter than its header and tag"
                ),
            },
            OpenError::Version(v) => StoreError::Unsealed {
                store,
                record,
                detail: format!(
                    "sealed record format version {v}; this Protego reads version {VERSION}"
                ),
            },
            OpenError::Authentication(key_id) => StoreError::Unsealed {
                store,
                record,
                detail: format!(
                    "authentication failed under key {key_id} of {}: the record was damaged, \
                     altered or moved, or the key with that id is not the one that sealed it",
                    key_file()
                ),
            },
        }
    }

    /// Seals a change's record with the current key (or leaves it in clear without a key file).
    fn seal_change(&self, change: &Change) -> Change {
        let Some(keys) = &self.keys else {
            return change.clone();
        };
        match change {
            Change::PutIkeSa { spi, snapshot } => Change::PutIkeSa {
                spi: *spi,
                snapshot: seal(keys, keys.current(), RecordId::IkeSa(*spi), snapshot),
            },
            Change::PutConfig { record } => Change::PutConfig {
                record: seal(keys, keys.current(), RecordId::Config, record),
            },
            Change::PutFilters { record } => Change::PutFilters {
                record: seal(keys, keys.current(), RecordId::Filters, record),
            },
            Change::DeleteIkeSa { .. } | Change::DeleteConfig | Change::DeleteFilters => {
                change.clone()
            }
        }
    }

    /// Notes the keys of committed changes.
    fn note_committed(&self, changes: &[Change]) {
        let key = self.keys.as_ref().map(KeyRing::current);
        let mut records = self.records();
        for change in changes {
            match change {
                Change::PutIkeSa { spi, .. } => {
                    records.insert(RecordId::IkeSa(*spi), key);
                }
                Change::DeleteIkeSa { spi } => {
                    records.remove(&RecordId::IkeSa(*spi));
                }
                Change::PutConfig { .. } => {
                    records.insert(RecordId::Config, key);
                }
                Change::DeleteConfig => {
                    records.remove(&RecordId::Config);
                }
                Change::PutFilters { .. } => {
                    records.insert(RecordId::Filters, key);
                }
                Change::DeleteFilters => {
                    records.remove(&RecordId::Filters);
                }
            }
        }
    }
}

impl Store for SealedStore {
    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        let sealed: Vec<Change> = changes.iter().map(|c| self.seal_change(c)).collect();
        self.inner.commit(&sealed)?;
        self.note_committed(changes);
        Ok(())
    }

    fn ike_sas(&self) -> Result<Vec<(u64, Snapshot)>, StoreError> {
        let stored = self.inner.ike_sas()?;
        let mut out = Vec::with_capacity(stored.len());
        for (spi, record) in stored {
            out.push((spi, self.open_record(RecordId::IkeSa(spi), &record)?));
        }
        // Every SA is known now: forget those that are gone.
        self.records().retain(|id, _| match id {
            RecordId::IkeSa(spi) => out.binary_search_by_key(spi, |(s, _)| *s).is_ok(),
            RecordId::Config
            | RecordId::Filters
            | RecordId::RouteChunk(..)
            | RecordId::RouteLog(..) => true,
        });
        Ok(out)
    }

    fn read_ike_sa(&self, spi: u64) -> Result<Option<Snapshot>, StoreError> {
        let id = RecordId::IkeSa(spi);
        match self.inner.read_ike_sa(spi)? {
            Some(record) => self.open_record(id, &record).map(Some),
            None => {
                self.records().remove(&id);
                Ok(None)
            }
        }
    }

    fn applied_config(&self) -> Result<Option<Snapshot>, StoreError> {
        match self.inner.applied_config()? {
            Some(record) => self.open_record(RecordId::Config, &record).map(Some),
            None => {
                self.records().remove(&RecordId::Config);
                Ok(None)
            }
        }
    }

    fn filters(&self) -> Result<Option<Snapshot>, StoreError> {
        match self.inner.filters()? {
            Some(record) => self.open_record(RecordId::Filters, &record).map(Some),
            None => {
                self.records().remove(&RecordId::Filters);
                Ok(None)
            }
        }
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn at_rest(&self) -> bool {
        self.inner.at_rest()
    }

    fn encryption(&self) -> Option<EncryptionStatus> {
        let records = self.records();
        let mut by_key: BTreeMap<String, u64> = BTreeMap::new();
        for key in records.values() {
            let name = key.map_or_else(|| "clear".to_owned(), |k| k.to_string());
            *by_key.entry(name).or_default() += 1;
        }
        let current = self.keys.as_ref().map(KeyRing::current);
        let pending = match current {
            Some(c) => records.values().filter(|k| **k != Some(c)).count() as u64,
            None => 0,
        };
        Some(EncryptionStatus {
            key_file: self.keys.as_ref().map(|k| k.path().to_owned()),
            current_key: current,
            keys: self.keys.as_ref().map(KeyRing::ids).unwrap_or_default(),
            records: by_key,
            reencrypt_pending: pending,
            reencrypted: self.reencrypted,
            accept_cleartext: self.accept_cleartext,
            error: None,
        })
    }

    /// Re-encrypts up to `max` records not under the current key: each is read again from the
    /// backend (the newest state), opened and sealed with the current key, and all of them are
    /// committed together through the backend's ordinary commit (with etcd, guarded by each
    /// key's revision like any commit). The configuration, which may be large, goes alone.
    /// Returns how many records it dealt with (re-encrypted, or found gone).
    fn reseal(&mut self, max: usize) -> Result<usize, StoreError> {
        let Some(current) = self.keys.as_ref().map(KeyRing::current) else {
            return Ok(0);
        };
        let stale: Vec<RecordId> = self
            .records()
            .iter()
            .filter(|(_, key)| **key != Some(current))
            .map(|(id, _)| *id)
            .take(max)
            .collect();
        let mut examined = 0;
        let mut changes = Vec::new();
        for id in stale {
            examined += 1;
            match id {
                // First in the order, and alone.
                RecordId::Config => {
                    if let Some(record) = self.applied_config()? {
                        changes.push(Change::PutConfig { record });
                    }
                    break;
                }
                RecordId::Filters => {
                    if let Some(record) = self.filters()? {
                        changes.push(Change::PutFilters { record });
                    }
                    break;
                }
                RecordId::IkeSa(spi) => {
                    if let Some(snapshot) = self.read_ike_sa(spi)? {
                        changes.push(Change::PutIkeSa { spi, snapshot });
                    }
                }
                // Never noted here: the route medium seals its records itself, and a new
                // generation (written at every compaction) is sealed under the current key.
                RecordId::RouteChunk(..) | RecordId::RouteLog(..) => {}
            }
        }
        self.commit(&changes)?;
        self.reencrypted += changes.len() as u64;
        Ok(examined)
    }

    /// Makes the key file's newer key current, or generates one ([`KeyRing::rotate`]); the
    /// records under older keys are then re-encrypted by [`Store::reseal`].
    fn rotate_key(&mut self) -> Result<KeyRotation, StoreError> {
        let Some(keys) = self.keys.as_mut() else {
            return Err(StoreError::NotEncrypted {
                store: self.inner.describe(),
            });
        };
        let rotated = keys.rotate()?;
        let key_file = keys.path().to_owned();
        let reencrypt_pending = self
            .records()
            .values()
            .filter(|k| **k != Some(rotated.id))
            .count() as u64;
        tracing::info!(store = %self.inner.describe(), key_file = %key_file.display(),
            key = rotated.id, generated = rotated.generated, records = reencrypt_pending,
            "new current store encryption key; re-encrypting the records under older keys in \
             the background");
        Ok(KeyRotation {
            key_id: rotated.id,
            key_file,
            generated: rotated.generated,
            reencrypt_pending,
        })
    }
}

impl fmt::Debug for SealedStore {
    /// The backend and the key ids, never the keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedStore")
            .field("store", &self.inner.describe())
            .field("keys", &self.keys)
            .field("accept_cleartext", &self.accept_cleartext)
            .finish_non_exhaustive()
    }
}
