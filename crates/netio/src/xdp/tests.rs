//! AF_XDP steering on a veth pair in a network namespace of the test's own: frames written
//! onto the peer end arrive in the sockets when they are for a steered (address, port), and in
//! the kernel's UDP sockets otherwise.

use super::*;
use crate::packet::{PacketScratch, PacketSocket};
use crate::testutil::{in_veth_namespace, ip};
use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

const GW: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const GW6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1);
const PEER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 2);

/// An Ethernet + IPv4 + UDP frame from PEER:`sport` to GW:`dport` for `dst_mac`; `options`
/// adds a 4-byte IPv4 option (NOP ×3, EOL), `frag` sets more-fragments.
fn udp_frame(dst_mac: [u8; 6], dport: u16, payload: &[u8], options: bool, frag: bool) -> Vec<u8> {
    let ihl = if options { 24 } else { 20 };
    let total = ihl + 8 + payload.len();
    let mut f = Vec::with_capacity(14 + total);
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&[2, 0, 0, 0, 0, 2]);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut h = vec![0u8; ihl];
    h[0] = 0x40 | (ihl / 4) as u8;
    h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    if frag {
        h[6] = 0x20;
    }
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&PEER.octets());
    h[16..20].copy_from_slice(&GW.octets());
    if options {
        h[20..24].copy_from_slice(&[1, 1, 1, 0]);
    }
    let mut sum = 0u32;
    for w in h.chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&h);
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    f
}

/// An Ethernet + IPv6 + UDP frame from fd00:77::2 to `dst`:`dport` for `dst_mac`, with the
/// UDP checksum IPv6 requires (RFC 8200 §8.1).
fn udp6_frame(dst_mac: [u8; 6], dst: Ipv6Addr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + 40 + 8 + payload.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&[2, 0, 0, 0, 0, 2]);
    f.extend_from_slice(&[0x86, 0xdd]);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[17, 64]);
    f.extend_from_slice(&PEER6.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    // Pseudo-header (addresses, length, next header) and the UDP header and payload.
    let udp = &f[14 + 40..];
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for w in bytes.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    add(&PEER6.octets());
    add(&dst.octets());
    add(&(udp.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 17]);
    add(udp);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let ck = match !(sum as u16) {
        0 => 0xffff,
        c => c,
    };
    f[14 + 40 + 6..14 + 40 + 8].copy_from_slice(&ck.to_be_bytes());
    f
}

#[test]
fn steered_datagrams_reach_the_socket_and_the_rest_the_kernel() {
    // Jumbo frames: a frame larger than a UMEM frame arrives in several descriptors.
    in_veth_namespace(9000, || {
        ip(&["addr", "add", "10.77.0.1/24", "dev", "v0"]);
        ip(&["-6", "addr", "add", "fd00:77::1/64", "dev", "v0", "nodad"]);
        let ifindex = interface_of(IpAddr::V4(GW)).expect("v0 holds the address");
        let steered: [SocketAddr; 3] = [
            SocketAddr::new(GW.into(), 4500),
            SocketAddr::new(GW.into(), 4789),
            SocketAddr::new(GW6.into(), 4500),
        ];
        let xdp = XdpSteering::open(ifindex, &steered, &[XdpAttach::Native, XdpAttach::Generic])
            .expect("XDP on a veth");
        assert_eq!(xdp.interface, "v0");
        assert_eq!(xdp.sockets.len(), 3);
        // The kernel's sockets on a steered port and on another one.
        let natt = UdpSocket::bind((GW, 4500)).expect("bind 4500");
        let other = UdpSocket::bind((GW, 5000)).expect("bind 5000");
        let other6 = UdpSocket::bind((GW6, 4789)).expect("bind [v6]:4789");
        for s in [&natt, &other, &other6] {
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .expect("timeout");
        }
        // This thread's namespace (sysfs shows the one it was mounted in).
        let out = std::process::Command::new("ip")
            .args(["-br", "link", "show", "v0"])
            .output()
            .expect("ip");
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        let mac: Vec<u8> = out
            .split_whitespace()
            .nth(2)
            .expect("the MAC column")
            .split(':')
            .map(|h| u8::from_str_radix(h, 16).expect("hex"))
            .collect();
        let mac: [u8; 6] = mac.try_into().expect("6 bytes");
        let tx = PacketSocket::open("v1").expect("AF_PACKET on v1");
        let frames = [
            udp_frame(mac, 4500, b"esp-0", false, false),
            udp_frame(mac, 4789, b"vxlan-0", false, false),
            udp_frame(mac, 4500, b"esp-1", false, false),
            udp_frame(mac, 4500, &[7; 6000], false, false),
            udp_frame(mac, 5000, b"other", false, false),
            udp_frame(mac, 4500, b"with-options", true, false),
            udp_frame(mac, 4500, b"fragment", false, true),
            udp6_frame(mac, GW6, 4500, b"esp-v6"),
            udp6_frame(mac, GW6, 4789, b"other-v6"),
        ];
        let failed = tx.send_batch(
            frames.iter().map(Vec::as_slice),
            &mut PacketScratch::default(),
        );
        assert_eq!(failed, 0);
        let mut got: Vec<(usize, Vec<u8>)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < 5 && Instant::now() < deadline {
            for (slot, (_, xsks)) in xdp.sockets.iter().enumerate() {
                for x in xsks {
                    x.receive(64, |f| {
                        let ip = if f[12..14] == [0x86, 0xdd] { 40 } else { 20 };
                        got.push((slot, f[14 + ip + 8..].to_vec()));
                    });
                    assert!(!x.zero_copy(), "a veth binds in copy mode");
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        got.sort();
        let mut want = vec![
            (0, b"esp-0".to_vec()),
            (0, b"esp-1".to_vec()),
            (0, vec![7; 6000]),
            (1, b"vxlan-0".to_vec()),
            (2, b"esp-v6".to_vec()),
        ];
        want.sort();
        assert!(
            got == want,
            "got {:?}",
            got.iter().map(|(s, d)| (s, d.len())).collect::<Vec<_>>()
        );
        // Not steered: the kernel delivers them as before (the fragment waits for the rest
        // in the kernel's reassembly, so it reaches no socket at all).
        let mut buf = [0u8; 64];
        let n = other.recv(&mut buf).expect("the other port's datagram");
        assert_eq!(&buf[..n], b"other");
        let n = natt.recv(&mut buf).expect("the datagram with IPv4 options");
        assert_eq!(&buf[..n], b"with-options");
        let n = other6
            .recv(&mut buf)
            .expect("the IPv6 datagram to a port not steered");
        assert_eq!(&buf[..n], b"other-v6");
        assert!(natt.recv(&mut buf).is_err(), "nothing else reached 4500");
        for (_, xsks) in &xdp.sockets {
            for x in xsks {
                assert_eq!(x.losses().expect("statistics").total(), 0);
            }
        }
        // Dropping the steering detaches the program: 4500 is the kernel's again.
        drop(xdp);
        let failed = tx.send_batch(
            std::iter::once(udp_frame(mac, 4500, b"after", false, false).as_slice()),
            &mut PacketScratch::default(),
        );
        assert_eq!(failed, 0);
        let n = natt.recv(&mut buf).expect("after the program is gone");
        assert_eq!(&buf[..n], b"after");
    });
}

#[test]
fn an_interface_with_a_program_already_is_left_alone() {
    in_veth_namespace(1500, || {
        ip(&["addr", "add", "10.77.0.1/24", "dev", "v0"]);
        let ifindex = interface_of(IpAddr::V4(GW)).expect("v0");
        let addr = [SocketAddr::new(GW.into(), 4500)];
        let first = XdpSteering::open(ifindex, &addr, &[XdpAttach::Native]).expect("first");
        let second = XdpSteering::open(ifindex, &addr, &[XdpAttach::Native, XdpAttach::Generic]);
        assert!(second.is_err(), "a second program replaced the first");
        drop(first);
    });
}

#[test]
fn an_address_no_interface_holds_is_an_error() {
    let e = interface_of("192.0.2.123".parse().expect("ip")).expect_err("not local");
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
}
