//! A pool of pre-built datagrams for one run, laid out as UDP GSO trains: consecutive packets
//! of equal length to the same destination are one train, sent with one `UDP_SEGMENT` control
//! message. Building it before the run keeps the load generator's per-packet work (and
//! CPU, which it shares with the gateway under test) to a memory read and a system call per
//! train.

use std::net::SocketAddr;

/// Most segments in one GSO train (the kernel's `UDP_MAX_SEGMENTS` is at least 64).
pub(crate) const MAX_SEGMENTS: usize = 64;
/// Most bytes in one GSO train (a UDP datagram, headers included, must stay below 64 KiB).
pub(crate) const MAX_TRAIN_BYTES: usize = 60_000;

/// Consecutive packets of equal length to one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Train {
    /// Offset of the first packet in the pool's buffer.
    pub(crate) offset: usize,
    /// Length of each packet (the GSO segment size).
    pub(crate) seg: usize,
    /// Number of packets.
    pub(crate) count: usize,
    /// Index of the first packet in the run.
    pub(crate) first: u32,
    /// Destination.
    pub(crate) dst: SocketAddr,
}

impl Train {
    /// Bytes of the whole train.
    pub(crate) fn len(&self) -> usize {
        self.seg * self.count
    }
}

/// One packet as the builder wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Built {
    /// Bytes written at the start of the slice the builder got.
    pub(crate) len: usize,
    /// Where it goes.
    pub(crate) dst: SocketAddr,
}

/// The pre-built datagrams of a run.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    buf: Vec<u8>,
    used: usize,
    trains: Vec<Train>,
    packets: u32,
}

impl Pool {
    /// A pool that may hold up to `budget` bytes (allocated lazily by the OS: pages are only
    /// touched when written).
    pub(crate) fn with_budget(budget: usize) -> Pool {
        Pool {
            buf: vec![0; budget],
            ..Pool::default()
        }
    }

    /// Byte capacity.
    pub(crate) fn budget(&self) -> usize {
        self.buf.len()
    }

    /// Builds `count` packets (fewer if the budget runs out first, leaving room for
    /// `max_len`-byte packets) with `build(index, slot)`, which writes packet `index` at the
    /// start of `slot` and says how long it is and where it goes. Trains hold at most
    /// `max_train` packets. Returns the number of packets built. The previous content is
    /// discarded.
    pub(crate) fn build<E>(
        &mut self,
        count: u32,
        max_len: usize,
        max_train: usize,
        mut build: impl FnMut(u32, &mut [u8]) -> Result<Built, E>,
    ) -> Result<u32, E> {
        self.used = 0;
        self.trains.clear();
        self.packets = 0;
        let max_train = max_train.clamp(1, MAX_SEGMENTS);
        for index in 0..count {
            if self.buf.len() - self.used < max_len {
                break;
            }
            let slot = &mut self.buf[self.used..];
            let b = build(index, slot)?;
            let extend = self.trains.last().is_some_and(|t| {
                t.seg == b.len
                    && t.dst == b.dst
                    && t.count < max_train
                    && t.len() + b.len <= MAX_TRAIN_BYTES
            });
            if extend {
                if let Some(t) = self.trains.last_mut() {
                    t.count += 1;
                }
            } else {
                self.trains.push(Train {
                    offset: self.used,
                    seg: b.len,
                    count: 1,
                    first: index,
                    dst: b.dst,
                });
            }
            self.used += b.len;
            self.packets += 1;
        }
        Ok(self.packets)
    }

    /// The trains, in send order.
    pub(crate) fn trains(&self) -> &[Train] {
        &self.trains
    }

    /// The bytes of a train.
    pub(crate) fn bytes(&self, train: &Train) -> &[u8] {
        &self.buf[train.offset..train.offset + train.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn groups_equal_packets_into_trains() {
        let mut pool = Pool::with_budget(1 << 20);
        let sizes = |i: u32| if (i / 10).is_multiple_of(2) { 100 } else { 200 };
        let n = pool
            .build::<()>(40, 300, 64, |i, slot| {
                let len = sizes(i);
                slot[..len].fill(i as u8);
                Ok(Built { len, dst: addr(1) })
            })
            .expect("builds");
        assert_eq!(n, 40);
        let trains = pool.trains();
        assert_eq!(trains.len(), 4);
        assert_eq!(
            trains
                .iter()
                .map(|t| (t.seg, t.count, t.first))
                .collect::<Vec<_>>(),
            vec![(100, 10, 0), (200, 10, 10), (100, 10, 20), (200, 10, 30)]
        );
        assert_eq!(pool.bytes(&trains[1])[0], 10);
        assert_eq!(pool.bytes(&trains[1]).len(), 2000);
    }

    #[test]
    fn respects_train_limits_destinations_and_budget() {
        let mut pool = Pool::with_budget(10_000);
        let n = pool
            .build::<()>(1000, 100, 8, |i, _| {
                Ok(Built {
                    len: 100,
                    dst: addr(if i < 20 { 1 } else { 2 }),
                })
            })
            .expect("builds");
        // 10_000 bytes hold 100 packets of 100 bytes.
        assert_eq!(n, 100);
        let counts: Vec<usize> = pool.trains().iter().map(|t| t.count).collect();
        assert_eq!(&counts[..3], &[8, 8, 4]);
        assert!(counts.iter().all(|&c| c <= 8));
        assert_eq!(pool.trains()[3].dst, addr(2));
        // Large packets: the byte limit of a train applies.
        let mut pool = Pool::with_budget(1 << 20);
        pool.build::<()>(200, 9000, 64, |_, _| {
            Ok(Built {
                len: 8000,
                dst: addr(1),
            })
        })
        .expect("builds");
        assert!(pool.trains().iter().all(|t| t.len() <= MAX_TRAIN_BYTES));
        assert_eq!(pool.trains()[0].count, 7);
        // A builder error stops the build.
        assert_eq!(pool.build(10, 100, 8, |_, _| Err("full")), Err("full"));
    }
}
