//! Tests of the status document (assembly, JSON round trip, text rendering) and of the control
//! socket protocol (server and client over a real Unix socket).

use super::*;
use crate::error::Error;
use datapath::{ChildStats, DataplaneStats};
use ike::{
    ChildSaStatus, IkeDrop, IkeSaState, IkeSaStatus, IkeSpis, IkeStats, TrafficSelector, TunnelId,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use wire::{EspSpi, IkeSpi};

fn ts(s: &str) -> TrafficSelector {
    TrafficSelector::parse(s).unwrap()
}

fn directory() -> TunnelDirectory {
    let entry = |id, name: &str, tenant: &str| TunnelEntry {
        id: TunnelId(id),
        name: name.into(),
        tenant: ids::TenantId::new(tenant).expect("tenant"),
        inside: "vnet:prod".into(),
        remote_addrs: vec!["192.0.2.2".parse().unwrap()],
        local_id: "gw.example".into(),
        remote_id: format!("{name}.example"),
    };
    TunnelDirectory(vec![
        entry(1, "hq", "acme"),
        entry(2, "branch", "acme"),
        entry(3, "dc", "globex"),
    ])
}

fn ike_sa(tunnel: u32, state: IkeSaState, children: Vec<ChildSaStatus>) -> IkeSaStatus {
    IkeSaStatus {
        tunnel: Some(TunnelId(tunnel)),
        ike: IkeSpis {
            initiator: IkeSpi(0x0123_4567_89ab_cdef),
            responder: IkeSpi(0xfedc_ba98_7654_3210),
        },
        initiator: true,
        state,
        proposal: "AES_GCM_16_256/PRF_HMAC_SHA2_256/CURVE_25519".into(),
        local: "198.51.100.1:4500".parse().unwrap(),
        remote: "192.0.2.2:4500".parse().unwrap(),
        age_secs: 125,
        rekey_in_secs: Some(3_000),
        children,
    }
}

fn child(spi_in: u32, spi_out: u32) -> ChildSaStatus {
    ChildSaStatus {
        inbound_spi: EspSpi(spi_in),
        outbound_spi: EspSpi(spi_out),
        proposal: "AES_GCM_16_256/NO_EXT_SEQ".into(),
        local_ts: vec![ts("10.2.0.0/24")],
        remote_ts: vec![ts("10.1.0.0/24"), ts("10.1.1.5[tcp/443]")],
        age_secs: 60,
        per_resource: false,
        rekey_in_secs: Some(3_200),
        expire_in_secs: Some(3_500),
    }
}

/// The engine's view behind [`sample_report`]: three tunnels (one established with a CHILD_SA,
/// one connecting, one down), an IKE SA of no tunnel, and the data path's counters.
pub(super) struct Sample {
    pub directory: TunnelDirectory,
    pub sas: Vec<IkeSaStatus>,
    pub stats: DataplaneStats,
}

impl Sample {
    /// The node-wide part of the report at uptime 3 700 s, with IKE drops counted (2
    /// `icv_failed`, 11 `truncated`).
    pub(super) fn node(&self) -> StatusReport {
        let mut node = StatusReport::node(&IkeStats::default(), &self.stats, 3_700);
        *node.ike_drops.get_mut("icv_failed").unwrap() = 2;
        *node.ike_drops.get_mut("truncated").unwrap() = 11;
        node
    }
}

pub(super) fn sample_report() -> StatusReport {
    let s = sample();
    let mut report =
        StatusReport::build(&s.directory, &s.sas, &IkeStats::default(), &s.stats, 3_700);
    report.ike_drops = s.node().ike_drops;
    report
}

pub(super) fn sample() -> Sample {
    let sas = vec![
        ike_sa(
            1,
            IkeSaState::Established,
            vec![child(0xc000_0001, 0xd000_0001)],
        ),
        ike_sa(2, IkeSaState::Connecting, vec![]),
        IkeSaStatus {
            tunnel: None,
            ..ike_sa(0, IkeSaState::Connecting, vec![])
        },
    ];
    let stats = DataplaneStats {
        children: vec![ChildStats {
            tunnel: Some(TunnelId(1)),
            inbound_spi: EspSpi(0xc000_0001),
            outbound_spi: EspSpi(0xd000_0001),
            bytes_in: 123_456,
            packets_in: 100,
            bytes_out: 654_321,
            packets_out: 200,
            drops_in: 3,
            ..ChildStats::default()
        }],
        tunnels: vec![(
            TunnelId(1),
            datapath::TunnelTraffic {
                bytes_in: 223_456,
                packets_in: 180,
                bytes_out: 754_321,
                packets_out: 290,
                drops_in: 4,
            },
        )],
        workers: vec![
            datapath::WorkerStats {
                cpu: Some(0),
                packets: 700,
                batches: 30,
                busy_ns: 0,
                spin_ns: 1_500_000,
            },
            datapath::WorkerStats {
                cpu: None,
                packets: 300,
                batches: 20,
                busy_ns: 0,
                spin_ns: 0,
            },
        ],
        drops: vec![
            ("esp_replay".into(), 3),
            ("esp_unknown_spi".into(), 0),
            ("esp_replay".into(), 1),
        ],
        relay_probes_answered: 0,
        tenants: vec![
            datapath::TenantStats {
                tenant: TenantId::new("acme").unwrap(),
                cpu_weight: 1,
                cpu_ns: 3_000_000,
                packets: 300,
                fair_drops: 0,
                tokens_ns: None,
                recent_cpu_ns: 500_000,
            },
            datapath::TenantStats {
                tenant: TenantId::new("globex").unwrap(),
                cpu_weight: 3,
                cpu_ns: 1_000_000,
                packets: 100,
                fair_drops: 7,
                tokens_ns: Some(-250_000),
                recent_cpu_ns: 1_500_000,
            },
        ],
        cpu_unattributed_ns: 500_000,
        cpu_capped_phases: 0,
        cpu_preempted_ns: 0,
        fair_kernel_drops: None,
        dispatch: None,
        xdp: vec![datapath::XdpStats {
            interface: "eth0".into(),
            attach: "native".into(),
            zero_copy: true,
            addresses: vec!["192.0.2.1:4500".parse().expect("address")],
            queues: 4,
            frames: 1234,
        }],
    };
    Sample {
        directory: directory(),
        sas,
        stats,
    }
}

#[test]
fn report_joins_engine_and_data_plane() {
    let r = sample_report();
    assert_eq!(r.version, STATUS_VERSION);
    assert_eq!(r.uptime_secs, 3_700);
    let states: Vec<TunnelState> = r.tunnels.iter().map(|t| t.state).collect();
    assert_eq!(
        states,
        [
            TunnelState::Established,
            TunnelState::Connecting,
            TunnelState::Down
        ]
    );
    let hq = &r.tunnels[0];
    assert_eq!(hq.ike_sas.len(), 1);
    let sa = &hq.ike_sas[0];
    assert_eq!(sa.spi_i, "0123456789abcdef");
    assert_eq!(sa.spi_r, "fedcba9876543210");
    assert_eq!(sa.state, "established");
    let c = &sa.children[0];
    assert_eq!(
        (c.spi_in.as_str(), c.spi_out.as_str()),
        ("c0000001", "d0000001")
    );
    assert_eq!(
        (
            c.bytes_in,
            c.packets_in,
            c.bytes_out,
            c.packets_out,
            c.drops_in
        ),
        (123_456, 100, 654_321, 200, 3)
    );
    assert_eq!(c.remote_ts, ["10.1.0.0/24", "10.1.1.5/32[tcp/443]"]);
    assert_eq!(r.unmatched_ike_sas, 1);
    assert_eq!(r.drops.get("esp_replay"), Some(&4), "same reason summed");
    assert_eq!(r.drops.get("esp_unknown_spi"), Some(&0));
    // Every IKE drop reason is listed under its stable name.
    assert_eq!(r.ike_drops.len(), IkeDrop::ALL.len());
    assert!(IkeDrop::ALL
        .iter()
        .all(|d| r.ike_drops.contains_key(d.name())));
    assert_eq!(r.ike_drops.get("icv_failed"), Some(&2));
    assert_eq!(
        r.xdp,
        [XdpStatus {
            interface: "eth0".into(),
            attach: "native".into(),
            zero_copy: true,
            addresses: vec!["192.0.2.1:4500".into()],
            queues: 4,
            frames: 1234,
        }]
    );
    assert!(render_text(&r).contains(
        "AF_XDP input on eth0 (native, zero-copy, 4 queue(s)): 192.0.2.1:4500; 1234 frames"
    ));
}

#[test]
fn established_sa_is_listed_first_during_rekey() {
    let sas = vec![
        IkeSaStatus {
            age_secs: 1,
            ..ike_sa(1, IkeSaState::Connecting, vec![])
        },
        ike_sa(1, IkeSaState::Rekeying, vec![]),
    ];
    let r = StatusReport::build(
        &directory(),
        &sas,
        &IkeStats::default(),
        &DataplaneStats::default(),
        0,
    );
    assert_eq!(r.tunnels[0].state, TunnelState::Established);
    assert_eq!(r.tunnels[0].ike_sas[0].state, "rekeying");
}

#[test]
fn json_round_trip() {
    let report = sample_report();
    let text = serde_json::to_string(&report).unwrap();
    let back: StatusReport = serde_json::from_str(&text).unwrap();
    assert_eq!(back, report);
    // The field names are the documented interface.
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["tunnels"][0]["state"], "established");
    assert_eq!(
        v["tunnels"][0]["ike_sas"][0]["children"][0]["bytes_out"],
        654_321
    );
    assert_eq!(v["tunnels"][0]["ike_sas"][0]["remote"], "192.0.2.2:4500");
    assert_eq!(v["tunnels"][2]["state"], "down");
    assert_eq!(v["ike_drops"]["truncated"], 11);
    assert_eq!(v["workers"][0]["cpu"], 0);
    assert_eq!(v["workers"][1]["packets"], 300);
    assert!(v["workers"][1]["cpu"].is_null());
    assert_eq!(v["workers"][0]["spin_ns"], 1_500_000);
    assert_eq!(v["workers"][1]["spin_ns"], 0);
    assert_eq!(v["ike_drops"]["unknown_spi"], 0);
    assert_eq!(v["tenants"][0]["tenant"], "acme");
    assert_eq!(v["tenants"][0]["cpu_ns"], 3_000_000);
    assert_eq!(v["tenants"][0]["cpu_share"], 0.75);
    // Over the last seconds globex took three quarters, whatever it took since the start.
    assert_eq!(v["tenants"][0]["recent_cpu_share"], 0.25);
    assert_eq!(v["tenants"][1]["recent_cpu_ns"], 1_500_000);
    assert_eq!(v["tenants"][1]["fair_drops"], 7);
    assert_eq!(v["tenants"][1]["tokens_ns"], -250_000);
    assert!(v["tenants"][0].get("tokens_ns").is_none());
    assert_eq!(v["cpu_unattributed_ns"], 500_000);
    // A document from a node without IKE counters still parses.
    let mut old = v.clone();
    old.as_object_mut().unwrap().remove("ike_drops");
    let back: StatusReport = serde_json::from_value(old).unwrap();
    assert!(back.ike_drops.is_empty());
}

#[test]
fn text_rendering() {
    let text = render_text(&sample_report());
    // Idle polling shows once a worker has any.
    assert!(
        text.contains("worker 0 (cpu 0): 700 packets in 30 batches, 1.5 ms polling idle\n"),
        "{text}"
    );
    assert!(
        text.contains("worker 1 (unpinned): 300 packets in 20 batches\n"),
        "{text}"
    );
    assert!(
        text.starts_with("3 tunnel(s), 1 established, uptime 1h 1m\n"),
        "{text}"
    );
    assert!(
        text.contains("hq: ESTABLISHED, tenant acme, inside vnet:prod"),
        "{text}"
    );
    assert!(
        text.contains("IKE_SA ESTABLISHED, 0123456789abcdef_i* fedcba9876543210_r"),
        "{text}"
    );
    assert!(
        text.contains("remote 'hq.example' @ 192.0.2.2[4500]"),
        "{text}"
    );
    assert!(text.contains("established 2m 5s ago"), "{text}");
    assert!(
        text.contains("CHILD_SA AES_GCM_16_256/NO_EXT_SEQ, installed 1m 0s ago"),
        "{text}"
    );
    assert!(
        text.contains("c0000001  123456      100        3"),
        "{text}"
    );
    assert!(text.contains("d0000001  654321      200"), "{text}");
    assert!(text.contains("dc: DOWN, tenant globex"), "{text}");
    assert!(text.contains("esp_replay  4"), "{text}");
    assert!(
        !text.contains("esp_unknown_spi"),
        "zero counters are not shown: {text}"
    );
    assert!(
        text.contains("ike drops:\n  icv_failed  2\n  truncated   11\n"),
        "{text}"
    );
    assert!(!text.contains("unknown_spi"), "{text}");
    assert!(
        text.contains(
            "tenant cpu:\n  acme: 25.0 % of the last 10 s (0.500 ms), weight 1; since the start \
             3.000 ms (75.0 %), 300 packets, 0 fair-share drops\n  \
             globex: 75.0 % of the last 10 s (1.500 ms), weight 3; since the start 1.000 ms \
             (25.0 %), 100 packets, 7 fair-share drops, tokens -0.250 ms\n  \
             unattributed: 0.500 ms\n"
        ),
        "{text}"
    );
    let quiet = StatusReport::build(
        &directory(),
        &[],
        &IkeStats::default(),
        &DataplaneStats::default(),
        0,
    );
    let text = render_text(&quiet);
    assert!(text.ends_with("drops: none\nike drops: none\n"), "{text}");
}

#[test]
fn traffic_selectors_in_swanctl_notation() {
    for (input, shown) in [
        ("10.1.0.0/24", "10.1.0.0/24"),
        ("10.1.0.5", "10.1.0.5/32"),
        ("10.1.0.1-10.1.0.9", "10.1.0.1..10.1.0.9"),
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("fd00::/64[udp]", "fd00::/64[udp]"),
        ("10.1.0.0/24[tcp/443]", "10.1.0.0/24[tcp/443]"),
        ("10.1.0.0/24[%any/1000-2000]", "10.1.0.0/24[any/1000-2000]"),
    ] {
        assert_eq!(format_ts(&ts(input)), shown, "{input}");
    }
}

#[test]
fn addresses_are_written_as_display_writes_them() {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut v4: Vec<std::net::Ipv4Addr> =
        ["0.0.0.0", "255.255.255.255", "10.0.9.100", "1.20.100.199"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
    v4.extend((0..2000).map(|_| std::net::Ipv4Addr::from(next() as u32)));
    for (i, ip) in v4.into_iter().enumerate() {
        let mut text = String::from("x");
        push_ip(&mut text, IpAddr::V4(ip));
        assert_eq!(text, format!("x{ip}"));
        let addr = std::net::SocketAddr::from((ip, (i * 37) as u16));
        let mut text = String::new();
        push_socket_addr(&mut text, addr);
        assert_eq!(text, addr.to_string());
    }
    for v6 in ["::", "2001:db8::1", "fe80::1:2:3:4", "::ffff:192.0.2.1"] {
        let ip: IpAddr = v6.parse().unwrap();
        let mut text = String::new();
        push_ip(&mut text, ip);
        assert_eq!(text, ip.to_string());
        let addr = std::net::SocketAddr::new(ip, 4500);
        let mut text = String::new();
        push_socket_addr(&mut text, addr);
        assert_eq!(text, addr.to_string());
    }
}

#[test]
fn request_lines() {
    assert_eq!(Request::parse_line("status\n"), Ok(Request::Status));
    assert_eq!(Request::parse_line("  ping "), Ok(Request::Ping));
    assert_eq!(
        Request::parse_line("initiate hq"),
        Ok(Request::Initiate {
            tunnel: "hq".into()
        })
    );
    assert_eq!(
        Request::parse_line(r#"{"command":"terminate","tunnel":"hq"}"#),
        Ok(Request::Terminate {
            tunnel: "hq".into()
        })
    );
    assert_eq!(
        Request::parse_line(r#"{"command":"status"}"#),
        Ok(Request::Status)
    );
    assert_eq!(
        Request::parse_line("rekey hq"),
        Ok(Request::Rekey {
            tunnel: "hq".into()
        })
    );
    assert_eq!(
        Request::parse_line("rekey-ike hq"),
        Request::parse_line(r#"{"command":"rekey_ike","tunnel":"hq"}"#)
    );
    assert!(Request::parse_line("rekey-ike")
        .unwrap_err()
        .contains("needs a tunnel name"));
    assert!(Request::parse_line("initiate")
        .unwrap_err()
        .contains("needs a tunnel name"));
    assert!(Request::parse_line("status now").is_err());
    // The distributed form's commands.
    assert_eq!(Request::parse_line("nodes"), Ok(Request::Nodes));
    assert_eq!(
        Request::parse_line("migrate hq data2"),
        Ok(Request::Migrate {
            tunnel: "hq".into(),
            to: "data2".into()
        })
    );
    assert_eq!(
        Request::parse_line(r#"{"command":"drain","node":"data1"}"#),
        Ok(Request::Drain {
            node: "data1".into()
        })
    );
    assert_eq!(
        Request::parse_line("undrain data1"),
        Ok(Request::Undrain {
            node: "data1".into()
        })
    );
    for bad in ["migrate hq", "migrate", "migrate a b c", "drain", "nodes x"] {
        assert!(Request::parse_line(bad).is_err(), "{bad}");
    }
    assert!(Request::parse_line("reboot")
        .unwrap_err()
        .contains("unknown command"));
    assert!(Request::parse_line(r#"{"command":"launch"}"#).is_err());
    assert!(
        Request::parse_line(r#"{"command":"initiate"}"#).is_err(),
        "missing tunnel"
    );
    // The client's encoding is what the server parses.
    let encoded = serde_json::to_string(&Request::Initiate {
        tunnel: "a b".into(),
    })
    .unwrap();
    assert_eq!(
        Request::parse_line(&encoded),
        Ok(Request::Initiate {
            tunnel: "a b".into()
        })
    );
}

/// A handler that answers status with the sample report and counts requests.
struct Fake(AtomicUsize);

impl RequestHandler for Fake {
    fn handle(&self, request: Request) -> Value {
        self.0.fetch_add(1, Ordering::SeqCst);
        match request {
            Request::Status => serde_json::to_value(sample_report()).unwrap(),
            Request::Ping => json!({ "ok": true }),
            Request::Initiate { tunnel }
            | Request::Terminate { tunnel }
            | Request::Rekey { tunnel }
            | Request::RekeyIke { tunnel } => {
                json!({ "error": format!("unknown tunnel {tunnel:?}") })
            }
            Request::Nodes => distributed_only("nodes"),
            Request::Capacity => distributed_only("capacity"),
            Request::Dispatch => distributed_only("dispatch"),
            Request::Migrate { .. } | Request::Drain { .. } | Request::Undrain { .. } => {
                distributed_only("moves")
            }
            Request::Apply { file, .. } => json!({ "file": file }),
            Request::RouteAdd { .. } | Request::RouteDel { .. } | Request::RouteLoad { .. } => {
                json!({ "ok": true })
            }
            Request::RotateStoreKey => json!({ "error": "no key file" }),
            Request::FilterLoad { .. }
            | Request::FilterUnload { .. }
            | Request::FilterShow { .. }
            | Request::FilterMap { .. } => json!({ "error": "no filters" }),
        }
    }
}

fn socket_path(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir()
        .join(format!(
            "protego-status-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ))
        .join(format!("{tag}.sock"))
}

#[test]
fn server_answers_and_cleans_up() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::fs::PermissionsExt;
    let path = socket_path("serve");
    let server = StatusServer::start(&path, Arc::new(Fake(AtomicUsize::new(0)))).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    assert_eq!(query_status(&path).unwrap(), sample_report());
    assert_eq!(query(&path, &Request::Ping).unwrap(), json!({ "ok": true }));
    match query(
        &path,
        &Request::Initiate {
            tunnel: "nope".into(),
        },
    ) {
        Err(Error::Protocol { reason, .. }) => assert_eq!(reason, "unknown tunnel \"nope\""),
        other => panic!("{other:?}"),
    }

    // Several requests on one connection, bare words, with garbage in between.
    let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
    stream.write_all(b"ping\n\nfrobnicate\nstatus\n").unwrap();
    let mut lines = BufReader::new(stream.try_clone().unwrap()).lines();
    assert_eq!(
        serde_json::from_str::<Value>(&lines.next().unwrap().unwrap()).unwrap(),
        json!({ "ok": true })
    );
    let err: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(err["error"].as_str().unwrap().contains("unknown command"));
    let status: StatusReport = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(status.tunnels.len(), 3);
    drop(stream);

    // A second server on the same path is refused while the first is alive.
    match StatusServer::start(&path, Arc::new(Fake(AtomicUsize::new(0)))) {
        Err(Error::Socket { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse)
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("second server started"),
    }

    server.shutdown();
    assert!(!path.exists(), "socket removed on shutdown");
    assert!(matches!(query_status(&path), Err(Error::Socket { .. })));
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn stale_socket_is_replaced_but_other_files_are_not() {
    let path = socket_path("stale");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    // A socket file nobody listens on: bind, then drop the listener.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let server = StatusServer::start(&path, Arc::new(Fake(AtomicUsize::new(0)))).unwrap();
    assert_eq!(query(&path, &Request::Ping).unwrap(), json!({ "ok": true }));
    drop(server);
    assert!(!path.exists());

    std::fs::write(&path, "not a socket").unwrap();
    assert!(matches!(
        StatusServer::start(&path, Arc::new(Fake(AtomicUsize::new(0)))),
        Err(Error::Socket { .. })
    ));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "not a socket",
        "regular file left alone"
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn oversized_request_is_refused() {
    use std::io::{BufRead, BufReader, Write};
    let path = socket_path("big");
    let server = StatusServer::start(&path, Arc::new(Fake(AtomicUsize::new(0)))).unwrap();
    let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
    let big = vec![b'a'; super::server::MAX_LINE + 1024];
    // The server may close before reading everything; ignore write errors.
    let _ = stream.write_all(&big);
    let mut line = String::new();
    let _ = BufReader::new(&stream).read_line(&mut line);
    assert!(line.contains("too long"), "{line:?}");
    drop(server);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[test]
fn store_figures_and_failure_are_shown() {
    let mut report = sample_report();
    assert!(!render_text(&report).contains("store:"));
    report.store = Some(crate::runtime::StoreStats {
        backend: "file /var/lib/protego/state.redb".into(),
        commits: 12,
        failures: 3,
        records_written: 14,
        commit_us_p50: 1_250,
        commit_us_p99: 8_000,
        commit_latency: crate::runtime::CommitLatency::default(),
        held: 2,
        error: Some("disk full".into()),
        encryption: None,
    });
    let text = render_text(&report);
    assert!(
        text.contains("store: file /var/lib/protego/state.redb, 12 commits (14 records), commit p50 1.2 ms, p99 8.0 ms, 3 failures"),
        "{text}"
    );
    assert!(
        text.contains("FAILING: disk full; 2 IKE datagrams held"),
        "{text}"
    );
    // The JSON document carries the same figures.
    let json: Value = serde_json::to_value(&report).unwrap();
    assert_eq!(json["store"]["commit_us_p99"], 8_000);
    let back: StatusReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, report);
}

#[test]
fn store_encryption_and_its_progress_are_shown() {
    let mut report = sample_report();
    let mut stats = crate::runtime::StoreStats {
        backend: "etcd http://127.0.0.1:2379 prefix /protego".into(),
        ..Default::default()
    };
    stats.encryption = Some(crate::store::EncryptionStatus::default());
    report.store = Some(stats.clone());
    let text = render_text(&report);
    assert!(text.contains("encryption: OFF"), "{text}");
    stats.encryption = Some(crate::store::EncryptionStatus {
        key_file: Some("/etc/protego/store.keys".into()),
        current_key: Some(2),
        keys: vec![1, 2],
        records: [("1".to_owned(), 30), ("2".to_owned(), 12)].into(),
        reencrypt_pending: 30,
        reencrypted: 11,
        accept_cleartext: false,
        error: Some("state store etcd: commit failed".into()),
    });
    report.store = Some(stats);
    let text = render_text(&report);
    assert!(
        text.contains(
            "encryption: AES-256-GCM-SIV, key file /etc/protego/store.keys, current key 2; \
             30 under key 1, 12 under key 2"
        ) && text.contains("re-encrypting: 30 records left (11 done)")
            && text.contains("re-encryption FAILING: state store etcd: commit failed"),
        "{text}"
    );
    let json: Value = serde_json::to_value(&report).unwrap();
    assert_eq!(json["store"]["encryption"]["current_key"], 2);
    assert_eq!(json["store"]["encryption"]["records"]["1"], 30);
    // A document from a node without this field still reads.
    let mut old = json.clone();
    old["store"].as_object_mut().unwrap().remove("encryption");
    let back: StatusReport = serde_json::from_value(old).unwrap();
    assert!(back.store.unwrap().encryption.is_none());
}

#[test]
fn route_requests_parse_from_words_and_json() {
    assert_eq!(
        Request::parse_line("route add acme prod 10.0.0.5 192.0.2.10"),
        Ok(Request::RouteAdd {
            tenant: "acme".into(),
            vnet: "prod".into(),
            address: "10.0.0.5".into(),
            host: "192.0.2.10".into(),
        })
    );
    assert_eq!(
        Request::parse_line("route del acme prod fd00::5"),
        Ok(Request::RouteDel {
            tenant: "acme".into(),
            vnet: "prod".into(),
            address: "fd00::5".into(),
        })
    );
    assert_eq!(
        Request::parse_line(r#"{"command":"route_load","file":"/tmp/r.csv"}"#),
        Ok(Request::RouteLoad {
            file: "/tmp/r.csv".into()
        })
    );
    for (bad, says) in [
        ("route add acme prod 10.0.0.5", "TENANT VNET ADDRESS HOST"),
        ("route del acme prod", "TENANT VNET ADDRESS"),
        ("route load", "one FILE"),
        ("route move a b", "route needs"),
    ] {
        let e = Request::parse_line(bad).expect_err(bad);
        assert!(e.contains(says), "{bad}: {e}");
    }
}

#[test]
fn route_fields_are_checked_and_named() {
    let r = crate::status::vm_route("acme", "prod", "10.0.0.5", Some("192.0.2.10")).expect("valid");
    assert_eq!(
        (r.address.to_string(), r.host.to_string()),
        ("10.0.0.5".into(), "192.0.2.10".into())
    );
    for (t, v, a, h, field) in [
        (
            "ac me",
            "prod",
            "10.0.0.5",
            Some("192.0.2.10"),
            "field tenant",
        ),
        ("acme", "", "10.0.0.5", Some("192.0.2.10"), "field vnet"),
        (
            "acme",
            "prod",
            "10.0.0",
            Some("192.0.2.10"),
            "field address",
        ),
        ("acme", "prod", "10.0.0.5", Some("host"), "field host"),
    ] {
        let e = crate::status::vm_route(t, v, a, h).expect_err(field);
        assert!(e.starts_with(field), "{e}");
    }
}

/// `route load` reads a regular file up to a limit, and says why it reads no other.
#[test]
fn a_route_file_is_read_up_to_its_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("routes.csv");
    std::fs::write(&file, "acme,prod,10.0.0.5,192.0.2.1\n").expect("file");
    let text = read_route_file(&file, 29).expect("at the limit");
    assert_eq!(text.len(), 29);
    let e = read_route_file(&file, 28).expect_err("past the limit");
    assert!(e.to_string().contains("29 bytes is more than"), "{e}");
    let e = read_route_file(dir.path(), 1 << 20).expect_err("a directory");
    assert!(e.to_string().contains("not a regular file"), "{e}");
    let e = read_route_file(Path::new("/dev/zero"), 1 << 20).expect_err("a device");
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

#[test]
fn a_route_answer_names_the_data_nodes_only_in_a_cluster() {
    let mut r = datapath::RouteChangeReport {
        added: 1,
        ..Default::default()
    };
    let alone = route_answer(&r, std::time::Duration::from_micros(5));
    assert_eq!(alone["added"], 1);
    assert!(alone.get("nodes").is_none());
    r.nodes = Some(datapath::RouteFanout {
        applied: 2,
        fetching: 1,
        failed: 0,
    });
    let cluster = route_answer(&r, std::time::Duration::from_micros(5));
    assert_eq!(
        cluster["nodes"],
        json!({"applied": 2, "fetching": 1, "failed": 0})
    );
}
