//! The load generator's IKEv2 side (RFC 7296): Protego's own sans-IO engine
//! (`ike::Endpoint`) as initiator of one IKE SA with one CHILD_SA per bench tunnel, PSK
//! authentication, UDP encapsulation forced (RFC 3948, as swanctl `encap = yes`), driven in a
//! thread of its own. The negotiated CHILD_SA keys ([`ike::ChildSaInfo`]) become the ESP SAs
//! the load generator seals with and opens with ([`TunnelSa`]).
//!
//! Port 500 is read by this thread; IKE on port 4500 arrives through [`IkeClient::inbox`]
//! from the thread that reads the shared NAT-T socket (it also carries the ESP).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use crypto::SaCipher;
use esp::{InboundSa, OutboundSa, SaConfig, MAX_REPLAY_WINDOW};
use ike::{
    ChildSaInfo, DpdAction, EndpointConfig, EspProposal, Event, Identity, IkeProposal, PeerConfig,
    StartAction, TrafficSelector, TunnelId,
};
use wire::esp::NON_ESP_MARKER;
use zeroize::Zeroizing;

use crate::error::{BenchError, Result};
use crate::gateway::{peer_id, GATEWAY_ID, IKE_PROPOSAL, PSK};
use crate::net;
use crate::options::Cipher;
use crate::sock::Socket;

/// An IKE message received on port 4500 (marker removed), with its sender.
pub(crate) type IkeDatagram = (SocketAddr, Vec<u8>);

/// IKE SAs negotiated at once.
const WAVE: usize = 64;

/// One tunnel's ESP SAs, keyed from its CHILD_SA.
pub(crate) struct TunnelSa {
    /// Its tunnel-side address (source of inbound inner packets, destination of outbound).
    pub(crate) addr: Ipv4Addr,
    /// What the load generator sends to the gateway (the gateway's inbound SA).
    pub(crate) outbound: OutboundSa,
    /// What the gateway sends to the load generator.
    pub(crate) inbound: Arc<InboundSa>,
    /// The next sequence number to seal with `outbound`. Pools are sealed ahead of a run and a
    /// run rarely sends all of its pool: the numbers of the packets it did not send are used
    /// again for the next pool (those packets never left this process, so no number reaches
    /// the wire twice), so the gateway sees each tunnel's numbers without gaps, as from a real
    /// peer. A gap larger than the replay window would make packets still in flight too old.
    pub(crate) next_seq: std::sync::atomic::AtomicU64,
}

impl TunnelSa {
    /// Keys both directions from a CHILD_SA.
    pub(crate) fn new(index: u32, info: &ChildSaInfo) -> Result<TunnelSa> {
        let keys = &info.keys;
        let cipher = |encr: &[u8], integ: &[u8], spi: u32| {
            SaCipher::new(info.encr, encr, info.integ.map(|i| (i, integ)))
                .map_err(|source| BenchError::Crypto { spi, source })
        };
        let cfg = SaConfig {
            esn: info.esn,
            replay_window: MAX_REPLAY_WINDOW,
            rekey_after: None,
        };
        let out_spi = info.outbound_spi;
        let in_spi = info.inbound_spi;
        let outbound = OutboundSa::new(
            out_spi,
            cipher(&keys.outbound_encr, &keys.outbound_integ, out_spi.0)?,
            &cfg,
        )
        .map_err(|source| BenchError::Esp {
            spi: out_spi.0,
            source,
        })?;
        let inbound = InboundSa::new(
            in_spi,
            cipher(&keys.inbound_encr, &keys.inbound_integ, in_spi.0)?,
            &cfg,
        )
        .map_err(|source| BenchError::Esp {
            spi: in_spi.0,
            source,
        })?;
        Ok(TunnelSa {
            addr: net::tunnel_addr(index),
            outbound,
            inbound: Arc::new(inbound),
            next_seq: std::sync::atomic::AtomicU64::new(1),
        })
    }
}

/// The inbound SAs by SPI (for the receiver that opens a sample of the gateway's ESP).
pub(crate) fn inbound_by_spi(sas: &[TunnelSa]) -> HashMap<u32, Arc<InboundSa>> {
    sas.iter()
        .map(|t| (t.inbound.spi().0, Arc::clone(&t.inbound)))
        .collect()
}

enum Command {
    Initiate(TunnelId),
}

/// The IKE thread and its channels.
pub(crate) struct IkeClient {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    commands: Sender<Command>,
    events: Receiver<Event>,
    inbox: Sender<IkeDatagram>,
    gateway: &'static str,
}

fn peer_config(i: u32, cipher: Cipher) -> Result<PeerConfig> {
    let bad = |e: ike::Error| BenchError::Ike {
        gateway: "config",
        reason: e.to_string(),
    };
    Ok(PeerConfig {
        id: TunnelId(i + 1),
        name: format!("t{i}"),
        local_addrs: vec![net::PEER.into()],
        remote_addrs: vec![net::GW_WAN.into()],
        local_id: Identity::parse(&peer_id(i)).map_err(bad)?,
        remote_id: Identity::parse(GATEWAY_ID).map_err(bad)?,
        psk: Zeroizing::new(PSK.as_bytes().to_vec()),
        ike_proposals: vec![IkeProposal::parse(IKE_PROPOSAL).map_err(bad)?],
        esp_proposals: vec![EspProposal::parse(cipher.esp_proposal()).map_err(bad)?],
        local_ts: vec![
            TrafficSelector::parse(&format!("{}/32", net::tunnel_addr(i)))
                .map_err(|e| bad(e.into()))?,
        ],
        remote_ts: vec![TrafficSelector::parse(net::VNET).map_err(|e| bad(e.into()))?],
        ike_rekey_time: Duration::ZERO,
        ike_over_time: Duration::ZERO,
        child_rekey_time: Duration::ZERO,
        child_life_time: Duration::ZERO,
        rand_time: Duration::ZERO,
        dpd_delay: None,
        dpd_action: DpdAction::Clear,
        start_action: StartAction::None,
        replay_window: MAX_REPLAY_WINDOW,
        resource_sas: ike::DEFAULT_RESOURCE_SAS,
    })
}

impl IkeClient {
    /// Starts the IKE thread with one peer configuration per tunnel. `ike` is the port 500
    /// socket (read and written here), `natt` the shared port 4500 socket (written here).
    pub(crate) fn start(
        gateway: &'static str,
        ike: Arc<UdpSocket>,
        natt: Arc<Socket>,
        tunnels: u32,
        cipher: Cipher,
    ) -> Result<IkeClient> {
        let now = Instant::now();
        let config = EndpointConfig {
            retransmit_timeout: Duration::from_secs(2),
            retransmit_tries: 4,
            ..EndpointConfig::default()
        };
        let mut ep = ike::Endpoint::new(config, Box::new(crypto::SystemRng), now);
        for i in 0..tunnels {
            ep.add_peer(now, peer_config(i, cipher)?)
                .map_err(|e| BenchError::Ike {
                    gateway,
                    reason: format!("tunnel {i}: {e}"),
                })?;
        }
        ike.set_nonblocking(true)
            .map_err(|e| BenchError::io("make the IKE socket non-blocking", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
        let (ev_tx, ev_rx) = crossbeam_channel::unbounded();
        let (in_tx, in_rx) = crossbeam_channel::bounded(4096);
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("bench-ike".to_owned())
            .spawn(move || drive(ep, ike, natt, thread_stop, cmd_rx, ev_tx, in_rx))
            .map_err(|e| BenchError::io("spawn the IKE thread", e))?;
        Ok(IkeClient {
            stop,
            thread: Some(thread),
            commands: cmd_tx,
            events: ev_rx,
            inbox: in_tx,
            gateway,
        })
    }

    /// Where the NAT-T socket's reader puts IKE messages.
    pub(crate) fn inbox(&self) -> Sender<IkeDatagram> {
        self.inbox.clone()
    }

    /// Initiates every tunnel (at most [`WAVE`] at once) and waits until each has its
    /// CHILD_SA; returns their SAs in tunnel order.
    pub(crate) fn establish(&self, tunnels: u32) -> Result<Vec<TunnelSa>> {
        let timeout = Duration::from_secs(30) + Duration::from_millis(30) * tunnels;
        let deadline = Instant::now() + timeout;
        let mut infos: Vec<Option<TunnelSa>> = (0..tunnels).map(|_| None).collect();
        let mut next = 0u32;
        let mut pending = 0usize;
        let mut done = 0u32;
        let fail = |reason: String| BenchError::Ike {
            gateway: self.gateway,
            reason,
        };
        while done < tunnels {
            while pending < WAVE && next < tunnels {
                self.commands
                    .send(Command::Initiate(TunnelId(next + 1)))
                    .map_err(|_| fail("the IKE thread stopped".to_owned()))?;
                next += 1;
                pending += 1;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(fail(format!(
                    "only {done} of {tunnels} CHILD_SAs after {timeout:?}"
                )));
            }
            let event = match self.events.recv_timeout(left) {
                Ok(e) => e,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => continue,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(fail("the IKE thread stopped".to_owned()))
                }
            };
            match event {
                Event::ChildSaInstalled(info) => {
                    let i = info.tunnel.0.wrapping_sub(1);
                    if let Some(slot) = infos.get_mut(i as usize) {
                        if slot.is_none() {
                            *slot = Some(TunnelSa::new(i, &info)?);
                            done += 1;
                            pending = pending.saturating_sub(1);
                        }
                    }
                }
                Event::IkeSaDeleted {
                    tunnel: Some(t),
                    reason,
                    ..
                } if infos
                    .get(t.0.wrapping_sub(1) as usize)
                    .is_some_and(Option::is_none) =>
                {
                    return Err(fail(format!(
                        "tunnel {} failed before its CHILD_SA was up: {reason:?}",
                        t.0 - 1
                    )));
                }
                _ => {}
            }
        }
        Ok(infos.into_iter().flatten().collect())
    }
}

impl Drop for IkeClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The IKE thread: feeds the engine with datagrams and timeouts, sends what it wants to send
/// (with the non-ESP marker on port 4500), and forwards its events.
fn drive(
    mut ep: ike::Endpoint,
    ike: Arc<UdpSocket>,
    natt: Arc<Socket>,
    stop: Arc<AtomicBool>,
    commands: Receiver<Command>,
    events: Sender<Event>,
    inbox: Receiver<IkeDatagram>,
) {
    let local500 = SocketAddr::from((net::PEER, 500));
    let local4500 = natt.local_addr();
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::new();
    let mut pkt = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while let Ok(Command::Initiate(t)) = commands.try_recv() {
            // An error (unknown tunnel) cannot happen for the tunnels added at start; the
            // establish loop times out if it somehow did.
            let _ = ep.initiate(now, t);
        }
        while let Ok((n, from)) = ike.recv_from(&mut buf) {
            ep.handle_datagram(Instant::now(), local500, from, &buf[..n]);
        }
        match inbox.recv_timeout(Duration::from_millis(2)) {
            Ok((from, msg)) => {
                ep.handle_datagram(Instant::now(), local4500, from, &msg);
                while let Ok((from, msg)) = inbox.try_recv() {
                    ep.handle_datagram(Instant::now(), local4500, from, &msg);
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        if ep.poll_timeout().is_some_and(|t| t <= now) {
            ep.handle_timeout(now);
        }
        while let Some(t) = ep.poll_transmit(&mut out) {
            let data = &out[..t.size];
            if t.local.port() == local4500.port() {
                pkt.clear();
                // RFC 3948 §2.3: a NAT keepalive is the single octet 0xFF, without a marker.
                if data != [0xFF] {
                    pkt.extend_from_slice(&NON_ESP_MARKER);
                }
                pkt.extend_from_slice(data);
                let _ = natt.send_to(&pkt, t.remote);
            } else {
                let _ = ike.send_to(data, t.remote);
            }
        }
        while let Some(e) = ep.poll_event() {
            if events.send(e).is_err() {
                return;
            }
        }
    }
}
