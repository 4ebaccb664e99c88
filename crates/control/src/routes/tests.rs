//! Tests of the route store: journal lines, restarts, and crashes at every step of a write.
use super::file::JOURNAL_HEADER;
use super::*;
use std::fs::{File, OpenOptions};
use std::io::Write;

#[test]
fn journal_lines_round_trip_and_bad_ones_are_named() {
    let add = Recorded::Add(VmRoute {
        tenant: TenantId::new("acme").expect("tenant"),
        vnet: "prod".into(),
        address: "10.0.0.5".parse().expect("ip"),
        host: "192.0.2.10".parse().expect("ip"),
    });
    assert_eq!(add.line(), "+ acme,prod,10.0.0.5,192.0.2.10");
    assert_eq!(Recorded::parse(1, &add.line()), Ok(add));
    let del = Recorded::Del {
        tenant: TenantId::new("acme").expect("tenant"),
        vnet: "prod".into(),
        address: "fd00::5".parse().expect("ip"),
    };
    assert_eq!(Recorded::parse(2, &del.line()), Ok(del));
    for bad in [
        "x acme",
        "- acme,prod",
        "- acme,prod,nope",
        "+ acme,prod,10.0.0.5",
    ] {
        let e = Recorded::parse(7, bad).expect_err(bad);
        assert!(e.contains("line 7"), "{bad}: {e}");
    }
}

/// A data path holding per-VM routes in a map, for VNet acme/prod only.
#[derive(Default)]
pub(super) struct Fake(pub(super) Mutex<std::collections::BTreeMap<IpAddr, IpAddr>>);

impl DataPath for Fake {
    fn install_child(&self, _: &ike::ChildSaInfo) -> Result<(), datapath::DataplaneError> {
        Ok(())
    }
    fn remove_child(&self, _: ike::TunnelId, _: wire::EspSpi, _: wire::EspSpi) {}
    fn update_peer(
        &self,
        _: ike::TunnelId,
        _: ike::IkeSpis,
        _: std::net::SocketAddr,
        _: std::net::SocketAddr,
    ) {
    }
    fn send_ike(
        &self,
        _: std::net::SocketAddr,
        _: std::net::SocketAddr,
        _: &[u8],
    ) -> Result<(), datapath::DataplaneError> {
        Ok(())
    }
    fn stats(&self) -> datapath::DataplaneStats {
        datapath::DataplaneStats::default()
    }
    fn change_routes(
        &self,
        change: RouteChange,
    ) -> Result<RouteChangeReport, datapath::DataplaneError> {
        let mut m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut r = RouteChangeReport::default();
        let replace = matches!(change, RouteChange::Replace(_));
        match change {
            RouteChange::Add(v) => {
                m.insert(v.address, v.host);
                r.added = 1;
            }
            RouteChange::Del { address, .. } => {
                r.removed = usize::from(m.remove(&address).is_some());
            }
            RouteChange::Load(text) => {
                for e in overlay::parse_routes(&text) {
                    let e = e.map_err(|e| datapath::DataplaneError::Route {
                        line: Some(e.line),
                        field: e.field.map(|f| f.name()),
                        reason: e.problem.to_string(),
                    })?;
                    m.insert(e.address, e.host);
                    r.added += 1;
                }
            }
            RouteChange::Restore(bytes) | RouteChange::Replace(bytes) => {
                if replace {
                    m.clear();
                }
                let s = overlay::read_snapshot(&bytes).map_err(|e| {
                    datapath::DataplaneError::Route {
                        line: None,
                        field: None,
                        reason: e.to_string(),
                    }
                })?;
                for (_, a, h) in s.entries().flatten() {
                    m.insert(a, h);
                    r.added += 1;
                }
            }
        }
        Ok(r)
    }
    fn write_routes(
        &self,
        out: &mut dyn std::io::Write,
    ) -> Result<usize, datapath::DataplaneError> {
        let m = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        overlay::write_snapshot(
            out,
            &[("acme", "prod")],
            m.len(),
            m.iter().map(|(a, h)| (0, *a, *h)),
        )
        .map_err(|e| datapath::DataplaneError::Route {
            line: None,
            field: None,
            reason: e.to_string(),
        })
    }
}

pub(super) fn add(vm: &str, host: &str) -> Recorded {
    Recorded::Add(VmRoute {
        tenant: TenantId::new("acme").expect("tenant"),
        vnet: "prod".into(),
        address: vm.parse().expect("ip"),
        host: host.parse().expect("ip"),
    })
}

/// Changes survive a restart: the snapshot of a load, the journal of single changes, and
/// a new snapshot written at start with the journal emptied.
#[test]
fn changes_survive_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state.redb");
    let (store, dp) = (RouteStore::beside(&state), Fake::default());
    assert_eq!(store.restore(&dp).expect("empty"), Restored::default());
    store
        .load(
            &dp,
            Arc::from("acme,prod,10.0.0.5,192.0.2.1\nacme,prod,10.0.0.6,192.0.2.1\n"),
        )
        .expect("load");
    store.apply(&dp, add("10.0.0.7", "192.0.2.2")).expect("add");
    let del = Recorded::Del {
        tenant: TenantId::new("acme").expect("tenant"),
        vnet: "prod".into(),
        address: "10.0.0.5".parse().expect("ip"),
    };
    store.apply(&dp, del).expect("del");
    let journal = std::fs::read_to_string(&store.journal).expect("journal");
    assert_eq!(
        journal.lines().count(),
        3,
        "a header and two changes: {journal}"
    );
    // A bad file is refused and recorded nowhere.
    assert!(store
        .load(&dp, Arc::from("acme,prod,10.0.0.8,nope\n"))
        .is_err());
    // The restart: a new data path, the same files.
    let (store, again) = (RouteStore::beside(&state), Fake::default());
    let r = store.restore(&again).expect("restored");
    assert_eq!((r.snapshot, r.journal, r.skipped), (2, 2, 0));
    let want = dp.0.lock().expect("lock").clone();
    assert_eq!(*again.0.lock().expect("lock"), want);
    assert_eq!(want.len(), 2);
    assert_eq!(
        std::fs::read_to_string(&store.journal).expect("journal"),
        format!("{JOURNAL_HEADER}3\n"),
        "generation 1 at the first start, 2 after the load, 3 at the restart"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(store.path())
        .expect("snapshot")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn files_sit_beside_the_state_store() {
    let s = RouteStore::beside(Path::new("/var/lib/protego/state.redb"));
    assert_eq!(s.path(), Path::new("/var/lib/protego/state.redb.routes"));
    assert_eq!(
        s.journal,
        PathBuf::from("/var/lib/protego/state.redb.routes.log")
    );
}

pub(super) fn routes_of(dp: &Fake) -> Vec<(IpAddr, IpAddr)> {
    let m = dp.0.lock().expect("lock");
    m.iter().map(|(a, h)| (*a, *h)).collect()
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

pub(super) fn del(vm: &str) -> Recorded {
    Recorded::Del {
        tenant: TenantId::new("acme").expect("tenant"),
        vnet: "prod".into(),
        address: ip(vm),
    }
}

fn append(path: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new().append(true).open(path).expect("journal");
    f.write_all(bytes).expect("appended");
}

/// A crash in the middle of appending a line leaves it without its newline: that change was
/// never answered, and is not replayed (its host is cut short into another valid address).
#[test]
fn a_torn_last_line_is_not_replayed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state.redb");
    let (store, dp) = (RouteStore::beside(&state), Fake::default());
    store.restore(&dp).expect("empty");
    store.apply(&dp, add("10.0.0.5", "192.0.2.1")).expect("add");
    append(&store.journal, b"+ acme,prod,10.0.0.9,192.0.2.1");
    let (store, again) = (RouteStore::beside(&state), Fake::default());
    let r = store.restore(&again).expect("restored");
    assert_eq!((r.journal, r.ignored), (1, 1));
    assert_eq!(routes_of(&again), [(ip("10.0.0.5"), ip("192.0.2.1"))]);
}

/// A line whose write failed half-way (the change was reported as not recorded) is cut off
/// before the next line is appended, so that line is not glued to it and lost.
#[test]
fn a_failed_write_is_cut_off_before_the_next_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state.redb");
    let (store, dp) = (RouteStore::new(FileMedium::beside(&state)), Fake::default());
    store.restore(&dp).expect("empty");
    store.apply(&dp, add("10.0.0.5", "192.0.2.1")).expect("add");
    // What `append` leaves after a failed write: part of a line, and no open file.
    append(&store.journal, b"+ acme,prod,10.0.0.9,19");
    store.lock().medium.file = None;
    store.apply(&dp, add("10.0.0.6", "192.0.2.2")).expect("add");
    let (store, again) = (RouteStore::beside(&state), Fake::default());
    let r = store.restore(&again).expect("restored");
    assert_eq!((r.journal, r.skipped, r.ignored), (2, 0, 0));
    assert_eq!(
        routes_of(&again),
        [
            (ip("10.0.0.5"), ip("192.0.2.1")),
            (ip("10.0.0.6"), ip("192.0.2.2"))
        ]
    );
}

/// A crash during a load's compaction, after the new snapshot replaced the old one but
/// before the journal was emptied, leaves the journal of the old snapshot: replaying it over
/// the new one would undo the load (here: move 10.0.0.5 back, delete 10.0.0.6 again).
#[test]
fn the_journal_of_the_previous_snapshot_is_not_replayed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state.redb");
    let (store, dp) = (RouteStore::beside(&state), Fake::default());
    store.restore(&dp).expect("empty");
    store
        .load(&dp, Arc::from("acme,prod,10.0.0.6,192.0.2.1\n"))
        .expect("load");
    store.apply(&dp, add("10.0.0.5", "192.0.2.1")).expect("add");
    store.apply(&dp, del("10.0.0.6")).expect("del");
    let old_journal = std::fs::read(&store.journal).expect("journal");
    store
        .load(
            &dp,
            Arc::from("acme,prod,10.0.0.5,192.0.2.2\nacme,prod,10.0.0.6,192.0.2.2\n"),
        )
        .expect("load");
    // The crash: the old journal is still there.
    std::fs::write(&store.journal, &old_journal).expect("old journal back");
    let (store, again) = (RouteStore::beside(&state), Fake::default());
    let r = store.restore(&again).expect("restored");
    assert_eq!((r.snapshot, r.journal, r.ignored), (2, 0, 2));
    let want = [
        (ip("10.0.0.5"), ip("192.0.2.2")),
        (ip("10.0.0.6"), ip("192.0.2.2")),
    ];
    assert_eq!(routes_of(&again), want);

    // A journal of any other generation is not this snapshot's: refused, not guessed at.
    std::fs::write(
        &store.journal,
        format!("{JOURNAL_HEADER}1\n+ acme,prod,10.0.0.7,192.0.2.3\n"),
    )
    .expect("journal");
    let e = RouteStore::beside(&state)
        .restore(&Fake::default())
        .expect_err("a foreign journal");
    assert!(e.to_string().contains("generation 1"), "{e}");
}

/// A damaged snapshot header is noticed, not read as another generation.
#[test]
fn a_damaged_snapshot_header_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state.redb");
    let (store, dp) = (RouteStore::beside(&state), Fake::default());
    store.restore(&dp).expect("empty");
    let mut bytes = std::fs::read(store.path()).expect("snapshot");
    bytes[15] ^= 1;
    std::fs::write(store.path(), &bytes).expect("damaged");
    let e = RouteStore::beside(&state)
        .restore(&Fake::default())
        .expect_err("damaged");
    assert!(e.to_string().contains("damaged"), "{e}");
}

#[test]
fn the_store_is_restored_before_use() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = RouteStore::beside(&dir.path().join("state.redb"));
    let e = store
        .apply(&Fake::default(), add("10.0.0.5", "192.0.2.1"))
        .expect_err("not restored");
    assert!(e.to_string().contains("before it was restored"), "{e}");
}

/// A VNet removed by `ctl apply` loses its entries in the data path; the compaction the
/// responder runs then drops them from the files too, so that a VNet of the same name
/// configured again later does not get them back at the next start.
#[test]
fn a_compaction_after_a_vnet_is_removed_forgets_its_entries() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state.redb");
    let (store, dp) = (RouteStore::beside(&state), Fake::default());
    store.restore(&dp).expect("empty");
    store
        .load(&dp, Arc::from("acme,prod,10.0.0.6,192.0.2.1\n"))
        .expect("load");
    store.apply(&dp, add("10.0.0.5", "192.0.2.1")).expect("add");
    // What `set_vnets` does to the data path when acme/prod is removed.
    dp.0.lock().expect("lock").clear();
    assert_eq!(store.compact(&dp).expect("compacted"), 0);
    // acme/prod is configured again, and the node restarts.
    let (store, again) = (RouteStore::beside(&state), Fake::default());
    let r = store.restore(&again).expect("restored");
    assert_eq!((r.snapshot, r.journal), (0, 0));
    assert_eq!(routes_of(&again), []);
}

/// A damaged line before the last one is not a torn write: the start stops, and the files
/// are left as they are. A damaged last line is skipped; the files found at start are kept
/// as `.prev` beside the new ones.
#[test]
fn a_damaged_line_in_the_middle_stops_the_start_and_the_previous_files_are_kept() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state.redb");
    let (store, dp) = (RouteStore::beside(&state), Fake::default());
    store.restore(&dp).expect("empty");
    store.apply(&dp, add("10.0.0.5", "192.0.2.1")).expect("add");
    store.apply(&dp, add("10.0.0.6", "192.0.2.1")).expect("add");
    let good = std::fs::read_to_string(&store.journal).expect("journal");
    let damaged = good.replacen("+ acme,prod,10.0.0.5", "+ acme,prod,10.0.0.5,x", 1);
    std::fs::write(&store.journal, &damaged).expect("damaged");
    let e = RouteStore::beside(&state)
        .restore(&Fake::default())
        .expect_err("damaged line 2 of 3");
    assert!(e.to_string().contains("line 2"), "{e}");
    assert_eq!(
        std::fs::read_to_string(&store.journal).expect("journal"),
        damaged
    );
    // Damaged last line: skipped, and the journal as found is kept.
    let damaged = good.replacen("+ acme,prod,10.0.0.6", "+ acme,prod,10.0.0.6,x", 1);
    std::fs::write(&store.journal, &damaged).expect("damaged");
    let snapshot = std::fs::read(store.path()).expect("snapshot");
    let again = Fake::default();
    let r = RouteStore::beside(&state)
        .restore(&again)
        .expect("restored");
    assert_eq!((r.journal, r.skipped), (1, 1));
    assert_eq!(routes_of(&again), [(ip("10.0.0.5"), ip("192.0.2.1"))]);
    let prev = |p: &Path| file::prev(p);
    assert_eq!(
        std::fs::read_to_string(prev(&store.journal)).expect("journal kept"),
        damaged
    );
    assert_eq!(
        std::fs::read(prev(store.path())).expect("snapshot kept"),
        snapshot
    );
}

/// A change the data path took but the journal could not record says so: it holds until
/// the next restart only.
#[test]
fn a_change_not_recorded_is_reported_as_applied_but_not_persisted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state.redb");
    let (store, dp) = (RouteStore::new(FileMedium::beside(&state)), Fake::default());
    store.restore(&dp).expect("empty");
    // A journal the store cannot write to.
    store.lock().medium.file = Some(File::open(&store.journal).expect("journal"));
    let e = store
        .apply(&dp, add("10.0.0.5", "192.0.2.1"))
        .expect_err("not recorded");
    assert!(matches!(e, Error::NotPersisted { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("applied to the data path but not persisted"),
        "{e}"
    );
    assert_eq!(routes_of(&dp), [(ip("10.0.0.5"), ip("192.0.2.1"))]);
    // The next change reopens the journal and is recorded.
    store
        .apply(&dp, add("10.0.0.6", "192.0.2.1"))
        .expect("recorded");
    let again = Fake::default();
    RouteStore::beside(&state)
        .restore(&again)
        .expect("restored");
    assert_eq!(routes_of(&again), [(ip("10.0.0.6"), ip("192.0.2.1"))]);
}
