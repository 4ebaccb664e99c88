//! Self-dispatch with unmodified Linux VXLAN hosts (issue 19 §1): in private network
//! namespaces, three data planes (the data nodes, each with its own VTEP address) and two
//! cloud hosts whose kernel `vxlan` device floods to all three VTEPs and learns (no static
//! entry for any MAC), each with three VMs behind a bridge. No dispatcher: each VM's ARP
//! request for the gateway reaches every node and is answered by exactly one, the owner of
//! the VM's virtual MAC, whose VTEP the host learns; each VM's traffic is then sealed by that
//! node. A virtual MAC moved to another node while a VM sends every millisecond loses
//! nothing: the new owner announces it and the old one sends the stragglers on.
//!
//! The namespaces are anonymous (held by file descriptors, gone when the test ends). Needs
//! root (under `make test` a missing capability fails the test).

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::netns::{in_netns, new_netns, ns_path, output, run, run_lines};
use dispatch::VmacSpace;
use ike::ChildSaInfo;
use protego_dataplane::{DataPath, Dataplane, DataplaneConfig, DispatchConfig, Route, VnetConfig};
use std::fs::File;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testutil::{child, ts, udp4, Peer};
use wire::ethernet::EthernetAddress;
use wire::ip::Ipv4Packet;

const VNI: u32 = 100;
const K: u32 = 6;
const NODES: [&str; 3] = ["172.31.0.1", "172.31.0.11", "172.31.0.12"];
const HOSTS: [&str; 2] = ["172.31.0.2", "172.31.0.3"];

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip address")
}

/// Owners of the K virtual MACs: index i is node i % 3's.
fn owners() -> Vec<u16> {
    (0..K as u16).map(|i| i % 3).collect()
}

fn table(owners: Vec<u16>) -> DispatchConfig {
    testutil::dispatch_table(VNI, &NODES, owners)
}

fn space() -> VmacSpace {
    VmacSpace::new(VNI, K).expect("space")
}

/// A VM: its namespace, host, address and MAC.
struct Vm {
    ns: File,
    host: usize,
    addr: String,
    mac: [u8; 6],
}

impl Vm {
    fn index(&self) -> u16 {
        space().assign(self.mac)
    }
}

/// Two VMs per node (one on each host), with MACs chosen so that each node owns the virtual
/// MAC of two of them.
fn vm_macs() -> Vec<(usize, [u8; 6])> {
    let mut out = Vec::new();
    for host in 0..2 {
        for node in 0..3u16 {
            let mac = (0..=255u8)
                .map(|b| [0x52, 0x54, 0, 0x10, host as u8, b])
                .find(|m| space().assign(*m) % 3 == node && !out.iter().any(|(_, o)| o == m))
                .expect("a MAC for each node");
            out.push((host, mac));
        }
    }
    out
}

fn mac_text(m: [u8; 6]) -> String {
    EthernetAddress(m).to_string()
}

/// The namespaces: hosts and VMs, the hosts' uplinks bridged in this (the gateway's)
/// namespace, which holds the three node addresses.
fn build_network() -> (Vec<File>, Vec<Vm>) {
    run_lines(&[
        "ip link set lo up",
        "ip link add u0 type bridge",
        "ip link set u0 up",
        "ip addr add 172.31.0.1/24 dev u0",
        "ip addr add 172.31.0.11/24 dev u0",
        "ip addr add 172.31.0.12/24 dev u0",
    ]);
    let mut vms = Vec::new();
    let mut hosts = Vec::new();
    let macs = vm_macs();
    for (h, host_ip) in HOSTS.iter().enumerate() {
        let host = new_netns();
        let up = format!("up{h}");
        run(&[
            "ip", "link", "add", &up, "type", "veth", "peer", "name", "h0",
        ]);
        run(&["ip", "link", "set", "h0", "netns", &ns_path(&host)]);
        run(&["ip", "link", "set", &up, "master", "u0"]);
        run(&["ip", "link", "set", &up, "up"]);
        let host_ip = host_ip.to_string();
        in_netns(&host, move || {
            run_lines(&[
                "ip link set lo up",
                &format!("ip addr add {host_ip}/24 dev h0"),
                "ip link set h0 up",
                "ip link add br0 type bridge",
                "ip link set br0 up",
                // Learning on (the default), no remote: flooding goes to the fdb's
                // all-zeros entries, one per data node.
                &format!("ip link add vx0 type vxlan id {VNI} local {host_ip} dstport 4789 dev h0"),
                "ip link set vx0 master br0",
                "ip link set vx0 up",
            ]);
            for node in NODES {
                run_lines(&[&format!(
                    "bridge fdb append 00:00:00:00:00:00 dev vx0 dst {node}"
                )]);
            }
        });
        for (n, (_, mac)) in macs.iter().filter(|(mh, _)| *mh == h).enumerate() {
            let vm = new_netns();
            let addr = format!("10.0.0.{}", 10 * (h + 1) + n);
            let (mac, addr2, vm_path) = (*mac, addr.clone(), ns_path(&vm));
            in_netns(&host, move || {
                run_lines(&[
                    &format!("ip link add vmh{n} type veth peer name vm0"),
                    &format!("ip link set vmh{n} master br0"),
                    &format!("ip link set vmh{n} up"),
                ]);
                run(&["ip", "link", "set", "vm0", "netns", &vm_path]);
            });
            in_netns(&vm, move || {
                run_lines(&[
                    "ip link set lo up",
                    &format!("ip link set vm0 address {}", mac_text(mac)),
                    &format!("ip addr add {addr2}/24 dev vm0"),
                    "ip link set vm0 up",
                    "ip route add default via 10.0.0.1",
                ]);
            });
            vms.push(Vm {
                ns: vm,
                host: h,
                addr,
                mac,
            });
        }
        hosts.push(host);
    }
    (hosts, vms)
}

/// Node `n`'s VNet: its own VTEP, 10.0.0.0/28 behind the first host and 10.0.0.16/28 behind
/// the second.
fn vnet(n: usize) -> VnetConfig {
    VnetConfig {
        vtep: ip(NODES[n]),
        routes: vec![
            Route {
                prefix: ip("10.0.0.0"),
                len: 28,
                host: ip(HOSTS[0]),
            },
            Route {
                prefix: ip("10.0.0.16"),
                len: 28,
                host: ip(HOSTS[1]),
            },
        ],
        ..common::vnet(NODES[n], HOSTS[0])
    }
}

/// A started data node: its data plane, CHILD_SA of the tunnel, and the peer's side of it.
struct Node {
    dp: Arc<Dataplane>,
    child: ChildSaInfo,
    peer: Peer,
}

fn start_node(n: usize, peer_addr: SocketAddr) -> Node {
    let cfg = DataplaneConfig {
        attachments: vec![],
        vnets: vec![vnet(n)],
        workers: 1,
        dispatch: Some(table(owners())),
        ..common::config(4789)
    };
    let (tx, _rx) = crossbeam_channel::unbounded();
    let dp = Dataplane::start(cfg, tx).expect("start");
    let natt = dp.local_addrs().natt[0];
    // One CHILD_SA per node, each with its own SPIs and sequence space.
    let spi = 0x1000 + n as u32;
    let c = child(
        1,
        spi,
        spi + 0x100,
        natt,
        peer_addr,
        ts("10.0.0.0", "10.0.0.255"),
        ts("192.168.0.0", "192.168.0.255"),
    );
    dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    Node { dp, child: c, peer }
}

/// Receives ESP at the peer until `want` datagrams are opened or 10 s pass: (node that sealed,
/// inner source, payload).
fn receive(peer: &UdpSocket, nodes: &[Node], want: usize) -> Vec<(usize, String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    let end = Instant::now() + Duration::from_secs(10);
    while got.len() < want && Instant::now() < end {
        let Ok((len, from)) = peer.recv_from(&mut buf) else {
            continue;
        };
        let n = nodes
            .iter()
            .position(|x| x.child.local == from)
            .expect("ESP from a node");
        let inner = nodes[n].peer.open(&buf[..len]).expect("the peer opens it");
        let v4 = Ipv4Packet::new_checked(&inner[..]).expect("ipv4");
        got.push((n, v4.src_addr().to_string(), inner[28..].to_vec()));
    }
    got
}

/// The node that owns virtual MAC `index` under `owners`.
fn owner(owners: &[u16], index: u16) -> usize {
    usize::from(owners[usize::from(index)])
}

fn gateway_namespace() {
    // SAFETY: unshare(2) affects only the calling thread's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        let why = std::io::Error::last_os_error();
        testreq::netns_refused(
            "three_nodes_serve_kernel_vxlan_hosts_without_a_dispatcher",
            &why,
        );
        return;
    }
    let (hosts, vms) = build_network();
    let peer = UdpSocket::bind("127.0.0.1:0").expect("peer");
    peer.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let peer_addr = peer.local_addr().expect("addr");
    let nodes: Vec<Node> = (0..3).map(|n| start_node(n, peer_addr)).collect();

    // 1. Every VM sends to the site; the owner of its virtual MAC seals it.
    let socks: Vec<UdpSocket> = vms
        .iter()
        .map(|vm| {
            let addr = format!("{}:7000", vm.addr);
            in_netns(&vm.ns, move || UdpSocket::bind(addr).expect("vm socket"))
        })
        .collect();
    for (vm, s) in vms.iter().zip(&socks) {
        s.send_to(vm.addr.as_bytes(), "192.168.0.9:9000")
            .expect("vm send");
    }
    let got = receive(&peer, &nodes, vms.len());
    assert_eq!(got.len(), vms.len(), "every VM reached the site: {got:?}");
    let table0 = owners();
    for (n, src, payload) in &got {
        let vm = vms.iter().find(|v| &v.addr == src).expect("a VM");
        assert_eq!(payload, vm.addr.as_bytes());
        assert_eq!(
            *n,
            owner(&table0, vm.index()),
            "{} sealed by its owner",
            vm.addr
        );
    }
    // Each VM took the gateway for its virtual MAC, and only one node answered each request
    // (every broadcast request reached all three: one answered, two left it).
    for vm in &vms {
        let neigh = in_netns(&vm.ns, || output(&["ip", "neigh", "show", "10.0.0.1"]));
        let vmac = mac_text(space().mac(vm.index()));
        assert!(
            neigh.contains(&vmac),
            "{}: {neigh} (expected {vmac})",
            vm.addr
        );
    }
    let stats: Vec<_> = nodes
        .iter()
        .map(|x| x.dp.stats().dispatch.expect("dispatch stats"))
        .collect();
    let answered: u64 = stats.iter().map(|s| s.answered).sum();
    let left: u64 = stats.iter().map(|s| s.left_to_owner).sum();
    assert!(answered >= vms.len() as u64, "{stats:?}");
    assert_eq!(
        left,
        2 * answered,
        "exactly one answer per request: {stats:?}"
    );
    for (n, x) in nodes.iter().enumerate() {
        let st = x.dp.stats();
        assert_eq!(
            st.children[0].packets_out, 2,
            "node {n} sealed its two VMs' traffic"
        );
        assert_eq!(st.dispatch.expect("stats").owned, 2);
    }

    // 2. Back from the site through node 0's CHILD_SA, to every VM (from the VM's virtual MAC
    // where node 0 owns it, else from node 0's own MAC).
    for vm in &vms {
        let pkt = udp4("192.168.0.9", 9000, &vm.addr, 7000, 64, b"pong");
        peer.send_to(&nodes[0].peer.seal(&pkt), nodes[0].child.local)
            .expect("peer send");
    }
    for (vm, s) in vms.iter().zip(&socks) {
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut buf = [0u8; 64];
        let (n, _) = s.recv_from(&mut buf).expect("the reply reaches the VM");
        assert_eq!(&buf[..n], b"pong", "{}", vm.addr);
    }

    // 3. A virtual MAC moves (from its owner to the next node) while its VM sends every
    // millisecond: the new owner takes it first, then the old one lets go (as Algorithm 5's
    // offer and acknowledgement do); nothing is lost, and the new owner ends up sealing.
    let moving = &vms[0];
    let index = moving.index();
    let (from, to) = (owner(&table0, index), (owner(&table0, index) + 1) % 3);
    let mut moved = owners();
    moved[usize::from(index)] = to as u16;
    let sock = socks[0].try_clone().expect("clone");
    const SENT: u32 = 400;
    let sender = std::thread::spawn(move || {
        for i in 0..SENT {
            sock.send_to(&i.to_be_bytes(), "192.168.0.9:9000")
                .expect("vm send");
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    for n in [to, 3 - to - from, from] {
        nodes[n]
            .dp
            .set_dispatch(table(moved.clone()))
            .expect("move");
    }
    let got = receive(&peer, &nodes, SENT as usize);
    sender.join().expect("sender");
    let mut seen = vec![0u32; SENT as usize];
    for (_, src, payload) in &got {
        assert_eq!(src, &moving.addr);
        let i = u32::from_be_bytes(payload[..4].try_into().expect("4 bytes"));
        seen[i as usize] += 1;
    }
    let lost: Vec<usize> = (0..seen.len()).filter(|&i| seen[i] == 0).collect();
    assert!(lost.is_empty(), "lost in the move: {lost:?}");
    assert!(seen.iter().all(|&c| c == 1), "each once");
    assert_eq!(got.last().map(|g| g.0), Some(to), "the new owner seals now");
    assert!(
        got.iter().any(|g| g.0 == from),
        "the old owner sealed before the move"
    );
    // The host learnt the move from the new owner's announcement (or its traffic).
    let fdb = in_netns(&hosts[moving.host], || {
        output(&["bridge", "fdb", "show", "dev", "vx0"])
    });
    let vmac = mac_text(space().mac(index));
    assert!(
        fdb.lines()
            .any(|l| l.starts_with(&vmac) && l.contains(&format!("dst {}", NODES[to]))),
        "{vmac} at {}: {fdb}",
        NODES[to]
    );
    let st = nodes[to].dp.stats().dispatch.expect("stats");
    assert!(st.announced > 0, "{st:?}");
    for x in &nodes {
        x.dp.shutdown();
    }
}

#[test]
fn three_nodes_serve_kernel_vxlan_hosts_without_a_dispatcher() {
    std::thread::spawn(gateway_namespace)
        .join()
        .expect("test thread");
}
