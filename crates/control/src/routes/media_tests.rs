//! The route store over both media: the same changes, restarts and compactions through files
//! ([`FileMedium`]) and through etcd ([`EtcdMedium`], a real etcd per test as in
//! `store/etcd_tests.rs`: missing, it fails under `make test` and skips elsewhere); then what
//! only etcd has: the layout, a crash between the chunks and the head flip, a missing or torn
//! chunk, sealed records, a fence lost.

use super::tests::{add, del, ip, routes_of, Fake};
use super::*;
use crate::store::{
    EncryptionOptions, EtcdAccess, EtcdMedium, EtcdOptions, EtcdStore, Fence, Term,
};
use crate::testing::{Etcd, Raw};
use std::time::Duration;

/// Chunks this small make even a few entries span several keys.
const SMALL_CHUNK: usize = 16;

/// Where a test keeps its route store, and how it opens the store again (a restart).
trait Place {
    /// A route store on this place, as a restarted node opens it.
    fn open(&self) -> RouteStore;
}

struct Files {
    _dir: tempfile::TempDir,
    state: PathBuf,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("state.redb");
        Self { _dir: dir, state }
    }
}

impl Place for Files {
    fn open(&self) -> RouteStore {
        RouteStore::beside(&self.state)
    }
}

struct InEtcd {
    etcd: Etcd,
    prefix: String,
    encryption: EncryptionOptions,
    fence: Option<Fence>,
}

fn etcd_options(etcd: &Etcd, prefix: &str) -> EtcdOptions {
    EtcdOptions {
        endpoints: vec![etcd.url()],
        prefix: prefix.into(),
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        access: EtcdAccess::default(),
    }
}

impl InEtcd {
    fn start() -> Option<Self> {
        Some(Self {
            etcd: Etcd::start()?,
            prefix: "/protego/routes-test".into(),
            encryption: EncryptionOptions::default(),
            fence: None,
        })
    }

    fn medium(&self) -> EtcdMedium {
        let mut store =
            EtcdStore::connect(&etcd_options(&self.etcd, &self.prefix)).expect("etcd store");
        if let Some(fence) = &self.fence {
            store = store.fenced(fence.clone());
        }
        EtcdMedium::new(store, &self.encryption)
            .expect("medium")
            .with_chunk_size(SMALL_CHUNK)
    }

    fn raw(&self) -> Raw {
        Raw::new(&self.etcd)
    }

    fn key(&self, rest: &str) -> String {
        format!("{}/routes/{rest}", self.prefix)
    }
}

impl Place for InEtcd {
    fn open(&self) -> RouteStore {
        RouteStore::new(Box::new(self.medium()))
    }
}

/// Both places, files first; the etcd one only if etcd could be started.
fn places() -> Vec<(&'static str, Box<dyn Place>)> {
    let mut out: Vec<(&'static str, Box<dyn Place>)> = vec![("files", Box::new(Files::new()))];
    if let Some(etcd) = InEtcd::start() {
        out.push(("etcd", Box::new(etcd)));
    }
    out
}

/// Changes survive restarts on either medium: a load (a snapshot), single changes (the
/// journal), a refused file (recorded nowhere), and the compaction at every start.
#[test]
fn route_store_changes_survive_restarts_on_both_media() {
    for (name, place) in places() {
        let (store, dp) = (place.open(), Fake::default());
        assert_eq!(
            store.restore(&dp).expect(name),
            Restored::default(),
            "{name}"
        );
        store
            .load(
                &dp,
                Arc::from("acme,prod,10.0.0.5,192.0.2.1\nacme,prod,10.0.0.6,192.0.2.1\n"),
            )
            .expect(name);
        store.apply(&dp, add("10.0.0.7", "192.0.2.2")).expect(name);
        store.apply(&dp, del("10.0.0.5")).expect(name);
        assert!(store
            .load(&dp, Arc::from("acme,prod,10.0.0.8,nope\n"))
            .is_err());
        let (store, again) = (place.open(), Fake::default());
        let r = store.restore(&again).expect(name);
        assert_eq!((r.snapshot, r.journal, r.skipped), (2, 2, 0), "{name}");
        assert_eq!(routes_of(&again), routes_of(&dp), "{name}");
        // Once more, with a change after the restart's compaction.
        store
            .apply(&again, add("10.0.0.9", "192.0.2.3"))
            .expect(name);
        let (store, third) = (place.open(), Fake::default());
        let r = store.restore(&third).expect(name);
        assert_eq!((r.snapshot, r.journal), (2, 1), "{name}");
        assert_eq!(routes_of(&third), routes_of(&again), "{name}");
        // The store refuses to be used before it is restored, on either medium.
        let e = place
            .open()
            .apply(&Fake::default(), add("10.0.0.5", "192.0.2.1"))
            .expect_err(name);
        assert!(
            e.to_string().contains("before it was restored"),
            "{name}: {e}"
        );
    }
}

/// A compaction after a VNet was removed forgets its entries on either medium.
#[test]
fn route_store_a_compaction_forgets_on_both_media() {
    for (name, place) in places() {
        let (store, dp) = (place.open(), Fake::default());
        store.restore(&dp).expect(name);
        store
            .load(&dp, Arc::from("acme,prod,10.0.0.6,192.0.2.1\n"))
            .expect(name);
        store.apply(&dp, add("10.0.0.5", "192.0.2.1")).expect(name);
        dp.0.lock().expect("lock").clear();
        assert_eq!(store.compact(&dp).expect(name), 0, "{name}");
        let (store, again) = (place.open(), Fake::default());
        let r = store.restore(&again).expect(name);
        assert_eq!((r.snapshot, r.journal), (0, 0), "{name}");
        assert_eq!(routes_of(&again), [], "{name}");
    }
}

/// What is in etcd is what `store/etcd/routes.rs` documents: a head, the chunks of one
/// generation, one log record per single change, and nothing of older generations.
#[test]
fn route_store_etcd_layout() {
    let Some(place) = InEtcd::start() else { return };
    let raw = place.raw();
    let (store, dp) = (place.open(), Fake::default());
    store.restore(&dp).expect("empty");
    let lines: String = (1..=5)
        .map(|i| format!("acme,prod,10.0.0.{i},192.0.2.1\n"))
        .collect();
    store.load(&dp, Arc::from(lines)).expect("load");
    store.apply(&dp, add("10.0.1.1", "192.0.2.2")).expect("add");
    store.apply(&dp, del("10.0.0.1")).expect("del");
    let keys: Vec<String> = raw
        .dump(&place.key(""))
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let head = String::from_utf8(raw.dump(&place.key("head"))[0].1.clone()).expect("text");
    // Generation 1 at the first start, 2 after the load.
    assert!(head.starts_with("generation=2 chunks="), "{head}");
    let snapshot = {
        let mut b = Vec::new();
        dp.write_routes(&mut b).expect("written");
        b
    };
    // The load's table: 5 entries of 13 bytes and the snapshot's framing, in 16-byte chunks.
    let mut want_snapshot = Vec::new();
    overlay::write_snapshot(
        &mut want_snapshot,
        &[("acme", "prod")],
        5,
        (1..=5).map(|i| (0, ip(&format!("10.0.0.{i}")), ip("192.0.2.1"))),
    )
    .expect("written");
    let chunks = want_snapshot.len().div_ceil(SMALL_CHUNK);
    assert!(
        head.contains(&format!("chunks={chunks} bytes={} ", want_snapshot.len())),
        "{head}"
    );
    let mut want: Vec<String> = vec![place.key("head")];
    want.extend((0..chunks).map(|i| place.key(&format!("snap/{:016x}/{i:08x}", 2))));
    want.extend((1..=2).map(|s| place.key(&format!("log/{:016x}/{s:016x}", 2))));
    want.sort();
    assert_eq!(keys, want);
    let log = raw.dump(&place.key("log/"));
    assert_eq!(log[0].1, b"+ acme,prod,10.0.1.1,192.0.2.2");
    assert_eq!(log[1].1, b"- acme,prod,10.0.0.1");
    // A compaction moves everything to generation 3 and deletes generation 2.
    store.compact(&dp).expect("compacted");
    let keys: Vec<String> = raw
        .dump(&place.key(""))
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let chunks = snapshot.len().div_ceil(SMALL_CHUNK);
    let mut want: Vec<String> = vec![place.key("head")];
    want.extend((0..chunks).map(|i| place.key(&format!("snap/{:016x}/{i:08x}", 3))));
    want.sort();
    assert_eq!(keys, want);
}

/// A compaction that crashed after writing some chunks of the next generation, before the
/// head flip, leaves the old generation whole: the restart restores it and its log, and its
/// own compaction replaces the leftovers.
#[test]
fn route_store_etcd_a_crash_before_the_head_flip_keeps_the_old_generation() {
    let Some(place) = InEtcd::start() else { return };
    let raw = place.raw();
    let (store, dp) = (place.open(), Fake::default());
    store.restore(&dp).expect("empty");
    store
        .load(
            &dp,
            Arc::from("acme,prod,10.0.0.5,192.0.2.1\nacme,prod,10.0.0.6,192.0.2.1\n"),
        )
        .expect("load");
    store.apply(&dp, add("10.0.0.7", "192.0.2.2")).expect("add");
    // The crash: chunks 0 and 1 of generation 3 written (another table's), no head flip.
    for i in 0..2u32 {
        raw.put(
            &place.key(&format!("snap/{:016x}/{i:08x}", 3)),
            b"a chunk of a compaction that never finished",
        );
    }
    let (store, again) = (place.open(), Fake::default());
    let r = store.restore(&again).expect("restored");
    assert_eq!((r.snapshot, r.journal), (2, 1));
    assert_eq!(routes_of(&again), routes_of(&dp));
    // The restart's compaction wrote generation 3 anew: it restores, and no leftover chunk
    // is left behind.
    let head = String::from_utf8(raw.dump(&place.key("head"))[0].1.clone()).expect("text");
    assert!(head.starts_with("generation=3 "), "{head}");
    for (k, v) in raw.dump(&place.key("snap/")) {
        assert_ne!(v, b"a chunk of a compaction that never finished", "{k}");
    }
    let (store, third) = (place.open(), Fake::default());
    store.restore(&third).expect("restored");
    assert_eq!(routes_of(&third), routes_of(&dp));
}

/// A missing chunk or a torn one stops the start with an error naming the key.
#[test]
fn route_store_etcd_a_missing_or_torn_chunk_is_named() {
    let Some(place) = InEtcd::start() else { return };
    let raw = place.raw();
    let (store, dp) = (place.open(), Fake::default());
    store.restore(&dp).expect("empty");
    store
        .load(
            &dp,
            Arc::from("acme,prod,10.0.0.5,192.0.2.1\nacme,prod,10.0.0.6,192.0.2.1\n"),
        )
        .expect("load");
    let chunk1 = place.key(&format!("snap/{:016x}/{:08x}", 2, 1));
    let value = raw.dump(&chunk1)[0].1.clone();
    // Torn: the chunk cut short.
    raw.put(&chunk1, &value[..value.len() - 3]);
    let e = place.open().restore(&Fake::default()).expect_err("torn");
    assert!(e.to_string().contains("torn"), "{e}");
    assert!(e.to_string().contains(&place.key("head")), "{e}");
    // Missing.
    raw.delete(&chunk1);
    let e = place.open().restore(&Fake::default()).expect_err("missing");
    assert!(e.to_string().contains(&chunk1), "{e}");
    assert!(e.to_string().contains("missing"), "{e}");
    // Put back, it restores.
    raw.put(&chunk1, &value);
    let again = Fake::default();
    place.open().restore(&again).expect("whole again");
    assert_eq!(routes_of(&again), routes_of(&dp));
}

/// With a key file, chunks and log records are sealed (no address in clear in etcd), a
/// record moved to another key does not open, and the store restores.
#[test]
fn route_store_etcd_records_are_sealed() {
    use crate::store::{key_line, write_key_file};
    let Some(mut place) = InEtcd::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let key_file = dir.path().join("store.keys");
    write_key_file(&key_file, &key_line(7, 0x42));
    place.encryption = EncryptionOptions {
        key_file: Some(key_file),
        accept_cleartext: false,
    };
    let raw = place.raw();
    let (store, dp) = (place.open(), Fake::default());
    store.restore(&dp).expect("empty");
    store
        .load(&dp, Arc::from("acme,prod,10.0.0.5,192.0.2.1\n"))
        .expect("load");
    store.apply(&dp, add("10.0.0.7", "192.0.2.2")).expect("add");
    for (k, v) in raw.dump(&place.key("")) {
        if !k.ends_with("/head") {
            assert!(v.starts_with(b"PSEC"), "{k} is not sealed");
            assert!(
                !v.windows(4).any(|w| w == [10, 0, 0, 5]),
                "{k} holds an address"
            );
        }
    }
    let (reopened, again) = (place.open(), Fake::default());
    reopened.restore(&again).expect("restored");
    assert_eq!(routes_of(&again), routes_of(&dp));
    // A key appended to the key file (a rotation): the next compaction seals under it.
    let key_file = place.encryption.key_file.clone().expect("key file");
    write_key_file(&key_file, &(key_line(7, 0x42) + &key_line(8, 0x43)));
    reopened.compact(&again).expect("compacted");
    for (k, v) in raw.dump(&place.key("snap/")) {
        assert_eq!(crate::store::sealed_key_id(&v), Some(8), "{k}");
    }
    // Chunk 0 copied over chunk 1: it does not open there.
    let chunk = |i: u32| place.key(&format!("snap/{:016x}/{i:08x}", 4));
    let first = raw.dump(&chunk(0))[0].1.clone();
    raw.put(&chunk(1), &first);
    let e = place.open().restore(&Fake::default()).expect_err("moved");
    assert!(e.to_string().contains(&chunk(1)), "{e}");
    assert!(e.to_string().contains("does not open"), "{e}");
}

/// A store fenced by a leadership that is lost writes nothing: a change is reported as not
/// persisted, and a compaction leaves the old generation.
#[test]
fn route_store_etcd_a_deposed_leader_writes_nothing() {
    let Some(mut place) = InEtcd::start() else {
        return;
    };
    let raw = place.raw();
    let leader = format!("{}/leader", place.prefix);
    // The prefix's schema key first (written by the first store to connect), then the leader.
    drop(place.open());
    raw.put(&leader, b"control1");
    let revision = {
        let mut client = raw.client.clone();
        let r = raw
            .runtime
            .block_on(client.get(leader.as_str(), None))
            .expect("leader");
        r.kvs()[0].create_revision()
    };
    place.fence = Some(Fence {
        key: leader.clone(),
        name: "control1".into(),
        term: Term::from_revision(revision),
    });
    let (store, dp) = (place.open(), Fake::default());
    store.restore(&dp).expect("empty");
    store
        .apply(&dp, add("10.0.0.5", "192.0.2.1"))
        .expect("leader writes");
    // Another node takes over.
    raw.delete(&leader);
    raw.put(&leader, b"control2");
    let e = store
        .apply(&dp, add("10.0.0.6", "192.0.2.1"))
        .expect_err("deposed");
    assert!(matches!(e, Error::NotPersisted { .. }), "{e:?}");
    assert!(e.to_string().contains("no longer the leader"), "{e}");
    let e = store.compact(&dp).expect_err("deposed");
    assert!(e.to_string().contains("no longer the leader"), "{e}");
    let head = String::from_utf8(raw.dump(&place.key("head"))[0].1.clone()).expect("text");
    assert!(head.starts_with("generation=1 "), "{head}");
    // What the old leader managed to store is what a new leader restores.
    place.fence = None;
    let again = Fake::default();
    place.open().restore(&again).expect("restored");
    assert_eq!(routes_of(&again), [(ip("10.0.0.5"), ip("192.0.2.1"))]);
}

/// A damaged log record before the last one stops the start, naming it; a damaged last one is
/// skipped (as a damaged last journal line of the file medium is).
#[test]
fn route_store_etcd_a_damaged_log_record() {
    let Some(place) = InEtcd::start() else { return };
    let raw = place.raw();
    let (store, dp) = (place.open(), Fake::default());
    store.restore(&dp).expect("empty");
    store.apply(&dp, add("10.0.0.5", "192.0.2.1")).expect("add");
    store.apply(&dp, add("10.0.0.6", "192.0.2.1")).expect("add");
    let record = |seq: u64| place.key(&format!("log/{:016x}/{seq:016x}", 1));
    let first = raw.dump(&record(1))[0].1.clone();
    raw.put(&record(1), b"+ acme,prod,10.0.0.5,x");
    let e = place.open().restore(&Fake::default()).expect_err("damaged");
    assert!(e.to_string().contains("line 1"), "{e}");
    assert!(e.to_string().contains(&place.key("log/")), "{e}");
    assert!(e.to_string().contains("before the last one"), "{e}");
    // The last one damaged: skipped.
    raw.put(&record(1), &first);
    raw.put(&record(2), b"+ acme,prod,10.0.0.6,x");
    let again = Fake::default();
    let r = place.open().restore(&again).expect("restored");
    assert_eq!((r.journal, r.skipped), (1, 1));
    assert_eq!(routes_of(&again), [(ip("10.0.0.5"), ip("192.0.2.1"))]);
}

/// A compaction that crashed after its head flip, before deleting the old generation, leaves
/// that generation's log: it is not replayed over the new snapshot (it would undo the load),
/// and the next compaction deletes it.
#[test]
fn route_store_etcd_the_log_of_the_previous_generation_is_not_replayed() {
    let Some(place) = InEtcd::start() else { return };
    let raw = place.raw();
    let (store, dp) = (place.open(), Fake::default());
    store.restore(&dp).expect("empty");
    store
        .load(&dp, Arc::from("acme,prod,10.0.0.6,192.0.2.1\n"))
        .expect("load");
    store.apply(&dp, add("10.0.0.5", "192.0.2.1")).expect("add");
    store.apply(&dp, del("10.0.0.6")).expect("del");
    let old_log = raw.dump(&place.key(&format!("log/{:016x}/", 2)));
    assert_eq!(old_log.len(), 2);
    store
        .load(
            &dp,
            Arc::from("acme,prod,10.0.0.5,192.0.2.2\nacme,prod,10.0.0.6,192.0.2.2\n"),
        )
        .expect("load");
    // The crash: generation 3 is the head, generation 2's log was not deleted.
    for (k, v) in &old_log {
        raw.put(k, v);
    }
    let (store, again) = (place.open(), Fake::default());
    let r = store.restore(&again).expect("restored");
    assert_eq!((r.snapshot, r.journal), (2, 0));
    assert_eq!(
        routes_of(&again),
        [
            (ip("10.0.0.5"), ip("192.0.2.2")),
            (ip("10.0.0.6"), ip("192.0.2.2"))
        ]
    );
    assert!(raw.dump(&place.key("log/")).is_empty(), "old log deleted");
}

/// Writes through to `inner`, calling `hook` once `after` bytes went through.
struct Tripwire<'a> {
    inner: &'a mut dyn std::io::Write,
    written: usize,
    after: usize,
    hook: &'a dyn Fn(),
}

impl std::io::Write for Tripwire<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        if self.written < self.after && self.written + n >= self.after {
            (self.hook)();
        }
        self.written += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A data path whose snapshot writes call `hook` after `after` bytes (the compaction is then
/// in the middle of its chunks).
struct Interrupted<'a> {
    inner: &'a Fake,
    after: usize,
    hook: Box<dyn Fn() + Send + Sync + 'a>,
}

impl DataPath for Interrupted<'_> {
    fn install_child(&self, c: &ike::ChildSaInfo) -> Result<(), datapath::DataplaneError> {
        self.inner.install_child(c)
    }
    fn remove_child(&self, t: ike::TunnelId, i: wire::EspSpi, o: wire::EspSpi) {
        self.inner.remove_child(t, i, o)
    }
    fn update_peer(
        &self,
        t: ike::TunnelId,
        s: ike::IkeSpis,
        l: std::net::SocketAddr,
        r: std::net::SocketAddr,
    ) {
        self.inner.update_peer(t, s, l, r)
    }
    fn send_ike(
        &self,
        l: std::net::SocketAddr,
        r: std::net::SocketAddr,
        p: &[u8],
    ) -> Result<(), datapath::DataplaneError> {
        self.inner.send_ike(l, r, p)
    }
    fn stats(&self) -> datapath::DataplaneStats {
        self.inner.stats()
    }
    fn change_routes(
        &self,
        change: RouteChange,
    ) -> Result<RouteChangeReport, datapath::DataplaneError> {
        self.inner.change_routes(change)
    }
    fn write_routes(
        &self,
        out: &mut dyn std::io::Write,
    ) -> Result<usize, datapath::DataplaneError> {
        let mut tripwire = Tripwire {
            inner: out,
            written: 0,
            after: self.after,
            hook: &*self.hook,
        };
        self.inner.write_routes(&mut tripwire)
    }
}

/// The leader loses its leadership in the middle of a compaction, after some chunks of the
/// new generation were written (what a crash there leaves, through the real code path): the
/// rest is refused, the head is not flipped, and the next leader restores the old
/// generation whole, with its log.
#[test]
fn route_store_etcd_interrupted_between_chunks_and_head_flip() {
    let Some(mut place) = InEtcd::start() else {
        return;
    };
    let raw = place.raw();
    let leader = format!("{}/leader", place.prefix);
    drop(place.open());
    raw.put(&leader, b"control1");
    let revision = {
        let mut client = raw.client.clone();
        let r = raw
            .runtime
            .block_on(client.get(leader.as_str(), None))
            .expect("leader");
        r.kvs()[0].create_revision()
    };
    place.fence = Some(Fence {
        key: leader.clone(),
        name: "control1".into(),
        term: Term::from_revision(revision),
    });
    let (store, dp) = (place.open(), Fake::default());
    store.restore(&dp).expect("empty");
    store
        .load(
            &dp,
            Arc::from("acme,prod,10.0.0.5,192.0.2.1\nacme,prod,10.0.0.6,192.0.2.1\n"),
        )
        .expect("load");
    store.apply(&dp, add("10.0.0.7", "192.0.2.2")).expect("add");
    let want = routes_of(&dp);
    let head = || String::from_utf8(raw.dump(&place.key("head"))[0].1.clone()).expect("text");
    let before = head();
    assert!(before.starts_with("generation=2 "), "{before}");
    // The compaction of generation 3: after two chunks, another node takes over.
    let interrupted = Interrupted {
        inner: &dp,
        after: 2 * SMALL_CHUNK + 1,
        hook: Box::new(|| {
            raw.delete(&leader);
            raw.put(&leader, b"control2");
        }),
    };
    let e = store.compact(&interrupted).expect_err("deposed mid-way");
    assert!(e.to_string().contains("no longer the leader"), "{e}");
    assert!(
        e.to_string()
            .contains(&place.key(&format!("snap/{:016x}/", 3))),
        "names the chunk: {e}"
    );
    let written = raw.dump(&place.key(&format!("snap/{:016x}/", 3)));
    assert_eq!(written.len(), 2, "two chunks of generation 3 written");
    assert_eq!(head(), before, "the head was not flipped");
    // The next leader restores generation 2 and its log, whole.
    place.fence = None;
    let again = Fake::default();
    let r = place.open().restore(&again).expect("restored");
    assert_eq!((r.snapshot, r.journal), (2, 1));
    assert_eq!(routes_of(&again), want);
}
