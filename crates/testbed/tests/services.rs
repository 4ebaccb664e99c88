//! The test bed's service helpers against the real programs: etcd with TLS and users in a
//! namespace, iperf3 and ping over a plain veth link, leftovers swept.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use protego_testbed::etcd::{Etcd, EtcdPki};
use protego_testbed::traffic::{self, IperfOptions, PingOptions};
use protego_testbed::{workspace_bin, Cmd, Result, Testbed};

/// etcd as the cluster tests run it: TLS with client certificates required, authentication
/// on, and a user whose role reaches its prefix only. A client without a certificate, or with
/// a wrong password, gets nothing; the user cannot read outside its prefix.
#[test]
fn etcd_starts_in_a_namespace_with_tls_and_users() -> Result<()> {
    let bed = Testbed::new()?;
    let ns = bed.netns("store")?;
    let addr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let bin = workspace_bin("protego")?;
    let pki = EtcdPki::create(&bin, &bed.dir().join("etcd-pki"), addr, &["node"])?;
    let mut etcd = Etcd::start(&ns, "s1", addr, 2379, &pki)?;
    assert_eq!(etcd.client_url, "https://127.0.0.1:2379");
    etcd.etcdctl(&["put", "/outside", "secret"])?;
    etcd.enable_auth(&[("protego", "/protego/s1/")])?;

    let password = pki.password_file("protego");
    let user = Some(("protego", password.as_path()));
    etcd.etcdctl_as(user, "node", &["put", "/protego/s1/k", "v"])?;
    let read = etcd.etcdctl_as(user, "node", &["get", "/protego/s1/k"])?;
    assert_eq!(read, "/protego/s1/k\nv\n");
    let outside = etcd.etcdctl_as(user, "node", &["get", "/outside"]);
    assert!(
        outside
            .as_ref()
            .is_err_and(|e| e.to_string().contains("permission denied")),
        "{outside:?}"
    );
    // A wrong password.
    let wrong = bed.dir().join("wrong.password");
    std::fs::write(&wrong, "wrong\n").map_err(|e| io_error(&wrong, e))?;
    let refused = etcd.etcdctl_as(Some(("protego", &wrong)), "node", &["get", "/protego/s1/k"]);
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("authentication failed")),
        "{refused:?}"
    );
    // The certificate without the user: its CN is no etcd user.
    assert!(etcd
        .etcdctl_as(None, "node", &["get", "/protego/s1/k"])
        .is_err());
    // No client certificate at all: the TLS handshake is refused.
    let no_cert = ns.exec_output(Cmd::new("etcdctl").args([
        "--endpoints=https://127.0.0.1:2379".to_owned(),
        format!("--cacert={}", pki.ca().display()),
        "--dial-timeout=2s".to_owned(),
        "get".to_owned(),
        "/protego/s1/k".to_owned(),
    ]))?;
    assert!(!no_cert.success(), "{no_cert:?}");
    assert!(!no_cert.stdout.contains("/protego/s1/k"), "{no_cert:?}");
    etcd.process.check_running()?;
    bed.teardown()
}

fn io_error(path: &std::path::Path, e: std::io::Error) -> protego_testbed::Error {
    protego_testbed::Error::Io {
        action: "write",
        path: path.to_owned(),
        source: e,
    }
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
