//! Prints what the CE -> VM path of an attachment lane (issue 16 §1) forwards: a CE's tagged
//! frames, written as fast as one thread can into a veth pair, go through the data plane's
//! AF_PACKET ring and leave as VXLAN toward a host socket on loopback. Printed per run: the
//! frames the lane processed per second, the frames lost before it (`attach_ring_full`: the
//! ring was full because the lane did not keep up), frames per batch, and per frame the
//! workers' busy time (`WorkerStats::busy_ns`: wall time in batches) and the time their
//! threads ran on a CPU.
//! The lane's capacity is what it processes while frames are lost before it.
//!
//! MODE `tunnel` sends the CE's packets into the VNet's IPsec tunnel instead (a CHILD_SA to a
//! peer socket on loopback that nobody reads), numbered in the VTEP lane's order
//! (`worker::to_vtep_lanes`); MODE `shared` does too while a host thread loads the same tunnel
//! from a VM over VXLAN as fast as it can, so the attachment lane's batches wait for the busy
//! VTEP lane's lock; MODE `vm-loaded` is its control: the CE's packets to the VM while the VM
//! loads the tunnel the same way (the same threads, no wait of the attachment lane for the
//! VTEP lane's lock). With a VM load the CE's frames per second are the frames written less
//! those lost before the ring, and the VM's the remaining packets the workers processed.
//!
//! Needs root (it unshares a network namespace of its own, so nothing outside is touched):
//! `cargo run -p protego-dataplane --example attach_lane -- [WORKERS] [SECONDS] [RUNS]
//! [WRITERS] [MODE]` (default 2 workers, 3 s, 5 runs, 1 writing thread, MODE `vm`). On a
//! shared machine compare figures of runs taken alternately, never single ones.

#[path = "../src/testutil.rs"]
mod testutil;

use protego_dataplane::{
    AttachmentConfig, AttachmentTags, DataPath, Dataplane, DataplaneConfig, Inside, Route,
    VnetConfig,
};
use std::net::{IpAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testutil::{child, ts, udp4, vxlan};
use wire::ethernet::EtherType;

const CE_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0xa, 1];
const VM_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 5];
/// The gateway side's MAC (set: sysfs shows the namespace the program started in).
const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
/// Frames per `sendmmsg` of the CE.
const BURST: usize = 64;

type Error = Box<dyn std::error::Error>;

fn ip(s: &str) -> Result<IpAddr, Error> {
    Ok(s.parse()?)
}

fn sh(args: &[&str]) -> Result<(), Error> {
    let st = Command::new(args[0]).args(&args[1..]).status()?;
    if !st.success() {
        return Err(format!("{args:?}: {st}").into());
    }
    Ok(())
}

/// A raw packet socket bound to `iface`, receiving nothing.
fn packet_socket(iface: &str) -> Result<OwnedFd, Error> {
    // SAFETY: plain system call; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a fresh descriptor this function owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(iface)?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(std::io::Error::last_os_error().into());
    }
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
    if ret != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(fd)
}

/// Where the CE's packets go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// To the VM (VXLAN).
    Vm,
    /// Into the VNet's tunnel.
    Tunnel,
    /// Into the VNet's tunnel while a VM loads it too.
    Shared,
    /// To the VM while the VM loads the VNet's tunnel.
    VmLoaded,
}

impl Mode {
    /// A VM loads the tunnel.
    fn vm_load(self) -> bool {
        matches!(self, Self::Shared | Self::VmLoaded)
    }
}

/// Sends `datagram` to `to` from `sock` until `stop`; returns the datagrams sent.
fn load(sock: &UdpSocket, datagram: &[u8], to: std::net::SocketAddr, stop: &AtomicBool) -> u64 {
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if sock.send_to(datagram, to).is_ok() {
            sent += 1;
        }
    }
    sent
}

/// Writes `frame` `BURST` times per `sendmmsg` until `stop`; returns the frames written.
fn blast(fd: &OwnedFd, frame: &[u8], stop: &AtomicBool) -> u64 {
    let mut iov: Vec<libc::iovec> = (0..BURST)
        .map(|_| libc::iovec {
            iov_base: frame.as_ptr() as *mut libc::c_void,
            iov_len: frame.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iov
        .iter_mut()
        .map(|v| {
            // SAFETY: mmsghdr is plain data.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            m
        })
        .collect();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: the headers point at `iov`, which points at `frame`; all outlive the call.
        let n = unsafe { libc::sendmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), BURST as u32, 0) };
        if n > 0 {
            sent += n as u64;
        }
    }
    sent
}

/// The data plane's counters at one moment.
#[derive(Clone, Copy)]
struct Counts {
    packets: u64,
    batches: u64,
    busy_ns: u64,
    ring_full: u64,
    /// Time the worker threads spent on a CPU (`/proc/self/task/*/schedstat`).
    cpu_ns: u64,
}

/// Nanoseconds the threads named `dp-worker…` have run on a CPU.
fn worker_cpu_ns() -> Result<u64, Error> {
    Ok(testutil::threads_cpu_ns(&testutil::worker_threads()?)?)
}

fn counts(dp: &Dataplane) -> Result<Counts, Error> {
    let s = dp.stats();
    Ok(Counts {
        packets: s.workers.iter().map(|w| w.packets).sum(),
        batches: s.workers.iter().map(|w| w.batches).sum(),
        busy_ns: s.workers.iter().map(|w| w.busy_ns).sum(),
        ring_full: s
            .drops
            .iter()
            .filter(|(r, _)| r == "attach_ring_full")
            .map(|(_, n)| n)
            .sum(),
        cpu_ns: worker_cpu_ns()?,
    })
}

fn main() -> Result<(), Error> {
    let mut args = std::env::args().skip(1);
    let workers: usize = args.next().map_or(Ok(2), |a| a.parse())?;
    let secs: u64 = args.next().map_or(Ok(3), |a| a.parse())?;
    let runs: usize = args.next().map_or(Ok(5), |a| a.parse())?;
    let writers: usize = args.next().map_or(Ok(1), |a| a.parse())?;
    let mode = match args.next().as_deref() {
        None | Some("vm") => Mode::Vm,
        Some("tunnel") => Mode::Tunnel,
        Some("shared") => Mode::Shared,
        Some("vm-loaded") => Mode::VmLoaded,
        Some(other) => {
            return Err(format!("MODE {other}: expected vm, tunnel, shared or vm-loaded").into())
        }
    };
    // A namespace of our own, before any thread starts (threads inherit it).
    // SAFETY: plain system call.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!("unshare (needs root): {}", std::io::Error::last_os_error()).into());
    }
    sh(&["ip", "link", "set", "lo", "up"])?;
    sh(&[
        "ip", "link", "add", "ce0", "type", "veth", "peer", "name", "gw0",
    ])?;
    sh(&["ip", "link", "set", "gw0", "address", "02:00:00:00:00:01"])?;
    for i in ["ce0", "gw0"] {
        sh(&["ip", "link", "set", i, "mtu", "1508", "up"])?;
    }
    let host = UdpSocket::bind("127.0.0.2:0")?;
    let port = host.local_addr()?.port();
    let cfg = DataplaneConfig {
        listen: vec![ip("127.0.0.1")?],
        ike_port: 0,
        natt_port: 0,
        vxlan_port: port,
        vnets: vec![VnetConfig {
            tenant: ids::TenantId::new("acme")?,
            name: "prod".into(),
            vni: 100,
            gateway_ips: vec![ip("10.0.0.1")?],
            vtep: ip("127.0.0.1")?,
            routes: vec![Route {
                prefix: ip("10.0.0.0")?,
                len: 24,
                host: ip("127.0.0.2")?,
            }],
            router_mac: None,
        }],
        tunnels: vec![protego_dataplane::TunnelBinding {
            tunnel: ike::TunnelId(1),
            name: "site".into(),
            tenant: ids::TenantId::new("acme")?,
            inside: Inside::Vnet(0),
        }],
        tun_name: None,
        batch: 64,
        workers,
        cpus: vec![],
        pin_workers: false,
        busy_poll: Duration::ZERO,
        busy_poll_budget: protego_dataplane::DEFAULT_BUSY_POLL_BUDGET,
        xdp: Default::default(),
        fair_kernel_gate: true,
        relay: None,
        dispatch: None,
        attachments: vec![AttachmentConfig {
            name: "dc".into(),
            tenant: ids::TenantId::new("acme")?,
            vnet: "prod".into(),
            port: datapath::AttachmentPort::Interface("gw0".into()),
            tags: AttachmentTags::Vlan { c_tag: 10 },
            gateway_ip: ip("10.99.0.1")?,
            ce_ip: None,
            routes: vec![(ip("10.99.0.0")?, 24)],
            ce_mac: None,
        }],
    };
    let (tx, _rx) = crossbeam_channel::unbounded();
    let dp = Dataplane::start(cfg, tx)?;
    // The VM's MAC, learned from a frame it sends to the gateway.
    let vnet_mac = dp.gateway_mac(0).ok_or("no VNet")?;
    let hello = udp4("10.0.0.5", 7, "10.99.0.2", 9, 64, b"hello");
    let vtep = dp.local_addrs().vxlan[0];
    host.send_to(&vxlan(100, vnet_mac, VM_MAC, EtherType::IPV4, &hello), vtep)?;
    std::thread::sleep(Duration::from_millis(200));
    // The tunnel's peer: a socket nobody reads (what it drops is beyond the data plane).
    let peer = UdpSocket::bind("127.0.0.1:0")?;
    if mode != Mode::Vm {
        dp.install_child(&child(
            1,
            0x1001,
            0x2001,
            dp.local_addrs().natt[0],
            peer.local_addr()?,
            ts("10.0.0.0", "10.255.255.255"),
            ts("192.168.0.0", "192.168.0.255"),
        ))?;
    }
    let dst = if matches!(mode, Mode::Tunnel | Mode::Shared) {
        "192.168.0.9"
    } else {
        "10.0.0.5"
    };
    let vm_load = vxlan(
        100,
        vnet_mac,
        VM_MAC,
        EtherType::IPV4,
        &udp4("10.0.0.5", 7, "192.168.0.9", 9, 64, &[0; 64]),
    );

    let pkt = udp4("10.99.0.2", 9, dst, 7, 64, &[0; 64]);
    let mut frame = GW_MAC.to_vec();
    frame.extend_from_slice(&CE_MAC);
    frame.extend_from_slice(&[0x81, 0x00, 0x00, 10, 0x08, 0x00]);
    frame.extend_from_slice(&pkt);
    let fd = packet_socket("ce0")?;
    let what = match mode {
        Mode::Vm => "CE -> VM",
        Mode::Tunnel => "CE -> tunnel",
        Mode::Shared => "CE -> tunnel, VM -> the same tunnel",
        Mode::VmLoaded => "CE -> VM, VM -> tunnel",
    };
    println!(
        "{what}, {} B frames, {workers} worker(s), {writers} writer(s), {secs} s per run",
        frame.len()
    );
    for run in 0..runs {
        let stop = Arc::new(AtomicBool::new(false));
        let c0 = counts(&dp)?;
        let started = Instant::now();
        let sent: u64 = std::thread::scope(|s| {
            let senders: Vec<_> = (0..writers)
                .map(|_| s.spawn(|| blast(&fd, &frame, &stop)))
                .collect();
            let vm = mode
                .vm_load()
                .then(|| s.spawn(|| load(&host, &vm_load, vtep, &stop)));
            std::thread::sleep(Duration::from_secs(secs));
            stop.store(true, Ordering::Relaxed);
            if let Some(h) = vm {
                let _ = h.join();
            }
            senders.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        std::thread::sleep(Duration::from_millis(300));
        let elapsed = started.elapsed().as_secs_f64();
        let c1 = counts(&dp)?;
        let packets = c1.packets - c0.packets;
        let per = |ns: u64| ns as f64 / packets.max(1) as f64;
        if mode.vm_load() {
            let ce = sent.saturating_sub(c1.ring_full - c0.ring_full);
            println!(
                "run {run}: CE {:>7.0} frames/s through the lane, VM {:>7.0} packets/s, \
                 ring full {:>7}, {:>5.1} packets/batch, {:>4.0} ns busy and {:>4.0} ns on CPU \
                 per packet",
                ce as f64 / elapsed,
                packets.saturating_sub(ce) as f64 / elapsed,
                c1.ring_full - c0.ring_full,
                packets as f64 / (c1.batches - c0.batches).max(1) as f64,
                per(c1.busy_ns - c0.busy_ns),
                per(c1.cpu_ns - c0.cpu_ns),
            );
            continue;
        }
        println!(
            "run {run}: {:>7.0} frames/s through the lane ({:>7.0} written, ring full {:>7}), \
             {:>5.1} frames/batch, {:>4.0} ns busy and {:>4.0} ns on CPU per frame",
            packets as f64 / elapsed,
            sent as f64 / elapsed,
            c1.ring_full - c0.ring_full,
            packets as f64 / (c1.batches - c0.batches).max(1) as f64,
            per(c1.busy_ns - c0.busy_ns),
            per(c1.cpu_ns - c0.cpu_ns),
        );
    }
    dp.shutdown();
    Ok(())
}
