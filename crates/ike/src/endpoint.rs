//! The IKE endpoint: all IKE SAs of a node, demultiplexed by SPI.

use crate::{config::*, event::*, Error};
use crypto::Rng;
use std::net::SocketAddr;
use std::time::Instant;
use wire::{EspSpi, Transmit};

/// All IKE SAs of a node. See the crate documentation for the order of calls.
pub struct Endpoint {
    config: EndpointConfig,
    rng: Box<dyn Rng>,
}

impl Endpoint {
    /// A new endpoint with no peers. `now` starts its clock.
    pub fn new(config: EndpointConfig, rng: Box<dyn Rng>, now: Instant) -> Self {
        let _ = now;
        Self { config, rng }
    }

    /// Adds or replaces a peer configuration. With `StartAction::Start` the next
    /// `handle_timeout` (or an explicit [`initiate`](Self::initiate)) initiates.
    pub fn add_peer(&mut self, now: Instant, peer: PeerConfig) -> Result<(), Error> {
        todo!("{now:?} {peer:?} {:?}", self.config)
    }

    /// Removes a peer configuration, deleting its SAs (DELETE sent to the peer).
    pub fn remove_peer(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), Error> {
        todo!("{now:?} {tunnel:?}")
    }

    /// Starts IKE_SA_INIT toward the peer of `tunnel` from `local` (port 500).
    pub fn initiate(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), Error> {
        todo!("{now:?} {tunnel:?} {}", self.rng.next_u32())
    }

    /// Starts a rekey of the CHILD_SA with this inbound SPI (data path: sequence numbers or byte
    /// limits near exhaustion, or operator request).
    pub fn rekey_child(&mut self, now: Instant, inbound_spi: EspSpi) -> Result<(), Error> {
        todo!("{now:?} {inbound_spi:?}")
    }

    /// Starts a rekey of the tunnel's IKE SA.
    pub fn rekey_ike(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), Error> {
        todo!("{now:?} {tunnel:?}")
    }

    /// Deletes the tunnel's IKE SA (and CHILD_SAs), telling the peer.
    pub fn terminate(&mut self, now: Instant, tunnel: TunnelId) -> Result<(), Error> {
        todo!("{now:?} {tunnel:?}")
    }

    /// Processes one received IKE datagram (non-ESP marker already removed).
    pub fn handle_datagram(&mut self, now: Instant, local: SocketAddr, remote: SocketAddr, data: &[u8]) {
        todo!("{now:?} {local} {remote} {}", data.len())
    }

    /// Runs timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        todo!("{now:?}")
    }

    /// Writes the next datagram to send into `buf` (cleared first).
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        todo!("{}", buf.len())
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<Event> {
        todo!()
    }

    /// When `handle_timeout` must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        todo!()
    }

    /// Status of every IKE SA.
    pub fn status(&self, now: Instant) -> Vec<IkeSaStatus> {
        todo!("{now:?}")
    }

    /// Serialises the full state of one IKE SA (keys, SPIs, message IDs, CHILD_SAs, timers as
    /// remaining durations) for a standby to restore.
    pub fn snapshot(&self, now: Instant, ike: IkeSpis) -> Option<Vec<u8>> {
        todo!("{now:?} {ike:?}")
    }

    /// Restores an IKE SA from [`snapshot`](Self::snapshot) bytes.
    pub fn restore(&mut self, now: Instant, bytes: &[u8]) -> Result<IkeSpis, Error> {
        todo!("{now:?} {}", bytes.len())
    }
}
