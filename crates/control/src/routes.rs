//! Where the per-VM overlay routes of `protego up` survive a restart (issue 16 §2): not one
//! store record per VM, but two files next to the state store (`[store] path`, e.g.
//! `/var/lib/protego/state.redb.routes` and `….routes.log`):
//!
//! - the **snapshot**, the data path's compact binary form of every entry
//!   (`overlay::snapshot`: about 13 bytes per IPv4 entry, a hash over the whole), replaced
//!   atomically (written to a temporary file, synced, renamed over the old one, the directory
//!   synced);
//! - the **journal** of the single changes since (`+ tenant,vnet,address,host` and
//!   `- tenant,vnet,address` lines), appended and synced before `ctl route add|del` answers.
//!
//! A bulk load (`ctl route load`) and every [`COMPACT_AFTER`] journal lines write a new
//! snapshot and empty the journal. At start the snapshot is restored, the journal replayed
//! (a line whose VNet is no longer configured is skipped with a warning, as are the
//! snapshot's), and the result written as the new snapshot.
//!
//! The change is applied to the data path first and recorded after: a crash in between
//! loses a change the operator saw no answer for.

use crate::error::Error;
use datapath::{DataPath, RouteChange, RouteChangeReport, VmRoute};
use ids::TenantId;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
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
    file: Option<File>,
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
    /// snapshot. Missing files are an empty table.
    pub fn restore(&self, dp: &dyn DataPath) -> Result<Restored, Error> {
        let mut out = Restored::default();
        match std::fs::read(&self.snapshot) {
            Ok(bytes) => {
                let r = dp
                    .change_routes(RouteChange::Restore(Arc::from(bytes)))
                    .map_err(|e| Self::err(&self.snapshot, e))?;
                out.snapshot = r.added;
                out.skipped += r.skipped;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Self::err(&self.snapshot, e)),
        }
        match std::fs::read_to_string(&self.journal) {
            Ok(text) => {
                for (i, line) in text.lines().enumerate() {
                    if line.trim().is_empty() {
                        continue;
                    }
                    let done = Recorded::parse(i + 1, line)
                        .and_then(|r| dp.change_routes(r.change()).map_err(|e| e.to_string()));
                    match done {
                        Ok(_) => out.journal += 1,
                        Err(e) => {
                            tracing::warn!(journal = %self.journal.display(), error = %e, "route journal line skipped");
                            out.skipped += 1;
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Self::err(&self.journal, e)),
        }
        let mut j = self.lock();
        self.compact(dp, &mut j)?;
        Ok(out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies a single change to `dp` and records it in the journal.
    pub fn apply(&self, dp: &dyn DataPath, change: Recorded) -> Result<RouteChangeReport, Error> {
        let mut j = self.lock();
        let report = dp.change_routes(change.change())?;
        if j.file.is_none() {
            let f = private(OpenOptions::new().create(true).append(true))
                .open(&self.journal)
                .map_err(|e| Self::err(&self.journal, e))?;
            j.file = Some(f);
        }
        if let Some(f) = j.file.as_mut() {
            let mut line = change.line();
            line.push('\n');
            f.write_all(line.as_bytes())
                .and_then(|()| f.sync_data())
                .map_err(|e| Self::err(&self.journal, e))?;
        }
        j.lines += 1;
        if j.lines >= COMPACT_AFTER {
            self.compact(dp, &mut j)?;
        }
        Ok(report)
    }

    /// Applies a route file's text to `dp` (validated whole by it) and writes a new snapshot.
    pub fn load(&self, dp: &dyn DataPath, text: Arc<str>) -> Result<RouteChangeReport, Error> {
        let mut j = self.lock();
        let report = dp.change_routes(RouteChange::Load(text))?;
        self.compact(dp, &mut j)?;
        Ok(report)
    }

    /// Writes `dp`'s routes as the new snapshot (atomically) and empties the journal.
    fn compact(&self, dp: &dyn DataPath, j: &mut Journal) -> Result<usize, Error> {
        let tmp = {
            let mut t = self.snapshot.as_os_str().to_owned();
            t.push(".tmp");
            PathBuf::from(t)
        };
        let file = private(OpenOptions::new().write(true).create(true).truncate(true))
            .open(&tmp)
            .map_err(|e| Self::err(&tmp, e))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let n = dp.write_routes(&mut w).map_err(|e| Self::err(&tmp, e))?;
        let file = w.into_inner().map_err(|e| Self::err(&tmp, e.error()))?;
        file.sync_all().map_err(|e| Self::err(&tmp, e))?;
        std::fs::rename(&tmp, &self.snapshot).map_err(|e| Self::err(&self.snapshot, e))?;
        if let Some(dir) = self.snapshot.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| Self::err(dir, e))?;
        }
        // The snapshot holds every journalled change now.
        let f = private(OpenOptions::new().write(true).create(true).truncate(true))
            .open(&self.journal)
            .map_err(|e| Self::err(&self.journal, e))?;
        f.sync_all().map_err(|e| Self::err(&self.journal, e))?;
        j.file = None;
        j.lines = 0;
        Ok(n)
    }
}

/// Files of the route store are the node's own, like its state store: mode 0600 when created.
fn private(o: &mut OpenOptions) -> &mut OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    o.mode(0o600)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    struct Fake(Mutex<std::collections::BTreeMap<IpAddr, IpAddr>>);

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
                RouteChange::Restore(bytes) => {
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

    fn add(vm: &str, host: &str) -> Recorded {
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
        assert_eq!(journal.lines().count(), 2, "{journal}");
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
            ""
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
}
