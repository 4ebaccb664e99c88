//! The test bed of the self-dispatch examples (`dispatch_scaling`, `dispatch_ring`): data
//! nodes as data planes on loopback (one worker each, VTEP 127.0.1.N, each with its own
//! CHILD_SA of one tunnel to a peer socket on 127.0.3.1), and a host socket on 127.0.2.1
//! playing the cloud hosts: it floods each VM's ARP request for the gateway to every node, as
//! a host's VXLAN device with the data nodes as flood list does, learns the one node that
//! answers and the virtual MAC it gives, and re-learns from the nodes' announcements.
#![allow(dead_code)]

use crate::testutil::{self, arp, child, dispatch_table, ts, udp4, vxlan};
use protego_dataplane::{
    DataPath, Dataplane, DataplaneConfig, DispatchConfig, Inside, Route, TunnelBinding, VnetConfig,
};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::arp::ArpOperation;
use wire::ethernet::EtherType;

pub(crate) const VNI: u32 = 100;

pub(crate) type Error = Box<dyn std::error::Error>;

/// Node `i`'s VTEP address.
pub(crate) fn node_ip(i: usize) -> IpAddr {
    IpAddr::from([127, 0, 1, 1 + i as u8])
}

/// VM `v`'s MAC: consecutive, as a hypervisor hands them out.
pub(crate) fn vm_mac(v: usize) -> [u8; 6] {
    let b = (v as u32 + 0x18).to_be_bytes();
    [0x52, 0x54, 0x00, b[1], b[2], b[3]]
}

/// VM `v`'s address, 10.0.x.y.
pub(crate) fn vm_ip(v: usize) -> String {
    format!("10.0.{}.{}", (v + 1) / 250, (v + 1) % 250 + 1)
}

/// A VM as the hosts know it.
pub(crate) struct Vm {
    /// The gateway's MAC it was given (a virtual MAC).
    pub(crate) vmac: [u8; 6],
    /// The node it answered from.
    pub(crate) node: usize,
    /// Its 64-byte IP packet toward the site, in VXLAN to `vmac`.
    pub(crate) frame: Vec<u8>,
}

/// The nodes, the hosts' socket and the peer.
pub(crate) struct Bed {
    pub(crate) host: UdpSocket,
    /// The VXLAN port (every node's and the hosts').
    pub(crate) port: u16,
    pub(crate) dps: Vec<Arc<Dataplane>>,
    /// Each node's worker thread ids.
    pub(crate) tids: Vec<Vec<u32>>,
    pub(crate) vms: Vec<Vm>,
    peer: Arc<UdpSocket>,
}

/// The dispatch table of `n` nodes with `owners` (node number per virtual MAC).
pub(crate) fn table(n: usize, owners: Vec<u16>, linger: Duration) -> DispatchConfig {
    let nodes: Vec<String> = (0..n).map(|i| node_ip(i).to_string()).collect();
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let mut t = dispatch_table(VNI, &names, owners);
    t.linger = linger;
    t
}

impl Bed {
    /// Starts `n` nodes with table `t`, and lets `vms` VMs resolve the gateway (each request
    /// answered by exactly one node, or an error).
    pub(crate) fn start(n: usize, vms: usize, t: &DispatchConfig) -> Result<Self, Error> {
        let host = UdpSocket::bind("127.0.2.1:0")?;
        let port = host.local_addr()?.port();
        host.set_read_timeout(Some(Duration::from_millis(500)))?;
        let peer = Arc::new(UdpSocket::bind("127.0.3.1:0")?);
        peer.set_read_timeout(Some(Duration::from_millis(100)))?;
        let mut dps = Vec::new();
        let mut tids: Vec<Vec<u32>> = Vec::new();
        for i in 0..n {
            let seen: Vec<u32> = tids.iter().flatten().copied().collect();
            let dp = start_node(i, port, t.clone())?;
            // A thread names itself once it runs: wait for the new worker's name.
            let deadline = Instant::now() + Duration::from_secs(2);
            let new = loop {
                let new: Vec<u32> = testutil::worker_threads()?
                    .into_iter()
                    .filter(|t| !seen.contains(t))
                    .collect();
                if !new.is_empty() || Instant::now() > deadline {
                    break new;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            if new.len() != 1 {
                return Err(format!("node {i}: {} worker threads, not 1", new.len()).into());
            }
            tids.push(new);
            let spi = 0x1000 + i as u32;
            let c = child(
                1,
                spi,
                spi + 0x100,
                dp.local_addrs().natt[0],
                peer.local_addr()?,
                ts("10.0.0.0", "10.0.255.255"),
                ts("192.168.0.0", "192.168.0.255"),
            );
            dp.install_child(&c)?;
            dps.push(dp);
        }
        let mut bed = Self {
            host,
            port,
            dps,
            tids,
            vms: Vec::with_capacity(vms),
            peer,
        };
        let mut buf = vec![0u8; 2048];
        for v in 0..vms {
            let mac = vm_mac(v);
            let req = arp(
                ArpOperation::REQUEST,
                mac,
                &vm_ip(v),
                [0; 6],
                "10.0.255.254",
            );
            let frame = vxlan(VNI, [0xff; 6], mac, EtherType::ARP, &req);
            for i in 0..n {
                bed.host
                    .send_to(&frame, SocketAddr::new(node_ip(i), port))?;
            }
            let (from, vmac) = bed
                .arp_reply(&mut buf, mac)?
                .ok_or("a VM's request went unanswered")?;
            let node = (0..n)
                .find(|&i| node_ip(i) == from.ip())
                .ok_or("an answer from no node")?;
            let pkt = udp4(&vm_ip(v), 1000, "192.168.0.9", 9000, 64, &[0u8; 36]);
            let frame = vxlan(VNI, vmac, mac, EtherType::IPV4, &pkt);
            bed.vms.push(Vm { vmac, node, frame });
        }
        // Exactly one answer each: no other reply is waiting.
        bed.host
            .set_read_timeout(Some(Duration::from_millis(200)))?;
        if bed.arp_reply(&mut buf, [0; 6])?.is_some() {
            return Err("a VM's request was answered twice".into());
        }
        Ok(bed)
    }

    /// The next ARP reply the hosts receive (to `vm`, or to anyone with `vm` all zeros),
    /// skipping the nodes' announcements: its sender and the MAC it gives. None: nothing
    /// within the socket's timeout.
    fn arp_reply(
        &self,
        buf: &mut [u8],
        vm: [u8; 6],
    ) -> Result<Option<(SocketAddr, [u8; 6])>, Error> {
        loop {
            let (len, from) = match self.host.recv_from(buf) {
                Ok(r) => r,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None)
                }
                Err(e) => return Err(e.into()),
            };
            let (_, dst, src, ty, _) = testutil::parse_vxlan(&buf[..len]);
            if ty == EtherType::ARP && (vm == [0; 6] || dst == vm) {
                return Ok(Some((from, src)));
            }
        }
    }

    /// Counts what reaches the peer until the returned flag is set; the thread returns the
    /// count.
    pub(crate) fn drain(&self) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
        let stop = Arc::new(AtomicBool::new(false));
        let (peer, flag) = (Arc::clone(&self.peer), Arc::clone(&stop));
        let handle = std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            let mut got = 0u64;
            while !flag.load(Ordering::Relaxed) {
                if peer.recv_from(&mut buf).is_ok() {
                    got += 1;
                }
            }
            got
        });
        (stop, handle)
    }

    /// Packets node `i` sealed so far.
    pub(crate) fn sealed(&self, i: usize) -> u64 {
        self.dps[i]
            .stats()
            .children
            .iter()
            .map(|c| c.packets_out)
            .sum()
    }

    /// Sends `schedule`'s frames (indices into `vms`) in turn at `rate` per second for `d`,
    /// re-learning where a virtual MAC lives from every frame the nodes send the hosts (as a
    /// VXLAN device with learning does), until `stop`; adds what it sent to `sent`.
    pub(crate) fn send(
        &self,
        schedule: &[usize],
        rate: f64,
        d: Duration,
        stop: &AtomicBool,
        sent: &AtomicU64,
    ) -> Result<(), Error> {
        let (host, port, vms) = (&self.host, self.port, &self.vms[..]);
        let mut at: std::collections::HashMap<[u8; 6], IpAddr> =
            vms.iter().map(|v| (v.vmac, node_ip(v.node))).collect();
        host.set_nonblocking(true)?;
        let mut buf = vec![0u8; 2048];
        let start = Instant::now();
        let mut n = 0u64;
        let mut i = 0usize;
        while start.elapsed() < d && !stop.load(Ordering::Relaxed) {
            while let Ok((len, from)) = host.recv_from(&mut buf) {
                if len >= 22 {
                    let (_, _, src, _, _) = testutil::parse_vxlan(&buf[..len]);
                    if let Some(ip) = at.get_mut(&src) {
                        *ip = from.ip();
                    }
                }
            }
            let due = (start.elapsed().as_secs_f64() * rate) as u64;
            while n < due {
                let vm = &vms[schedule[i % schedule.len()]];
                host.send_to(&vm.frame, SocketAddr::new(at[&vm.vmac], port))?;
                i += 1;
                n += 1;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        sent.fetch_add(n, Ordering::Relaxed);
        host.set_nonblocking(false)?;
        Ok(())
    }

    /// Stops every node.
    pub(crate) fn shutdown(&self) {
        for dp in &self.dps {
            dp.shutdown();
        }
    }
}

fn start_node(i: usize, vxlan_port: u16, table: DispatchConfig) -> Result<Arc<Dataplane>, Error> {
    let tenant = ids::TenantId::new("acme")?;
    let cfg = DataplaneConfig {
        listen: vec![IpAddr::from([127, 0, 0, 1])],
        ike_port: 0,
        natt_port: 0,
        vxlan_port,
        vnets: vec![VnetConfig {
            tenant: tenant.clone(),
            name: "prod".into(),
            vni: VNI,
            gateway_ips: vec![IpAddr::from([10, 0, 255, 254])],
            vtep: node_ip(i),
            routes: vec![Route {
                prefix: IpAddr::from([10, 0, 0, 0]),
                len: 16,
                host: IpAddr::from([127, 0, 2, 1]),
            }],
            router_mac: None,
        }],
        tunnels: vec![TunnelBinding {
            tunnel: ike::TunnelId(1),
            name: "site".into(),
            tenant,
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
        fair_kernel_gate: false,
        relay: None,
        dispatch: Some(table),
        attachments: vec![],
    };
    let (tx, _rx) = crossbeam_channel::unbounded();
    Ok(Dataplane::start(cfg, tx)?)
}
