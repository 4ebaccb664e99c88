//! Helpers of the socket tests: a steer node on loopback with kernel-chosen ports, fake
//! peers, hosts and nodes as plain UDP sockets, and Geneve frame builders and readers.
//!
//! Address plan (all loopback): VIPs 127.0.0.10/11, steer underlay 127.0.0.20, peers
//! 127.0.0.50, data nodes 127.0.1.x, control 127.0.2.1, strangers 127.0.3.x, hosts
//! 127.0.4.1. Each test starts its own steer node, so tests do not see each other's traffic.

#![allow(dead_code)]

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protego_steernode::{SteerConfig, SteerNode, SteerStats};
use steer::HealthConfig;
use wire::geneve::{GeneveBuilder, GeneveRepr, HealthProbe, ProtegoOption};
use wire::relay::{self, RelayFrame};
use wire::vxlan::Vni;

/// How long a test waits for something that should happen.
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);

pub(crate) fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Failure detection that never declares anything dead during a test.
pub(crate) fn patient_health() -> HealthConfig {
    HealthConfig {
        timeout: Duration::from_secs(600),
        idle_interval: Duration::from_secs(600),
        ..HealthConfig::default()
    }
}

/// A steer node on two VIPs with every port chosen by the kernel.
pub(crate) fn start(health: HealthConfig, revive: Option<Duration>) -> Arc<SteerNode> {
    let mut c = SteerConfig::new(
        vec!["127.0.0.10".parse().unwrap(), "127.0.0.11".parse().unwrap()],
        sa("127.0.0.20:0"),
        sa("127.0.0.20:0"),
    );
    c.ike_port = 0;
    c.natt_port = 0;
    c.health = health;
    c.revive_interval = revive;
    SteerNode::start(c).unwrap()
}

/// A UDP socket on `ip` with a short read timeout.
pub(crate) fn socket(ip: &str) -> UdpSocket {
    let s = UdpSocket::bind(format!("{ip}:0")).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    s
}

/// The next datagram within `within`, with its source.
pub(crate) fn recv(s: &UdpSocket, within: Duration) -> Option<(Vec<u8>, SocketAddr)> {
    let deadline = Instant::now() + within;
    let mut buf = vec![0u8; 65536];
    while Instant::now() < deadline {
        if let Ok((n, from)) = s.recv_from(&mut buf) {
            return Some((buf[..n].to_vec(), from));
        }
    }
    None
}

/// A received Geneve frame and its bytes.
pub(crate) struct Frame {
    pub(crate) bytes: Vec<u8>,
    pub(crate) from: SocketAddr,
    pub(crate) parsed: RelayFrame,
}

impl Frame {
    /// The relayed datagram's UDP payload.
    pub(crate) fn payload(&self) -> &[u8] {
        let d = self.parsed.datagram.as_ref().expect("a datagram");
        &self.bytes[d.payload.clone()]
    }
}

/// The next Geneve frame carrying a datagram within `within`, skipping probe frames (and
/// answering every probe, on data frames too, if `answer` is set).
pub(crate) fn recv_frame(s: &UdpSocket, answer: bool, within: Duration) -> Option<Frame> {
    let deadline = Instant::now() + within;
    while let Some((bytes, from)) = recv(s, deadline.saturating_duration_since(Instant::now())) {
        let parsed = relay::parse_frame(&bytes).expect("a valid Geneve frame");
        if answer {
            if let Some(p) = parsed.probe {
                reply_probe(s, from, p);
            }
        }
        if parsed.datagram.is_some() {
            return Some(Frame {
                bytes,
                from,
                parsed,
            });
        }
    }
    None
}

/// Answers probe `p` with a control frame carrying the reply, as a data node does.
pub(crate) fn reply_probe(s: &UdpSocket, to: SocketAddr, p: HealthProbe) {
    let mut buf = [0u8; 64];
    let repr = GeneveRepr {
        control: true,
        protocol_type: relay::protocol_type(to.is_ipv6()),
        vni: Vni::default(),
    };
    let mut b = GeneveBuilder::new(&mut buf, &repr).unwrap();
    b.push_protego(&ProtegoOption::ProbeReply(p)).unwrap();
    let n = b.finish();
    s.send_to(&buf[..n], to).unwrap();
}

/// Sends a relay frame asking the steer node at `steer` to send `payload` from `src` to `dst`.
pub(crate) fn send_relay(
    s: &UdpSocket,
    steer: SocketAddr,
    src: SocketAddr,
    dst: SocketAddr,
    payload: &[u8],
) {
    let mut buf = vec![0u8; payload.len() + 128];
    let n = relay::emit_frame(&mut buf, Vni::default(), &[], src, dst, payload).unwrap();
    s.send_to(&buf[..n], steer).unwrap();
}

/// Waits until `cond` holds on the node's stats; returns them (panics at the deadline).
pub(crate) fn wait_stats(
    node: &SteerNode,
    what: &str,
    cond: impl Fn(&SteerStats) -> bool,
) -> SteerStats {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let s = node.stats();
        if cond(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s:#?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An ESP datagram with `spi`, sequence number `seq` and `len` bytes in all.
pub(crate) fn esp(spi: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut d = vec![0xa5u8; len.max(8)];
    d[..4].copy_from_slice(&spi.to_be_bytes());
    d[4..8].copy_from_slice(&seq.to_be_bytes());
    d
}

/// Runs `ip ARGS` in the calling thread's namespace; the test fails if it fails.
pub(crate) fn ip(args: &[&str]) {
    let st = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("run ip");
    assert!(st.success(), "ip {args:?}");
}

/// Runs `test` in a network namespace of its own (namespaces are per thread: a thread that
/// made its own, joined before returning) holding a veth pair up: `port0`, the steer node's
/// customer-facing port, and `ce0`, the customer's end. IPv6 is off in the namespace, so the
/// kernel sends no untagged router solicitations or MLD reports of its own on the link: every
/// frame the port sees is one the test wrote.
pub(crate) fn with_customer_link(test: fn()) {
    std::thread::spawn(move || {
        // SAFETY: plain system call; affects this thread (and the threads it starts) only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        // Read through this thread's network namespace (/proc/sys/net is per namespace).
        for conf in ["all", "default"] {
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{conf}/disable_ipv6"), "1")
                .expect("turn IPv6 off in the test's namespace");
        }
        ip(&["link", "set", "lo", "up"]);
        ip(&[
            "link", "add", "port0", "type", "veth", "peer", "name", "ce0",
        ]);
        ip(&["link", "set", "port0", "up"]);
        ip(&["link", "set", "ce0", "up"]);
        test();
    })
    .join()
    .expect("in its own namespace");
}

/// A steer node on loopback (as [`start`]'s) whose port `port0` has id 5.
pub(crate) fn start_with_port() -> Arc<SteerNode> {
    let mut c = SteerConfig::new(
        vec!["127.0.0.10".parse().unwrap()],
        sa("127.0.0.20:0"),
        sa("127.0.0.20:0"),
    );
    c.ike_port = 0;
    c.natt_port = 0;
    c.health = patient_health();
    c.ports = vec![protego_steernode::PortSpec {
        id: steer::PortId(5),
        interface: "port0".into(),
    }];
    SteerNode::start(c).expect("steer node with a port")
}
