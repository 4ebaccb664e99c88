//! Tests of the sealing layer ([`SealedStore`]) and its record format: round trips, wrong
//! keys, swapped records, unknown key ids, damaged records, records in clear, rotation.

use super::keyring::tests::tempdir::Dir;
use super::keyring::tests::{key_line, write_key_file};
use super::sealed::{open, OpenError, RecordId, HEADER, MAGIC};
use super::*;
use crate::testing::put;
use std::path::Path;

/// A snapshot that is easy to find in raw bytes.
fn secret(spi: u64) -> Vec<u8> {
    format!("SECRET-KEY-MATERIAL-{spi:04}-")
        .repeat(8)
        .into_bytes()
}

fn options(key_file: Option<&Path>, accept_cleartext: bool) -> EncryptionOptions {
    EncryptionOptions {
        key_file: key_file.map(Path::to_owned),
        accept_cleartext,
    }
}

/// A sealed store over (a clone of) `inner`.
fn sealed(inner: &MemoryStore, key_file: Option<&Path>, accept_cleartext: bool) -> SealedStore {
    SealedStore::open(
        Box::new(inner.clone()),
        &options(key_file, accept_cleartext),
    )
    .unwrap()
}

/// The key id in a sealed record's header.
fn key_id_of(record: &[u8]) -> u32 {
    super::sealed::key_id_of(record).unwrap_or_else(|| panic!("not sealed: {record:?}"))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A key file with the given lines in a new directory.
fn key_file(lines: &str) -> (Dir, std::path::PathBuf) {
    let dir = Dir::new("sealed");
    let path = dir.path().join("store.keys");
    write_key_file(&path, lines);
    (dir, path)
}

#[test]
fn store_sealed_round_trips_and_hides_the_plaintext() {
    let (_dir, keys) = key_file(&key_line(1, 0x11));
    // The ordinary contract holds through the layer.
    super::tests::round_trips(&mut sealed(&MemoryStore::new(), Some(&keys), false));
    let inner = MemoryStore::new();
    let mut store = sealed(&inner, Some(&keys), false);
    store
        .commit(&[put(7, &secret(7)), put(9, &secret(9))])
        .unwrap();
    store
        .commit(&[Change::PutConfig {
            record: Zeroizing::new(b"PSK: hunter2hunter2".to_vec()),
        }])
        .unwrap();
    let read: Vec<(u64, Vec<u8>)> = store
        .ike_sas()
        .unwrap()
        .into_iter()
        .map(|(s, v)| (s, v.to_vec()))
        .collect();
    assert_eq!(read, vec![(7, secret(7)), (9, secret(9))]);
    assert_eq!(store.read_ike_sa(9).unwrap().unwrap().as_slice(), secret(9));
    assert!(store.read_ike_sa(8).unwrap().is_none());
    assert_eq!(
        store.applied_config().unwrap().unwrap().as_slice(),
        b"PSK: hunter2hunter2"
    );
    // What the backend holds is sealed under key 1, and holds no plaintext.
    for spi in [7, 9] {
        let raw = inner.ike_sa(spi).unwrap();
        assert_eq!(key_id_of(&raw), 1);
        assert!(!contains(&raw, b"SECRET-KEY-MATERIAL"));
    }
    let raw = inner.applied_config().unwrap().unwrap();
    assert_eq!(key_id_of(&raw), 1);
    assert!(!contains(&raw, b"hunter2"));
    // A fresh nonce per record: the same snapshot sealed twice differs.
    store.commit(&[put(9, &secret(9))]).unwrap();
    assert_ne!(inner.ike_sa(9).unwrap(), raw);
    let again = inner.ike_sa(9).unwrap();
    store.commit(&[put(9, &secret(9))]).unwrap();
    assert_ne!(inner.ike_sa(9).unwrap(), again);
    let status = store.encryption().unwrap();
    assert_eq!(
        (
            status.current_key,
            status.keys.clone(),
            status.reencrypt_pending
        ),
        (Some(1), vec![1], 0)
    );
    assert_eq!(status.records.get("1"), Some(&3), "{status:?}");
    // Neither Debug nor the status shows the key.
    let key_hex = hex::encode([0x11u8; 32]);
    assert!(!format!("{store:?}").contains(&key_hex));
    assert!(!serde_json::to_string(&status).unwrap().contains(&key_hex));
}

#[test]
fn store_sealed_refuses_a_wrong_key_and_swapped_records() {
    let (_a, keys_a) = key_file(&key_line(1, 0xaa));
    let (_b, keys_b) = key_file(&key_line(1, 0xbb));
    let inner = MemoryStore::new();
    let mut store = sealed(&inner, Some(&keys_a), false);
    store
        .commit(&[put(1, &secret(1)), put(2, &secret(2))])
        .unwrap();
    // The same key id, another key.
    let wrong = sealed(&inner, Some(&keys_b), false);
    let e = wrong.ike_sas().unwrap_err();
    assert!(
        matches!(e, StoreError::Unsealed { ref record, .. } if record == "ike_sa/0000000000000001"),
        "{e}"
    );
    assert!(
        e.to_string().contains("authentication failed under key 1"),
        "{e}"
    );
    // A record moved to another SPI (or to the configuration) does not open.
    let record_1 = inner.ike_sa(1).unwrap();
    let mut raw = inner.clone();
    raw.commit(&[Change::PutIkeSa {
        spi: 2,
        snapshot: record_1.clone(),
    }])
    .unwrap();
    let e = store.read_ike_sa(2).unwrap_err();
    assert!(
        matches!(e, StoreError::Unsealed { ref record, .. } if record == "ike_sa/0000000000000002"),
        "{e}"
    );
    assert!(store.ike_sas().is_err());
    raw.commit(&[
        Change::DeleteIkeSa { spi: 2 },
        Change::PutConfig {
            record: record_1.clone(),
        },
    ])
    .unwrap();
    let e = store.applied_config().unwrap_err();
    assert!(
        matches!(e, StoreError::Unsealed { ref record, .. } if record == "config"),
        "{e}"
    );
    // An altered key id in the header is caught too (here: to a key that exists).
    let (_c, both) = key_file(&format!("{}{}", key_line(1, 0xaa), key_line(2, 0xaa)));
    let mut altered = record_1.to_vec();
    altered[8] = 2;
    let keyring = super::keyring::KeyRing::load(&both).unwrap();
    assert_eq!(
        open(Some(&keyring), false, RecordId::IkeSa(1), &altered).err(),
        Some(OpenError::Authentication(2))
    );
    assert!(open(Some(&keyring), false, RecordId::IkeSa(1), &record_1).is_ok());
}

#[test]
fn store_sealed_names_an_unknown_key_id_and_the_key_file() {
    let (_a, keys_2) = key_file(&key_line(2, 0x22));
    let (_b, keys_1) = key_file(&key_line(1, 0x11));
    let inner = MemoryStore::new();
    let mut store = sealed(&inner, Some(&keys_2), false);
    store.commit(&[put(5, &secret(5))]).unwrap();
    let other = sealed(&inner, Some(&keys_1), false);
    let e = other.ike_sas().unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, StoreError::UnknownKey { key_id: 2, .. })
            && text.contains("key id 2")
            && text.contains(&keys_1.display().to_string()),
        "{text}"
    );
    // Without a key file at all.
    let clear = sealed(&inner, None, false);
    let text = clear.ike_sas().unwrap_err().to_string();
    assert!(
        text.contains("key id 2") && text.contains("no encryption_key_file"),
        "{text}"
    );
}

#[test]
fn store_sealed_damaged_records_are_errors_not_panics() {
    let (_dir, keys) = key_file(&key_line(1, 0x11));
    let keyring = super::keyring::KeyRing::load(&keys).unwrap();
    let id = RecordId::IkeSa(3);
    let good = super::sealed::seal(&keyring, 1, id, &secret(3));
    assert_eq!(
        open(Some(&keyring), false, id, &good)
            .unwrap()
            .plaintext
            .as_slice(),
        secret(3)
    );
    // Every truncation, and every single-bit flip, fails cleanly.
    for len in 0..good.len() {
        let cut = &good[..len];
        let result = open(Some(&keyring), false, id, cut);
        assert!(result.is_err(), "a record cut to {len} bytes opened");
    }
    for bit in 0..good.len() * 8 {
        let mut flipped = good.to_vec();
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(
            open(Some(&keyring), false, id, &flipped).is_err(),
            "bit {bit} flipped and the record still opened"
        );
    }
    let short = [MAGIC.as_slice(), &[1, 0, 0]].concat();
    assert_eq!(
        open(Some(&keyring), false, id, &short).err(),
        Some(OpenError::Truncated(7))
    );
    let mut newer = good.to_vec();
    newer[4] = 2;
    assert_eq!(
        open(Some(&keyring), false, id, &newer).err(),
        Some(OpenError::Version(2))
    );
    // A header and a tag, nothing else: the tag fails.
    let empty = [good[..HEADER].to_vec(), vec![0; 16]].concat();
    assert_eq!(
        open(Some(&keyring), false, id, &empty).err(),
        Some(OpenError::Authentication(1))
    );
    // Through the store: garbage under the magic is an error naming the record.
    let inner = MemoryStore::new();
    let store = sealed(&inner, Some(&keys), false);
    let mut raw = inner.clone();
    raw.commit(&[put(4, &short)]).unwrap();
    let text = store.ike_sas().unwrap_err().to_string();
    assert!(
        text.contains("ike_sa/0000000000000004") && text.contains("7 bytes"),
        "{text}"
    );
}

#[test]
fn store_sealed_refuses_cleartext_unless_accepted_then_encrypts_it() {
    let (_dir, keys) = key_file(&key_line(1, 0x11));
    let inner = MemoryStore::new();
    // A store written without a key file (as before this feature).
    let mut clear = sealed(&inner, None, false);
    clear
        .commit(&[
            put(1, &secret(1)),
            put(2, &secret(2)),
            Change::PutConfig {
                record: Zeroizing::new(b"{\"psk\":\"hunter2\"}".to_vec()),
            },
        ])
        .unwrap();
    assert!(contains(&inner.ike_sa(1).unwrap(), b"SECRET-KEY-MATERIAL"));
    assert!(clear
        .rotate_key()
        .unwrap_err()
        .to_string()
        .contains("not encrypted"));
    drop(clear);
    // With a key file, a record in clear is refused: it could have been planted.
    let strict = sealed(&inner, Some(&keys), false);
    let e = strict.ike_sas().unwrap_err();
    assert!(matches!(e, StoreError::Cleartext { .. }), "{e}");
    assert!(e.to_string().contains("accept_cleartext = true"), "{e}");
    assert!(matches!(
        strict.applied_config(),
        Err(StoreError::Cleartext { .. })
    ));
    // Opted in: read, counted as clear, and encrypted in rounds.
    let mut migrating = sealed(&inner, Some(&keys), true);
    assert_eq!(migrating.ike_sas().unwrap().len(), 2);
    assert!(migrating.applied_config().unwrap().is_some());
    let status = migrating.encryption().unwrap();
    assert_eq!(
        (status.records.get("clear"), status.reencrypt_pending),
        (Some(&3), 3)
    );
    assert_eq!(
        migrating.reseal(2).unwrap(),
        1,
        "the configuration goes alone"
    );
    assert_eq!(migrating.reseal(2).unwrap(), 2);
    assert_eq!(migrating.reseal(2).unwrap(), 0);
    let status = migrating.encryption().unwrap();
    assert_eq!(
        (status.records.get("1"), status.reencrypt_pending),
        (Some(&3), 0)
    );
    for spi in [1, 2] {
        assert_eq!(key_id_of(&inner.ike_sa(spi).unwrap()), 1);
    }
    assert!(!contains(
        &inner.applied_config().unwrap().unwrap(),
        b"hunter2"
    ));
    // Now even the strict store reads everything.
    assert_eq!(strict.ike_sas().unwrap().len(), 2);
}

#[test]
fn store_sealed_rotation_reencrypts_everything() {
    let (dir, keys) = key_file(&key_line(1, 0x11));
    let inner = MemoryStore::new();
    let mut store = sealed(&inner, Some(&keys), false);
    let mut changes: Vec<Change> = (1..=40).map(|spi| put(spi, &secret(spi))).collect();
    changes.push(Change::PutConfig {
        record: Zeroizing::new(b"config".to_vec()),
    });
    store.commit(&changes).unwrap();
    let rotation = store.rotate_key().unwrap();
    let new = rotation.key_id;
    assert_eq!(
        (
            rotation.generated,
            rotation.key_file.as_path(),
            rotation.reencrypt_pending
        ),
        (true, keys.as_path(), 41)
    );
    assert_ne!(new, 1);
    // New writes use the new key at once; the old records still open.
    store.commit(&[put(41, &secret(41))]).unwrap();
    assert_eq!(key_id_of(&inner.ike_sa(41).unwrap()), new);
    assert_eq!(key_id_of(&inner.ike_sa(1).unwrap()), 1);
    assert_eq!(store.ike_sas().unwrap().len(), 41);
    let status = store.encryption().unwrap();
    assert_eq!(
        (
            status.current_key,
            status.keys.clone(),
            status.reencrypt_pending
        ),
        (Some(new), vec![1.min(new), 1.max(new)], 41)
    );
    // Bounded rounds until nothing is left; meanwhile everything stays readable.
    let before = inner.commits();
    let mut rounds = 0;
    while store.reseal(16).unwrap() > 0 {
        rounds += 1;
        assert!(rounds < 10);
        assert_eq!(store.ike_sas().unwrap().len(), 41);
    }
    assert_eq!(rounds, 4, "the configuration alone, then 16 + 16 + 8 SAs");
    assert_eq!(inner.commits() - before, 4, "one commit per round");
    for spi in 1..=41 {
        assert_eq!(key_id_of(&inner.ike_sa(spi).unwrap()), new, "SA {spi}");
    }
    assert_eq!(key_id_of(&inner.applied_config().unwrap().unwrap()), new);
    let status = store.encryption().unwrap();
    assert_eq!(status.records.len(), 1, "{status:?}");
    assert_eq!(
        (status.records.get(&new.to_string()), status.reencrypted),
        (Some(&42), 41)
    );
    // Another node with the rotated key file reads everything, even with the old key gone.
    let text = std::fs::read_to_string(&keys).unwrap();
    let new_only: String = text
        .lines()
        .filter(|l| !l.starts_with("1 "))
        .map(|l| format!("{l}\n"))
        .collect();
    let only_2 = dir.path().join("only-2.keys");
    write_key_file(&only_2, &new_only);
    let other = sealed(&inner, Some(&only_2), false);
    let read = other.ike_sas().unwrap();
    assert_eq!(read.len(), 41);
    assert_eq!(read[0].1.as_slice(), secret(1));
}

#[test]
fn store_sealed_works_over_a_file_store() {
    let (dir, keys) = key_file(&key_line(1, 0x11));
    let path = dir.path().join("state.redb");
    {
        let file = FileStore::open(&path).unwrap();
        let mut store = SealedStore::open(Box::new(file), &options(Some(&keys), false)).unwrap();
        store
            .commit(&[put(1, &secret(1)), put(2, &secret(2))])
            .unwrap();
        assert_eq!(store.read_ike_sa(2).unwrap().unwrap().as_slice(), secret(2));
        store.rotate_key().unwrap();
        while store.reseal(1).unwrap() > 0 {}
    }
    let bytes = std::fs::read(&path).unwrap();
    assert!(!contains(&bytes, b"SECRET-KEY-MATERIAL"));
    let file = FileStore::open(&path).unwrap();
    let current = super::keyring::KeyRing::load(&keys).unwrap().current();
    assert_eq!(key_id_of(&file.read_ike_sa(1).unwrap().unwrap()), current);
    assert_ne!(current, 1);
    let store = SealedStore::open(Box::new(file), &options(Some(&keys), false)).unwrap();
    assert_eq!(store.ike_sas().unwrap().len(), 2);
}

#[test]
fn store_sealed_uses_aes_256_gcm_siv() {
    // RFC 8452, Appendix C.2, the first AEAD_AES_256_GCM_SIV vector: an empty plaintext and
    // AAD, key 01 00..00, nonce 03 00..00.
    let mut key = vec![0u8; 32];
    key[0] = 1;
    let (_dir, keys) = key_file(&format!("7 {}\n", hex::encode(&key)));
    let ring = super::keyring::KeyRing::load(&keys).unwrap();
    let mut nonce = [0u8; 12];
    nonce[0] = 3;
    let mut out = Vec::new();
    ring.key(7)
        .unwrap()
        .seal_in_place_append_tag(
            aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce),
            aws_lc_rs::aead::Aad::empty(),
            &mut out,
        )
        .unwrap();
    assert_eq!(hex::encode(out), "07f5f4169bbf55a8400cd47ea6fd400f");
}

#[test]
fn store_sealed_rotation_to_a_key_added_on_every_node() {
    // Two control nodes with the same key file; the active one seals with key 1.
    let (dir, keys_a) = key_file(&key_line(1, 0x11));
    let keys_b = dir.path().join("node-b.keys");
    write_key_file(&keys_b, &key_line(1, 0x11));
    let inner = MemoryStore::new();
    let mut active = sealed(&inner, Some(&keys_a), false);
    active
        .commit(&[
            put(1, &secret(1)),
            Change::PutConfig {
                record: Zeroizing::new(b"config".to_vec()),
            },
        ])
        .unwrap();
    assert_eq!(active.ike_sas().unwrap().len(), 1);
    assert!(active.applied_config().unwrap().is_some());
    // The operator adds key 0x5eed to the active node's file, forgets the standby's, and
    // rotates: the active node takes the added key instead of generating one.
    let added = format!("{}{}", key_line(1, 0x11), key_line(0x5eed, 0x5e));
    write_key_file(&keys_a, &added);
    let rotation = active.rotate_key().unwrap();
    assert_eq!(
        (
            rotation.key_id,
            rotation.generated,
            rotation.reencrypt_pending
        ),
        (0x5eed, false, 2)
    );
    assert_eq!(std::fs::read_to_string(&keys_a).unwrap(), added);
    active.commit(&[put(2, &secret(2))]).unwrap();
    assert_eq!(key_id_of(&inner.ike_sa(2).unwrap()), 0x5eed);
    while active.reseal(16).unwrap() > 0 {}
    assert_eq!(key_id_of(&inner.ike_sa(1).unwrap()), 0x5eed);
    // The standby takes over (or a node restarts) without the key: the error names the key id
    // and its key file, and says what to do.
    let standby = sealed(&inner, Some(&keys_b), false);
    for e in [
        standby.ike_sas().unwrap_err(),
        standby.applied_config().unwrap_err(),
    ] {
        let text = e.to_string();
        assert!(
            matches!(e, StoreError::UnknownKey { key_id: 0x5eed, .. })
                && text.contains(&format!("key id {}", 0x5eed))
                && text.contains(&keys_b.display().to_string())
                && text.contains("add that key's line"),
            "{text}"
        );
    }
    // With the line added to its file too, it reads everything.
    write_key_file(&keys_b, &added);
    let standby = sealed(&inner, Some(&keys_b), false);
    assert_eq!(standby.ike_sas().unwrap().len(), 2);
    assert_eq!(
        standby.applied_config().unwrap().unwrap().as_slice(),
        b"config"
    );
}
