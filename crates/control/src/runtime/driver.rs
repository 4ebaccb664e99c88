//! The control loop's thread ([`Driver::run`]): waits for datagrams, commands and the engine's
//! timers, starts and restarts tunnels, and drains the engine (events, then state, then
//! datagrams).

use super::*;

impl Driver {
    pub(super) fn run(&mut self, data: &Receiver<ToControl>, commands: &Receiver<Command>) {
        let now = Instant::now();
        info!(store = %self.persist.describe(), "IKE state store");
        // The data path says which restored CHILD_SAs it no longer holds (all of them when it
        // restarted with this process; in the distributed form, those no data node kept).
        let restored = std::mem::take(&mut self.restored);
        let lost = self.datapath.reconcile(&restored);
        if !restored.is_empty() {
            info!(
                restored = restored.len(),
                kept = restored.len().saturating_sub(lost.len()),
                rekeyed = lost.len(),
                "restored CHILD_SAs reconciled with the data path"
            );
        }
        for spi in lost {
            if let Err(e) = self.endpoint.rekey_child(now, spi) {
                warn!(spi_in = %spi, error = %e, "cannot rekey a restored CHILD_SA");
            }
        }
        self.on_timeout(now);
        self.drain();
        self.start_tunnels(now);
        let mut data_open = true;
        loop {
            let now = Instant::now();
            if let Some(deadline) = self.shutdown_deadline {
                if now >= deadline || self.endpoint.status(now).is_empty() {
                    break;
                }
            }
            let wake = [
                self.endpoint.poll_timeout(),
                self.shutdown_deadline,
                self.persist.retry_at(),
                self.persist.reseal_at(),
            ]
            .into_iter()
            .flatten()
            .min();
            let mut select = Select::new();
            let data_index = data_open.then(|| select.recv(data));
            let command_index = select.recv(commands);
            let ready = match wake {
                Some(at) => select.ready_deadline(at).ok(),
                None => Some(select.ready()),
            };
            let now = Instant::now();
            match ready {
                Some(i) if Some(i) == data_index => match data.try_recv() {
                    Ok(message) => self.on_data(now, message),
                    Err(crossbeam_channel::TryRecvError::Empty) => {}
                    Err(crossbeam_channel::TryRecvError::Disconnected) => {
                        data_open = false;
                        if self.shutdown_deadline.is_none() {
                            error!("data plane channel closed; stopping the control loop");
                            break;
                        }
                    }
                },
                Some(i) if i == command_index => match commands.try_recv() {
                    Ok(command) => {
                        self.on_command(now, command);
                        if self.aborted {
                            return;
                        }
                    }
                    Err(crossbeam_channel::TryRecvError::Empty) => {}
                    Err(crossbeam_channel::TryRecvError::Disconnected) => {
                        // Every handle is gone: nobody can stop us any more, so stop now.
                        self.begin_shutdown(now, Duration::ZERO);
                    }
                },
                _ => {}
            }
            let now = Instant::now();
            self.on_timeout(now);
            self.drain();
            self.restart_dead(now);
            // Every datagram of the round has left: re-encrypt a few records now, if due and
            // no IKE datagram is waiting (the wait is bounded, see `persist`).
            self.persist.reseal(Instant::now(), !data.is_empty());
        }
        if self.shutdown_deadline.is_some() {
            self.forget_all();
        }
        debug!("control loop stopped");
    }

    /// After a shutdown: every peer was told its IKE SAs are deleted (answered or not), so none
    /// may come back at the next start.
    pub(super) fn forget_all(&mut self) {
        let now = Instant::now();
        let changes = self.endpoint.take_state_changes(now);
        self.persist.save(now, changes, |_| String::new());
        match self.persist.load() {
            Ok(records) => {
                if !self
                    .persist
                    .forget(now, records.into_iter().map(|(spi, _)| spi))
                {
                    warn!("cannot clear the stored IKE SAs at shutdown; they will be restored (and fail) at the next start");
                }
            }
            Err(e) => warn!(error = %e, "cannot clear the stored IKE SAs at shutdown"),
        }
    }

    /// Runs the engine's timers if they are due.
    pub(super) fn on_timeout(&mut self, now: Instant) {
        if self.endpoint.poll_timeout().is_some_and(|t| t <= now) {
            self.endpoint.handle_timeout(now);
        }
    }

    pub(super) fn on_data(&mut self, now: Instant, message: ToControl) {
        match message {
            ToControl::Ike(d) => self
                .endpoint
                .handle_datagram(now, d.local, d.remote, &d.data),
            ToControl::RekeyNeeded(spi) => {
                if self.shutdown_deadline.is_some() {
                    return;
                }
                info!(spi_in = %spi, "data plane asks for a CHILD_SA rekey");
                if let Err(e) = self.endpoint.rekey_child(now, spi) {
                    warn!(spi_in = %spi, error = %e, "cannot rekey CHILD_SA");
                }
            }
            ToControl::PeerAddressSeen {
                inbound_spi,
                local,
                remote,
            } => {
                debug!(spi_in = %inbound_spi, %remote, "authenticated ESP from a new peer address");
                self.endpoint
                    .peer_address_seen(now, inbound_spi, local, remote);
            }
            // One data path serves every attachment here: nobody else needs the MAC.
            ToControl::CeLearned { attachment, mac } => {
                debug!(%attachment, mac = %wire::ethernet::EthernetAddress(mac), "CE MAC learned");
            }
        }
    }

    pub(super) fn on_command(&mut self, now: Instant, command: Command) {
        match command {
            Command::Status(None, reply) => {
                let _ = reply.send(IkeReport {
                    sas: self.endpoint.status(now),
                    drops: self.endpoint.stats().clone(),
                    events: self.events.clone(),
                });
            }
            Command::Status(Some(tunnel), reply) => {
                let _ = reply.send(IkeReport {
                    sas: self.endpoint.tunnel_status(now, tunnel),
                    drops: self.endpoint.stats().clone(),
                    events: (self.events.get(&tunnel).cloned())
                        .map(|e| (tunnel, e))
                        .into_iter()
                        .collect(),
                });
            }
            Command::StoreStats(reply) => {
                let _ = reply.send(self.persist.stats());
            }
            Command::RotateStoreKey(reply) => {
                let _ = reply.send(self.persist.rotate_key());
            }
            Command::Initiate(tunnel, reply) => {
                let _ = reply.send(self.unless_shutting_down(|d| d.endpoint.initiate(now, tunnel)));
            }
            Command::Terminate(tunnel, reply) => {
                self.restart.retain(|t| *t != tunnel);
                let _ = reply.send(
                    self.endpoint
                        .terminate(now, tunnel)
                        .map_err(CommandFailure::Engine),
                );
            }
            Command::RekeyChild(tunnel, reply) => {
                let _ =
                    reply.send(self.unless_shutting_down(|d| d.rekey_tunnel_child(now, tunnel)));
            }
            Command::RekeyIke(tunnel, reply) => {
                let _ =
                    reply.send(self.unless_shutting_down(|d| d.endpoint.rekey_ike(now, tunnel)));
            }
            Command::AddChild(tunnel, reply) => {
                let _ =
                    reply.send(self.unless_shutting_down(|d| d.endpoint.add_child(now, tunnel)));
            }
            Command::DeleteChild(spi, reply) => {
                let _ =
                    reply.send(self.unless_shutting_down(|d| d.endpoint.delete_child(now, spi)));
            }
            Command::Apply(request, reply) => {
                let _ = reply.send(self.apply(now, *request));
            }
            Command::FilterState(reply) => {
                let state = self.persist.filters().map(|stored| FilterState {
                    filters: self.config.filters.clone(),
                    tenants: self.config.tenants.clone(),
                    generation: stored.map_or(0, |r| r.generation),
                });
                let _ = reply.send(state);
            }
            Command::CommitFilters(filters, reply) => {
                let _ = reply.send(self.commit_filters(filters));
            }
            Command::CommitMapSetting(tenant, map, op, reply) => {
                let _ = reply.send(self.commit_map_setting(&tenant, &map, &op));
            }
            Command::Shutdown { grace } => self.begin_shutdown(now, grace),
            Command::Abort => self.aborted = true,
        }
    }

    /// Runs an engine command unless the loop is shutting down.
    fn unless_shutting_down(
        &mut self,
        command: impl FnOnce(&mut Self) -> Result<(), ike::Error>,
    ) -> Result<(), CommandFailure> {
        if self.shutdown_deadline.is_some() {
            return Err(CommandFailure::ShuttingDown);
        }
        command(self).map_err(CommandFailure::Engine)
    }

    /// Rekeys the tunnel's CHILD_SA: the oldest one of its newest established IKE SA. A tunnel
    /// carries one CHILD_SA; while a rekey of it is under way (ours or the peer's) the oldest is
    /// the one being replaced, and the engine leaves it alone, as swanctl does with a CHILD_SA
    /// that is already rekeying (rekeying its successor before the peer's DELETE of the old
    /// one would only be postponed).
    pub(super) fn rekey_tunnel_child(
        &mut self,
        now: Instant,
        tunnel: TunnelId,
    ) -> Result<(), ike::Error> {
        let current = self
            .endpoint
            .status(now)
            .into_iter()
            .filter(|s| s.tunnel == Some(tunnel) && s.state == ike::IkeSaState::Established)
            .max_by_key(|s| std::cmp::Reverse(s.age_secs))
            .and_then(|s| s.children.first().map(|c| c.inbound_spi))
            .ok_or(ike::Error::NotEstablished(tunnel))?;
        self.endpoint.rekey_child(now, current)
    }

    /// Terminates every tunnel that has an IKE SA, so that peers get a DELETE, and arms the
    /// deadline after which the loop ends regardless of answers.
    pub(super) fn begin_shutdown(&mut self, now: Instant, grace: Duration) {
        if self.shutdown_deadline.is_some() {
            return;
        }
        self.shutdown_deadline = Some(now + grace);
        self.restart.clear();
        let mut with_sa: Vec<TunnelId> = self
            .endpoint
            .status(now)
            .iter()
            .filter_map(|s| s.tunnel)
            .collect();
        with_sa.sort_unstable();
        with_sa.dedup();
        info!(
            tunnels = with_sa.len(),
            grace_ms = grace.as_millis(),
            "deleting IKE SAs before stopping"
        );
        for tunnel in with_sa {
            if let Err(e) = self.endpoint.terminate(now, tunnel) {
                debug!(tunnel = %self.name(Some(tunnel)), error = %e, "terminate on shutdown");
            }
        }
        self.drain();
    }

    /// Initiates `start_action = "start"` tunnels the engine has not initiated on its own.
    pub(super) fn start_tunnels(&mut self, now: Instant) {
        let status = self.endpoint.status(now);
        let mut to_start: Vec<TunnelId> = self
            .tunnels
            .iter()
            .filter(|(id, t)| {
                !t.removed
                    && t.start_action == StartAction::Start
                    && !status.iter().any(|s| s.tunnel == Some(**id))
            })
            .map(|(id, _)| *id)
            .collect();
        to_start.sort_unstable();
        for tunnel in to_start {
            if let Err(e) = self.endpoint.initiate(now, tunnel) {
                warn!(tunnel = %self.name(Some(tunnel)), error = %e, "cannot initiate");
            }
        }
        self.drain();
    }

    /// Re-initiates tunnels whose IKE SA died of a DPD timeout under `dpd_action = "restart"`,
    /// unless the engine already did.
    pub(super) fn restart_dead(&mut self, now: Instant) {
        if self.restart.is_empty() || self.shutdown_deadline.is_some() {
            return;
        }
        let status = self.endpoint.status(now);
        for tunnel in std::mem::take(&mut self.restart) {
            if status.iter().any(|s| s.tunnel == Some(tunnel)) {
                continue;
            }
            info!(tunnel = %self.name(Some(tunnel)), tenant = %self.tenant(Some(tunnel)), "re-initiating after DPD timeout");
            if let Err(e) = self.endpoint.initiate(now, tunnel) {
                warn!(tunnel = %self.name(Some(tunnel)), error = %e, "cannot re-initiate");
            }
        }
        self.drain();
    }

    /// Applies every pending event, then sends every pending datagram, until the engine has
    /// nothing more to say. Events first: a CHILD_SA must be in the data path before the
    /// message that lets the peer use it leaves (our CREATE_CHILD_SA response, or anything
    /// sent after we processed the peer's response); otherwise the peer's first packets on it
    /// can arrive before it is installed. Removals cannot cut traffic short by coming first:
    /// the data path keeps a removed SA's inbound half for a grace period.
    /// Drains the engine: events first (SAs reach the data path), then the state changes
    /// (committed to the store), then the datagrams, which leave only once their state is
    /// durable; while the store fails they are held (see `persist`).
    pub(super) fn drain(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(event) = self.endpoint.poll_event() {
                progressed = true;
                self.on_event(event);
            }
            let now = Instant::now();
            let changes = self.endpoint.take_state_changes(now);
            let tunnels = &self.tunnels;
            let name = |t: Option<TunnelId>| {
                t.and_then(|t| tunnels.get(&t))
                    .map_or_else(String::new, |i| i.name.clone())
            };
            let durable = self.persist.save(now, changes, name);
            if durable && self.persist.holding() {
                for h in self.persist.release() {
                    self.send(h.local, h.remote, &h.data);
                }
            }
            while let Some(t) = self.endpoint.poll_transmit(&mut self.buf) {
                progressed = true;
                let Some(payload) = self.buf.get(..t.size) else {
                    error!(
                        size = t.size,
                        buffer = self.buf.len(),
                        "engine reported a datagram larger than its buffer"
                    );
                    continue;
                };
                if durable {
                    self.send(t.local, t.remote, payload);
                } else {
                    self.persist.hold(Held {
                        local: t.local,
                        remote: t.remote,
                        data: payload.to_vec(),
                    });
                }
            }
            if !progressed {
                break;
            }
        }
    }

    pub(super) fn send(
        &self,
        local: std::net::SocketAddr,
        remote: std::net::SocketAddr,
        data: &[u8],
    ) {
        if let Err(e) = self.datapath.send_ike(local, remote, data) {
            debug!(%local, %remote, error = %e, "IKE send failed");
        }
    }

    pub(super) fn name(&self, tunnel: Option<TunnelId>) -> &str {
        tunnel
            .and_then(|t| self.tunnels.get(&t))
            .map_or("-", |t| t.name.as_str())
    }

    pub(super) fn tenant(&self, tunnel: Option<TunnelId>) -> &str {
        tunnel
            .and_then(|t| self.tunnels.get(&t))
            .map_or("-", |t| t.tenant.as_str())
    }
}
