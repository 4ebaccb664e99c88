use super::file::{IKE_SAS, META, SCHEMA_KEY, SCHEMA_VERSION};
use super::*;
use crate::testing::put;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// A scratch directory (not yet created), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        Self::new_in(&std::env::temp_dir())
    }

    fn new_in(base: &Path) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        Self(base.join(format!(
            "protego-store-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        )))
    }

    fn file(&self) -> PathBuf {
        self.0.join("state.redb")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

pub(super) fn contents(store: &dyn Store) -> Vec<(u64, Vec<u8>)> {
    store
        .ike_sas()
        .unwrap()
        .into_iter()
        .map(|(spi, s)| (spi, s.to_vec()))
        .collect()
}

/// Put, replace, delete and ordering, the same for every backend.
pub(super) fn round_trips(store: &mut dyn Store) {
    assert!(contents(store).is_empty());
    store.commit(&[put(7, b"seven")]).unwrap();
    assert_eq!(contents(store), [(7, b"seven".to_vec())]);

    // Replace.
    store.commit(&[put(7, b"seven again")]).unwrap();
    assert_eq!(contents(store), [(7, b"seven again".to_vec())]);

    // Several changes in one commit, including a put and a delete of the same SPI (in order),
    // and SPIs whose byte order differs from their numeric order.
    let spis = [
        u64::MAX,
        0x0100_0000_0000_0000,
        256,
        1,
        0,
        0x8000_0000_0000_0000,
    ];
    let mut batch: Vec<Change> = spis.iter().map(|&s| put(s, &s.to_be_bytes())).collect();
    batch.push(put(99, b"short-lived"));
    batch.push(Change::DeleteIkeSa { spi: 99 });
    // A delete then a put of the same SPI leaves the put.
    batch.push(Change::DeleteIkeSa { spi: 98 });
    batch.push(put(98, b"reborn"));
    store.commit(&batch).unwrap();
    let got = contents(store);
    let mut want: Vec<(u64, Vec<u8>)> = spis
        .iter()
        .map(|&s| (s, s.to_be_bytes().to_vec()))
        .collect();
    want.push((7, b"seven again".to_vec()));
    want.push((98, b"reborn".to_vec()));
    want.sort();
    assert_eq!(got, want, "ike_sas must be in ascending SPI order");

    // Delete, including of an SPI that is not stored.
    store
        .commit(&[
            Change::DeleteIkeSa { spi: 7 },
            Change::DeleteIkeSa { spi: 12345 },
            Change::DeleteIkeSa { spi: 0 },
        ])
        .unwrap();
    want.retain(|(s, _)| *s != 7 && *s != 0);
    assert_eq!(contents(store), want);

    // An empty commit changes nothing.
    store.commit(&[]).unwrap();
    assert_eq!(contents(store), want);

    // An empty snapshot is stored as such.
    store.commit(&[put(5, b"")]).unwrap();
    assert!(contents(store).contains(&(5, Vec::new())));

    // The applied configuration: one record beside the IKE SAs, replaced, deleted, committed
    // together with them.
    let config = |store: &dyn Store| store.applied_config().unwrap().map(|r| r.to_vec());
    assert_eq!(config(store), None);
    store
        .commit(&[Change::PutConfig {
            record: Zeroizing::new(b"first".to_vec()),
        }])
        .unwrap();
    assert_eq!(config(store).as_deref(), Some(&b"first"[..]));
    store
        .commit(&[
            put(6, b"six"),
            Change::PutConfig {
                record: Zeroizing::new(b"second".to_vec()),
            },
        ])
        .unwrap();
    assert_eq!(config(store).as_deref(), Some(&b"second"[..]));
    assert!(contents(store).contains(&(6, b"six".to_vec())));
    store.commit(&[Change::DeleteConfig]).unwrap();
    assert_eq!(config(store), None);
    store.commit(&[Change::DeleteConfig]).unwrap();
    store
        .commit(&[Change::PutConfig {
            record: Zeroizing::new(b"kept".to_vec()),
        }])
        .unwrap();
    assert_eq!(config(store).as_deref(), Some(&b"kept"[..]));

    // The filter set: a record of its own, apart from the configuration.
    let filters = |store: &dyn Store| store.filters().unwrap().map(|r| r.to_vec());
    assert_eq!(filters(store), None);
    store
        .commit(&[
            Change::PutFilters {
                record: Zeroizing::new(b"filters one".to_vec()),
            },
            put(7, b"seven"),
        ])
        .unwrap();
    assert_eq!(filters(store).as_deref(), Some(&b"filters one"[..]));
    assert_eq!(config(store).as_deref(), Some(&b"kept"[..]));
    store.commit(&[Change::DeleteConfig]).unwrap();
    assert_eq!(filters(store).as_deref(), Some(&b"filters one"[..]));
    store
        .commit(&[Change::PutFilters {
            record: Zeroizing::new(b"filters two".to_vec()),
        }])
        .unwrap();
    assert_eq!(filters(store).as_deref(), Some(&b"filters two"[..]));
    store.commit(&[Change::DeleteFilters]).unwrap();
    assert_eq!(filters(store), None);
    store
        .commit(&[Change::PutConfig {
            record: Zeroizing::new(b"kept".to_vec()),
        }])
        .unwrap();
}

#[test]
fn store_memory_round_trips() {
    let mut store = MemoryStore::new();
    round_trips(&mut store);
    assert_eq!(store.describe(), "memory");
}

#[test]
fn store_memory_clones_share_state() {
    let mut first = MemoryStore::new();
    let second = first.clone();
    first.commit(&[put(1, b"one"), put(2, b"two")]).unwrap();
    drop(first); // the "crash"
    assert_eq!(
        contents(&second),
        [(1, b"one".to_vec()), (2, b"two".to_vec())]
    );
    assert_eq!(
        second.ike_sa(2).as_deref().map(Vec::as_slice),
        Some(&b"two"[..])
    );
    assert_eq!(second.ike_sa(3), None);
    assert_eq!(second.commits(), 1);
}

#[test]
fn store_memory_failed_commit_applies_nothing() {
    let mut store = MemoryStore::new();
    let observer = store.clone();
    store.commit(&[put(1, b"one")]).unwrap();
    assert_eq!(store.commits(), 1);

    observer.fail_commits(true);
    let err = store
        .commit(&[
            put(2, b"two"),
            Change::DeleteIkeSa { spi: 1 },
            put(1, b"uno"),
        ])
        .unwrap_err();
    assert!(matches!(err, StoreError::Write { .. }), "{err:?}");
    assert!(err.to_string().contains("memory"), "{err}");
    assert_eq!(contents(&store), [(1, b"one".to_vec())]);
    assert_eq!(store.commits(), 1);
    // An empty commit is still a no-op, not a failure.
    store.commit(&[]).unwrap();

    observer.fail_commits(false);
    store.commit(&[put(2, b"two")]).unwrap();
    assert_eq!(
        contents(&store),
        [(1, b"one".to_vec()), (2, b"two".to_vec())]
    );
    assert_eq!(store.commits(), 2);
}

#[test]
fn store_memory_empty_commit_is_not_counted() {
    let mut store = MemoryStore::new();
    store.commit(&[]).unwrap();
    assert_eq!(store.commits(), 0);
}

#[test]
fn store_boxed_store_is_a_store() {
    let shared = MemoryStore::new();
    let mut boxed: Box<dyn Store> = Box::new(shared.clone());
    boxed.commit(&[put(3, b"three")]).unwrap();
    assert_eq!(boxed.describe(), "memory");
    assert_eq!(contents(&shared), [(3, b"three".to_vec())]);
}

#[test]
fn store_change_debug_hides_snapshot() {
    let change = put(0x0123_4567_89ab_cdef, &[0xa5; 37]);
    let text = format!("{change:?}");
    assert_eq!(
        text,
        "PutIkeSa { spi: 0123456789abcdef, snapshot: <37 bytes> }"
    );
    assert!(!text.contains("165"), "{text}");
    let text = format!("{:?}", Change::DeleteIkeSa { spi: 1 });
    assert_eq!(text, "DeleteIkeSa { spi: 0000000000000001 }");

    let mut store = MemoryStore::new();
    store.commit(&[change]).unwrap();
    let text = format!("{store:?}");
    assert!(
        text.contains("ike_sas: 1") && !text.contains("165"),
        "{text}"
    );
}

#[test]
fn store_file_round_trips_and_persists() {
    let scratch = Scratch::new();
    let path = scratch.file();
    {
        let mut store = FileStore::open(&path).unwrap();
        assert_eq!(store.describe(), format!("file {}", path.display()));
        assert_eq!(store.path(), path);
        round_trips(&mut store);
    }
    let want = {
        let store = FileStore::open(&path).unwrap();
        contents(&store)
    };
    assert!(!want.is_empty());
    // Each reopen reads what the last instance committed, in order.
    let mut store = FileStore::open(&path).unwrap();
    store
        .commit(&[put(42, &[0x42; 1024]), Change::DeleteIkeSa { spi: 5 }])
        .unwrap();
    drop(store);
    let store = FileStore::open(&path).unwrap();
    assert_eq!(
        store
            .applied_config()
            .unwrap()
            .as_deref()
            .map(Vec::as_slice),
        Some(&b"kept"[..]),
        "the applied configuration survives a reopen"
    );
    let got = contents(&store);
    let mut want2: Vec<_> = want.into_iter().filter(|(s, _)| *s != 5).collect();
    want2.push((42, vec![0x42; 1024]));
    want2.sort();
    assert_eq!(got, want2);
}

#[test]
fn store_file_empty_commit_does_not_touch_the_file() {
    let scratch = Scratch::new();
    let path = scratch.file();
    let mut store = FileStore::open(&path).unwrap();
    store.commit(&[put(1, b"one")]).unwrap();
    let before = std::fs::metadata(&path).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    store.commit(&[]).unwrap();
    let after = std::fs::metadata(&path).unwrap();
    assert_eq!(before.modified().unwrap(), after.modified().unwrap());
    assert_eq!(before.len(), after.len());
    // A real commit does change it (so the check above means something).
    store.commit(&[put(2, b"two")]).unwrap();
    let changed = std::fs::metadata(&path).unwrap();
    assert_ne!(before.modified().unwrap(), changed.modified().unwrap());
}

#[test]
fn store_file_modes() {
    let scratch = Scratch::new();
    let nested = scratch.0.join("a").join("b");
    let path = nested.join("state.redb");
    drop(FileStore::open(&path).unwrap());
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&nested), 0o700);
    assert_eq!(mode(&scratch.0.join("a")), 0o700);
    assert_eq!(mode(&scratch.0), 0o700);

    // An existing file readable by others is tightened.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(FileStore::open(&path).unwrap());
    assert_eq!(mode(&path), 0o600);

    // An existing empty file (e.g. made by `touch`) becomes a store, mode 0600.
    let touched = scratch.0.join("touched.redb");
    std::fs::write(&touched, b"").unwrap();
    std::fs::set_permissions(&touched, std::fs::Permissions::from_mode(0o664)).unwrap();
    let mut store = FileStore::open(&touched).unwrap();
    store.commit(&[put(1, b"one")]).unwrap();
    assert_eq!(mode(&touched), 0o600);
}

#[test]
fn store_file_second_open_is_locked() {
    let scratch = Scratch::new();
    let path = scratch.file();
    let mut first = FileStore::open(&path).unwrap();
    first.commit(&[put(1, b"one")]).unwrap();

    // In a thread, so that a hang fails the test instead of blocking it.
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let _ = tx.send(FileStore::open(&p).map(drop));
    });
    let err = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("second open hangs")
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Locked { path: p } if *p == path),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&*path.to_string_lossy()) && text.contains("locked"),
        "{text}"
    );

    // The first store still works, and once it is closed the file opens again.
    first.commit(&[put(2, b"two")]).unwrap();
    drop(first);
    let store = FileStore::open(&path).unwrap();
    assert_eq!(contents(&store).len(), 2);
}

/// Kills and reaps the child process on drop, whatever the test's outcome.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn store_file_open_in_another_process_is_locked() {
    use std::io::BufRead;
    let scratch = Scratch::new();
    let path = scratch.file();
    drop(FileStore::open(&path).unwrap());
    // This test binary, re-run as the holder below.
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "store::tests::store_lock_holder",
            "--ignored",
            "--nocapture",
        ])
        .env(HOLDER_ENV, &path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildGuard(child);
    let mut stdout = std::io::BufReader::new(child.0.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains(HOLDER_READY) {
        line.clear();
        let n = stdout.read_line(&mut line).unwrap();
        assert!(n > 0, "the holder process did not open the store");
    }

    let err = FileStore::open(&path).unwrap_err();
    assert!(
        matches!(&err, StoreError::Locked { path: p } if *p == path),
        "{err:?}"
    );

    // Once the holder is gone, the file opens again with what it committed.
    drop(child.0.stdin.take());
    std::io::Read::read_to_string(&mut stdout, &mut line).unwrap();
    assert!(child.0.wait().unwrap().success(), "{line}");
    let store = FileStore::open(&path).unwrap();
    assert_eq!(contents(&store), [(77, b"from the holder".to_vec())]);
}

const HOLDER_ENV: &str = "PROTEGO_STORE_TEST_HOLD";
const HOLDER_READY: &str = "protego-store-holder-ready";

/// Not a test: the other process of `store_file_open_in_another_process_is_locked`. Holds the
/// store named by `PROTEGO_STORE_TEST_HOLD` open until its stdin closes.
#[test]
#[ignore]
fn store_lock_holder() {
    let Some(path) = std::env::var_os(HOLDER_ENV) else {
        return;
    };
    let mut store = FileStore::open(Path::new(&path)).unwrap();
    store.commit(&[put(77, b"from the holder")]).unwrap();
    println!("{HOLDER_READY}");
    let mut sink = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut sink);
}

#[test]
fn store_file_rejects_garbage() {
    let scratch = Scratch::new();
    std::fs::create_dir_all(&scratch.0).unwrap();
    let long: String = "protego = \"not a database\"\n".repeat(400);
    for (name, content) in [
        ("short.txt", "hello\n".as_bytes()),
        ("long.txt", long.as_bytes()),
        ("zeros.bin", &[0u8; 8192][..]),
    ] {
        let path = scratch.0.join(name);
        std::fs::write(&path, content).unwrap();
        let err = FileStore::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{name}: {err:?}");
        let text = err.to_string();
        assert!(text.contains(&*path.to_string_lossy()), "{name}: {text}");
        // The file is left as it was.
        assert_eq!(std::fs::read(&path).unwrap(), content, "{name}");
    }

    // A directory.
    let err = FileStore::open(&scratch.0).unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&*scratch.0.to_string_lossy()),
        "{err}"
    );

    // A parent that is a file.
    let blocker = scratch.0.join("short.txt");
    let err = FileStore::open(&blocker.join("state.redb")).unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&*blocker.to_string_lossy()),
        "{err}"
    );
}

#[test]
fn store_file_rejects_other_schemas_and_databases() {
    let scratch = Scratch::new();
    let path = scratch.file();
    drop(FileStore::open(&path).unwrap());
    let set_schema = |version: u64| {
        let db = redb::Database::open(&path).unwrap();
        let write = db.begin_write().unwrap();
        write
            .open_table(META)
            .unwrap()
            .insert(SCHEMA_KEY, version)
            .unwrap();
        write.commit().unwrap();
    };

    set_schema(SCHEMA_VERSION + 1);
    let err = FileStore::open(&path).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Schema {
                found: 2,
                supported: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&*path.to_string_lossy()) && text.contains("schema version 2"),
        "{text}"
    );

    set_schema(0);
    let err = FileStore::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");

    set_schema(SCHEMA_VERSION);
    drop(FileStore::open(&path).unwrap());

    // Another program's redb database.
    let foreign = scratch.0.join("foreign.redb");
    {
        let db = redb::Database::create(&foreign).unwrap();
        let write = db.begin_write().unwrap();
        write
            .open_table(redb::TableDefinition::<u64, u64>::new("other"))
            .unwrap()
            .insert(1, 2)
            .unwrap();
        write.commit().unwrap();
    }
    let err = FileStore::open(&foreign).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("another program"), "{err}");

    // A `meta` table of the wrong types.
    let wrong = scratch.0.join("wrong.redb");
    {
        let db = redb::Database::create(&wrong).unwrap();
        let write = db.begin_write().unwrap();
        write
            .open_table(redb::TableDefinition::<u64, u64>::new("meta"))
            .unwrap()
            .insert(1, 2)
            .unwrap();
        write.commit().unwrap();
    }
    let err = FileStore::open(&wrong).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains(&*wrong.to_string_lossy()), "{err}");
}

#[test]
fn store_file_layout() {
    // What is on disk is what the module docs say.
    let scratch = Scratch::new();
    let path = scratch.file();
    let mut store = FileStore::open(&path).unwrap();
    store.commit(&[put(9, b"nine")]).unwrap();
    drop(store);
    let db = redb::Database::open(&path).unwrap();
    let read = redb::ReadableDatabase::begin_read(&db).unwrap();
    let meta = read.open_table(META).unwrap();
    assert_eq!(meta.get(SCHEMA_KEY).unwrap().unwrap().value(), 1);
    let sas = read.open_table(IKE_SAS).unwrap();
    assert_eq!(sas.get(9).unwrap().unwrap().value(), b"nine");
}

/// Commits 1000 SAs (as on a busy gateway), then measures 200 commits of one ~1 KiB snapshot
/// each; returns the figures as one line (mean, p50, p90, p99, max).
pub(crate) fn commit_latency(store: &mut dyn Store) -> String {
    let batch: Vec<Change> = (0..1000u64)
        .map(|spi| put((spi << 32) | 1, &[0x5a; 1024]))
        .collect();
    store.commit(&batch).unwrap();
    let rounds = 200u64;
    let mut samples = Vec::new();
    for i in 0..rounds {
        let change = put(((i % 1000) << 32) | 1, &[i as u8; 1024]);
        let t = Instant::now();
        store.commit(&[change]).unwrap();
        samples.push(t.elapsed());
    }
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / rounds as u32;
    let pct = |p: usize| samples[(samples.len() - 1) * p / 100];
    format!(
        "mean {mean:?}, p50 {:?}, p90 {:?}, p99 {:?}, max {:?} ({rounds} commits, 1000 SAs stored)",
        pct(50),
        pct(90),
        pct(99),
        samples[samples.len() - 1]
    )
}

/// Prints the latency of committing one ~1 KiB snapshot (fsync included). Run with
/// `cargo test -p protego-control store_file_commit_latency -- --ignored --nocapture`;
/// `PROTEGO_STORE_BENCH_DIR` picks the file system (default: the temporary directory).
#[test]
#[ignore]
fn store_file_commit_latency() {
    let base = std::env::var_os("PROTEGO_STORE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let scratch = Scratch::new_in(&base);
    let path = scratch.file();
    let t = Instant::now();
    let mut store = FileStore::open(&path).unwrap();
    let create = t.elapsed();
    let commits = commit_latency(&mut store);
    drop(store);
    let t = Instant::now();
    let store = FileStore::open(&path).unwrap();
    let reopen = t.elapsed();
    let t = Instant::now();
    let n = store.ike_sas().unwrap().len();
    let restore = t.elapsed();
    println!(
        "store commit of one 1 KiB snapshot on {}: {commits}; create {create:?}, reopen with \
         integrity check {reopen:?}, reading {n} SAs {restore:?}, file {} bytes",
        base.display(),
        std::fs::metadata(&path).unwrap().len(),
    );
}

#[test]
fn store_file_damaged_copies_fail_cleanly() {
    // Truncated or overwritten copies of a real store either open with exactly the committed
    // contents (the damage hit free space) or fail with `Corrupt` naming the path; never a panic
    // and never different contents.
    let scratch = Scratch::new();
    let path = scratch.file();
    let mut store = FileStore::open(&path).unwrap();
    let batch: Vec<Change> = (0..50u64).map(|spi| put(spi, &[spi as u8; 1024])).collect();
    store.commit(&batch).unwrap();
    let want = contents(&store);
    drop(store);
    let orig = std::fs::read(&path).unwrap();
    let damaged = scratch.0.join("damaged.redb");
    let check = |bad: &[u8], what: &str| {
        std::fs::write(&damaged, bad).unwrap();
        match FileStore::open(&damaged) {
            Ok(store) => assert_eq!(contents(&store), want, "{what}"),
            Err(StoreError::Corrupt { path, .. }) => assert_eq!(path, damaged, "{what}"),
            Err(e) => panic!("{what}: {e:?}"),
        }
    };
    for len in (1..orig.len()).step_by(997) {
        check(&orig[..len], &format!("truncated to {len}"));
    }
    for off in (0..orig.len()).step_by(1499) {
        let mut bad = orig.clone();
        for b in &mut bad[off..(off + 64).min(orig.len())] {
            *b ^= 0xff;
        }
        check(&bad, &format!("64 bytes flipped at {off}"));
    }
}
