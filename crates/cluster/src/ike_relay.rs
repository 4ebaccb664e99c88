//! The control node's IKE path in the distributed form. Steer nodes forward every IKE
//! datagram that reaches the VIP (UDP 500, and UDP 4500 behind the non-ESP marker of
//! RFC 3948 §2.2) to the active control node inside Geneve, as the whole IP/UDP datagram
//! (`wire::relay`); control answers the same way, and the steer node sends the answer from
//! the VIP. So the IKE engine sees the peer's real address and port, and the VIP it used,
//! exactly as in `protego up`.
//!
//! Only frames from the live steer nodes' Geneve addresses are accepted; anything else, and
//! anything malformed, is dropped and counted.

use crossbeam_channel::Sender;
use dataplane::{DataplaneError, IkeDatagram, ToControl};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{debug, warn};
use wire::relay;
use wire::vxlan::Vni;

/// The non-ESP marker before IKE on the NAT-T port (RFC 3948 §2.2).
const NON_ESP_MARKER: [u8; 4] = [0; 4];
/// Largest frame accepted (an IKE message of 64 KiB plus headers).
const MAX_FRAME: usize = 65_535;
/// How often the receive thread checks for shutdown.
const POLL: Duration = Duration::from_millis(200);

/// Why an IKE frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Discard {
    UnknownSender,
    Malformed,
    NoDatagram,
    WrongPort,
    NoMarker,
    Queue,
    NoSteer,
}

impl Discard {
    const ALL: [Discard; 7] = [
        Discard::UnknownSender,
        Discard::Malformed,
        Discard::NoDatagram,
        Discard::WrongPort,
        Discard::NoMarker,
        Discard::Queue,
        Discard::NoSteer,
    ];

    fn name(self) -> &'static str {
        match self {
            Discard::UnknownSender => "unknown_sender",
            Discard::Malformed => "malformed",
            Discard::NoDatagram => "no_datagram",
            Discard::WrongPort => "wrong_port",
            Discard::NoMarker => "natt_without_marker",
            Discard::Queue => "control_queue_full",
            Discard::NoSteer => "no_steer_node",
        }
    }
}

struct Shared {
    socket: UdpSocket,
    ike_port: u16,
    natt_port: u16,
    steers: Mutex<Vec<SocketAddr>>,
    drops: [AtomicU64; Discard::ALL.len()],
    stop: AtomicBool,
}

impl Shared {
    fn drop_frame(&self, why: Discard) {
        self.drops[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn steers(&self) -> std::sync::MutexGuard<'_, Vec<SocketAddr>> {
        self.steers.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The control node's Geneve socket for IKE.
pub struct IkeRelay {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl IkeRelay {
    /// Binds `addr` and starts handing the IKE datagrams steer nodes relay to `to_control`.
    pub fn bind(
        addr: SocketAddr,
        ike_port: u16,
        natt_port: u16,
        to_control: Sender<ToControl>,
    ) -> Result<Self, DataplaneError> {
        let socket =
            UdpSocket::bind(addr).map_err(|source| DataplaneError::Bind { addr, source })?;
        socket
            .set_read_timeout(Some(POLL))
            .map_err(|source| DataplaneError::Bind { addr, source })?;
        let shared = Arc::new(Shared {
            socket,
            ike_port,
            natt_port,
            steers: Mutex::new(Vec::new()),
            drops: Default::default(),
            stop: AtomicBool::new(false),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("protego-ike-relay".into())
                .spawn(move || receive(&shared, &to_control))
                .map_err(|source| DataplaneError::Start { source })?
        };
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.shared.socket.local_addr()
    }

    /// The steer nodes frames are accepted from.
    pub fn set_steers(&self, steers: Vec<SocketAddr>) {
        *self.shared.steers() = steers;
    }

    /// Sends an IKE message from `local` (a VIP and port) to `remote` through the first of
    /// `steers` (steer nodes hold the same tables, any of them can send from the VIP).
    pub fn send(
        &self,
        steers: &[SocketAddr],
        local: SocketAddr,
        remote: SocketAddr,
        payload: &[u8],
    ) -> Result<(), DataplaneError> {
        let Some(steer) = steers.first().copied() else {
            self.shared.drop_frame(Discard::NoSteer);
            return Err(DataplaneError::Send {
                to: remote,
                source: io::Error::new(io::ErrorKind::NotConnected, "no steer node is registered"),
            });
        };
        let marker: &[u8] = if local.port() == self.shared.natt_port {
            &NON_ESP_MARKER
        } else {
            &[]
        };
        let mut data = Vec::with_capacity(marker.len() + payload.len());
        data.extend_from_slice(marker);
        data.extend_from_slice(payload);
        let mut frame = vec![0u8; data.len() + 128];
        let vni = Vni::new(0).unwrap_or_default();
        let len = relay::emit_frame(&mut frame, vni, &[], local, remote, &data).map_err(|e| {
            DataplaneError::Send {
                to: remote,
                source: io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
            }
        })?;
        self.shared
            .socket
            .send_to(&frame[..len], steer)
            .map(|_| ())
            .map_err(|source| DataplaneError::Send { to: steer, source })
    }

    /// Dropped frames by reason.
    pub fn drops(&self) -> Vec<(String, u64)> {
        Discard::ALL
            .iter()
            .map(|d| {
                (
                    d.name().to_owned(),
                    self.shared.drops[*d as usize].load(Ordering::Relaxed),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Stops the receive thread.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for IkeRelay {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn receive(sh: &Shared, to_control: &Sender<ToControl>) {
    let mut buf = vec![0u8; MAX_FRAME];
    while !sh.stop.load(Ordering::Relaxed) {
        let (n, from) = match sh.socket.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => {
                warn!(error = %e, "IKE relay socket failed; retrying");
                std::thread::sleep(POLL);
                continue;
            }
        };
        match classify(sh, from, &buf[..n]) {
            Ok(datagram) => {
                if to_control.try_send(ToControl::Ike(datagram)).is_err() {
                    sh.drop_frame(Discard::Queue);
                }
            }
            Err(why) => {
                debug!(%from, reason = why.name(), "IKE relay frame dropped");
                sh.drop_frame(why);
            }
        }
    }
}

/// Checks one frame and extracts its IKE message.
fn classify(sh: &Shared, from: SocketAddr, frame: &[u8]) -> Result<IkeDatagram, Discard> {
    if !sh.steers().contains(&from) {
        return Err(Discard::UnknownSender);
    }
    let f = relay::parse_frame(frame).map_err(|_| Discard::Malformed)?;
    let d = f.datagram.ok_or(Discard::NoDatagram)?;
    let payload = &frame[d.payload.clone()];
    let data = if d.dst.port() == sh.natt_port {
        payload
            .strip_prefix(&NON_ESP_MARKER)
            .ok_or(Discard::NoMarker)?
    } else if d.dst.port() == sh.ike_port {
        payload
    } else {
        return Err(Discard::WrongPort);
    };
    Ok(IkeDatagram {
        local: d.dst,
        remote: d.src,
        data: data.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn relays_ike_both_ways_and_refuses_strangers() {
        let (tx, rx) = crossbeam_channel::bounded(8);
        let relay = IkeRelay::bind(sa("127.0.0.1:0"), 500, 4500, tx).unwrap();
        let addr = relay.local_addr().unwrap();
        let steer = UdpSocket::bind("127.0.0.1:0").unwrap();
        steer
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        relay.set_steers(vec![steer.local_addr().unwrap()]);
        let (vip, peer) = (sa("198.51.100.1:4500"), sa("203.0.113.9:61000"));
        let mut frame = [0u8; 256];
        let vni = Vni::new(0).unwrap();
        // Marker + IKE on 4500 from the steer node: delivered without the marker.
        let n = relay::emit_frame(&mut frame, vni, &[], peer, vip, b"\0\0\0\0hello").unwrap();
        stranger.send_to(&frame[..n], addr).unwrap();
        steer.send_to(&frame[..n], addr).unwrap();
        let got = rx.recv_timeout(Duration::from_secs(2)).unwrap();
        match got {
            ToControl::Ike(d) => {
                assert_eq!((d.local, d.remote), (vip, peer));
                assert_eq!(d.data, b"hello");
            }
            other => panic!("unexpected {other:?}"),
        }
        // ESP on 4500 (no marker) is not IKE.
        let n = relay::emit_frame(&mut frame, vni, &[], peer, vip, b"\x01\x02\x03\x04esp").unwrap();
        steer.send_to(&frame[..n], addr).unwrap();
        // The answer goes out through the steer node, marker added, addresses swapped.
        relay
            .send(&[steer.local_addr().unwrap()], vip, peer, b"answer")
            .unwrap();
        let mut buf = [0u8; 512];
        let (m, _) = steer.recv_from(&mut buf).unwrap();
        let f = relay::parse_frame(&buf[..m]).unwrap();
        let d = f.datagram.unwrap();
        assert_eq!((d.src, d.dst), (vip, peer));
        assert_eq!(&buf[d.payload], b"\0\0\0\0answer");
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let drops = relay.drops();
            let has = |name: &str| drops.iter().any(|(n, c)| n == name && *c == 1);
            if has("unknown_sender") && has("natt_without_marker") {
                break;
            }
            assert!(Instant::now() < deadline, "drops not counted: {drops:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            rx.try_recv().is_err(),
            "only the one IKE message was delivered"
        );
        // No steer node: an error, counted.
        assert!(relay.send(&[], vip, peer, b"x").is_err());
        relay.shutdown();
    }
}
