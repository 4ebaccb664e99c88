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

mod dispatch_bed;

use dispatch_bed::{table, Bed, Error};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const K: u32 = 256;

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

fn run(n: usize, vms: usize, pps_per_node: u64, dur: Duration) -> Result<Run, Error> {
    // Algorithm 1's even partition, in the nodes' order.
    let mut owners = vec![0u16; K as usize];
    for (node, part) in dispatch::partition(K, &(0..n as u32).collect::<Vec<_>>()) {
        for i in part {
            owners[usize::from(i)] = node as u16;
        }
    }
    let bed = Bed::start(n, vms, &table(n, owners, Duration::from_secs(5)))?;
    let answered: Vec<usize> = (0..n)
        .map(|i| bed.vms.iter().filter(|v| v.node == i).count())
        .collect();
    let (stop, drain) = bed.drain();
    let schedule: Vec<usize> = (0..bed.vms.len()).collect();
    let rate = (pps_per_node * n as u64) as f64;
    let (never, sent) = (AtomicBool::new(false), AtomicU64::new(0));
    let go = |d: Duration| bed.send(&schedule, rate, d, &never, &sent);
    go(Duration::from_millis(500))?;
    let before: Vec<u64> = (0..n).map(|i| bed.sealed(i)).collect();
    let cpu_before: Vec<u64> = bed
        .tids
        .iter()
        .map(|t| testutil::threads_cpu_ns(t))
        .collect::<Result<_, _>>()?;
    let t0 = Instant::now();
    go(dur)?;
    let elapsed = t0.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(100));
    let after: Vec<u64> = (0..n).map(|i| bed.sealed(i)).collect();
    let cpu_after: Vec<u64> = bed
        .tids
        .iter()
        .map(|t| testutil::threads_cpu_ns(t))
        .collect::<Result<_, _>>()?;
    stop.store(true, Ordering::Relaxed);
    let received = drain.join().map_err(|_| "drain thread")?;
    let nodes = (0..n)
        .map(|i| {
            let packets = after[i] - before[i];
            NodeFigures {
                rate: packets as f64 / elapsed,
                cost: (cpu_after[i] - cpu_before[i]) as f64 / packets.max(1) as f64,
                vms: answered[i],
            }
        })
        .collect();
    bed.shutdown();
    Ok(Run {
        nodes,
        sent: sent.load(Ordering::Relaxed),
        received,
    })
}
