//! `protego bench failover`: the distributed form's moves, measured against real strongSwan in
//! network namespaces (one control node, three data nodes, one steer node, the control node's
//! store in etcd when the machine has it, else the file store).
//!
//! Each scenario runs a 1 kHz ping (`ping -D -i 0.001`) from the site's LAN to a VM through
//! the tunnel and counts what is lost:
//!
//! - `migration`: `ctl migrate` of the tunnel to another data node;
//! - `drain`: `ctl drain` of the node holding it (then `undrain`);
//! - `data_failover`: `kill -9` of the data node holding it; `outage_ms` runs from the kill
//!   on to traffic flowing again: the longest time between two ping replies.
//!
//! Also: the control node's IKE state commit latency (`state_write_ms`, from its status) and
//! the round trip between the peer and the VIP (`peer_rtt_ms`). With etcd, two control nodes
//! run and `control_failover` kills the active one: `takeover_ms` runs from the kill to the
//! standby serving every live node again, and the ping shows whether ESP stopped. Without
//! etcd it is `null`, with the reason in `not_measured`.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use testbed::cluster::{ClusterSpec, ClusterStore, ProtegoCluster};
use testbed::protego::GatewayTunnel;
use testbed::strongswan::{Charon, CharonSettings, SwanctlConfig};
use testbed::traffic::{self, PingOptions};
use testbed::wait::{wait_for, Probe};
use testbed::{CleanupHandle, Cmd, Process, Testbed, Topology};

use crate::error::{BenchError, Result};

/// How long the tunnel may take to come up.
const UP: Duration = Duration::from_secs(20);
/// Ping interval during a scenario.
const PING_INTERVAL: Duration = Duration::from_millis(1);
/// How long ping runs before the move.
const LEAD: Duration = Duration::from_millis(1000);
/// How long ping runs in each scenario.
const WINDOW: Duration = Duration::from_secs(4);

/// Options of the failover benchmark.
#[derive(Debug, Clone, Default)]
pub struct FailoverOptions {
    /// The `protego` binary under test (default: the one beside this process).
    pub protego_bin: Option<PathBuf>,
    /// Use the file store even when etcd is installed.
    pub file_store: bool,
}

/// Packets lost around one move.
#[derive(Debug, Clone, Serialize)]
pub struct MoveFigures {
    /// Echo requests sent during the scenario.
    pub sent: u32,
    /// Requests without a reply.
    pub lost: u32,
    /// How long the move's command took (ms), or for a failover the outage: from the kill to
    /// the first reply after it.
    pub ms: u64,
}

/// A data node failover.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverFigures {
    /// Echo requests sent during the scenario.
    pub sent: u32,
    /// Requests without a reply.
    pub lost: u32,
    /// The longest time without a ping reply (1 ms apart) from the kill on, ms.
    pub outage_ms: u64,
}

/// A control node failover.
#[derive(Debug, Clone, Serialize)]
pub struct ControlFailoverFigures {
    /// Echo requests sent during the scenario.
    pub sent: u32,
    /// Requests without a reply.
    pub lost: u32,
    /// From the kill of the active control node to the standby serving every live node.
    pub takeover_ms: u64,
    /// The longest time between two ping replies around the kill, ms.
    pub longest_gap_ms: u64,
}

/// Commit latency of the control node's store.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// The store backend.
    pub backend: String,
    /// Median, ms.
    pub p50: f64,
    /// 99th percentile, ms.
    pub p99: f64,
    /// Commits measured.
    pub commits: u64,
}

/// The figures, as one JSON object.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    /// `ctl migrate` under a 1 kHz ping.
    pub migration: MoveFigures,
    /// `ctl drain` under a 1 kHz ping.
    pub drain: MoveFigures,
    /// `kill -9` of the data node holding the tunnel.
    pub data_failover: FailoverFigures,
    /// `kill -9` of the active control node (null without etcd: one control node).
    pub control_failover: Option<ControlFailoverFigures>,
    /// The IKE state store's commit latency on the control node.
    pub state_write_ms: Latency,
    /// Average round trip between the peer and the VIP, ms.
    pub peer_rtt_ms: f64,
    /// What was not measured, and why.
    pub not_measured: Vec<String>,
}

/// A timestamped 1 kHz ping through the tunnel.
struct Pinger {
    process: Process,
}

impl Pinger {
    fn start(topo: &Topology, count: u32) -> Result<Pinger> {
        let s = &topo.sites[0];
        let vm = &topo.tenants[0].vms[0];
        let cmd = Cmd::new("stdbuf").args(["-oL", "ping", "-n", "-D", "-W", "1"]);
        let cmd = cmd.args([
            "-i".to_owned(),
            format!("{:.3}", PING_INTERVAL.as_secs_f64()),
            "-c".to_owned(),
            count.to_string(),
            "-I".to_owned(),
            s.lan_addr.to_string(),
            vm.addr.addr.to_string(),
        ]);
        Ok(Pinger {
            process: s.ns.spawn("failover-ping", cmd)?,
        })
    }

    /// Waits for the end and returns (sent, lost, reply times in seconds since the epoch).
    fn finish(self) -> Result<(u32, u32, Vec<f64>)> {
        self.process.wait(WINDOW + Duration::from_secs(10))?;
        let log = self.process.log();
        let stats = traffic::parse_ping(&log)?;
        let replies = log
            .lines()
            .filter(|l| l.contains("bytes from"))
            .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
            .collect();
        Ok((stats.transmitted, stats.lost(), replies))
    }
}

fn epoch(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The longest time without a ping reply from the last reply before `t0` (the kill) to the
/// last reply: how long traffic stopped. `None` if no reply came after `t0`.
fn longest_gap_ms(replies: &[f64], t0: f64) -> Option<u64> {
    let start = replies.iter().rposition(|t| *t <= t0).unwrap_or(0);
    let after = &replies[start..];
    if !after.iter().any(|t| *t > t0) {
        return None;
    }
    let gap = after.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    Some((gap * 1e3).round() as u64)
}

fn wait_holder(cluster: &ProtegoCluster) -> Result<String> {
    Ok(wait_for(
        "one data node holding the tunnel",
        Duration::from_secs(20),
        || {
            Ok(match cluster.sa_holder()? {
                Some(h) => Probe::Ready(h),
                None => Probe::NotYet(cluster.nodes()?.to_string()),
            })
        },
    )?)
}

fn command(cluster: &ProtegoCluster, request: &str) -> Result<u64> {
    let answer = cluster.control(request)?;
    if answer["ok"] != true {
        return Err(BenchError::Gateway {
            gateway: "protego",
            reason: format!("`{request}` failed"),
            log_tail: answer.to_string(),
        });
    }
    Ok(answer["ms"].as_u64().unwrap_or(0))
}

/// Runs a ping for [`WINDOW`] and `action` [`LEAD`] into it; returns (sent, lost, action's
/// result, reply times).
fn under_ping<T>(
    topo: &Topology,
    action: impl FnOnce() -> Result<T>,
) -> Result<(u32, u32, T, Vec<f64>)> {
    let count = (WINDOW.as_secs_f64() / PING_INTERVAL.as_secs_f64()) as u32;
    let pinger = Pinger::start(topo, count)?;
    std::thread::sleep(LEAD);
    let value = action()?;
    let (sent, lost, replies) = pinger.finish()?;
    Ok((sent, lost, value, replies))
}

/// Runs every scenario; `progress` gets a line per step. `on_start` receives the test bed's
/// cleanup handle as soon as it exists (a Ctrl-C handler removes every namespace and process
/// with it).
pub fn run(
    options: &FailoverOptions,
    progress: &mut dyn FnMut(&str),
    on_start: &mut dyn FnMut(CleanupHandle),
) -> Result<FailoverReport> {
    let bed = Testbed::new()?;
    on_start(bed.cleanup_handle());
    let topo = Topology::build(&bed, crate::site::one_site(&[0, 1], 2)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, "failover-bench-psk-5d1c");
    let etcd = !options.file_store && testbed::cmd::program_exists("etcd");
    let spec = ClusterSpec {
        data: 3,
        controls: if etcd { 2 } else { 1 },
        store: if etcd {
            ClusterStore::Etcd
        } else {
            ClusterStore::File
        },
        log_level: "info".into(),
        ..ClusterSpec::default()
    };
    progress(&format!(
        "starting {} control, 3 data and 1 steer node ({} store)",
        spec.controls,
        if etcd { "etcd" } else { "file" }
    ));
    let cluster = match &options.protego_bin {
        Some(bin) => {
            ProtegoCluster::start_with(&bed, &topo, std::slice::from_ref(&tun), &spec, bin)?
        }
        None => ProtegoCluster::start(&bed, &topo, std::slice::from_ref(&tun), &spec)?,
    };
    let result = scenarios(&topo, &tun, &cluster, etcd, progress);
    if result.is_err() {
        eprintln!("{}", cluster.log_tails(40));
    }
    cluster.stop_all();
    result
}

fn scenarios(
    topo: &Topology,
    tun: &GatewayTunnel,
    cluster: &ProtegoCluster,
    etcd: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<FailoverReport> {
    let (mut conn, _) = topo.site_connections(tun.site, &tun.psk);
    tun.apply_to_site(&mut conn);
    let site = Charon::start(
        &topo.sites[0].ns,
        "failover-site",
        &CharonSettings::default(),
    )?;
    site.load(&SwanctlConfig::new(vec![conn]))?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    let s = &topo.sites[0];
    let rtt = traffic::ping(
        &s.ns,
        topo.gateway.wan.addr,
        &PingOptions::new(20, Duration::from_millis(10)),
    )?;
    let peer_rtt_ms = rtt
        .rtt_avg
        .map_or(0.0, |d| (d.as_secs_f64() * 1e6).round() / 1e3);

    progress("migration under a 1 kHz ping");
    let from = wait_holder(cluster)?;
    let to = other_node(cluster, &from)?;
    let (sent, lost, ms, _) = under_ping(topo, || {
        command(cluster, &format!("migrate {} {to}", tun.name))
    })?;
    let migration = MoveFigures { sent, lost, ms };

    progress("drain under a 1 kHz ping");
    let victim = wait_holder(cluster)?;
    let (sent, lost, ms, _) = under_ping(topo, || command(cluster, &format!("drain {victim}")))?;
    command(cluster, &format!("undrain {victim}"))?;
    let drain = MoveFigures { sent, lost, ms };

    progress("kill -9 of the data node holding the tunnel under a 1 kHz ping");
    let victim = wait_holder(cluster)?;
    let (sent, lost, killed_at, replies) = under_ping(topo, || {
        let at = SystemTime::now();
        cluster.kill(&victim)?;
        Ok(at)
    })?;
    let outage_ms =
        longest_gap_ms(&replies, epoch(killed_at)).ok_or_else(|| BenchError::Gateway {
            gateway: "protego",
            reason: "no ping reply after the data node was killed".into(),
            log_tail: cluster.log_tails(20),
        })?;
    let data_failover = FailoverFigures {
        sent,
        lost,
        outage_ms,
    };

    let status = cluster.control("status")?;
    let store = &status["store"];
    // Microseconds to milliseconds, three decimals.
    let ms = |key: &str| store[key].as_u64().unwrap_or(0) as f64 / 1e3;
    let state_write_ms = Latency {
        backend: store["backend"]
            .as_str()
            .unwrap_or(if etcd { "etcd" } else { "file" })
            .to_owned(),
        p50: ms("commit_us_p50"),
        p99: ms("commit_us_p99"),
        commits: store["commits"].as_u64().unwrap_or(0),
    };
    let mut not_measured = Vec::new();
    let control_failover = if etcd {
        progress("kill -9 of the active control node under a 1 kHz ping");
        Some(control_failover(topo, cluster)?)
    } else {
        not_measured.push(
            "control_failover: needs etcd (two control nodes elect the active one through it)"
                .to_owned(),
        );
        None
    };

    Ok(FailoverReport {
        migration,
        drain,
        data_failover,
        control_failover,
        state_write_ms,
        peer_rtt_ms,
        not_measured,
    })
}

/// Kills the active control node; the standby takes over.
fn control_failover(topo: &Topology, cluster: &ProtegoCluster) -> Result<ControlFailoverFigures> {
    let active = cluster.active_control()?.to_owned();
    let standby = cluster
        .control_node_names()
        .into_iter()
        .find(|n| *n != active)
        .ok_or_else(|| BenchError::Gateway {
            gateway: "protego",
            reason: "no standby control node".into(),
            log_tail: String::new(),
        })?;
    // Every node still running must be back with the standby.
    let expected = cluster
        .members()
        .iter()
        .filter(|m| m.role() != testbed::cluster::ClusterRole::Control && m.is_running())
        .count();
    let (sent, lost, (takeover, killed_at), replies) = under_ping(topo, || {
        let at = SystemTime::now();
        let started = std::time::Instant::now();
        cluster.kill(&active)?;
        wait_for(
            "the standby control node to take over",
            Duration::from_secs(15),
            || {
                let Ok(nodes) = cluster.control_on(&standby, "nodes") else {
                    return Ok(Probe::NotYet("not active yet".into()));
                };
                let alive = nodes["nodes"]
                    .as_array()
                    .map_or(0, |n| n.iter().filter(|n| n["alive"] == true).count());
                Ok(if alive >= expected {
                    Probe::Ready(())
                } else {
                    Probe::NotYet(nodes.to_string())
                })
            },
        )?;
        Ok((started.elapsed(), at))
    })?;
    Ok(ControlFailoverFigures {
        sent,
        lost,
        takeover_ms: takeover.as_millis() as u64,
        longest_gap_ms: longest_gap_ms(&replies, epoch(killed_at)).unwrap_or(0),
    })
}

fn other_node(cluster: &ProtegoCluster, not: &str) -> Result<String> {
    cluster
        .data_node_names()
        .into_iter()
        .find(|n| n != not)
        .ok_or_else(|| BenchError::Gateway {
            gateway: "protego",
            reason: "no second data node".into(),
            log_tail: String::new(),
        })
}

/// The report as text.
pub fn render(report: &FailoverReport) -> String {
    let mut out = String::new();
    let m = &report.migration;
    let d = &report.drain;
    let f = &report.data_failover;
    out.push_str(&format!(
        "migration      lost {:>5} of {:>5} pings  ({} ms)\n",
        m.lost, m.sent, m.ms
    ));
    out.push_str(&format!(
        "drain          lost {:>5} of {:>5} pings  ({} ms)\n",
        d.lost, d.sent, d.ms
    ));
    out.push_str(&format!(
        "data failover  lost {:>5} of {:>5} pings  outage {} ms\n",
        f.lost, f.sent, f.outage_ms
    ));
    match &report.control_failover {
        Some(c) => out.push_str(&format!(
            "control failover lost {:>5} of {:>5} pings  takeover {} ms, longest reply gap {} ms\n",
            c.lost, c.sent, c.takeover_ms, c.longest_gap_ms
        )),
        None => out.push_str("control failover  not measured\n"),
    }
    out.push_str(&format!(
        "state write ({})  p50 {:.2} ms  p99 {:.2} ms  ({} commits)\n",
        report.state_write_ms.backend,
        report.state_write_ms.p50,
        report.state_write_ms.p99,
        report.state_write_ms.commits
    ));
    out.push_str(&format!("peer rtt       {:.3} ms\n", report.peer_rtt_ms));
    for n in &report.not_measured {
        out.push_str(&format!("not measured: {n}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outage_is_the_longest_silence_from_the_kill_on() {
        // Replies every 1 ms, then nothing for 40 ms after the kill at 10.0035.
        let mut r: Vec<f64> = (0..5).map(|i| 10.0 + f64::from(i) * 0.001).collect();
        r.extend((0..5).map(|i| 10.044 + f64::from(i) * 0.001));
        assert_eq!(longest_gap_ms(&r, 10.0035), Some(40));
        // A gap before the kill does not count.
        let mut early = vec![9.0];
        early.extend(&r);
        assert_eq!(longest_gap_ms(&early, 10.0035), Some(40));
        assert_eq!(longest_gap_ms(&r, 20.0), None);
    }
}
