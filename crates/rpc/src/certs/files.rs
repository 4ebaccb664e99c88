//! The PKI's directory and files: created private, written atomically, read as PEM (`pem`),
//! a key file refused when others may read it.

use super::*;

/// Creates `dir` (and its parents) with mode 0700 if missing.
pub(super) fn make_dir(dir: &Path) -> Result<(), CertError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| CertError::Write {
            path: dir.to_owned(),
            source,
        })
}

/// Writes `contents` to `path` through a temporary file in the same directory, created with
/// `mode`, then renamed over `path`: a reader never sees half a file, and a key is never
/// readable by others, not even for a moment.
pub(super) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    let err = |source| CertError::Write {
        path: path.to_owned(),
        source,
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{file_name}.tmp{}", std::process::id()));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    if let Some(dir) = path.parent() {
        // Best effort: make the rename durable.
        if let Ok(d) = File::open(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        }) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Reads `path` (a private key file if `secret`: then refused if other users may access it or
/// its group may write it) and returns the DER of its one PEM block labelled `label`.
pub(super) fn read_pem(
    path: &Path,
    label: &str,
    secret: bool,
) -> Result<Zeroizing<Vec<u8>>, CertError> {
    let file = File::open(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => CertError::Missing {
            path: path.to_owned(),
        },
        _ => CertError::Read {
            path: path.to_owned(),
            source,
        },
    })?;
    let read_err = |source| CertError::Read {
        path: path.to_owned(),
        source,
    };
    let meta = file.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(invalid(path, "not a regular file"));
    }
    if secret {
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o027 != 0 {
            return Err(CertError::InsecureKey {
                path: path.to_owned(),
                mode,
            });
        }
    }
    if meta.len() > MAX_FILE_LEN {
        return Err(invalid(
            path,
            &format!("larger than {MAX_FILE_LEN} bytes: not a certificate or key"),
        ));
    }
    // Room for the whole file up front, so that reading never reallocates (and never leaves an
    // unzeroized copy of a key behind).
    let mut text = Zeroizing::new(Vec::with_capacity(meta.len() as usize + 1));
    file.take(MAX_FILE_LEN + 1)
        .read_to_end(&mut text)
        .map_err(read_err)?;
    let not_pem = |reason: String| CertError::NotPem {
        path: path.to_owned(),
        reason,
    };
    let text = std::str::from_utf8(&text)
        .map_err(|_| not_pem("not text (a DER file? convert it to PEM)".into()))?;
    let blocks = pem_decode(text).map_err(not_pem)?;
    let mut found = blocks.into_iter().filter(|b| b.label == label);
    let (Some(block), None) = (found.next(), found.next()) else {
        let labels: Vec<String> = pem_decode(text)
            .unwrap_or_default()
            .into_iter()
            .map(|b| b.label)
            .collect();
        let count = labels.iter().filter(|l| *l == label).count();
        return Err(if count > 1 {
            invalid(
                path,
                &format!("{count} {label} blocks: expected exactly one (chains are not supported)"),
            )
        } else if label == KEY_LABEL {
            not_pem(format!(
                "no PKCS#8 `-----BEGIN {label}-----` block (found: {}); convert a key with \
                 `openssl pkcs8 -topk8 -nocrypt`",
                labels.join(", ")
            ))
        } else {
            not_pem(format!(
                "no `-----BEGIN {label}-----` block (found: {})",
                labels.join(", ")
            ))
        });
    };
    Ok(block.der)
}
