//! Tenant filters (issue 18) in the running data path, with real packets on loopback as in
//! `features.rs`: a peer speaks ESP-in-UDP to the NAT-T socket, a host socket plays the VTEP
//! of VM 10.0.0.5, and `tests/filters/echo.c` (compiled with clang-14) runs as tenant acme's
//! filter in each direction: it drops, passes, sends back (`XDP_TX`), lengthens and aborts.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{drop_counter, recv, wait_stats, Started};
use datapath::{FilterConfig, FilterDirection};
use protego_dataplane::{DataPath, Dataplane, DataplaneError};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use testutil::{parse_vxlan, udp4, vxlan, Peer};
use wire::ethernet::EtherType;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];

/// Offset of the first UDP payload byte of an IPv4 packet without options.
const PAYLOAD: usize = 28;

/// `tests/filters/echo.c`, compiled; `None`: the test returns (no clang-14, not strict).
fn echo() -> Option<Arc<[u8]>> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filters/echo.c");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "echo-{}-{}.o",
        std::process::id(),
        testreq::this_test().replace("::", "-")
    ));
    testreq::bpf::compile(&source, &out, true).map(Into::into)
}

fn filter(object: &Arc<[u8]>, direction: FilterDirection) -> FilterConfig {
    FilterConfig {
        tenant: ids::TenantId::new("acme").expect("tenant"),
        direction,
        object_name: "echo.o".into(),
        object: Arc::clone(object),
        section: "xdp".into(),
        weight: 0,
    }
}

struct Setup {
    dp: Arc<Dataplane>,
    host: UdpSocket,
    peer: UdpSocket,
    natt: SocketAddr,
    vtep: SocketAddr,
}

fn setup() -> Setup {
    let Started { dp, host, .. } = common::start_beside_host(common::config);
    let addrs = dp.local_addrs();
    Setup {
        dp,
        host,
        peer: common::bind("127.0.0.1:0"),
        natt: addrs.natt[0],
        vtep: addrs.vxlan[0],
    }
}

/// The next IPv4 packet the host's VTEP receives for the VM (ARP and others skipped).
fn to_vm(host: &UdpSocket) -> Vec<u8> {
    loop {
        let (vni, dst, _, ty, payload) = parse_vxlan(&recv(host).0);
        if ty == EtherType::IPV4 {
            assert_eq!((vni, dst), (100, VM_MAC));
            return payload.to_vec();
        }
    }
}

#[test]
fn a_tenant_filter_drops_passes_sends_back_and_lengthens_both_ways() {
    let Some(object) = echo() else {
        return;
    };
    let s = setup();
    let c = common::site_child(s.natt, s.peer.local_addr().expect("addr"));
    s.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let gw_mac = s.dp.gateway_mac(0).expect("vnet 0");
    // The VM speaks first, so the gateway knows its MAC.
    let hello = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, &[0; 4]);
    s.host
        .send_to(&vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &hello), s.vtep)
        .expect("send vxlan");
    peer.open(&recv(&s.peer).0).expect("peer opens");

    s.dp.set_filters(&[
        filter(&object, FilterDirection::ToCloud),
        filter(&object, FilterDirection::FromCloud),
    ])
    .expect("filters set");
    let st = s.dp.stats();
    for reason in [
        "acme/filter_drop",
        "acme/filter_aborted",
        "acme/filter_too_long",
    ] {
        assert_eq!(drop_counter(&st, reason), Some(0), "{reason}");
    }

    // Peer -> VM (to_cloud): port 9 dropped, 13 aborted, 2000 passes, 6 lengthened, 7 back.
    let from_peer = |port: u16, mark: u8| {
        let inner = udp4("192.168.0.9", 3000, "10.0.0.5", port, 64, &[mark, 0, 0, 0]);
        s.peer
            .send_to(&peer.seal(&inner), s.natt)
            .expect("send esp");
    };
    from_peer(9, 1);
    from_peer(13, 2);
    from_peer(2000, 3);
    let p = to_vm(&s.host);
    assert_eq!((p[PAYLOAD], p.len()), (3, PAYLOAD + 4), "passed unchanged");
    from_peer(6, 4);
    let p = to_vm(&s.host);
    assert_eq!(p[PAYLOAD], 4);
    assert_eq!(p.len(), PAYLOAD + 4 + 8, "lengthened by the filter");
    assert_eq!(&p[PAYLOAD + 4..], &[0xee; 8]);
    assert_eq!(
        u16::from_be_bytes([p[2], p[3]]) as usize,
        p.len(),
        "IPv4 length"
    );
    from_peer(7, 5);
    let back = peer
        .open(&recv(&s.peer).0)
        .expect("the peer opens the packet sent back");
    assert_eq!(&back[12..16], &[10, 0, 0, 5], "from the VM's address");
    assert_eq!(&back[16..20], &[192, 168, 0, 9], "to the peer's");
    assert_eq!(u16::from_be_bytes([back[20], back[21]]), 7);
    assert_eq!(u16::from_be_bytes([back[22], back[23]]), 3000);
    assert_eq!(back[PAYLOAD], 5);
    wait_stats(&s.dp, "to_cloud verdicts counted", |st| {
        drop_counter(st, "acme/filter_drop") == Some(1)
            && drop_counter(st, "acme/filter_aborted") == Some(1)
            && st.children[0].packets_in == 5
    });

    // VM -> peer (from_cloud): port 9 dropped, 2000 passes, 7 back into the VNet.
    let from_vm = |port: u16, mark: u8| {
        let inner = udp4("10.0.0.5", 1000, "192.168.0.9", port, 64, &[mark, 0, 0, 0]);
        s.host
            .send_to(&vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &inner), s.vtep)
            .expect("send vxlan");
    };
    from_vm(9, 6);
    from_vm(2000, 7);
    let out = peer.open(&recv(&s.peer).0).expect("peer opens");
    assert_eq!(out[PAYLOAD], 7, "only the packet the filter passed");
    from_vm(7, 8);
    let p = to_vm(&s.host);
    assert_eq!(
        &p[12..16],
        &[192, 168, 0, 9],
        "sent back from the peer's address"
    );
    assert_eq!(&p[16..20], &[10, 0, 0, 5], "to the VM");
    assert_eq!(p[PAYLOAD], 8);
    wait_stats(&s.dp, "from_cloud drop counted", |st| {
        drop_counter(st, "acme/filter_drop") == Some(2)
    });

    // Removed: packets pass untouched again; a refused object changes nothing.
    let junk: Arc<[u8]> = Arc::from(&b"not an object"[..]);
    assert!(matches!(
        s.dp.set_filters(&[filter(&junk, FilterDirection::ToCloud)]),
        Err(DataplaneError::Config { .. })
    ));
    from_peer(9, 9);
    std::thread::sleep(Duration::from_millis(50));
    wait_stats(&s.dp, "still filtered", |st| {
        drop_counter(st, "acme/filter_drop") == Some(3)
    });
    s.dp.set_filters(&[]).expect("removed");
    from_peer(9, 10);
    let p = to_vm(&s.host);
    assert_eq!(p[PAYLOAD], 10, "no filter any more");
}
