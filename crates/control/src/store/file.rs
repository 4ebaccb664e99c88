//! [`FileStore`]: the embedded backend, one [redb](https://www.redb.org) database file on a local
//! disk.
//!
//! Layout (schema version [`SCHEMA_VERSION`]): table `meta` (`&str` -> `u64`) holds
//! `schema_version`; table `ike_sas` (`u64` SPI -> bytes) holds one snapshot per IKE SA; table
//! `config` (`&str` -> bytes), created by the first `protego ctl apply`, holds the applied
//! configuration under the key `applied`. A file with any other schema version is refused, so
//! an older Protego never misreads what a newer one wrote (one that predates `config` ignores
//! the table, and runs its configuration file's tunnels).

use super::{Change, Snapshot, Store, StoreError};
use redb::backends::FileBackend;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::fmt;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The schema version this build reads and writes.
pub(super) const SCHEMA_VERSION: u64 = 1;
/// Key of the schema version in [`META`].
pub(super) const SCHEMA_KEY: &str = "schema_version";
/// Facts about the file itself.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// IKE SA snapshots by the SA's own (local) SPI.
pub(super) const IKE_SAS: TableDefinition<u64, &[u8]> = TableDefinition::new("ike_sas");
/// The configuration applied with `protego ctl apply` (under [`CONFIG_KEY`]) and the filters
/// loaded with `protego ctl filter` (under [`FILTERS_KEY`]).
pub(super) const CONFIG: TableDefinition<&str, &[u8]> = TableDefinition::new("config");
/// The key of [`CONFIG`] holding the applied configuration.
const CONFIG_KEY: &str = "applied";
/// The key of [`CONFIG`] holding the filters loaded with `protego ctl filter`.
const FILTERS_KEY: &str = "filters";

/// The embedded file store: one redb database file, opened by one process at a time.
///
/// Every [`Store::commit`] is one redb write transaction with immediate durability: the file
/// is fsync'd before `commit` returns, and a crash at any point leaves either the whole
/// transaction or none of it. After a failed commit (an I/O error), redb may refuse further
/// commits on this handle; the store is then down until it is reopened.
pub struct FileStore {
    db: Database,
    path: PathBuf,
}

impl FileStore {
    /// Opens the store at `path`, creating it (mode 0600, missing parent directories mode 0700)
    /// if it does not exist.
    ///
    /// An existing file whose mode is not 0600 is tightened to 0600 (it holds keys); if that is
    /// not possible the open is refused with [`StoreError::Permissions`]. Fails with
    /// [`StoreError::Locked`] if another process (or another `FileStore` in this process) has
    /// the file open, at once rather than waiting; with [`StoreError::Corrupt`] if the file is
    /// not a Protego state file; with [`StoreError::Schema`] if it was written with another
    /// schema version. Every page's checksum is verified on open.
    pub fn open(path: &Path) -> Result<FileStore, StoreError> {
        let open_err = |path: &Path, source| StoreError::Open {
            path: path.to_owned(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| open_err(parent, e))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| open_err(path, e))?;
        let metadata = file.metadata().map_err(|e| open_err(path, e))?;
        if !metadata.is_file() {
            return Err(open_err(
                path,
                io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        tighten_mode(&file, path, metadata.permissions().mode())?;

        let backend = FileBackend::new(file).map_err(|e| open_failure(path, e.into()))?;
        let db = Database::builder()
            .set_check_integrity_on_open(true)
            .create_with_backend(backend)
            .map_err(|e| open_failure(path, e.into()))?;
        let store = FileStore {
            db,
            path: path.to_owned(),
        };
        store
            .check_schema()
            .map_err(|e| open_failure(path, e))
            .and_then(|r| r)?;
        Ok(store)
    }

    /// The file this store is in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks the schema version, writing it into a new (empty) database. The outer error is
    /// redb's, the inner one ours.
    fn check_schema(&self) -> Result<Result<(), StoreError>, redb::Error> {
        let read = self.db.begin_read()?;
        match read.open_table(META) {
            Ok(meta) => {
                let found = meta.get(SCHEMA_KEY)?.map(|v| v.value());
                return Ok(match found {
                    Some(SCHEMA_VERSION) => Ok(()),
                    Some(found) if found > SCHEMA_VERSION => Err(StoreError::Schema {
                        path: self.path.clone(),
                        found,
                        supported: SCHEMA_VERSION,
                    }),
                    Some(found) => Err(self.corrupt(format!("invalid schema version {found}"))),
                    None => Err(self.corrupt("no schema version in table `meta`".into())),
                });
            }
            Err(redb::TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(e.into()),
        }
        if read.list_tables()?.next().is_some() || read.list_multimap_tables()?.next().is_some() {
            return Ok(Err(self.corrupt(
                "a redb database of another program (it has no table `meta`)".into(),
            )));
        }
        drop(read);
        let write = self.db.begin_write()?;
        {
            let mut meta = write.open_table(META)?;
            meta.insert(SCHEMA_KEY, SCHEMA_VERSION)?;
            write.open_table(IKE_SAS)?;
        }
        write.commit()?;
        Ok(Ok(()))
    }

    fn corrupt(&self, detail: String) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            detail,
        }
    }

    fn write_error(&self, e: impl Into<redb::Error>) -> StoreError {
        StoreError::Write {
            store: self.describe(),
            detail: e.into().to_string(),
        }
    }

    fn read_error(&self, e: impl Into<redb::Error>) -> StoreError {
        StoreError::Read {
            store: self.describe(),
            detail: e.into().to_string(),
        }
    }

    /// The record under `key` of [`CONFIG`], if any.
    fn read_config(&self, key: &str) -> Result<Option<Snapshot>, StoreError> {
        let read = self.db.begin_read().map_err(|e| self.read_error(e))?;
        let table = match read.open_table(CONFIG) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(self.read_error(e)),
        };
        let value = table.get(key).map_err(|e| self.read_error(e))?;
        Ok(value.map(|v| Zeroizing::new(v.value().to_vec())))
    }
}

/// Sets the file's mode to 0600 unless it already is, and refuses a file that stays readable
/// by others (a file system that ignores modes, or a file owned by another user).
fn tighten_mode(file: &File, path: &Path, mode: u32) -> Result<(), StoreError> {
    if mode & 0o7777 == 0o600 {
        return Ok(());
    }
    let refuse = |source| StoreError::Permissions {
        path: path.to_owned(),
        mode: mode & 0o7777,
        source,
    };
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(refuse)?;
    let now = file.metadata().map_err(refuse)?.permissions().mode();
    if now & 0o077 != 0 {
        return Err(refuse(io::Error::other(format!(
            "the file system left mode {:04o}",
            now & 0o7777
        ))));
    }
    Ok(())
}

/// Maps a redb error met while opening the file.
fn open_failure(path: &Path, e: redb::Error) -> StoreError {
    let path = path.to_owned();
    match e {
        redb::Error::DatabaseAlreadyOpen | redb::Error::LockProtocolMismatch => {
            StoreError::Locked { path }
        }
        // redb reports a file without its magic number as invalid data, and one shorter than
        // its header as an unexpected end of file.
        redb::Error::Io(source)
            if matches!(
                source.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
            ) =>
        {
            StoreError::Corrupt {
                path,
                detail: source.to_string(),
            }
        }
        redb::Error::Io(source) => StoreError::Open { path, source },
        e => StoreError::Corrupt {
            path,
            detail: e.to_string(),
        },
    }
}

impl Store for FileStore {
    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        // Durability is redb's default, `Durability::Immediate`: `commit` returns after fsync.
        // On any error the transaction is dropped, which aborts it: nothing is applied.
        let write = self.db.begin_write().map_err(|e| self.write_error(e))?;
        {
            let mut table = write.open_table(IKE_SAS).map_err(|e| self.write_error(e))?;
            // Created by the first apply or filter load, not by every IKE commit.
            let touches_config = changes.iter().any(|c| {
                matches!(
                    c,
                    Change::PutConfig { .. }
                        | Change::DeleteConfig
                        | Change::PutFilters { .. }
                        | Change::DeleteFilters
                )
            });
            let mut config = touches_config
                .then(|| write.open_table(CONFIG))
                .transpose()
                .map_err(|e| self.write_error(e))?;
            for change in changes {
                match change {
                    Change::PutIkeSa { spi, snapshot } => {
                        table
                            .insert(*spi, snapshot.as_slice())
                            .map_err(|e| self.write_error(e))?;
                    }
                    Change::DeleteIkeSa { spi } => {
                        table.remove(*spi).map_err(|e| self.write_error(e))?;
                    }
                    Change::PutConfig { record } | Change::PutFilters { record } => {
                        let key = match change {
                            Change::PutConfig { .. } => CONFIG_KEY,
                            _ => FILTERS_KEY,
                        };
                        if let Some(config) = config.as_mut() {
                            config
                                .insert(key, record.as_slice())
                                .map_err(|e| self.write_error(e))?;
                        }
                    }
                    Change::DeleteConfig | Change::DeleteFilters => {
                        let key = match change {
                            Change::DeleteConfig => CONFIG_KEY,
                            _ => FILTERS_KEY,
                        };
                        if let Some(config) = config.as_mut() {
                            config.remove(key).map_err(|e| self.write_error(e))?;
                        }
                    }
                }
            }
        }
        write.commit().map_err(|e| self.write_error(e))
    }

    fn ike_sas(&self) -> Result<Vec<(u64, Snapshot)>, StoreError> {
        let read = self.db.begin_read().map_err(|e| self.read_error(e))?;
        let table = match read.open_table(IKE_SAS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(self.read_error(e)),
        };
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.read_error(e))? {
            let (spi, snapshot) = entry.map_err(|e| self.read_error(e))?;
            out.push((spi.value(), Zeroizing::new(snapshot.value().to_vec())));
        }
        Ok(out)
    }

    fn applied_config(&self) -> Result<Option<Snapshot>, StoreError> {
        self.read_config(CONFIG_KEY)
    }

    fn filters(&self) -> Result<Option<Snapshot>, StoreError> {
        self.read_config(FILTERS_KEY)
    }

    fn describe(&self) -> String {
        format!("file {}", self.path.display())
    }

    fn read_ike_sa(&self, spi: u64) -> Result<Option<Snapshot>, StoreError> {
        let read = self.db.begin_read().map_err(|e| self.read_error(e))?;
        let table = match read.open_table(IKE_SAS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(self.read_error(e)),
        };
        let value = table.get(spi).map_err(|e| self.read_error(e))?;
        Ok(value.map(|v| Zeroizing::new(v.value().to_vec())))
    }
}

impl fmt::Debug for FileStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}
