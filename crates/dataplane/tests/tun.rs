//! Real TUN devices in private network namespaces: each test thread unshares its network
//! namespace (so devices, addresses and routes vanish with the thread, even on failure).
//!
//! - `tun_round_trip`: the data plane's TUN inside interface, UDP through the kernel both ways.
//! - `offload_*`: the offload device itself ([`tun::Tun`] with `IFF_VNET_HDR` and
//!   `TUNSETOFFLOAD`, included from the crate's sources). A relay thread reads the device in
//!   batches, checks every split packet's checksums with an independent routine, rewrites the
//!   addresses so the packet comes back to the namespace from a "remote" address (10.88.0.0/24,
//!   fd88::/64, routed into the device), and writes through the coalescing [`TunWriter`]. TCP and
//!   UDP transfers between sockets of the namespace then cross the device twice: the kernel's
//!   super-packets are split on the read side, and coalesced super-packets must be accepted by
//!   the kernel on the write side. The plain fallback runs the same transfers. Each prints
//!   packets per read and per write syscall.
//!
//! Needs CAP_SYS_ADMIN and CAP_NET_ADMIN; without them a test fails under `make test` and in CI
//! and elsewhere prints why and skips (see `testreq`). A kernel that refuses an offload is not
//! a skip: the device then runs without it, and the test asserts that fallback instead.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

// The device code itself, compiled into this test: what only the data plane uses is dead here.
#[path = "../src/sys/tun.rs"]
#[allow(dead_code)]
mod tun;

#[path = "../src/sys/tun_offload.rs"]
#[allow(dead_code)]
mod tun_offload;

use protego_dataplane::{DataPath, Dataplane, DataplaneConfig, Inside, TunnelBinding};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testutil::{child, ts, udp4, Peer};
use tun::{Tun, TunReadBatch};
use tun_offload::writer::TunWriter;
use tun_offload::Offloads;
use wire::ip::Ipv4Packet;

/// `super::cvt` of the included `tun.rs`.
fn cvt(ret: libc::c_int) -> std::io::Result<libc::c_int> {
    if ret == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn sh(args: &[&str]) {
    let st = Command::new(args[0])
        .args(&args[1..])
        .status()
        .expect("run command");
    assert!(st.success(), "{args:?} failed");
}

/// Runs `f` on a fresh thread in a new network namespace with loopback up; false (after
/// printing why) if the namespace cannot be made.
fn in_netns(test: &'static str, f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        // SAFETY: unshare(2) affects only the calling thread's namespaces.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            let why = std::io::Error::last_os_error();
            testreq::netns_refused(test, &why);
            return;
        }
        sh(&["ip", "link", "set", "lo", "up"]);
        f();
    })
    .join()
    .expect("test thread");
}

fn private_netns_round_trip() {
    let cfg = DataplaneConfig {
        attachments: vec![],
        vnets: vec![],
        tunnels: vec![TunnelBinding {
            tunnel: ike::TunnelId(7),
            name: "lan".into(),
            tenant: ids::TenantId::new("site").expect("tenant"),
            inside: Inside::Tun,
        }],
        tun_name: Some("ptun0".into()),
        batch: 16,
        ..common::config(4789)
    };
    let (tx, _rx) = crossbeam_channel::unbounded();
    let dp = Dataplane::start(cfg, tx).expect("start with TUN");
    sh(&["ip", "addr", "add", "10.9.0.1/24", "dev", "ptun0"]);
    sh(&["ip", "route", "add", "10.8.0.0/24", "dev", "ptun0"]);
    let peer = common::bind("127.0.0.1:0");
    let natt = dp.local_addrs().natt[0];
    let c = child(
        7,
        0x3001,
        0x4001,
        natt,
        peer.local_addr().expect("addr"),
        ts("10.9.0.0", "10.9.0.255"),
        ts("10.8.0.0", "10.8.0.255"),
    );
    dp.install_child(&c).expect("install");
    let p = Peer::of(&c);

    // LAN -> peer: the kernel routes into the TUN, the data plane seals.
    let app = common::bind("10.9.0.1:7000");
    app.send_to(b"ping", "10.8.0.7:9000").expect("send");
    let mut buf = vec![0u8; 2048];
    let (n, from) = peer.recv_from(&mut buf).expect("ESP from the data plane");
    assert_eq!(from, natt);
    let inner = p.open(&buf[..n]).expect("peer opens");
    let v4 = Ipv4Packet::new_checked(&inner[..]).expect("ipv4");
    assert_eq!(
        (v4.src_addr().to_string(), v4.dst_addr().to_string()),
        ("10.9.0.1".into(), "10.8.0.7".into())
    );
    assert_eq!(&inner[28..], b"ping");

    // Peer -> LAN: decrypted and written to the TUN, the kernel delivers to the app.
    let reply = udp4("10.8.0.7", 9000, "10.9.0.1", 7000, 64, b"pong");
    peer.send_to(&p.seal(&reply), natt).expect("send esp");
    let (n, from) = app.recv_from(&mut buf).expect("reply through the TUN");
    assert_eq!(
        (&buf[..n], from.to_string()),
        (&b"pong"[..], "10.8.0.7:9000".to_string())
    );

    // A packet to a destination no CHILD_SA covers is dropped and counted.
    sh(&["ip", "route", "add", "10.8.1.0/24", "dev", "ptun0"]);
    app.send_to(b"nowhere", "10.8.1.7:9000").expect("send");
    common::wait_stats(&dp, "tun_no_tunnel counted", |st| {
        common::drop_count(st, "tun_no_tunnel") >= 1
    });
    dp.shutdown();
}

#[test]
fn tun_round_trip() {
    in_netns("tun_round_trip", private_netns_round_trip);
}

// ---- the offload device ----

/// RFC 1071 the slow way, independent of the code under test.
fn naive_sum(data: &[u8]) -> u32 {
    data.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// IPv4 or IPv6 without extension headers: (transport offset, protocol).
fn l4_of(p: &[u8]) -> (usize, u8) {
    if p[0] >> 4 == 4 {
        (usize::from(p[0] & 15) * 4, p[9])
    } else {
        (40, p[6])
    }
}

fn l4_sum(p: &[u8]) -> u32 {
    let (l4, proto) = l4_of(p);
    let addrs = if p[0] >> 4 == 6 {
        &p[8..40]
    } else {
        &p[12..20]
    };
    naive_sum(addrs) + u32::from(proto) + (p.len() - l4) as u32 + naive_sum(&p[l4..])
}

/// Whether a TCP/UDP packet's IP length, IPv4 header checksum and transport checksum are right.
fn valid(p: &[u8]) -> bool {
    let v6 = p[0] >> 4 == 6;
    let (l4, _) = l4_of(p);
    if v6 {
        usize::from(u16::from_be_bytes([p[4], p[5]])) + 40 == p.len() && fold(l4_sum(p)) == 0xffff
    } else {
        usize::from(u16::from_be_bytes([p[2], p[3]])) == p.len()
            && fold(naive_sum(&p[..l4])) == 0xffff
            && fold(l4_sum(p)) == 0xffff
    }
}

/// Makes a packet from the namespace to a "remote" address come back from it: destination
/// 10.88.0.x (fd88::x) becomes the source 10.88.0.(x^3), the old source the destination;
/// checksums are recomputed. False for packets that are not ours (ND, MLD, ...).
fn reflect(p: &mut [u8]) -> bool {
    let v6 = p[0] >> 4 == 6;
    let (src, dst, len) = if v6 { (8, 24, 16) } else { (12, 16, 4) };
    let ours = if v6 {
        p[dst..dst + 8] == [0xfd, 0x88, 0, 0, 0, 0, 0, 0]
    } else {
        p[dst..dst + 3] == [10, 88, 0]
    };
    let (l4, proto) = l4_of(p);
    if !ours || (proto != 6 && proto != 17) {
        return false;
    }
    let mut old_src = [0u8; 16];
    old_src[..len].copy_from_slice(&p[src..src + len]);
    p.copy_within(dst..dst + len, src);
    p[src + len - 1] ^= 3;
    p[dst..dst + len].copy_from_slice(&old_src[..len]);
    if !v6 {
        p[10..12].fill(0);
        let c = !fold(naive_sum(&p[..l4]));
        p[10..12].copy_from_slice(&c.to_be_bytes());
    }
    let at = l4 + if proto == 6 { 16 } else { 6 };
    p[at..at + 2].fill(0);
    let mut c = !fold(l4_sum(p));
    if c == 0 && proto == 17 {
        c = 0xffff;
    }
    p[at..at + 2].copy_from_slice(&c.to_be_bytes());
    true
}

/// What the relay saw and did.
#[derive(Debug, Default, Clone, Copy)]
struct RelayStats {
    reads: usize,
    gso_frames: usize,
    /// Of those, UDP (USO) super-packets.
    udp_gso_frames: usize,
    packets_in: usize,
    /// UDP packets written back (TCP stragglers of an earlier phase may share a relay).
    udp_out: usize,
    writes: usize,
    super_writes: usize,
    packets_out: usize,
    write_failures: usize,
    drops: u64,
}

impl RelayStats {
    fn print(&self, what: &str, bytes: usize, took: Duration) {
        println!(
            "{what}: {:.2} MiB in {:.2} s ({:.2} Gbit/s through the relay); read side: {} reads, \
             {} packets, {:.1} packets/read syscall, {} super-packets; write side: {} writes, \
             {} packets, {:.1} packets/write syscall, {} super-packets",
            bytes as f64 / f64::from(1 << 20),
            took.as_secs_f64(),
            bytes as f64 * 8.0 / took.as_secs_f64() / 1e9,
            self.reads,
            self.packets_in,
            self.packets_in as f64 / self.reads.max(1) as f64,
            self.gso_frames,
            self.writes,
            self.packets_out,
            self.packets_out as f64 / self.writes.max(1) as f64,
            self.super_writes,
        );
    }
}

/// Reads the device in batches, checks and reflects every packet, writes them back coalesced,
/// until `stop`.
fn relay(tun: &Tun, stop: &AtomicBool) -> RelayStats {
    let mut st = RelayStats::default();
    let mut batch = TunReadBatch::new(1 << 20, 64);
    let mut w = TunWriter::new(tun.offloads(), 1 << 20, 1024);
    let account = |st: &mut RelayStats, f: tun_offload::writer::FlushStats| {
        st.writes += f.writes;
        st.super_writes += f.super_packets;
        st.packets_out += f.packets;
        st.write_failures += f.failed;
    };
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd: tun.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut pfd, 1, 20) };
        let out = tun.read_batch(&mut batch, 64).expect("read batch");
        st.reads += out.reads;
        st.drops += batch.drops().total();
        for i in 0..batch.frames().len() {
            let (f, bytes) = batch.frame_mut(i);
            st.gso_frames += usize::from(f.gso);
            if f.gso && l4_of(bytes).1 == 17 {
                st.udp_gso_frames += 1;
            }
            for pkt in bytes.chunks_mut(f.stride) {
                st.packets_in += 1;
                let (_, proto) = l4_of(pkt);
                if proto != 6 && proto != 17 {
                    continue;
                }
                assert!(
                    valid(pkt),
                    "a packet read from the device is invalid: {pkt:02x?}"
                );
                if !reflect(pkt) {
                    continue;
                }
                st.udp_out += usize::from(proto == 17);
                let (queued, flushed) = w.push_or_flush(tun, pkt);
                assert!(queued, "valid packet rejected");
                account(&mut st, flushed);
            }
        }
        account(&mut st, w.flush(tun));
    }
    st
}

/// Opens `name` asking for `want`, addresses it (10.77.0.1/24, fd77::1/64) and routes the
/// "remote" prefixes (10.88.0.0/24, fd88::/64) into it.
fn open_device(name: &str, want: Offloads) -> Tun {
    let tun = Tun::open_with(name, want).expect("open TUN");
    sh(&["ip", "addr", "add", "10.77.0.1/24", "dev", name]);
    sh(&["ip", "route", "add", "10.88.0.0/24", "dev", name]);
    sh(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd77::1/64",
        "dev",
        name,
        "nodad",
    ]);
    sh(&["ip", "-6", "route", "add", "fd88::/64", "dev", name]);
    tun
}

/// A running relay thread: stop it to get the device back with what it saw.
struct Relay {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(Tun, RelayStats)>,
}

impl Relay {
    fn start(tun: Tun) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let st = relay(&tun, &s);
            (tun, st)
        });
        Self { stop, thread }
    }

    fn stop(self) -> (Tun, RelayStats) {
        self.stop.store(true, Ordering::Relaxed);
        let (tun, st) = self.thread.join().expect("relay");
        assert_eq!(st.drops, 0, "{st:?}");
        assert_eq!(st.write_failures, 0, "{st:?}");
        (tun, st)
    }
}

fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// Sends `bytes` over TCP from a client to a server of the namespace through the relay;
/// returns how long it took.
fn tcp_transfer(listen: &str, connect: &str, bytes: usize) -> Duration {
    let listener = TcpListener::bind(listen).expect("listen");
    let server = std::thread::spawn(move || {
        let (mut s, from) = listener.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0;
        loop {
            let k = s.read(&mut buf).expect("read");
            if k == 0 {
                break;
            }
            for (j, b) in buf[..k].iter().enumerate() {
                assert_eq!(*b, pattern(n + j), "byte {} from {from}", n + j);
            }
            n += k;
        }
        n
    });
    let start = Instant::now();
    let to: SocketAddr = connect.parse().expect("address");
    let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(5)).expect("connect");
    c.set_write_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let chunk: Vec<u8> = (0..(1 << 20)).map(pattern).collect();
    let mut sent = 0;
    while sent < bytes {
        // 1 MiB is a multiple of neither 251 nor the MSS: write from the right phase.
        let phase = sent % 251;
        let k = (bytes - sent).min(chunk.len() - 251);
        c.write_all(&chunk[phase..phase + k]).expect("send");
        sent += k;
    }
    c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let got = server.join().expect("server");
    assert_eq!(got, bytes);
    start.elapsed()
}

/// `UDP_SEGMENT` (linux/udp.h): the socket sends one GSO super-datagram per send.
const UDP_SEGMENT: libc::c_int = 103;

/// Sends 10 segments of 1000 bytes with one `sendto` (UDP GSO); the receiver must get all ten.
fn udp_gso_transfer(bind: &str, recv: &str, to: &str) {
    let rx = UdpSocket::bind(recv).expect("receiver");
    rx.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let tx = UdpSocket::bind(bind).expect("sender");
    let seg: libc::c_int = 1000;
    // SAFETY: setsockopt reads one int of the given size.
    let r = unsafe {
        libc::setsockopt(
            tx.as_raw_fd(),
            libc::SOL_UDP,
            UDP_SEGMENT,
            (&seg as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
    for round in 0..3u8 {
        let data: Vec<u8> = (0..10_000).map(|i| (i / 1000) as u8 ^ round).collect();
        tx.send_to(&data, to).expect("send");
        let mut buf = [0u8; 2048];
        for k in 0..10u8 {
            let (n, _) = rx.recv_from(&mut buf).expect("datagram through the relay");
            assert_eq!(n, 1000, "round {round}, datagram {k}");
            assert!(buf[..n].iter().all(|&b| b == k ^ round));
        }
    }
}

/// Runs TCP transfers (`mib` MiB over IPv4, half that over IPv6), then UDP GSO sends over both
/// families, each phase with its own relay on the device; prints and returns both phases' stats.
fn transfers(tun: Tun, mib: usize) -> (RelayStats, RelayStats) {
    let name = tun.name().to_owned();
    println!("{name}: offloads {}", tun.offloads());
    let relay = Relay::start(tun);
    let t = tcp_transfer("10.77.0.1:5001", "10.88.0.1:5001", mib << 20)
        + tcp_transfer("[fd77::1]:5002", "[fd88::1]:5002", mib << 19);
    let (tun, tcp) = relay.stop();
    tcp.print(&format!("{name} TCP"), (mib << 20) + (mib << 19), t);
    let relay = Relay::start(tun);
    let start = Instant::now();
    udp_gso_transfer("10.77.0.1:0", "10.77.0.1:6001", "10.88.0.1:6001");
    udp_gso_transfer("[fd77::1]:0", "[fd77::1]:6002", "[fd88::1]:6002");
    let t = start.elapsed();
    let (_, udp) = relay.stop();
    udp.print(&format!("{name} UDP GSO"), 60_000, t);
    (tcp, udp)
}

#[test]
fn offload_tcp_and_udp_through_a_tun_with_offloads() {
    in_netns("offload_tcp_and_udp_through_a_tun_with_offloads", || {
        let tun = open_device("pto0", Offloads::ALL);
        let got = tun.offloads();
        let (tcp, udp) = transfers(tun, 64);
        if got.tso4 && got.tso6 {
            assert!(
                tcp.gso_frames > 0,
                "the kernel sent no super-packet: {tcp:?}"
            );
            assert!(tcp.super_writes > 0, "no super-packet was written: {tcp:?}");
            assert!(tcp.packets_in > 2 * tcp.reads, "{tcp:?}");
            assert!(tcp.packets_out > 2 * tcp.writes, "{tcp:?}");
        } else {
            // The kernel refused TSO: the device adapts (no TCP super-packets either way), and
            // the same transfers still pass.
            println!("the kernel refused TSO ({got}): asserting the fallback");
            assert_eq!(tcp.gso_frames, 0, "{tcp:?}");
        }
        if got.uso4 && got.uso6 {
            // Six sends of ten segments: one read and one write each.
            assert_eq!((udp.udp_gso_frames, udp.udp_out), (6, 60), "{udp:?}");
            assert!(udp.super_writes >= 6, "{udp:?}");
        } else {
            // Without USO the kernel splits UDP GSO sends before the device: every datagram
            // arrives on its own, and all 60 still cross.
            println!("the kernel refused USO ({got}): asserting the fallback");
            assert_eq!((udp.udp_gso_frames, udp.udp_out), (0, 60), "{udp:?}");
        }
    });
}

#[test]
fn offload_plain_fallback_carries_the_same_traffic() {
    in_netns("offload_plain_fallback_carries_the_same_traffic", || {
        let tun = open_device("pto1", Offloads::NONE);
        assert_eq!(tun.offloads(), Offloads::NONE);
        let (tcp, udp) = transfers(tun, 16);
        for st in [tcp, udp] {
            assert_eq!((st.gso_frames, st.super_writes), (0, 0), "{st:?}");
            assert_eq!(st.packets_in, st.reads, "one packet per read: {st:?}");
            assert_eq!(st.packets_out, st.writes, "one packet per write: {st:?}");
        }
        assert_eq!(udp.udp_out, 60, "{udp:?}");
    });
}

#[test]
fn offload_tcp_only_writes_udp_singly() {
    in_netns("offload_tcp_only_writes_udp_singly", || {
        let tun = open_device("pto2", Offloads::ALL.without_uso());
        let got = tun.offloads();
        assert!(!got.uso4 && !got.uso6, "{got}");
        let relay = Relay::start(tun);
        udp_gso_transfer("10.77.0.1:0", "10.77.0.1:6001", "10.88.0.1:6001");
        let (_, st) = relay.stop();
        // Without USO the kernel segments before the device, and the writer sends singly.
        assert_eq!((st.gso_frames, st.super_writes), (0, 0), "{st:?}");
        // (The device may also carry the kernel's own IPv6 ND/MLD packets, which are read but
        // not written back.)
        assert_eq!(st.udp_out, 30, "{st:?}");
        assert_eq!(st.packets_out, st.writes, "{st:?}");
        assert_eq!(st.packets_in, st.reads, "{st:?}");
    });
}
