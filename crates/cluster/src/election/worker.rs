//! The election's thread ([`Worker`]): one session with etcd at a time (lease, campaign, watch,
//! keep-alives), as the [module docs](super) describe.

use super::*;

impl Worker {
    /// Runs sessions until stopped; the error is a failed resign's.
    pub(super) async fn run(mut self) -> Result<(), String> {
        // Sessions that failed in a row, to pause once every endpoint has.
        let mut failures = 0usize;
        loop {
            let (established, failure) = self.session().await;
            if established {
                failures = 0;
            }
            match failure {
                Failure::Interrupted(Interrupt::Stop(Stop::Abandon)) => return Ok(()),
                Failure::Interrupted(Interrupt::Stop(Stop::Resign)) => return self.resign().await,
                Failure::Interrupted(Interrupt::Freeze) => return self.frozen().await,
                Failure::LeaseGone => {
                    // A new lease is granted at once; only a session that fails so before it
                    // gets going counts (not to spin).
                    self.lost_lease();
                    if !established {
                        failures += 1;
                    }
                }
                Failure::Etcd(detail) => {
                    if failures == 0 {
                        warn!(node = %self.name, endpoint = %self.endpoints[self.next],
                              error = %detail, "leader election: etcd failed; trying again");
                    } else {
                        debug!(node = %self.name, endpoint = %self.endpoints[self.next],
                               error = %detail, "leader election: etcd failed again");
                    }
                    self.client = None;
                    self.next = (self.next + 1) % self.endpoints.len();
                    failures += 1;
                }
            }
            if failures >= self.endpoints.len() {
                let pause = Instant::now() + RETRY_PAUSE;
                let waited = self
                    .race(std::future::pending::<()>(), Some(pause), Accept::All)
                    .await;
                match waited {
                    Waited::Interrupted(Interrupt::Stop(Stop::Abandon)) => return Ok(()),
                    Waited::Interrupted(Interrupt::Stop(Stop::Resign)) => {
                        return self.resign().await
                    }
                    Waited::Interrupted(Interrupt::Freeze) => return self.frozen().await,
                    Waited::Done(()) | Waited::TimedOut => {}
                }
            }
        }
    }

    /// One connection to one endpoint: keeps the lease alive, claims or watches the key, until
    /// something fails. Also says whether the session got as far as watching.
    pub(super) async fn session(&mut self) -> (bool, Failure) {
        let client = match self.client.clone() {
            Some(client) => client,
            None => {
                let endpoint = self.endpoints[self.next].clone();
                let options = self.connect_options.clone();
                let connect = Client::connect([endpoint], Some(options));
                match self.request("connect", connect).await {
                    Ok(client) => self.client.insert(client).clone(),
                    Err(failure) => return (false, failure),
                }
            }
        };
        let (mut keeper, mut answers) = match self.open_lease(&client).await {
            Ok(stream) => stream,
            Err(failure) => return (false, failure),
        };
        let revision = match self.claim(&client).await {
            Ok(revision) => revision,
            Err(failure) => return (false, failure),
        };
        self.update();
        let mut watch_client = client.watch_client();
        let key = self.key.clone();
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let watch = async move { watch_client.watch(key, Some(options)).await };
        let mut watch = match self.request("watch the leader key", watch).await {
            Ok(watch) => watch,
            Err(failure) => return (false, failure),
        };
        debug!(node = %self.name, endpoint = %self.endpoints[self.next], "leader election: connected");

        // When the keep-alive in flight was sent; when the last one was.
        let mut in_flight: Option<Instant> = None;
        let mut last_sent = Instant::now();
        loop {
            let Some(lease) = &self.lease else {
                return (true, Failure::LeaseGone);
            };
            let interval = lease.ttl / 3;
            let wake = match in_flight {
                Some(sent) => sent + interval.min(self.timeout),
                None => last_sent + interval,
            };
            let next = next_event(&mut answers, &mut watch, in_flight.is_some());
            let failure = match self.race(next, Some(wake), Accept::All).await {
                Waited::Interrupted(interrupt) => Failure::Interrupted(interrupt),
                Waited::TimedOut if in_flight.is_some() => Failure::Etcd(format!(
                    "keep-alive: no answer within {:?}",
                    interval.min(self.timeout)
                )),
                Waited::TimedOut => {
                    let now = Instant::now();
                    match self.request("keep-alive", keeper.keep_alive()).await {
                        Ok(()) => {
                            in_flight = Some(now);
                            last_sent = now;
                            continue;
                        }
                        Err(failure) => failure,
                    }
                }
                Waited::Done(Event::KeepAlive(answer)) => match answer {
                    Ok(Some(answer)) if answer.ttl() > 0 => {
                        if let Some(sent) = in_flight.take() {
                            self.renewed(sent, answer.ttl());
                            self.update();
                        }
                        continue;
                    }
                    Ok(Some(_)) => Failure::LeaseGone,
                    Ok(None) => Failure::Etcd("etcd closed the keep-alive stream".into()),
                    Err(e) => Failure::Etcd(format!("keep-alive: {}", cause(&e))),
                },
                Waited::Done(Event::Watch(answer)) => match answer {
                    Ok(Some(answer)) => match self.watched(&client, &answer).await {
                        Ok(()) => continue,
                        Err(failure) => failure,
                    },
                    Ok(None) => Failure::Etcd("etcd closed the watch stream".into()),
                    Err(e) => Failure::Etcd(format!("watch: {}", cause(&e))),
                },
            };
            return (true, failure);
        }
    }

    /// Opens the keep-alive stream of this node's lease, granting a new one if it has none
    /// (or etcd forgot it).
    pub(super) async fn open_lease(
        &mut self,
        client: &Client,
    ) -> Result<(LeaseKeeper, LeaseKeepAliveStream), Failure> {
        if let Some(lease) = &self.lease {
            let (id, ttl) = (lease.id, lease.ttl);
            let sent = Instant::now();
            let mut leases = client.lease_client();
            // It sends a keep-alive and waits for its answer.
            let open = async move { leases.keep_alive(id).await };
            match self.request("keep-alive", open).await {
                Ok(stream) => {
                    self.renewed(sent, secs(ttl));
                    return Ok(stream);
                }
                Err(Failure::LeaseGone) => self.lost_lease(),
                Err(failure) => return Err(failure),
            }
        }
        let sent = Instant::now();
        let mut leases = client.lease_client();
        let secs_asked = secs(self.ttl);
        let grant = async move { leases.grant(secs_asked, None).await };
        let granted = self.request("lease grant", grant).await?;
        let Ok(granted_secs @ 1..) = u64::try_from(granted.ttl()) else {
            return Err(Failure::Etcd(format!(
                "lease grant: etcd granted a TTL of {} s",
                granted.ttl()
            )));
        };
        let ttl = Duration::from_secs(granted_secs);
        if ttl > self.ttl && !self.warned_ttl {
            self.warned_ttl = true;
            warn!(node = %self.name, asked = ?self.ttl, granted = ?ttl,
                  "leader election: etcd lengthened the lease TTL to its minimum (1.5 x its \
                   --election-timeout); a crashed leader is replaced later than configured");
        }
        let id = granted.id();
        self.lease = Some(Lease {
            id,
            ttl,
            valid_until: sent + ttl - margin(ttl),
        });
        self.shared.published().granted_ttl = Some(ttl);
        let sent = Instant::now();
        let mut leases = client.lease_client();
        let open = async move { leases.keep_alive(id).await };
        let stream = self.request("keep-alive", open).await?;
        self.renewed(sent, granted.ttl());
        Ok(stream)
    }

    /// Learns who holds the key, and campaigns if no one does; returns the revision the watch
    /// must start after.
    pub(super) async fn claim(&mut self, client: &Client) -> Result<i64, Failure> {
        for _ in 0..3 {
            let mut kv = client.kv_client();
            let key = self.key.clone();
            let read = async move { kv.get(key, None).await };
            let answer = self.request("read the leader key", read).await?;
            let revision = answer.header().map_or(0, |h| h.revision());
            if let Some(kv) = answer.kvs().first() {
                self.observed(kv);
                return Ok(revision);
            }
            if let Some(revision) = self.campaign(client).await? {
                return Ok(revision);
            }
            // Another node created it in between: read it again.
        }
        Err(Failure::Etcd(
            "the leader key changed three times while this node read it".into(),
        ))
    }

    /// Creates the leader key if it is absent; the revision if this node won.
    pub(super) async fn campaign(&mut self, client: &Client) -> Result<Option<i64>, Failure> {
        let Some(lease) = &self.lease else {
            return Err(Failure::LeaseGone);
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                self.key.clone(),
                self.name.clone(),
                Some(PutOptions::new().with_lease(lease.id)),
            )]);
        let mut kv = client.kv_client();
        let campaign = async move { kv.txn(txn).await };
        let answer = self.request("campaign", campaign).await?;
        if !answer.succeeded() {
            return Ok(None);
        }
        let revision = answer.header().map_or(0, |h| h.revision());
        if revision <= 0 {
            return Err(Failure::Etcd(
                "campaign: etcd's answer has no revision".into(),
            ));
        }
        info!(node = %self.name, term = revision, "leader election: won");
        self.holder = Holder::Us {
            term: Term::from_revision(revision),
            since: Instant::now(),
        };
        Ok(Some(revision))
    }

    /// Follows the watch: a deleted key is campaigned for at once.
    pub(super) async fn watched(
        &mut self,
        client: &Client,
        answer: &WatchResponse,
    ) -> Result<(), Failure> {
        if answer.canceled() {
            return Err(Failure::Etcd(format!(
                "etcd cancelled the watch: {} (compacted up to revision {})",
                answer.cancel_reason(),
                answer.compact_revision()
            )));
        }
        for event in answer.events() {
            if let Some(kv) = event.kv().filter(|kv| kv.key() == self.key.as_bytes()) {
                self.observed(kv);
            }
        }
        if self.holder == Holder::Nobody && self.campaign(client).await?.is_none() {
            // The winner's put comes next on the watch.
            self.holder = Holder::Unknown;
        }
        self.update();
        Ok(())
    }

    /// Takes in a state of the leader key (read, or from the watch).
    pub(super) fn observed(&mut self, kv: &KeyValue) {
        let ours = self.lease.as_ref().is_some_and(|l| l.id == kv.lease());
        self.holder = if kv.version() == 0 {
            // A deletion (its key-value has no versions).
            Holder::Nobody
        } else if ours {
            let term = Term::from_revision(kv.create_revision());
            match &self.holder {
                Holder::Us { term: held, since } if *held == term => Holder::Us {
                    term,
                    since: *since,
                },
                _ => Holder::Us {
                    term,
                    since: Instant::now(),
                },
            }
        } else {
            Holder::Other {
                name: String::from_utf8_lossy(kv.value()).into_owned(),
            }
        };
    }

    /// A keep-alive sent at `sent` was answered: the lease lives at least until `sent + TTL`.
    pub(super) fn renewed(&mut self, sent: Instant, answered_secs: i64) {
        if let Some(lease) = &mut self.lease {
            let ttl = lease
                .ttl
                .min(Duration::from_secs(answered_secs.unsigned_abs()));
            let until = sent + ttl - margin(ttl);
            lease.valid_until = lease.valid_until.max(until);
        }
    }

    /// etcd no longer knows this node's lease.
    pub(super) fn lost_lease(&mut self) {
        if self.lease.take().is_some() {
            if matches!(self.holder, Holder::Us { .. }) {
                warn!(node = %self.name, "leader election: the lease expired; no longer leader");
            } else {
                info!(node = %self.name, "leader election: the lease expired");
            }
        }
        self.holder = Holder::Unknown;
        self.update();
    }

    /// Publishes the role to the handle.
    pub(super) fn update(&self) {
        let role = match &self.holder {
            Holder::Us { term, since } => Role::Leader {
                since: *since,
                term: *term,
            },
            Holder::Other { name } => Role::Standby {
                leader: Some(name.clone()),
            },
            Holder::Nobody | Holder::Unknown => Role::Standby { leader: None },
        };
        {
            let mut published = self.shared.published();
            published.role = role;
            published.valid_until = self.lease.as_ref().map(|l| l.valid_until);
        }
        self.notify();
    }

    /// Sends the role on the channel if it changed since last sent.
    pub(super) fn notify(&self) {
        let (previous, role) = {
            let mut published = self.shared.published();
            let role = published.effective(Instant::now());
            if role == published.notified {
                return;
            }
            (
                std::mem::replace(&mut published.notified, role.clone()),
                role,
            )
        };
        match &role {
            Role::Leader { term, .. } => {
                info!(node = %self.name, term = term.revision(), "leader election: leader")
            }
            Role::Standby { leader } => {
                info!(node = %self.name, leader = leader.as_deref().unwrap_or("-"),
                      "leader election: standby")
            }
            Role::Unknown => {
                warn!(node = %self.name, "leader election: role unknown (etcd unreachable)")
            }
        }
        let known = role != Role::Unknown;
        match self.changes.try_send(RoleChange { previous, role }) {
            Ok(()) | Err(TrySendError::Disconnected(_)) => {}
            Err(TrySendError::Full(_)) => {
                debug!(node = %self.name, "leader election: change channel full; dropped a change")
            }
        }
        // After the change is on the channel: whoever `Election::start` returned to finds it.
        if known {
            let _ = self.ready.try_send(());
        }
    }

    /// Gives the lease back (which deletes the key if this node holds it).
    pub(super) async fn resign(&mut self) -> Result<(), String> {
        let was_leader = matches!(self.holder, Holder::Us { .. });
        let lease = self.lease.take();
        self.holder = Holder::Unknown;
        self.update();
        let Some(lease) = lease else {
            return Ok(());
        };
        let deadline = Instant::now() + self.timeout;
        let mut failures = Vec::new();
        for _ in 0..self.endpoints.len() {
            let endpoint = self.endpoints[self.next].clone();
            let client = match self.client.take() {
                Some(client) => Ok(client),
                None => {
                    let options = self.connect_options.clone();
                    let connect = Client::connect([endpoint.clone()], Some(options));
                    self.request_until("connect", connect, deadline, Accept::Nothing)
                        .await
                }
            };
            let outcome = match client {
                Ok(client) => {
                    let mut leases = client.lease_client();
                    let revoke = async move { leases.revoke(lease.id).await };
                    self.request_until("revoke the lease", revoke, deadline, Accept::Nothing)
                        .await
                        .map(drop)
                }
                Err(failure) => Err(failure),
            };
            match outcome {
                Ok(()) | Err(Failure::LeaseGone) => {
                    info!(node = %self.name, was_leader, "leader election: resigned");
                    return Ok(());
                }
                Err(Failure::Etcd(detail)) => failures.push(format!("{endpoint}: {detail}")),
                Err(Failure::Interrupted(_)) => {}
            }
            self.next = (self.next + 1) % self.endpoints.len();
            if Instant::now() >= deadline {
                break;
            }
        }
        Err(failures.join("; "))
    }

    /// Test only: a node cut off from etcd; it only reports its role timing out, until stopped.
    pub(super) async fn frozen(&mut self) -> Result<(), String> {
        self.client = None;
        let _ = self
            .race(std::future::pending::<()>(), None, Accept::StopOnly)
            .await;
        Ok(())
    }

    /// Sends a request, bounded by the timeout; any signal cuts it short.
    pub(super) async fn request<T>(
        &self,
        what: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Failure> {
        let deadline = Instant::now() + self.timeout;
        self.request_until(what, request, deadline, Accept::All)
            .await
    }

    pub(super) async fn request_until<T>(
        &self,
        what: &str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
        deadline: Instant,
        accept: Accept,
    ) -> Result<T, Failure> {
        match self.race(request, Some(deadline), accept).await {
            Waited::Done(Ok(answer)) => Ok(answer),
            Waited::Done(Err(e)) if lease_gone(&e) => Err(Failure::LeaseGone),
            Waited::Done(Err(e)) => Err(Failure::Etcd(format!(
                "{what}: {}",
                explain_etcd_error(cause(&e))
            ))),
            Waited::TimedOut => Err(Failure::Etcd(format!(
                "{what}: no answer within {:?}",
                self.timeout
            ))),
            Waited::Interrupted(interrupt) => Err(Failure::Interrupted(interrupt)),
        }
    }

    /// Waits for `future`, until `until`, or for a signal `accept` lets through, whichever
    /// comes first. Meanwhile, reports the role turning unknown when the lease's deadline
    /// passes.
    pub(super) async fn race<F: Future>(
        &self,
        future: F,
        until: Option<Instant>,
        accept: Accept,
    ) -> Waited<F::Output> {
        let mut future = pin!(future);
        let mut timer = pin!(until.map(|t| tokio::time::sleep_until(t.into())));
        let now = Instant::now();
        let valid_until = self.shared.published().valid_until.filter(|t| *t > now);
        // A millisecond late, so the role has surely timed out when it fires.
        let mut expiry =
            pin!(valid_until
                .map(|t| tokio::time::sleep_until((t + Duration::from_millis(1)).into())));
        let mut expired = false;
        poll_fn(|cx| {
            if accept != Accept::Nothing {
                if let Poll::Ready(interrupt) = self.shared.poll_signal(cx, accept) {
                    return Poll::Ready(Waited::Interrupted(interrupt));
                }
            }
            if let Poll::Ready(output) = future.as_mut().poll(cx) {
                return Poll::Ready(Waited::Done(output));
            }
            if !expired {
                if let Some(expiry) = expiry.as_mut().as_pin_mut() {
                    if expiry.poll(cx).is_ready() {
                        expired = true;
                        self.notify();
                    }
                }
            }
            if let Some(timer) = timer.as_mut().as_pin_mut() {
                if timer.poll(cx).is_ready() {
                    return Poll::Ready(Waited::TimedOut);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// The next keep-alive answer (if one is awaited) or watch answer. Both streams keep what they
/// received when this is dropped early.
pub(super) async fn next_event(
    answers: &mut LeaseKeepAliveStream,
    watch: &mut WatchStream,
    answer_awaited: bool,
) -> Event {
    let mut answer = pin!(answer_awaited.then(|| answers.message()));
    let mut watched = pin!(watch.message());
    poll_fn(|cx| {
        if let Some(answer) = answer.as_mut().as_pin_mut() {
            if let Poll::Ready(answer) = answer.poll(cx) {
                return Poll::Ready(Event::KeepAlive(answer));
            }
        }
        if let Poll::Ready(answer) = watched.as_mut().poll(cx) {
            return Poll::Ready(Event::Watch(answer));
        }
        Poll::Pending
    })
    .await
}

/// How long before a lease's earliest expiry its holder stops counting on it.
pub(super) fn margin(ttl: Duration) -> Duration {
    ttl / 5
}

/// A TTL in whole seconds, as etcd takes it.
pub(super) fn secs(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)
}

/// Whether etcd said it does not know the lease: a keep-alive stream opened for it is
/// answered with TTL 0, and a put or revoke naming it fails with NOT_FOUND (the only
/// NOT_FOUND the requests of this module can get).
pub(super) fn lease_gone(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::LeaseKeepAliveError(text) => text.contains("not found"),
        etcd_client::Error::GRpcStatus(status) => status.code() == tonic::Code::NotFound,
        _ => false,
    }
}

/// An etcd client error as one line: the gRPC code and message, or the error, and its root
/// cause (e.g. `tcp connect error: Connection refused (os error 111)`).
pub(super) fn cause(e: &etcd_client::Error) -> String {
    use std::error::Error as _;
    let (mut text, mut source) = match e {
        etcd_client::Error::GRpcStatus(status) => {
            let text = if status.message().is_empty() {
                format!("{:?}", status.code())
            } else {
                format!("{:?}: {}", status.code(), status.message())
            };
            (text, status.source())
        }
        etcd_client::Error::TransportError(inner) => (inner.to_string(), inner.source()),
        other => (other.to_string(), None),
    };
    let mut root = None;
    while let Some(inner) = source {
        root = Some(inner.to_string());
        source = inner.source();
    }
    if let Some(root) = root.filter(|root| !text.contains(root.as_str())) {
        text.push_str(": ");
        text.push_str(&root);
    }
    text
}
