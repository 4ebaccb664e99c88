//! Writes and restores N per-VM routes through the route store on etcd (`EtcdMedium`), and
//! prints the figures of docs/performance.md ("Per-VM routes in etcd"):
//!
//! ```text
//! cargo run -p protego-control --release --features testing --example route_store_bench -- \
//!     [ENTRIES, default 1000000] [--sealed]
//! ```
//!
//! It starts an etcd of its own (`etcd` on `PATH`, backend quota 8 GiB, auto-compaction off),
//! builds a master table (`routebook::RouteMaster`, the control node's) of ENTRIES IPv4 entries
//! over 64 VNets and 4096 hosts, then times: a compaction (the snapshot written as 1 MiB
//! chunks, the head flipped, the older generation deleted), the medium's read of the snapshot
//! (range reads, seals opened, checksum), and a whole restore into a new master (read, table
//! built, and the start's compaction written again). `--sealed` seals the records with a
//! generated key file, as `[store] encryption_key_file` does.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use datapath::{DataPath, DataplaneError, RouteChange, RouteChangeReport};
use ids::TenantId;
use overlay::Vni;
use protego_control::routes::{RouteMedium, RouteStore};
use protego_control::store::{EncryptionOptions, EtcdAccess, EtcdMedium, EtcdOptions, EtcdStore};
use routebook::{RouteMaster, RouteVnet};

const VNETS: u32 = 64;
const HOSTS: u32 = 4096;

/// The control node's master table as a data path (what the cluster's `DataPath` will do).
struct Master(Mutex<RouteMaster>);

impl Master {
    fn new() -> Result<Self, String> {
        let mut m = RouteMaster::new(1);
        let tenant = TenantId::new("acme").map_err(|e| e.to_string())?;
        let mut vnets = Vec::new();
        for i in 0..VNETS {
            let name = format!("v{i}");
            let id = m.vnet_id(&tenant, &name);
            vnets.push(RouteVnet {
                tenant: tenant.clone(),
                name,
                id,
                vni: Vni::new(1000 + i).ok_or("VNI out of range")?,
                vtep_v6: false,
            });
        }
        m.set_vnets(vnets);
        Ok(Self(Mutex::new(m)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RouteMaster> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl DataPath for Master {
    fn install_child(&self, _: &ike::ChildSaInfo) -> Result<(), DataplaneError> {
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
    ) -> Result<(), DataplaneError> {
        Ok(())
    }
    fn stats(&self) -> datapath::DataplaneStats {
        datapath::DataplaneStats::default()
    }
    fn change_routes(&self, change: RouteChange) -> Result<RouteChangeReport, DataplaneError> {
        self.lock().change(change).map(|(_, r)| r)
    }
    fn write_routes(&self, out: &mut dyn Write) -> Result<usize, DataplaneError> {
        self.lock().peek_snapshot(out)
    }
}

/// A snapshot of `n` entries: VM 10.0.0.0 + i in VNet i % 64, on host 192.0.2.0 + i % 4096.
fn snapshot(n: usize) -> Result<Vec<u8>, String> {
    let names: Vec<String> = (0..VNETS).map(|i| format!("v{i}")).collect();
    let vnets: Vec<(&str, &str)> = names.iter().map(|n| ("acme", n.as_str())).collect();
    let base = u32::from(Ipv4Addr::new(10, 0, 0, 0));
    let hosts = u32::from(Ipv4Addr::new(192, 0, 2, 0));
    let entries = (0..n as u32).map(|i| {
        (
            i % VNETS,
            IpAddr::V4(Ipv4Addr::from(base + i)),
            IpAddr::V4(Ipv4Addr::from(hosts + i % HOSTS)),
        )
    });
    let mut out = Vec::with_capacity(n * 13 + 1024);
    overlay::write_snapshot(&mut out, &vnets, n, entries).map_err(|e| e.to_string())?;
    Ok(out)
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut entries = 1_000_000usize;
    let mut sealed = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--sealed" => sealed = true,
            n => {
                entries = n
                    .parse()
                    .map_err(|_| format!("not a number of entries: {n}"))?
            }
        }
    }
    let etcd = protego_control::testing::Etcd::start_with(&[
        "--quota-backend-bytes=8589934592",
        "--auto-compaction-retention=0",
    ])
    .ok_or("etcd is not installed (Debian: etcd-server)")?;
    let keys_dir = tempfile::tempdir()?;
    let encryption = if sealed {
        let path = keys_dir.path().join("store.keys");
        let mut key = [0u8; 32];
        aws_lc_rs::rand::fill(&mut key).map_err(|_| "no random key")?;
        std::fs::write(&path, format!("1 {}\n", hex::encode(key)))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        EncryptionOptions {
            key_file: Some(path),
            accept_cleartext: false,
        }
    } else {
        EncryptionOptions::default()
    };
    let options = EtcdOptions {
        endpoints: vec![etcd.url()],
        prefix: "/protego/bench".into(),
        timeout: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(10),
        access: EtcdAccess::default(),
    };
    let medium = || -> Result<EtcdMedium, Box<dyn std::error::Error>> {
        Ok(EtcdMedium::new(EtcdStore::connect(&options)?, &encryption)?)
    };

    let bytes = snapshot(entries)?;
    let master = Master::new()?;
    let store = RouteStore::new(medium()?);
    store.restore(&master)?;
    let bytes: Arc<[u8]> = Arc::from(bytes);
    let t = Instant::now();
    master.change_routes(RouteChange::Restore(bytes))?;
    let built = t.elapsed();

    let t = Instant::now();
    let written = store.compact(&master)?;
    let write = t.elapsed();
    // In memory, as a cluster's control node serialises it with its routes lock held.
    let mut snap = Vec::new();
    let t = Instant::now();
    master.write_routes(&mut snap)?;
    let serialise = t.elapsed();
    let snap_bytes = snap.len();
    drop(snap);

    let mut reader = medium()?;
    let t = Instant::now();
    let (generation, read) = reader.read_snapshot()?.ok_or("no snapshot stored")?;
    let read_time = t.elapsed();
    assert_eq!(read.len(), snap_bytes);
    drop(read);

    let again = Master::new()?;
    let t = Instant::now();
    let restored = RouteStore::new(medium()?).restore(&again)?;
    let restore = t.elapsed();
    assert_eq!(restored.snapshot, entries);

    println!(
        "entries {entries}  sealed {sealed}  snapshot {snap_bytes} bytes ({:.1} MiB, {:.1} B/entry, {} chunks)  generation {generation}",
        snap_bytes as f64 / (1 << 20) as f64,
        snap_bytes as f64 / entries.max(1) as f64,
        snap_bytes.div_ceil(protego_control::store::MAX_CHUNK),
    );
    println!(
        "  table built from a snapshot (no etcd)        {}",
        ms(built)
    );
    println!(
        "  snapshot serialised in memory                {}",
        ms(serialise)
    );
    println!(
        "  compaction: snapshot written to etcd         {} ({written} entries)",
        ms(write)
    );
    println!(
        "  medium read of the snapshot (read + check)   {}",
        ms(read_time)
    );
    println!(
        "  restore into a new master (read + build + the start's compaction) {}",
        ms(restore)
    );
    Ok(())
}
