//! A VM and a CE attached at L2 (issue 16 §1) load one tunnel at once, on two workers: the
//! VM's packets come in on the VTEP lane, the CE's on the attachment lane, and the peer still
//! receives the CHILD_SA's sequence numbers strictly in order (RFC 4303 §3.3.3), so its
//! anti-replay window drops none of them: the CE's packets are numbered in the VTEP lane's
//! order. Also with two VNets on two VTEPs whose CEs share one attachment interface (an
//! attachment batch numbered in two VTEP lanes). Each test in a network namespace of its own
//! (a veth pair for the attachment, loopback for the rest); needs root.

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{packet_socket, try_recv};
use protego_dataplane::{
    AttachmentConfig, AttachmentTags, DataPath, DataplaneConfig, Inside, Route, TunnelBinding,
    VnetConfig,
};
use std::net::{IpAddr, UdpSocket};
use std::os::fd::AsRawFd;
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

/// A CE's frame from `src` to 192.168.0.9 under C-tag `tag`.
fn ce_frame(tag: u8, src: &str) -> Vec<u8> {
    let mut f = GW_MAC.to_vec();
    f.extend_from_slice(&CE_MAC);
    f.extend_from_slice(&[0x81, 0x00, 0x00, tag, 0x08, 0x00]);
    f.extend_from_slice(&marked(src, 1));
    f
}

/// One VNet of tenant `acme` on local VTEP `vtep`: its name, VNI, gateway, the attachment's
/// C-tag and segment (`10.N.0.0/24`, the CE at `.2`), the VM's subnet (`10.M.0.0/24`, the VM
/// at `.5`), its tunnel and CHILD_SA SPIs.
struct Net {
    name: &'static str,
    vni: u32,
    vtep: &'static str,
    c_tag: u8,
    segment: u8,
    subnet: u8,
    tunnel: u32,
}

const NETS: [Net; 2] = [
    Net {
        name: "prod",
        vni: 100,
        vtep: "127.0.0.1",
        c_tag: 10,
        segment: 99,
        subnet: 0,
        tunnel: 1,
    },
    Net {
        name: "dev",
        vni: 200,
        vtep: "127.0.0.3",
        c_tag: 20,
        segment: 98,
        subnet: 1,
        tunnel: 2,
    },
];

impl Net {
    fn vnet(&self) -> VnetConfig {
        VnetConfig {
            name: self.name.into(),
            vni: self.vni,
            gateway_ips: vec![ip(&format!("10.{}.0.1", self.subnet))],
            routes: vec![Route {
                prefix: ip(&format!("10.{}.0.0", self.subnet)),
                len: 24,
                host: ip("127.0.0.2"),
            }],
            ..common::vnet(self.vtep, "127.0.0.2")
        }
    }

    fn attachment(&self) -> AttachmentConfig {
        AttachmentConfig {
            name: format!("dc-{}", self.name),
            tenant: ids::TenantId::new("acme").expect("tenant"),
            vnet: self.name.into(),
            port: datapath::AttachmentPort::Interface("gw0".into()),
            tags: AttachmentTags::Vlan {
                c_tag: u16::from(self.c_tag),
            },
            gateway_ip: ip(&format!("10.{}.0.1", self.segment)),
            ce_ip: None,
            routes: vec![(ip(&format!("10.{}.0.0", self.segment)), 24)],
            ce_mac: None,
        }
    }

    fn binding(&self, index: usize) -> TunnelBinding {
        TunnelBinding {
            tunnel: ike::TunnelId(self.tunnel),
            name: format!("site-{}", self.name),
            ..common::site_tunnel(Inside::Vnet(index))
        }
    }
}

/// The peer of one tunnel: what it received.
struct Received {
    /// ESP sequence numbers in arrival order.
    seqs: Vec<u32>,
    /// Packets from the VM and from the CE.
    vm: usize,
    ce: usize,
}

/// A VM and a CE per VNet (`nets` of [`NETS`]) load their VNet's tunnel at once; the CEs share
/// one attachment interface, so with two VNets on two VTEPs one attachment batch holds packets
/// numbered in both VTEP lanes.
fn vms_and_ces_share_tunnels(nets: usize) {
    let nets = &NETS[..nets];
    common::attachment_namespace();
    let common::Started { dp, host, .. } = common::start_beside_host(|port| DataplaneConfig {
        attachments: nets.iter().map(Net::attachment).collect(),
        vnets: nets.iter().map(Net::vnet).collect(),
        tunnels: nets.iter().enumerate().map(|(i, n)| n.binding(i)).collect(),
        // Small batches: many of them, on both workers.
        batch: 4,
        ..common::config(port)
    });
    let natt = dp.local_addrs().natt[0];
    let vteps = dp.local_addrs().vxlan;
    let mut peers = Vec::new();
    let mut readers = Vec::new();
    let mut vm_packets = Vec::new();
    for (i, n) in nets.iter().enumerate() {
        let sock = common::bind("127.0.0.1:0");
        sock.set_read_timeout(Some(Duration::from_secs(1)))
            .expect("timeout");
        big_rcvbuf(&sock);
        // The VNet and the CE's segment on our side, the site's LAN on the peer's.
        let c = child(
            n.tunnel,
            0x1000 + n.tunnel,
            0x2000 + n.tunnel,
            natt,
            sock.local_addr().expect("addr"),
            ts("10.0.0.0", "10.255.255.255"),
            ts("192.168.0.0", "192.168.0.255"),
        );
        dp.install_child(&c).expect("install");
        peers.push(Peer::of(&c));
        readers.push(std::thread::spawn(move || {
            let mut got = Vec::new();
            while let Some((d, _)) = try_recv(&sock) {
                got.push(d);
            }
            got
        }));
        let gw = dp.gateway_mac(i).expect("vnet");
        let vm = marked(&format!("10.{}.0.5", n.subnet), 0);
        let vtep = *vteps
            .iter()
            .find(|a| a.ip() == ip(n.vtep))
            .expect("the VNet's VTEP is open");
        vm_packets.push((vxlan(n.vni, gw, VM_MAC, EtherType::IPV4, &vm), vtep));
    }
    let ce_frames: Vec<Vec<u8>> = nets
        .iter()
        .map(|n| ce_frame(n.c_tag, &format!("10.{}.0.2", n.segment)))
        .collect();
    let fd = packet_socket("ce0", false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..COUNT {
                for (d, vtep) in &vm_packets {
                    host.send_to(d, vtep).expect("send");
                }
                if i % 32 == 31 {
                    std::thread::sleep(Duration::from_micros(300));
                }
            }
        });
        s.spawn(|| {
            for i in 0..COUNT {
                // One frame for each VNet in turn: an attachment batch holds both.
                for f in &ce_frames {
                    // SAFETY: writes a live buffer of the length given on a live descriptor.
                    let n = unsafe { libc::send(fd.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
                    assert_eq!(n, f.len() as isize, "write to ce0");
                }
                if i % 32 == 31 {
                    std::thread::sleep(Duration::from_micros(300));
                }
            }
        });
    });
    let received: Vec<Received> = readers
        .into_iter()
        .zip(&peers)
        .map(|(r, peer)| {
            let got = r.join().expect("reader");
            let from: Vec<u8> = got
                .iter()
                .map(|d| peer.open(d).expect("the peer opens it")[28])
                .collect();
            Received {
                seqs: got
                    .iter()
                    .map(|d| u32::from_be_bytes(d[4..8].try_into().expect("seq")))
                    .collect(),
                vm: from.iter().filter(|&&w| w == 0).count(),
                ce: from.iter().filter(|&&w| w == 1).count(),
            }
        })
        .collect();
    let st = dp.stats();
    let drops: Vec<_> = st.drops.iter().filter(|(_, v)| *v != 0).collect();
    // Nearly all of the VM's: the kernel may drop a few in the VTEP's socket buffer. The
    // CEs' frames meet the attachment interface's ring first, which the writer can fill (the
    // kernel counts what it drops there, `attach_ring_full`): most get through, and every
    // one is accounted for; the data plane drops none of them.
    let nearly_all = COUNT as usize * 99 / 100;
    let ring_full = common::drop_count(&st, "attach_ring_full") as usize;
    let ce_total: usize = received.iter().map(|r| r.ce).sum();
    assert!(
        ce_total + ring_full >= nets.len() * COUNT as usize,
        "every CE frame reaches its site or is lost before the ring: {ce_total} + {ring_full}; \
         drops {drops:?}"
    );
    for (n, r) in nets.iter().zip(&received) {
        eprintln!(
            "{}: {} ESP packets, {} from the VM, {} from the CE; workers {:?}; drops {drops:?}",
            n.name,
            r.seqs.len(),
            r.vm,
            r.ce,
            st.workers
        );
        assert!(
            r.vm >= nearly_all && r.ce >= COUNT as usize / 2,
            "{}: the VM's and the CE's packets reach the site: {} {} of {COUNT}; drops {drops:?}",
            n.name,
            r.vm,
            r.ce
        );
        let behind = r.seqs.windows(2).filter(|w| w[1] <= w[0]).count();
        assert_eq!(
            behind,
            0,
            "{}: sequence numbers out of order at the peer ({} packets)",
            n.name,
            r.seqs.len()
        );
    }
    for reason in ["too_big", "feature_hold_full", "no_route", "esp_seal"] {
        assert_eq!(common::drop_count(&st, reason), 0, "{reason}: {drops:?}");
    }
    // Both workers ran (which of them took batches is the scheduler's choice).
    assert_eq!(st.workers.len(), 2, "{:?}", st.workers);
    dp.shutdown();
}

#[test]
fn a_vm_and_a_ce_loading_one_tunnel_keep_its_sequence_numbers_in_order() {
    std::thread::spawn(|| vms_and_ces_share_tunnels(1))
        .join()
        .expect("in its own namespace");
}

/// Two VNets on two VTEPs, their CEs on one attachment interface: an attachment batch's
/// packets for the tunnels are numbered in two VTEP lanes, one after the other.
#[test]
fn ces_of_vnets_on_two_vteps_keep_each_tunnels_sequence_numbers_in_order() {
    std::thread::spawn(|| vms_and_ces_share_tunnels(2))
        .join()
        .expect("in its own namespace");
}
