//! Times the per-VM route table's changes on a running data plane (issue 16 §2): a bulk load
//! of N IPv4 entries from a route file's text (default 16 M), single adds (a VM moving
//! host) while it is that large, the snapshot a node stores and its restore, and the memory.
//!
//! `cargo run -p protego-dataplane --release --example route_load -- [N]`
//! (loopback sockets: IKE and NAT-T on ports of the kernel's choosing, VXLAN on a port picked
//! from the process id; one worker).

use protego_dataplane::{
    DataPath, Dataplane, DataplaneConfig, Inside, Route, RouteChange, TunnelBinding, VmRoute,
    VnetConfig,
};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(16 << 20);
    let tenant = ids::TenantId::new("acme").expect("tenant");
    let cfg = DataplaneConfig {
        listen: vec![IpAddr::from([127, 0, 0, 1])],
        ike_port: 0,
        natt_port: 0,
        vxlan_port: 47_89 + 10_000 + (std::process::id() % 20_000) as u16,
        vnets: vec![VnetConfig {
            tenant: tenant.clone(),
            name: "prod".into(),
            vni: 100,
            gateway_ips: vec![IpAddr::from([10, 255, 255, 254])],
            vtep: IpAddr::from([127, 0, 0, 1]),
            routes: vec![Route {
                prefix: IpAddr::from([10, 0, 0, 0]),
                len: 8,
                host: IpAddr::from([127, 0, 0, 2]),
            }],
            router_mac: None,
        }],
        tunnels: vec![TunnelBinding {
            tunnel: ike::TunnelId(1),
            name: "t".into(),
            tenant: tenant.clone(),
            inside: Inside::Vnet(0),
        }],
        tun_name: None,
        batch: 32,
        workers: 1,
        cpus: vec![],
        pin_workers: false,
        busy_poll: Duration::ZERO,
        busy_poll_budget: protego_dataplane::DEFAULT_BUSY_POLL_BUDGET,
        xdp: Default::default(),
        fair_kernel_gate: true,
        relay: None,
        dispatch: None,
        attachments: vec![],
    };
    let (tx, _rx) = crossbeam_channel::unbounded();
    let dp = Dataplane::start(cfg, tx).expect("start");
    // VM i is 10.x.y.z (i + 1), on one of 4096 hosts 172.16.x.y.
    let vm = |i: u32| Ipv4Addr::from(0x0a00_0000 + i + 1);
    let host = |i: u32| Ipv4Addr::from(0xac10_0000 + (i.wrapping_mul(2_654_435_761) >> 20));
    let started = Instant::now();
    let mut text = String::with_capacity(n as usize * 32);
    for i in 0..n {
        use std::fmt::Write;
        let _ = writeln!(text, "acme,prod,{},{}", vm(i), host(i));
    }
    println!(
        "route file: {n} lines, {:.0} MiB, made in {:.2} s",
        text.len() as f64 / 1048576.0,
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let r = dp
        .change_routes(RouteChange::Load(Arc::from(text)))
        .expect("load");
    let load = started.elapsed();
    let st = dp.route_stats();
    println!(
        "bulk load: {} entries in {:.2} s (parse and check, insert into one copy, publish, copy to \
         the other); table {} MiB for both copies, {:.1} B/entry ({:.1} per copy)",
        r.added,
        load.as_secs_f64(),
        st.memory_bytes >> 20,
        st.memory_bytes as f64 / st.entries as f64,
        st.memory_bytes as f64 / st.entries as f64 / 2.0
    );
    let mut single = Vec::new();
    for k in 0..1000u32 {
        let i = k.wrapping_mul(7919) % n;
        let started = Instant::now();
        dp.change_routes(RouteChange::Add(VmRoute {
            tenant: tenant.clone(),
            vnet: "prod".into(),
            address: vm(i).into(),
            host: IpAddr::from([192, 0, 2, (k % 200) as u8 + 1]),
        }))
        .expect("move");
        single.push(started.elapsed());
    }
    single.sort();
    println!(
        "single change (a VM moves host) at {n} entries: median {:.1} us, p99 {:.1} us, max {:.1} us",
        single[500].as_secs_f64() * 1e6,
        single[990].as_secs_f64() * 1e6,
        single[999].as_secs_f64() * 1e6
    );
    let started = Instant::now();
    let mut snap = Vec::new();
    let written = dp.write_routes(&mut snap).expect("snapshot");
    println!(
        "snapshot: {written} entries, {:.0} MiB ({:.1} B/entry), written in {:.2} s",
        snap.len() as f64 / 1048576.0,
        snap.len() as f64 / written as f64,
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let r = dp
        .change_routes(RouteChange::Restore(Arc::from(snap)))
        .expect("restore");
    println!(
        "restore over the same entries: {} in {:.2} s",
        r.added,
        started.elapsed().as_secs_f64()
    );
    dp.shutdown();
}
