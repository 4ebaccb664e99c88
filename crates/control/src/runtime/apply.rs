//! `protego ctl apply` in the control loop ([`Driver::apply`]): a new inventory of tenants, VNets
//! and tunnels checked whole, then carried out.

use super::*;

impl Driver {
    /// Stores `filters` as the next generation of the filter set, with the map settings that
    /// stay ([`crate::filters::keep_settings`]), and makes them the running configuration's
    /// (see [`ControlHandle::commit_filters`]).
    pub(super) fn commit_filters(
        &mut self,
        filters: Vec<datapath::FilterConfig>,
    ) -> Result<FilterCommit, Error> {
        if self.shutdown_deadline.is_some() {
            return Err(Error::ShuttingDown);
        }
        let stored = self.persist.filters()?;
        let settings = stored.as_ref().map_or_else(Vec::new, |r| {
            crate::filters::keep_settings(&r.settings, &self.config.filters, &filters)
        });
        let record = crate::filters::FilterRecord {
            generation: stored.map_or(0, |r| r.generation) + 1,
            filters,
            set_stored: true,
            settings,
        };
        self.store_filters(&record)?;
        self.config.filters = record.filters;
        Ok(FilterCommit {
            generation: record.generation,
            settings: record.settings,
        })
    }

    /// Stores the change of the running filters' map `map` of `tenant` by `op` (carried out by
    /// the data path) in the map settings, if it changes them (see
    /// [`ControlHandle::commit_map_setting`]).
    pub(super) fn commit_map_setting(
        &mut self,
        tenant: &ids::TenantId,
        map: &str,
        op: &datapath::FilterMapOp,
    ) -> Result<Option<FilterCommit>, Error> {
        if self.shutdown_deadline.is_some() {
            return Err(Error::ShuttingDown);
        }
        let stored = self.persist.filters()?;
        // Settings alone do not make the running set a stored one: the file's tables keep
        // running at the next start unless a load or unload stored a set.
        let (generation, set_stored, settings) = stored.map_or((0, false, Vec::new()), |r| {
            (r.generation, r.set_stored, r.settings)
        });
        let Some(settings) =
            crate::filters::record_setting(&settings, &self.config.filters, tenant, map, op)
        else {
            return Ok(None);
        };
        let record = crate::filters::FilterRecord {
            generation: generation + 1,
            filters: self.config.filters.clone(),
            set_stored,
            settings,
        };
        self.store_filters(&record)?;
        Ok(Some(FilterCommit {
            generation: record.generation,
            settings: record.settings,
        }))
    }

    fn store_filters(&mut self, record: &crate::filters::FilterRecord) -> Result<(), Error> {
        self.persist
            .commit_config(
                &[crate::store::Change::PutFilters {
                    record: record.encode(),
                }],
                &[],
            )
            .map_err(|e| Error::Filter(format!("cannot write it to the store: {e}")))
    }

    /// Carries out an apply (see [`ControlHandle::apply`]).
    pub(super) fn apply(
        &mut self,
        now: Instant,
        request: ApplyRequest,
    ) -> Result<ApplyOutcome, Error> {
        use crate::config::TunnelChange;
        if self.shutdown_deadline.is_some() {
            return Err(Error::ShuttingDown);
        }
        let ApplyRequest {
            text,
            source,
            dry_run,
        } = request;
        let mut new = self.config.with_inventory(&text, &source, None)?;
        // A tunnel that moves to another tenant or inside is a new tunnel under its old name
        // (a fresh id): its SAs must never carry traffic into the new place, not even while
        // their DELETE is under way.
        let mut ids = self.config.tunnel_ids();
        for t in &new.tunnels {
            if self
                .config
                .tunnel_named(&t.peer.name)
                .is_some_and(|o| o.tenant != t.tenant || o.inside != t.inside)
            {
                ids.remove(&t.peer.name);
            }
        }
        let mut next_id = self.next_id;
        new.keep_ids(&ids, &mut next_id);
        let plan = crate::config::plan(&self.config, &new);
        if dry_run || plan.is_empty() {
            return Ok(ApplyOutcome {
                plan,
                generation: self.generation,
                config: new,
            });
        }
        self.datapath
            .check_inside(&new.dataplane.vnets, &new.dataplane.tunnels)
            .map_err(|e| {
                Error::Apply(format!("the data path refuses its VNets and tunnels: {e}"))
            })?;
        // What goes: removed tunnels, and the old ids of moved ones (deleted with their peers);
        // replaced ones keep their id but lose their SAs (negotiated again).
        let mut retired: Vec<(TunnelId, String)> = Vec::new();
        let mut replaced: Vec<TunnelId> = Vec::new();
        for old in &self.config.tunnels {
            match new.tunnel_named(&old.peer.name) {
                Some(t) if t.peer.id != old.peer.id => {
                    retired.push((old.peer.id, old.peer.name.clone()))
                }
                Some(t) if crate::config::tunnel_change(old, t) == TunnelChange::Replace => {
                    replaced.push(old.peer.id)
                }
                Some(_) => {}
                None => retired.push((old.peer.id, old.peer.name.clone())),
            }
        }
        // Their IKE SAs leave the store in the same commit as the new configuration: a node
        // that takes over right after must not restore an SA negotiated with the old settings
        // (an old PSK) under the new ones.
        let doomed: Vec<u64> = self
            .endpoint
            .status(now)
            .iter()
            .filter(|s| {
                s.tunnel.is_some_and(|t| {
                    replaced.contains(&t) || retired.iter().any(|(id, _)| *id == t)
                })
            })
            .map(|s| s.local_spi().0)
            .collect();
        let generation = self.generation + 1;
        let record = crate::applied::AppliedConfig::new(&new, text, source, generation, next_id);
        let mut changes = vec![crate::store::Change::PutConfig {
            record: record.encode(),
        }];
        changes.extend(
            doomed
                .iter()
                .map(|&spi| crate::store::Change::DeleteIkeSa { spi }),
        );
        self.persist.commit_config(&changes, &doomed).map_err(|e| {
            Error::Apply(format!(
                "cannot write it to the store: {e} (nothing changed here; if the store applied \
                 it after all, a restart would run it: apply again)"
            ))
        })?;
        for (id, name) in &retired {
            self.restart.retain(|t| t != id);
            if let Err(e) = self.endpoint.remove_peer(now, *id) {
                warn!(tunnel = %name, error = %e, "cannot remove the tunnel from the IKE engine");
            }
            if let Some(info) = self.tunnels.get_mut(id) {
                info.removed = true;
            }
        }
        for t in &new.tunnels {
            let id = t.peer.id;
            let name = &t.peer.name;
            let old = self.config.tunnel_named(name);
            let what = match old.map(|o| (o.peer.id == id, crate::config::tunnel_change(o, t))) {
                Some((true, TunnelChange::Same)) => continue,
                Some((true, TunnelChange::Update)) => "tunnel settings updated in place",
                Some((true, TunnelChange::Replace)) => {
                    self.restart.retain(|r| *r != id);
                    if let Err(e) = self.endpoint.terminate(now, id) {
                        warn!(tunnel = %name, error = %e, "cannot delete the SAs of a changed tunnel");
                    }
                    "tunnel changed; its SAs are deleted and negotiated again"
                }
                Some((false, _)) => {
                    "tunnel moved to another tenant or inside; its SAs are deleted and it starts anew"
                }
                None => "tunnel added",
            };
            if let Err(e) = self.endpoint.add_peer(now, t.peer.clone()) {
                error!(tunnel = %name, error = %e, "IKE engine refused the tunnel's new configuration");
            }
            self.tunnels.insert(id, TunnelInfo::of(t));
            // The old IKE SA is still being deleted, which keeps the engine from starting the
            // tunnel on its own: start the new one now (a dead old peer address must not
            // delay it by a whole retransmission budget).
            if old.is_some_and(|o| o.peer.id == id)
                && replaced.contains(&id)
                && t.peer.start_action == StartAction::Start
            {
                if let Err(e) = self.endpoint.initiate(now, id) {
                    warn!(tunnel = %name, error = %e, "cannot initiate the changed tunnel");
                }
            }
            info!(tunnel = %name, tenant = %t.tenant, "{what}");
        }
        for (_, name) in &retired {
            if new.tunnel_named(name).is_none() {
                info!(tunnel = %name, "tunnel removed by apply; deleting its SAs");
            }
        }
        self.drain();
        if let Err(e) = self
            .datapath
            .set_inside(new.dataplane.vnets.clone(), new.dataplane.tunnels.clone())
        {
            error!(error = %e, "data path refused VNets and tunnels it had accepted; traffic of changed tunnels may not flow");
        }
        // The tenants' CPU weights (new tenants, changed weights).
        if let Err(e) = self.datapath.set_cpu_fairness(&new.cpu_fairness()) {
            error!(error = %e, "data path refused the tenants' CPU weights");
        }
        // Tunnels removed by an earlier apply whose SAs are gone by now.
        let status = self.endpoint.status(now);
        self.tunnels
            .retain(|id, t| !t.removed || status.iter().any(|s| s.tunnel == Some(*id)));
        info!(
            generation,
            tenants_added = plan.tenants_added.len(),
            tenants_removed = plan.tenants_removed.len(),
            vnets_added = plan.vnets_added.len(),
            vnets_changed = plan.vnets_changed.len(),
            vnets_removed = plan.vnets_removed.len(),
            tunnels_added = plan.tunnels_added.len(),
            tunnels_removed = plan.tunnels_removed.len(),
            tunnels_replaced = plan.tunnels_replaced.len(),
            tunnels_updated = plan.tunnels_updated.len(),
            "configuration applied"
        );
        self.config = new.clone();
        self.next_id = next_id;
        self.generation = generation;
        Ok(ApplyOutcome {
            plan,
            generation,
            config: new,
        })
    }
}
