//! The control node's handle on one node's session: directives go out on the session's
//! stream with an id; the node's `Ack` with that id completes the waiting caller.
//!
//! [`NodeLink`] is the seam between the cluster logic and gRPC: the manager only submits
//! directives and waits for their answers, so it is tested with in-memory links.

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use rpc::pb;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Why a directive did not take effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The node's session is gone.
    #[error("the node's session is closed")]
    Closed,
    /// No answer within the directive timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The node refused the directive (nothing changed there).
    #[error("refused: {0}")]
    Refused(String),
}

/// The pending answer to one directive.
#[derive(Debug)]
pub struct Ack(Receiver<Result<(), String>>);

impl Ack {
    /// An answer that is already known (tests, and links that apply synchronously).
    pub fn ready(result: Result<(), String>) -> Self {
        let (tx, rx) = bounded(1);
        let _ = tx.send(result);
        Self(rx)
    }

    /// An answer to be given later through the sender (tests: a node that answers late).
    #[cfg(test)]
    pub(crate) fn later() -> (Sender<Result<(), String>>, Self) {
        let (tx, rx) = bounded(1);
        (tx, Self(rx))
    }

    /// Waits until `deadline` for the node's answer.
    pub fn wait_until(self, deadline: Instant) -> Result<(), LinkError> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.0.recv_timeout(left) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(LinkError::Refused(reason)),
            Err(RecvTimeoutError::Timeout) => Err(LinkError::Timeout(left)),
            Err(RecvTimeoutError::Disconnected) => Err(LinkError::Closed),
        }
    }
}

impl Ack {
    /// The node's answer if it comes by `deadline` (`None`: not yet; the answer can still be
    /// polled later). Taken once: a later poll after an answer sees [`LinkError::Closed`].
    pub fn poll_until(&self, deadline: Instant) -> Option<Result<(), LinkError>> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.0.recv_timeout(left) {
            Ok(Ok(())) => Some(Ok(())),
            Ok(Err(reason)) => Some(Err(LinkError::Refused(reason))),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Err(LinkError::Closed)),
        }
    }
}

/// Sends directives to one node.
pub trait NodeLink: Send + Sync {
    /// Queues `op` for the node; the returned [`Ack`] completes with its answer.
    fn submit(&self, op: pb::directive::Op) -> Result<Ack, LinkError>;

    /// True once the session behind the link is gone.
    fn is_closed(&self) -> bool;
}

/// Where a session's outgoing messages go (the gRPC response stream).
pub type Outgoing = tokio::sync::mpsc::UnboundedSender<Result<pb::ControlMessage, tonic::Status>>;

/// A node's gRPC session seen from control: directives are numbered, answers matched by id.
#[derive(Debug)]
pub struct SessionLink {
    out: Outgoing,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, Sender<Result<(), String>>>>,
}

impl SessionLink {
    /// A link writing to `out`.
    pub fn new(out: Outgoing) -> Self {
        Self {
            out,
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// Sends a message that needs no answer (Welcome).
    pub fn send_message(&self, msg: pb::control_message::Msg) -> Result<(), LinkError> {
        self.out
            .send(Ok(pb::ControlMessage { msg: Some(msg) }))
            .map_err(|_| LinkError::Closed)
    }

    /// The node answered directive `id`. Unknown ids (answers after a timeout) are ignored.
    pub fn complete(&self, ack: pb::Ack) {
        let waiter = self.pending().remove(&ack.id);
        if let Some(tx) = waiter {
            let result = if ack.error.is_empty() {
                Ok(())
            } else {
                Err(ack.error)
            };
            let _ = tx.send(result);
        }
    }

    /// Ends the session: every waiter sees [`LinkError::Closed`], and the node's stream ends
    /// with `status`.
    pub fn close(&self, status: Option<tonic::Status>) {
        self.pending().clear();
        if let Some(status) = status {
            let _ = self.out.send(Err(status));
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Sender<Result<(), String>>>> {
        // A panicking holder cannot leave the map inconsistent (single inserts and removes).
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl NodeLink for SessionLink {
    fn submit(&self, op: pb::directive::Op) -> Result<Ack, LinkError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        self.pending().insert(id, tx);
        let directive = pb::Directive { id, op: Some(op) };
        if self
            .send_message(pb::control_message::Msg::Directive(directive))
            .is_err()
        {
            self.pending().remove(&id);
            return Err(LinkError::Closed);
        }
        Ok(Ack(rx))
    }

    fn is_closed(&self) -> bool {
        self.out.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op() -> pb::directive::Op {
        pb::directive::Op::RemoveSpi(pb::RemoveSpi { spi: 0x1234 })
    }

    #[test]
    fn answers_are_matched_by_id() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let link = SessionLink::new(tx);
        let a = link.submit(op()).unwrap();
        let b = link.submit(op()).unwrap();
        let ids: Vec<u64> = (0..2)
            .map(|_| match rx.try_recv().unwrap().unwrap().msg {
                Some(pb::control_message::Msg::Directive(d)) => d.id,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        link.complete(pb::Ack {
            id: ids[1],
            error: "no such SA".into(),
        });
        link.complete(pb::Ack {
            id: ids[0],
            error: String::new(),
        });
        let deadline = Instant::now() + Duration::from_secs(1);
        assert_eq!(a.wait_until(deadline), Ok(()));
        assert_eq!(
            b.wait_until(deadline),
            Err(LinkError::Refused("no such SA".into()))
        );
    }

    #[test]
    fn closing_fails_waiters_and_later_submits() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let link = SessionLink::new(tx);
        let a = link.submit(op()).unwrap();
        link.close(None);
        assert_eq!(
            a.wait_until(Instant::now() + Duration::from_secs(1)),
            Err(LinkError::Closed)
        );
        drop(rx);
        assert!(link.is_closed());
        assert!(matches!(link.submit(op()), Err(LinkError::Closed)));
    }

    #[test]
    fn silence_is_a_timeout() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let link = SessionLink::new(tx);
        let a = link.submit(op()).unwrap();
        let r = a.wait_until(Instant::now() + Duration::from_millis(20));
        assert!(matches!(r, Err(LinkError::Timeout(_))));
    }
}
