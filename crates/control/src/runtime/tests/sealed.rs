//! Encryption at rest with real negotiated SAs: two control loops negotiate an IKE SA and a
//! CHILD_SA, `a` keeps its state in a real store (a redb file, an etcd) behind
//! [`crate::store::SealedStore`] and logs its keys ([`crate::keylog`]); the raw store is then
//! searched for every logged key. With a key file none is found, and `a` restores its IKE SA
//! from the sealed records; without one every key is found (so the search can fail).

use super::*;
use crate::store::{EncryptionOptions, EtcdOptions, EtcdStore, FileStore, SealedStore};
use crate::testing::{Etcd, Raw};

/// Every key in the key log under `dir`: the hex fields of at least 16 bytes of both tables
/// (SK_ei, SK_er and, with integrity algorithms, SK_ai, SK_ar; the ESP keys with their salt).
fn logged_keys(dir: &Path) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    for table in [crate::IKE_TABLE, crate::ESP_TABLE] {
        let text = std::fs::read_to_string(dir.join(table)).unwrap_or_default();
        for field in text.split([',', '"', '\n']) {
            let hex = field.trim().trim_start_matches("0x");
            if hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                keys.push(hex::decode(hex).unwrap());
            }
        }
    }
    keys
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Starts `a`'s control loop over `store` with `path` as its data path.
fn start_a(
    config: &Config,
    path: &Arc<FakePath>,
    rx: Receiver<ToControl>,
    store: Box<dyn Store>,
) -> ControlPlane {
    let datapath: Arc<dyn DataPath> = path.clone();
    ControlPlane::start_with_rng(
        config,
        datapath,
        rx,
        store,
        Box::new(crypto::SeededRng::new(8)),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Negotiates a tunnel between `a` (over the store `open` makes, key log on) and `b`, crashes
/// `a`, and returns the raw store as `raw` reads it and the logged keys. With `restore`, `a` is
/// started again over a new store from `open` and must restore the same IKE SA.
fn negotiate(
    name: &str,
    open: &dyn Fn(&Path) -> Box<dyn Store>,
    raw: &dyn Fn(&Path) -> Vec<u8>,
    restore: bool,
) -> (Vec<u8>, Vec<Vec<u8>>) {
    let _ = logs();
    let dir = scratch_dir();
    let key_log = dir.0.join("keylog");
    let config_a = config(
        &dir.0,
        'a',
        name,
        true,
        &format!("key_log = \"{}\"", key_log.display()),
        "",
    );
    let config_b = config(&dir.0, 'b', name, false, "", "");
    let ((path_a, tx_a, rx_a), wired_b) = wired_paths();
    let b = Node::start(config_b, wired_b, &dir);
    let mut a = Node {
        control: Some(start_a(&config_a, &path_a, rx_a, open(&dir.0))),
        config: config_a,
        path: path_a,
        to_control: tx_a,
        store: MemoryStore::default(),
        _dir: Arc::clone(&dir),
    };
    wait_up(&a, &b);
    wait_until(5, "the keys of the IKE SA and the CHILD_SA logged", || {
        logged_keys(&key_log).len() >= 4
    });
    let keys = logged_keys(&key_log);
    let before = ike_spis(&a);
    a.control.take().unwrap().hand_over();
    let bytes = raw(&dir.0);
    if restore {
        let path = Arc::new(FakePath::default());
        let (tx, rx) = crossbeam_channel::unbounded();
        *path.peer.lock().unwrap() = Some(b.to_control.clone());
        *b.path.peer.lock().unwrap() = Some(tx.clone());
        a.control = Some(start_a(&a.config, &path, rx, open(&dir.0)));
        a.path = path;
        a.to_control = tx;
        assert_eq!(
            ike_spis(&a),
            before,
            "the IKE SA restored from the sealed store"
        );
        wait_until(10, "the restored node's new CHILD_SA", || {
            !a.path.live().is_empty()
        });
        // A key rotation through the control loop, to a key the operator appended to the key
        // file (with a key file: `open` wrote it): the record moves to the new key in the
        // background, and the status says when none is left under the old one.
        let key_file = dir.0.join("store.keys");
        if key_file.exists() {
            let mut text = std::fs::read_to_string(&key_file).unwrap();
            text.push_str(&format!("2 {}\n", "c3".repeat(32)));
            std::fs::write(&key_file, text).unwrap();
        }
        let handle = a.control().handle();
        let rotation = handle.rotate_store_key().unwrap();
        assert_eq!((rotation.key_id, rotation.generated), (2, false));
        wait_until(10, "every record under key 2", || {
            let e = handle.store_stats().unwrap().encryption.unwrap();
            e.reencrypt_pending == 0 && e.records.keys().all(|k| k == "2")
        });
        a.control.take().unwrap().hand_over();
    }
    (bytes, keys)
}

/// The keys found in `bytes`.
fn found(bytes: &[u8], keys: &[Vec<u8>]) -> Vec<String> {
    keys.iter()
        .filter(|k| contains(bytes, k))
        .map(hex::encode)
        .collect()
}

/// A key file with one key in `dir`.
fn key_file(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("store.keys");
    std::fs::write(&path, format!("1 {}\n", "5a".repeat(32))).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn sealed_over(inner: Box<dyn Store>, key_file: Option<std::path::PathBuf>) -> Box<dyn Store> {
    let options = EncryptionOptions {
        key_file,
        accept_cleartext: false,
    };
    Box::new(SealedStore::open(inner, &options).unwrap())
}

#[test]
fn sealed_store_file_holds_no_negotiated_key() {
    let file = |dir: &Path| dir.join("state.redb");
    let raw = |dir: &Path| std::fs::read(file(dir)).unwrap();
    let encrypted = |dir: &Path| {
        sealed_over(
            Box::new(FileStore::open(&file(dir)).unwrap()),
            Some(key_file(dir)),
        )
    };
    let (bytes, keys) = negotiate("sealed-file", &encrypted, &raw, true);
    assert!(keys.len() >= 4, "{} keys logged", keys.len());
    assert!(bytes.len() > 4096);
    assert_eq!(
        found(&bytes, &keys),
        Vec::<String>::new(),
        "keys in the redb file"
    );

    // The same without a key file: every key is in the file.
    let clear = |dir: &Path| sealed_over(Box::new(FileStore::open(&file(dir)).unwrap()), None);
    let (bytes, keys) = negotiate("clear-file", &clear, &raw, false);
    assert_eq!(
        found(&bytes, &keys).len(),
        keys.len(),
        "the search finds keys in clear"
    );
}

#[test]
fn sealed_store_etcd_holds_no_negotiated_key() {
    let etcd = Etcd::start_with(&[])
        .expect("etcd is needed for this test: scripts/setup.sh installs it (etcd-server)");
    let url = etcd.url();
    let connect = move |prefix: &str| -> Box<dyn Store> {
        Box::new(
            EtcdStore::connect(&EtcdOptions {
                endpoints: vec![url.clone()],
                prefix: prefix.into(),
                timeout: Duration::from_secs(2),
                connect_timeout: Duration::from_secs(2),
                access: Default::default(),
            })
            .unwrap(),
        )
    };
    let dump = Raw::new(&etcd);
    // Keys and values of every key under the prefix, as etcd returns them.
    let raw = |prefix: &str| -> Vec<u8> {
        dump.dump(prefix)
            .into_iter()
            .flat_map(|(k, v)| k.into_bytes().into_iter().chain(v))
            .collect()
    };
    let encrypted = |dir: &Path| sealed_over(connect("/sealed-test"), Some(key_file(dir)));
    let (bytes, keys) = negotiate("sealed-etcd", &encrypted, &|_| raw("/sealed-test/"), true);
    assert!(keys.len() >= 4, "{} keys logged", keys.len());
    assert!(
        contains(&bytes, b"/sealed-test/ike_sas/"),
        "the dump holds the IKE SA"
    );
    assert_eq!(found(&bytes, &keys), Vec::<String>::new(), "keys in etcd");

    let clear = |_: &Path| sealed_over(connect("/clear-test"), None);
    let (bytes, keys) = negotiate("clear-etcd", &clear, &|_| raw("/clear-test/"), false);
    assert_eq!(
        found(&bytes, &keys).len(),
        keys.len(),
        "the search finds keys in clear"
    );
}
