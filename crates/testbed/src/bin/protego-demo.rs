//! `protego-demo`: builds the demo topology in network namespaces — two tenants,
//! each with an on-prem site running strongSwan (one of them behind NAT), the
//! gateway namespace, two cloud hosts with kernel VXLAN (RFC 7348) and VMs of
//! both tenants — starts the gateway, brings the IKEv2 tunnels (RFC 7296, ESP
//! in UDP per RFC 3948) up, pings every VM from its tenant's site, runs a 3 s
//! iperf3 per tenant, prints a summary table, and removes everything on exit,
//! on failure and on Ctrl-C.
//!
//! Usage: `protego-demo [--iperf-seconds N] [--keep] [--sweep]` (as root; `make demo`).

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::strongswan::{Charon, CharonSettings, SwanctlConfig};
use protego_testbed::topology::{SiteSpec, TenantSpec, VmSpec};
use protego_testbed::traffic::{self, IperfOptions, PingOptions};
use protego_testbed::{Result, Testbed, Topology, TopologySpec};

/// The pre-shared key of every demo tunnel.
const PSK: &str = "protego-demo-psk";
/// Set by the Ctrl-C handler; the main thread then stays quiet and exits 130.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Time limit for one tunnel to come up.
const TUNNEL_TIMEOUT: Duration = Duration::from_secs(20);

struct Options {
    iperf_seconds: u64,
    keep: bool,
    sweep_only: bool,
}

fn parse_args() -> std::result::Result<Options, String> {
    let mut opts = Options {
        iperf_seconds: 3,
        keep: false,
        sweep_only: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--iperf-seconds" => {
                let v = args.next().ok_or("--iperf-seconds needs a value")?;
                opts.iperf_seconds = v
                    .parse()
                    .ok()
                    .filter(|&n| (1..=600).contains(&n))
                    .ok_or_else(|| format!("--iperf-seconds: `{v}` is not within 1..=600"))?;
            }
            "--keep" => opts.keep = true,
            "--sweep" => opts.sweep_only = true,
            "-h" | "--help" => {
                return Err(
                    "usage: protego-demo [--iperf-seconds N] [--keep] [--sweep]\n\
                     Builds the demo topology in network namespaces (needs root),\n\
                     runs ping and iperf3 through the gateway, prints a summary and\n\
                     removes everything again. --keep keeps logs and configs;\n\
                     --sweep only removes leftovers of killed test-bed runs."
                        .to_owned(),
                )
            }
            other => return Err(format!("unknown argument `{other}` (try --help)")),
        }
    }
    Ok(opts)
}

fn main() -> ExitCode {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    if opts.sweep_only {
        let report = protego_testbed::sweep();
        if report.is_empty() {
            println!("protego-demo: nothing to sweep");
        }
        return ExitCode::SUCCESS;
    }
    let bed = match Testbed::new() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("protego-demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    if opts.keep {
        bed.keep_files(true);
    }
    let handle = bed.cleanup_handle();
    if let Err(e) = ctrlc::set_handler(move || {
        INTERRUPTED.store(true, Ordering::SeqCst);
        eprintln!("\nprotego-demo: interrupted, cleaning up...");
        for p in handle.cleanup() {
            eprintln!("protego-demo: cleanup: {p}");
        }
        std::process::exit(130);
    }) {
        eprintln!("protego-demo: cannot install the Ctrl-C handler: {e}");
        return ExitCode::FAILURE;
    }
    println!(
        "protego-demo: run {} (files in {})",
        bed.run_id(),
        bed.dir().display()
    );
    let outcome = run(&bed, &opts);
    if INTERRUPTED.load(Ordering::SeqCst) {
        // The handler is tearing down; wait for it (teardown serializes), then
        // leave with the conventional status for SIGINT.
        let _ = bed.teardown();
        return ExitCode::from(130);
    }
    let code = match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("protego-demo: some checks failed (see the table)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("protego-demo: error: {e}");
            ExitCode::FAILURE
        }
    };
    match bed.teardown() {
        Ok(()) => println!("protego-demo: cleaned up"),
        Err(e) => eprintln!("protego-demo: {e}"),
    }
    code
}

/// The demo's topology: tenant `blue` with a directly reachable site, tenant
/// `red` with a site behind NAT; both have one VM on each of two cloud hosts.
fn demo_spec() -> Result<TopologySpec> {
    Ok(TopologySpec {
        tenants: vec![
            TenantSpec {
                name: "blue".into(),
                vni: 100,
                vnet: "10.2.0.0/24".parse()?,
                vnet6: None,
                vms: vec![VmSpec { host: 0 }, VmSpec { host: 1 }],
                sites: vec![SiteSpec {
                    lan: "10.1.0.0/24".parse()?,
                    lan6: None,
                    behind_nat: false,
                }],
            },
            TenantSpec {
                name: "red".into(),
                vni: 200,
                vnet: "10.4.0.0/24".parse()?,
                vnet6: None,
                vms: vec![VmSpec { host: 0 }, VmSpec { host: 1 }],
                sites: vec![SiteSpec {
                    lan: "10.3.0.0/24".parse()?,
                    lan6: None,
                    behind_nat: true,
                }],
            },
        ],
        hosts: 2,
        ..TopologySpec::default()
    })
}

/// Starts `protego up` in `topo.gateway.ns` with one tunnel per site (the gateway side of
/// each standard site connection) and one VNet per tenant, delivered over VXLAN to the hosts'
/// unmodified kernel VXLAN devices.
fn start_gateway(
    bed: &Testbed,
    topo: &Topology,
    tunnels: &[GatewayTunnel],
) -> Result<ProtegoGateway> {
    ProtegoGateway::start(bed, topo, tunnels, &[])
}

/// One line of the summary table.
struct Row {
    tenant: String,
    from: String,
    to: String,
    check: String,
    result: String,
    ok: bool,
}

fn run(bed: &Testbed, opts: &Options) -> Result<bool> {
    let started = Instant::now();
    let topo = Topology::build(bed, demo_spec()?)?;
    println!(
        "protego-demo: topology up: {} sites, gateway VIP {}, {} cloud hosts, {} VMs ({:.1} s)",
        topo.sites.len(),
        topo.gateway.wan.addr,
        topo.hosts.len(),
        topo.vms().count(),
        started.elapsed().as_secs_f64()
    );

    // Each site's strongSwan, and the gateway's side of every connection.
    let mut site_charons = Vec::new();
    let mut tunnels = Vec::new();
    for (k, site) in topo.sites.iter().enumerate() {
        let tunnel = GatewayTunnel::for_site(&topo, k, PSK);
        let (mut site_conn, _) = topo.site_connections(k, PSK);
        tunnel.apply_to_site(&mut site_conn);
        let label = format!("site-{}-{}", topo.tenants[site.tenant].name, site.index);
        let charon = Charon::start(&site.ns, &label, &CharonSettings::default())?;
        charon.load(&SwanctlConfig::new(vec![site_conn]))?;
        site_charons.push(charon);
        tunnels.push(tunnel);
    }
    let gateway = start_gateway(bed, &topo, &tunnels)?;
    println!(
        "protego-demo: gateway: protego up (pid {}), config {}",
        gateway.process().pid(),
        gateway.config_path().display()
    );

    let mut rows = Vec::new();
    for (k, site) in topo.sites.iter().enumerate() {
        let tenant = &topo.tenants[site.tenant];
        let charon = &site_charons[k];
        let t0 = Instant::now();
        let up = charon
            .initiate("net", TUNNEL_TIMEOUT)
            .and_then(|()| charon.wait_child_installed("net", TUNNEL_TIMEOUT));
        let nat = if site.nat.is_some() {
            " (behind NAT)"
        } else {
            ""
        };
        rows.push(Row {
            tenant: tenant.name.clone(),
            from: format!("site{}{nat}", site.index),
            to: format!("gateway {}", topo.gateway.wan.addr),
            check: "IKE + CHILD_SA".into(),
            result: match &up {
                Ok(c) => format!(
                    "up in {:.2} s, SPIs in={} out={}",
                    t0.elapsed().as_secs_f64(),
                    c.spi_in,
                    c.spi_out
                ),
                Err(e) => format!("FAILED: {e}"),
            },
            ok: up.is_ok(),
        });
    }
    gateway.process().check_running()?;

    // Ping every VM of the tenant from the site's LAN address: 100 pings at 100 Hz.
    for site in &topo.sites {
        let tenant = &topo.tenants[site.tenant];
        for vm in &tenant.vms {
            let stats = traffic::ping(
                &site.ns,
                vm.addr.addr,
                &PingOptions::new(100, Duration::from_millis(10)).from(site.lan_addr),
            );
            rows.push(Row {
                tenant: tenant.name.clone(),
                from: format!("site{} {}", site.index, site.lan_addr),
                to: format!("vm on host{} {}", vm.host, vm.addr.addr),
                check: "ping 100 @ 100 Hz".into(),
                result: match &stats {
                    Ok(s) => format!(
                        "{}/{} received, {} lost{}",
                        s.received,
                        s.transmitted,
                        s.lost(),
                        s.rtt_avg
                            .map(|r| format!(", rtt {:.2} ms", r.as_secs_f64() * 1e3))
                            .unwrap_or_default()
                    ),
                    Err(e) => format!("FAILED: {e}"),
                },
                ok: stats.as_ref().is_ok_and(|s| s.all_received()),
            });
        }
    }

    // iperf3 per tenant: site -> first VM.
    for site in &topo.sites {
        let tenant = &topo.tenants[site.tenant];
        let Some(vm) = tenant.vms.first() else {
            continue;
        };
        let result = iperf(&site.ns, site.lan_addr, vm, opts.iperf_seconds);
        rows.push(Row {
            tenant: tenant.name.clone(),
            from: format!("site{} {}", site.index, site.lan_addr),
            to: format!("vm on host{} {}", vm.host, vm.addr.addr),
            check: format!("iperf3 TCP {} s", opts.iperf_seconds),
            result: match &result {
                Ok(bps) => format!("{:.0} Mbit/s", bps / 1e6),
                Err(e) => format!("FAILED: {e}"),
            },
            ok: result.is_ok(),
        });
    }

    if !INTERRUPTED.load(Ordering::SeqCst) {
        match gateway.status_text() {
            Ok(text) => println!("\n$ protego status\n{text}"),
            Err(e) => println!("\nprotego status failed: {e}"),
        }
        print_table(&rows);
    }
    Ok(rows.iter().all(|r| r.ok))
}

fn iperf(
    site: &protego_testbed::Netns,
    from: IpAddr,
    vm: &protego_testbed::topology::Vm,
    seconds: u64,
) -> Result<f64> {
    let server = traffic::iperf3_server(&vm.ns, vm.addr.addr, traffic::IPERF3_PORT)?;
    let mut o = IperfOptions::tcp(Duration::from_secs(seconds));
    o.bind = Some(from);
    let r = traffic::iperf3_client(site, vm.addr.addr, &o);
    server.process.stop();
    Ok(r?.received_bps)
}

fn print_table(rows: &[Row]) {
    let headers = ["tenant", "from", "to", "check", "result", ""];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.tenant.clone(),
                r.from.clone(),
                r.to.clone(),
                r.check.clone(),
                r.result.clone(),
                if r.ok { "ok".into() } else { "FAIL".into() },
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(c.chars().count()).min(90);
        }
    }
    let line = |cols: &[String]| {
        let parts: Vec<String> = cols
            .iter()
            .zip(widths.iter())
            .map(|(c, &w)| format!("{c:<w$}"))
            .collect();
        println!("| {} |", parts.join(" | "));
    };
    let sep: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
    println!();
    line(&headers.map(str::to_owned));
    println!("|-{}-|", sep.join("-|-"));
    for row in &cells {
        line(row);
    }
    println!();
}
