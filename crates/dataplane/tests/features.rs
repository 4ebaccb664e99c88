//! The per-tenant feature chain, proven through its public interface with real packets: the
//! data plane runs with real sockets and threads on loopback (a peer speaks ESP-in-UDP to the
//! NAT-T socket, a host socket on 127.0.0.2 plays the VXLAN VTEP of VM 10.0.0.5), and test
//! stages plugged in with [`Dataplane::set_feature_chain`] count, rewrite and drop packets in
//! both directions.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{drop_count, drop_counter, recv, wait_stats};
use protego_dataplane::{
    DataPath, Dataplane, DataplaneError, DataplaneStats, Direction, Feature, FeatureBatch,
    FeatureChain, Inside,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use testutil::{parse_vxlan, udp4, vxlan, Peer};
use wire::ethernet::EtherType;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];

/// Offset of the first UDP payload byte of an IPv4 packet without options.
const PAYLOAD: usize = 28;

/// Counts the packets it sees and writes a mark into each (the payload's second byte).
struct Count {
    direction: Direction,
    mark: u8,
    seen: AtomicU64,
    /// What `batch_done` was told the stage saw, summed.
    charged: AtomicU64,
}

impl Count {
    fn new(direction: Direction, mark: u8) -> Arc<Self> {
        Arc::new(Self {
            direction,
            mark,
            seen: AtomicU64::new(0),
            charged: AtomicU64::new(0),
        })
    }
}

impl Feature for Count {
    fn name(&self) -> &'static str {
        "test_count"
    }

    fn process(&self, batch: &mut FeatureBatch<'_>) {
        assert_eq!(batch.tenant(), "acme");
        assert_eq!(batch.direction(), self.direction);
        for i in 0..batch.len() {
            let meta = batch.meta(i);
            assert_eq!(
                (meta.tunnel, meta.direction, &meta.inside),
                (
                    (self.direction == Direction::Inbound).then_some(ike::TunnelId(1)),
                    self.direction,
                    &Inside::Vnet(0)
                )
            );
            if let Some(b) = batch.packet_mut(i).get_mut(PAYLOAD + 1) {
                *b = self.mark;
            }
        }
        self.seen.fetch_add(batch.len() as u64, Ordering::Relaxed);
    }

    fn batch_done(&self, tenant: &ids::TenantId, seen: usize, packets: u64, busy: Duration) {
        assert_eq!(tenant, "acme");
        assert!(seen as u64 <= packets && busy > Duration::ZERO);
        self.charged.fetch_add(seen as u64, Ordering::Relaxed);
    }
}

/// Drops the packets whose first payload byte is odd.
struct DropOdd {
    reasons: &'static [&'static str],
}

impl Feature for DropOdd {
    fn name(&self) -> &'static str {
        "test_drop_odd"
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        self.reasons
    }

    fn process(&self, batch: &mut FeatureBatch<'_>) {
        for i in 0..batch.len() {
            if batch.packet(i).get(PAYLOAD).is_some_and(|b| b % 2 == 1) {
                batch.drop_packet(i, 0);
                assert!(batch.is_dropped(i));
            }
        }
    }
}

#[test]
fn feature_chains_count_rewrite_and_drop_both_ways() {
    let s = common::peer_and_host();
    let c = common::site_child(s.natt, s.peer.local_addr().expect("addr"));
    s.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let gw_mac = s.dp.gateway_mac(0).expect("vnet 0");

    // A stage may not reuse one of the data plane's own drop reasons.
    let clash = FeatureChain::new().with(Arc::new(DropOdd {
        reasons: &["esp_replay"],
    }));
    assert!(matches!(
        s.dp.set_feature_chain(
            &ids::TenantId::new("acme").expect("tenant"),
            Direction::Inbound,
            clash
        ),
        Err(DataplaneError::Config { .. })
    ));

    let count_out = Count::new(Direction::Outbound, 0xa0);
    let count_in = Count::new(Direction::Inbound, 0xb0);
    let out_chain = FeatureChain::new()
        .with(Arc::clone(&count_out) as Arc<dyn Feature>)
        .with(Arc::new(DropOdd {
            reasons: &["test_odd_out"],
        }));
    let in_chain = FeatureChain::new()
        .with(Arc::clone(&count_in) as Arc<dyn Feature>)
        .with(Arc::new(DropOdd {
            reasons: &["test_odd_in"],
        }));
    assert_eq!(out_chain.len(), 2);
    s.dp.set_feature_chain(
        &ids::TenantId::new("acme").expect("tenant"),
        Direction::Outbound,
        out_chain,
    )
    .expect("outbound chain");
    s.dp.set_feature_chain(
        &ids::TenantId::new("acme").expect("tenant"),
        Direction::Inbound,
        in_chain,
    )
    .expect("inbound chain");
    let st = s.dp.stats();
    assert_eq!(drop_counter(&st, "acme/test_odd_out"), Some(0));
    assert_eq!(drop_counter(&st, "acme/test_odd_in"), Some(0));
    assert_eq!(
        drop_counter(&st, "esp_replay"),
        Some(0),
        "own reasons unchanged"
    );

    // VM -> peer: ten packets, the odd ones dropped by the outbound chain. The gateway also
    // learns the VM's MAC from them.
    for i in 0..10u8 {
        let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, &[i, 0, 0, 0]);
        s.host
            .send_to(&vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &inner), s.vtep)
            .expect("send vxlan");
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        let inner = peer.open(&recv(&s.peer).0).expect("peer opens");
        assert_eq!(inner[PAYLOAD + 1], 0xa0, "rewritten by the outbound chain");
        assert_eq!(inner[8], 63, "forwarded: TTL decremented");
        got.push(inner[PAYLOAD]);
    }
    got.sort_unstable();
    assert_eq!(got, vec![0, 2, 4, 6, 8]);
    wait_stats(&s.dp, "outbound drops counted", |st| {
        drop_counter(st, "acme/test_odd_out") == Some(5)
            && count_out.charged.load(Ordering::Relaxed) == 10
    });
    assert_eq!(count_out.seen.load(Ordering::Relaxed), 10);

    // Peer -> VM: ten packets, the odd ones dropped by the inbound chain.
    for i in 0..10u8 {
        let inner = udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, &[i, 0, 0, 0]);
        s.peer
            .send_to(&peer.seal(&inner), s.natt)
            .expect("send esp");
    }
    let mut got = Vec::new();
    while got.len() < 5 {
        let (vni, dst, _, ty, payload) = parse_vxlan(&recv(&s.host).0);
        if ty != EtherType::IPV4 {
            continue;
        }
        assert_eq!((vni, dst), (100, VM_MAC));
        assert_eq!(payload[PAYLOAD + 1], 0xb0, "rewritten by the inbound chain");
        got.push(payload[PAYLOAD]);
    }
    got.sort_unstable();
    assert_eq!(got, vec![0, 2, 4, 6, 8]);
    wait_stats(&s.dp, "inbound drops counted", |st| {
        drop_counter(st, "acme/test_odd_in") == Some(5)
            && count_in.charged.load(Ordering::Relaxed) == 10
            && st.children[0].packets_in == 10
    });
    assert_eq!(count_in.seen.load(Ordering::Relaxed), 10);
    assert_eq!(drop_counter(&s.dp.stats(), "esp_replay"), Some(0));

    // An empty chain removes the tenant's: packets pass untouched again.
    s.dp.set_feature_chain(
        &ids::TenantId::new("acme").expect("tenant"),
        Direction::Outbound,
        FeatureChain::new(),
    )
    .expect("cleared");
    let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, &[7, 0, 0, 0]);
    s.host
        .send_to(&vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &inner), s.vtep)
        .expect("send vxlan");
    let inner = peer.open(&recv(&s.peer).0).expect("peer opens");
    assert_eq!((inner[PAYLOAD], inner[PAYLOAD + 1]), (7, 0));
    assert_eq!(count_out.seen.load(Ordering::Relaxed), 10);
    assert_eq!(drop_counter(&s.dp.stats(), "acme/test_odd_out"), Some(5));
}

/// A source NAT: rewrites the inner IPv4 source `from.x` of outbound packets to `to.x` (the
/// first three bytes of the address), fixing the header checksum and clearing the UDP one
/// (optional over IPv4, RFC 768).
struct SourceNat {
    from: [u8; 3],
    to: [u8; 3],
}

/// The IPv4 header checksum of `h` (its checksum field taken as zero).
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for (i, w) in h.chunks(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Feature for SourceNat {
    fn name(&self) -> &'static str {
        "test_snat"
    }

    fn process(&self, batch: &mut FeatureBatch<'_>) {
        assert_eq!(batch.direction(), Direction::Outbound);
        for i in 0..batch.len() {
            assert_eq!(batch.meta(i).tunnel, None, "chosen after the chain");
            let p = batch.packet_mut(i);
            if p[12..15] != self.from {
                continue;
            }
            p[12..15].copy_from_slice(&self.to);
            let c = ipv4_checksum(&p[..20]);
            p[10..12].copy_from_slice(&c.to_be_bytes());
            p[26..28].copy_from_slice(&[0, 0]);
        }
    }
}

#[test]
fn outbound_chain_runs_before_the_child_sa_choice() {
    let s = common::peer_and_host();
    let c = common::site_child(s.natt, s.peer.local_addr().expect("addr"));
    s.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let gw_mac = s.dp.gateway_mac(0).expect("vnet 0");
    let send = |src: &str, tag: u8| {
        let inner = udp4(src, 1000, "192.168.0.9", 2000, 64, &[tag, 0, 0, 0]);
        s.host
            .send_to(&vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &inner), s.vtep)
            .expect("send vxlan");
    };
    let no_tunnel = |st: &DataplaneStats| drop_count(st, "vxlan_no_tunnel");

    // Without a chain, a source outside every tunnel's selectors has no tunnel.
    send("172.16.0.5", 1);
    wait_stats(&s.dp, "no tunnel without NAT", |st| no_tunnel(st) == 1);

    // A NAT of 172.16.0.0/24 into the tunnel's 10.0.0.0/24: the packet leaves sealed in it.
    let nat = FeatureChain::new().with(Arc::new(SourceNat {
        from: [172, 16, 0],
        to: [10, 0, 0],
    }));
    s.dp.set_feature_chain(
        &ids::TenantId::new("acme").expect("tenant"),
        Direction::Outbound,
        nat,
    )
    .expect("nat chain");
    send("172.16.0.5", 2);
    let inner = peer.open(&recv(&s.peer).0).expect("sealed in tunnel 1");
    assert_eq!(&inner[12..16], &[10, 0, 0, 5], "translated source");
    assert_eq!(
        (inner[PAYLOAD], inner[8]),
        (2, 63),
        "forwarded after the chain"
    );
    assert_eq!(
        u16::from_be_bytes([inner[10], inner[11]]),
        ipv4_checksum(&inner[..20]),
        "header checksum valid after NAT and TTL decrement"
    );
    assert_eq!(no_tunnel(&s.dp.stats()), 1);

    // A NAT out of every tunnel's selectors: dropped for having no tunnel, not sent.
    let away = FeatureChain::new().with(Arc::new(SourceNat {
        from: [10, 0, 0],
        to: [10, 9, 9],
    }));
    s.dp.set_feature_chain(
        &ids::TenantId::new("acme").expect("tenant"),
        Direction::Outbound,
        away,
    )
    .expect("nat chain");
    send("10.0.0.5", 3);
    wait_stats(&s.dp, "no tunnel after NAT", |st| no_tunnel(st) == 2);
    s.dp.set_feature_chain(
        &ids::TenantId::new("acme").expect("tenant"),
        Direction::Outbound,
        FeatureChain::new(),
    )
    .expect("cleared");
    send("10.0.0.5", 4);
    let inner = peer.open(&recv(&s.peer).0).expect("peer opens");
    assert_eq!(inner[PAYLOAD], 4, "the rewritten packet was never sent");
}

#[test]
fn drop_counters_are_per_tenant_and_a_refused_chain_leaves_none() {
    let s = common::peer_and_host();
    let names = |dp: &Dataplane| -> Vec<String> {
        dp.stats()
            .drops
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n.contains('/'))
            .collect()
    };
    // The second stage clashes: the first one's reason must not be left behind.
    let refused = FeatureChain::new()
        .with(Arc::new(DropOdd {
            reasons: &["test_first"],
        }))
        .with(Arc::new(DropOdd {
            reasons: &["esp_auth"],
        }));
    assert!(matches!(
        s.dp.set_feature_chain(
            &ids::TenantId::new("acme").expect("tenant"),
            Direction::Inbound,
            refused
        ),
        Err(DataplaneError::Config { .. })
    ));
    let twice = FeatureChain::new()
        .with(Arc::new(DropOdd {
            reasons: &["test_first"],
        }))
        .with(Arc::new(DropOdd {
            reasons: &["test_first"],
        }));
    assert!(s
        .dp
        .set_feature_chain(
            &ids::TenantId::new("acme").expect("tenant"),
            Direction::Inbound,
            twice
        )
        .is_err());
    assert_eq!(names(&s.dp), Vec::<String>::new(), "nothing changed");

    // One reason name in two tenants' chains: two counters.
    for tenant in ["acme", "globex"] {
        let chain = FeatureChain::new().with(Arc::new(DropOdd {
            reasons: &["test_odd"],
        }));
        s.dp.set_feature_chain(
            &ids::TenantId::new(tenant).expect("tenant"),
            Direction::Outbound,
            chain,
        )
        .expect("chain");
    }
    assert_eq!(names(&s.dp), vec!["acme/test_odd", "globex/test_odd"]);

    // Only acme's counts acme's drops.
    let gw_mac = s.dp.gateway_mac(0).expect("vnet 0");
    for i in [1u8, 3] {
        let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, &[i, 0, 0, 0]);
        s.host
            .send_to(&vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &inner), s.vtep)
            .expect("send vxlan");
    }
    wait_stats(&s.dp, "acme's drops", |st| {
        drop_counter(st, "acme/test_odd") == Some(2)
    });
    assert_eq!(drop_counter(&s.dp.stats(), "globex/test_odd"), Some(0));
}
