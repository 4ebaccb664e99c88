//! Interoperation with an unmodified Linux VXLAN host (RFC 7348): in private network
//! namespaces, a host with a kernel `vxlan` device (dstport 4789) and a bridge, and a VM behind
//! it that has only an address and a default route via the gateway. The VM's UDP datagram
//! reaches the ESP peer and the peer's answer reaches the VM's socket, with ARP in both
//! directions done by the kernel and the gateway.
//!
//! The namespaces are anonymous (held by file descriptors, gone when the test ends). Needs
//! CAP_SYS_ADMIN and CAP_NET_ADMIN; without them it prints why and passes vacuously.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::netns::{in_netns, new_netns, ns_path, run};
use protego_dataplane::{DataPath, Dataplane, DataplaneConfig};
use std::net::UdpSocket;
use std::time::Duration;
use testutil::{udp4, Peer};
use wire::ip::Ipv4Packet;

fn gateway_namespace() {
    // SAFETY: unshare(2) affects only the calling thread's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        let why = std::io::Error::last_os_error();
        testreq::netns_refused("linux_vxlan_host_and_vm_reach_the_peer_and_back", &why);
        return;
    }
    let host = new_netns();
    let vm = new_netns();
    run(&["ip", "link", "set", "lo", "up"]);
    run(&[
        "ip", "link", "add", "gw0", "type", "veth", "peer", "name", "h0",
    ]);
    run(&["ip", "link", "set", "h0", "netns", &ns_path(&host)]);
    run(&["ip", "addr", "add", "172.31.0.1/24", "dev", "gw0"]);
    run(&["ip", "link", "set", "gw0", "up"]);
    let vm_path = ns_path(&vm);
    in_netns(&host, move || {
        for cmd in [
            "ip link set lo up",
            "ip addr add 172.31.0.2/24 dev h0",
            "ip link set h0 up",
            "ip link add br0 type bridge",
            "ip link set br0 up",
            "ip link add vx0 type vxlan id 100 local 172.31.0.2 remote 172.31.0.1 dstport 4789 dev h0",
            "ip link set vx0 master br0",
            "ip link set vx0 up",
            "ip link add vmh type veth peer name vm0",
            "ip link set vmh master br0",
            "ip link set vmh up",
        ] {
            run(&cmd.split(' ').collect::<Vec<_>>());
        }
        run(&["ip", "link", "set", "vm0", "netns", &vm_path]);
    });
    in_netns(&vm, || {
        for cmd in [
            "ip link set lo up",
            "ip addr add 10.0.0.5/24 dev vm0",
            "ip link set vm0 up",
            "ip route add default via 10.0.0.1",
        ] {
            run(&cmd.split(' ').collect::<Vec<_>>());
        }
    });

    let cfg = DataplaneConfig {
        attachments: vec![],
        vnets: vec![common::vnet("172.31.0.1", "172.31.0.2")],
        pin_workers: true,
        ..common::config(4789)
    };
    let (tx, _rx) = crossbeam_channel::unbounded();
    let dp = Dataplane::start(cfg, tx).expect("start");
    let natt = dp.local_addrs().natt[0];
    let peer = UdpSocket::bind("127.0.0.1:0").expect("peer");
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let c = common::site_child(natt, peer.local_addr().expect("addr"));
    dp.install_child(&c).expect("install");
    let p = Peer::of(&c);

    // The VM's socket lives in the VM namespace.
    let vm_sock = in_netns(&vm, || UdpSocket::bind("10.0.0.5:7000").expect("vm socket"));
    vm_sock
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    vm_sock
        .send_to(b"ping", "192.168.0.9:9000")
        .expect("vm send");

    let mut buf = vec![0u8; 4096];
    let (n, from) = peer.recv_from(&mut buf).expect("ESP from the gateway");
    assert_eq!(from, natt);
    let inner = p.open(&buf[..n]).expect("peer opens");
    let v4 = Ipv4Packet::new_checked(&inner[..]).expect("ipv4");
    assert_eq!(
        (v4.src_addr().to_string(), v4.dst_addr().to_string()),
        ("10.0.0.5".into(), "192.168.0.9".into())
    );
    assert_eq!(v4.ttl(), 63);
    assert_eq!(&inner[28..], b"ping");

    peer.send_to(
        &p.seal(&udp4("192.168.0.9", 9000, "10.0.0.5", 7000, 64, b"pong")),
        natt,
    )
    .expect("peer send");
    let (n, from) = vm_sock.recv_from(&mut buf).expect("reply at the VM");
    assert_eq!(
        (&buf[..n], from.to_string()),
        (&b"pong"[..], "192.168.0.9:9000".to_string())
    );
    let st = dp.stats();
    assert_eq!(
        (st.children[0].packets_in, st.children[0].packets_out),
        (1, 1),
        "{st:?}"
    );
    dp.shutdown();
}

#[test]
fn linux_vxlan_host_and_vm_reach_the_peer_and_back() {
    std::thread::spawn(gateway_namespace)
        .join()
        .expect("test thread");
}
