//! Control loop tests: two real IKE endpoints, each driven by its own control loop, joined by
//! fake data paths that carry IKE datagrams from one loop to the other in memory and record
//! every install/remove/update call.

use super::*;
use crate::status::{Responder, TunnelDirectory, TunnelState};
use crate::store::MemoryStore;
use crate::Config;
use datapath::{ChildStats, DataplaneError, DataplaneStats, IkeDatagram};
use ike::{ChildSaInfo, IkeSpis};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use wire::EspSpi;

mod apply;
mod events;

/// One recorded data path call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Install {
        tunnel: TunnelId,
        spi_in: EspSpi,
        spi_out: EspSpi,
        replaces: Option<EspSpi>,
    },
    Remove {
        tunnel: TunnelId,
        spi_in: EspSpi,
        spi_out: EspSpi,
    },
    UpdatePeer {
        tunnel: TunnelId,
        ike: IkeSpis,
        remote: SocketAddr,
    },
    /// `set_inside` with the bindings' tunnel ids.
    SetInside(Vec<TunnelId>),
}

/// A data path that records calls and delivers IKE datagrams to the other node's loop.
#[derive(Default)]
struct FakePath {
    calls: Mutex<Vec<Call>>,
    peer: Mutex<Option<Sender<ToControl>>>,
    /// While set, outgoing IKE datagrams are lost (a dead peer, seen from the other side).
    blackhole: AtomicBool,
    sent: AtomicUsize,
    /// Non-zero: our datagrams from port 4500 reach the peer from this port (a NAT).
    snat: AtomicU16,
    /// Non-zero: our datagrams to this port reach the peer on port 4500 (the NAT's way back).
    dnat: AtomicU16,
    /// While set, `check_inside` refuses.
    refuse_inside: AtomicBool,
}

impl FakePath {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn installs(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| matches!(c, Call::Install { .. }))
            .collect()
    }

    fn removes(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| matches!(c, Call::Remove { .. }))
            .collect()
    }

    /// CHILD_SAs installed and not removed: (inbound, outbound).
    fn live(&self) -> Vec<(EspSpi, EspSpi)> {
        let calls = self.calls();
        let removed: Vec<EspSpi> = calls
            .iter()
            .filter_map(|c| match c {
                Call::Remove { spi_in, .. } => Some(*spi_in),
                _ => None,
            })
            .collect();
        calls
            .iter()
            .filter_map(|c| match c {
                Call::Install {
                    spi_in, spi_out, ..
                } if !removed.contains(spi_in) => Some((*spi_in, *spi_out)),
                _ => None,
            })
            .collect()
    }
}

impl DataPath for FakePath {
    fn install_child(&self, child: &ChildSaInfo) -> Result<(), DataplaneError> {
        self.calls.lock().unwrap().push(Call::Install {
            tunnel: child.tunnel,
            spi_in: child.inbound_spi,
            spi_out: child.outbound_spi,
            replaces: child.replaces,
        });
        Ok(())
    }

    fn remove_child(&self, tunnel: TunnelId, inbound_spi: EspSpi, outbound_spi: EspSpi) {
        self.calls.lock().unwrap().push(Call::Remove {
            tunnel,
            spi_in: inbound_spi,
            spi_out: outbound_spi,
        });
    }

    fn update_peer(&self, tunnel: TunnelId, ike: IkeSpis, _local: SocketAddr, remote: SocketAddr) {
        self.calls.lock().unwrap().push(Call::UpdatePeer {
            tunnel,
            ike,
            remote,
        });
    }

    fn send_ike(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        payload: &[u8],
    ) -> Result<(), DataplaneError> {
        self.sent.fetch_add(1, Ordering::SeqCst);
        if self.blackhole.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (mut from, mut to) = (local, remote);
        let snat = self.snat.load(Ordering::SeqCst);
        if snat != 0 && from.port() == 4500 {
            from.set_port(snat);
        }
        let dnat = self.dnat.load(Ordering::SeqCst);
        if dnat != 0 && to.port() == dnat {
            to.set_port(4500);
        }
        let datagram = IkeDatagram {
            local: to,
            remote: from,
            data: payload.to_vec(),
        };
        if let Some(peer) = self.peer.lock().unwrap().as_ref() {
            let _ = peer.send(ToControl::Ike(datagram));
        }
        Ok(())
    }

    fn check_inside(
        &self,
        _vnets: &[datapath::VnetConfig],
        _tunnels: &[datapath::TunnelBinding],
    ) -> Result<(), DataplaneError> {
        if self.refuse_inside.load(Ordering::SeqCst) {
            return Err(DataplaneError::Unsupported {
                operation: "set_inside",
                reason: "refused by the test".into(),
            });
        }
        Ok(())
    }

    fn set_inside(
        &self,
        _vnets: Vec<datapath::VnetConfig>,
        tunnels: Vec<datapath::TunnelBinding>,
    ) -> Result<(), DataplaneError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::SetInside(tunnels.iter().map(|b| b.tunnel).collect()));
        Ok(())
    }

    fn stats(&self) -> DataplaneStats {
        let children = self
            .live()
            .into_iter()
            .map(|(i, o)| ChildStats {
                tunnel: Some(TunnelId(1)),
                inbound_spi: i,
                outbound_spi: o,
                bytes_in: 1_000,
                packets_in: 10,
                bytes_out: 2_000,
                packets_out: 20,
                drops_in: 0,
                ..ChildStats::default()
            })
            .collect();
        DataplaneStats {
            children,
            workers: vec![],
            drops: vec![("esp_replay".into(), 0)],
            ..DataplaneStats::default()
        }
    }
}

/// A node: its configuration, fake data path, control loop and the sender its data path
/// would use.
struct Node {
    config: Config,
    path: Arc<FakePath>,
    control: Option<ControlPlane>,
    to_control: Sender<ToControl>,
    /// Its state store (clones share it: a restarted node gets the same one).
    store: MemoryStore,
    _dir: Arc<Scratch>,
}

impl Node {
    fn control(&self) -> &ControlPlane {
        self.control.as_ref().expect("node is running")
    }
}

/// Captures every log line of the test process (the control loops log from their own threads).
fn logs() -> &'static Mutex<Vec<u8>> {
    static LOGS: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        struct W(&'static Mutex<Vec<u8>>);
        impl std::io::Write for W {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .with_writer(move || W(buffer))
            .try_init();
        buffer
    })
}

fn log_lines_with(needle: &str) -> Vec<String> {
    let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    text.lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// A temporary directory, removed when the last node using it is dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch_dir() -> Arc<Scratch> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "protego-runtime-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    Arc::new(Scratch(dir))
}

/// Writes and loads one side's configuration. `extra` is appended to the tunnel table and
/// `gateway_extra` to `[gateway]`.
fn config(
    dir: &Path,
    side: char,
    name: &str,
    start: bool,
    gateway_extra: &str,
    extra: &str,
) -> Config {
    let (me, peer, my_ts, peer_ts) = match side {
        'a' => ("192.0.2.1", "192.0.2.2", "10.1.0.0/24", "10.2.0.0/24"),
        _ => ("192.0.2.2", "192.0.2.1", "10.2.0.0/24", "10.1.0.0/24"),
    };
    let other = if side == 'a' { 'b' } else { 'a' };
    let psk = dir.join("psk");
    std::fs::write(&psk, "runtime test secret\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&psk, std::fs::Permissions::from_mode(0o600)).unwrap();
    let text = format!(
        r#"[gateway]
listen = ["{me}"]
control_socket = "{dir}/{side}.sock"
retransmit_timeout = "1s"
retransmit_tries = 2
{gateway_extra}

[[tenant]]
name = "t"

[[tunnel]]
name = "{name}"
tenant = "t"
inside = "tun"
remote_addrs = "{peer}"
local_id = "{side}.example"
remote_id = "{other}.example"
psk_file = "psk"
proposals = "aes256gcm16-prfsha256-x25519"
esp_proposals = "aes256gcm16"
local_ts = "{my_ts}"
remote_ts = "{peer_ts}"
start_action = "{start}"
{extra}
"#,
        dir = dir.display(),
        start = if start { "start" } else { "none" },
    );
    let path = dir.join(format!("{side}.toml"));
    std::fs::write(&path, &text).unwrap();
    Config::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn node(config: Config, dir: Arc<Scratch>) -> Node {
    let path = Arc::new(FakePath::default());
    let (to_control, from_dataplane) = crossbeam_channel::unbounded();
    Node {
        config,
        path,
        control: None,
        to_control,
        store: MemoryStore::default(),
        _dir: dir,
    }
    .with_receiver(from_dataplane)
}

impl Node {
    /// A node over a memory store of its own, its control loop started on one side of
    /// [`wired_paths`].
    fn start(config: Config, (path, to_control, rx): Wired, dir: &Arc<Scratch>) -> Node {
        Node {
            config,
            path,
            control: None,
            to_control,
            store: MemoryStore::default(),
            _dir: Arc::clone(dir),
        }
        .with_receiver(rx)
    }

    fn with_receiver(mut self, rx: Receiver<ToControl>) -> Self {
        let datapath: Arc<dyn DataPath> = self.path.clone();
        let rng = Box::new(crypto::SeededRng::new(
            u64::from(self.config.gateway.listen[0].is_ipv4()) + 7,
        ));
        self.control = Some(
            ControlPlane::start_with_rng(
                &self.config,
                datapath,
                rx,
                Box::new(self.store.clone()),
                rng,
            )
            .unwrap_or_else(|e| panic!("{e}")),
        );
        self
    }
}

/// One side of [`wired_paths`]: a fake data path, and the channel into its control loop.
type Wired = (Arc<FakePath>, Sender<ToControl>, Receiver<ToControl>);

/// Two fake data paths wired to each other before any loop starts (so the first IKE_SA_INIT is
/// not lost): what one sends reaches the other's control loop.
fn wired_paths() -> (Wired, Wired) {
    let path_a = Arc::new(FakePath::default());
    let path_b = Arc::new(FakePath::default());
    let (tx_a, rx_a) = crossbeam_channel::unbounded();
    let (tx_b, rx_b) = crossbeam_channel::unbounded();
    *path_a.peer.lock().unwrap() = Some(tx_b.clone());
    *path_b.peer.lock().unwrap() = Some(tx_a.clone());
    ((path_a, tx_a, rx_a), (path_b, tx_b, rx_b))
}

/// Two nodes wired to each other; `a` initiates (start_action = "start"), `b` responds.
fn pair(name: &str, gateway_extra_a: &str, extra_a: &str, extra_b: &str) -> (Node, Node) {
    let _ = logs();
    let dir = scratch_dir();
    let config_a = config(&dir.0, 'a', name, true, gateway_extra_a, extra_a);
    let config_b = config(&dir.0, 'b', name, false, "", extra_b);
    let (wired_a, wired_b) = wired_paths();
    let b = Node::start(config_b, wired_b, &dir);
    let a = Node::start(config_a, wired_a, &dir);
    (a, b)
}

/// Polls `cond` every 10 ms for up to `secs` seconds.
fn wait_until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("timed out waiting for {what}");
}

fn established(node: &Node) -> bool {
    node.control()
        .handle()
        .ike_status()
        .map(|s| s.iter().any(|sa| sa.state == ike::IkeSaState::Established))
        .unwrap_or(false)
}

fn wait_up(a: &Node, b: &Node) {
    wait_until(10, "both CHILD_SAs installed", || {
        !a.path.live().is_empty() && !b.path.live().is_empty()
    });
    wait_until(5, "both IKE SAs established", || {
        established(a) && established(b)
    });
}

#[test]
fn tunnel_comes_up_with_matching_spis() {
    let (a, b) = pair("up-test", "", "", "");
    wait_up(&a, &b);
    let (a_in, a_out) = a.path.live()[0];
    let (b_in, b_out) = b.path.live()[0];
    assert_eq!(
        (a_in, a_out),
        (b_out, b_in),
        "each side's inbound SPI is the other's outbound"
    );
    assert!(matches!(
        a.path.installs()[0],
        Call::Install {
            tunnel: TunnelId(1),
            replaces: None,
            ..
        }
    ));

    // The status document joins the engine's view with the data path's counters.
    let responder = Responder::new(
        a.control().handle(),
        a.path.clone(),
        TunnelDirectory::from_config(&a.config),
    );
    let report = responder.status().unwrap();
    let t = &report.tunnels[0];
    assert_eq!(
        (t.name.as_str(), t.tenant.as_str(), t.state),
        ("up-test", "t", TunnelState::Established)
    );
    let sa = &t.ike_sas[0];
    assert!(sa.initiator);
    assert!(sa.proposal.contains("AES_GCM_16"), "{}", sa.proposal);
    assert_eq!(
        sa.remote.ip(),
        "192.0.2.2".parse::<std::net::IpAddr>().unwrap()
    );
    let child = &sa.children[0];
    assert_eq!(child.spi_in, a_in.to_string());
    assert_eq!(child.spi_out, a_out.to_string());
    assert_eq!((child.bytes_in, child.packets_out), (1_000, 20));
    assert_eq!(child.local_ts, ["10.1.0.0/24"]);
    assert_eq!(child.remote_ts, ["10.2.0.0/24"]);

    // A request about one tunnel builds that tunnel's entry alone, the same as the report's
    // (its times aside: a second may pass between the two).
    let without_times = |t: &crate::status::TunnelStatus| {
        let mut v = serde_json::to_value(t).unwrap();
        fn strip(v: &mut serde_json::Value) {
            match v {
                serde_json::Value::Object(m) => {
                    m.retain(|k, _| !k.ends_with("_secs"));
                    m.values_mut().for_each(strip);
                }
                serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
                _ => {}
            }
        }
        strip(&mut v);
        v
    };
    let one = responder
        .tunnel_status("up-test")
        .unwrap()
        .expect("a configured tunnel");
    assert_eq!(without_times(&one), without_times(t));
    assert!(responder.tunnel_status("no-such-tunnel").unwrap().is_none());
    let traffic = responder.tunnel_traffic();
    assert_eq!(traffic.len(), 1);
    assert_eq!(
        (traffic[0].0.as_str(), traffic[0].1.as_str(), traffic[0].2),
        ("up-test", "t", t.traffic)
    );

    // One structured line per state change, with the tunnel's fields.
    let established = log_lines_with("IKE_SA established");
    assert!(
        established.iter().any(|l| l.contains("tunnel=up-test")
            && l.contains("tenant=t")
            && l.contains("proposal=")),
        "{established:?}"
    );
    let installed = log_lines_with(&format!("spi_in={a_in}"));
    assert!(
        installed
            .iter()
            .any(|l| l.contains("CHILD_SA installed") && l.contains(&format!("spi_out={a_out}"))),
        "{installed:?}"
    );
}

#[test]
fn shutdown_deletes_the_sas_at_the_peer() {
    let (mut a, b) = pair("shutdown-test", "", "", "");
    wait_up(&a, &b);
    let (b_in, _) = b.path.live()[0];
    let started = Instant::now();
    a.control
        .take()
        .unwrap()
        .shutdown(Duration::from_secs(1))
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "shutdown is bounded"
    );
    wait_until(5, "the peer removed its CHILD_SA", || {
        b.path.live().is_empty()
    });
    assert!(b
        .path
        .removes()
        .iter()
        .any(|c| matches!(c, Call::Remove { spi_in, .. } if *spi_in == b_in)));
    wait_until(5, "the peer's IKE SA is gone", || {
        b.control()
            .handle()
            .ike_status()
            .is_ok_and(|s| s.is_empty())
    });
    assert!(
        a.path.live().is_empty(),
        "our side removed its CHILD_SA too"
    );
    let deleted = log_lines_with("tunnel=shutdown-test");
    assert!(
        deleted
            .iter()
            .any(|l| l.contains("IKE_SA deleted") && l.contains("reason=peer_request")),
        "{deleted:?}"
    );
    // Both stores held the IKE SA while it lived; after a shutdown (ours) or a DELETE from the
    // peer (theirs) nothing is left to restore.
    assert!(a.store.commits() > 0 && b.store.commits() > 0);
    assert!(a.store.ike_sas().unwrap().is_empty());
    wait_until(5, "the peer's store is empty", || {
        b.store.ike_sas().is_ok_and(|s| s.is_empty())
    });
}

/// The IKE SAs of `node` as (initiator SPI, responder SPI).
fn ike_spis(node: &Node) -> Vec<IkeSpis> {
    node.control()
        .handle()
        .ike_status()
        .unwrap()
        .iter()
        .map(|s| s.ike)
        .collect()
}

/// Crashes `b` (no DELETE, the store keeps its state) and starts it again from the same
/// configuration file and store with a fresh data path, as `protego up` restarted after a
/// `kill -9`.
fn crash_and_restart(a: &Node, b: &mut Node, config: Config) {
    b.control.take().unwrap().hand_over();
    let path = Arc::new(FakePath::default());
    let (tx, rx) = crossbeam_channel::unbounded();
    *path.peer.lock().unwrap() = Some(a.to_control.clone());
    *a.path.peer.lock().unwrap() = Some(tx.clone());
    b.config = config;
    b.path = path;
    b.to_control = tx;
    let node = std::mem::replace(
        b,
        Node {
            config: b.config.clone(),
            path: Arc::clone(&b.path),
            control: None,
            to_control: b.to_control.clone(),
            store: b.store.clone(),
            _dir: Arc::clone(&b._dir),
        },
    );
    *b = node.with_receiver(rx);
}

#[test]
fn a_restarted_node_restores_its_ike_sa_and_rekeys_the_child() {
    let (a, mut b) = pair("restart-test", "", "", "");
    wait_up(&a, &b);
    let before = ike_spis(&b);
    assert_eq!(before, ike_spis(&a));
    let (a_old_in, _) = a.path.live()[0];
    assert_eq!(b.store.ike_sas().unwrap().len(), 1);
    let config = b.config.clone();
    crash_and_restart(&a, &mut b, config);

    // The same IKE SA, restored; its CHILD_SA is rekeyed over it (no IKE_SA_INIT, no AUTH).
    assert_eq!(ike_spis(&b), before);
    wait_until(10, "a new CHILD_SA on the restarted node", || {
        !b.path.live().is_empty()
    });
    wait_until(10, "the peer replaced its CHILD_SA", || {
        a.path.installs().len() == 2 && a.path.live().len() == 1
    });
    let (b_in, b_out) = b.path.live()[0];
    assert_eq!(a.path.live()[0], (b_out, b_in));
    assert!(a
        .path
        .installs()
        .iter()
        .any(|c| matches!(c, Call::Install { replaces: Some(old), .. } if *old == a_old_in)));
    assert_eq!(ike_spis(&a), before, "the peer kept its IKE SA");
    assert!(!log_lines_with("IKE_SA restored from the store")
        .iter()
        .all(|l| !l.contains("tunnel=restart-test")));

    // Message IDs are in step: an IKE SA rekey started by the peer succeeds on the restored SA.
    a.control().handle().rekey_ike(TunnelId(1)).unwrap();
    wait_until(10, "the IKE SA rekeyed", || {
        let (x, y) = (ike_spis(&a), ike_spis(&b));
        x.len() == 1 && x == y && x != before
    });
    assert_eq!(
        b.store.ike_sas().unwrap().len(),
        1,
        "the old SA's record is gone"
    );
}

#[test]
fn a_stored_sa_of_a_tunnel_now_named_otherwise_is_dropped() {
    let (a, mut b) = pair("rename-test", "", "", "");
    wait_up(&a, &b);
    let dir = b._dir.0.clone();
    let renamed = config(&dir, 'b', "renamed-test", false, "", "");
    crash_and_restart(&a, &mut b, renamed);
    assert!(ike_spis(&b).is_empty(), "nothing restored");
    assert!(
        b.store.ike_sas().unwrap().is_empty(),
        "the record was dropped"
    );
    assert!(log_lines_with("no longer configured under that name")
        .iter()
        .any(|l| l.contains("tunnel=rename-test")));
}

mod sealed;
