//! [`EtcdMedium`]: the per-VM route store ([`crate::routes::RouteStore`]) of the cluster's
//! control nodes, in etcd under the store's prefix `P`, not one key per VM:
//!
//! - `P/routes/head`: `generation=<g> chunks=<n> bytes=<b> fnv=<16 hex digits>`, the snapshot
//!   in use (FNV-1a 64 over its bytes; in clear: it names no tenant's address);
//! - `P/routes/snap/<g:016x>/<i:08x>`: the snapshot of generation `g` (the data path's
//!   `overlay::snapshot` bytes) in chunks of at most 1 MiB (etcd refuses requests over
//!   `--max-request-bytes`, 1.5 MiB by default), chunk `i` from 0;
//! - `P/routes/log/<g:016x>/<seq:016x>`: one record per single change after the snapshot of
//!   generation `g`, numbered from 1 (`+ tenant,vnet,address,host` or
//!   `- tenant,vnet,address`).
//!
//! Chunks and log records are sealed with the key ring of `[store] encryption_key_file` when
//! one is set (read again at every compaction, so a new generation is sealed under the file's
//! newest key), as [`SealedStore`](crate::store::SealedStore) seals its records (AES-256-GCM-SIV,
//! the record's name `routes/snap/<g>/<i>` or `routes/log/<g>/<seq>` in the associated data, so
//! a chunk moved to another place does not open); they hold the tenants' addresses.
//!
//! Every write is an etcd transaction guarded by the schema key and, for a fenced store, by the
//! leader's fence ([`super::super::Fence`]): a deposed leader writes nothing. A compaction
//! writes the new generation's chunks (one transaction each, after deleting what a compaction
//! that crashed before its flip left under that generation), then flips the head in one
//! transaction, then deletes the older generations' chunks and logs. A crash before the flip
//! leaves the old generation whole (the head still names it); after it, the old generation's
//! keys are ignored and deleted at the next compaction. A log record is written only while the
//! head is the one this medium read or wrote (guarded by its value), and only where none is.
//!
//! A snapshot is checked whole when read: every chunk present (a missing one is named), its
//! seal, the total length and the checksum of the head.

use super::{EtcdStore, MAX_RESPONSE_BYTES, SCHEMA_VERSION};
use crate::routes::{JournalRead, MediumError, RouteMedium, WriteSnapshot};
use crate::store::keyring::KeyRing;
use crate::store::sealed::{open, seal, OpenError, RecordId};
use crate::store::{EncryptionOptions, StoreError};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use fnv::FnvHasher;
use std::fmt;
use std::hash::Hasher;
use std::io::{self, Write};

/// The largest chunk of a snapshot (before sealing: 37 bytes more).
pub const MAX_CHUNK: usize = 1 << 20;
/// Chunks read per request (each up to 1 MiB; the answer stays below the client's limit).
const CHUNK_PAGE: i64 = 32;
/// Log records read per request.
const LOG_PAGE: i64 = 1024;

/// The per-VM route store's medium in etcd (see the module docs).
pub struct EtcdMedium {
    store: EtcdStore,
    /// `P/routes/head`.
    head: String,
    /// `P/routes/snap/`.
    snap: String,
    /// `P/routes/log/`.
    log: String,
    keys: Option<KeyRing>,
    accept_cleartext: bool,
    chunk: usize,
    /// The head as last read or written (the value appends are guarded by).
    current: Option<String>,
    /// The revision the head was last read at (0: none pending), for the reads after it.
    pinned: i64,
    /// The next log record's number in the current generation (from 1: the number is what
    /// errors call the record's line).
    next_seq: u64,
}

/// The head's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    generation: u64,
    chunks: u32,
    bytes: u64,
    fnv: u64,
}

impl Head {
    fn text(&self) -> String {
        format!(
            "generation={} chunks={} bytes={} fnv={:016x}",
            self.generation, self.chunks, self.bytes, self.fnv
        )
    }

    fn parse(text: &str) -> Result<Head, String> {
        let mut fields = text.split(' ');
        let mut field = |name: &str, radix: u32| -> Result<u64, String> {
            let f = fields.next().unwrap_or_default();
            let value = f
                .strip_prefix(name)
                .and_then(|v| v.strip_prefix('='))
                .ok_or_else(|| format!("expected {name}=…, found {f:?}"))?;
            u64::from_str_radix(value, radix).map_err(|_| format!("bad {name} {value:?}"))
        };
        let head = Head {
            generation: field("generation", 10)?,
            chunks: u32::try_from(field("chunks", 10)?).map_err(|_| "too many chunks")?,
            bytes: field("bytes", 10)?,
            fnv: field("fnv", 16)?,
        };
        if fields.next().is_some() {
            return Err("trailing fields".into());
        }
        Ok(head)
    }
}

impl EtcdMedium {
    /// The route medium on `store` (a store of its own, fenced like the control node's state
    /// store when it is the cluster's leader), sealing with the keys of `encryption.key_file`
    /// if set.
    pub fn new(store: EtcdStore, encryption: &EncryptionOptions) -> Result<Self, StoreError> {
        let keys = encryption
            .key_file
            .as_deref()
            .map(KeyRing::load)
            .transpose()?;
        let base = store.keys.all.clone();
        Ok(Self {
            store,
            head: format!("{base}routes/head"),
            snap: format!("{base}routes/snap/"),
            log: format!("{base}routes/log/"),
            keys,
            accept_cleartext: encryption.accept_cleartext,
            chunk: MAX_CHUNK,
            current: None,
            pinned: 0,
            next_seq: 1,
        })
    }

    /// Chunks of at most `bytes` (1 to [`MAX_CHUNK`]; tests use small ones).
    pub fn with_chunk_size(mut self, bytes: usize) -> Self {
        self.chunk = bytes.clamp(1, MAX_CHUNK);
        self
    }

    /// The key of chunk `index` of generation `generation`.
    pub fn chunk_key(&self, generation: u64, index: u32) -> String {
        format!("{}{generation:016x}/{index:08x}", self.snap)
    }

    /// The key of log record `seq` of generation `generation`.
    pub fn log_key(&self, generation: u64, seq: u64) -> String {
        format!("{}{generation:016x}/{seq:016x}", self.log)
    }

    /// The head's key.
    pub fn head_key(&self) -> &str {
        &self.head
    }

    fn seal(&self, id: RecordId, bytes: &[u8]) -> Vec<u8> {
        match &self.keys {
            Some(keys) => seal(keys, keys.current(), id, bytes).to_vec(),
            None => bytes.to_vec(),
        }
    }

    fn open(&self, key: &str, id: RecordId, record: &[u8]) -> Result<Vec<u8>, MediumError> {
        open(self.keys.as_ref(), self.accept_cleartext, id, record)
            .map(|o| o.plaintext.to_vec())
            .map_err(|e| MediumError::new(key, unsealed(e)))
    }

    /// The guard of every write: the schema, the fence, and `extra`.
    fn guard(&self, extra: Vec<Compare>) -> Vec<Compare> {
        let mut guard = vec![Compare::value(
            self.store.keys.schema.clone(),
            CompareOp::Equal,
            SCHEMA_VERSION.to_string(),
        )];
        if let Some(fence) = &self.store.fence {
            guard.extend(fence.compares());
        }
        guard.extend(extra);
        guard
    }

    /// Runs a guarded transaction; `at` names the key for errors.
    fn write(&self, at: &str, extra: Vec<Compare>, ops: Vec<TxnOp>) -> Result<(), MediumError> {
        let txn = Txn::new().when(self.guard(extra)).and_then(ops);
        let response = self
            .store
            .call(|mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .map_err(|detail| MediumError::new(at, format!("not written: {detail}")))?;
        if !response.succeeded() {
            let who = match &self.store.fence {
                Some(f) => format!(
                    "this node ({}) is no longer the leader of term {}, ",
                    f.name, f.term
                ),
                None => String::new(),
            };
            return Err(MediumError::new(
                at,
                format!("not written: {who}the schema key changed, or another writer changed the route head"),
            ));
        }
        Ok(())
    }

    /// Every key and value under `[start, end)` at one revision, in key order: `revision` if
    /// it is positive, else the revision of the first answer, which is left in `revision`.
    fn range(
        &self,
        start: &str,
        end: &str,
        page: i64,
        revision: &mut i64,
    ) -> Result<Vec<(String, Vec<u8>)>, MediumError> {
        let mut out = Vec::new();
        let mut from = start.as_bytes().to_vec();
        loop {
            let mut options = GetOptions::new().with_range(end).with_limit(page);
            if *revision > 0 {
                options = options.with_revision(*revision);
            }
            let mut answer = self
                .store
                .call(|client| {
                    let (key, options) = (from.clone(), options.clone());
                    async move {
                        client
                            .kv_client()
                            .max_decoding_message_size(MAX_RESPONSE_BYTES)
                            .get(key, Some(options))
                            .await
                    }
                })
                .map_err(|detail| MediumError::new(start, format!("read failed: {detail}")))?;
            if *revision <= 0 {
                *revision = answer.header().map_or(0, |h| h.revision());
            }
            let more = answer.more();
            let kvs = answer.take_kvs();
            let Some(last) = kvs.last() else { break };
            from = last.key().to_vec();
            from.push(0);
            for kv in kvs {
                let (key, value) = kv.into_key_value();
                out.push((String::from_utf8_lossy(&key).into_owned(), value));
            }
            if !more {
                break;
            }
        }
        Ok(out)
    }

    /// The head, read at a revision the reads of its chunks and log that follow use too (so
    /// a compaction by another node in between cannot make a chunk look missing).
    fn read_head(&mut self) -> Result<Option<Head>, MediumError> {
        let mut revision = 0;
        let found = self.range(&self.head, &format!("{}\0", self.head), 1, &mut revision)?;
        self.pinned = revision;
        let Some((_, value)) = found.into_iter().next() else {
            self.current = None;
            return Ok(None);
        };
        let text = String::from_utf8(value)
            .map_err(|_| MediumError::new(&self.head, "the route head is not text"))?;
        let head = Head::parse(&text).map_err(|e| {
            MediumError::new(&self.head, format!("damaged route head {text:?}: {e}"))
        })?;
        self.current = Some(text);
        Ok(Some(head))
    }

    /// The guard that the head is still the one this medium read or wrote (or that there is
    /// none, if it read none).
    fn head_unchanged(&self) -> Compare {
        match &self.current {
            Some(text) => Compare::value(self.head.clone(), CompareOp::Equal, text.clone()),
            None => Compare::create_revision(self.head.clone(), CompareOp::Equal, 0),
        }
    }

    /// `<prefix><generation:016x>/`, and the end of its range.
    fn generation_range(prefix: &str, generation: u64) -> (String, String) {
        (
            format!("{prefix}{generation:016x}/"),
            format!("{prefix}{generation:016x}0"),
        )
    }
}

/// Why a route record could not be opened, in words.
fn unsealed(e: OpenError) -> String {
    match e {
        OpenError::Truncated(n) => format!("sealed record cut short ({n} bytes)"),
        OpenError::Version(v) => format!("sealed record of unknown format version {v}"),
        OpenError::UnknownKey(id) => {
            format!("sealed with key id {id}, which the key file does not hold")
        }
        OpenError::NoKeyFile(id) => {
            format!("sealed with key id {id}, but [store] has no encryption_key_file")
        }
        OpenError::Authentication(id) => format!(
            "sealed record (key id {id}) does not open: damaged, altered or moved to another key"
        ),
        OpenError::Cleartext => "record in clear, but [store] encryption_key_file is set".into(),
    }
}

/// Writes a snapshot's bytes as chunks of a generation, each put as it fills.
struct Chunks<'a> {
    medium: &'a EtcdMedium,
    generation: u64,
    buf: Vec<u8>,
    index: u32,
    bytes: u64,
    /// FNV-1a, 64 bits (`fnv`), over the snapshot's bytes: notices a torn or mixed-up
    /// snapshot.
    fnv: FnvHasher,
    /// The first failure, with the key it names (the writer returns a plain I/O error).
    failed: Option<MediumError>,
}

impl Chunks<'_> {
    fn put(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let key = self.medium.chunk_key(self.generation, self.index);
        let value = self
            .medium
            .seal(RecordId::RouteChunk(self.generation, self.index), &self.buf);
        if let Err(e) =
            self.medium
                .write(&key, Vec::new(), vec![TxnOp::put(key.clone(), value, None)])
        {
            let text = e.to_string();
            self.failed = Some(e);
            return Err(io::Error::other(text));
        }
        self.index += 1;
        self.buf.clear();
        Ok(())
    }
}

impl Write for Chunks<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = self.medium.chunk - self.buf.len();
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        self.fnv.write(&data[..n]);
        self.bytes += n as u64;
        if self.buf.len() == self.medium.chunk {
            self.put()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Chunks are whole or not written: the last, partial one is put by `finish`.
        Ok(())
    }
}

impl RouteMedium for EtcdMedium {
    fn snapshot_at(&self) -> String {
        self.head.clone()
    }

    fn journal_at(&self) -> String {
        self.log.clone()
    }

    fn read_snapshot(&mut self) -> Result<Option<(u64, Vec<u8>)>, MediumError> {
        let Some(head) = self.read_head()? else {
            return Ok(None);
        };
        let (start, end) = Self::generation_range(&self.snap, head.generation);
        let mut revision = self.pinned;
        let found = self.range(&start, &end, CHUNK_PAGE, &mut revision)?;
        // The head is read in clear: reserve no more than its chunks can hold.
        let most = u64::from(head.chunks).saturating_mul(MAX_CHUNK as u64);
        let mut bytes = Vec::with_capacity(usize::try_from(head.bytes.min(most)).unwrap_or(0));
        let mut found = found.into_iter().peekable();
        for index in 0..head.chunks {
            let key = self.chunk_key(head.generation, index);
            // Keys sort as the indexes do (fixed-width hex): chunk `index` is next, or missing.
            while found.peek().is_some_and(|(k, _)| *k < key) {
                found.next();
            }
            let Some((_, value)) = found.next_if(|(k, _)| *k == key) else {
                return Err(MediumError::new(
                    &key,
                    format!(
                        "chunk {index} of {} of the route snapshot of generation {} is missing",
                        head.chunks, head.generation
                    ),
                ));
            };
            let chunk = self.open(&key, RecordId::RouteChunk(head.generation, index), &value)?;
            bytes.extend_from_slice(&chunk);
        }
        let mut fnv = FnvHasher::default();
        fnv.write(&bytes);
        if bytes.len() as u64 != head.bytes || fnv.finish() != head.fnv {
            return Err(MediumError::new(
                &self.head,
                format!(
                    "the route snapshot of generation {} is torn: its {} chunks hold {} bytes \
                     (checksum {:016x}), the head says {} bytes (checksum {:016x})",
                    head.generation,
                    head.chunks,
                    bytes.len(),
                    fnv.finish(),
                    head.bytes,
                    head.fnv
                ),
            ));
        }
        Ok(Some((head.generation, bytes)))
    }

    fn read_journal(&mut self, snapshot: u64) -> Result<Option<JournalRead>, MediumError> {
        let (start, end) = Self::generation_range(&self.log, snapshot);
        // At the revision the snapshot was read at, if it was just read.
        let mut revision = std::mem::take(&mut self.pinned);
        let found = self.range(&start, &end, LOG_PAGE, &mut revision)?;
        let mut out = JournalRead {
            generation: snapshot,
            ..JournalRead::default()
        };
        self.next_seq = 1;
        for (key, value) in found {
            let seq = key
                .strip_prefix(&start)
                .filter(|s| s.len() == 16)
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .ok_or_else(|| MediumError::new(&key, "not a route log key"))?;
            let text = self.open(&key, RecordId::RouteLog(snapshot, seq), &value)?;
            let text = String::from_utf8(text)
                .map_err(|_| MediumError::new(&key, "route log record is not text"))?;
            out.lines
                .push((usize::try_from(seq).unwrap_or(usize::MAX), text));
            self.next_seq = seq + 1;
        }
        Ok((!out.lines.is_empty()).then_some(out))
    }

    fn write_snapshot(
        &mut self,
        generation: u64,
        write: &mut WriteSnapshot<'_>,
    ) -> Result<usize, MediumError> {
        // The key file again: a generation is sealed under its newest key (a rotation reaches
        // the routes at the next compaction, and at the latest at the next start's).
        if let Some(path) = self.keys.as_ref().map(|k| k.path().to_owned()) {
            match KeyRing::load(&path) {
                Ok(keys) => self.keys = Some(keys),
                Err(e) => {
                    tracing::warn!(error = %e, "key file not read again; the route snapshot is sealed with the keys read before")
                }
            }
        }
        // Never a generation the head names (or an older one): its chunks are the snapshot.
        let named = self
            .current
            .as_deref()
            .and_then(|t| Head::parse(t).ok())
            .map(|h| h.generation);
        if named.is_some_and(|g| g >= generation) {
            return Err(MediumError::new(
                &self.head,
                format!(
                    "not written: the route head names generation {}, not older than {generation}",
                    named.unwrap_or_default()
                ),
            ));
        }
        // What a compaction that stopped before its flip left under this generation.
        let (snap_start, snap_end) = Self::generation_range(&self.snap, generation);
        let (log_start, log_end) = Self::generation_range(&self.log, generation);
        self.write(
            &snap_start,
            vec![self.head_unchanged()],
            vec![
                TxnOp::delete(
                    snap_start.clone(),
                    Some(etcd_client::DeleteOptions::new().with_range(snap_end)),
                ),
                TxnOp::delete(
                    log_start.clone(),
                    Some(etcd_client::DeleteOptions::new().with_range(log_end)),
                ),
            ],
        )?;
        let mut chunks = Chunks {
            medium: self,
            generation,
            buf: Vec::with_capacity(self.chunk),
            index: 0,
            bytes: 0,
            fnv: FnvHasher::default(),
            failed: None,
        };
        let written = write(&mut chunks).and_then(|n| {
            chunks.put().map_err(|e| e.to_string())?;
            Ok(n)
        });
        let n = match written {
            Ok(n) => n,
            Err(e) => {
                return Err(chunks
                    .failed
                    .take()
                    .unwrap_or_else(|| MediumError::new(&snap_start, e)))
            }
        };
        let head = Head {
            generation,
            chunks: chunks.index,
            bytes: chunks.bytes,
            fnv: chunks.fnv.finish(),
        }
        .text();
        // The flip: from here on the new generation is the snapshot. A failed answer may
        // hide a flip that landed (a timeout after the commit): the head read again says.
        let flip = TxnOp::put(self.head.clone(), head.clone(), None);
        if let Err(e) = self.write(&self.head, vec![self.head_unchanged()], vec![flip]) {
            let landed = self.read_head().is_ok() && self.current.as_deref() == Some(&head);
            if !landed {
                return Err(e);
            }
            tracing::warn!(error = %e, "the route head's flip answered with an error but landed");
        }
        self.current = Some(head);
        self.next_seq = 1;
        // The older generations (and their logs) are garbage now; a failure here costs space
        // only, and the next compaction deletes them.
        let (old_snap, _) = Self::generation_range(&self.snap, generation);
        let (old_log, _) = Self::generation_range(&self.log, generation);
        let cleanup = self.write(
            &self.snap,
            Vec::new(),
            vec![
                TxnOp::delete(
                    self.snap.clone(),
                    Some(etcd_client::DeleteOptions::new().with_range(old_snap)),
                ),
                TxnOp::delete(
                    self.log.clone(),
                    Some(etcd_client::DeleteOptions::new().with_range(old_log)),
                ),
            ],
        );
        if let Err(e) = cleanup {
            tracing::warn!(error = %e, "older route snapshot generations not deleted; the next compaction tries again");
        }
        Ok(n)
    }

    fn start_journal(&mut self, _generation: u64) -> Result<(), MediumError> {
        // The log of a new generation is empty: its range was cleared before the flip.
        self.next_seq = 1;
        Ok(())
    }

    fn append(&mut self, generation: u64, line: &str) -> Result<(), MediumError> {
        let seq = self.next_seq;
        let key = self.log_key(generation, seq);
        // Numbers are not reused, even after a failure: an ambiguous write may have landed.
        self.next_seq += 1;
        let Some(head) = self.current.clone() else {
            return Err(MediumError::new(&key, "no route snapshot to append to"));
        };
        let value = self.seal(RecordId::RouteLog(generation, seq), line.as_bytes());
        let written = self.write(
            &key,
            vec![
                Compare::value(self.head.clone(), CompareOp::Equal, head),
                Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            ],
            vec![TxnOp::put(key.clone(), value, None)],
        );
        if written.is_err() {
            // The head this medium holds may be stale (another writer, or a flip whose answer
            // was lost): read it again, so that the next write is guarded by the real one.
            let _ = self.read_head();
        }
        written
    }
}

impl fmt::Debug for EtcdMedium {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdMedium")
            .field("store", &self.store)
            .field("head", &self.head)
            .field("sealed", &self.keys.is_some())
            .finish_non_exhaustive()
    }
}
