//! The shell carrying the core's outputs out: directives queued to the nodes' links under
//! the lock, then (without it) the waits for their answers, fed back into the core, and the
//! rekeys handed to the control loop.

use super::{convert, Cluster, Shell, Task};
use crate::core::{Await, Directive, Outgoing};
use crate::link::{Ack, LinkError};
use ike::{ChildSaInfo, TunnelId};
use std::time::Instant;
use tracing::warn;

/// Directives queued under the lock whose answers are awaited after it is released.
#[derive(Default)]
pub(super) struct Queued {
    /// Steering updates: a failure makes the steer node resync.
    pub(super) steers: Vec<(u32, String, Result<Ack, LinkError>)>,
    /// Whole tables a tick resent: (node, name, answer, token).
    pub(super) resync: Vec<(u32, String, Result<Ack, LinkError>, u64)>,
    /// The install in flight.
    pub(super) install: Option<Result<Ack, LinkError>>,
    /// Answers only logged.
    pub(super) logged: Vec<(String, Directive, Result<Ack, LinkError>)>,
    /// Directives to queue once the steering answers came.
    pub(super) after_steers: Vec<Outgoing>,
    /// Tunnels to rekey.
    pub(super) rekeys: Vec<(Vec<TunnelId>, &'static str)>,
    /// CHILD_SAs to create and to delete (self-dispatch).
    pub(super) add_children: Vec<TunnelId>,
    pub(super) delete_children: Vec<(TunnelId, wire::EspSpi)>,
}

impl Cluster {
    /// Carries out the core's outbox under the lock: queues its directives (`install`: the
    /// CHILD_SA an install directive stands for) and returns what to wait for.
    pub(super) fn carry(&self, sh: &mut Shell, install: Option<&ChildSaInfo>) -> Queued {
        let outbox = sh.core.poll_outbox();
        if let Some(steers) = outbox.ike_steers {
            self.ike.set_steers(steers);
        }
        let mut q = Queued {
            after_steers: outbox.after_steers,
            rekeys: outbox.rekeys,
            add_children: outbox.add_children,
            delete_children: outbox.delete_children,
            ..Queued::default()
        };
        for out in outbox.send {
            self.submit(sh, out, install, &mut q);
        }
        q
    }

    /// Queues one directive.
    fn submit(&self, sh: &mut Shell, out: Outgoing, install: Option<&ChildSaInfo>, q: &mut Queued) {
        let name = sh
            .core
            .node(out.node)
            .map_or_else(String::new, |n| n.name.clone());
        let config = self.data_config();
        let Some((op, unsent)) = convert::to_pb(&out.directive, &config, install, &name) else {
            // Nothing expressible to send: no answer will come.
            if let Await::Shares(t) | Await::Resync(t) = out.wait {
                sh.core.handle_share_answer(t, false);
            }
            return;
        };
        if let Await::Shares(t) | Await::Resync(t) = out.wait {
            for tunnel in unsent {
                sh.core.handle_share_unsent(t, tunnel);
            }
        }
        let result = match sh.links.get(&out.node) {
            Some(link) => link.submit(op),
            None => Err(LinkError::Closed),
        };
        match out.wait {
            Await::Nothing => {
                if let Err(e) = result {
                    warn!(node = %name, error = %e, "cannot send a directive");
                }
            }
            Await::Steer => q.steers.push((out.node, name, result)),
            Await::Shares(t) => match result {
                Ok(ack) => {
                    sh.acks.insert(t, ack);
                }
                Err(e) => {
                    warn!(node = %name, error = %e, "cannot send a directive");
                    sh.core.handle_share_answer(t, false);
                }
            },
            Await::Attachments(t) => match result {
                Ok(ack) => {
                    sh.acks.insert(t, ack);
                }
                Err(e) => {
                    warn!(node = %name, error = %e, "cannot send a directive");
                    sh.core.handle_attachments_answer(t, false);
                }
            },
            Await::Dispatch(t) => match result {
                Ok(ack) => {
                    sh.acks.insert(t, ack);
                }
                Err(e) => {
                    warn!(node = %name, error = %e, "cannot send a directive");
                    sh.core.handle_dispatch_answer(t, false, Instant::now());
                }
            },
            Await::Resync(t) => q.resync.push((out.node, name, result, t)),
            Await::Install(_) => q.install = Some(result),
            Await::Logged => q.logged.push((name, out.directive, result)),
        }
    }

    /// Waits (without the lock) for what `q` queued, in order: the steering answers (a steer
    /// node that did not apply an update gets the whole tables again on the next tick), then
    /// the directives that waited for them, then resent tables; then asks for the rekeys.
    /// Returns false if the control loop could not be asked.
    pub(super) fn finish(&self, mut q: Queued) -> bool {
        let deadline = self.deadline();
        let mut failed = Vec::new();
        for (id, name, ack) in q.steers.drain(..) {
            if let Err(e) = ack.and_then(|a| a.wait_until(deadline)) {
                warn!(node = %name, error = %e, "steer node did not apply a steering update; resending its tables");
                failed.push(id);
            }
        }
        if !failed.is_empty() || !q.after_steers.is_empty() {
            let mut sh = self.state();
            for id in failed {
                sh.core.handle_steer_failed(id);
            }
            let mut later = Queued::default();
            for out in std::mem::take(&mut q.after_steers) {
                // Decided when the steering moved: the holder may have gone since.
                if sh.core.node(out.node).is_some_and(|n| n.session_open) {
                    self.submit(&mut sh, out, None, &mut later);
                }
            }
            q.logged.append(&mut later.logged);
        }
        let deadline = self.deadline();
        for (name, d, ack) in q.logged {
            if let Err(e) = ack.and_then(|a| a.wait_until(deadline)) {
                match d {
                    Directive::RemoveChild {
                        tunnel,
                        inbound_spi,
                        ..
                    } => {
                        warn!(node = %name, tunnel = tunnel.0, spi_in = %inbound_spi, error = %e, "data node did not remove a CHILD_SA");
                    }
                    other => {
                        warn!(node = %name, directive = ?other, error = %e, "directive failed")
                    }
                }
            }
        }
        for (id, name, ack, token) in q.resync {
            let result = ack.and_then(|a| a.wait_until(deadline));
            if let Err(e) = &result {
                warn!(node = %name, error = %e, "steer node did not take its whole tables; retrying");
            }
            self.state()
                .core
                .handle_resync_answer(id, token, result.is_ok());
        }
        let mut sent = true;
        for (tunnels, why) in q.rekeys {
            sent &= self.tasks.send(Task::Rekey(tunnels, why)).is_ok();
        }
        if !q.delete_children.is_empty() {
            sent &= self
                .tasks
                .send(Task::DeleteChildren(q.delete_children))
                .is_ok();
        }
        if !q.add_children.is_empty() {
            sent &= self.tasks.send(Task::AddChildren(q.add_children)).is_ok();
        }
        sent
    }

    /// Feeds the answers to shares and attachments that came into the core (call with the
    /// lock held).
    pub(super) fn poll_acks(sh: &mut Shell) {
        let now = Instant::now();
        for token in sh.core.pending_shares(None) {
            let Some(answer) = sh.acks.get(&token).and_then(|a| a.poll_until(now)) else {
                continue;
            };
            sh.acks.remove(&token);
            sh.core.handle_share_answer(token, answer.is_ok());
        }
        for token in sh.core.pending_attachment_acks() {
            if let Some(ok) = Self::answered(sh, token, now, "the attachments") {
                sh.core.handle_attachments_answer(token, ok);
            }
        }
        for token in sh.core.pending_dispatch_acks() {
            if let Some(ok) = Self::answered(sh, token, now, "its self-dispatch table") {
                sh.core.handle_dispatch_answer(token, ok, now);
            }
        }
    }

    /// Whether the answer to the directive sent with `token` (a data node's `what`) came and
    /// applied it; None while it has not come. A refusal is logged.
    fn answered(sh: &mut Shell, token: u64, now: Instant, what: &str) -> Option<bool> {
        let answer = sh.acks.get(&token).and_then(|a| a.poll_until(now))?;
        sh.acks.remove(&token);
        if let Err(e) = &answer {
            warn!(error = %e, "data node did not take {what}");
        }
        Some(answer.is_ok())
    }

    /// Waits until `deadline` (without the lock) for the steer nodes' answers to their
    /// shares, except `skip`'s, then sends the growth they make room for.
    pub(super) fn settle_shares(&self, deadline: Instant, skip: Option<u32>) {
        let waiting: Vec<(u64, Ack)> = {
            let mut sh = self.state();
            sh.core
                .pending_shares(skip)
                .into_iter()
                .filter_map(|t| sh.acks.remove(&t).map(|a| (t, a)))
                .collect()
        };
        let answers: Vec<_> = waiting
            .into_iter()
            .map(|(t, a)| {
                let answer = a.poll_until(deadline);
                (t, a, answer)
            })
            .collect();
        let mut sh = self.state();
        for (t, a, answer) in answers {
            match answer {
                None => {
                    sh.acks.insert(t, a);
                }
                Some(r) => sh.core.handle_share_answer(t, r.is_ok()),
            }
        }
        Self::poll_acks(&mut sh);
        sh.core.handle_shares_settled(Instant::now());
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
    }
}
