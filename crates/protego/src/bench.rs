//! `protego bench`: runs the data plane benchmark (the `protego-bench` crate) against this
//! very binary as the gateway under test (`protego up` in a network namespace), optionally
//! beside strongSwan, prints a table or one JSON document, and removes every namespace and
//! process it started — also on Ctrl-C.

mod fairness;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use bench::{
    parse_duration, parse_list, parse_load, parse_tunnels, render_text, BenchError, Cipher,
    Direction, Options, PacketSize, PeerMode, Session, WorkerCount,
};

/// Options of `protego bench`.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    scenario: Option<BenchScenario>,
    /// Inner IP packet sizes in bytes, or `imix` (7:4:1 of 40/576/1500), comma-separated.
    /// Default: 64,512,1400,imix.
    #[arg(long, value_name = "LIST")]
    sizes: Option<String>,
    /// ESP transforms: aes256gcm, aes128gcm, chacha20poly1305, aes256cbc-sha256. Default: all.
    #[arg(long, value_name = "LIST")]
    ciphers: Option<String>,
    /// Directions: `in` (ESP -> gateway decrypts -> VXLAN) and/or `out` (VXLAN -> gateway
    /// encrypts -> ESP). Default: in,out.
    #[arg(long, value_name = "LIST")]
    dirs: Option<String>,
    /// Tunnel counts. Default: 1,1000.
    #[arg(long, value_name = "LIST")]
    tunnels: Option<String>,
    /// Gateway worker counts, numbers or `all`. Default: 1,all.
    #[arg(long, value_name = "LIST")]
    workers: Option<String>,
    /// Length of each measurement (maximum-rate run and latency run), e.g. `2s`, `500ms`.
    /// Default: 1s (0.5s with --quick).
    #[arg(long, value_name = "TIME")]
    duration: Option<String>,
    /// A short preset: AES-256-GCM, 1400 and 64 bytes, both directions, 1 tunnel, 1 and all
    /// workers, 0.5 s. Other options refine it.
    #[arg(long)]
    quick: bool,
    /// Print one JSON document on stdout instead of the tables.
    #[arg(long)]
    json: bool,
    /// Also measure strongSwan 5.9 (charon, kernel-libipsec) as the gateway in the same run.
    #[arg(long)]
    compare_strongswan: bool,
    /// Measure strongSwan only (with --compare-strongswan).
    #[arg(long, requires = "compare_strongswan")]
    strongswan_only: bool,
    /// Pre-built packets the load generator may hold per run, MiB. Default: 1024.
    #[arg(long, value_name = "MIB")]
    pool_mb: Option<usize>,
    /// The protego binary to benchmark (default: this one).
    #[arg(long, value_name = "PATH")]
    gateway_bin: Option<PathBuf>,
    /// Keep the run directory (gateway configurations and logs) afterwards.
    #[arg(long)]
    keep: bool,
    /// An extra `key = value` line for the Protego gateway's `[gateway]` table, e.g.
    /// `--gateway-option 'busy_poll = "200us"'` (repeatable).
    #[arg(long, value_name = "LINE")]
    gateway_option: Vec<String>,
    /// Offered loads of each case's load runs, percent of its maximum rate, or `none`.
    /// Default: 100,50,10.
    #[arg(long, value_name = "LIST")]
    loads: Option<String>,
    /// How the load generator sends in the load runs: `batching` (GSO trains, many per
    /// system call) and/or `single` (one datagram per system call, as a real peer's kernel
    /// does). Default: batching,single.
    #[arg(long, value_name = "LIST")]
    peers: Option<String>,
    /// Give the Protego gateway a `[metrics]` listener and scrape it this often while the
    /// cases run (e.g. `1s`); prints the scrapes' durations and sizes after each group.
    #[arg(long, value_name = "DURATION")]
    scrape_every: Option<String>,
}

/// Benchmarks other than the data plane's.
#[derive(Debug, Clone, clap::Subcommand)]
enum BenchScenario {
    /// The distributed form's moves against strongSwan in network namespaces: migration,
    /// drain and data node failover under a 1 kHz ping (lost pings, outage), the control
    /// node's state commit latency and the peer round trip (needs root; see
    /// docs/performance.md).
    Failover {
        /// Print one JSON object on stdout instead of the table.
        #[arg(long)]
        json: bool,
        /// Use the file store even when etcd is installed.
        #[arg(long)]
        file_store: bool,
        /// The protego binary to run as the nodes (default: this one).
        #[arg(long, value_name = "PATH")]
        gateway_bin: Option<PathBuf>,
    },
    /// The provider edge (issue 16 §3): a customer attached over Q-in-Q to the VNet and back,
    /// at 1, 1 M and 16 M per-VM overlay entries (CPU per packet, Mpps per core, drops,
    /// latency), and the overlay table alone (needs root; see docs/performance.md).
    Edge(EdgeArgs),
    /// CPU fairness between tenants (issue 18 §4, the offloading paper's experiment): a SYN
    /// flood with the SYN-cookie program, a DNS flood with the rate limiter and IMIX without a
    /// program through one worker under overload, with cpu_fairness off, account and enforce;
    /// per-tenant CPU shares against their weighted fair shares, an idle tenant, the charge's
    /// cost, 1 against 64 tenants, a program that runs to its instruction limit (needs root
    /// and clang-14; see docs/performance.md).
    Fairness(fairness::FairArgs),
    /// What a user sees (issue 23 §1): an unmodified strongSwan site sends iperf3 TCP streams
    /// to a VM through Protego and, in the same run, through strongSwan as the responder;
    /// each gateway's CPU per byte from /proc and their ratio (needs root; see
    /// docs/performance.md).
    Site(SiteArgs),
}

/// Options of `protego bench site`.
#[derive(Debug, Clone, clap::Args)]
struct SiteArgs {
    /// Parallel TCP streams of each iperf3 run, comma-separated. Default: 1,8.
    #[arg(long, value_name = "LIST")]
    streams: Option<String>,
    /// Length of each iperf3 run, e.g. `10s` (whole seconds). Default: 10s.
    #[arg(long, value_name = "TIME")]
    duration: Option<String>,
    /// Rounds (each runs every stream count through both gateways). Default: 3.
    #[arg(long, value_name = "N")]
    rounds: Option<u32>,
    /// An extra `key = value` line for Protego's `[gateway]` table, e.g. `workers = 1`
    /// (repeatable).
    #[arg(long, value_name = "LINE")]
    gateway_option: Vec<String>,
    /// The protego binary to run as the gateway (default: this one).
    #[arg(long, value_name = "PATH")]
    gateway_bin: Option<PathBuf>,
    /// How the gateways' links deliver what they send: `veth` (the receiver's path billed to
    /// the sender, as a veth does) and/or `threaded` (in NAPI threads of their own, as behind
    /// a real NIC). Default: veth,threaded.
    #[arg(long, value_name = "LIST")]
    links: Option<String>,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

/// Options of `protego bench edge`.
#[derive(Debug, Clone, clap::Args)]
struct EdgeArgs {
    /// Per-VM entry counts, comma-separated (`K` = 1000, `M` = 2^20). Default: 1,1M,16M.
    #[arg(long, value_name = "LIST")]
    entries: Option<String>,
    /// Inner IP packet sizes in bytes, comma-separated. Default: 64,128,512,1400.
    #[arg(long, value_name = "LIST")]
    sizes: Option<String>,
    /// Directions: to-vnet (attachment -> VXLAN), to-ce (VXLAN -> attachment). Default: both.
    #[arg(long, value_name = "LIST")]
    dirs: Option<String>,
    /// Length of the maximum-rate and latency runs of each case, e.g. `2s`. Default: 1s.
    #[arg(long, value_name = "TIME")]
    duration: Option<String>,
    /// Draw the VMs from the first N entries only (default: all loaded entries).
    #[arg(long, value_name = "N")]
    active: Option<String>,
    /// Preset: 1 and 1M entries, 64 and 1400 B, 0.5 s runs; other options refine it.
    #[arg(long)]
    quick: bool,
    /// Skip the table-alone figures.
    #[arg(long)]
    no_table: bool,
    /// Give the VNet no router_mac: the gateway resolves each VM's MAC with ARP (the host
    /// answers for every VM).
    #[arg(long)]
    resolve_macs: bool,
    /// Rate of each case's equal-rate run (every case at the same load), packets per
    /// second. Default: 100000.
    #[arg(long, value_name = "PPS")]
    equal_rate: Option<f64>,
    /// Confine the gateway to PERCENT of one CPU (5..100, cgroup v1 cpu controller) from the
    /// first warm-up on, so that it is saturated at the maximum rate and takes full batches:
    /// CPU per packet then compares the table sizes at saturation (no equal-rate runs).
    #[arg(long, value_name = "PERCENT")]
    gateway_cpu: Option<u32>,
    /// Pre-built packets the load generator may hold per run, MiB. Default: 512.
    #[arg(long, value_name = "MIB")]
    pool_mb: Option<usize>,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// The protego binary to put under test (default: this one).
    #[arg(long, value_name = "PATH")]
    gateway_bin: Option<PathBuf>,
    /// Keep the run directory (configuration, gateway log at `info`).
    #[arg(long)]
    keep: bool,
}

impl EdgeArgs {
    /// The options these arguments ask for.
    fn options(&self) -> Result<bench::edge::EdgeOptions, BenchError> {
        use bench::edge::{parse_entries, EdgeDirection, EdgeOptions};
        let mut o = if self.quick {
            EdgeOptions::quick()
        } else {
            EdgeOptions::full()
        };
        if let Some(s) = &self.entries {
            o.entries = parse_list(s, parse_entries)?;
        }
        if let Some(s) = &self.sizes {
            o.sizes = parse_list(s, |v| {
                v.parse::<u16>().map_err(|_| BenchError::InvalidOption {
                    option: "--sizes",
                    value: v.to_owned(),
                    reason: "expected a size in bytes".to_owned(),
                })
            })?;
        }
        if let Some(s) = &self.dirs {
            o.directions = parse_list(s, str::parse::<EdgeDirection>)?;
        }
        if let Some(s) = &self.duration {
            o.duration = parse_duration(s)?;
        }
        if let Some(s) = &self.active {
            o.active = Some(parse_entries(s)?);
        }
        if let Some(mb) = self.pool_mb {
            o.pool_bytes = mb.saturating_mul(1 << 20);
        }
        o.table = !self.no_table;
        o.resolve_macs = self.resolve_macs;
        if let Some(r) = self.equal_rate {
            o.equal_rate = r;
        }
        o.gateway_cpu = self.gateway_cpu;
        o.protego_bin = self.gateway_bin.clone();
        o.keep = self.keep;
        o.validate()?;
        Ok(o)
    }
}

/// Runs `protego bench edge`.
fn run_edge(args: &EdgeArgs) -> ExitCode {
    let options = match args.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    run_scenario(
        "bench edge",
        args.json,
        |progress, on_start| bench::edge::run(&options, progress, on_start),
        bench::edge::render,
        |r| r.errors.is_empty(),
    )
}

/// Runs `protego bench site`.
fn run_site(args: &SiteArgs) -> ExitCode {
    let mut options = bench::site::SiteOptions {
        protego_bin: args.gateway_bin.clone(),
        gateway_options: args.gateway_option.clone(),
        ..bench::site::SiteOptions::default()
    };
    let parsed = (|| -> Result<(), BenchError> {
        if let Some(s) = &args.streams {
            options.streams = parse_list(s, |v| {
                v.trim()
                    .parse::<u32>()
                    .map_err(|_| BenchError::InvalidOption {
                        option: "--streams",
                        value: v.to_owned(),
                        reason: "a number of streams".to_owned(),
                    })
            })?;
        }
        if let Some(d) = &args.duration {
            options.duration = parse_duration(d)?;
        }
        if let Some(r) = args.rounds {
            options.rounds = r;
        }
        if let Some(l) = &args.links {
            options.links = parse_list(l, str::parse::<bench::site::Links>)?;
        }
        options.validate()
    })();
    if let Err(e) = parsed {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    run_scenario(
        "bench site",
        args.json,
        |progress, on_start| bench::site::run(&options, progress, on_start),
        bench::site::render,
        |_| true,
    )
}

/// Runs `protego bench failover`.
fn run_failover(json: bool, file_store: bool, bin: Option<PathBuf>) -> ExitCode {
    let options = bench::failover::FailoverOptions {
        protego_bin: bin,
        file_store,
    };
    run_scenario(
        "bench",
        json,
        |progress, on_start| bench::failover::run(&options, progress, on_start),
        bench::failover::render,
        |_| true,
    )
}

/// Runs a scenario that builds its own test beds (`edge`, `failover`, `site`): a Ctrl-C
/// handler that cleans the beds up once they exist, progress lines on stderr behind `prefix`, then the
/// report as JSON or text. Fails if the run fails or `ok` says the report holds errors.
fn run_scenario<R: serde::Serialize>(
    prefix: &str,
    json: bool,
    run: impl FnOnce(
        &mut dyn FnMut(&str),
        &mut dyn FnMut(testbed::CleanupHandle),
    ) -> Result<R, BenchError>,
    render: impl Fn(&R) -> String,
    ok: impl Fn(&R) -> bool,
) -> ExitCode {
    let mut handler_failed = None;
    // A scenario may build several test beds: one handler cleans up every one.
    let handles: std::sync::Arc<std::sync::Mutex<Vec<testbed::CleanupHandle>>> =
        std::sync::Arc::default();
    let mut on_start = |handle: testbed::CleanupHandle| {
        let first = match handles.lock() {
            Ok(mut h) => {
                h.push(handle);
                h.len() == 1
            }
            Err(_) => false,
        };
        if !first {
            return;
        }
        let all = std::sync::Arc::clone(&handles);
        if let Err(e) = ctrlc::set_handler(move || {
            eprintln!("\nprotego bench: interrupted, cleaning up...");
            if let Ok(h) = all.lock() {
                for p in h.iter().flat_map(|h| h.cleanup()) {
                    eprintln!("protego bench: cleanup: {p}");
                }
            }
            std::process::exit(130);
        }) {
            handler_failed = Some(e);
        }
    };
    let mut progress = |line: &str| eprintln!("{prefix}: {line}");
    let result = run(&mut progress, &mut on_start);
    if let Some(e) = handler_failed {
        eprintln!(
            "warning: no Ctrl-C handler ({e}); `make sweep` removes what an interrupted run leaves"
        );
    }
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    print_report(json, &report, render, ok)
}

/// Prints `report` as one line of JSON or as `render`'s text; success if `ok` holds.
fn print_report<R: serde::Serialize>(
    json: bool,
    report: &R,
    render: impl Fn(&R) -> String,
    ok: impl Fn(&R) -> bool,
) -> ExitCode {
    if json {
        match serde_json::to_string(report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("error: cannot format the report: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", render(report));
    }
    if ok(report) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

impl BenchArgs {
    /// The benchmark options these arguments ask for.
    fn options(&self) -> Result<Options, BenchError> {
        let mut o = if self.quick {
            Options::quick()
        } else {
            Options::full()
        };
        if let Some(s) = &self.sizes {
            o.sizes = parse_list(s, str::parse::<PacketSize>)?;
        }
        if let Some(s) = &self.ciphers {
            o.ciphers = parse_list(s, str::parse::<Cipher>)?;
        }
        if let Some(s) = &self.dirs {
            o.directions = parse_list(s, str::parse::<Direction>)?;
        }
        if let Some(s) = &self.tunnels {
            o.tunnels = parse_list(s, parse_tunnels)?;
        }
        if let Some(s) = &self.workers {
            o.workers = parse_list(s, str::parse::<WorkerCount>)?;
        }
        if let Some(s) = &self.duration {
            o.duration = parse_duration(s)?;
        }
        if let Some(mb) = self.pool_mb {
            o.pool_bytes = mb.saturating_mul(1 << 20);
        }
        if let Some(s) = &self.loads {
            o.loads = if s.trim() == "none" {
                Vec::new()
            } else {
                parse_list(s, parse_load)?
            };
        }
        if let Some(s) = &self.peers {
            o.peers = parse_list(s, str::parse::<PeerMode>)?;
        }
        o.compare_strongswan = self.compare_strongswan;
        o.skip_protego = self.strongswan_only;
        o.gateway_bin = self.gateway_bin.clone();
        o.keep = self.keep;
        o.gateway_options = self.gateway_option.clone();
        if let Some(every) = &self.scrape_every {
            o.scrape_every = Some(control::config::parse_duration(every).map_err(|reason| {
                BenchError::InvalidOption {
                    option: "--scrape-every",
                    value: every.clone(),
                    reason,
                }
            })?);
        }
        o.validate()?;
        Ok(o)
    }
}

/// Runs `protego bench`.
pub(crate) fn run(args: &BenchArgs) -> ExitCode {
    match &args.scenario {
        Some(BenchScenario::Failover {
            json,
            file_store,
            gateway_bin,
        }) => return run_failover(*json, *file_store, gateway_bin.clone()),
        Some(BenchScenario::Edge(edge)) => return run_edge(edge),
        Some(BenchScenario::Fairness(f)) => return fairness::run(f),
        Some(BenchScenario::Site(s)) => return run_site(s),
        None => {}
    }
    let options = match args.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut session = match Session::new(&options) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot set up the benchmark: {e}");
            return ExitCode::FAILURE;
        }
    };
    let handle = session.cleanup_handle();
    let flag = session.interrupt_flag();
    if let Err(e) = ctrlc::set_handler(move || {
        flag.store(true, Ordering::SeqCst);
        eprintln!("\nprotego bench: interrupted, cleaning up...");
        for p in handle.cleanup() {
            eprintln!("protego bench: cleanup: {p}");
        }
        std::process::exit(130);
    }) {
        eprintln!("error: cannot install the Ctrl-C handler: {e}");
        return ExitCode::FAILURE;
    }
    let mut progress = |line: &str| eprintln!("bench: {line}");
    let report = match session.run(&options, &mut progress) {
        Ok(r) => r,
        Err(BenchError::Interrupted) => return ExitCode::from(130),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    drop(session);
    print_report(args.json, &report, render_text, |r| r.errors.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_refine_the_presets() {
        let args = BenchArgs {
            sizes: Some("1400".into()),
            ciphers: Some("aes256gcm".into()),
            dirs: Some("in".into()),
            tunnels: Some("1".into()),
            workers: Some("1,2".into()),
            duration: Some("2s".into()),
            ..BenchArgs::default()
        };
        let o = args.options().expect("valid");
        assert_eq!(o.sizes, vec![PacketSize::Fixed(1400)]);
        assert_eq!(o.directions, vec![Direction::Inbound]);
        assert_eq!(o.workers, vec![WorkerCount::N(1), WorkerCount::N(2)]);
        assert_eq!(o.duration, std::time::Duration::from_secs(2));
        let quick = BenchArgs {
            quick: true,
            ..BenchArgs::default()
        }
        .options()
        .expect("valid");
        assert_eq!(quick.ciphers, vec![Cipher::Aes256Gcm]);
        let bad = BenchArgs {
            sizes: Some("12".into()),
            ..BenchArgs::default()
        };
        assert!(bad.options().is_err());
    }
}
