//! Where the per-VM overlay routes of `protego up` survive a restart (issue 16 §2): not one
//! store record per VM, but two files next to the state store (`[store] path`, e.g.
//! `/var/lib/protego/state.redb.routes` and `….routes.log`):
//!
//! - the **snapshot**: a header (`PGRTGEN1`, the generation, its complement) and the data
//!   path's compact binary form of every entry (`overlay::snapshot`: about 13 bytes per IPv4
//!   entry, a hash over the whole), replaced atomically (written to a temporary file, synced,
//!   renamed over the old one, the directory synced);
//! - the **journal** of the single changes since: a header line naming the snapshot's
//!   generation, then `+ tenant,vnet,address,host` and `- tenant,vnet,address` lines,
//!   appended and synced before `ctl route add|del` answers.
//!
//! A bulk load (`ctl route load`), every [`COMPACT_AFTER`] journal lines and
//! [`RouteStore::compact`] write the snapshot of the next generation, then a new journal of
//! that generation (created, synced, its directory synced). At start the snapshot is
//! restored and the journal replayed if it is of the snapshot's generation; the journal of
//! the generation before (a compaction stopped after the rename) is already in the snapshot
//! and is ignored. A last journal line without its newline is a write a crash cut short,
//! never answered: ignored, and cut off before anything is appended after it; a damaged
//! complete last line is skipped with a warning, a damaged line before it stops the start.
//! A line whose VNet is no longer configured is skipped with a warning, as are the
//! snapshot's entries of such VNets; the result is written as the new snapshot, the files
//! found kept beside it as `….routes.prev` and `….routes.log.prev`.
//!
//! The change is applied to the data path first and recorded after: a crash in between
//! loses a change the operator saw no answer for.

use crate::error::Error;
use datapath::{DataPath, RouteChange, RouteChangeReport, VmRoute};
use ids::TenantId;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// Journal lines after which a new snapshot is written.
pub const COMPACT_AFTER: usize = 100_000;

/// A change recorded in the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// `route add`.
    Add(VmRoute),
    /// `route del`.
    Del {
        /// The VNet's tenant.
        tenant: TenantId,
        /// The VNet's name.
        vnet: String,
        /// The VM's address.
        address: IpAddr,
    },
}

impl Recorded {
    /// The journal line (without its newline).
    pub fn line(&self) -> String {
        match self {
            Recorded::Add(r) => format!("+ {},{},{},{}", r.tenant, r.vnet, r.address, r.host),
            Recorded::Del {
                tenant,
                vnet,
                address,
            } => format!("- {tenant},{vnet},{address}"),
        }
    }

    /// Parses a journal line (`n`: its 1-based number, for errors).
    pub fn parse(n: usize, line: &str) -> Result<Self, String> {
        if let Some(rest) = line.strip_prefix("+ ") {
            let r = overlay::routes::parse_line(n, rest).map_err(|e| e.to_string())?;
            let tenant = TenantId::new(&r.tenant).map_err(|e| format!("line {n}: {e}"))?;
            return Ok(Recorded::Add(VmRoute {
                tenant,
                vnet: r.vnet.into_owned(),
                address: r.address,
                host: r.host,
            }));
        }
        if let Some(rest) = line.strip_prefix("- ") {
            let f: Vec<&str> = rest.split(',').map(str::trim).collect();
            let [tenant, vnet, address] = f[..] else {
                return Err(format!("line {n}: expected tenant,vnet,address"));
            };
            let tenant = TenantId::new(tenant).map_err(|e| format!("line {n}: {e}"))?;
            ids::check_name(vnet).map_err(|e| format!("line {n}: {e}"))?;
            let address = address
                .parse()
                .map_err(|_| format!("line {n}: {address:?} is not an IP address"))?;
            return Ok(Recorded::Del {
                tenant,
                vnet: vnet.to_owned(),
                address,
            });
        }
        Err(format!("line {n}: neither `+ ` nor `- `"))
    }

    /// The data path's change.
    pub fn change(&self) -> RouteChange {
        match self.clone() {
            Recorded::Add(r) => RouteChange::Add(r),
            Recorded::Del {
                tenant,
                vnet,
                address,
            } => RouteChange::Del {
                tenant,
                vnet,
                address,
            },
        }
    }
}

/// What [`RouteStore::restore`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    /// Entries of the snapshot restored.
    pub snapshot: usize,
    /// Journal lines replayed.
    pub journal: usize,
    /// Snapshot entries and journal lines skipped (VNet gone, bad line).
    pub skipped: usize,
    /// Journal lines not replayed because the snapshot already holds them (a compaction
    /// stopped between writing the snapshot and emptying the journal), plus a torn last line.
    pub ignored: usize,
}

/// The snapshot file's header: this magic, the generation (u64, big-endian) and its bitwise
/// complement (a damaged header is noticed). The data path's snapshot follows.
const SNAPSHOT_MAGIC: &[u8; 8] = b"PGRTGEN1";
const SNAPSHOT_HEADER: usize = 24;
/// The journal's first line, before its generation.
const JOURNAL_HEADER: &str = "# protego route journal, generation ";

/// The generation of a snapshot file and the data path's snapshot in it. A file without the
/// header (written before generations existed) is generation 0.
fn split_snapshot(bytes: &[u8]) -> Result<(u64, &[u8]), &'static str> {
    if !bytes.starts_with(SNAPSHOT_MAGIC) {
        return Ok((0, bytes));
    }
    let Some(field) = bytes.get(8..SNAPSHOT_HEADER) else {
        return Err("route snapshot header cut short");
    };
    let (g, check) = field.split_at(8);
    let g = u64::from_be_bytes(g.try_into().expect("8 bytes"));
    let check = u64::from_be_bytes(check.try_into().expect("8 bytes"));
    if g != !check {
        return Err("route snapshot header damaged (generation and its check differ)");
    }
    Ok((g, &bytes[SNAPSHOT_HEADER..]))
}

fn snapshot_header(generation: u64) -> [u8; SNAPSHOT_HEADER] {
    let mut h = [0; SNAPSHOT_HEADER];
    h[..8].copy_from_slice(SNAPSHOT_MAGIC);
    h[8..16].copy_from_slice(&generation.to_be_bytes());
    h[16..].copy_from_slice(&(!generation).to_be_bytes());
    h
}

/// A journal's complete lines: its generation (0 without a header line), its change lines
/// with their 1-based numbers, and whether a last line without its newline (a write the
/// crash cut short, never answered) was left out.
#[derive(Debug, PartialEq, Eq)]
struct JournalText<'a> {
    generation: u64,
    lines: Vec<(usize, &'a str)>,
    torn: bool,
}

fn read_journal(bytes: &[u8]) -> Result<JournalText<'_>, String> {
    let complete = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(last) => &bytes[..=last],
        None => &[],
    };
    let torn = complete.len() < bytes.len();
    let text = std::str::from_utf8(complete)
        .map_err(|e| format!("not UTF-8 at byte {}", e.valid_up_to()))?;
    let mut out = JournalText {
        generation: 0,
        lines: Vec::new(),
        torn,
    };
    for (i, line) in text.lines().enumerate() {
        if let Some(g) = line.strip_prefix(JOURNAL_HEADER) {
            if i != 0 {
                return Err(format!(
                    "line {}: a header that is not the first line",
                    i + 1
                ));
            }
            out.generation = g
                .parse()
                .map_err(|_| format!("line 1: bad generation {g:?}"))?;
        } else if !line.trim().is_empty() {
            out.lines.push((i + 1, line));
        }
    }
    Ok(out)
}

/// The snapshot and journal of one node's per-VM routes.
#[derive(Debug)]
pub struct RouteStore {
    snapshot: PathBuf,
    journal: PathBuf,
    /// The open journal and its lines; held while a change is applied and recorded, so
    /// changes are recorded in the order they were applied.
    state: Mutex<Journal>,
}

#[derive(Debug, Default)]
struct Journal {
    /// The generation of the snapshot on disk; None before [`RouteStore::restore`].
    generation: Option<u64>,
    /// The journal, open for appending at `len`.
    file: Option<File>,
    /// The bytes of complete lines the journal holds (header included), None while the file
    /// on disk is not the journal of `generation` (it is written anew before the next line).
    len: Option<u64>,
    /// Change lines since the snapshot.
    lines: usize,
}

impl RouteStore {
    /// The files of the store beside the state store file `state` (`state` + `.routes` and
    /// `.routes.log`).
    pub fn beside(state: &Path) -> Self {
        let mut snapshot = state.as_os_str().to_owned();
        snapshot.push(".routes");
        let snapshot = PathBuf::from(snapshot);
        let mut journal = snapshot.as_os_str().to_owned();
        journal.push(".log");
        Self {
            snapshot,
            journal: PathBuf::from(journal),
            state: Mutex::new(Journal::default()),
        }
    }

    /// The snapshot file's path.
    pub fn path(&self) -> &Path {
        &self.snapshot
    }

    fn err(path: &Path, reason: impl std::fmt::Display) -> Error {
        Error::RouteStore {
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }

    /// Restores the snapshot and replays the journal into `dp`, then writes them as one new
    /// snapshot. Missing files are an empty table. The journal is replayed only if it is the
    /// snapshot's (same generation); the journal of the generation before is already in the
    /// snapshot and is ignored; any other is refused.
    pub fn restore(&self, dp: &dyn DataPath) -> Result<Restored, Error> {
        let mut j = self.lock();
        let mut out = Restored::default();
        let generation = match std::fs::read(&self.snapshot) {
            Ok(bytes) => {
                let (generation, body) =
                    split_snapshot(&bytes).map_err(|e| Self::err(&self.snapshot, e))?;
                let r = dp
                    .change_routes(RouteChange::Restore(Arc::from(body)))
                    .map_err(|e| Self::err(&self.snapshot, e))?;
                out.snapshot = r.added;
                out.skipped += r.skipped;
                generation
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(Self::err(&self.snapshot, e)),
        };
        match std::fs::read(&self.journal) {
            Ok(bytes) => {
                let text = read_journal(&bytes).map_err(|e| Self::err(&self.journal, e))?;
                if text.torn {
                    tracing::warn!(journal = %self.journal.display(), "route journal: a last line cut short (never answered) is ignored");
                    out.ignored += 1;
                }
                if text.lines.is_empty() || text.generation == generation {
                    let count = text.lines.len();
                    for (i, (n, line)) in text.lines.into_iter().enumerate() {
                        let change = match Recorded::parse(n, line) {
                            Ok(r) => r.change(),
                            // Only the last line can be damaged by a crash; damage before it
                            // is something else, and the evidence is kept.
                            Err(e) if i + 1 < count => {
                                return Err(Self::err(
                                    &self.journal,
                                    format!("{e}: a damaged line before the last one (the files are left as they are: fix or remove the line, then start again)"),
                                ))
                            }
                            Err(e) => {
                                tracing::warn!(journal = %self.journal.display(), error = %e, "damaged last route journal line skipped");
                                out.skipped += 1;
                                continue;
                            }
                        };
                        match dp.change_routes(change) {
                            Ok(_) => out.journal += 1,
                            Err(e) => {
                                tracing::warn!(journal = %self.journal.display(), line = n, error = %e, "route journal line skipped");
                                out.skipped += 1;
                            }
                        }
                    }
                } else if text.generation.checked_add(1) == Some(generation) {
                    tracing::info!(journal = %self.journal.display(), lines = text.lines.len(), "route journal of the previous snapshot ignored (the snapshot holds it)");
                    out.ignored += text.lines.len();
                } else {
                    return Err(Self::err(
                        &self.journal,
                        format!(
                            "journal of generation {} does not belong to snapshot generation {generation}",
                            text.generation
                        ),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Self::err(&self.journal, e)),
        }
        j.generation = Some(generation);
        self.keep_previous()?;
        self.compact_locked(dp, &mut j)?;
        Ok(out)
    }

    /// `path` + `.prev`.
    fn prev(path: &Path) -> PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(".prev");
        PathBuf::from(p)
    }

    /// Keeps the files as found at start (`.routes.prev`, `.routes.log.prev`) before the
    /// start's compaction replaces them: what it drops (entries of VNets no longer
    /// configured, skipped lines) can still be looked at. The snapshot is linked (it is
    /// replaced by a rename, the link keeps the old one), the journal copied (it is emptied
    /// in place).
    fn keep_previous(&self) -> Result<(), Error> {
        for (from, copy) in [(&self.snapshot, false), (&self.journal, true)] {
            let to = Self::prev(from);
            match std::fs::remove_file(&to) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Self::err(&to, e)),
            }
            let kept = if copy {
                std::fs::copy(from, &to).map(drop)
            } else {
                std::fs::hard_link(from, &to)
            };
            match kept {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Self::err(&to, e)),
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn not_restored(&self) -> Error {
        Self::err(
            &self.snapshot,
            "the route store is used before it was restored",
        )
    }

    /// Applies a single change to `dp` and records it in the journal.
    pub fn apply(&self, dp: &dyn DataPath, change: Recorded) -> Result<RouteChangeReport, Error> {
        let mut j = self.lock();
        if j.generation.is_none() {
            return Err(self.not_restored());
        }
        let report = dp.change_routes(change.change())?;
        self.record(&mut j, &change).map_err(not_persisted)?;
        j.lines += 1;
        if j.lines >= COMPACT_AFTER {
            // The change is in the journal: a failed compaction loses nothing, it is retried
            // after the next change.
            if let Err(e) = self.compact_locked(dp, &mut j) {
                tracing::warn!(error = %e, "route store not compacted; the journal keeps growing");
            }
        }
        Ok(report)
    }

    /// Appends `change` to the journal and syncs it. A write that fails leaves the journal
    /// to be cut back to its last complete line before the next one.
    fn record(&self, j: &mut Journal, change: &Recorded) -> Result<(), Error> {
        let path = &self.journal;
        let generation = j.generation.ok_or_else(|| self.not_restored())?;
        if j.file.is_none() {
            let f = match j.len {
                Some(len) => {
                    let mut f = OpenOptions::new()
                        .write(true)
                        .open(path)
                        .map_err(|e| Self::err(path, e))?;
                    let on_disk = f.metadata().map_err(|e| Self::err(path, e))?.len();
                    if on_disk < len {
                        return Err(Self::err(
                            path,
                            format!("the journal holds {on_disk} bytes, fewer than the {len} written: changed by someone else"),
                        ));
                    }
                    f.set_len(len)
                        .and_then(|()| f.seek(SeekFrom::End(0)).map(drop))
                        .map_err(|e| Self::err(path, e))?;
                    f
                }
                None => {
                    let (f, len) = self.new_journal(generation)?;
                    j.len = Some(len);
                    f
                }
            };
            j.file = Some(f);
        }
        let (Some(f), Some(len)) = (j.file.as_mut(), j.len) else {
            return Err(self.not_restored());
        };
        let mut line = change.line();
        line.push('\n');
        let written = f.write_all(line.as_bytes()).and_then(|()| f.sync_data());
        if let Err(e) = written {
            j.file = None;
            return Err(Self::err(path, e));
        }
        j.len = Some(len + line.len() as u64);
        Ok(())
    }

    /// Applies a route file's text to `dp` (validated whole by it) and writes a new snapshot.
    pub fn load(&self, dp: &dyn DataPath, text: Arc<str>) -> Result<RouteChangeReport, Error> {
        let mut j = self.lock();
        if j.generation.is_none() {
            return Err(self.not_restored());
        }
        let report = dp.change_routes(RouteChange::Load(text))?;
        let before = j.generation;
        match self.compact_locked(dp, &mut j) {
            Ok(_) => Ok(report),
            // The snapshot holding the load was written; only the new journal was not (the
            // next change writes it).
            Err(e) if j.generation != before => {
                tracing::warn!(error = %e, "route journal not started after a load");
                Ok(report)
            }
            Err(e) => Err(not_persisted(e)),
        }
    }

    /// Writes `dp`'s routes as a new snapshot and empties the journal; returns the entries
    /// written. Call it after VNets were removed from the data path: their entries are then
    /// in neither file, and do not come back at the next start when a VNet of the same name
    /// is configured again.
    pub fn compact(&self, dp: &dyn DataPath) -> Result<usize, Error> {
        let mut j = self.lock();
        if j.generation.is_none() {
            return Err(self.not_restored());
        }
        self.compact_locked(dp, &mut j)
    }

    /// Writes `dp`'s routes as the snapshot of the next generation (atomically), then a new
    /// empty journal of that generation. A crash between the two leaves the journal of the
    /// generation before, which the next start ignores (the snapshot holds its changes).
    fn compact_locked(&self, dp: &dyn DataPath, j: &mut Journal) -> Result<usize, Error> {
        let generation = j.generation.ok_or_else(|| self.not_restored())? + 1;
        let tmp = {
            let mut t = self.snapshot.as_os_str().to_owned();
            t.push(".tmp");
            PathBuf::from(t)
        };
        let file = private(OpenOptions::new().write(true).create(true).truncate(true))
            .open(&tmp)
            .map_err(|e| Self::err(&tmp, e))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(&snapshot_header(generation))
            .map_err(|e| Self::err(&tmp, e))?;
        let n = dp.write_routes(&mut w).map_err(|e| Self::err(&tmp, e))?;
        let file = w.into_inner().map_err(|e| Self::err(&tmp, e.error()))?;
        file.sync_all().map_err(|e| Self::err(&tmp, e))?;
        std::fs::rename(&tmp, &self.snapshot).map_err(|e| Self::err(&self.snapshot, e))?;
        self.sync_dir()?;
        // The snapshot holds every journalled change now: the journal on disk is stale.
        j.generation = Some(generation);
        j.file = None;
        j.len = None;
        j.lines = 0;
        let (f, len) = self.new_journal(generation)?;
        j.file = Some(f);
        j.len = Some(len);
        Ok(n)
    }

    /// Creates (or empties) the journal with its header line, synced with its directory
    /// entry; returns it and its length.
    fn new_journal(&self, generation: u64) -> Result<(File, u64), Error> {
        let path = &self.journal;
        let mut f = private(OpenOptions::new().write(true).create(true).truncate(true))
            .open(path)
            .map_err(|e| Self::err(path, e))?;
        let header = format!("{JOURNAL_HEADER}{generation}\n");
        f.write_all(header.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| Self::err(path, e))?;
        self.sync_dir()?;
        Ok((f, header.len() as u64))
    }

    /// Syncs the directory of the files, so that a created or renamed file survives a crash.
    fn sync_dir(&self) -> Result<(), Error> {
        if let Some(dir) = self.snapshot.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| Self::err(dir, e))?;
        }
        Ok(())
    }
}

/// A route store error after the data path took the change.
fn not_persisted(e: Error) -> Error {
    match e {
        Error::RouteStore { path, reason } => Error::NotPersisted { path, reason },
        other => other,
    }
}

/// Files of the route store are the node's own, like its state store: mode 0600 when created.
fn private(o: &mut OpenOptions) -> &mut OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    o.mode(0o600)
}

#[cfg(test)]
mod tests;
