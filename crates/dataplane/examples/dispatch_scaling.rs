//! Self-dispatch's scaling (issue 19 §4, the clustering paper's Fig. 4) on this machine's data
//! planes: 1, 2 and 3 data nodes, each a data plane with one worker, its own VTEP and its own
//! CHILD_SA of one tunnel, under that tunnel's VNet → site traffic from many VMs. Because this
//! machine has 2 cores, the nodes' capacity is not measured by saturating them together: each
//! node's CPU per packet and its share of the packets are, with every node offered the rate a
//! single node is offered, so the batches are alike. The capacity of N nodes relative to one
//! is then `min over nodes of cost(1) / (cost(node) · share(node))` (the busiest node
//! saturates first); even shares and an unchanged cost give N.
//!
//! The load generator plays the hosts: it floods each VM's ARP request for the gateway to
//! every node's VTEP, as a host's VXLAN device with the data nodes as flood list does, learns
//! the VTEP of the one node that answers (checking that exactly one does), and then sends each
//! VM's packets (64-byte IP packets, UDP) to that VTEP, the VMs taking turns. Nothing is
//! tuned: K = 256 virtual MACs split evenly, VM MACs consecutive as a hypervisor hands them
//! out (`dispatch::VmacSpace::assign` spreads such sequences nearly evenly).
//!
//! `cargo run -p protego-dataplane --release --example dispatch_scaling -- [VMS] [KPPS] [SECONDS]`
//! (default 240 VMs, 20 000 packets per second per node, 3 s per run; loopback sockets:
//! nodes' VTEPs on 127.0.1.N, the hosts on 127.0.2.1, the peer on 127.0.3.1).

#[path = "../src/testutil.rs"]
mod testutil;

use protego_dataplane::{
    DataPath, Dataplane, DataplaneConfig, DataplaneStats, DispatchConfig, Inside, Route,
    TunnelBinding, VnetConfig,
};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testutil::{arp, child, dispatch_table, ts, udp4, vxlan};
use wire::arp::ArpOperation;
use wire::ethernet::EtherType;

const VNI: u32 = 100;
const K: u32 = 256;

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let arg = |i: usize, d: u64| -> u64 {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let (vms, kpps, secs) = (arg(1, 240) as usize, arg(2, 20), arg(3, 3));
    println!("{vms} VMs, {kpps} kpps offered per node, {secs} s per run, K = {K}, 64-byte packets");
    println!(
        "{:>5} {:>5} {:>10} {:>7} {:>12} {:>10} {:>9}",
        "nodes", "node", "sealed/s", "share", "CPU ns/pkt", "vs 1 node", "VMs"
    );
    let mut single_cost = None;
    for n in 1..=3usize {
        let run = run(n, vms, kpps * 1000, Duration::from_secs(secs))?;
        let cost1 = *single_cost.get_or_insert(run.nodes[0].cost);
        let total: f64 = run.nodes.iter().map(|x| x.rate).sum();
        let mut capacity = f64::INFINITY;
        for (i, x) in run.nodes.iter().enumerate() {
            let share = x.rate / total;
            capacity = capacity.min(cost1 / (x.cost * share));
            println!(
                "{n:>5} {i:>5} {:>10.0} {:>6.1}% {:>12.0} {:>9.3}x {:>9}",
                x.rate,
                100.0 * share,
                x.cost,
                x.cost / cost1,
                x.vms
            );
        }
        let even = 1.0 / n as f64;
        let worst = run
            .nodes
            .iter()
            .map(|x| (x.rate / total - even).abs() / even)
            .fold(0.0, f64::max);
        println!(
            "{n:>5}   all {total:>10.0}  capacity {capacity:.2}x one node; shares off even by at most {:.1}%; {} of {} sent reached the peer",
            100.0 * worst,
            run.received,
            run.sent
        );
    }
    Ok(())
}

/// What one node did in a run.
struct NodeFigures {
    /// Packets sealed per second.
    rate: f64,
    /// CPU time of its worker thread per packet sealed (ns, from the thread's
    /// `/proc/self/task/TID/schedstat`: time on a CPU, so a worker that waits for a core
    /// counts nothing for the wait), its whole work included: receiving, the frame's checks,
    /// sealing, sending, sleeping and waking.
    cost: f64,
    /// VMs whose ARP it answered.
    vms: usize,
}

struct Run {
    nodes: Vec<NodeFigures>,
    sent: u64,
    received: u64,
}

fn node_ip(i: usize) -> IpAddr {
    IpAddr::from([127, 0, 1, 1 + i as u8])
}

fn run(n: usize, vms: usize, pps_per_node: u64, dur: Duration) -> Result<Run, Error> {
    let host = UdpSocket::bind("127.0.2.1:0")?;
    let port = host.local_addr()?.port();
    host.set_read_timeout(Some(Duration::from_millis(500)))?;
    let peer = Arc::new(UdpSocket::bind("127.0.3.1:0")?);
    peer.set_read_timeout(Some(Duration::from_millis(100)))?;
    let nodes: Vec<String> = (0..n).map(|i| node_ip(i).to_string()).collect();
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    // Algorithm 1's even partition, in the nodes' order.
    let mut owners = vec![0u16; K as usize];
    for (node, part) in dispatch::partition(K, &(0..n as u32).collect::<Vec<_>>()) {
        for i in part {
            owners[usize::from(i)] = node as u16;
        }
    }
    let table: DispatchConfig = dispatch_table(VNI, &names, owners);
    let mut dps = Vec::new();
    let mut tids: Vec<Vec<u32>> = Vec::new();
    for i in 0..n {
        let seen: Vec<u32> = tids.iter().flatten().copied().collect();
        let dp = start_node(i, port, table.clone())?;
        // A thread names itself once it runs: wait for the new worker's name.
        let deadline = Instant::now() + Duration::from_secs(2);
        let new = loop {
            let new: Vec<u32> = testutil::worker_threads()?
                .into_iter()
                .filter(|t| !seen.contains(t))
                .collect();
            if !new.is_empty() || Instant::now() > deadline {
                break new;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if new.len() != 1 {
            return Err(format!("node {i}: {} worker threads, not 1", new.len()).into());
        }
        tids.push(new);
        let natt = dp.local_addrs().natt[0];
        let spi = 0x1000 + i as u32;
        let c = child(
            1,
            spi,
            spi + 0x100,
            natt,
            peer.local_addr()?,
            ts("10.0.0.0", "10.0.255.255"),
            ts("192.168.0.0", "192.168.0.255"),
        );
        dp.install_child(&c)?;
        dps.push(dp);
    }
    // The hosts' flood: each VM's ARP request to every node; the answering node is learnt.
    let mut learnt = Vec::with_capacity(vms);
    let mut answered = vec![0usize; n];
    let mut buf = vec![0u8; 2048];
    for v in 0..vms {
        let mac = vm_mac(v);
        let req = arp(
            ArpOperation::REQUEST,
            mac,
            &vm_ip(v),
            [0; 6],
            "10.0.255.254",
        );
        let frame = vxlan(VNI, [0xff; 6], mac, EtherType::ARP, &req);
        for i in 0..n {
            host.send_to(&frame, SocketAddr::new(node_ip(i), port))?;
        }
        let (from, vmac) =
            arp_reply(&host, &mut buf, mac)?.ok_or("a VM's request went unanswered")?;
        let node = (0..n)
            .find(|&i| node_ip(i) == from.ip())
            .ok_or("an answer from no node")?;
        answered[node] += 1;
        learnt.push((SocketAddr::new(from.ip(), port), vmac, mac, v));
    }
    // Exactly one answer each: no other reply is waiting.
    host.set_read_timeout(Some(Duration::from_millis(200)))?;
    if arp_reply(&host, &mut buf, [0; 6])?.is_some() {
        return Err("a VM's request was answered twice".into());
    }
    // The peer drains what the nodes seal.
    let stop = Arc::new(AtomicBool::new(false));
    let drain = {
        let (peer, stop) = (Arc::clone(&peer), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            let mut got = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if peer.recv_from(&mut buf).is_ok() {
                    got += 1;
                }
            }
            got
        })
    };
    // Packets: each VM's to the virtual MAC it was given, at the node it learnt.
    let frames: Vec<(SocketAddr, Vec<u8>)> = learnt
        .iter()
        .map(|(to, vmac, mac, v)| {
            let pkt = udp4(&vm_ip(*v), 1000, "192.168.0.9", 9000, 64, &[0u8; 36]);
            (*to, vxlan(VNI, *vmac, *mac, EtherType::IPV4, &pkt))
        })
        .collect();
    let rate = (pps_per_node * n as u64) as f64;
    let send = |d: Duration, sent: &mut u64| -> Result<(), Error> {
        let start = Instant::now();
        let mut i = 0usize;
        while start.elapsed() < d {
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            while *sent < due {
                let (to, f) = &frames[i % frames.len()];
                host.send_to(f, to)?;
                i += 1;
                *sent += 1;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    };
    let mut warm = 0;
    send(Duration::from_millis(500), &mut warm)?;
    let before: Vec<DataplaneStats> = dps.iter().map(|d| d.stats()).collect();
    let cpu_before: Vec<u64> = tids
        .iter()
        .map(|t| testutil::threads_cpu_ns(t))
        .collect::<Result<_, _>>()?;
    let mut sent = 0;
    let t0 = Instant::now();
    send(dur, &mut sent)?;
    let elapsed = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(100));
    let after: Vec<DataplaneStats> = dps.iter().map(|d| d.stats()).collect();
    let cpu_after: Vec<u64> = tids
        .iter()
        .map(|t| testutil::threads_cpu_ns(t))
        .collect::<Result<_, _>>()?;
    stop.store(true, Ordering::Relaxed);
    let received = drain.join().map_err(|_| "drain thread")?;
    let mut figures = Vec::new();
    for i in 0..n {
        let sealed = |s: &DataplaneStats| s.children.iter().map(|c| c.packets_out).sum::<u64>();
        let packets = sealed(&after[i]) - sealed(&before[i]);
        figures.push(NodeFigures {
            rate: packets as f64 / elapsed,
            cost: (cpu_after[i] - cpu_before[i]) as f64 / packets.max(1) as f64,
            vms: answered[i],
        });
    }
    for dp in &dps {
        dp.shutdown();
    }
    Ok(Run {
        nodes: figures,
        sent: sent + warm,
        received,
    })
}

/// The next ARP reply the hosts receive (to `vm`, or to anyone with `vm` all zeros), skipping
/// the nodes' announcements: its sender and the MAC it gives. None: nothing within the
/// socket's timeout.
fn arp_reply(
    host: &UdpSocket,
    buf: &mut [u8],
    vm: [u8; 6],
) -> Result<Option<(SocketAddr, [u8; 6])>, Error> {
    loop {
        let (len, from) = match host.recv_from(buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
        };
        let (_, dst, src, ty, _) = testutil::parse_vxlan(&buf[..len]);
        if ty == EtherType::ARP && (vm == [0; 6] || dst == vm) {
            return Ok(Some((from, src)));
        }
    }
}

fn start_node(i: usize, vxlan_port: u16, table: DispatchConfig) -> Result<Arc<Dataplane>, Error> {
    let tenant = ids::TenantId::new("acme")?;
    let cfg = DataplaneConfig {
        listen: vec![IpAddr::from([127, 0, 0, 1])],
        ike_port: 0,
        natt_port: 0,
        vxlan_port,
        vnets: vec![VnetConfig {
            tenant: tenant.clone(),
            name: "prod".into(),
            vni: VNI,
            gateway_ips: vec![IpAddr::from([10, 0, 255, 254])],
            vtep: node_ip(i),
            routes: vec![Route {
                prefix: IpAddr::from([10, 0, 0, 0]),
                len: 16,
                host: IpAddr::from([127, 0, 2, 1]),
            }],
            router_mac: None,
        }],
        tunnels: vec![TunnelBinding {
            tunnel: ike::TunnelId(1),
            name: "site".into(),
            tenant,
            inside: Inside::Vnet(0),
        }],
        tun_name: None,
        batch: 32,
        workers: 1,
        cpus: vec![],
        pin_workers: false,
        busy_poll: Duration::ZERO,
        fair_kernel_gate: false,
        relay: None,
        dispatch: Some(table),
        attachments: vec![],
    };
    let (tx, _rx) = crossbeam_channel::unbounded();
    Ok(Dataplane::start(cfg, tx)?)
}

/// VM `v`'s MAC: consecutive, as a hypervisor hands them out.
fn vm_mac(v: usize) -> [u8; 6] {
    let b = (v as u32 + 0x18).to_be_bytes();
    [0x52, 0x54, 0x00, b[1], b[2], b[3]]
}

/// VM `v`'s address, 10.0.x.y.
fn vm_ip(v: usize) -> String {
    format!("10.0.{}.{}", (v + 1) / 250, (v + 1) % 250 + 1)
}
