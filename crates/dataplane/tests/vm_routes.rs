//! Per-VM overlay routes on the running data plane (issue 16 §2), on loopback: VNet
//! `acme/prod` has 10.0.0.0/24 behind the host VTEP 127.0.0.2, and a second host VTEP on
//! 127.0.0.3 (same VXLAN port) takes VM 10.0.0.5 when an exact entry says so. ESP from the
//! peer is delivered to whichever host the table names when the packet is looked up.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{bind, recv, try_recv, wait_stats, Started};
use protego_dataplane::{DataPath, DataplaneConfig, Inside, RouteChange, VmRoute};
use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;
use testutil::{arp, ip, parse_vxlan, udp4, vxlan, Peer};
use wire::arp::ArpOperation;
use wire::ethernet::EtherType;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];

fn add(vm: &str, host: &str) -> RouteChange {
    RouteChange::Add(VmRoute {
        tenant: ids::TenantId::new("acme").expect("tenant"),
        vnet: "prod".into(),
        address: ip(vm),
        host: ip(host),
    })
}

fn del(vm: &str) -> RouteChange {
    RouteChange::Del {
        tenant: ids::TenantId::new("acme").expect("tenant"),
        vnet: "prod".into(),
        address: ip(vm),
    }
}

/// The data plane, the two host VTEP sockets (127.0.0.2, 127.0.0.3), the peer socket and the
/// peer's side of the CHILD_SA (installed).
struct Setup {
    dp: std::sync::Arc<protego_dataplane::Dataplane>,
    hosts: [UdpSocket; 2],
    peer: UdpSocket,
    sa: Peer,
    natt: SocketAddr,
    vtep: SocketAddr,
}

fn setup() -> Setup {
    setup_with(None, "10.0.0.255")
}

/// [`setup`] with the VNet's hosts routing at `router_mac`, if given, and the CHILD_SA's local
/// selector 10.0.0.0 ..= `ts_end`.
fn setup_with(router_mac: Option<[u8; 6]>, ts_end: &str) -> Setup {
    let mut second = None;
    let Started { dp, host, .. } = common::start_beside_host(|port| {
        second = UdpSocket::bind(("127.0.0.3", port)).ok();
        let mut c = DataplaneConfig {
            listen: vec![ip("127.0.0.1")],
            tunnels: vec![common::site_tunnel(Inside::Vnet(0))],
            ..common::config(port)
        };
        c.vnets[0].router_mac = router_mac;
        c
    });
    let second = second.expect("127.0.0.3 on the VXLAN port");
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let addrs = dp.local_addrs();
    let peer = bind("127.0.0.1:0");
    let mut c = common::site_child(addrs.natt[0], peer.local_addr().expect("addr"));
    c.local_ts = vec![testutil::ts("10.0.0.0", ts_end)];
    dp.install_child(&c).expect("install");
    Setup {
        sa: Peer::of(&c),
        dp,
        hosts: [host, second],
        peer,
        natt: addrs.natt[0],
        vtep: addrs.vxlan[0],
    }
}

impl Setup {
    fn send(&self, seq: u32) {
        let inner = udp4(
            "192.168.0.9",
            2000,
            "10.0.0.5",
            1000,
            64,
            &seq.to_be_bytes(),
        );
        self.peer
            .send_to(&self.sa.seal(&inner), self.natt)
            .expect("send esp");
    }

    /// Has host `h` answer the ARP request it must have received for 10.0.0.5.
    fn resolve_at(&self, h: usize) {
        let (d, _) = recv(&self.hosts[h]);
        let (_, _, _, ty, _) = parse_vxlan(&d);
        assert_eq!(ty, EtherType::ARP, "the gateway asks the VM's host");
        let gw = self.dp.gateway_mac(0).expect("vnet");
        let reply = arp(ArpOperation::REPLY, VM_MAC, "10.0.0.5", gw, "10.0.0.1");
        self.hosts[h]
            .send_to(&vxlan(100, gw, VM_MAC, EtherType::ARP, &reply), self.vtep)
            .expect("send arp");
    }

    /// The sequence number of the next data packet host `h` receives.
    fn data_at(&self, h: usize) -> u32 {
        loop {
            let (d, _) = recv(&self.hosts[h]);
            let (_, _, _, ty, payload) = parse_vxlan(&d);
            if ty == EtherType::IPV4 {
                return u32::from_be_bytes(payload[28..32].try_into().expect("4 bytes"));
            }
        }
    }
}

#[test]
fn an_exact_entry_moves_a_vm_and_its_removal_falls_back_to_the_prefix() {
    let s = setup();
    // Before any packet: 10.0.0.5 lives on 127.0.0.3, not where the prefix says.
    s.dp.change_routes(add("10.0.0.5", "127.0.0.3"))
        .expect("added");
    s.send(1);
    s.resolve_at(1);
    assert_eq!(s.data_at(1), 1);
    // The entry's host is accepted as a VXLAN sender: its ARP reply taught the MAC.
    wait_stats(&s.dp, "the host's ARP reply accepted", |st| {
        common::drop_count(st, "vxlan_unknown_host") == 0
    });
    // Removed: the prefix route again (the MAC is still known).
    s.dp.change_routes(del("10.0.0.5")).expect("deleted");
    s.send(2);
    assert_eq!(s.data_at(0), 2);
    // Moved back with `add`: the next packet goes to the new host.
    s.dp.change_routes(add("10.0.0.5", "127.0.0.3"))
        .expect("moved");
    s.send(3);
    assert_eq!(s.data_at(1), 3);
    let st = s.dp.route_stats();
    assert_eq!((st.entries, st.vnets[0].v4), (1, 1));
}

/// The peer sends a steady stream while the entry flips between the two hosts hundreds of
/// times: every packet arrives exactly once, at one of the two hosts, both hosts get some
/// (the table is used), each host gets its packets in order, and the packets sent after the
/// last change all arrive at the last host (not the one the prefix names).
#[test]
fn no_packet_is_lost_or_misdelivered_while_the_table_changes() {
    let s = setup();
    s.dp.change_routes(add("10.0.0.5", "127.0.0.2"))
        .expect("added");
    s.send(0);
    s.resolve_at(0);
    assert_eq!(s.data_at(0), 0);
    const N: u32 = 2000;
    let collect = |h: UdpSocket| {
        std::thread::spawn(move || {
            h.set_read_timeout(Some(Duration::from_millis(500)))
                .expect("timeout");
            let mut got = Vec::new();
            while let Some((d, _)) = try_recv(&h) {
                let (_, _, _, ty, payload) = parse_vxlan(&d);
                if ty == EtherType::IPV4 {
                    got.push(u32::from_be_bytes(payload[28..32].try_into().expect("4")));
                }
            }
            got
        })
    };
    let Setup {
        dp,
        hosts: [h0, h1],
        peer,
        sa,
        natt,
        ..
    } = s;
    let (c0, c1) = (collect(h0), collect(h1));
    // After N packets the sender waits for the last change, then sends TAIL more.
    const TAIL: u32 = 100;
    let (last_change_done, wait_last_change) = std::sync::mpsc::channel::<()>();
    let waiting = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender_waiting = std::sync::Arc::clone(&waiting);
    let sender = std::thread::spawn(move || {
        for seq in 1..=N + TAIL {
            if seq == N + 1 {
                sender_waiting.store(true, std::sync::atomic::Ordering::Release);
                wait_last_change.recv().expect("the last change");
            }
            let inner = udp4(
                "192.168.0.9",
                2000,
                "10.0.0.5",
                1000,
                64,
                &seq.to_be_bytes(),
            );
            peer.send_to(&sa.seal(&inner), natt).expect("send esp");
            if seq % 8 == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    });
    let mut flips = 0;
    // Until the sender has sent N packets and waits.
    while !waiting.load(std::sync::atomic::Ordering::Acquire) {
        let host = if flips % 2 == 0 {
            "127.0.0.3"
        } else {
            "127.0.0.2"
        };
        dp.change_routes(add("10.0.0.5", host)).expect("moved");
        flips += 1;
    }
    // The last change: to the host the prefix does not name.
    dp.change_routes(add("10.0.0.5", "127.0.0.3"))
        .expect("moved");
    last_change_done.send(()).expect("sender waiting");
    sender.join().expect("sender");
    let (g0, g1) = (c0.join().expect("host 0"), c1.join().expect("host 1"));
    for (h, got) in [(0, &g0), (1, &g1)] {
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "host {h} got packets out of order: {got:?}"
        );
        assert!(
            got.iter().any(|&s| s <= N),
            "host {h} got none of the packets sent while the entry flipped"
        );
    }
    let tail: Vec<u32> = g0.iter().copied().filter(|&s| s > N).collect();
    assert!(
        tail.is_empty(),
        "sent after the last change, delivered to the old host: {tail:?}"
    );
    assert_eq!(
        g1.iter().filter(|&&s| s > N).count(),
        TAIL as usize,
        "the packets sent after the last change reach its host"
    );
    let all: Vec<u32> = g0.iter().chain(&g1).copied().collect();
    let unique: HashSet<u32> = all.iter().copied().collect();
    assert_eq!(all.len(), unique.len(), "a packet was delivered twice");
    let missing: Vec<u32> = (1..=N + TAIL).filter(|s| !unique.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "lost {} packets: {missing:?}",
        missing.len()
    );
    assert!(flips > 10, "the table changed {flips} times only");
    eprintln!("{N} packets, {flips} changes of the entry meanwhile");
    let stats = dp.stats();
    assert_eq!(common::drop_count(&stats, "no_route"), 0);
}

/// A bulk load of 1 M entries (other VMs) while the peer streams to the VM: every packet
/// arrives, at the VM's host, and no gap between arrivals passes 50 ms. The bound is
/// 10 ms (measured here: 3.7-5.0 ms, printed); the assertion is five times that because the
/// 2-core test machine runs other builds whose scheduling alone stalls a thread for tens of
/// milliseconds now and then. A data plane that waited for the load (about a second) fails.
#[test]
fn a_bulk_load_while_forwarding_loses_nothing() {
    let s = setup();
    s.dp.change_routes(add("10.0.0.5", "127.0.0.3"))
        .expect("added");
    s.send(0);
    s.resolve_at(1);
    assert_eq!(s.data_at(1), 0);
    const N: u32 = 3000;
    let Setup {
        dp,
        hosts: [_h0, h1],
        peer,
        sa,
        natt,
        ..
    } = s;
    let receiver = std::thread::spawn(move || {
        h1.set_read_timeout(Some(Duration::from_millis(1000)))
            .expect("timeout");
        let mut got = Vec::new();
        while let Some((d, _)) = try_recv(&h1) {
            let (_, _, _, ty, payload) = parse_vxlan(&d);
            if ty == EtherType::IPV4 {
                let seq = u32::from_be_bytes(payload[28..32].try_into().expect("4"));
                got.push((seq, std::time::Instant::now()));
            }
        }
        got
    });
    let sender = std::thread::spawn(move || {
        for seq in 1..=N {
            let inner = udp4(
                "192.168.0.9",
                2000,
                "10.0.0.5",
                1000,
                64,
                &seq.to_be_bytes(),
            );
            peer.send_to(&sa.seal(&inner), natt).expect("send esp");
            std::thread::sleep(Duration::from_micros(500));
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    let mut text = String::new();
    for i in 0..1u32 << 20 {
        let vm = std::net::Ipv4Addr::from(0x0b00_0000 + i);
        text.push_str(&format!("acme,prod,{vm},127.0.0.{}\n", 2 + i % 2));
    }
    let started = std::time::Instant::now();
    let r = dp
        .change_routes(RouteChange::Load(text.into()))
        .expect("loaded");
    let load = started.elapsed();
    sender.join().expect("sender");
    let got = receiver.join().expect("receiver");
    let seqs: HashSet<u32> = got.iter().map(|(s, _)| *s).collect();
    let missing: Vec<u32> = (1..=N).filter(|s| !seqs.contains(s)).collect();
    assert!(missing.is_empty(), "lost {}: {missing:?}", missing.len());
    let gap = got
        .windows(2)
        .map(|w| w[1].1.duration_since(w[0].1))
        .max()
        .unwrap_or_default();
    eprintln!(
        "{} entries loaded in {:.2} s while {N} packets (one per 0.5 ms) were forwarded: none lost, longest gap between arrivals {:.1} ms",
        r.added,
        load.as_secs_f64(),
        gap.as_secs_f64() * 1e3
    );
    assert_eq!(dp.route_stats().entries, (1 << 20) + 1);
    assert!(
        gap < Duration::from_millis(50),
        "forwarding stalled for {:.1} ms during the load",
        gap.as_secs_f64() * 1e3
    );
}

/// With `router_mac`, the VNet's hosts route at that MAC: 100 000 VMs (more than the 65 536 a
/// VNet's neighbour cache holds), each behind its own per-VM entry, all get their packet at
/// their host with the router MAC as the inner destination, and the gateway never asks for a
/// VM's MAC (no ARP request, no `neigh_*` drop).
#[test]
fn with_a_router_mac_no_vm_is_resolved_however_many_there_are() {
    const ROUTER: [u8; 6] = [0x02, 0, 0x5e, 0, 1, 0xfe];
    const VMS: u32 = 100_000;
    let s = setup_with(Some(ROUTER), "10.255.255.255");
    let vm = |i: u32| std::net::Ipv4Addr::from(0x0a01_0000 + i);
    let mut text = String::new();
    for i in 0..VMS {
        text.push_str(&format!("acme,prod,{},127.0.0.{}\n", vm(i), 2 + i % 2));
    }
    s.dp.change_routes(RouteChange::Load(text.into()))
        .expect("loaded");
    let Setup {
        dp,
        hosts: [h0, h1],
        peer,
        sa,
        natt,
        ..
    } = s;
    // Each host counts what it gets (inner destination MAC checked) until quiet for a second.
    let count = |h: UdpSocket| {
        std::thread::spawn(move || {
            h.set_read_timeout(Some(Duration::from_millis(1000)))
                .expect("timeout");
            let (mut data, mut other, mut wrong_mac) = (0u32, 0u32, 0u32);
            while let Some((d, _)) = try_recv(&h) {
                let (_, dst, _, ty, _) = parse_vxlan(&d);
                if ty != EtherType::IPV4 {
                    other += 1;
                } else if dst != ROUTER {
                    wrong_mac += 1;
                } else {
                    data += 1;
                }
            }
            (data, other, wrong_mac)
        })
    };
    let (c0, c1) = (count(h0), count(h1));
    for i in 0..VMS {
        let inner = udp4(
            "192.168.0.9",
            2000,
            &vm(i).to_string(),
            1000,
            64,
            &i.to_be_bytes(),
        );
        peer.send_to(&sa.seal(&inner), natt).expect("send esp");
        if i % 32 == 31 {
            // Paced, so the sockets keep up on a loaded machine.
            std::thread::sleep(Duration::from_micros(400));
        }
    }
    let (d0, o0, w0) = c0.join().expect("host 0");
    let (d1, o1, w1) = c1.join().expect("host 1");
    assert_eq!((o0, o1), (0, 0), "no ARP or other frame to the hosts");
    assert_eq!((w0, w1), (0, 0), "every packet to the router MAC");
    let stats = dp.stats();
    let dropped: Vec<_> = stats.drops.iter().filter(|(_, v)| *v > 0).collect();
    eprintln!("received {d0} + {d1}; drops {dropped:?}");
    for reason in ["neigh_table_full", "neigh_unresolved", "no_route"] {
        assert_eq!(common::drop_count(&stats, reason), 0, "{reason}");
    }
    // Sent over loopback UDP: the kernel's socket buffers may overflow on a loaded machine
    // (not the gateway's doing, which dropped nothing, above); nearly all arrived, about half
    // at each host.
    assert!(d0 + d1 >= VMS * 95 / 100, "{d0} + {d1} of {VMS}");
    assert!(d0 >= VMS * 45 / 100 && d1 >= VMS * 45 / 100, "{d0} / {d1}");
}
