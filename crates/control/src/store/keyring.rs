//! The store's encryption keys (`[store] encryption_key_file`): reading the key file, and making
//! a new key current (`protego ctl store rotate-key`).
//!
//! # The key file
//!
//! A text file, mode 0600 (a file that its group or other users may read or write is refused),
//! with one key per line: a key id (a decimal number from 1 to 4294967295) and the key, 64 hex
//! digits (32 bytes, AES-256-GCM-SIV), separated by white space. Empty lines and lines starting
//! with `#` are ignored. The **last** key is the current one, which seals every new record; the
//! others only open records sealed with them. For example (`printf '%u %s\n'
//! "0x$(openssl rand -hex 4)" "$(openssl rand -hex 32)"` makes a line with a random id):
//!
//! ```text
//! # Protego state store keys: ID HEX; the last one is current.
//! 1 6b1c1f0a2e6d6e21d8a5b3c9b3f3a6c1d5a3e9f0c2b4a6d8e0f1a3c5e7f9b1d3
//! ```
//!
//! # Rotation
//!
//! [`KeyRing::rotate`] reads the file again. If its last key is not the current one (the
//! operator appended a key, to every control node's file, beforehand), that key becomes current
//! and nothing is written: this is how a cluster rotates, since every node then holds the key
//! before any record is sealed with it. Otherwise (`protego up`, one node) a key is generated
//! under a random id not in use and appended. The file is replaced by writing a temporary file
//! with a random name beside it and renaming it over the file; a key file that is a symbolic
//! link is resolved first, so the file it points to is replaced and the link stays.
//!
//! Keys are held in [`zeroize::Zeroizing`] buffers and never printed: the `Debug` of a
//! [`KeyRing`] shows its file and key ids only. The file's text is read into, and a rotation
//! builds it in, a buffer allocated whole up front, so no reallocation leaves a copy behind.

use super::StoreError;
use aws_lc_rs::aead::{LessSafeKey, UnboundKey, AES_256_GCM_SIV};
use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Length of a key in bytes (AES-256).
pub(crate) const KEY_LEN: usize = 32;
/// Largest key file read (a few thousand keys).
const MAX_FILE: u64 = 1 << 20;
/// The comment line a generated key gets above it.
const GENERATED: &str = "# key added by `protego ctl store rotate-key`\n";

/// One key: its bytes (to compare with the file's when rotating) and the AEAD key made of them.
struct Key {
    material: Zeroizing<[u8; KEY_LEN]>,
    aead: LessSafeKey,
}

/// The keys of one key file, by id, and the current one.
pub(crate) struct KeyRing {
    path: PathBuf,
    keys: BTreeMap<u32, Key>,
    current: u32,
}

impl fmt::Debug for KeyRing {
    /// The file and the key ids, never the keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("path", &self.path)
            .field("ids", &self.keys.keys().collect::<Vec<_>>())
            .field("current", &self.current)
            .finish()
    }
}

/// A key file as read: the keys in file order (the last is current).
struct Parsed {
    keys: Vec<(u32, Zeroizing<[u8; KEY_LEN]>)>,
}

/// What [`KeyRing::rotate`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rotated {
    /// The new current key's id.
    pub(crate) id: u32,
    /// True if the key was generated and appended to the file; false if it was the file's last
    /// key, added by the operator.
    pub(crate) generated: bool,
}

impl KeyRing {
    /// Reads the key file at `path`: refuses it if its group or other users may read or write
    /// it, if a line is malformed, if an id repeats, or if it holds no key.
    pub(crate) fn load(path: &Path) -> Result<KeyRing, StoreError> {
        let (parsed, _) = read_file(path)?;
        let mut keys = BTreeMap::new();
        let mut current = 0;
        for (id, material) in parsed.keys {
            keys.insert(id, Key::new(material));
            current = id;
        }
        Ok(KeyRing {
            path: path.to_owned(),
            keys,
            current,
        })
    }

    /// The key file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The id of the key that seals new records.
    pub(crate) fn current(&self) -> u32 {
        self.current
    }

    /// The ids of every key held.
    pub(crate) fn ids(&self) -> Vec<u32> {
        self.keys.keys().copied().collect()
    }

    /// The AEAD key with id `id`, if held.
    pub(crate) fn key(&self, id: u32) -> Option<&LessSafeKey> {
        self.keys.get(&id).map(|k| &k.aead)
    }

    /// Makes a new key current (see the [module documentation](self)). The file is read again
    /// first and its keys taken in. If its last key is not the current one, that key becomes
    /// current and the file is left as it is. Otherwise a key is generated under a random id
    /// that neither the file nor this ring uses, and appended as the file's last line: the file
    /// is written whole to a temporary file (mode 0600, random name) beside it, fsync'd and
    /// renamed over it, so a crash leaves the old file or the new one.
    ///
    /// Fails, changing nothing, if a key id of the file holds another key than the one loaded
    /// under that id, or if the current key is no longer in the file (records sealed with it
    /// would not open after a restart).
    pub(crate) fn rotate(&mut self) -> Result<Rotated, StoreError> {
        let (parsed, text) = read_file(&self.path)?;
        for (id, material) in &parsed.keys {
            if let Some(held) = self.keys.get(id) {
                if held.material[..] != material[..] {
                    return Err(self.error(
                        0,
                        format!(
                            "key id {id} in the file differs from the key {id} loaded at start; \
                             nothing changed (restore the file, or restart to load it)"
                        ),
                    ));
                }
            }
        }
        let current = self.current;
        if !parsed.keys.iter().any(|(id, _)| *id == current) {
            return Err(self.error(
                0,
                format!(
                    "the current key {current} is no longer in the file; records sealed with it \
                     would not open after a restart: put its line back (nothing changed)"
                ),
            ));
        }
        let last = parsed.keys.last().map(|(id, _)| *id);
        // Parsing refuses a file without a key.
        let last = last.expect("a parsed key file holds a key");
        if last != current {
            for (id, material) in parsed.keys {
                self.keys.entry(id).or_insert_with(|| Key::new(material));
            }
            self.current = last;
            return Ok(Rotated {
                id: last,
                generated: false,
            });
        }
        let id = loop {
            let mut bytes = [0u8; 4];
            aws_lc_rs::rand::fill(&mut bytes)
                .map_err(|_| self.error(0, "the system's random generator failed".into()))?;
            let id = u32::from_be_bytes(bytes);
            let taken = self.keys.contains_key(&id) || parsed.keys.iter().any(|(k, _)| *k == id);
            if id != 0 && !taken {
                break id;
            }
        };
        let mut material = Zeroizing::new([0u8; KEY_LEN]);
        aws_lc_rs::rand::fill(&mut material[..])
            .map_err(|_| self.error(0, "the system's random generator failed".into()))?;
        let id_text = id.to_string();
        let newline = !text.is_empty() && !text.ends_with(b"\n");
        let len = text.len()
            + usize::from(newline)
            + GENERATED.len()
            + id_text.len()
            + 1
            + 2 * KEY_LEN
            + 1;
        // Allocated whole: growing would leave copies of the keys behind.
        let mut out = Zeroizing::new(Vec::with_capacity(len));
        out.extend_from_slice(&text);
        if newline {
            out.push(b'\n');
        }
        out.extend_from_slice(GENERATED.as_bytes());
        out.extend_from_slice(id_text.as_bytes());
        out.push(b' ');
        let start = out.len();
        out.resize(start + 2 * KEY_LEN, 0);
        hex::encode_to_slice(&material[..], &mut out[start..])
            .expect("the buffer holds exactly two hex digits per byte");
        out.push(b'\n');
        debug_assert_eq!(out.len(), len, "the key file's new text was sized exactly");
        write_atomically(&self.path, &out).map_err(|detail| self.error(0, detail))?;
        for (old, material) in parsed.keys {
            self.keys.entry(old).or_insert_with(|| Key::new(material));
        }
        self.keys.insert(id, Key::new(material));
        self.current = id;
        Ok(Rotated {
            id,
            generated: true,
        })
    }

    fn error(&self, line: usize, detail: String) -> StoreError {
        StoreError::KeyFile {
            path: self.path.clone(),
            line,
            detail,
        }
    }
}

impl Key {
    fn new(material: Zeroizing<[u8; KEY_LEN]>) -> Key {
        let unbound = UnboundKey::new(&AES_256_GCM_SIV, &material[..])
            .expect("AES-256-GCM-SIV takes a key of KEY_LEN bytes");
        Key {
            material,
            aead: LessSafeKey::new(unbound),
        }
    }
}

/// Reads and parses the key file: its keys and its whole text (kept by a rotation).
fn read_file(path: &Path) -> Result<(Parsed, Zeroizing<Vec<u8>>), StoreError> {
    let error = |line: usize, detail: String| StoreError::KeyFile {
        path: path.to_owned(),
        line,
        detail,
    };
    let file = File::open(path).map_err(|e| error(0, format!("cannot open: {e}")))?;
    let metadata = file
        .metadata()
        .map_err(|e| error(0, format!("cannot inspect: {e}")))?;
    if !metadata.is_file() {
        return Err(error(0, "not a regular file".into()));
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(error(
            0,
            format!(
                "has mode {mode:04o}: a key file must not be readable or writable by its group \
                 or other users (chmod 600 {})",
                path.display()
            ),
        ));
    }
    if metadata.len() > MAX_FILE {
        return Err(error(
            0,
            format!(
                "is {} bytes long, more than a key file can be",
                metadata.len()
            ),
        ));
    }
    // Room for the whole file (and one byte to notice that it grew) up front, and never more
    // read: the buffer never grows, so no unwiped copy of the keys is left behind.
    let room = metadata.len() + 1;
    let mut text = Zeroizing::new(Vec::with_capacity(
        usize::try_from(room).expect("a key file is at most MAX_FILE bytes"),
    ));
    file.take(room)
        .read_to_end(&mut text)
        .map_err(|e| error(0, format!("cannot read: {e}")))?;
    if text.len() as u64 != metadata.len() {
        return Err(error(0, "changed while it was read; try again".into()));
    }
    let parsed = std::str::from_utf8(&text)
        .map_err(|e| {
            error(
                0,
                format!("is not UTF-8 text (at byte {})", e.valid_up_to()),
            )
        })
        .and_then(|t| parse(t).map_err(|(line, detail)| error(line, detail)))?;
    Ok((parsed, text))
}

/// Parses a key file's text; an error carries its line number (1-based).
fn parse(text: &str) -> Result<Parsed, (usize, String)> {
    let mut keys: Vec<(u32, Zeroizing<[u8; KEY_LEN]>)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(id), Some(hex), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err((
                number,
                "expected `ID KEY`: a key id and 64 hex digits, separated by a space".into(),
            ));
        };
        // Plain decimal only: `+1` and `01` are refused.
        let id = match id.parse::<u32>() {
            Ok(n) if n > 0 && n.to_string() == id => n,
            _ => {
                return Err((
                    number,
                    "the key id must be a decimal number from 1 to 4294967295".into(),
                ))
            }
        };
        if keys.iter().any(|(other, _)| *other == id) {
            return Err((number, format!("key id {id} appears twice")));
        }
        if hex.len() != 2 * KEY_LEN {
            return Err((
                number,
                format!(
                    "key {id} has {} characters; a key is {} hex digits ({KEY_LEN} bytes)",
                    hex.len(),
                    2 * KEY_LEN
                ),
            ));
        }
        let mut material = Zeroizing::new([0u8; KEY_LEN]);
        if hex::decode_to_slice(hex, &mut material[..]).is_err() {
            return Err((number, format!("key {id} is not hex digits")));
        }
        keys.push((id, material));
    }
    if keys.is_empty() {
        return Err((0, "holds no key (add a line `1 <64 hex digits>`)".into()));
    }
    Ok(Parsed { keys })
}

/// Writes `bytes` to a new file (mode 0600, a random name) beside the file `path` names (the
/// target, if `path` is a symbolic link: the link stays), fsyncs it, renames it over that file
/// and fsyncs the directory. An error names the file it concerns.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let target = std::fs::canonicalize(path)
        .map_err(|e| format!("cannot resolve {}: {e}", path.display()))?;
    let dir = target
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_owned);
    let name = target
        .file_name()
        .ok_or_else(|| format!("{} has no file name", target.display()))?;
    let mut suffix = [0u8; 8];
    aws_lc_rs::rand::fill(&mut suffix)
        .map_err(|_| "the system's random generator failed".to_owned())?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".tmp-{}", hex::encode(suffix)));
    let temp = dir.join(temp_name);
    let mut created = false;
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(|e| format!("cannot create {}: {e}", temp.display()))?;
        created = true;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| format!("cannot write {}: {e}", temp.display()))?;
        std::fs::rename(&temp, &target).map_err(|e| {
            format!(
                "cannot rename {} to {}: {e}",
                temp.display(),
                target.display()
            )
        })?;
        created = false;
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| format!("cannot sync {}: {e}", dir.display()))
    })();
    if created {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

#[cfg(test)]
#[path = "keyring_tests.rs"]
pub(crate) mod tests;
