//! One tunnel on several workers, with real sockets on loopback: a burst of ESP (RFC 4303) from
//! the peer comes out as VXLAN (RFC 7348) in exactly the order it was sent, the anti-replay
//! window accepts packets in arrival order although several workers open packets of the same
//! SA at once (so it refuses nothing, even after losses longer than itself), and both workers
//! take part; a burst of VXLAN from the host leaves as ESP whose sequence numbers arrive
//! strictly in order (RFC 4303 §3.3.3 numbers allocated at dispatch). Only loopback addresses
//! are used.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{drop_count, try_recv, Started};
use protego_dataplane::{DataPath, Dataplane, DataplaneConfig};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testutil::{arp, parse_vxlan, udp4, vxlan, Peer};
use wire::arp::ArpOperation;
use wire::ethernet::EtherType;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 7];
const BURST: u32 = 8_192;

fn big_rcvbuf(s: &UdpSocket) {
    let size: libc::c_int = 64 << 20;
    // SAFETY: sets an integer option on a live socket from a live c_int.
    let ret = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(ret, 0, "SO_RCVBUFFORCE (tests run as root)");
}

struct Bed {
    dp: Arc<Dataplane>,
    host: UdpSocket,
    peer: UdpSocket,
    natt: SocketAddr,
    vtep: SocketAddr,
}

fn bed(workers: usize) -> Bed {
    let Started { dp, host, .. } = common::start_beside_host(|port| DataplaneConfig {
        // One receive slot per batch (one GRO train of up to 128 packets), so a window of
        // the paced sender spans several batches that the workers take in turn.
        batch: 1,
        workers,
        ..common::config(port)
    });
    let addrs = dp.local_addrs();
    let peer = common::bind("127.0.0.1:0");
    big_rcvbuf(&host);
    big_rcvbuf(&peer);
    Bed {
        dp,
        host,
        peer,
        natt: addrs.natt[0],
        vtep: addrs.vxlan[0],
    }
}

/// Sends `datagrams` to `to` in windows of `WINDOW`, waiting before each window until the
/// data plane's workers have taken all but one window of what was sent, so no socket
/// buffer overflows however slow the (shared, 2-core) machine is, while each window still
/// arrives as a burst that several workers share.
fn send_paced(b: &Bed, from: &UdpSocket, to: SocketAddr, datagrams: &[Vec<u8>]) {
    const WINDOW: usize = 512;
    let base: u64 = b.dp.stats().workers.iter().map(|w| w.packets).sum();
    for (n, chunk) in datagrams.chunks(WINDOW).enumerate() {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let done: u64 = b.dp.stats().workers.iter().map(|w| w.packets).sum::<u64>() - base;
            if done + WINDOW as u64 >= (n * WINDOW) as u64 {
                break;
            }
            assert!(Instant::now() < deadline, "workers stalled at {done}");
            std::thread::sleep(Duration::from_micros(200));
        }
        for d in chunk {
            from.send_to(d, to).expect("send");
        }
    }
}

/// The index a test packet carries in its first 4 payload bytes.
fn index_of(inner: &[u8]) -> u32 {
    u32::from_be_bytes(inner[28..32].try_into().expect("index"))
}

fn payload(i: u32) -> Vec<u8> {
    let mut p = vec![0u8; 1000];
    p[..4].copy_from_slice(&i.to_be_bytes());
    p
}

/// A bed with 2 workers, one CHILD_SA (replay window 64) installed, and the VM's MAC known.
fn two_workers_one_tunnel() -> (Bed, Peer, [u8; 6]) {
    let b = bed(2);
    let c = common::site_child(b.natt, b.peer.local_addr().expect("addr"));
    b.dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let gw = b.dp.gateway_mac(0).expect("vnet");
    // Teach the gateway the VM's MAC first (the VM announces itself with a gratuitous reply).
    let announce = arp(ArpOperation::REPLY, VM_MAC, "10.0.0.5", gw, "10.0.0.1");
    b.host
        .send_to(&vxlan(100, gw, VM_MAC, EtherType::ARP, &announce), b.vtep)
        .expect("announce");
    std::thread::sleep(Duration::from_millis(50));
    (b, peer, gw)
}

/// Seals packets `0..count` toward the VM; those for which `lost` holds are sealed (they use
/// up their sequence numbers) but left out, as if the network had lost them.
fn seal_inbound(peer: &Peer, count: u32, lost: impl Fn(u32) -> bool) -> Vec<(u32, Vec<u8>)> {
    (0..count)
        .map(|i| {
            let inner = udp4("192.168.0.9", 2000, "10.0.0.5", 1000, 64, &payload(i));
            (i, peer.seal(&inner))
        })
        .filter(|(i, _)| !lost(*i))
        .collect()
}

/// Sends the sealed packets to the gateway and returns the indexes the host received, in order.
fn inbound(b: &Bed, sealed: &[(u32, Vec<u8>)]) -> Vec<u32> {
    let reader = {
        let host = b.host.try_clone().expect("clone");
        std::thread::spawn(move || {
            let mut got = Vec::new();
            while let Some((d, _)) = try_recv(&host) {
                let (_, _, _, ty, inner) = parse_vxlan(&d);
                if ty == EtherType::IPV4 {
                    got.push(index_of(&inner));
                }
            }
            got
        })
    };
    let datagrams: Vec<Vec<u8>> = sealed.iter().map(|(_, d)| d.clone()).collect();
    send_paced(b, &b.peer, b.natt, &datagrams);
    reader.join().expect("reader")
}

#[test]
fn one_tunnel_on_two_workers_keeps_order_and_the_replay_window_exact() {
    let (b, peer, gw) = two_workers_one_tunnel();

    // Inbound: a burst of ESP of one SA, pre-sealed so the sender is fast.
    let sealed = seal_inbound(&peer, BURST, |_| false);
    let got = inbound(&b, &sealed);
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "VXLAN output out of order"
    );
    let st = b.dp.stats();
    assert_eq!(
        drop_count(&st, "esp_replay"),
        0,
        "replay window refused packets: {st:?}"
    );
    let ch = &st.children[0];
    assert_eq!(ch.drops_in, 0, "{st:?}");
    // The window accepts in arrival order whatever worker opened a packet: loopback reorders
    // nothing, so neither does the window see anything out of order.
    assert_eq!((ch.reordered_in, ch.max_reorder_in), (0, 0), "{ch:?}");
    assert_eq!(got.len() as u32, BURST, "delivered: {st:?}");
    let busy = st.workers.iter().filter(|w| w.batches > 0).count();
    assert_eq!(busy, 2, "both workers take batches: {:?}", st.workers);

    // Outbound: a burst of VXLAN from the VM leaves as ESP in sequence number order.
    let reader = {
        let peer_sock = b.peer.try_clone().expect("clone");
        std::thread::spawn(move || {
            let mut got = Vec::new();
            while let Some((d, _)) = try_recv(&peer_sock) {
                let seq = u32::from_be_bytes(d[4..8].try_into().expect("seq"));
                got.push((seq, d));
            }
            got
        })
    };
    let frames: Vec<Vec<u8>> = (0..BURST)
        .map(|i| {
            let inner = udp4("10.0.0.5", 1000, "192.168.0.9", 2000, 64, &payload(i));
            vxlan(100, gw, VM_MAC, EtherType::IPV4, &inner)
        })
        .collect();
    send_paced(&b, &b.host, b.vtep, &frames);
    let got = reader.join().expect("reader");
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "ESP sequence numbers out of order"
    );
    let mut last = None;
    for (_, d) in &got {
        let inner = peer.open(d).expect("authentic ESP");
        let i = index_of(&inner);
        assert!(last.is_none_or(|l| l < i), "inner packets out of order");
        last = Some(i);
    }
    assert_eq!(
        got.len() as u32,
        BURST,
        "ESP packets sent: {:?}",
        b.dp.stats()
    );
}

#[test]
fn losses_longer_than_the_window_between_batches_in_flight_refuse_nothing() {
    // Every packet sent is followed by 65 lost ones (the window holds 64): a worker that opens
    // a packet before another worker has opened the one sent before it must not push that one
    // out of the window. Delivered: every packet sent, in order.
    let (b, peer, _) = two_workers_one_tunnel();
    let lost = |i: u32| !i.is_multiple_of(66);
    let sealed = seal_inbound(&peer, 66 * 4096, lost);
    let got = inbound(&b, &sealed);
    let sent: Vec<u32> = sealed.iter().map(|(i, _)| *i).collect();
    let st = b.dp.stats();
    assert_eq!(drop_count(&st, "esp_replay"), 0, "{st:?}");
    assert_eq!(got, sent, "{st:?}");
    let ch = &st.children[0];
    assert_eq!((ch.replay_window, ch.reordered_in), (64, 0), "{ch:?}");
    let busy = st.workers.iter().filter(|w| w.batches > 0).count();
    assert_eq!(busy, 2, "both workers take batches: {:?}", st.workers);
}
