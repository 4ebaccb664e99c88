//! Lanes: the ordered multi-core pipeline of one input (an IKE or NAT-T socket, a VTEP
//! socket, the TUN device, an attachment interface's AF_PACKET ring, or in relay mode the
//! Geneve socket). Protego's dispatcher / worker / sender design (ATC'17 §4.4,
//! §6.3), without dedicated threads:
//!
//! 1. **Dispatch** (serial per lane): a worker takes the lane's receive stage, reads a batch
//!    with one `recvmmsg` (UDP GRO trains included), draws the batch's *ticket*, and for
//!    outbound lanes classifies the packets and allocates their ESP sequence numbers — in
//!    arrival order, so a tunnel's sequence numbers leave in order — then releases the stage.
//! 2. **Work** (parallel): the same worker decrypts or encrypts its batch on its own core,
//!    into send batches from its own pool, while other workers dispatch and work on the
//!    following batches of the same lane (and so of the same tunnel).
//! 3. **Send** (ordered): finished send batches are handed to the lane with their ticket;
//!    whichever worker finds the batch at the head of the lane's order sends it, and every
//!    following one that is ready, with `sendmmsg`/GSO. Output order therefore equals input
//!    order within a lane, hence within every tunnel.
//!
//! Locks are taken per batch, never per packet: the receive stage's mutex (held for one
//! receive and the outbound classification) and the order mutex (held only to deposit or
//! pick up batches, never while sending).
//!
//! A worker holds at most `P` send batches (its pool), so at most `workers × P` tickets of a
//! lane are unsent at any time and a ring of that many slots orders them without allocating.
//! The worker holding the lowest unsent ticket can always proceed: every batch it deposited
//! is at the head and gets sent and returned, so the pipeline cannot deadlock.

use crate::batch::TxBatch;
use std::os::fd::RawFd;
use std::sync::{Mutex, MutexGuard};

/// What a lane reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaneKind {
    /// The IKE socket of listen address `listen`.
    Ike {
        /// Index into `Shared::listen`.
        listen: usize,
    },
    /// The NAT-T (ESP-in-UDP) socket of listen address `listen`.
    Natt {
        /// Index into `Shared::listen`.
        listen: usize,
    },
    /// The receiving socket of local VTEP `vtep`.
    Vtep {
        /// Index into `Shared::vteps`.
        vtep: usize,
    },
    /// The TUN device.
    Tun,
    /// The AF_PACKET ring of a customer-facing interface (attachments, issue 16 §1).
    Attach {
        /// Index into `Sockets::packet`.
        iface: usize,
    },
    /// Relay mode: the Geneve socket. It carries both directions, so its batches are
    /// processed in two passes (see `pipeline::classify`): the outbound packets under the dispatch
    /// stage, the inbound ones after it.
    Relay,
}

impl LaneKind {
    /// True for lanes whose batches run the whole graph in arrival order under the dispatch
    /// stage because their packets may be sealed (ESP sequence numbers allocated at
    /// dispatch): a VTEP's and the TUN device's. The relay lane is not: its outbound part runs
    /// under the stage and its ESP from peers after it. Nor is an attachment lane, though its
    /// batches also run under the stage: a CE's packets for the tunnels are numbered in the
    /// VNet's VTEP lane (`worker::batch` handles that lane kind on its own).
    pub(crate) fn is_outbound(self) -> bool {
        matches!(self, Self::Vtep { .. } | Self::Tun)
    }
}

/// Ticket value of an empty ring slot (tickets count up from 0 and never reach it).
const EMPTY: u64 = u64::MAX;

struct Slot {
    ticket: u64,
    parts: Vec<TxBatch>,
    done: bool,
}

struct Order {
    /// The next ticket to send.
    head: u64,
    /// A worker is sending (it keeps sending until nothing at the head is ready).
    sending: bool,
    ring: Box<[Slot]>,
}

/// One input and its ordered pipeline.
pub(crate) struct Lane {
    /// What it reads.
    pub(crate) kind: LaneKind,
    /// The descriptor workers poll.
    pub(crate) fd: RawFd,
    /// The dispatch stage; the value is the next ticket.
    rx: Mutex<u64>,
    order: Mutex<Order>,
}

/// The dispatch stage of a lane, held by one worker: receive, classify, then
/// [`ticket`](Self::ticket) and drop.
pub(crate) struct Dispatch<'a> {
    next: MutexGuard<'a, u64>,
}

impl Dispatch<'_> {
    /// Draws the ticket of the batch just received (once per non-empty batch).
    pub(crate) fn ticket(&mut self) -> u64 {
        let t = *self.next;
        *self.next += 1;
        t
    }
}

impl Lane {
    /// A lane for `kind` on `fd`, ordering up to `in_flight` unsent batches (workers × pool
    /// size) of at most `parts_per_ticket` parts each.
    pub(crate) fn new(
        kind: LaneKind,
        fd: RawFd,
        in_flight: usize,
        parts_per_ticket: usize,
    ) -> Self {
        let size = in_flight.max(1).next_power_of_two();
        let ring = (0..size)
            .map(|_| Slot {
                ticket: EMPTY,
                parts: Vec::with_capacity(parts_per_ticket.max(1)),
                done: false,
            })
            .collect();
        Self {
            kind,
            fd,
            rx: Mutex::new(0),
            order: Mutex::new(Order {
                head: 0,
                sending: false,
                ring,
            }),
        }
    }

    /// Takes the dispatch stage: waits for it if `wait`, else returns None when another worker
    /// holds it.
    pub(crate) fn dispatch(&self, wait: bool) -> Option<Dispatch<'_>> {
        // The guarded value is a counter; a panic elsewhere cannot leave it inconsistent.
        let next = if wait {
            self.rx.lock().unwrap_or_else(|p| p.into_inner())
        } else {
            match self.rx.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        };
        Some(Dispatch { next })
    }

    /// Takes the dispatch stage, waiting for it.
    pub(crate) fn dispatch_waiting(&self) -> Dispatch<'_> {
        // The guarded value is a counter; a panic elsewhere cannot leave it inconsistent.
        Dispatch {
            next: self.rx.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    fn order(&self) -> MutexGuard<'_, Order> {
        self.order.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands over a finished part of batch `ticket` (`last`: the batch is complete). If it is
    /// this lane's turn and nobody is sending, the caller becomes the sender: `send` is called
    /// for every part that is ready, in ticket order, without the lock held; it must send the
    /// part and return it to its owner's pool. `scratch` carries the parts out of the lock
    /// (reused, so no allocation).
    pub(crate) fn submit(
        &self,
        ticket: u64,
        part: TxBatch,
        last: bool,
        scratch: &mut Vec<TxBatch>,
        mut send: impl FnMut(TxBatch),
    ) {
        let mut st = self.order();
        let mask = st.ring.len() as u64 - 1;
        let slot = &mut st.ring[(ticket & mask) as usize];
        debug_assert!(
            slot.ticket == EMPTY || slot.ticket == ticket,
            "lane ring overrun: ticket {ticket} meets {}",
            slot.ticket
        );
        slot.ticket = ticket;
        slot.parts.push(part);
        slot.done |= last;
        if st.sending {
            // The active sender re-checks the head after each round.
            return;
        }
        st.sending = true;
        loop {
            scratch.clear();
            loop {
                let head = st.head;
                let slot = &mut st.ring[(head & mask) as usize];
                if slot.ticket != head {
                    break;
                }
                scratch.append(&mut slot.parts);
                if !slot.done {
                    break;
                }
                slot.done = false;
                slot.ticket = EMPTY;
                st.head += 1;
            }
            if scratch.is_empty() {
                st.sending = false;
                return;
            }
            drop(st);
            for part in scratch.drain(..) {
                send(part);
            }
            st = self.order();
        }
    }

    /// The next ticket to be sent (tests).
    #[cfg(test)]
    pub(crate) fn head(&self) -> u64 {
        self.order().head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex as StdMutex};

    fn part(tag: u64, owner: usize) -> TxBatch {
        let mut b = TxBatch::new(4, 1 << 16, false);
        b.owner = owner;
        let room = b.room(8).expect("room");
        room.copy_from_slice(&tag.to_be_bytes());
        b.commit(0, SocketAddr::from(([127, 0, 0, 1], 9)), 8);
        b
    }

    fn tag(b: &TxBatch) -> u64 {
        u64::from_be_bytes(b.data()[..8].try_into().expect("8 bytes"))
    }

    #[test]
    fn out_of_order_completion_is_sent_in_ticket_order() {
        let lane = Lane::new(LaneKind::Tun, -1, 8, 2);
        let sent = StdMutex::new(Vec::new());
        let mut scratch = Vec::new();
        let mut t = Vec::new();
        for _ in 0..4 {
            let mut d = lane.dispatch(false).expect("free");
            t.push(d.ticket());
        }
        assert!(lane.dispatch(false).is_some());
        let send = |b: TxBatch| sent.lock().unwrap().push(tag(&b));
        // Ticket 2 finishes first, then 1 in two parts, then 3, then 0.
        lane.submit(t[2], part(20, 0), true, &mut scratch, send);
        lane.submit(t[1], part(10, 0), false, &mut scratch, send);
        lane.submit(t[1], part(11, 0), true, &mut scratch, send);
        lane.submit(t[3], part(30, 0), true, &mut scratch, send);
        assert!(sent.lock().unwrap().is_empty());
        assert_eq!(lane.head(), 0);
        lane.submit(t[0], part(0, 0), true, &mut scratch, send);
        assert_eq!(*sent.lock().unwrap(), vec![0, 10, 11, 20, 30]);
        assert_eq!(lane.head(), 4);
    }

    #[test]
    fn head_parts_leave_before_the_batch_is_complete() {
        let lane = Lane::new(LaneKind::Tun, -1, 4, 2);
        let sent = StdMutex::new(Vec::new());
        let mut scratch = Vec::new();
        let t0 = lane.dispatch(true).expect("stage").ticket();
        let send = |b: TxBatch| sent.lock().unwrap().push(tag(&b));
        lane.submit(t0, part(1, 0), false, &mut scratch, send);
        assert_eq!(*sent.lock().unwrap(), vec![1]);
        lane.submit(t0, part(2, 0), true, &mut scratch, send);
        assert_eq!(*sent.lock().unwrap(), vec![1, 2]);
        assert_eq!(lane.head(), 1);
    }

    #[test]
    fn concurrent_workers_keep_order() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        const WORKERS: usize = 4;
        const POOL: usize = 3;
        const BATCHES: u64 = 2000;
        let lane = Arc::new(Lane::new(LaneKind::Tun, -1, WORKERS * POOL, POOL));
        let sent = Arc::new(StdMutex::new(Vec::new()));
        // Parts each worker has out (its pool: at most POOL, as in the data plane).
        let held: Arc<Vec<AtomicUsize>> =
            Arc::new((0..WORKERS).map(|_| AtomicUsize::new(0)).collect());
        let threads: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (lane, sent, held) = (Arc::clone(&lane), Arc::clone(&sent), Arc::clone(&held));
                std::thread::spawn(move || {
                    let mut scratch = Vec::new();
                    let mut rng = w as u64 + 1;
                    let take = |held: &[AtomicUsize]| {
                        while held[w].load(Ordering::Acquire) >= POOL {
                            std::thread::yield_now();
                        }
                        held[w].fetch_add(1, Ordering::AcqRel);
                    };
                    loop {
                        take(&held);
                        let ticket = {
                            let mut d = lane.dispatch(true).expect("stage");
                            let t = d.ticket();
                            if t >= BATCHES {
                                return;
                            }
                            t
                        };
                        // Uneven work: some batches take much longer than others.
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        for _ in 0..(rng % 2000) {
                            std::hint::spin_loop();
                        }
                        let parts = 1 + rng % 3;
                        for p in 0..parts {
                            if p > 0 {
                                take(&held);
                            }
                            lane.submit(
                                ticket,
                                part(ticket * 10 + p, w),
                                p + 1 == parts,
                                &mut scratch,
                                |b| {
                                    sent.lock().unwrap().push(tag(&b));
                                    held[b.owner].fetch_sub(1, Ordering::AcqRel);
                                },
                            );
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("worker");
        }
        let sent = sent.lock().unwrap();
        let tickets: Vec<u64> = sent.iter().map(|t| t / 10).collect();
        assert!(tickets.windows(2).all(|w| w[0] <= w[1]), "out of order");
        assert!(sent.windows(2).all(|w| w[0] < w[1]), "parts out of order");
        let mut distinct = tickets.clone();
        distinct.dedup();
        assert_eq!(distinct.len() as u64, BATCHES);
    }
}
