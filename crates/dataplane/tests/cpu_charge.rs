//! The CPU charge (issue 18 §3) on real traffic: a data plane on loopback with three tenants,
//! each with a VNet (VMs behind the host VTEP on 127.0.0.2) and two of them with a tunnel to
//! a peer; ESP from the peers and VXLAN from the VMs both ways. The charge must count every
//! packet of a tenant once, charge CPU to the tenants that sent and none to the idle one, show
//! nothing while off and stop counting once turned off again. No timing is asserted.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{recv, wait_stats, Started};
use protego_dataplane::{
    CpuFairness, CpuFairnessConfig, DataPath, DataplaneConfig, DataplaneStats, Inside, Route,
    TenantStats, TunnelBinding, VnetConfig,
};
use std::net::{IpAddr, UdpSocket};
use testutil::{child, ts, udp4, vxlan, Peer};
use wire::ethernet::EtherType;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];
const ROUTER_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xfe];

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip address")
}

fn tenant(name: &str) -> ids::TenantId {
    ids::TenantId::new(name).expect("tenant")
}

/// Tenant `name`'s VNet with VNI `vni`, gateway 10.`n`.0.1 and 10.`n`.0.0/24 behind the host
/// VTEP 127.0.0.2 (a router MAC: no address resolution toward the VMs).
fn vnet(name: &str, vni: u32, n: u8) -> VnetConfig {
    VnetConfig {
        tenant: tenant(name),
        name: "net".into(),
        vni,
        gateway_ips: vec![ip(&format!("10.{n}.0.1"))],
        vtep: ip("127.0.0.1"),
        routes: vec![Route {
            prefix: ip(&format!("10.{n}.0.0")),
            len: 24,
            host: ip("127.0.0.2"),
        }],
        router_mac: Some(ROUTER_MAC),
    }
}

fn config(port: u16) -> DataplaneConfig {
    DataplaneConfig {
        vnets: vec![
            vnet("acme", 100, 0),
            vnet("globex", 200, 1),
            vnet("idle", 300, 2),
        ],
        tunnels: vec![
            TunnelBinding {
                tunnel: ike::TunnelId(1),
                name: "acme-site".into(),
                tenant: tenant("acme"),
                inside: Inside::Vnet(0),
            },
            TunnelBinding {
                tunnel: ike::TunnelId(2),
                name: "globex-site".into(),
                tenant: tenant("globex"),
                inside: Inside::Vnet(1),
            },
        ],
        ..common::config(port)
    }
}

fn tenant_stats<'a>(st: &'a DataplaneStats, name: &str) -> Option<&'a TenantStats> {
    st.tenants.iter().find(|t| t.tenant == name)
}

fn packets(st: &DataplaneStats, name: &str) -> u64 {
    tenant_stats(st, name).map_or(0, |t| t.packets)
}

/// One tenant's traffic: its tunnel's peer and its VNet.
struct Site {
    peer_sock: UdpSocket,
    peer: Peer,
    vnet: usize,
    vni: u32,
    n: u8,
}

impl Site {
    /// `count` packets each way: peer -> VM (ESP in, VXLAN out) and VM -> peer (VXLAN in,
    /// ESP out), all received at the far end.
    fn exchange(&self, s: &Started, count: usize) {
        let addrs = s.dp.local_addrs();
        let gw_mac = s.dp.gateway_mac(self.vnet).expect("vnet");
        let n = self.n;
        for i in 0..count {
            let inner = udp4(
                &format!("192.168.{n}.9"),
                2000,
                &format!("10.{n}.0.5"),
                1000,
                64,
                &[i as u8],
            );
            let esp = self.peer.seal(&inner);
            self.peer_sock
                .send_to(&esp, addrs.natt[0])
                .expect("send esp");
            let out = udp4(
                &format!("10.{n}.0.5"),
                1000,
                &format!("192.168.{n}.9"),
                2000,
                64,
                &[i as u8],
            );
            s.host
                .send_to(
                    &vxlan(self.vni, gw_mac, VM_MAC, EtherType::IPV4, &out),
                    addrs.vxlan[0],
                )
                .expect("send vxlan");
        }
        for _ in 0..count {
            recv(&s.host);
            recv(&self.peer_sock);
        }
    }
}

fn site(s: &Started, tunnel: u32, vnet: usize, vni: u32, n: u8) -> Site {
    let peer_sock = common::bind("127.0.0.1:0");
    let c = child(
        tunnel,
        0x1000 + tunnel,
        0x2000 + tunnel,
        s.dp.local_addrs().natt[0],
        peer_sock.local_addr().expect("addr"),
        ts(&format!("10.{n}.0.0"), &format!("10.{n}.0.255")),
        ts(&format!("192.168.{n}.0"), &format!("192.168.{n}.255")),
    );
    s.dp.install_child(&c).expect("install");
    Site {
        peer: Peer::of(&c),
        peer_sock,
        vnet,
        vni,
        n,
    }
}

#[test]
fn every_packet_is_charged_to_its_tenant() {
    let s = common::start_beside_host(config);
    let acme = site(&s, 1, 0, 100, 0);
    let globex = site(&s, 2, 1, 200, 1);

    // Off (the default): nothing is measured or shown.
    acme.exchange(&s, 5);
    assert!(s.dp.stats().tenants.is_empty(), "off shows no tenant");

    let weights = vec![(tenant("globex"), 3)];
    s.dp.set_cpu_fairness(&CpuFairnessConfig {
        mode: CpuFairness::Account,
        weights,
    })
    .expect("account");
    // 30 packets each way for acme, 10 for globex: every one counted once, at the point its
    // tenant became known (ESP by SPI, VXLAN by VNI).
    acme.exchange(&s, 30);
    globex.exchange(&s, 10);
    wait_stats(&s.dp, "packets counted per tenant", |st| {
        packets(st, "acme") == 60 && packets(st, "globex") == 20
    });
    let st = s.dp.stats();
    let names: Vec<&str> = st.tenants.iter().map(|t| t.tenant.as_str()).collect();
    assert_eq!(names, vec!["acme", "globex", "idle"]);
    let (a, g, idle) = (
        tenant_stats(&st, "acme").expect("acme"),
        tenant_stats(&st, "globex").expect("globex"),
        tenant_stats(&st, "idle").expect("idle"),
    );
    assert!(a.cpu_ns > 0 && g.cpu_ns > 0, "both charged: {st:?}");
    assert_eq!(
        (idle.packets, idle.cpu_ns),
        (0, 0),
        "nothing for the idle tenant"
    );
    assert_eq!((a.cpu_weight, g.cpu_weight, idle.cpu_weight), (1, 3, 1));
    assert_eq!(
        (a.fair_drops, a.tokens_ns),
        (0, None),
        "accounting drops nothing"
    );

    // Off again: counted no more (the workers stop at the batch that sees it).
    s.dp.set_cpu_fairness(&CpuFairnessConfig::default())
        .expect("off");
    acme.exchange(&s, 10);
    let after = s.dp.stats();
    assert_eq!(packets(&after, "acme"), 60, "nothing counted while off");
    assert_eq!(packets(&after, "globex"), 20);
}

#[test]
fn enforcing_drops_nothing_while_the_workers_keep_up() {
    // A few hundred packets on two workers are far below what they can do: every bucket
    // stays positive (work conservation), nothing is dropped for a fair share, and the
    // tokens are shown.
    let s = common::start_beside_host(config);
    let acme = site(&s, 1, 0, 100, 0);
    let globex = site(&s, 2, 1, 200, 1);
    s.dp.set_cpu_fairness(&CpuFairnessConfig {
        mode: CpuFairness::Enforce,
        weights: vec![(tenant("acme"), 1), (tenant("globex"), 3)],
    })
    .expect("enforce");
    acme.exchange(&s, 30);
    globex.exchange(&s, 30);
    wait_stats(&s.dp, "packets counted per tenant", |st| {
        packets(st, "acme") == 60 && packets(st, "globex") == 60
    });
    let st = s.dp.stats();
    for name in ["acme", "globex"] {
        let t = tenant_stats(&st, name).expect("tenant");
        assert_eq!(t.fair_drops, 0, "{st:?}");
        assert!(
            t.tokens_ns.is_some(),
            "tokens shown while enforcing: {st:?}"
        );
    }
    assert_eq!(common::drop_count(&st, "fair_share"), 0);
    // The kernel gate opened with enforcement (as root), and dropped nothing either.
    if testreq::need(
        &testreq::this_test(),
        st.fair_kernel_drops.is_some(),
        "the kernel gate of CPU fairness did not open (bpf(2) socket filters)",
        "run as root (CAP_BPF) on Linux 5.5 or later",
    ) {
        assert_eq!(st.fair_kernel_drops, Some(0));
    }
}

#[test]
fn the_kernel_gate_stays_closed_when_turned_off() {
    let s = common::start_beside_host(|port| DataplaneConfig {
        fair_kernel_gate: false,
        ..config(port)
    });
    let acme = site(&s, 1, 0, 100, 0);
    s.dp.set_cpu_fairness(&CpuFairnessConfig {
        mode: CpuFairness::Enforce,
        weights: vec![(tenant("acme"), 1)],
    })
    .expect("enforce");
    acme.exchange(&s, 10);
    wait_stats(&s.dp, "packets counted", |st| packets(st, "acme") == 20);
    assert_eq!(s.dp.stats().fair_kernel_drops, None);
}
