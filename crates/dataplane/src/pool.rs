//! Per-worker pools of send batches. A worker fills a [`TxBatch`] taken from its own pool;
//! whichever worker sends it (the lane's ordered sender, [`crate::lane`]) returns it to the
//! owner's pool. Batches move (their buffers stay put) through a bounded channel: nothing is allocated after
//! start-up, and a worker that runs too far ahead of the lane's send order waits here for
//! its batches to come back (back-pressure instead of unbounded queues).

use crate::batch::TxBatch;
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use netio::Waker;
use std::time::Duration;

/// How often a worker waiting for a batch checks for shutdown.
const SHUTDOWN_POLL: Duration = Duration::from_millis(100);

/// The send batches of one worker.
pub(crate) struct TxPool {
    give: Sender<TxBatch>,
    take: Receiver<TxBatch>,
    owner: usize,
    msgs: usize,
    bytes: usize,
}

impl TxPool {
    /// A pool of `count` batches of `msgs` messages in `bytes` bytes each, owned by worker
    /// `owner`.
    pub(crate) fn new(owner: usize, count: usize, msgs: usize, bytes: usize) -> Self {
        let (give, take) = bounded(count.max(1));
        for _ in 0..count.max(1) {
            let mut b = TxBatch::new(msgs, bytes, true);
            b.owner = owner;
            // The channel has room for exactly `count` batches.
            let _ = give.try_send(b);
        }
        Self {
            give,
            take,
            owner,
            msgs,
            bytes,
        }
    }

    /// An empty batch, waiting for one to come back if all are in flight. At shutdown (the
    /// lane may then never send what it holds) a fresh batch is made instead of waiting.
    pub(crate) fn take(&self, waker: &Waker) -> TxBatch {
        loop {
            match self.take.recv_timeout(SHUTDOWN_POLL) {
                Ok(b) => return b,
                Err(RecvTimeoutError::Timeout) if !waker.is_woken() => continue,
                Err(_) => {
                    let mut b = TxBatch::new(self.msgs, self.bytes, true);
                    b.owner = self.owner;
                    return b;
                }
            }
        }
    }

    /// Returns a sent batch (emptied here). A surplus batch made at shutdown is freed.
    pub(crate) fn give(&self, mut batch: TxBatch) {
        batch.clear();
        let _ = self.give.try_send(batch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_circulate_and_shutdown_never_blocks() {
        let waker = Waker::new().expect("eventfd");
        let pool = TxPool::new(3, 2, 8, 1 << 16);
        let a = pool.take(&waker);
        let b = pool.take(&waker);
        assert_eq!((a.owner, b.owner), (3, 3));
        pool.give(a);
        let c = pool.take(&waker);
        assert!(c.is_empty());
        waker.wake();
        // Both are out: at shutdown a fresh one is made rather than waiting forever.
        let d = pool.take(&waker);
        assert_eq!(d.owner, 3);
        pool.give(b);
        pool.give(c);
        pool.give(d); // surplus: dropped
    }
}
