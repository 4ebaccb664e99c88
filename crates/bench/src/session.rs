//! A benchmark session: the test bed with the bench network and the load generator, the
//! crypto-only figures, the baseline latency, then every group of cases (start the gateway
//! under test, negotiate the tunnels over IKEv2, measure each case: maximum rate, then latency
//! at half of it) and the targets.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use testbed::{CleanupHandle, Testbed};

use crate::crypto_only::{self, CryptoFigure};
use crate::error::{BenchError, Result};
use crate::gateway::{self, GatewayParams, ProtegoUnderTest};
use crate::ike_client::{IkeClient, TunnelSa};
use crate::imix;
use crate::load::{Flow, HostSide, Loadgen, RunResult, RunSpec, UnderTest, TRAINS_PER_CALL};
use crate::net::BenchNet;
use crate::options::{matrix, Case, Direction, GatewayKind, Group, Options, PacketSize, PeerMode};
use crate::report::{CaseReport, LoadFigures, Machine, Report, Settings, REPORT_VERSION};
use crate::stats;
use crate::swan::CharonUnderTest;
use crate::targets;

/// The load generator never offers more than this (packets per second).
const MAX_OFFER_PPS: f64 = 5e6;
/// Nor more than this (inner bits per second).
const MAX_OFFER_BPS: f64 = 60e9;
/// Offered load of the maximum-rate run relative to the probed capacity.
const OVERLOAD: f64 = 1.25;
/// A run that delivered at least this share of what was offered did not saturate the gateway
/// (offered 125 % of its capacity, a saturated gateway loses about 20 %): the probe
/// underestimated it, and the run is repeated at twice the delivered rate.
const KEPT_UP: f64 = 0.90;
/// Send-time granularity of the latency runs: trains hold this long's worth of packets.
const LATENCY_TICK_S: f64 = 50e-6;
/// Time of the crypto-only loop per cipher, size and operation.
const CRYPTO_BUDGET: Duration = Duration::from_millis(60);

/// A benchmark session. Dropping it removes every namespace and process it created.
pub struct Session {
    // Dropped in this order: the load generator's threads end, then the test bed goes.
    load: Loadgen,
    net: BenchNet,
    bed: Testbed,
    interrupted: Arc<AtomicBool>,
    cpus: u32,
}

/// Something to say while running (one line, no newline).
type Progress<'a> = &'a mut dyn FnMut(&str);

impl Session {
    /// Creates the test bed (three namespaces) and the load generator.
    pub fn new(options: &Options) -> Result<Session> {
        options.validate()?;
        let bed = Testbed::new()?;
        if options.keep {
            bed.keep_files(true);
        }
        let net = BenchNet::build(&bed)?;
        let interrupted = Arc::new(AtomicBool::new(false));
        let load = Loadgen::new(&net, options.pool_bytes, Arc::clone(&interrupted))?;
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        Ok(Session {
            bed,
            net,
            load,
            interrupted,
            cpus,
        })
    }

    /// Tears the session down from another thread (a Ctrl-C handler).
    pub fn cleanup_handle(&self) -> CleanupHandle {
        self.bed.cleanup_handle()
    }

    /// Set it to stop the run at the next packet train.
    pub fn interrupt_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.interrupted)
    }

    /// The run directory (gateway configurations and logs).
    pub fn dir(&self) -> &Path {
        self.bed.dir()
    }

    /// Usable CPUs.
    pub fn cpus(&self) -> u32 {
        self.cpus
    }

    /// Runs every case of `options`.
    pub fn run(&mut self, options: &Options, progress: &mut dyn FnMut(&str)) -> Result<Report> {
        let groups = matrix(options, self.cpus);
        let total: usize = groups.iter().map(|g| g.cases.len()).sum();
        progress(&format!(
            "{} cases in {} gateway configurations; run directory {}",
            total,
            groups.len(),
            self.bed.dir().display()
        ));

        // Crypto-only limits of every cipher and size in the matrix.
        let mut crypto = Vec::new();
        for &cipher in &options.ciphers {
            for &size in &options.sizes {
                crypto.push(crypto_only::measure(cipher, size, CRYPTO_BUDGET)?);
            }
        }
        progress("crypto-only limits measured");

        // The baseline path: kernel forwarding in the gateway namespace, no user space.
        let baseline = self.baseline()?;
        if let Some(b) = &baseline {
            progress(&format!(
                "baseline path latency: p50 {:.1} us, p99 {:.1} us",
                b.p50, b.p99
            ));
        }

        let needs_protego = groups.iter().any(|g| g.gateway == GatewayKind::Protego);
        let files = self.bed.dir().join("bench");
        std::fs::create_dir_all(&files)
            .map_err(|e| BenchError::io(format!("create {}", files.display()), e))?;
        let psk_file = gateway::write_psk(&files)?;
        let bin = if needs_protego {
            Some(crate::gateway::protego_binary(
                options.gateway_bin.as_deref(),
            )?)
        } else {
            None
        };
        let workers_key = match &bin {
            Some(b) => gateway::workers_key_supported(b, &files, &psk_file)?,
            None => false,
        };
        if needs_protego && !workers_key {
            progress("warning: this protego does not know `[gateway] workers`; it runs its default worker count");
        }

        let mut cases = Vec::new();
        let mut errors = Vec::new();
        for (k, group) in groups.iter().enumerate() {
            if self.interrupted.load(Ordering::Relaxed) {
                return Err(BenchError::Interrupted);
            }
            let ctx = GroupCtx {
                index: k,
                bin: bin.as_deref(),
                files: &files,
                psk_file: &psk_file,
                workers_key,
                options,
                crypto: &crypto,
                baseline_us: baseline.map(|b| b.p50),
            };
            match self.run_group(group, &ctx, progress, &mut cases) {
                Ok(()) => {}
                Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                // Ctrl-C tears the gateway down under a running group: not its fault.
                Err(_) if self.interrupted.load(Ordering::Relaxed) => {
                    return Err(BenchError::Interrupted)
                }
                Err(e) => {
                    let msg = format!(
                        "{} {} tunnel(s) {} worker(s) {}: {e}",
                        group.gateway.name(),
                        group.tunnels,
                        group
                            .workers
                            .map_or_else(|| "-".to_owned(), |w| w.to_string()),
                        group.cipher
                    );
                    progress(&format!("error: {msg}"));
                    errors.push(msg);
                }
            }
        }
        let targets = targets::evaluate(&cases, &crypto);
        Ok(Report {
            version: REPORT_VERSION,
            machine: machine(self.cpus),
            settings: Settings {
                duration_s: options.duration.as_secs_f64(),
                pool_mib: options.pool_bytes >> 20,
                workers_key,
                loadgen_gso: self.load.gso(),
                imix: imix::describe(),
                loads: options.loads.clone(),
                peers: options.peers.iter().map(|p| p.name().to_owned()).collect(),
                notes: notes(),
            },
            crypto_only: crypto,
            baseline_latency_us: baseline,
            cases,
            targets,
            errors,
        })
    }

    /// Latency of the baseline path: 50 kpps of 512-byte packets for 0.5 s.
    fn baseline(&mut self) -> Result<Option<stats::Percentiles>> {
        let spec = RunSpec {
            size: PacketSize::Fixed(512),
            packets: 25_000,
            rate_pps: 50_000.0,
            train: 2,
            per_call: TRAINS_PER_CALL,
            record: true,
        };
        let mut r = self.load.run(&Flow::Baseline, &spec, None)?;
        Ok(stats::percentiles(&mut r.latency_ns))
    }

    fn run_group(
        &mut self,
        group: &Group,
        ctx: &GroupCtx<'_>,
        progress: Progress<'_>,
        out: &mut Vec<CaseReport>,
    ) -> Result<()> {
        let label = format!("{}{}", group.gateway.name(), ctx.index);
        let gw: Box<dyn UnderTest> = match group.gateway {
            GatewayKind::Protego => {
                let bin = ctx.bin.ok_or_else(|| BenchError::Gateway {
                    gateway: "protego",
                    reason: "no protego binary".to_owned(),
                    log_tail: String::new(),
                })?;
                let params = GatewayParams {
                    workers: group.workers.filter(|_| ctx.workers_key),
                    tunnels: group.tunnels,
                    cipher: group.cipher,
                    socket: ctx.files.join(format!("{label}.sock")),
                    psk_file: ctx.psk_file.to_owned(),
                    extra: ctx.options.gateway_options.clone(),
                    metrics: ctx
                        .options
                        .scrape_every
                        .map(|_| crate::scrape::METRICS_ADDR),
                };
                Box::new(ProtegoUnderTest::start(
                    &self.net.gw,
                    bin,
                    ctx.files,
                    &label,
                    &params,
                    ctx.options.keep,
                )?)
            }
            GatewayKind::StrongSwan => Box::new(CharonUnderTest::start(
                &self.net.gw,
                &label,
                group.tunnels,
                group.cipher,
                ctx.options.keep,
            )?),
        };
        let result = self.run_group_cases(group, ctx, gw.as_ref(), progress, out);
        let _ = self.load.set_ike_inbox(None);
        // Stopping a gateway sends IKE DELETEs nobody answers; the next group starts afresh.
        gw.stop();
        result
    }

    fn run_group_cases(
        &mut self,
        group: &Group,
        ctx: &GroupCtx<'_>,
        gw: &dyn UnderTest,
        progress: Progress<'_>,
        out: &mut Vec<CaseReport>,
    ) -> Result<()> {
        let client = IkeClient::start(
            gw.name(),
            Arc::clone(&self.load.ike),
            Arc::clone(&self.load.natt),
            group.tunnels,
            group.cipher,
        )?;
        self.load.set_ike_inbox(Some(client.inbox()))?;
        let sas = client.establish(group.tunnels)?;
        progress(&format!(
            "{}: {} tunnel(s) up ({} {}, {} worker(s))",
            gw.name(),
            sas.len(),
            group.cipher,
            group.cipher.esp_proposal(),
            group
                .workers
                .map_or_else(|| "-".to_owned(), |w| w.to_string()),
        ));
        let host = match group.gateway {
            GatewayKind::Protego => HostSide::Vxlan,
            GatewayKind::StrongSwan => HostSide::Plain,
        };
        let gw_mac = match host {
            HostSide::Vxlan => self.load.resolve_gateway_mac(Duration::from_secs(5))?,
            HostSide::Plain => wire::ethernet::EthernetAddress([0; 6]),
        };
        self.warm_up(&sas, host, gw)?;
        let scraper = match (group.gateway, ctx.options.scrape_every) {
            (GatewayKind::Protego, Some(every)) => {
                let idle = crate::scrape::idle(&self.net.gw, 20);
                progress(&format!("{}: {idle}", gw.name()));
                Some(crate::scrape::Scraper::start(&self.net.gw, every))
            }
            _ => None,
        };
        for case in &group.cases {
            let flow = match case.direction {
                Direction::Inbound => Flow::Inbound { sas: &sas, host },
                Direction::Outbound => Flow::Outbound {
                    sas: &sas,
                    host,
                    gw_mac,
                },
            };
            let crypto = ctx
                .crypto
                .iter()
                .find(|f| f.cipher == case.cipher.name() && f.size == case.size.label());
            let report = self.measure_case(case, &flow, gw, crypto, ctx)?;
            progress(&crate::report::table_row(&report));
            out.push(report);
        }
        if let Some(s) = scraper {
            progress(&format!("{}: {}", gw.name(), s.finish()));
        }
        drop(client);
        Ok(())
    }

    /// Sends a few inbound packets until they arrive: the gateway has resolved the VM's MAC
    /// (ARP over VXLAN) or its routes are in place.
    fn warm_up(&mut self, sas: &[TunnelSa], host: HostSide, gw: &dyn UnderTest) -> Result<()> {
        let spec = RunSpec {
            size: PacketSize::Fixed(128),
            packets: (sas.len() as u32 * 2).clamp(200, 4000),
            rate_pps: 20_000.0,
            train: 1,
            per_call: TRAINS_PER_CALL,
            record: false,
        };
        let mut last = RunResult::default();
        for _ in 0..5 {
            last = self
                .load
                .run(&Flow::Inbound { sas, host }, &spec, Some(gw))?;
            if last.delivered >= last.sent.saturating_sub(last.sent / 100) && last.delivered > 0 {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        Err(BenchError::NoTraffic {
            case: format!("{} warm-up", gw.name()),
            detail: format!(
                "only {} of {} inbound packets arrived (gateway drop counters {:?})",
                last.delivered, last.sent, last.gateway_drops
            ),
        })
    }

    /// Measures one case: a short probe of the capacity, the maximum-rate run (offered above
    /// capacity; repeated higher if the gateway kept up), and the latency run at half the
    /// maximum rate.
    fn measure_case(
        &mut self,
        case: &Case,
        flow: &Flow<'_>,
        gw: &dyn UnderTest,
        crypto: Option<&CryptoFigure>,
        ctx: &GroupCtx<'_>,
    ) -> Result<CaseReport> {
        let secs = ctx.options.duration.as_secs_f64();
        let inbound = case.direction == Direction::Inbound;
        let cores = f64::from(case.workers.unwrap_or(self.cpus).max(1));
        let crypto_pps = crypto.map_or(MAX_OFFER_PPS, |c| 1e9 / c.ns_per_packet(inbound).max(1.0));
        let upper = (crypto_pps * cores)
            .min(MAX_OFFER_PPS)
            .min(MAX_OFFER_BPS / (8.0 * case.size.mean()));
        let pool_packets = self.pool_capacity(case);
        let packets = |rate: f64, s: f64| ((rate * s) as u64).clamp(1000, pool_packets) as u32;

        let probe = self.load.run(
            flow,
            &RunSpec {
                size: case.size,
                packets: packets(upper, 0.05).min((pool_packets / 4).max(1000) as u32),
                rate_pps: upper,
                train: 64,
                per_call: TRAINS_PER_CALL,
                record: false,
            },
            Some(gw),
        )?;
        if probe.delivered == 0 {
            return Err(BenchError::NoTraffic {
                case: case.label(),
                detail: format!(
                    "none of {} probe packets arrived (gateway drop counters {:?}, socket drops {})",
                    probe.sent, probe.gateway_drops, probe.gateway_socket_drops
                ),
            });
        }
        let mut offered = (probe.delivered_pps() * OVERLOAD).min(upper);
        let mut max;
        let mut tries = 0;
        loop {
            max = self.load.run(
                flow,
                &RunSpec {
                    size: case.size,
                    packets: packets(offered, secs),
                    rate_pps: offered,
                    train: 64,
                    per_call: TRAINS_PER_CALL,
                    record: false,
                },
                Some(gw),
            )?;
            tries += 1;
            let kept_up = max.delivered as f64 >= KEPT_UP * max.sent as f64;
            if kept_up && offered < upper && tries < 3 {
                offered = (max.delivered_pps() * 2.0).min(upper);
                continue;
            }
            break;
        }
        if max.delivered == 0 {
            return Err(BenchError::NoTraffic {
                case: case.label(),
                detail: format!("none of {} packets arrived at the maximum rate", max.sent),
            });
        }
        let rate = max.delivered_pps() / 2.0;
        let train = paced_train(rate);
        let mut half = self.load.run(
            flow,
            &RunSpec {
                size: case.size,
                packets: packets(rate, secs),
                rate_pps: rate,
                train,
                per_call: TRAINS_PER_CALL,
                record: true,
            },
            Some(gw),
        )?;
        let latency = stats::percentiles(&mut half.latency_ns);
        half.latency_ns = Vec::new();
        let mut report = CaseReport::new(case, &max, &half, latency, ctx.baseline_us, crypto);
        // The offered loads, as a batching and as a non-batching peer (issue 23 §1). The
        // maximum-rate and latency runs are the batching peer's 100 and 50 %.
        for &peer in &ctx.options.peers {
            for &pct in &ctx.options.loads {
                let figures = match (peer, pct) {
                    (PeerMode::Batching, 100) => LoadFigures::new(peer, pct, &max),
                    (PeerMode::Batching, 50) => LoadFigures::new(peer, pct, &half),
                    _ => {
                        let rate = max.delivered_pps() * f64::from(pct) / 100.0;
                        let (train, per_call) = match peer {
                            PeerMode::Batching => (paced_train(rate), TRAINS_PER_CALL),
                            PeerMode::Single => (1, 1),
                        };
                        let run = self.load.run(
                            flow,
                            &RunSpec {
                                size: case.size,
                                packets: packets(rate, secs),
                                rate_pps: rate,
                                train,
                                per_call,
                                record: false,
                            },
                            Some(gw),
                        )?;
                        LoadFigures::new(peer, pct, &run)
                    }
                };
                report.at_load.push(figures);
            }
        }
        Ok(report)
    }

    /// How many packets of `case` the pool holds.
    fn pool_capacity(&self, case: &Case) -> u64 {
        let per_packet = case.size.mean() + 100.0;
        ((self.load.pool_budget() as f64 / per_packet) as u64).max(1000)
    }
}

/// Packets per GSO train of a batching peer's paced run at `rate`: what a tick of
/// [`LATENCY_TICK_S`] holds.
fn paced_train(rate: f64) -> usize {
    ((rate * LATENCY_TICK_S) as usize).clamp(1, 64)
}

struct GroupCtx<'a> {
    index: usize,
    bin: Option<&'a Path>,
    files: &'a Path,
    psk_file: &'a Path,
    workers_key: bool,
    options: &'a Options,
    crypto: &'a [CryptoFigure],
    baseline_us: Option<f64>,
}

/// The machine the benchmark runs on.
pub(crate) fn machine(cpus: u32) -> Machine {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default();
    Machine {
        cpus,
        kernel,
        cpu_model,
    }
}

fn notes() -> Vec<String> {
    vec![
        "size = inner IP packet length; Gbit/s and ns/B count inner IP bytes".to_owned(),
        "CPU = the gateway process's own run time (sum of /proc/<pid>/task/*/schedstat) over the run, per delivered packet or byte".to_owned(),
        "maximum rate = delivered rate with the gateway offered more than it can take (probe, then 125 % of the probed rate)".to_owned(),
        "latency = one-way, send time of the GSO train to the kernel receive timestamp, at half the maximum rate; added latency subtracts the baseline path's median".to_owned(),
        "loss = sent - delivered at half the maximum rate; the gateway's counters and socket drops are listed apart".to_owned(),
        "crypto%: crypto-only ns/B (open inbound, seal outbound) / gateway ns/B".to_owned(),
        "at offered loads: each case again at a percentage of its maximum delivered rate, sent by a batching peer (paced GSO trains, the load generator's way) and by a single-datagram peer (one datagram per system call, as kernel ESP and VXLAN devices send); CPU per delivered packet and byte as above".to_owned(),
        "strongSwan: kernel-libipsec, inner packets routed by the kernel (plain UDP, no VXLAN), no outbound packets above 1400 B (its TUN MTU)".to_owned(),
    ]
}
