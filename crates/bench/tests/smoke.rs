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
