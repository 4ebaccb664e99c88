//! A VNet's neighbour cache: VM address -> MAC, resolved by ARP (RFC 826) or IPv6 neighbour
//! discovery (RFC 4861 §7.2) over VXLAN, and learned from frames the hosts send. Packets for an
//! unresolved address wait in a short queue while requests are retried (RFC 1122 §2.3.2.2 asks
//! to keep at least one); entries go stale, are re-probed while used, and expire.
//!
//! Pure state: the caller passes the time and sends the requests the cache asks for.

use crate::stats::DropReason;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// A MAC address.
pub(crate) type Mac = [u8; 6];

/// After this long without confirmation an entry in use is re-probed.
pub(crate) const REACHABLE: Duration = Duration::from_secs(30);
/// Minimum spacing of re-probes of a stale entry.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// Unconfirmed for this long, an entry is forgotten.
pub(crate) const EXPIRE: Duration = Duration::from_secs(120);
/// Spacing of requests for an unresolved address.
pub(crate) const RETRY: Duration = Duration::from_secs(1);
/// Requests sent before giving up on an address.
pub(crate) const MAX_TRIES: u8 = 3;
/// Packets queued per unresolved address. Enough for a burst: a data node that joins a
/// self-dispatch ring, or takes a tunnel over, gets every VM's traffic at once, with its cache
/// empty, and the steer node's hold (`crates/steernode/src/hold.rs`) may release tens of
/// milliseconds of it in one go; eight (the former value) lost pings at 500 Hz while the first
/// answers were on their way. Linux holds up to `unres_qlen_bytes` (about 200 KiB) per
/// address.
pub(crate) const QUEUE_LEN: usize = 64;
/// Bytes queued per unresolved address.
pub(crate) const QUEUE_BYTES: usize = 64 * 1024;
/// Bytes queued for all of a VNet's unresolved addresses together: what a tenant sending to
/// many addresses that never answer can make a VNet hold (and [`MAX_INCOMPLETE`] of them).
pub(crate) const MAX_QUEUED_BYTES: usize = 4 * 1024 * 1024;
/// Entries per VNet.
pub(crate) const MAX_ENTRIES: usize = 65536;
/// Unresolved entries per VNet.
pub(crate) const MAX_INCOMPLETE: usize = 1024;

#[derive(Debug)]
enum Entry {
    Reachable {
        mac: Mac,
        confirmed: Instant,
        probed: Option<Instant>,
    },
    Incomplete {
        queue: VecDeque<Vec<u8>>,
        tries: u8,
        last_sent: Instant,
    },
}

/// The bytes of the packets waiting in `queue`.
fn queued_bytes(queue: &VecDeque<Vec<u8>>) -> usize {
    queue.iter().map(Vec::len).sum()
}

/// What to do with a packet for an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// Send it to this MAC; with `probe`, also send a request to re-confirm the entry.
    Mac {
        /// The neighbour's MAC.
        mac: Mac,
        /// Re-probe the (stale) entry.
        probe: bool,
    },
    /// The packet was queued; with `request`, send the first resolution request now.
    Queued {
        /// Send a request now.
        request: bool,
    },
    /// The packet was dropped.
    Dropped(DropReason),
    /// The packet was dropped (the VNet's queue budget is spent), but the address is new:
    /// send the first resolution request now, so that the next packets find it resolved.
    DroppedAsking(DropReason),
}

/// The neighbour cache of one VNet.
#[derive(Debug, Default)]
pub(crate) struct NeighCache {
    entries: HashMap<IpAddr, Entry>,
    incomplete: usize,
    /// Bytes queued in all incomplete entries.
    queued: usize,
}

impl NeighCache {
    /// Looks `ip` up for a packet; if it is not resolved, queues a copy of `packet` once
    /// `admit` allows it (an inbound ESP packet is accepted by the replay window there, as it
    /// cannot be left out of a send batch once it waits here; its error drops the packet).
    pub(crate) fn resolve(
        &mut self,
        ip: IpAddr,
        now: Instant,
        packet: &[u8],
        admit: impl FnOnce() -> Result<(), DropReason>,
    ) -> Resolution {
        match self.entries.get_mut(&ip) {
            Some(Entry::Reachable {
                mac,
                confirmed,
                probed,
            }) => {
                let stale = now.saturating_duration_since(*confirmed) > REACHABLE;
                let probe = stale
                    && probed.is_none_or(|p| now.saturating_duration_since(p) >= PROBE_INTERVAL);
                if probe {
                    *probed = Some(now);
                }
                Resolution::Mac { mac: *mac, probe }
            }
            Some(Entry::Incomplete { queue, .. }) => {
                if queue.len() >= QUEUE_LEN
                    || queued_bytes(queue) + packet.len() > QUEUE_BYTES
                    || self.queued + packet.len() > MAX_QUEUED_BYTES
                {
                    Resolution::Dropped(DropReason::NeighUnresolved)
                } else if let Err(reason) = admit() {
                    Resolution::Dropped(reason)
                } else {
                    queue.push_back(packet.to_vec());
                    self.queued += packet.len();
                    Resolution::Queued { request: false }
                }
            }
            None => {
                if self.entries.len() >= MAX_ENTRIES || self.incomplete >= MAX_INCOMPLETE {
                    return Resolution::Dropped(DropReason::NeighTableFull);
                }
                let fits =
                    packet.len() <= QUEUE_BYTES && self.queued + packet.len() <= MAX_QUEUED_BYTES;
                let mut queue = VecDeque::new();
                if fits {
                    if let Err(reason) = admit() {
                        return Resolution::Dropped(reason);
                    }
                    queue.push_back(packet.to_vec());
                    self.queued += packet.len();
                }
                self.entries.insert(
                    ip,
                    Entry::Incomplete {
                        queue,
                        tries: 1,
                        last_sent: now,
                    },
                );
                self.incomplete += 1;
                if fits {
                    Resolution::Queued { request: true }
                } else {
                    Resolution::DroppedAsking(DropReason::NeighUnresolved)
                }
            }
        }
    }

    /// Records that `ip` is at `mac` (an ARP/NA answer or a frame from it). Creates the entry
    /// if `create` (bounded by the table size). Returns the packets that waited for it.
    pub(crate) fn learn(
        &mut self,
        ip: IpAddr,
        mac: Mac,
        now: Instant,
        create: bool,
    ) -> Option<VecDeque<Vec<u8>>> {
        match self.entries.get_mut(&ip) {
            Some(e @ Entry::Incomplete { .. }) => {
                let old = std::mem::replace(
                    e,
                    Entry::Reachable {
                        mac,
                        confirmed: now,
                        probed: None,
                    },
                );
                self.incomplete -= 1;
                match old {
                    Entry::Incomplete { queue, .. } => {
                        self.queued -= queued_bytes(&queue);
                        Some(queue)
                    }
                    Entry::Reachable { .. } => None,
                }
            }
            Some(Entry::Reachable {
                mac: m,
                confirmed,
                probed,
            }) => {
                *m = mac;
                *confirmed = now;
                *probed = None;
                None
            }
            None => {
                if create && self.entries.len() < MAX_ENTRIES {
                    self.entries.insert(
                        ip,
                        Entry::Reachable {
                            mac,
                            confirmed: now,
                            probed: None,
                        },
                    );
                }
                None
            }
        }
    }

    /// Housekeeping: pushes onto `requests` the addresses to ask for again, forgets expired
    /// entries; returns how many queued packets were dropped because resolution failed.
    pub(crate) fn tick(&mut self, now: Instant, requests: &mut Vec<IpAddr>) -> u64 {
        let mut dropped = 0u64;
        let mut gave_up = 0usize;
        let mut freed = 0usize;
        self.entries.retain(|ip, e| match e {
            Entry::Reachable { confirmed, .. } => {
                now.saturating_duration_since(*confirmed) <= EXPIRE
            }
            Entry::Incomplete {
                queue,
                tries,
                last_sent,
            } => {
                if now.saturating_duration_since(*last_sent) < RETRY {
                    return true;
                }
                if *tries < MAX_TRIES {
                    *tries += 1;
                    *last_sent = now;
                    requests.push(*ip);
                    true
                } else {
                    dropped += queue.len() as u64;
                    gave_up += 1;
                    freed += queued_bytes(queue);
                    false
                }
            }
        });
        self.incomplete -= gave_up;
        self.queued -= freed;
        dropped
    }

    /// The MAC of `ip` if resolved.
    #[cfg(test)]
    pub(crate) fn mac(&self, ip: IpAddr) -> Option<Mac> {
        match self.entries.get(&ip) {
            Some(Entry::Reachable { mac, .. }) => Some(*mac),
            _ => None,
        }
    }
}

/// How long a thread trusts its memo of a neighbour cache answer.
pub(crate) const MEMO_FRESH: Duration = Duration::from_secs(1);

const MEMO_SLOTS: usize = 256;

#[derive(Debug, Clone, Copy)]
struct MemoSlot {
    vnet: usize,
    ip: IpAddr,
    mac: Mac,
    at: Instant,
}

/// A thread's direct-mapped memo of recent neighbour cache answers (VNet, address -> MAC), so
/// that the per-packet path takes a VNet's cache lock about once per second per address
/// rather than per packet. A MAC change reaches a thread within [`MEMO_FRESH`].
#[derive(Debug)]
pub(crate) struct NeighMemo {
    slots: Box<[Option<MemoSlot>]>,
}

impl Default for NeighMemo {
    fn default() -> Self {
        Self {
            slots: vec![None; MEMO_SLOTS].into_boxed_slice(),
        }
    }
}

impl NeighMemo {
    fn index(vnet: usize, ip: IpAddr) -> usize {
        let v = match ip {
            IpAddr::V4(a) => u64::from(u32::from(a)),
            IpAddr::V6(a) => {
                let x = u128::from(a);
                (x as u64) ^ ((x >> 64) as u64)
            }
        };
        let h = (v ^ (vnet as u64).rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 56) as usize % MEMO_SLOTS
    }

    /// The memoised MAC of `ip` in `vnet`, if fresh.
    pub(crate) fn get(&self, vnet: usize, ip: IpAddr, now: Instant) -> Option<Mac> {
        match self.slots[Self::index(vnet, ip)] {
            Some(s)
                if s.vnet == vnet
                    && s.ip == ip
                    && now.saturating_duration_since(s.at) < MEMO_FRESH =>
            {
                Some(s.mac)
            }
            _ => None,
        }
    }

    /// Remembers an answer.
    pub(crate) fn put(&mut self, vnet: usize, ip: IpAddr, mac: Mac, now: Instant) {
        self.slots[Self::index(vnet, ip)] = Some(MemoSlot {
            vnet,
            ip,
            mac,
            at: now,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Result<(), DropReason> {
        Ok(())
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 5));
    const MAC: Mac = [2, 0, 0, 0, 0, 5];

    #[test]
    fn queue_until_resolved_then_release() {
        let t0 = Instant::now();
        let mut c = NeighCache::default();
        assert_eq!(
            c.resolve(IP, t0, b"p1", ok),
            Resolution::Queued { request: true }
        );
        assert_eq!(
            c.resolve(IP, t0, b"p2", ok),
            Resolution::Queued { request: false }
        );
        let q = c.learn(IP, MAC, t0, false).expect("queued packets");
        assert_eq!(q, VecDeque::from(vec![b"p1".to_vec(), b"p2".to_vec()]));
        assert_eq!(
            c.resolve(IP, t0, b"p3", ok),
            Resolution::Mac {
                mac: MAC,
                probe: false
            }
        );
        assert_eq!(c.incomplete, 0);
    }

    #[test]
    fn queue_is_bounded() {
        let t0 = Instant::now();
        let mut c = NeighCache::default();
        for _ in 0..QUEUE_LEN {
            assert!(matches!(
                c.resolve(IP, t0, b"p", ok),
                Resolution::Queued { .. }
            ));
        }
        assert_eq!(
            c.resolve(IP, t0, b"p", ok),
            Resolution::Dropped(DropReason::NeighUnresolved)
        );
    }

    #[test]
    fn queued_bytes_are_bounded_per_address_and_per_vnet_and_given_back() {
        let t0 = Instant::now();
        let mut c = NeighCache::default();
        let big = vec![0u8; 9000];
        // Per address: 64 KiB (seven jumbo packets), whatever the count.
        for i in 0..QUEUE_BYTES / big.len() {
            assert!(
                matches!(c.resolve(IP, t0, &big, ok), Resolution::Queued { .. }),
                "{i}"
            );
        }
        assert_eq!(
            c.resolve(IP, t0, &big, ok),
            Resolution::Dropped(DropReason::NeighUnresolved)
        );
        assert_eq!(c.queued, QUEUE_BYTES / big.len() * big.len());
        // Resolved: its bytes are given back.
        let released = c.learn(IP, MAC, t0, false).expect("the queue");
        assert_eq!(released.len(), QUEUE_BYTES / big.len());
        assert_eq!(c.queued, 0);
        // Per VNet: 4 MiB over many addresses; then even a new address's first packet waits
        // nowhere (but a request goes out for it).
        let addr = |i: u32| IpAddr::V4(std::net::Ipv4Addr::from(0x0a01_0000 + i));
        let mut i = 0;
        while c.queued + big.len() <= MAX_QUEUED_BYTES {
            assert!(matches!(
                c.resolve(addr(i / 4), t0, &big, ok),
                Resolution::Queued { .. }
            ));
            i += 1;
        }
        let next = addr(i / 4 + 1);
        assert_eq!(
            c.resolve(next, t0, &big, ok),
            Resolution::DroppedAsking(DropReason::NeighUnresolved),
            "dropped, but asked for: the next packets find it resolved"
        );
        assert_eq!(c.learn(next, MAC, t0, false), Some(VecDeque::new()));
        assert_eq!(c.mac(next), Some(MAC));
        // Those that never answer give their bytes back when given up.
        let mut req = Vec::new();
        for k in 1..=3 {
            c.tick(t0 + RETRY * k, &mut req);
        }
        assert_eq!((c.queued, c.incomplete), (0, 0));
        let other = addr(i / 4 + 2);
        assert!(matches!(
            c.resolve(other, t0 + RETRY * 3, &big, ok),
            Resolution::Queued { request: true }
        ));
    }

    #[test]
    fn retries_then_gives_up_and_counts_the_queue() {
        let t0 = Instant::now();
        let mut c = NeighCache::default();
        c.resolve(IP, t0, b"p1", ok);
        c.resolve(IP, t0, b"p2", ok);
        let mut req = Vec::new();
        assert_eq!(c.tick(t0 + Duration::from_millis(500), &mut req), 0);
        assert!(req.is_empty());
        assert_eq!(c.tick(t0 + RETRY, &mut req), 0);
        assert_eq!(c.tick(t0 + RETRY * 2, &mut req), 0);
        assert_eq!(req, vec![IP, IP]);
        assert_eq!(c.tick(t0 + RETRY * 3, &mut req), 2);
        assert_eq!(c.incomplete, 0);
        assert_eq!(
            c.resolve(IP, t0 + RETRY * 3, b"p", ok),
            Resolution::Queued { request: true }
        );
    }

    #[test]
    fn stale_entries_are_probed_while_used_and_expire() {
        let t0 = Instant::now();
        let mut c = NeighCache::default();
        c.learn(IP, MAC, t0, true);
        let t1 = t0 + REACHABLE + Duration::from_secs(1);
        assert_eq!(
            c.resolve(IP, t1, b"", ok),
            Resolution::Mac {
                mac: MAC,
                probe: true
            }
        );
        assert_eq!(
            c.resolve(IP, t1, b"", ok),
            Resolution::Mac {
                mac: MAC,
                probe: false
            }
        );
        assert_eq!(
            c.resolve(IP, t1 + PROBE_INTERVAL, b"", ok),
            Resolution::Mac {
                mac: MAC,
                probe: true
            }
        );
        // A new MAC (VM replaced) is taken over.
        c.learn(IP, [2, 0, 0, 0, 0, 6], t1, false);
        assert_eq!(c.mac(IP), Some([2, 0, 0, 0, 0, 6]));
        let mut req = Vec::new();
        c.tick(t1 + EXPIRE + Duration::from_secs(1), &mut req);
        assert_eq!(c.mac(IP), None);
    }

    #[test]
    fn memo_is_fresh_for_a_second_and_keyed_by_vnet() {
        let t0 = Instant::now();
        let mut m = NeighMemo::default();
        assert_eq!(m.get(0, IP, t0), None);
        m.put(0, IP, MAC, t0);
        assert_eq!(m.get(0, IP, t0 + Duration::from_millis(999)), Some(MAC));
        assert_eq!(m.get(1, IP, t0), None);
        assert_eq!(m.get(0, IP, t0 + MEMO_FRESH), None);
    }

    #[test]
    fn learning_without_create_does_not_add() {
        let t0 = Instant::now();
        let mut c = NeighCache::default();
        assert!(c.learn(IP, MAC, t0, false).is_none());
        assert_eq!(c.mac(IP), None);
    }
}
