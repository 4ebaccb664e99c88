//! Set-up shared by the data plane's integration tests: the VNet whose VM 10.0.0.5 lives
//! behind a host VTEP, the tunnel bound to it and its CHILD_SA, a configuration for tests to
//! adjust, the start of a data plane beside a host VTEP socket on loopback (tried again on a
//! port clash), sockets with a read timeout, and waiting for the statistics.
//!
//! Each test file uses only part of it, and includes `src/testutil.rs` as `testutil` next to
//! it (the CHILD_SA is built with it).
#![allow(dead_code)]

pub(crate) mod netns;

use crate::testutil::{child, ts};
use crossbeam_channel::Receiver;
use ike::ChildSaInfo;
use protego_dataplane::{
    DataPath, Dataplane, DataplaneConfig, DataplaneError, DataplaneStats, Inside, Route, ToControl,
    TunnelBinding, VnetConfig,
};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip address")
}

/// Tenant `acme`'s VNet `prod`, VNI 100, gateway 10.0.0.1, local VTEP `vtep`, and
/// 10.0.0.0/24 behind the host VTEP `host`.
pub(crate) fn vnet(vtep: &str, host: &str) -> VnetConfig {
    VnetConfig {
        tenant: ids::TenantId::new("acme").expect("tenant"),
        name: "prod".into(),
        vni: 100,
        gateway_ips: vec![ip("10.0.0.1")],
        vtep: ip(vtep),
        routes: vec![Route {
            prefix: ip("10.0.0.0"),
            len: 24,
            host: ip(host),
        }],
        router_mac: None,
    }
}

/// [`vnet`] on loopback: local VTEP 127.0.0.1, host VTEP 127.0.0.2.
pub(crate) fn loopback_vnet() -> VnetConfig {
    vnet("127.0.0.1", "127.0.0.2")
}

/// Tunnel 1 (`site`) of tenant `acme`, its traffic to `inside`.
pub(crate) fn site_tunnel(inside: Inside) -> TunnelBinding {
    TunnelBinding {
        tunnel: ike::TunnelId(1),
        name: "site".into(),
        tenant: ids::TenantId::new("acme").expect("tenant"),
        inside,
    }
}

/// The CHILD_SA of tunnel 1 (SPIs 0x1001 in, 0x2001 out) between the gateway's `local` and
/// the peer's `remote`, for traffic between 10.0.0.0/24 and 192.168.0.0/24.
pub(crate) fn site_child(local: SocketAddr, remote: SocketAddr) -> ChildSaInfo {
    child(
        1,
        0x1001,
        0x2001,
        local,
        remote,
        ts("10.0.0.0", "10.0.0.255"),
        ts("192.168.0.0", "192.168.0.255"),
    )
}

/// The configuration the tests start from (each changes what it tests): IKE and NAT-T on
/// ports of the kernel's choosing on 127.0.0.1, VXLAN on `vxlan_port`, [`loopback_vnet`] with
/// tunnel 1 bound to it, two unpinned workers, batches of 32, no busy polling, no relay.
pub(crate) fn config(vxlan_port: u16) -> DataplaneConfig {
    DataplaneConfig {
        attachments: vec![],
        listen: vec![ip("127.0.0.1")],
        ike_port: 0,
        natt_port: 0,
        vxlan_port,
        vnets: vec![loopback_vnet()],
        tunnels: vec![site_tunnel(Inside::Vnet(0))],
        tun_name: None,
        batch: 32,
        workers: 2,
        cpus: vec![],
        pin_workers: false,
        busy_poll: Duration::ZERO,
        busy_poll_budget: protego_dataplane::DEFAULT_BUSY_POLL_BUDGET,
        xdp: Default::default(),
        fair_kernel_gate: true,
        relay: None,
        dispatch: None,
    }
}

/// A UDP socket bound to `addr`, with a read timeout of 5 s.
pub(crate) fn bind(addr: &str) -> UdpSocket {
    let s = UdpSocket::bind(addr).expect("bind a test socket");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s
}

/// A data plane started by [`start_beside_host`].
pub(crate) struct Started {
    pub(crate) dp: Arc<Dataplane>,
    /// What the data plane hands to the control plane.
    pub(crate) rx: Receiver<ToControl>,
    /// The host's VTEP socket on 127.0.0.2 (see [`bind`]); its port is the VXLAN port.
    pub(crate) host: UdpSocket,
}

/// Starts the data plane `config(port)` describes, where `port` is the port of a fresh host
/// VTEP socket on 127.0.0.2, so both ends of the VXLAN path use one port of the kernel's
/// choosing. The data plane's own sockets may find that port taken on their addresses
/// ([`DataplaneError::Bind`]), and in relay mode it may be one the configuration forbids (the
/// NAT-T or IKE port, [`DataplaneError::Config`]): then it tries again with a new port, 20
/// times at most.
pub(crate) fn start_beside_host(mut config: impl FnMut(u16) -> DataplaneConfig) -> Started {
    for _ in 0..20 {
        let host = bind("127.0.0.2:0");
        let cfg = config(host.local_addr().expect("addr").port());
        let relay = cfg.relay.is_some();
        let (tx, rx) = crossbeam_channel::unbounded();
        match Dataplane::start(cfg, tx) {
            Ok(dp) => return Started { dp, rx, host },
            Err(DataplaneError::Bind { .. }) => continue,
            Err(DataplaneError::Config { .. }) if relay => continue,
            Err(e) => panic!("start: {e}"),
        }
    }
    panic!("no free port for the VXLAN socket");
}

/// A data plane on [`config`] beside a host VTEP, with a peer's socket for ESP in UDP.
pub(crate) struct PeerAndHost {
    pub(crate) dp: Arc<Dataplane>,
    /// The host's VTEP socket (VM 10.0.0.5 lives behind it).
    pub(crate) host: UdpSocket,
    /// The peer's socket on 127.0.0.1.
    pub(crate) peer: UdpSocket,
    /// The data plane's NAT-T socket.
    pub(crate) natt: SocketAddr,
    /// The data plane's VXLAN socket.
    pub(crate) vtep: SocketAddr,
}

/// Starts a [`PeerAndHost`].
pub(crate) fn peer_and_host() -> PeerAndHost {
    let Started { dp, host, .. } = start_beside_host(config);
    let addrs = dp.local_addrs();
    PeerAndHost {
        dp,
        host,
        peer: bind("127.0.0.1:0"),
        natt: addrs.natt[0],
        vtep: addrs.vxlan[0],
    }
}

/// The next datagram on `s` and its sender, None when none came within the read timeout.
pub(crate) fn try_recv(s: &UdpSocket) -> Option<(Vec<u8>, SocketAddr)> {
    let mut buf = vec![0u8; 65536];
    let (n, from) = s.recv_from(&mut buf).ok()?;
    buf.truncate(n);
    Some((buf, from))
}

/// The next datagram on `s` and its sender, which must come within the read timeout.
pub(crate) fn recv(s: &UdpSocket) -> (Vec<u8>, SocketAddr) {
    try_recv(s).expect("a datagram within the read timeout")
}

/// The drop counter `name`, None if the data plane has no such counter.
pub(crate) fn drop_counter(st: &DataplaneStats, name: &str) -> Option<u64> {
    st.drops.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
}

/// The drop counter `name`, 0 if the data plane has no such counter.
pub(crate) fn drop_count(st: &DataplaneStats, name: &str) -> u64 {
    drop_counter(st, name).unwrap_or(0)
}

/// Waits until `f` holds for the data plane's statistics (5 s at most; the failure names
/// `what`).
pub(crate) fn wait_stats(dp: &Dataplane, what: &str, f: impl Fn(&DataplaneStats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = dp.stats();
        if f(&s) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Moves this thread (and the threads it starts) into a network namespace of its own with
/// loopback up and a veth pair for an attachment: `gw0`, the gateway's port (MAC
/// 02:00:00:00:00:01), and `ce0`, the CE's side, both with room for two VLAN tags (MTU 1508).
/// Needs root.
pub(crate) fn attachment_namespace() {
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
}

/// Runs a command that must succeed (`ip ...` in a test's namespace).
pub(crate) fn run(args: &[&str]) {
    let st = Command::new(args[0])
        .args(&args[1..])
        .status()
        .expect(args[0]);
    assert!(st.success(), "{args:?}");
}

/// A raw packet socket bound to `iface`: it receives every frame on it with `receive`, else
/// none (it only sends).
pub(crate) fn packet_socket(iface: &str, receive: bool) -> OwnedFd {
    let protocol = if receive {
        i32::from((libc::ETH_P_ALL as u16).to_be())
    } else {
        0
    };
    // SAFETY: plain system call; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, protocol) };
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
    sll.sll_protocol = protocol as u16;
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
