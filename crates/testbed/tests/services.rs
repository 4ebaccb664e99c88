//! The test bed's service helpers against the real programs: etcd in a
//! namespace, iperf3 and ping over a plain veth link, leftovers swept.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use protego_testbed::etcd::Etcd;
use protego_testbed::traffic::{self, IperfOptions, PingOptions};
use protego_testbed::{Cmd, Result, Testbed};

#[test]
fn etcd_starts_in_a_namespace() -> Result<()> {
    let bed = Testbed::new()?;
    let ns = bed.netns("store")?;
    let addr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let etcd = Etcd::start(&ns, "s1", addr, 2379)?;
    assert_eq!(etcd.client_url, "http://127.0.0.1:2379");
    // The v3 gRPC gateway answers plain HTTP: put and read back a key.
    let put = r#"{"key":"cHJvdGVnbw==","value":"b2s="}"#;
    let out = ns.exec(Cmd::new("bash").args([
        "-c",
        &format!(
            "exec 3<>/dev/tcp/127.0.0.1/2379; printf 'POST /v3/kv/put HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: {}\\r\\nConnection: close\\r\\n\\r\\n%s' '{put}' >&3; cat <&3",
            put.len()
        ),
    ]))?;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    etcd.process.check_running()?;
    bed.teardown()
}

#[test]
fn veth_ping_and_iperf3_udp() -> Result<()> {
    let bed = Testbed::new()?;
    let a = bed.netns("a")?;
    let b = bed.netns("b")?;
    let link = a.veth_to(&b)?;
    a.add_addr(&link.local, "192.0.2.1/24".parse()?)?;
    b.add_addr(&link.peer, "192.0.2.2/24".parse()?)?;
    a.add_addr(&link.local, "2001:db8::1/64".parse()?)?;
    b.add_addr(&link.peer, "2001:db8::2/64".parse()?)?;
    let dst: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));

    let stats = traffic::ping(&a, dst, &PingOptions::new(100, Duration::from_millis(10)))?;
    assert!(stats.all_received(), "{stats:?}");
    let v6 = traffic::ping(
        &a,
        "2001:db8::2"
            .parse()
            .map_err(|_| protego_testbed::Error::InvalidSpec {
                field: "test".into(),
                reason: "bad literal".into(),
            })?,
        &PingOptions::new(10, Duration::from_millis(10)),
    )?;
    assert!(v6.all_received(), "{v6:?}");

    // Unreachable destination: loss is reported, not an error.
    let lost = traffic::ping(
        &a,
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 99)),
        &PingOptions {
            reply_timeout: Duration::from_millis(200),
            ..PingOptions::new(3, Duration::from_millis(10))
        },
    )?;
    assert_eq!(lost.received, 0, "{lost:?}");

    let server = traffic::iperf3_server(&b, dst, 5299)?;
    let mut opts = IperfOptions::tcp(Duration::from_secs(1));
    opts.port = 5299;
    opts.udp_bitrate = Some(20_000_000);
    let r = traffic::iperf3_client(&a, dst, &opts)?;
    assert!(r.lost_percent.is_some(), "{r:?}");
    assert!(r.received_bps > 1e6, "{r:?}");
    server.process.stop();
    assert!(!server.process.is_running());
    bed.teardown()
}
