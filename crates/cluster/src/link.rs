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

/// How a node took a directive it did not refuse.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Applied.
    Applied,
    /// Kept, to be applied later: a data node fetching the route snapshot keeps the route
    /// changes it receives meanwhile (`Ack.kept`).
    Kept,
    /// Applied, with the answer to a `filter_map` directive (`Ack.filter_map`).
    FilterMap(Box<pb::FilterMapResult>),
}

/// A node's answer as it travels to the waiter.
type Answered = Result<Answer, String>;

/// The pending answer to one directive.
#[derive(Debug)]
pub struct Ack(Receiver<Answered>);

impl Ack {
    /// An answer that is already known (tests, and links that apply synchronously).
    pub fn ready(result: Result<(), String>) -> Self {
        Self::answered(result.map(|()| Answer::Applied))
    }

    /// An answer that is already known, kept or applied.
    pub fn answered(result: Result<Answer, String>) -> Self {
        let (tx, rx) = bounded(1);
        let _ = tx.send(result);
        Self(rx)
    }

    /// An answer to be given later through the sender (tests: a node that answers late).
    #[cfg(test)]
    pub(crate) fn later() -> (Sender<Result<Answer, String>>, Self) {
        let (tx, rx) = bounded(1);
        (tx, Self(rx))
    }

    /// Waits until `deadline` for the node's answer (a directive kept counts as taken).
    pub fn wait_until(self, deadline: Instant) -> Result<(), LinkError> {
        self.wait_answer_until(deadline).map(drop)
    }

    /// Waits until `deadline` for the node's answer, applied or kept.
    pub fn wait_answer_until(self, deadline: Instant) -> Result<Answer, LinkError> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.0.recv_timeout(left) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(reason)) => Err(LinkError::Refused(reason)),
            Err(RecvTimeoutError::Timeout) => Err(LinkError::Timeout(left)),
            Err(RecvTimeoutError::Disconnected) => Err(LinkError::Closed),
        }
    }

    /// Calls `done` with the node's answer (or the timeout at `deadline`) from a thread of
    /// its own, so that the caller does not wait: a node's session reads answers only once
    /// its registration returned. An error starting the thread is given to `done` at once,
    /// as [`LinkError::Closed`] would be (nothing is known of the answer).
    pub fn on_answer<F>(self, deadline: Instant, done: F)
    where
        F: FnOnce(Result<Answer, LinkError>) + Send + 'static,
    {
        // The closure runs exactly once: on the thread, or here if it cannot start.
        let slot = std::sync::Arc::new(Mutex::new(Some(done)));
        let on_thread = std::sync::Arc::clone(&slot);
        let started = std::thread::Builder::new()
            .name("protego-ack-wait".into())
            .spawn(move || {
                let answer = self.wait_answer_until(deadline);
                let done = on_thread.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(done) = done {
                    done(answer);
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start a thread to wait for a node's answer");
            let done = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(done) = done {
                done(Err(LinkError::Closed));
            }
        }
    }
}

/// Waits until `deadline` for the answers to `acks`, handing each to `each(index, answer)` as
/// it arrives (in the order they arrive, not the order given): one node's refusal is acted on
/// at once, not after a slower node's answer. Those without an answer by then are handed a
/// timeout.
pub fn each_answer(
    acks: &[Ack],
    deadline: Instant,
    mut each: impl FnMut(usize, Result<Answer, LinkError>),
) {
    let waited = deadline.saturating_duration_since(Instant::now());
    let mut select = crossbeam_channel::Select::new();
    for ack in acks {
        select.recv(&ack.0);
    }
    let mut answered = vec![false; acks.len()];
    let mut pending = acks.len();
    while pending > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(op) = select.select_timeout(left) else {
            break;
        };
        let i = op.index();
        let answer = match op.recv(&acks[i].0) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(reason)) => Err(LinkError::Refused(reason)),
            Err(_) => Err(LinkError::Closed),
        };
        select.remove(i);
        answered[i] = true;
        pending -= 1;
        each(i, answer);
    }
    for (i, ack) in acks.iter().enumerate().filter(|(i, _)| !answered[*i]) {
        // An answer may have come between the last wait and now: still taken.
        let answer = match ack.0.try_recv() {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(reason)) => Err(LinkError::Refused(reason)),
            Err(crossbeam_channel::TryRecvError::Disconnected) => Err(LinkError::Closed),
            Err(crossbeam_channel::TryRecvError::Empty) => Err(LinkError::Timeout(waited)),
        };
        each(i, answer);
    }
}

impl Ack {
    /// The node's answer if it comes by `deadline` (`None`: not yet; the answer can still be
    /// polled later). Taken once: a later poll after an answer sees [`LinkError::Closed`].
    pub fn poll_until(&self, deadline: Instant) -> Option<Result<(), LinkError>> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.0.recv_timeout(left) {
            Ok(Ok(_)) => Some(Ok(())),
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
    pending: Mutex<HashMap<u64, Sender<Answered>>>,
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
            let result = if !ack.error.is_empty() {
                Err(ack.error)
            } else if ack.kept {
                Ok(Answer::Kept)
            } else if let Some(m) = ack.filter_map {
                Ok(Answer::FilterMap(Box::new(m)))
            } else {
                Ok(Answer::Applied)
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

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Sender<Answered>>> {
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
            ..pb::Ack::default()
        });
        link.complete(pb::Ack {
            id: ids[0],
            ..pb::Ack::default()
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
    fn a_kept_directive_is_told_from_an_applied_one() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let link = SessionLink::new(tx);
        let a = link.submit(op()).unwrap();
        let id = match rx.try_recv().unwrap().unwrap().msg {
            Some(pb::control_message::Msg::Directive(d)) => d.id,
            other => panic!("unexpected {other:?}"),
        };
        link.complete(pb::Ack {
            id,
            kept: true,
            ..pb::Ack::default()
        });
        let deadline = Instant::now() + Duration::from_secs(1);
        assert_eq!(a.wait_answer_until(deadline), Ok(Answer::Kept));
    }

    #[test]
    fn an_answer_is_handed_on_without_waiting() {
        let (tx, ack) = Ack::later();
        let (done_tx, done) = bounded(1);
        ack.on_answer(Instant::now() + Duration::from_secs(5), move |a| {
            let _ = done_tx.send(a);
        });
        assert!(done.try_recv().is_err(), "called before the answer");
        tx.send(Ok(Answer::Applied)).unwrap();
        assert_eq!(
            done.recv_timeout(Duration::from_secs(5)),
            Ok(Ok(Answer::Applied))
        );
    }

    /// A refusal is handed on as soon as it comes, while another node's answer is still
    /// awaited; a late answer, an answer from a closed session and silence each get theirs.
    #[test]
    fn each_answer_is_handed_on_as_it_comes() {
        let (refuse_tx, refused) = Ack::later();
        let (slow_tx, slow) = Ack::later();
        let (closed_tx, closed) = Ack::later();
        let (_silent_tx, silent) = Ack::later();
        drop(closed_tx);
        refuse_tx.send(Err("gap".into())).unwrap();
        let (seen_tx, seen) = bounded(8);
        let waiter = std::thread::spawn(move || {
            each_answer(
                &[slow, refused, closed, silent],
                Instant::now() + Duration::from_secs(2),
                |i, a| {
                    let _ = seen_tx.send((i, a));
                },
            );
        });
        // The refusal and the closed session come first, the slow node has not answered.
        let mut first: Vec<usize> = (0..2)
            .map(|_| seen.recv_timeout(Duration::from_secs(5)).unwrap().0)
            .collect();
        first.sort_unstable();
        assert_eq!(first, vec![1, 2]);
        slow_tx.send(Ok(Answer::Applied)).unwrap();
        assert_eq!(
            seen.recv_timeout(Duration::from_secs(5)),
            Ok((0, Ok(Answer::Applied)))
        );
        assert!(matches!(
            seen.recv_timeout(Duration::from_secs(5)),
            Ok((3, Err(LinkError::Timeout(_))))
        ));
        waiter.join().unwrap();
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
