//! One `protego bench edge` run: for each entry count the gateway started on the test bed
//! ([`super::bed`]) with its per-VM routes loaded, then each case measured — warm-up, probe,
//! maximum rate, latency at half of it — with the gateway's CPU time and drops around each
//! run; then the table alone.

use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use overlay::Family;
use testbed::{CleanupHandle, Testbed};
use wire::ethernet::{EtherType, EthernetAddress};

use super::bed::{parse_mac, render_config, EdgeNet, CE_MAC, ROUTER_MAC, TAGS};
use super::cgroup::{self, CpuShare};
use super::frames;
use super::packet_sock::{PacketSocket, Role};
use super::plan::{self, Draw};
use super::traffic::{drain, send_frames_paced, CeReceiver};
use super::{
    fill_ratios, table, targets, DropReasons, EdgeCase, EdgeDirection, EdgeOptions, EdgeReport,
    EdgeSettings, RouteLoad, EDGE_REPORT_VERSION,
};
use crate::cpu;
use crate::error::{BenchError, Result};
use crate::gateway::{self, ProtegoUnderTest};
use crate::load::{self, UnderTest};
use crate::net;
use crate::packet::{self, InnerSpec, VXLAN_FRAME_HEADER};
use crate::pool::{Built, Pool};
use crate::rx::{GatewayMac, Measure, RxHandle, RxKind};
use crate::sock::{self, SendScratch, Socket};
use crate::stats;

/// Inner UDP flows (source ports).
const FLOWS: u32 = 64;
/// Packets of the probe run.
const PROBE_PACKETS: u32 = 100_000;
/// Upper bound of the probe's rate, packets per second.
const PROBE_RATE: f64 = 5e6;
/// Most maximum-rate runs of a case (the first plus doublings).
const MAX_RUNS: usize = 3;
/// A run kept up when it delivered this share of its offer.
const KEPT_UP: f64 = 0.9;
/// Most destinations the warm-up visits (the gateway's neighbour cache holds 65 536 per VNet).
const WARM_UP_MAX: u32 = 65_536;
/// Warm-up rate, packets per second.
const WARM_UP_RATE: f64 = 200_000.0;
/// How long `route load` may take.
const ROUTE_LOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// Socket buffers of the host side.
const SOCKET_BUFFER: usize = 64 << 20;

/// The load generator's sockets and state.
struct Edge {
    opts: EdgeOptions,
    net: EdgeNet,
    dir: PathBuf,
    ce_tx: PacketSocket,
    ce_rx: Arc<PacketSocket>,
    host: Arc<Socket>,
    rx_host: RxHandle,
    gw_mac: GatewayMac,
    /// The gateway's trunk MAC (the attachment answers ARP with it).
    trunk_mac: EthernetAddress,
    interrupted: AtomicBool,
    next_tag: u32,
    pool: Pool,
    frames: Vec<u8>,
    send_ns: Vec<u64>,
    scratch: SendScratch,
    cpus: u32,
    /// The current gateway's CPU share (`--gateway-cpu`).
    share: Option<CpuShare>,
}

/// What one run measured.
#[derive(Debug, Default)]
struct RunOut {
    sent: u64,
    delivered: u64,
    rx_span_s: f64,
    send_span_s: f64,
    cpu_ns: u64,
    drops: DropReasons,
    path_drops: u64,
    loadgen_drops: u64,
    socket_drops: u64,
    latency_ns: Vec<u64>,
    /// Packets and batches the gateway's workers processed.
    worker_packets: u64,
    worker_batches: u64,
    /// Wall time of the run and the time the gateway spent throttled in it, ns.
    wall_ns: u64,
    throttled_ns: Option<u64>,
}

impl RunOut {
    fn delivered_pps(&self) -> f64 {
        let span = if self.rx_span_s > 1e-4 {
            self.rx_span_s
        } else {
            self.send_span_s
        };
        if span > 0.0 {
            self.delivered as f64 / span
        } else {
            0.0
        }
    }

    fn packets_per_batch(&self) -> Option<f64> {
        (self.worker_batches > 0).then(|| self.worker_packets as f64 / self.worker_batches as f64)
    }

    fn loss(&self) -> f64 {
        if self.sent == 0 {
            return 0.0;
        }
        1.0 - (self.delivered as f64 / self.sent as f64).min(1.0)
    }
}

/// The drop counters of a status document, by reason.
fn drop_reasons(status: &serde_json::Value) -> DropReasons {
    status
        .get("drops")
        .and_then(|d| d.as_object())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Packets and batches of all the gateway's workers in a status document (None: it reports
/// no batches).
fn worker_totals(status: &serde_json::Value) -> Option<(u64, u64)> {
    let workers = status.get("workers")?.as_array()?;
    let sum = |key: &str| -> Option<u64> {
        workers
            .iter()
            .map(|w| w.get(key).and_then(|v| v.as_u64()))
            .sum()
    };
    Some((sum("packets")?, sum("batches")?))
}

/// `after - before` per reason, the non-zero ones.
fn drops_since(after: &DropReasons, before: &DropReasons) -> DropReasons {
    after
        .iter()
        .filter_map(|(k, &v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

impl Edge {
    fn new(bed: &Testbed, opts: &EdgeOptions) -> Result<Edge> {
        let net = EdgeNet::build(bed)?;
        let dir = bed.dir().join("edge");
        std::fs::create_dir_all(&dir)
            .map_err(|e| BenchError::io(format!("create {}", dir.display()), e))?;
        let io = |what: &str| {
            let what = what.to_owned();
            move |e| BenchError::io(what, e)
        };
        let ce_tx = PacketSocket::open(net.ce.name(), &net.ce_if, Role::Send)
            .map_err(io("a packet socket on the CE's trunk end"))?;
        let ce_rx = Arc::new(
            PacketSocket::open(net.ce.name(), &net.ce_if, Role::Receive)
                .map_err(io("a receiving packet socket on the CE's trunk end"))?,
        );
        let raw = net
            .host
            .udp_socket(SocketAddr::from((net::HOST_VTEP, net::VXLAN_PORT)))?;
        let host =
            Arc::new(sock::wrap(raw, SOCKET_BUFFER, true).map_err(io("the host's VTEP socket"))?);
        let gw_mac: GatewayMac = Arc::new(Mutex::new(None));
        let rx_host = RxHandle::spawn(
            "rx-host",
            RxKind::HostVxlan,
            Arc::clone(&host),
            Arc::clone(&gw_mac),
        )?;
        let trunk_mac = parse_mac(&net.gw.mac(&net.gw_if)?)?;
        load::set_timer_slack(1_000);
        Ok(Edge {
            opts: opts.clone(),
            net,
            dir,
            ce_tx,
            ce_rx,
            host,
            rx_host,
            gw_mac,
            trunk_mac,
            interrupted: AtomicBool::new(false),
            next_tag: (std::process::id() << 12) ^ 0x3c3c_0000,
            pool: Pool::with_budget(opts.pool_bytes),
            frames: Vec::new(),
            send_ns: Vec::new(),
            scratch: SendScratch::default(),
            cpus: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
            share: None,
        })
    }

    /// Writes the route file of `entries` VMs and loads it into the gateway.
    fn load_routes(&self, gw: &ProtegoUnderTest, entries: u32) -> Result<RouteLoad> {
        let path = self.dir.join(format!("routes-{entries}.csv"));
        let file = std::fs::File::create(&path)
            .map_err(|e| BenchError::io(format!("create {}", path.display()), e))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        plan::write_route_file(&mut w, entries, net::HOST_VTEP)
            .and_then(|()| w.flush())
            .map_err(|e| BenchError::io(format!("write {}", path.display()), e))?;
        drop(w);
        let file_bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let start = Instant::now();
        let answer = gateway::control_request(
            gw.socket(),
            &format!("route load {}", path.display()),
            ROUTE_LOAD_TIMEOUT,
        )?;
        let seconds = start.elapsed().as_secs_f64();
        if answer.get("ok").is_some_and(|ok| ok == false) {
            return Err(BenchError::Gateway {
                gateway: "protego",
                reason: format!("route load refused: {answer}"),
                log_tail: gw.log_tail(20),
            });
        }
        // The file is not needed any more (16 M entries take 600 MB).
        let _ = std::fs::remove_file(&path);
        Ok(RouteLoad {
            entries,
            seconds,
            file_bytes,
        })
    }

    /// Teaches the gateway the CE's MAC (an ARP request for the segment's gateway address)
    /// and learns the gateway's MAC in the VNet (an ARP request over VXLAN for its address).
    fn resolve(&self) -> Result<EthernetAddress> {
        let mut buf = [0u8; 128];
        let req = packet::arp_request(CE_MAC, plan::CE_IP, plan::SEGMENT_GW);
        if let Some(n) =
            frames::write_arp_frame(&mut buf, EthernetAddress::BROADCAST, CE_MAC, TAGS, &req)
        {
            self.ce_tx.send(&[&buf[..n]]);
        }
        crate::load::ask_gateway_mac(
            &self.host,
            &self.gw_mac,
            plan::vm_addr(0),
            Duration::from_secs(10),
        )
    }

    /// Builds the packets of a run: `count` packets of `size` bytes, their VMs drawn from
    /// `0..drawn_from` (or visited in order with `sequential`). Returns the packets built.
    #[allow(clippy::too_many_arguments)]
    fn build(
        &mut self,
        dir: EdgeDirection,
        size: u16,
        count: u32,
        drawn_from: u32,
        sequential: bool,
        tag: u32,
        vnet_mac: EthernetAddress,
    ) -> Result<usize> {
        let size = usize::from(size);
        let mut draw = Draw::new(u64::from(tag) ^ 0x5eed);
        let mut pick = move |i: u32| {
            if sequential {
                i % drawn_from
            } else {
                draw.below(drawn_from)
            }
        };
        let too_small = |what: &str| BenchError::NoTraffic {
            case: "pool".into(),
            detail: format!("cannot build a {size}-byte {what}"),
        };
        match dir {
            EdgeDirection::ToVnet => {
                let stride = frames::QINQ_HEADER + size.max(64);
                let count = (count as usize).min(self.opts.pool_bytes / stride).max(1);
                self.frames.resize(count * stride, 0);
                for i in 0..count {
                    let vm = pick(i as u32);
                    let inner = InnerSpec {
                        src: plan::CE_IP,
                        dst: plan::vm_addr(vm),
                        src_port: 1024 + (i as u32 % FLOWS) as u16,
                        dst_port: net::INNER_PORT,
                    };
                    frames::write_ip_frame(
                        &mut self.frames[i * stride..(i + 1) * stride],
                        self.trunk_mac,
                        CE_MAC,
                        TAGS,
                        &inner,
                        size,
                        tag,
                        i as u32,
                    )
                    .ok_or_else(|| too_small("frame"))?;
                }
                Ok(count)
            }
            EdgeDirection::ToCe => {
                let dst = SocketAddr::from((net::GW_VTEP, net::VXLAN_PORT));
                let built = self.pool.build::<BenchError>(
                    count,
                    VXLAN_FRAME_HEADER + size,
                    64,
                    |i, slot| {
                        let h = packet::write_vxlan_header(
                            slot,
                            net::vni(),
                            vnet_mac,
                            net::VM_MAC,
                            EtherType::IPV4,
                        )
                        .ok_or_else(|| too_small("VXLAN frame"))?;
                        let inner = InnerSpec {
                            src: plan::vm_addr(pick(i)),
                            dst: plan::CE_IP,
                            src_port: 1024 + (i % FLOWS) as u16,
                            dst_port: net::INNER_PORT,
                        };
                        packet::write_inner(&mut slot[h..], &inner, size, tag, i)
                            .ok_or_else(|| too_small("packet"))?;
                        Ok(Built { len: h + size, dst })
                    },
                )?;
                Ok(built as usize)
            }
        }
    }

    /// Sends a run's packets at `rate` and measures what arrives and what the gateway spent.
    #[allow(clippy::too_many_arguments)]
    fn run_once(
        &mut self,
        gw: &ProtegoUnderTest,
        dir: EdgeDirection,
        size: u16,
        count: u32,
        drawn_from: u32,
        sequential: bool,
        rate: f64,
        record: bool,
        vnet_mac: EthernetAddress,
    ) -> Result<RunOut> {
        self.next_tag = self.next_tag.wrapping_add(1);
        let tag = self.next_tag;
        let built = self.build(dir, size, count, drawn_from, sequential, tag, vnet_mac)?;
        self.send_ns.clear();
        self.send_ns.resize(built, 0);
        let pid = gw.pid();
        let status0 = gateway::query_status(gw.socket())?;
        let cpu0 = cpu::thread_cpu_ns(pid)
            .map_err(|e| BenchError::io("read the gateway's CPU time", e))?;
        let path0 = backlog_drops();
        let throttled0 = self.share.as_ref().and_then(CpuShare::throttled);
        let udp0 = cpu::netns_udp_drops(pid);
        self.ce_rx.take_drops();
        let mut out = RunOut::default();
        let start = Instant::now();
        match dir {
            EdgeDirection::ToVnet => {
                self.rx_host.start(Measure {
                    tag,
                    record,
                    sample_every: 1,
                    sas: Arc::default(),
                    esp_sizes: Vec::new(),
                })?;
                let stride = frames::QINQ_HEADER + usize::from(size).max(64);
                let len = (frames::QINQ_HEADER + usize::from(size)).max(60);
                out.sent = send_frames_paced(
                    &self.ce_tx,
                    &self.frames,
                    stride,
                    len,
                    built,
                    rate,
                    &mut self.send_ns,
                );
                out.send_span_s = start.elapsed().as_secs_f64();
                drain(|| self.rx_host.progress(), out.sent);
                let report = self.rx_host.stop()?;
                out.delivered = report.packets;
                out.loadgen_drops = report.overflow;
                if let (Some(f), Some(l)) = (report.first_ns, report.last_ns) {
                    out.rx_span_s = l.saturating_sub(f) as f64 / 1e9;
                }
                if record {
                    out.latency_ns = latencies(&report.samples, &self.send_ns);
                }
            }
            EdgeDirection::ToCe => {
                let rx = CeReceiver::start(Arc::clone(&self.ce_rx), tag, record)?;
                out.sent = load::send_paced(
                    &self.host,
                    &mut self.scratch,
                    &self.pool,
                    &mut self.send_ns,
                    rate,
                    load::TRAINS_PER_CALL,
                    &self.interrupted,
                );
                out.send_span_s = start.elapsed().as_secs_f64();
                let progress = Arc::clone(&rx.progress);
                drain(|| progress.load(Ordering::Relaxed), out.sent);
                let c = rx.finish()?;
                out.delivered = c.packets;
                out.loadgen_drops = self.ce_rx.take_drops();
                if let (Some(f), Some(l)) = (c.first_ns, c.last_ns) {
                    out.rx_span_s = l.saturating_sub(f) as f64 / 1e9;
                }
                if record {
                    out.latency_ns = latencies(&c.samples, &self.send_ns);
                }
            }
        }
        let cpu1 = cpu::thread_cpu_ns(pid)
            .map_err(|e| BenchError::io("read the gateway's CPU time", e))?;
        let status1 = gateway::query_status(gw.socket())?;
        out.wall_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        out.throttled_ns = self
            .share
            .as_ref()
            .and_then(CpuShare::throttled)
            .zip(throttled0)
            .map(|((_, t1), (_, t0))| t1.saturating_sub(t0));
        if let (Some((p1, b1)), Some((p0, b0))) = (worker_totals(&status1), worker_totals(&status0))
        {
            out.worker_packets = p1.saturating_sub(p0);
            out.worker_batches = b1.saturating_sub(b0);
        }
        out.cpu_ns = cpu1.since(&cpu0);
        out.path_drops = backlog_drops().saturating_sub(path0);
        out.socket_drops = cpu::netns_udp_drops(pid).saturating_sub(udp0);
        out.drops = drops_since(&drop_reasons(&status1), &drop_reasons(&status0));
        gw.check_running()?;
        Ok(out)
    }

    /// Measures one case.
    fn case(
        &mut self,
        gw: &ProtegoUnderTest,
        dir: EdgeDirection,
        entries: u32,
        size: u16,
        vnet_mac: EthernetAddress,
    ) -> Result<EdgeCase> {
        let drawn_from = self.opts.active.map_or(entries, |a| a.min(entries));
        // Warm-up: the gateway resolves (to-vnet) or learns (to-ce) the VMs' MACs of up to
        // WARM_UP_MAX destinations, visited in order.
        let warm = drawn_from.min(WARM_UP_MAX);
        self.run_once(
            gw,
            dir,
            size,
            warm,
            drawn_from,
            true,
            WARM_UP_RATE,
            false,
            vnet_mac,
        )?;
        std::thread::sleep(Duration::from_millis(200));
        let probe = self.run_once(
            gw,
            dir,
            size,
            PROBE_PACKETS,
            drawn_from,
            false,
            PROBE_RATE,
            false,
            vnet_mac,
        )?;
        let secs = self.opts.duration.as_secs_f64();
        let mut rate = (probe.delivered_pps() * 1.25).max(10_000.0);
        let mut best: Option<(f64, RunOut)> = None;
        for _ in 0..MAX_RUNS {
            let count = (rate * secs).clamp(1_000.0, 50e6) as u32;
            let r = self.run_once(
                gw, dir, size, count, drawn_from, false, rate, false, vnet_mac,
            )?;
            let delivered = r.delivered_pps();
            let kept_up = r.sent > 0 && r.delivered as f64 >= KEPT_UP * r.sent as f64;
            best = Some((rate, r));
            if !kept_up {
                break;
            }
            rate = delivered * 2.0;
        }
        let (offered, max) = best.ok_or_else(|| BenchError::NoTraffic {
            case: format!("{} {entries} {size}", dir.name()),
            detail: "no run".into(),
        })?;
        let max_pps = max.delivered_pps();
        let cpu_ns_per_packet = if max.delivered > 0 {
            max.cpu_ns as f64 / max.delivered as f64
        } else {
            0.0
        };
        // The equal-rate run: every case at the same load (when its maximum allows it).
        let equal = self.opts.equal_rate;
        let equal_rate_cpu_ns = if max_pps >= equal && self.share.is_none() {
            let count = (equal * secs).clamp(1_000.0, 50e6) as u32;
            let e = self.run_once(
                gw, dir, size, count, drawn_from, false, equal, false, vnet_mac,
            )?;
            (e.delivered > 0).then(|| e.cpu_ns as f64 / e.delivered as f64)
        } else {
            None
        };
        let (latency_us, latency_loss) = if max_pps > 0.0 {
            let half = max_pps / 2.0;
            let count = (half * secs).clamp(1_000.0, 50e6) as u32;
            let mut l = self.run_once(
                gw, dir, size, count, drawn_from, false, half, true, vnet_mac,
            )?;
            (stats::percentiles(&mut l.latency_ns), l.loss())
        } else {
            (None, 1.0)
        };
        Ok(EdgeCase {
            direction: dir,
            entries,
            drawn_from,
            size,
            offered_mpps: offered / 1e6,
            delivered_mpps: max_pps / 1e6,
            cpu_ns_per_packet,
            mpps_per_core: if cpu_ns_per_packet > 0.0 {
                1e3 / cpu_ns_per_packet
            } else {
                0.0
            },
            cpu_vs_1_entry: None,
            busy_cores_at_max: max_pps * cpu_ns_per_packet / 1e9,
            packets_per_batch: max.packets_per_batch(),
            throttled_share: max
                .throttled_ns
                .filter(|_| max.wall_ns > 0)
                .map(|t| t as f64 / max.wall_ns as f64),
            equal_rate_cpu_ns,
            equal_rate_vs_1_entry: None,
            loss: max.loss(),
            gateway_drops: max.drops,
            path_drops: max.path_drops,
            loadgen_drops: max.loadgen_drops,
            gateway_socket_drops: max.socket_drops,
            latency_us,
            latency_loss,
        })
    }

    /// Starts the gateway for `entries`, loads the routes and measures every case of it.
    fn entry_group(
        &mut self,
        bin: &Path,
        entries: u32,
        group: usize,
        progress: &mut dyn FnMut(&str),
        cases: &mut Vec<EdgeCase>,
        loads: &mut Vec<RouteLoad>,
    ) -> Result<()> {
        let socket = self.dir.join(format!("gw{group}.sock"));
        let router_mac = (!self.opts.resolve_macs).then_some(ROUTER_MAC);
        let config = render_config(&socket, &self.net.gw_if, router_mac);
        let gw = ProtegoUnderTest::start_with_config(
            &self.net.gw,
            bin,
            &self.dir,
            &format!("protego-edge{group}"),
            &config,
            &socket,
            self.opts.keep,
        )?;
        let result = (|| -> Result<()> {
            progress(&format!("loading {entries} per-VM routes"));
            let l = self.load_routes(&gw, entries)?;
            progress(&format!("loaded in {:.2} s", l.seconds));
            loads.push(l);
            let vnet_mac = self.resolve()?;
            // The share is taken after the route load (16 M entries would take minutes at
            // a few percent of a CPU) and before the first warm-up.
            if let Some(percent) = self.opts.gateway_cpu {
                self.share = Some(CpuShare::confine(gw.pid(), percent)?);
                progress(&format!(
                    "gateway confined to {percent} % of one CPU ({} of every {} µs)",
                    cgroup::quota_us(percent),
                    cgroup::PERIOD_US
                ));
            }
            for &dir in &self.opts.directions.clone() {
                for &size in &self.opts.sizes.clone() {
                    progress(&format!("{} {entries} entries {size} B", dir.name()));
                    let c = self.case(&gw, dir, entries, size, vnet_mac)?;
                    progress(&format!(
                        "  {:.3} Mpps delivered, {:.0} ns/packet, loss {:.1} %",
                        c.delivered_mpps,
                        c.cpu_ns_per_packet,
                        c.loss * 100.0
                    ));
                    cases.push(c);
                }
            }
            Ok(())
        })();
        if result.is_err() {
            eprintln!("{}", gw.log_tail(30));
        }
        // Its group is removed first (the gateway moved back to the parent group).
        self.share = None;
        gw.stop();
        result
    }
}

/// The machine's input backlog drops (a veth delivers through the backlog). The interfaces'
/// own drop counters are no measure here: the kernel discards every tagged frame after the
/// gateway's packet socket has seen it (no VLAN device), and counts it as dropped.
fn backlog_drops() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .map(|t| cpu::parse_softnet_drops(&t))
        .unwrap_or(0)
}

/// One-way delays of the recorded packets.
fn latencies(samples: &[(u32, u64)], send_ns: &[u64]) -> Vec<u64> {
    samples
        .iter()
        .filter_map(|&(index, rx)| {
            let sent = *send_ns.get(index as usize)?;
            (sent != 0).then(|| rx.saturating_sub(sent))
        })
        .collect()
}

/// Runs `protego bench edge`; `progress` gets a line per step, `on_start` the test bed's
/// cleanup handle as soon as it exists (for a Ctrl-C handler).
pub fn run(
    opts: &EdgeOptions,
    progress: &mut dyn FnMut(&str),
    on_start: &mut dyn FnMut(CleanupHandle),
) -> Result<EdgeReport> {
    opts.validate()?;
    let mut cases = Vec::new();
    let mut loads = Vec::new();
    let mut errors = Vec::new();
    let cpus;
    {
        let bed = Testbed::new()?;
        if opts.keep {
            bed.keep_files(true);
        }
        on_start(bed.cleanup_handle());
        let bin = crate::gateway::protego_binary(opts.protego_bin.as_deref())?;
        if opts.gateway_cpu.is_some() {
            cgroup::sweep_stale();
        }
        let mut edge = Edge::new(&bed, opts)?;
        cpus = edge.cpus;
        for (group, &entries) in opts.entries.iter().enumerate() {
            if let Err(e) = edge.entry_group(&bin, entries, group, progress, &mut cases, &mut loads)
            {
                progress(&format!("{entries} entries: {e}"));
                errors.push(format!("{entries} entries: {e}"));
            }
        }
    }
    let mut table_figures = Vec::new();
    if opts.table {
        for &entries in &opts.entries {
            for family in [Family::V4, Family::V6] {
                progress(&format!("table alone: {family:?} {entries} entries"));
                match table::measure(family, entries, opts.table_lookups) {
                    Ok(f) => table_figures.push(f),
                    Err(e) => errors.push(format!("table {family:?} {entries}: {e}")),
                }
            }
        }
    }
    fill_ratios(&mut cases);
    let targets = targets(&cases, &table_figures);
    let mut notes = vec![
        "CPU per packet is the gateway's own (all threads, schedstat) per delivered packet at the maximum rate; Mpps/core = 1000 / that".into(),
        format!(
            "before each case a warm-up visits up to {WARM_UP_MAX} of its destinations in order (the gateway's neighbour cache holds 65 536 VMs per VNet)"
        ),
        "latency is one way, load generator to load generator, at half the maximum rate".into(),
        "pkt/bat: packets per batch of the gateway's workers over the maximum-rate run".into(),
    ];
    if let Some(p) = opts.gateway_cpu {
        notes.push(format!(
            "the gateway ran confined to {p} % of one CPU (cgroup v1 cpu controller, {} µs quota per {} µs period) from each entry count's first warm-up on: the maximum rate is the gateway's at saturation, busy is at most {:.2}; no equal-rate runs",
            cgroup::quota_us(p),
            cgroup::PERIOD_US,
            f64::from(p) / 100.0
        ));
    }
    Ok(EdgeReport {
        version: EDGE_REPORT_VERSION,
        settings: EdgeSettings {
            duration_s: opts.duration.as_secs_f64(),
            workers: 1,
            cpus,
            router_mac: (!opts.resolve_macs).then(|| ROUTER_MAC.to_owned()),
            gateway_cpu_percent: opts.gateway_cpu,
            notes,
        },
        cases,
        route_loads: loads,
        table: table_figures,
        targets,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_by_reason_and_losses() {
        let before =
            drop_reasons(&serde_json::json!({"drops": {"no_route": 2, "attach_source": 1}}));
        let after = drop_reasons(
            &serde_json::json!({"drops": {"no_route": 5, "attach_source": 1, "too_big": 4}}),
        );
        let d = drops_since(&after, &before);
        assert_eq!(
            d,
            DropReasons::from([("no_route".into(), 3), ("too_big".into(), 4)])
        );
        assert!(drop_reasons(&serde_json::json!({})).is_empty());
        let status = serde_json::json!({"workers": [
            {"cpu": 0, "packets": 640, "batches": 10, "busy_ns": 1},
            {"cpu": 1, "packets": 60, "batches": 2, "busy_ns": 1},
        ]});
        assert_eq!(worker_totals(&status), Some((700, 12)));
        assert_eq!(
            worker_totals(&serde_json::json!({"workers": [{"packets": 3}]})),
            None
        );
        let r = RunOut {
            sent: 100,
            delivered: 90,
            rx_span_s: 0.5,
            ..RunOut::default()
        };
        assert!((r.loss() - 0.1).abs() < 1e-9);
        assert!((r.delivered_pps() - 180.0).abs() < 1e-9);
        assert_eq!(
            latencies(&[(0, 150), (1, 10), (5, 9)], &[100, 0, 3]),
            vec![50]
        );
    }
}
