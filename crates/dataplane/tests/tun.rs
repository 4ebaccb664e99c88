//! The TUN inside interface with a real TUN device in a private network namespace: the test
//! thread unshares its network namespace (so the device, addresses and routes vanish with it),
//! starts the data plane there, and sends UDP through the kernel both ways.
//!
//! Needs CAP_SYS_ADMIN and CAP_NET_ADMIN; without them it prints why and passes vacuously
//! (listed in the report of skipped cases).

#[path = "../src/testutil.rs"]
mod testutil;

use protego_dataplane::{DataPath, Dataplane, DataplaneConfig, Inside, TunnelBinding};
use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;
use testutil::{child, ip, ts, udp4, Peer};
use wire::ip::Ipv4Packet;

fn sh(args: &[&str]) {
    let st = Command::new(args[0])
        .args(&args[1..])
        .status()
        .expect("run command");
    assert!(st.success(), "{args:?} failed");
}

fn in_private_netns() {
    // SAFETY: unshare(2) affects only the calling thread's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!(
            "SKIP tun_round_trip: cannot create a network namespace: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    sh(&["ip", "link", "set", "lo", "up"]);
    let cfg = DataplaneConfig {
        listen: vec![ip("127.0.0.1")],
        ike_port: 0,
        natt_port: 0,
        vxlan_port: 4789,
        vnets: vec![],
        tunnels: vec![TunnelBinding {
            tunnel: ike::TunnelId(7),
            name: "lan".into(),
            tenant: "site".into(),
            inside: Inside::Tun,
        }],
        tun_name: Some("ptun0".into()),
        batch: 16,
    };
    let (tx, _rx) = crossbeam_channel::unbounded();
    let dp = Dataplane::start(cfg, tx).expect("start with TUN");
    sh(&["ip", "addr", "add", "10.9.0.1/24", "dev", "ptun0"]);
    sh(&["ip", "route", "add", "10.8.0.0/24", "dev", "ptun0"]);
    let peer = UdpSocket::bind("127.0.0.1:0").expect("peer");
    peer.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let natt = dp.local_addrs().natt[0];
    let c = child(
        7,
        0x3001,
        0x4001,
        natt,
        peer.local_addr().expect("addr"),
        ts("10.9.0.0", "10.9.0.255"),
        ts("10.8.0.0", "10.8.0.255"),
    );
    dp.install_child(&c).expect("install");
    let p = Peer::of(&c);

    // LAN -> peer: the kernel routes into the TUN, the data plane seals.
    let app = UdpSocket::bind("10.9.0.1:7000").expect("app socket");
    app.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    app.send_to(b"ping", "10.8.0.7:9000").expect("send");
    let mut buf = vec![0u8; 2048];
    let (n, from) = peer.recv_from(&mut buf).expect("ESP from the data plane");
    assert_eq!(from, natt);
    let inner = p.open(&buf[..n]).expect("peer opens");
    let v4 = Ipv4Packet::new_checked(&inner[..]).expect("ipv4");
    assert_eq!(
        (v4.src_addr().to_string(), v4.dst_addr().to_string()),
        ("10.9.0.1".into(), "10.8.0.7".into())
    );
    assert_eq!(&inner[28..], b"ping");

    // Peer -> LAN: decrypted and written to the TUN, the kernel delivers to the app.
    let reply = udp4("10.8.0.7", 9000, "10.9.0.1", 7000, 64, b"pong");
    peer.send_to(&p.seal(&reply), natt).expect("send esp");
    let (n, from) = app.recv_from(&mut buf).expect("reply through the TUN");
    assert_eq!(
        (&buf[..n], from.to_string()),
        (&b"pong"[..], "10.8.0.7:9000".to_string())
    );

    // A packet to a destination no CHILD_SA covers is dropped and counted.
    sh(&["ip", "route", "add", "10.8.1.0/24", "dev", "ptun0"]);
    app.send_to(b"nowhere", "10.8.1.7:9000").expect("send");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let st = dp.stats();
        if st
            .drops
            .iter()
            .any(|(n, v)| n == "tun_no_tunnel" && *v >= 1)
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{st:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    dp.shutdown();
}

#[test]
fn tun_round_trip() {
    // A fresh thread: the namespace change stays with it and disappears when it ends.
    std::thread::spawn(in_private_netns)
        .join()
        .expect("test thread");
}
