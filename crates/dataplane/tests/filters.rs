//! Tenant filters (issue 18) in the running data path, with real packets on loopback as in
//! `features.rs`: a peer speaks ESP-in-UDP to the NAT-T socket, a host socket plays the VTEP
//! of VM 10.0.0.5, and `tests/filters/echo.c` (compiled with clang-14) runs as tenant acme's
//! filter in each direction: it drops, passes, sends back (`XDP_TX`), lengthens and aborts.
//! The same between a CE attached at L2 (a veth pair in a namespace of the test's own) and
//! the VM.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{drop_counter, packet_socket, recv, wait_stats, PeerAndHost};
use datapath::{AttachmentConfig, AttachmentTags, FilterConfig, FilterDirection};
use protego_dataplane::{DataPath, DataplaneConfig, DataplaneError};
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
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

/// Installs the site's CHILD_SA and has the VM speak first through it, so the gateway knows
/// the VM's MAC; returns the peer's end of the SA and the gateway's MAC.
fn tunnel_up(s: &PeerAndHost) -> (Peer, [u8; 6]) {
    let c = common::site_child(s.natt, s.peer.local_addr().expect("addr"));
    s.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let gw_mac = s.dp.gateway_mac(0).expect("vnet 0");
    let hello = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, &[0; 4]);
    s.host
        .send_to(&vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &hello), s.vtep)
        .expect("send vxlan");
    peer.open(&recv(&s.peer).0).expect("peer opens");
    (peer, gw_mac)
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
    let s = common::peer_and_host();
    let (peer, gw_mac) = tunnel_up(&s);

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

    // Each program's counters, summed over the workers: the verdicts above, CPU time.
    let report =
        s.dp.filter_report(Some(&ids::TenantId::new("acme").expect("tenant")));
    let counters = |d: FilterDirection| {
        let p = (report.programs.iter())
            .find(|p| p.direction == d)
            .expect("the program of each direction");
        assert!(p.instructions > 0 && p.counters.cpu_ns > 0, "{p:?}");
        let c = p.counters;
        (c.passed, c.dropped, c.tx, c.aborted)
    };
    assert_eq!(counters(FilterDirection::ToCloud), (2, 1, 1, 1));
    assert_eq!(counters(FilterDirection::FromCloud), (1, 1, 1, 0));
    assert!(!report.maps.is_empty());
    assert!(s
        .dp
        .filter_report(Some(&ids::TenantId::new("other").expect("tenant")))
        .programs
        .is_empty());

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

/// The ones' complement sum of `data` (RFC 1071), folded, not complemented.
fn sum16(data: &[u8], mut sum: u32) -> u32 {
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// An IPv4 TCP segment without payload: `flags` (0x02 SYN, 0x10 ACK, 0x12 SYN-ACK), an MSS
/// option if `mss` is given, checksums filled in. (The arguments are the header's fields.)
#[allow(clippy::too_many_arguments)]
fn tcp4(
    src: [u8; 4],
    sport: u16,
    dst: [u8; 4],
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    mss: Option<u16>,
) -> Vec<u8> {
    let tcp_len = 20 + if mss.is_some() { 4 } else { 0 };
    let total = 20 + tcp_len;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[6] = 0x40;
    p[8] = 64;
    p[9] = 6;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    let ip_sum = !(sum16(&p[..20], 0) as u16);
    p[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = ((tcp_len / 4) as u8) << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&29200u16.to_be_bytes());
    if let Some(mss) = mss {
        t[20..24].copy_from_slice(&[2, 4, (mss >> 8) as u8, mss as u8]);
    }
    let sum = tcp_sum(&p);
    p[36..38].copy_from_slice(&sum.to_be_bytes());
    p
}

/// The TCP checksum an IPv4 packet's segment should carry (its checksum field taken as 0).
fn tcp_sum(p: &[u8]) -> u16 {
    let tcp = &p[20..];
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&p[12..20]);
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
    let mut seg = tcp.to_vec();
    seg[16..18].copy_from_slice(&[0, 0]);
    !(sum16(&seg, sum16(&pseudo, 0)) as u16)
}

/// (seq, ack, flags, MSS option) of an IPv4 TCP packet, checksums checked.
fn segment(p: &[u8]) -> (u32, u32, u8, Option<u16>) {
    assert_eq!(p[9], 6, "TCP");
    assert_eq!(!(sum16(&p[..20], 0) as u16), 0, "IPv4 checksum");
    assert_eq!(
        u16::from_be_bytes([p[36], p[37]]),
        tcp_sum(p),
        "TCP checksum"
    );
    let t = &p[20..];
    let word = |i: usize| u32::from_be_bytes([t[i], t[i + 1], t[i + 2], t[i + 3]]);
    let mss =
        (t[12] >> 4 >= 6 && t[20] == 2 && t[21] == 4).then(|| u16::from_be_bytes([t[22], t[23]]));
    (word(4), word(8), t[13], mss)
}

/// The SYN-cookie proxy of `examples/filters/syncookie.c` completes a TCP handshake through a
/// tunnel: the peer's SYN is answered by the gateway with a cookie (the VM sees nothing), the
/// peer's ACK carrying the cookie becomes the SYN the VM gets, the VM's SYN-ACK is answered
/// for the peer, and the connection's sequence numbers are translated from then on.
#[test]
fn the_syn_cookie_proxy_completes_a_handshake_through_a_tunnel() {
    let Some((_, bytes)) =
        testreq::bpf::example("syncookie", Path::new(env!("CARGO_TARGET_TMPDIR")))
    else {
        return;
    };
    let object: Arc<[u8]> = bytes.into();
    let s = common::peer_and_host();
    let (peer, gw_mac) = tunnel_up(&s);
    let section = |direction, section: &str| FilterConfig {
        section: section.into(),
        ..filter(&object, direction)
    };
    s.dp.set_filters(&[
        section(FilterDirection::ToCloud, "xdp:syncookie_in"),
        section(FilterDirection::FromCloud, "xdp:syncookie_out"),
    ])
    .expect("filters set");
    let maps =
        s.dp.filter_maps(&ids::TenantId::new("acme").expect("tenant"));
    let map = |name: &str| {
        maps.iter()
            .find(|m| m.spec().name == name)
            .unwrap_or_else(|| panic!("map {name}"))
            .clone()
    };
    // Port 80 is protected (the key is the port in network order, as the program reads it).
    map("protected_ports")
        .update(&80u16.to_be_bytes(), &[1], 0)
        .expect("protect port 80");

    let (peer_ip, vm_ip) = ([192, 168, 0, 9], [10, 0, 0, 5]);
    let isn = 1_000_000u32;
    // SYN: answered by the gateway, through the tunnel, with a cookie.
    let syn = tcp4(peer_ip, 40000, vm_ip, 80, isn, 0, 0x02, Some(1460));
    s.peer.send_to(&peer.seal(&syn), s.natt).expect("send syn");
    let synack = peer
        .open(&recv(&s.peer).0)
        .expect("the peer opens the SYN-ACK");
    assert_eq!(&synack[12..16], &vm_ip);
    assert_eq!(&synack[16..20], &peer_ip);
    let (cookie, ack, flags, mss) = segment(&synack);
    assert_eq!((ack, flags, mss), (isn + 1, 0x12, Some(1460)));
    // ACK with the cookie: the VM gets the peer's SYN (its ISN, the MSS from the cookie).
    let ack = tcp4(
        peer_ip,
        40000,
        vm_ip,
        80,
        isn + 1,
        cookie.wrapping_add(1),
        0x10,
        None,
    );
    s.peer.send_to(&peer.seal(&ack), s.natt).expect("send ack");
    let to_server = to_vm(&s.host);
    assert_eq!(segment(&to_server), (isn, 0, 0x02, Some(1460)));
    // The VM answers with its own ISN: the gateway acknowledges it for the peer.
    let server_isn = 7_000_000u32;
    let server_synack = tcp4(
        vm_ip,
        80,
        peer_ip,
        40000,
        server_isn,
        isn + 1,
        0x12,
        Some(1460),
    );
    s.host
        .send_to(
            &vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &server_synack),
            s.vtep,
        )
        .expect("send vxlan");
    let back = to_vm(&s.host);
    assert_eq!(&back[16..20], &vm_ip, "back to the VM");
    assert_eq!(segment(&back), (isn + 1, server_isn + 1, 0x10, None));
    // From now on the VM's sequence numbers reach the peer in the cookie's space, and the
    // peer's acknowledgements reach the VM in the VM's.
    let data = tcp4(
        vm_ip,
        80,
        peer_ip,
        40000,
        server_isn + 1,
        isn + 1,
        0x10,
        None,
    );
    s.host
        .send_to(&vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &data), s.vtep)
        .expect("send vxlan");
    let at_peer = peer.open(&recv(&s.peer).0).expect("peer opens");
    assert_eq!(segment(&at_peer).0, cookie.wrapping_add(1));
    let peer_ack = tcp4(
        peer_ip,
        40000,
        vm_ip,
        80,
        isn + 1,
        cookie.wrapping_add(1),
        0x10,
        None,
    );
    s.peer
        .send_to(&peer.seal(&peer_ack), s.natt)
        .expect("send ack");
    let at_vm = to_vm(&s.host);
    assert_eq!(segment(&at_vm).1, server_isn + 1);
    // An ACK with a wrong cookie for another connection is answered with a RST.
    let forged = tcp4(peer_ip, 40001, vm_ip, 80, 5, 12345, 0x10, None);
    s.peer
        .send_to(&peer.seal(&forged), s.natt)
        .expect("send forged ack");
    let rst = peer.open(&recv(&s.peer).0).expect("peer opens the RST");
    let (seq, _, flags, _) = segment(&rst);
    assert_eq!((seq, flags & 0x04), (12345, 0x04));
}

/// The CE's MAC on the attachment's segment.
const CE_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0xa, 1];
/// The attachment interface's MAC (the gateway's on the segment).
const GW_PORT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];

/// A tenant's filters see its attached CE's traffic too: what the CE sends toward the VNet
/// passes the `to_cloud` filter, what the VMs send to the CE the `from_cloud` one, and
/// `XDP_TX` sends each back the way it came (to the CE, into the VNet). In a network
/// namespace of its own (a veth pair for the attachment); needs root.
#[test]
fn a_tenant_filter_sees_an_attached_ces_traffic_both_ways() {
    std::thread::spawn(ce_and_vm_through_filters)
        .join()
        .expect("the test's thread");
}

fn ce_and_vm_through_filters() {
    let Some(object) = echo() else {
        return;
    };
    common::attachment_namespace();
    let ip = |s: &str| s.parse::<std::net::IpAddr>().expect("ip");
    let common::Started { dp, host, .. } = common::start_beside_host(|port| DataplaneConfig {
        attachments: vec![AttachmentConfig {
            name: "dc".into(),
            tenant: ids::TenantId::new("acme").expect("tenant"),
            vnet: "prod".into(),
            port: datapath::AttachmentPort::Interface("gw0".into()),
            tags: AttachmentTags::Vlan { c_tag: 10 },
            gateway_ip: ip("10.99.0.1"),
            ce_ip: None,
            routes: vec![(ip("10.99.0.0"), 24)],
            ce_mac: None,
        }],
        tunnels: vec![],
        ..common::config(port)
    });
    dp.set_filters(&[
        filter(&object, FilterDirection::ToCloud),
        filter(&object, FilterDirection::FromCloud),
    ])
    .expect("filters set");
    let vtep = dp.local_addrs().vxlan[0];
    let gw_mac = dp.gateway_mac(0).expect("vnet 0");
    let ce = packet_socket("ce0", true);
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 200_000,
    };
    // SAFETY: sets a timeval option on a live socket from a live timeval.
    let ret = unsafe {
        libc::setsockopt(
            ce.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    assert_eq!(ret, 0, "SO_RCVTIMEO");
    // The CE sends UDP from 10.99.0.2 to the VM on `port`, tagged 10, marked `mark`.
    let from_ce = |port: u16, mark: u8| {
        let mut f = GW_PORT_MAC.to_vec();
        f.extend_from_slice(&CE_MAC);
        f.extend_from_slice(&[0x81, 0x00, 0x00, 10, 0x08, 0x00]);
        f.extend_from_slice(&udp4(
            "10.99.0.2",
            3000,
            "10.0.0.5",
            port,
            64,
            &[mark, 0, 0, 0],
        ));
        // SAFETY: writes a live buffer of the length given on a live descriptor.
        let n = unsafe { libc::send(ce.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
        assert_eq!(n, f.len() as isize, "write to ce0");
    };
    // The next IPv4 packet the gateway sends the CE (tagged 10, to its MAC), if one comes.
    let to_ce = || -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        for _ in 0..50 {
            // SAFETY: reads into a live buffer of the length given.
            let n = unsafe { libc::recv(ce.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return None;
            }
            let f = &buf[..n as usize];
            // Ours: from the gateway's port to the CE, IPv4 tagged 10 (the tag may have been
            // taken off into the packet's metadata by the veth's VLAN offload); the CE's own
            // frames show up too, and so do the kernel's own multicast frames from the
            // gateway's port (IPv6 MLD reports to 33:33:00:00:00:16 once the link is up).
            if f.len() < 18 || f[6..12] != GW_PORT_MAC || f[0] & 1 == 1 {
                continue;
            }
            assert_eq!(&f[..6], &CE_MAC, "to the CE's MAC");
            let ip = match f[12..16] {
                [0x81, 0, 0, 10] if f[16..18] == [8, 0] => 18,
                [8, 0, ..] => 14,
                _ => panic!("not an IPv4 frame tagged 10: {f:02x?}"),
            };
            return Some(f[ip..].to_vec());
        }
        None
    };

    // The VM sends from 10.0.0.5 to the CE on `port`, marked `mark`.
    let from_vm = |port: u16, mark: u8| {
        let inner = udp4("10.0.0.5", 1000, "10.99.0.2", port, 64, &[mark, 0, 0, 0]);
        host.send_to(&vxlan(100, gw_mac, VM_MAC, EtherType::IPV4, &inner), vtep)
            .expect("send vxlan");
    };
    // The VM speaks first, so that the gateway knows its MAC (the CE's is not known yet:
    // dropped after the filter passed it).
    from_vm(2000, 0);
    wait_stats(&dp, "the VM's first packet", |st| {
        drop_counter(st, "attach_ce_unresolved") == Some(1)
    });

    // CE -> VM (to_cloud): port 2000 passes, 9 is dropped, 7 comes back to the CE.
    from_ce(2000, 1);
    let p = to_vm(&host);
    assert_eq!(
        (&p[12..16], p[PAYLOAD]),
        (&[10, 99, 0, 2][..], 1),
        "passed to the VM"
    );
    from_ce(9, 2);
    from_ce(7, 3);
    let Some(back) = to_ce() else {
        panic!(
            "the CE gets no packet its filter sent back: {:?}",
            dp.stats()
                .drops
                .iter()
                .filter(|(_, n)| *n > 0)
                .collect::<Vec<_>>()
        );
    };
    assert_eq!(&back[12..16], &[10, 0, 0, 5], "from the VM's address");
    assert_eq!(&back[16..20], &[10, 99, 0, 2], "to the CE's");
    assert_eq!(back[PAYLOAD], 3);
    from_ce(2000, 4);
    assert_eq!(to_vm(&host)[PAYLOAD], 4, "the dropped packet never arrived");
    wait_stats(
        &dp,
        "the CE's packet dropped by the to_cloud filter",
        |st| drop_counter(st, "acme/filter_drop") == Some(1),
    );

    // VM -> CE (from_cloud): port 2000 reaches the CE, 9 is dropped, 7 comes back to the VM.
    from_vm(2000, 5);
    let p = to_ce().expect("the CE gets the VM's packet");
    assert_eq!(p[PAYLOAD], 5);
    from_vm(9, 6);
    from_vm(7, 7);
    let p = to_vm(&host);
    assert_eq!(
        &p[12..16],
        &[10, 99, 0, 2],
        "sent back from the CE's address"
    );
    assert_eq!((&p[16..20], p[PAYLOAD]), (&[10, 0, 0, 5][..], 7));
    from_vm(2000, 8);
    assert_eq!(to_ce().expect("the CE gets the next one")[PAYLOAD], 8);
    wait_stats(
        &dp,
        "the VM's packet dropped by the from_cloud filter",
        |st| drop_counter(st, "acme/filter_drop") == Some(2),
    );
    let report = dp.filter_report(None);
    let tx: u64 = report.programs.iter().map(|p| p.counters.tx).sum();
    assert_eq!(tx, 2, "{report:?}");
    dp.shutdown();
}
