//! [`FileMedium`]: the route store's two files beside a file state store (`protego up`): the
//! snapshot (a header naming its generation, then the data path's snapshot; replaced by a
//! rename) and the journal (a header line naming the generation, then one change a line,
//! appended and synced).

use super::medium::{JournalRead, MediumError, RouteMedium, WriteSnapshot};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The snapshot file's header: this magic, the generation (u64, big-endian) and its bitwise
/// complement (a damaged header is noticed). The data path's snapshot follows.
pub(super) const SNAPSHOT_MAGIC: &[u8; 8] = b"PGRTGEN1";
pub(super) const SNAPSHOT_HEADER: usize = 24;
/// The journal's first line, before its generation.
pub(super) const JOURNAL_HEADER: &str = "# protego route journal, generation ";

/// The generation of a snapshot file and the data path's snapshot in it. A file without the
/// header (written before generations existed) is generation 0.
pub(super) fn split_snapshot(bytes: &[u8]) -> Result<(u64, &[u8]), &'static str> {
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

pub(super) fn snapshot_header(generation: u64) -> [u8; SNAPSHOT_HEADER] {
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
pub(super) struct JournalText<'a> {
    pub(super) generation: u64,
    pub(super) lines: Vec<(usize, &'a str)>,
    pub(super) torn: bool,
}

pub(super) fn read_journal(bytes: &[u8]) -> Result<JournalText<'_>, String> {
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

/// The snapshot and journal files of one node's per-VM routes.
#[derive(Debug)]
pub struct FileMedium {
    snapshot: PathBuf,
    journal: PathBuf,
    /// The journal, open for appending at `len`.
    pub(super) file: Option<File>,
    /// The bytes of complete lines the journal holds (header included), None while the file
    /// on disk is not the journal being appended to (it is written anew before the next line).
    len: Option<u64>,
}

impl FileMedium {
    /// The files beside the state store file `state` (`state` + `.routes` and `.routes.log`).
    pub fn beside(state: &Path) -> Self {
        let mut snapshot = state.as_os_str().to_owned();
        snapshot.push(".routes");
        let snapshot = PathBuf::from(snapshot);
        let mut journal = snapshot.as_os_str().to_owned();
        journal.push(".log");
        Self {
            snapshot,
            journal: PathBuf::from(journal),
            file: None,
            len: None,
        }
    }

    /// The snapshot file's path.
    pub fn snapshot_path(&self) -> &Path {
        &self.snapshot
    }

    /// The journal file's path.
    pub fn journal_path(&self) -> &Path {
        &self.journal
    }

    fn err(path: &Path, reason: impl std::fmt::Display) -> MediumError {
        MediumError::new(path.display().to_string(), reason)
    }

    /// Creates (or empties) the journal with its header line, synced with its directory
    /// entry; returns it and its length.
    fn new_journal(&self, generation: u64) -> Result<(File, u64), MediumError> {
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
    fn sync_dir(&self) -> Result<(), MediumError> {
        if let Some(dir) = self.snapshot.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| Self::err(dir, e))?;
        }
        Ok(())
    }
}

/// `path` + `.prev`.
pub(super) fn prev(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".prev");
    PathBuf::from(p)
}

impl RouteMedium for FileMedium {
    fn snapshot_at(&self) -> String {
        self.snapshot.display().to_string()
    }

    fn journal_at(&self) -> String {
        self.journal.display().to_string()
    }

    fn read_snapshot(&mut self) -> Result<Option<(u64, Vec<u8>)>, MediumError> {
        match std::fs::read(&self.snapshot) {
            Ok(mut bytes) => {
                let (generation, body) =
                    split_snapshot(&bytes).map_err(|e| Self::err(&self.snapshot, e))?;
                let skip = bytes.len() - body.len();
                bytes.drain(..skip);
                Ok(Some((generation, bytes)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Self::err(&self.snapshot, e)),
        }
    }

    fn read_journal(&mut self, _snapshot: u64) -> Result<Option<JournalRead>, MediumError> {
        match std::fs::read(&self.journal) {
            Ok(bytes) => {
                let text = read_journal(&bytes).map_err(|e| Self::err(&self.journal, e))?;
                Ok(Some(JournalRead {
                    generation: text.generation,
                    lines: text
                        .lines
                        .into_iter()
                        .map(|(n, l)| (n, l.to_owned()))
                        .collect(),
                    torn: text.torn,
                }))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Self::err(&self.journal, e)),
        }
    }

    /// Keeps the files as found at start (`.routes.prev`, `.routes.log.prev`) before the
    /// start's compaction replaces them: what it drops (entries of VNets no longer
    /// configured, skipped lines) can still be looked at. The snapshot is linked (it is
    /// replaced by a rename, the link keeps the old one), the journal copied (it is emptied
    /// in place).
    fn keep_previous(&mut self) -> Result<(), MediumError> {
        for (from, copy) in [(&self.snapshot, false), (&self.journal, true)] {
            let to = prev(from);
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

    /// Writes a temporary file beside the snapshot, syncs it, renames it over the snapshot and
    /// syncs the directory.
    fn write_snapshot(
        &mut self,
        generation: u64,
        write: &mut WriteSnapshot<'_>,
    ) -> Result<usize, MediumError> {
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
        let n = write(&mut w).map_err(|e| Self::err(&tmp, e))?;
        let file = w.into_inner().map_err(|e| Self::err(&tmp, e.error()))?;
        file.sync_all().map_err(|e| Self::err(&tmp, e))?;
        std::fs::rename(&tmp, &self.snapshot).map_err(|e| Self::err(&self.snapshot, e))?;
        self.sync_dir()?;
        // The snapshot holds every journalled change now: the journal on disk is stale.
        self.file = None;
        self.len = None;
        Ok(n)
    }

    fn start_journal(&mut self, generation: u64) -> Result<(), MediumError> {
        let (f, len) = self.new_journal(generation)?;
        self.file = Some(f);
        self.len = Some(len);
        Ok(())
    }

    /// Appends the line and syncs it. A write that fails leaves the journal to be cut back to
    /// its last complete line before the next one.
    fn append(&mut self, generation: u64, line: &str) -> Result<(), MediumError> {
        let path = &self.journal;
        if self.file.is_none() {
            let f = match self.len {
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
                    self.len = Some(len);
                    f
                }
            };
            self.file = Some(f);
        }
        let (Some(f), Some(len)) = (self.file.as_mut(), self.len) else {
            return Err(Self::err(path, "the journal is not open"));
        };
        let mut line = line.to_owned();
        line.push('\n');
        let written = f.write_all(line.as_bytes()).and_then(|()| f.sync_data());
        if let Err(e) = written {
            self.file = None;
            return Err(Self::err(path, e));
        }
        self.len = Some(len + line.len() as u64);
        Ok(())
    }
}

/// Files of the route store are the node's own, like its state store: mode 0600 when created.
fn private(o: &mut OpenOptions) -> &mut OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    o.mode(0o600)
}
