//! A VM and a CE attached at L2 (issue 16 §1) load one tunnel at once, on two workers: the
//! VM's packets come in on the VTEP lane, the CE's on the attachment lane, and the peer still
//! receives the CHILD_SA's sequence numbers strictly in order (RFC 4303 §3.3.3), so its
//! anti-replay window drops none of them: the CE's packets are numbered in the VTEP lane's
//! order. In a network namespace of its own (a veth pair for the attachment, loopback for
//! the rest); needs root.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::try_recv;
use protego_dataplane::{AttachmentConfig, AttachmentTags, DataPath, DataplaneConfig};
use std::net::{IpAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::Duration;
use testutil::{child, ts, udp4, vxlan, Peer};
use wire::ethernet::EtherType;

const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 7];
const CE_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0xa, 1];
const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
/// Packets from each side.
const COUNT: u32 = 4_000;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip address")
}

fn run(args: &[&str]) {
    let st = Command::new(args[0])
        .args(&args[1..])
        .status()
        .expect(args[0]);
    assert!(st.success(), "{args:?}");
}

/// A raw packet socket bound to `iface`, receiving nothing.
fn packet_socket(iface: &str) -> OwnedFd {
    // SAFETY: plain system call; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    assert!(fd >= 0, "AF_PACKET socket (needs root)");
    // SAFETY: a fresh descriptor this function owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(iface).expect("name");
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "{iface}");
    // SAFETY: sockaddr_ll is plain data.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_ifindex = index as i32;
    // SAFETY: binds a live descriptor to a sockaddr_ll of the size given.
    let ret = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    assert_eq!(ret, 0, "bind to {iface}");
    fd
}

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

/// The packet's UDP payload marks who sent it: 0 the VM, 1 the CE.
fn marked(src: &str, who: u8) -> Vec<u8> {
    udp4(src, 1000, "192.168.0.9", 2000, 64, &[who; 200])
}

fn vm_and_ce_share_a_tunnel() {
    // SAFETY: plain system call; affects this thread (and the threads it starts) only.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    run(&["ip", "link", "set", "lo", "up"]);
    run(&[
        "ip", "link", "add", "ce0", "type", "veth", "peer", "name", "gw0",
    ]);
    run(&["ip", "link", "set", "gw0", "address", "02:00:00:00:00:01"]);
    for i in ["ce0", "gw0"] {
        run(&["ip", "link", "set", i, "mtu", "1508", "up"]);
    }
    let common::Started { dp, host, .. } = common::start_beside_host(|port| DataplaneConfig {
        attachments: vec![AttachmentConfig {
            name: "dc".into(),
            tenant: ids::TenantId::new("acme").expect("tenant"),
            vnet: "prod".into(),
            interface: "gw0".into(),
            tags: AttachmentTags::Vlan { c_tag: 10 },
            gateway_ip: ip("10.99.0.1"),
            ce_ip: None,
            routes: vec![(ip("10.99.0.0"), 24)],
        }],
        // Small batches: many of them, on both workers.
        batch: 4,
        ..common::config(port)
    });
    let peer_sock = common::bind("127.0.0.1:0");
    peer_sock
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    big_rcvbuf(&peer_sock);
    let natt = dp.local_addrs().natt[0];
    // The VNet and the CE's segment on our side, the site's LAN on the peer's.
    let c = child(
        1,
        0x1001,
        0x2001,
        natt,
        peer_sock.local_addr().expect("addr"),
        ts("10.0.0.0", "10.255.255.255"),
        ts("192.168.0.0", "192.168.0.255"),
    );
    dp.install_child(&c).expect("install");
    let peer = Peer::of(&c);
    let gw = dp.gateway_mac(0).expect("vnet");
    let vtep = dp.local_addrs().vxlan[0];

    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        while let Some((d, _)) = try_recv(&peer_sock) {
            got.push(d);
        }
        got
    });
    let fd = packet_socket("ce0");
    let mut ce_frame = GW_MAC.to_vec();
    ce_frame.extend_from_slice(&CE_MAC);
    ce_frame.extend_from_slice(&[0x81, 0x00, 0x00, 10, 0x08, 0x00]);
    ce_frame.extend_from_slice(&marked("10.99.0.2", 1));
    let vm = vxlan(100, gw, VM_MAC, EtherType::IPV4, &marked("10.0.0.5", 0));
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..COUNT {
                host.send_to(&vm, vtep).expect("send");
                if i % 64 == 63 {
                    std::thread::sleep(Duration::from_micros(300));
                }
            }
        });
        s.spawn(|| {
            for i in 0..COUNT {
                // SAFETY: writes a live buffer of the length given on a live descriptor.
                let n = unsafe {
                    libc::send(fd.as_raw_fd(), ce_frame.as_ptr().cast(), ce_frame.len(), 0)
                };
                assert_eq!(n, ce_frame.len() as isize, "write to ce0");
                if i % 64 == 63 {
                    std::thread::sleep(Duration::from_micros(300));
                }
            }
        });
    });
    let got = reader.join().expect("reader");
    let seqs: Vec<u32> = got
        .iter()
        .map(|d| u32::from_be_bytes(d[4..8].try_into().expect("seq")))
        .collect();
    let from: Vec<u8> = got
        .iter()
        .map(|d| peer.open(d).expect("the peer opens it")[28])
        .collect();
    let (vm_n, ce_n) = (
        from.iter().filter(|&&w| w == 0).count(),
        from.iter().filter(|&&w| w == 1).count(),
    );
    let st = dp.stats();
    eprintln!(
        "{} ESP packets: {vm_n} from the VM, {ce_n} from the CE; workers {:?}",
        got.len(),
        st.workers
    );
    assert!(
        vm_n > 0 && ce_n > 0,
        "both reach the site: {vm_n} {ce_n}; {st:?}"
    );
    let workers = st.workers.iter().filter(|w| w.batches > 0).count();
    assert_eq!(workers, 2, "both workers took batches: {:?}", st.workers);
    let behind = seqs.windows(2).filter(|w| w[1] <= w[0]).count();
    assert_eq!(
        behind,
        0,
        "sequence numbers out of order at the peer ({} packets)",
        seqs.len()
    );
    dp.shutdown();
}

#[test]
fn a_vm_and_a_ce_loading_one_tunnel_keep_its_sequence_numbers_in_order() {
    std::thread::spawn(vm_and_ce_share_a_tunnel)
        .join()
        .expect("in its own namespace");
}
