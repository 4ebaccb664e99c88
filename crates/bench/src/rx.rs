//! The load generator's receivers: one thread per receiving socket, alive for the whole
//! benchmark, reading with `recvmmsg` + UDP GRO and kernel timestamps.
//!
//! - **host VXLAN** (host VTEP, port 4789): answers the gateway's ARP requests for VMs
//!   (RFC 826 inside VXLAN, RFC 7348), learns the gateway's MAC from ARP replies, and counts the
//!   inner packets of the current run.
//! - **host plain** (the VM address): inner packets routed by the kernel (strongSwan).
//! - **peer ESP** (port 4500): IKE messages (non-ESP marker, RFC 3948 §2.2) go to the IKE
//!   thread; ESP of the current run is counted and a sample is opened with the load
//!   generator's inbound SA to read the packet index for latency.
//!
//! A run is bracketed by [`RxHandle::start`] and [`RxHandle::stop`]; packets carrying another
//! run's tag are counted apart, so stragglers of an earlier run never count.
//!
//! The receivers poll their non-blocking sockets (every 50 µs during a run, every 2 ms
//! otherwise) instead of sleeping on them: a datagram sent over a veth is delivered into the
//! receiving socket by the *sender's* system call, and waking a sleeping reader there would
//! bill the gateway under test for a cross-task wake-up per datagram, which a NIC never
//! costs it. Latency is unaffected: it is read from kernel receive timestamps.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use esp::{InboundSa, Opened};
use wire::arp::ArpOperation;
use wire::esp::{UdpEncap, NON_ESP_MARKER_LEN};
use wire::ethernet::EthernetAddress;

use crate::error::{BenchError, Result};
use crate::ike_client::IkeDatagram;
use crate::net;
use crate::packet::{self, VxlanFrame};
use crate::sock::{realtime_ns, RecvBatch, Socket};

/// Messages per `recvmmsg`.
const RX_SLOTS: usize = 64;
/// Polling interval while a run is being counted.
const POLL_ACTIVE: Duration = Duration::from_micros(50);
/// Polling interval between runs (ARP answers, IKE).
const POLL_IDLE: Duration = Duration::from_millis(2);

/// What a receiver thread reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxKind {
    /// VXLAN at the host VTEP.
    HostVxlan,
    /// Plain inner packets at the VM address.
    HostPlain,
    /// IKE and ESP at the peer's NAT-T port.
    PeerEsp,
}

/// What to count in a run.
pub(crate) struct Measure {
    /// The run's tag.
    pub(crate) tag: u32,
    /// Keep `(index, receive time)` of the packets read (or opened, for ESP).
    pub(crate) record: bool,
    /// ESP: open one datagram in this many (1: all).
    pub(crate) sample_every: u32,
    /// ESP: the load generator's inbound SAs by SPI.
    pub(crate) sas: Arc<HashMap<u32, Arc<InboundSa>>>,
    /// ESP: `(ESP length, inner length)` of the run's packet sizes, to count the inner bytes
    /// of datagrams that are not opened (the nearest ESP length wins).
    pub(crate) esp_sizes: Vec<(usize, usize)>,
}

/// What a receiver saw during a run.
#[derive(Debug, Clone, Default)]
pub(crate) struct RxReport {
    /// Packets of the run.
    pub(crate) packets: u64,
    /// Their inner bytes.
    pub(crate) bytes: u64,
    /// Kernel receive time of the first, `CLOCK_REALTIME` ns.
    pub(crate) first_ns: Option<u64>,
    /// Kernel receive time of the last.
    pub(crate) last_ns: Option<u64>,
    /// `(packet index, receive time)` pairs (if recorded).
    pub(crate) samples: Vec<(u32, u64)>,
    /// Datagrams the receiving socket dropped for lack of buffer space during the run.
    pub(crate) overflow: u64,
    /// Packets of other runs, or not ours.
    pub(crate) foreign: u64,
    /// ESP datagrams chosen for the sample that did not open.
    pub(crate) unopened: u64,
}

enum Command {
    Start(Box<Measure>, Sender<()>),
    Stop(Sender<RxReport>),
    Ike(Option<Sender<IkeDatagram>>),
}

/// A receiver thread.
pub(crate) struct RxHandle {
    name: &'static str,
    commands: Sender<Command>,
    progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// State shared with the host VXLAN receiver: the gateway's MAC once an ARP reply taught it.
pub(crate) type GatewayMac = Arc<Mutex<Option<EthernetAddress>>>;

impl RxHandle {
    /// Starts a receiver of `kind` on `sock`.
    pub(crate) fn spawn(
        name: &'static str,
        kind: RxKind,
        sock: Arc<Socket>,
        gw_mac: GatewayMac,
    ) -> Result<RxHandle> {
        let timestamps = sock.timestamps();
        let (tx, rx) = crossbeam_channel::unbounded();
        let progress = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut state = RxThread {
            kind,
            sock,
            commands: rx,
            progress: Arc::clone(&progress),
            stop: Arc::clone(&stop),
            gw_mac,
            ike: None,
            active: None,
            last_overflow: 0,
            timestamps,
        };
        let thread = std::thread::Builder::new()
            .name(format!("bench-{name}"))
            .spawn(move || state.run())
            .map_err(|e| BenchError::io(format!("spawn receiver {name}"), e))?;
        Ok(RxHandle {
            name,
            commands: tx,
            progress,
            stop,
            thread: Some(thread),
        })
    }

    fn gone(&self) -> BenchError {
        BenchError::Thread {
            thread: self.name,
            reason: "the receiver thread ended".to_owned(),
        }
    }

    /// Starts counting a run; returns once the thread has taken the command.
    pub(crate) fn start(&self, m: Measure) -> Result<()> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.progress.store(0, Ordering::Relaxed);
        self.commands
            .send(Command::Start(Box::new(m), tx))
            .map_err(|_| self.gone())?;
        rx.recv_timeout(Duration::from_secs(5))
            .map_err(|_| self.gone())
    }

    /// Ends the run and returns what was counted.
    pub(crate) fn stop(&self) -> Result<RxReport> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.commands
            .send(Command::Stop(tx))
            .map_err(|_| self.gone())?;
        rx.recv_timeout(Duration::from_secs(5))
            .map_err(|_| self.gone())
    }

    /// Packets of the current run so far.
    pub(crate) fn progress(&self) -> u64 {
        self.progress.load(Ordering::Relaxed)
    }

    /// Where IKE messages on this socket go from now on (peer ESP receiver only).
    pub(crate) fn set_ike(&self, inbox: Option<Sender<IkeDatagram>>) -> Result<()> {
        self.commands
            .send(Command::Ike(inbox))
            .map_err(|_| self.gone())
    }
}

impl Drop for RxHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Active {
    m: Box<Measure>,
    report: RxReport,
    overflow_start: u64,
    esp_seen: u64,
    scratch: Vec<u8>,
}

struct RxThread {
    kind: RxKind,
    sock: Arc<Socket>,
    commands: Receiver<Command>,
    progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    gw_mac: GatewayMac,
    ike: Option<Sender<IkeDatagram>>,
    active: Option<Active>,
    last_overflow: u64,
    timestamps: bool,
}

impl RxThread {
    fn run(&mut self) {
        set_timer_slack_1us();
        let mut batch = RecvBatch::new(RX_SLOTS);
        let mut reply = vec![0u8; 128];
        while !self.stop.load(Ordering::Relaxed) {
            while let Ok(cmd) = self.commands.try_recv() {
                self.command(cmd);
            }
            // An error (none is expected on a bound UDP socket) is treated as an empty poll.
            let n = self.sock.recv_batch(&mut batch).unwrap_or_default();
            if n == 0 {
                std::thread::sleep(if self.active.is_some() {
                    POLL_ACTIVE
                } else {
                    POLL_IDLE
                });
                continue;
            }
            let fallback_ns = if self.timestamps { 0 } else { realtime_ns() };
            for (meta, data) in batch.iter() {
                if let Some(o) = meta.queue_drops {
                    self.last_overflow = u64::from(o);
                }
                let stamp = meta.stamp_ns.unwrap_or(fallback_ns);
                let Some(src) = meta.src else { continue };
                for d in data.chunks(meta.seg) {
                    match self.kind {
                        RxKind::HostVxlan => self.vxlan(d, src, stamp, &mut reply),
                        RxKind::HostPlain => {
                            if let Some(m) = packet::read_mark(d) {
                                self.count(m.tag, m.index, m.len, stamp);
                            }
                        }
                        RxKind::PeerEsp => self.natt(d, src, stamp),
                    }
                }
            }
            if let Some(a) = &self.active {
                self.progress.store(a.report.packets, Ordering::Relaxed);
            }
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Start(m, ack) => {
                self.active = Some(Active {
                    m,
                    report: RxReport::default(),
                    overflow_start: self.last_overflow,
                    esp_seen: 0,
                    scratch: vec![0; 65536],
                });
                let _ = ack.send(());
            }
            Command::Stop(reply) => {
                let report = match self.active.take() {
                    Some(mut a) => {
                        a.report.overflow = self.last_overflow.saturating_sub(a.overflow_start);
                        a.report
                    }
                    None => RxReport::default(),
                };
                let _ = reply.send(report);
            }
            Command::Ike(inbox) => self.ike = inbox,
        }
    }

    /// Counts a packet of the current run.
    fn count(&mut self, tag: u32, index: u32, len: usize, stamp: u64) {
        let Some(a) = &mut self.active else { return };
        if tag != a.m.tag {
            a.report.foreign += 1;
            return;
        }
        let r = &mut a.report;
        r.packets += 1;
        r.bytes += len as u64;
        r.first_ns = Some(r.first_ns.map_or(stamp, |f| f.min(stamp)));
        r.last_ns = Some(r.last_ns.map_or(stamp, |l| l.max(stamp)));
        if a.m.record {
            r.samples.push((index, stamp));
        }
    }

    fn vxlan(&mut self, d: &[u8], src: SocketAddr, stamp: u64, reply: &mut [u8]) {
        match packet::parse_vxlan(d) {
            Some(VxlanFrame::Ipv4 { packet, .. }) => {
                if let Some(m) = packet::read_inner(packet) {
                    self.count(m.tag, m.index, m.len, stamp);
                } else if let Some(a) = &mut self.active {
                    a.report.foreign += 1;
                }
            }
            Some(VxlanFrame::Arp {
                vni,
                src: eth_src,
                arp,
            }) => {
                // Every address but the gateway's is a VM behind this host (the edge bench's
                // gateway resolves each of its per-VM destinations).
                if arp.operation == ArpOperation::REQUEST
                    && arp.target_protocol_addr != net::VNET_GW
                {
                    let answer = arp.reply(net::VM_MAC);
                    if let Some(n) =
                        packet::write_arp_frame(reply, vni, eth_src, net::VM_MAC, &answer)
                    {
                        let _ = self
                            .sock
                            .send_to(&reply[..n], SocketAddr::new(src.ip(), net::VXLAN_PORT));
                    }
                } else if arp.operation == ArpOperation::REPLY
                    && arp.source_protocol_addr == net::VNET_GW
                {
                    if let Ok(mut mac) = self.gw_mac.lock() {
                        *mac = Some(arp.source_hardware_addr);
                    }
                }
            }
            _ => {}
        }
    }

    fn natt(&mut self, d: &[u8], src: SocketAddr, stamp: u64) {
        match UdpEncap::classify(d) {
            Ok(UdpEncap::Ike) => {
                if let Some(inbox) = &self.ike {
                    let _ = inbox.try_send((src, d[NON_ESP_MARKER_LEN..].to_vec()));
                }
            }
            Ok(UdpEncap::Esp(spi)) => self.esp(spi.0, d, stamp),
            _ => {}
        }
    }

    fn esp(&mut self, spi: u32, d: &[u8], stamp: u64) {
        enum Outcome {
            Mark(packet::Mark),
            Foreign,
            Estimate,
            Nothing,
        }
        let outcome = {
            let Some(a) = &mut self.active else { return };
            a.esp_seen += 1;
            match a.m.sas.get(&spi) {
                None => Outcome::Foreign,
                Some(sa) => {
                    let every = u64::from(a.m.sample_every.max(1));
                    if a.esp_seen % every == 1 % every {
                        let buf = &mut a.scratch[..d.len()];
                        buf.copy_from_slice(d);
                        match sa.open(buf) {
                            Ok(Opened::Packet { inner, .. }) => {
                                match buf.get(inner).and_then(packet::read_inner) {
                                    Some(m) => Outcome::Mark(m),
                                    None => Outcome::Foreign,
                                }
                            }
                            Ok(Opened::Dummy { .. }) => Outcome::Nothing,
                            Err(_) => {
                                a.report.unopened += 1;
                                Outcome::Estimate
                            }
                        }
                    } else {
                        Outcome::Estimate
                    }
                }
            }
        };
        match outcome {
            Outcome::Mark(m) => self.count(m.tag, m.index, m.len, stamp),
            Outcome::Nothing => {}
            Outcome::Foreign => {
                if let Some(a) = &mut self.active {
                    a.report.foreign += 1;
                }
            }
            Outcome::Estimate => {
                // Counted without opening: the inner length from the ESP length.
                let Some(a) = &mut self.active else { return };
                let len = nearest_inner(&a.m.esp_sizes, d.len());
                let r = &mut a.report;
                r.packets += 1;
                r.bytes += len as u64;
                r.first_ns = Some(r.first_ns.map_or(stamp, |f| f.min(stamp)));
                r.last_ns = Some(r.last_ns.map_or(stamp, |l| l.max(stamp)));
            }
        }
    }
}

/// Sleeps of this thread end within a microsecond of their deadline (the default slack is
/// 50 µs).
fn set_timer_slack_1us() {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long by value and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0) };
}

/// The inner length whose ESP length is nearest to `esp_len`.
pub(crate) fn nearest_inner(sizes: &[(usize, usize)], esp_len: usize) -> usize {
    sizes
        .iter()
        .min_by_key(|(e, _)| e.abs_diff(esp_len))
        .map_or(0, |&(_, inner)| inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_length_from_esp_length() {
        let sizes = [(80, 40), (616, 576), (1540, 1500)];
        assert_eq!(nearest_inner(&sizes, 80), 40);
        assert_eq!(nearest_inner(&sizes, 84), 40);
        assert_eq!(nearest_inner(&sizes, 620), 576);
        assert_eq!(nearest_inner(&sizes, 1600), 1500);
        assert_eq!(nearest_inner(&[], 100), 0);
    }
}
