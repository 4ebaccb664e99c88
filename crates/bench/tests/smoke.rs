//! End-to-end smoke test of `protego bench`: the smallest case (one tunnel negotiated over
//! IKEv2, RFC 7296, with the real `protego up`; 1400-byte packets; AES-256-GCM ESP in UDP,
//! RFC 4106/RFC 3948; inbound and outbound; one worker) runs in network namespaces, packets are
//! delivered both ways and the JSON report has every field. Timings are never asserted: this
//! is a benchmark's plumbing test, not a benchmark.
//!
//! Needs root and the workspace's `protego` binary of the same profile (`make test` builds it;
//! by hand: `cargo build -p protego`).

use std::time::Duration;

use protego_bench::{Cipher, Direction, Options, PacketSize, Session, WorkerCount};

#[test]
fn smallest_case_end_to_end() {
    let bin = testbed::workspace_bin("protego").expect("the protego binary is built");
    let options = Options {
        sizes: vec![PacketSize::Fixed(1400)],
        ciphers: vec![Cipher::Aes256Gcm],
        directions: vec![Direction::Inbound, Direction::Outbound],
        tunnels: vec![1],
        workers: vec![WorkerCount::N(1)],
        duration: Duration::from_millis(300),
        pool_bytes: 64 << 20,
        gateway_bin: Some(bin),
        ..Options::quick()
    };
    let mut session = Session::new(&options).expect("test bed and load generator");
    let report = session
        .run(&options, &mut |line| eprintln!("bench: {line}"))
        .expect("the benchmark runs");
    drop(session);
    assert!(report.errors.is_empty(), "errors: {:?}", report.errors);
    assert_eq!(report.cases.len(), 2, "one case per direction");
    for c in &report.cases {
        assert_eq!(c.gateway, "protego");
        assert_eq!((c.tunnels, c.workers), (1, Some(1)));
        for (name, run) in [("max", &c.max_rate), ("half", &c.half_rate)] {
            assert!(run.sent > 0, "{} {name}: nothing sent", c.direction);
            assert!(
                run.delivered > 0,
                "{} {name}: nothing delivered of {}",
                c.direction,
                run.sent
            );
            assert!(
                run.cpu_s > 0.0,
                "{} {name}: no gateway CPU time",
                c.direction
            );
        }
        let lat = c.latency_us.expect("latency samples at half rate");
        assert!(lat.samples > 0);
        // The offered loads (100, 50, 10 %), by a batching and by a single-datagram peer.
        let runs: Vec<(&str, u32)> = c
            .at_load
            .iter()
            .map(|l| (l.peer.as_str(), l.load_pct))
            .collect();
        assert_eq!(
            runs,
            [
                ("batching", 100),
                ("batching", 50),
                ("batching", 10),
                ("single", 100),
                ("single", 50),
                ("single", 10)
            ],
            "{} load runs",
            c.direction
        );
        for l in &c.at_load {
            assert!(
                l.run.delivered > 0 && l.run.cpu_s > 0.0 && l.run.cpu_ns_per_packet > 0.0,
                "{} {} {}%: {:?}",
                c.direction,
                l.peer,
                l.load_pct,
                l.run
            );
        }
        // The 10 % runs were offered a tenth of what the maximum-rate run delivered.
        let tenth = c.max_rate.mpps * 1e6 / 10.0;
        for l in c.at_load.iter().filter(|l| l.load_pct == 10) {
            assert!(
                (l.run.offered_pps - tenth).abs() <= tenth * 1e-6,
                "{} {}: offered {} for a tenth of {}",
                c.direction,
                l.peer,
                l.run.offered_pps,
                c.max_rate.mpps
            );
        }
    }
    let json = serde_json::to_value(&report).expect("the report serialises");
    for key in [
        "version",
        "machine",
        "settings",
        "crypto_only",
        "baseline_latency_us",
        "cases",
        "targets",
        "errors",
    ] {
        assert!(json.get(key).is_some(), "report lacks `{key}`");
    }
    let directions: Vec<&str> = json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| c["direction"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(directions, ["inbound", "outbound"]);
    for case in json["cases"].as_array().expect("cases") {
        for key in [
            "gbps",
            "mpps",
            "cpu_ns_per_byte",
            "cpu_ns_per_packet",
            "drops",
            "latency_us",
            "workers",
            "tunnels",
            "cipher",
            "size",
            "crypto_fraction",
            "worker_share",
            "at_load",
        ] {
            assert!(case.get(key).is_some(), "case lacks `{key}`: {case}");
        }
        for p in ["p50", "p99", "p999"] {
            assert!(case["latency_us"][p].is_number(), "latency_us.{p}: {case}");
        }
        assert!(case["drops"]["lost"].is_u64());
    }
    assert!(json["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .any(|t| t["name"] == "cpu_per_byte" && t["value"].is_number()));
}

/// `protego bench site` end to end, as short as it goes: a strongSwan site's iperf3 stream
/// through Protego and through strongSwan, each with plain and threaded links. Checks the
/// plumbing (both gateways carried the stream, their CPU was read, the report is whole), never
/// a figure.
#[test]
fn site_runs_both_gateways_over_both_link_modes() {
    use protego_bench::site::{self, Links, SiteOptions};
    let options = SiteOptions {
        protego_bin: Some(testbed::workspace_bin("protego").expect("the protego binary is built")),
        streams: vec![1],
        duration: Duration::from_secs(2),
        rounds: 1,
        gateway_options: Vec::new(),
        links: vec![Links::Veth, Links::Threaded],
    };
    let report = site::run(
        &options,
        &mut |line| eprintln!("bench site: {line}"),
        &mut |_| {},
    )
    .expect("the site benchmark runs");
    let runs: Vec<(&str, &str)> = report
        .runs
        .iter()
        .map(|r| (r.gateway.as_str(), r.links.as_str()))
        .collect();
    assert_eq!(
        runs,
        [
            ("protego", "veth"),
            ("strongswan", "veth"),
            ("protego", "threaded"),
            ("strongswan", "threaded")
        ]
    );
    for r in &report.runs {
        assert!(
            r.bytes > 0 && r.gateway_cpu_s > 0.0 && r.cpu_ns_per_byte > 0.0,
            "{r:?}"
        );
    }
    assert_eq!(report.comparison.len(), 2, "one row per link mode");
    assert!(report.comparison.iter().all(|c| c.ratio[0] > 0.0));
    let names: Vec<&str> = report.targets.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "site_cpu_per_byte_veth",
            "site_vs_strongswan_veth",
            "site_cpu_per_byte_threaded",
            "site_vs_strongswan_threaded"
        ]
    );
    let text = site::render(&report);
    assert!(
        text.contains("threaded") && text.contains("targets:"),
        "{text}"
    );
}
