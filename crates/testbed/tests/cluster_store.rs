//! The issue's "etcd unreachable for a while: forwarding continues, control retries, nothing
//! committed is lost", against real strongSwan 5.9 and etcd 3.4: two control nodes elected
//! through etcd (their IKE state in it), two data nodes, one steer node; etcd made unreachable
//! by stopping its process (SIGSTOP: connections stay open, nothing is answered; SIGCONT
//! ends the outage).
//!
//! How long etcd may be away depends on the leader's lease (`cluster::election`): the TTL
//! is 1 s (`DEFAULT_TTL`, not configurable), a keep-alive goes out every TTL/3, and a leader
//! takes itself to hold the role only until TTL − TTL/5 after its last answered keep-alive was
//! sent. Whatever the phase of its keep-alives, a leader therefore keeps its role through an
//! outage shorter than TTL − TTL/5 − TTL/3 ≈ 467 ms; a longer one may depose it (at the latest
//! after 800 ms), and it then stops.
//!
//! - [`etcd_outage_shorter_than_the_lease_loses_nothing`]: outages of [`SHORT_OUTAGE`], one
//!   for a rekey started by Protego and one for a rekey started by strongSwan. ESP flows
//!   throughout, the commits fail and are retried (the answers wait for them), both rekeys
//!   complete once etcd is back, and after a `kill -9` of the active control node the standby
//!   carries on with the same IKE SA: everything committed survived.
//! - [`etcd_outage_longer_than_the_lease_hands_over_after_it`]: a [`LONG_OUTAGE`] outage with
//!   a rekey started by strongSwan in it. ESP flows throughout; the active control node loses
//!   its lease and stops; once etcd is back the standby takes over with the same IKE SA and
//!   answers strongSwan's retransmitted rekey.
//!
//! The two tests run one after the other.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use common::*;

use protego_testbed::cluster::{ClusterSpec, ClusterStore, ProtegoCluster};
use protego_testbed::protego::GatewayTunnel;
use protego_testbed::strongswan::{Charon, CharonSettings, IkeSa};
use protego_testbed::{Result, Testbed, Topology};

/// One test of this file at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// An outage the leader's lease survives in any phase of its keep-alives (below ~467 ms, see
/// the module documentation), longer than the store's commit timeout ([`STORE_TIMEOUT`]).
const SHORT_OUTAGE: Duration = Duration::from_millis(300);
/// An outage well beyond the lease.
const LONG_OUTAGE: Duration = Duration::from_secs(5);
/// The control nodes' `[store] timeout`: a commit during an outage fails after this long.
const STORE_TIMEOUT: &str = "100ms";

/// The standard one-tenant topology, its tunnel and a cluster of two control nodes on etcd,
/// two data nodes and one steer node.
fn up(bed: &Testbed) -> Result<(Topology, GatewayTunnel, ProtegoCluster)> {
    let topo = Topology::build(bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let spec = ClusterSpec {
        controls: 2,
        store: ClusterStore::Etcd,
        extra_store: vec![format!("timeout = {STORE_TIMEOUT:?}")],
        ..ClusterSpec::default()
    };
    let cluster = ProtegoCluster::start(bed, &topo, std::slice::from_ref(&tun), &spec)?;
    Ok((topo, tun, cluster))
}

/// [`with_logs`], with etcd woken first (a failed outage test may leave it stopped) and its log
/// tail printed on failure too.
fn with_store_logs(cluster: &ProtegoCluster, body: impl FnOnce() -> Result<()>) -> Result<()> {
    with_logs(cluster, || {
        let result = body();
        if let Some((etcd, _)) = cluster.etcd() {
            etcd.process.signal(libc::SIGCONT);
            if result.is_err() {
                eprintln!("---- etcd ----\n{}", etcd.process.log_tail(30));
            }
        }
        result
    })
}

/// The store figures of control node `name`'s `status`: (commits, failures, held).
fn store_stats(cluster: &ProtegoCluster, name: &str) -> Result<(u64, u64, u64, serde_json::Value)> {
    let status = cluster.control_on(name, "status")?;
    let s = status["store"].clone();
    let n = |k: &str| s[k].as_u64().unwrap_or_default();
    Ok((n("commits"), n("failures"), n("held"), s))
}

/// The arrival times of the ping replies between `from` and `to` (seconds since the epoch).
fn replies_between(pinger: &OutagePing, from: f64, to: f64) -> usize {
    pinger
        .replies()
        .into_iter()
        .filter(|t| *t >= from && *t <= to)
        .count()
}

/// The longest time without a ping reply from the last reply before `t0` on, in seconds.
fn longest_gap(replies: &[f64], t0: f64) -> f64 {
    let start = replies.iter().rposition(|t| *t <= t0).unwrap_or(0);
    replies
        .get(start..)
        .unwrap_or_default()
        .windows(2)
        .map(|w| w[1] - w[0])
        .fold(0.0, f64::max)
}

/// The site's one IKE SA.
fn the_ike_sa(site: &Charon) -> Result<IkeSa> {
    let sas = site.list_sas()?;
    assert_eq!(sas.len(), 1, "one IKE SA: {sas:?}");
    Ok(sas.into_iter().next().expect("one IKE SA"))
}

/// Stops etcd for `outage`, runs `during` at once, and reads `status` of control node
/// `control` just before the end (while the store still fails). Returns what `during`
/// returned and the store figures read, and the epoch times of the stop and the
/// continuation.
fn etcd_outage<T>(
    cluster: &ProtegoCluster,
    control: &str,
    outage: Duration,
    during: impl FnOnce() -> Result<T>,
) -> Result<(T, serde_json::Value, f64, f64)> {
    let (etcd, _) = cluster.etcd().expect("an etcd store");
    let stopped = Instant::now();
    let t_stop = epoch_secs(SystemTime::now());
    etcd.process.signal(libc::SIGSTOP);
    let out = during();
    // Late in the outage, after at least one commit timed out.
    let probe_at = outage.saturating_sub(Duration::from_millis(60));
    std::thread::sleep(probe_at.saturating_sub(stopped.elapsed()));
    let figures = cluster
        .control_on(control, "status")
        .map(|s| s["store"].clone());
    std::thread::sleep(outage.saturating_sub(stopped.elapsed()));
    etcd.process.signal(libc::SIGCONT);
    let t_cont = epoch_secs(SystemTime::now());
    let lasted = stopped.elapsed();
    eprintln!("etcd stopped for {} ms", lasted.as_millis());
    Ok((out?, figures?, t_stop, t_cont))
}

/// A short etcd outage with a rekey in it, and what must hold of it.
struct Outage<'a> {
    cluster: &'a ProtegoCluster,
    control: &'a str,
    site: &'a Charon,
    pinger: &'a OutagePing,
}

impl Outage<'_> {
    /// Stops etcd for [`SHORT_OUTAGE`] and runs `start` (a rekey of the CHILD_SA `spi_in`,
    /// started by either side) in it. Checks that a commit failed and the request or answer
    /// waited for its commit, with the error shown, that ESP flowed, and that once etcd is
    /// back the commits went through and nothing waits. `before` is (commits, failures)
    /// before; returns the new CHILD_SA and the same figures after.
    fn rekey(
        &self,
        what: &str,
        spi_in: &str,
        before: (u64, u64),
        start: impl FnOnce() -> Result<()>,
    ) -> Result<(protego_testbed::strongswan::ChildSa, (u64, u64))> {
        let ((), during, t_stop, t_cont) =
            etcd_outage(self.cluster, self.control, SHORT_OUTAGE, start)?;
        let rekeyed_at = Instant::now();
        let child = self.site.wait_child_rekeyed("net", spi_in, UP)?;
        let rekey = rekeyed_at.elapsed();
        let (commits, failures, held, after) = store_stats(self.cluster, self.control)?;
        let flowing = replies_between(self.pinger, t_stop, t_cont);
        eprintln!(
            "{what} in an outage: store during it {during}; after it {after}; rekey done {} ms \
             after etcd came back; {flowing} ping replies during the outage",
            rekey.as_millis()
        );
        assert!(
            during["failures"].as_u64().unwrap_or_default() > before.1,
            "{what}: a commit failed during the outage: {during}"
        );
        assert!(
            during["held"].as_u64().unwrap_or_default() > 0,
            "{what}: it waited for its commit: {during}"
        );
        assert!(during["error"].is_string(), "{what}: {during}");
        assert!(failures > before.1 && commits > before.0, "{what}: {after}");
        assert_eq!(held, 0, "{what}: nothing waits once etcd is back: {after}");
        assert!(after["error"].is_null(), "{what}: {after}");
        assert!(
            flowing >= 10,
            "{what}: ESP flowed during the outage ({flowing} replies)"
        );
        Ok((child, (commits, failures)))
    }
}

/// Short outages: ESP flows, commits fail and are retried, the rekeys started by either side
/// during them complete after, and the standby finds everything committed after a `kill -9`
/// of the active control node.
#[test]
fn etcd_outage_shorter_than_the_lease_loses_nothing() -> Result<()> {
    if skip_without_etcd("etcd_outage_shorter_than_the_lease_loses_nothing") {
        return Ok(());
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let bed = Testbed::new()?;
    let (topo, tun, cluster) = up(&bed)?;
    with_store_logs(&cluster, || {
        let site = site_charon(&topo, &tun)?;
        site.initiate("net", UP)?;
        let child = site.wait_child_installed("net", UP)?;
        ping_all_vms(&topo, 0, 3)?;
        let (active, standby) = cluster.active_and_standby()?;
        let ike = the_ike_sa(&site)?;
        let charon_seen = site.log().len();
        let pinger = OutagePing::start(&topo)?;
        std::thread::sleep(Duration::from_millis(300));
        let t_first = epoch_secs(SystemTime::now());
        let (commits0, failures0, _, _) = store_stats(&cluster, &active)?;
        let outage = Outage {
            cluster: &cluster,
            control: &active,
            site: &site,
            pinger: &pinger,
        };
        // A rekey Protego starts while etcd is away: its request waits for its commit.
        let (second, after) = outage.rekey(
            "Protego's rekey",
            &child.spi_in,
            (commits0, failures0),
            || cluster.control(&format!("rekey {}", tun.name)).map(drop),
        )?;
        // A rekey strongSwan starts while etcd is away: the answer waits for its commit.
        let (third, _) = outage.rekey("strongSwan's rekey", &second.spi_in, after, || {
            site.rekey_child("net")
        })?;
        ping_all_vms(&topo, 0, 3)?;
        let gap = longest_gap(&pinger.replies(), t_first);
        eprintln!(
            "longest gap between ping replies over both outages and rekeys: {:.0} ms",
            gap * 1e3
        );
        assert!(gap < 0.2, "ESP stopped for {:.0} ms", gap * 1e3);
        // The leader kept its role through both outages.
        assert_eq!(cluster.active_control()?, active);
        assert!(
            !cluster.log(&active)?.contains("lost the leadership"),
            "{active} was deposed by a {} ms outage",
            SHORT_OUTAGE.as_millis()
        );

        // Nothing committed is lost: the standby restores the IKE SA as of the last commit
        // (two rekeys later, message IDs included) and carries on with it.
        let t_kill = epoch_secs(SystemTime::now());
        let killed_at = Instant::now();
        cluster.kill(&active)?;
        cluster.wait_alive(&["data1", "data2", "steer1"], Duration::from_secs(15))?;
        let takeover = killed_at.elapsed();
        assert_eq!(cluster.active_control()?, standby);
        std::thread::sleep(Duration::from_millis(300));
        let gap = longest_gap(&pinger.replies(), t_kill);
        eprintln!(
            "{active} killed: {standby} active after {} ms; longest gap between ping replies \
             {:.0} ms",
            takeover.as_millis(),
            gap * 1e3
        );
        assert!(gap < 0.3, "ESP stopped for {:.0} ms", gap * 1e3);
        let now = site.wait_child_installed("net", UP)?;
        assert_eq!(now.spi_in, third.spi_in, "the takeover kept the CHILD_SA");
        cluster.control_on(&standby, &format!("rekey {}", tun.name))?;
        let fourth = site.wait_child_rekeyed("net", &third.spi_in, UP)?;
        site.rekey_child("net")?;
        site.wait_child_rekeyed("net", &fourth.spi_in, UP)?;
        ping_all_vms(&topo, 0, 3)?;
        let after = the_ike_sa(&site)?;
        assert_eq!(after.initiator_spi, ike.initiator_spi, "the same IKE SA");
        assert_eq!(after.responder_spi, ike.responder_spi, "the same IKE SA");
        let charon_new = site.log().get(charon_seen..).unwrap_or_default().to_owned();
        assert!(
            !charon_new.contains("IKE_SA_INIT") && !charon_new.contains("IKE_AUTH"),
            "strongSwan re-authenticated:\n{charon_new}"
        );
        let (_, failures, _, store) = store_stats(&cluster, &standby)?;
        assert_eq!(failures, 0, "the new leader's commits succeed: {store}");
        pinger.process.stop();
        eprintln!("test took {} ms", started.elapsed().as_millis());
        Ok(())
    })
}

/// An outage longer than the lease: ESP flows throughout; the active control node stops when
/// its lease can have expired (two nodes must never act on the same IKE SAs), and once etcd
/// is back the standby takes over with the same IKE SA and answers the rekey strongSwan
/// started during the outage (when it retransmits it). The stopped node is left stopped (in
/// production a supervisor restarts it, and it stands by).
#[test]
fn etcd_outage_longer_than_the_lease_hands_over_after_it() -> Result<()> {
    if skip_without_etcd("etcd_outage_longer_than_the_lease_hands_over_after_it") {
        return Ok(());
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let bed = Testbed::new()?;
    let (topo, tun, cluster) = up(&bed)?;
    with_store_logs(&cluster, || {
        // strongSwan retransmits after 1 s, then 1.8 s, 3.2 s...: the rekey it started in the
        // outage is answered soon after the standby took over.
        let settings = CharonSettings {
            retransmit_timeout: Some(1.0),
            retransmit_base: Some(1.8),
            retransmit_tries: Some(8),
            ..CharonSettings::default()
        };
        let site = site_charon_with(&topo, &tun, "site0", &settings, |_| {})?;
        site.initiate("net", UP)?;
        let child = site.wait_child_installed("net", UP)?;
        ping_all_vms(&topo, 0, 3)?;
        let (active, standby) = cluster.active_and_standby()?;
        let ike = the_ike_sa(&site)?;
        let charon_seen = site.log().len();
        let pinger = OutagePing::start(&topo)?;
        std::thread::sleep(Duration::from_millis(300));

        let (etcd, _) = cluster.etcd().expect("an etcd store");
        let stopped = Instant::now();
        let t_stop = epoch_secs(SystemTime::now());
        etcd.process.signal(libc::SIGSTOP);
        std::thread::sleep(Duration::from_millis(100));
        site.rekey_child("net")?;
        // The leader gives up its role at the latest 800 ms after its last answered
        // keep-alive, and its process stops within its 500 ms watchdog.
        let exit = cluster.wait_exit(&active, LONG_OUTAGE)?;
        let deposed_after = stopped.elapsed();
        std::thread::sleep(LONG_OUTAGE.saturating_sub(stopped.elapsed()));
        etcd.process.signal(libc::SIGCONT);
        let t_cont = epoch_secs(SystemTime::now());
        let back = Instant::now();
        let flowing = replies_between(&pinger, t_stop, t_cont);
        let gap = longest_gap(&pinger.replies(), t_stop);
        eprintln!(
            "etcd stopped for {} ms: {active} stopped after {} ms ({exit}); {flowing} ping \
             replies during the outage, longest gap {:.0} ms",
            stopped.elapsed().as_millis(),
            deposed_after.as_millis(),
            gap * 1e3
        );
        assert!(
            cluster.log(&active)?.contains("lost the leadership"),
            "{active} says why it stopped"
        );
        assert!(
            gap < 0.3,
            "ESP stopped for {:.0} ms without control",
            gap * 1e3
        );

        // The standby takes over once etcd is back, with the stored IKE SA.
        cluster.wait_alive(&["data1", "data2", "steer1"], Duration::from_secs(20))?;
        let takeover = back.elapsed();
        assert_eq!(cluster.active_control()?, standby);
        let rekeyed = site.wait_child_rekeyed("net", &child.spi_in, Duration::from_secs(30))?;
        let rekey_done = back.elapsed();
        let gap = longest_gap(&pinger.replies(), t_stop);
        eprintln!(
            "{standby} active {} ms after etcd came back; strongSwan's rekey from the outage \
             done {} ms after it; longest gap between ping replies since the outage began \
             {:.0} ms",
            takeover.as_millis(),
            rekey_done.as_millis(),
            gap * 1e3
        );
        assert!(gap < 0.3, "ESP stopped for {:.0} ms", gap * 1e3);
        cluster.control(&format!("rekey {}", tun.name))?;
        site.wait_child_rekeyed("net", &rekeyed.spi_in, UP)?;
        ping_all_vms(&topo, 0, 3)?;
        let after = the_ike_sa(&site)?;
        assert_eq!(after.initiator_spi, ike.initiator_spi, "the same IKE SA");
        let charon_new = site.log().get(charon_seen..).unwrap_or_default().to_owned();
        assert!(
            !charon_new.contains("IKE_SA_INIT") && !charon_new.contains("IKE_AUTH"),
            "strongSwan re-authenticated:\n{charon_new}"
        );
        pinger.process.stop();
        eprintln!("test took {} ms", started.elapsed().as_millis());
        Ok(())
    })
}
