//! ESP for an SPI that is not steered yet, held a moment by the VIP thread.
//!
//! Also ESP whose data node is declared dead, for as long: a data node that restarted answers
//! its probes again a moment after control has given it a CHILD_SA.
//!
//! A peer may send on a CHILD_SA as soon as it has answered the CREATE_CHILD_SA that made it
//! (RFC 7296 §2.17; strongSwan does for a CHILD_SA beside others with the same selectors,
//! which self-dispatch creates, one per data node). The control node learns the keys from
//! that answer, installs the CHILD_SA on its data node and only then steers its SPI here: a
//! millisecond or two in which the peer's first packets find no steering. They are held here
//! instead of dropped, in arrival order, and sent on once the SPI is steered; those whose SPI
//! is still unknown after [`HOLD_FOR`] are dropped as `unknown_spi`, as before.
//!
//! Bounded against a peer or an attacker sending unknown SPIs: at most [`MAX_HELD`] datagrams
//! and [`MAX_HELD_BYTES`] bytes (beyond, unknown SPIs are dropped at once), and the held ones
//! are looked at again only when the tables changed or the oldest expired, so a flood costs
//! a copy per held datagram and nothing per batch.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wire::EspSpi;

use crate::tables::Tables;

/// How long a datagram waits for its SPI to be steered (an install on a busy data node
/// takes tens of milliseconds; one that takes longer has failed).
pub(crate) const HOLD_FOR: Duration = Duration::from_millis(500);
/// Most datagrams held at once (at 6 000 packets per second, the first 0.7 s).
pub(crate) const MAX_HELD: usize = 4096;
/// Most bytes held at once.
pub(crate) const MAX_HELD_BYTES: usize = 4 * 1024 * 1024;
/// How often the VIP thread looks at what it holds while it holds something.
pub(crate) const HOLD_POLL: Duration = Duration::from_millis(2);

/// One held datagram.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    /// Its SPI.
    pub(crate) spi: EspSpi,
    /// When it arrived.
    pub(crate) at: Instant,
    /// Who sent it.
    pub(crate) src: SocketAddr,
    /// Which VIP socket it came to.
    pub(crate) local: SocketAddr,
    /// Its UDP payload.
    pub(crate) payload: Vec<u8>,
    /// It waits for its data node (declared dead), not for its SPI.
    pub(crate) for_node: bool,
}

/// What the VIP thread holds.
#[derive(Debug, Default)]
pub(crate) struct Hold {
    held: VecDeque<Held>,
    bytes: usize,
    /// The tables the held datagrams were last looked up in.
    seen: Option<Arc<Tables>>,
    /// When some held datagrams wait for their data node to answer its probes again, the
    /// last time they were looked at (they are looked at every [`HOLD_POLL`] then).
    node_wait: Option<Instant>,
}

/// What [`Hold::release`] gives back.
#[derive(Debug, Default)]
pub(crate) struct Released {
    /// Datagrams whose SPI is steered now, in arrival order.
    pub(crate) ready: Vec<Held>,
    /// Datagrams dropped because their SPI stayed unknown.
    pub(crate) expired: u64,
    /// Datagrams dropped because their data node stayed dead.
    pub(crate) expired_dead: u64,
}

impl Hold {
    /// Holds a datagram for `spi` that arrived at `now`; false if the hold is full (the
    /// caller drops it).
    pub(crate) fn push(
        &mut self,
        spi: EspSpi,
        now: Instant,
        (src, local): (SocketAddr, SocketAddr),
        payload: &[u8],
    ) -> bool {
        if self.held.len() >= MAX_HELD || self.bytes + payload.len() > MAX_HELD_BYTES {
            return false;
        }
        self.bytes += payload.len();
        self.held.push_back(Held {
            spi,
            at: now,
            src,
            local,
            payload: payload.to_vec(),
            for_node: false,
        });
        true
    }

    /// Holds a datagram for `spi` whose data node is declared dead (see
    /// [`Hold::wait_for_node`]); false if the hold is full.
    pub(crate) fn push_for_node(
        &mut self,
        spi: EspSpi,
        now: Instant,
        addrs: (SocketAddr, SocketAddr),
        payload: &[u8],
    ) -> bool {
        if !self.push(spi, now, addrs, payload) {
            return false;
        }
        if let Some(h) = self.held.back_mut() {
            h.for_node = true;
        }
        self.node_wait.get_or_insert(now);
        true
    }

    /// True if nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Holds again a datagram [`Hold::release`] gave back whose data node is declared dead
    /// (a node that restarted answers its probes again a moment after control steered a new
    /// CHILD_SA to it): it keeps its arrival time, and what waits on a node is looked at every
    /// [`HOLD_POLL`]. False if the hold is full.
    pub(crate) fn wait_for_node(&mut self, h: Held, now: Instant) -> bool {
        if now.saturating_duration_since(h.at) >= HOLD_FOR {
            return false;
        }
        if self.held.len() >= MAX_HELD || self.bytes + h.payload.len() > MAX_HELD_BYTES {
            return false;
        }
        self.node_wait.get_or_insert(now);
        self.bytes += h.payload.len();
        self.held.push_back(Held {
            for_node: true,
            ..h
        });
        true
    }

    /// The datagrams whose SPI `tables` steer, and how many expired at `now`; nothing is
    /// looked up unless the tables changed since the last call or the oldest expired.
    pub(crate) fn release(&mut self, tables: &Arc<Tables>, now: Instant) -> Released {
        let mut out = Released::default();
        let changed = !self.seen.as_ref().is_some_and(|s| Arc::ptr_eq(s, tables));
        let expiring = self
            .held
            .front()
            .is_some_and(|h| now.saturating_duration_since(h.at) >= HOLD_FOR);
        let node_due = self
            .node_wait
            .is_some_and(|at| now.saturating_duration_since(at) >= HOLD_POLL);
        if self.held.is_empty() || !(changed || expiring || node_due) {
            return out;
        }
        if !(changed || node_due) {
            // Only the oldest expired: nothing can have become steerable since the last look
            // (the tables are the same), so only the expired ones at the front go, without a
            // look at the others (a slow stream of unknown SPIs costs no scan per batch).
            while let Some(h) = self
                .held
                .front()
                .filter(|h| now.saturating_duration_since(h.at) >= HOLD_FOR)
            {
                if h.for_node {
                    out.expired_dead += 1;
                } else {
                    out.expired += 1;
                }
                self.bytes -= h.payload.len();
                self.held.pop_front();
            }
            return out;
        }
        self.seen = Some(Arc::clone(tables));
        self.node_wait = None;
        let mut kept = VecDeque::with_capacity(self.held.len());
        for h in self.held.drain(..) {
            if tables.spis.lookup(h.spi).is_some() {
                self.bytes -= h.payload.len();
                out.ready.push(h);
            } else if now.saturating_duration_since(h.at) >= HOLD_FOR {
                self.bytes -= h.payload.len();
                if h.for_node {
                    out.expired_dead += 1;
                } else {
                    out.expired += 1;
                }
            } else {
                kept.push_back(h);
            }
        }
        self.held = kept;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steer::{NodeId, SpiEntry, TunnelId};

    /// Tables that steer `spi` to node 1.
    fn steering(spi: EspSpi) -> Arc<Tables> {
        let mut t = Tables::default();
        t.spis
            .insert(
                spi,
                SpiEntry {
                    node: NodeId(1),
                    tunnel: TunnelId(1),
                },
            )
            .unwrap();
        Arc::new(t)
    }

    fn addrs() -> (SocketAddr, SocketAddr) {
        (
            "198.51.100.2:4500".parse().unwrap(),
            "198.51.100.1:4500".parse().unwrap(),
        )
    }

    #[test]
    fn held_datagrams_go_once_their_spi_is_steered_and_expire_otherwise() {
        let t0 = Instant::now();
        let mut hold = Hold::default();
        assert!(hold.push(EspSpi(0x1007), t0, addrs(), &[1, 2, 3]));
        assert!(hold.push(EspSpi(0x1008), t0, addrs(), &[4]));
        assert!(hold.push(EspSpi(0x1007), t0, addrs(), &[5]));
        let empty = Arc::new(Tables::default());
        let r = hold.release(&empty, t0);
        assert!(r.ready.is_empty() && r.expired == 0);
        // SPI 7 steered: its two datagrams, in order; 8 waits.
        let t = steering(EspSpi(0x1007));
        let r = hold.release(&t, t0 + Duration::from_millis(3));
        let got: Vec<Vec<u8>> = r.ready.iter().map(|h| h.payload.clone()).collect();
        assert_eq!(got, vec![vec![1, 2, 3], vec![5]]);
        assert!(!hold.is_empty());
        // The same tables again, before expiry: nothing looked up.
        assert!(hold
            .release(&t, t0 + Duration::from_millis(4))
            .ready
            .is_empty());
        // 8 never steered: dropped after HOLD_FOR.
        let r = hold.release(&t, t0 + HOLD_FOR);
        assert_eq!(r.expired, 1);
        assert!(hold.is_empty());
    }

    #[test]
    fn the_hold_is_bounded() {
        let t0 = Instant::now();
        let mut hold = Hold::default();
        for _ in 0..MAX_HELD {
            assert!(hold.push(EspSpi(0x1009), t0, addrs(), &[0; 8]));
        }
        assert!(!hold.push(EspSpi(0x1009), t0, addrs(), &[0; 8]));
        let mut hold = Hold::default();
        assert!(hold.push(EspSpi(0x1009), t0, addrs(), &vec![0; MAX_HELD_BYTES]));
        assert!(!hold.push(EspSpi(0x1009), t0, addrs(), &[0]));
    }

    #[test]
    fn a_datagram_waiting_for_its_node_is_looked_at_again_until_it_expires() {
        let t0 = Instant::now();
        let mut hold = Hold::default();
        let t = steering(EspSpi(0x1007));
        assert!(hold.push(EspSpi(0x1007), t0, addrs(), &[1]));
        let mut r = hold.release(&t, t0);
        let h = r.ready.pop().unwrap();
        // Its node is dead: held again, looked at after HOLD_POLL though the tables are the
        // same.
        assert!(hold.wait_for_node(h, t0));
        assert!(hold
            .release(&t, t0 + Duration::from_millis(1))
            .ready
            .is_empty());
        let mut r = hold.release(&t, t0 + HOLD_POLL);
        let h = r.ready.pop().unwrap();
        assert!(h.for_node);
        // Past HOLD_FOR it is not held again (the caller drops it as node_dead).
        assert!(!hold.wait_for_node(h, t0 + HOLD_FOR));
        assert!(hold.is_empty());
    }
}
