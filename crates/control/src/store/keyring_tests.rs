//! Tests of the key file: parsing, errors, modes, rotation.

use super::*;
use std::os::unix::fs::PermissionsExt;

/// A key line with id `id` and every byte `byte`.
pub(crate) fn key_line(id: u32, byte: u8) -> String {
    format!("{id} {}\n", hex::encode([byte; KEY_LEN]))
}

/// Writes a key file (mode 0600) at `path`.
pub(crate) fn write_key_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn dir() -> tempdir::Dir {
    tempdir::Dir::new("keyring")
}

/// A scratch directory removed on drop.
pub(crate) mod tempdir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    pub(crate) struct Dir(PathBuf);

    impl Dir {
        pub(crate) fn new(what: &str) -> Dir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let path = std::env::temp_dir().join(format!(
                "protego-{what}-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }

        pub(crate) fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn load_error(text: &str) -> String {
    let d = dir();
    let path = d.path().join("keys");
    write_key_file(&path, text);
    KeyRing::load(&path).unwrap_err().to_string()
}

#[test]
fn keyring_reads_ids_comments_and_the_current_key() {
    let d = dir();
    let path = d.path().join("keys");
    let text = format!(
        "# comment\n\n1 {} # trailing\n",
        hex::encode([1u8; KEY_LEN])
    );
    write_key_file(&path, &text);
    assert!(
        KeyRing::load(&path).is_err(),
        "a trailing comment is a third field"
    );
    write_key_file(
        &path,
        &format!("# keys\n\n{}  {}", key_line(7, 7), key_line(3, 3)),
    );
    let ring = KeyRing::load(&path).unwrap();
    assert_eq!(
        (ring.ids(), ring.current()),
        (vec![3, 7], 3),
        "the last line is current"
    );
    let debug = format!("{ring:?}");
    assert!(
        !debug.contains(&hex::encode([7u8; KEY_LEN])) && !debug.contains("[7, 7"),
        "{debug}"
    );
}

#[test]
fn keyring_errors_name_the_file_and_line() {
    let cases: &[(&str, &str)] = &[
        ("", "holds no key"),
        ("# only a comment\n", "holds no key"),
        ("1\n", ":1: expected `ID KEY`"),
        ("\n\n0 00\n", ":3: the key id must be"),
        ("x 00\n", ":1: the key id must be"),
        ("01 00\n", ":1: the key id must be"),
        ("1 abcd\n", ":1: key 1 has 4 characters"),
    ];
    for (text, expected) in cases {
        let message = load_error(text);
        assert!(
            message.contains("keys") && message.contains(expected),
            "{text:?}: {message}"
        );
    }
    let bad_hex = format!("1 {}\n", "z".repeat(64));
    assert!(load_error(&bad_hex).contains(":1: key 1 is not hex digits"));
    let twice = format!("{}{}", key_line(2, 1), key_line(2, 2));
    assert!(load_error(&twice).contains(":2: key id 2 appears twice"));
    // The key itself never appears in an error.
    let long = format!("1 {}00\n", hex::encode([9u8; KEY_LEN]));
    let message = load_error(&long);
    assert!(!message.contains(&hex::encode([9u8; KEY_LEN])), "{message}");
}

#[test]
fn keyring_refuses_a_file_others_can_read() {
    let d = dir();
    let path = d.path().join("keys");
    write_key_file(&path, &key_line(1, 1));
    for mode in [0o640, 0o604, 0o660, 0o602] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let message = KeyRing::load(&path).unwrap_err().to_string();
        assert!(
            message.contains(&format!("mode {mode:04o}")) && message.contains("chmod 600"),
            "{message}"
        );
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
    assert!(KeyRing::load(&path).is_ok());
    let missing = KeyRing::load(&d.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(
        missing.contains("nope") && missing.contains("cannot open"),
        "{missing}"
    );
}

/// The files in `dir`, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn keyring_rotation_takes_the_key_the_operator_added() {
    let d = dir();
    let path = d.path().join("keys");
    write_key_file(&path, &format!("# mine\n{}", key_line(4, 4)));
    let mut ring = KeyRing::load(&path).unwrap();
    // The cluster procedure: the new key is appended to every node's file first.
    let by_hand = format!(
        "# mine\n{}{}{}",
        key_line(4, 4),
        key_line(2, 2),
        key_line(9, 9)
    );
    write_key_file(&path, &by_hand);
    let rotated = ring.rotate().unwrap();
    assert_eq!(
        rotated,
        Rotated {
            id: 9,
            generated: false
        }
    );
    assert_eq!((ring.ids(), ring.current()), (vec![2, 4, 9], 9));
    // Nothing is written: every node's file stays the same.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), by_hand);
    assert_eq!(files(d.path()), ["keys"]);
    // Once the file's last key is current, a rotation generates one.
    let generated = ring.rotate().unwrap();
    assert!(generated.generated && ![2, 4, 9].contains(&generated.id));
}

#[test]
fn keyring_rotation_generates_a_random_id_and_appends_atomically() {
    let d = dir();
    let path = d.path().join("keys");
    let before = format!("# mine\n{}", key_line(4, 4));
    write_key_file(&path, &before);
    let copy = d.path().join("copy");
    write_key_file(&copy, &before);
    let mut ring = KeyRing::load(&path).unwrap();
    let rotated = ring.rotate().unwrap();
    assert!(rotated.generated);
    assert_ne!(rotated.id, 4);
    assert_eq!((ring.ids().len(), ring.current()), (2, rotated.id));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with(&before), "{text}");
    assert!(
        text.ends_with(&format!(
            "{GENERATED}{} {}\n",
            rotated.id,
            &text[text.len() - 65..text.len() - 1]
        )),
        "{text}"
    );
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600);
    let reloaded = KeyRing::load(&path).unwrap();
    assert_eq!(
        (reloaded.ids(), reloaded.current()),
        (ring.ids(), rotated.id)
    );
    // No temporary file is left.
    assert_eq!(files(d.path()), ["copy", "keys"]);
    // Two nodes rotating the same file pick different ids (max + 1 would clash, with
    // different keys under one id).
    let other = KeyRing::load(&copy).unwrap().rotate().unwrap();
    assert!(other.generated);
    assert_ne!(other.id, rotated.id);
}

#[test]
fn keyring_rotation_refuses_a_changed_or_missing_key() {
    let d = dir();
    let path = d.path().join("keys");
    write_key_file(&path, &format!("{}{}", key_line(1, 1), key_line(10, 10)));
    let mut ring = KeyRing::load(&path).unwrap();
    // A key that changed under an id held here stops the rotation; the file stays.
    let changed = format!("{}{}", key_line(1, 1), key_line(10, 3));
    write_key_file(&path, &changed);
    let message = ring.rotate().unwrap_err().to_string();
    assert!(
        message.contains("key id 10") && message.contains("keys"),
        "{message}"
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), changed);
    // The current key gone from the file: its records would not open after a restart.
    write_key_file(&path, &key_line(1, 1));
    let message = ring.rotate().unwrap_err().to_string();
    assert!(
        message.contains("current key 10 is no longer in the file"),
        "{message}"
    );
    assert_eq!(ring.current(), 10);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), key_line(1, 1));
}

#[test]
fn keyring_rotation_survives_leftovers_and_keeps_a_symlink() {
    let d = dir();
    let real_dir = d.path().join("secrets");
    std::fs::create_dir(&real_dir).unwrap();
    let real = real_dir.join("store.keys");
    write_key_file(&real, &key_line(1, 1));
    let link = d.path().join("keys");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    // Temporary files a crashed rotation left behind (with this process's id, as a container's
    // PID 1 would have again) do not block a rotation.
    let leftover = real_dir.join(format!(".store.keys.tmp-{}", std::process::id()));
    write_key_file(&leftover, "half a file");
    let leftover_link = d.path().join(format!(".keys.tmp-{}", std::process::id()));
    write_key_file(&leftover_link, "half a file");
    let mut ring = KeyRing::load(&link).unwrap();
    let rotated = ring.rotate().unwrap();
    assert!(rotated.generated);
    // The link stays a link; the file it points to holds the new key.
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_link(&link).unwrap(), real);
    assert_eq!(KeyRing::load(&real).unwrap().current(), rotated.id);
    assert_eq!(KeyRing::load(&link).unwrap().current(), rotated.id);
    let leftover_name = leftover.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(files(&real_dir), [leftover_name, "store.keys".to_owned()]);
}
