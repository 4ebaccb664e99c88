//! The control plane's edits of the SA tables: install a CHILD_SA pair (RFC 7296 §2.17 keys,
//! rekey takeover of §2.8), remove it, move a tunnel's SAs to new outer addresses (NAT
//! rebinding, RFC 7296 §2.23). Each edit is validated, applied to the registry and published
//! as a new snapshot.
//!
//! In relay mode a CHILD_SA's local address is a steer node's VIP, not one of ours: its ESP
//! leaves from the Geneve socket, wrapped for the steer node (see `relays`).

use crate::sa::SaPair;
use crate::shared::Shared;
use crate::stats::ChildCounters;
use crate::tables::{Child, ChildState};
use datapath::DataplaneError;
use ike::{ChildSaInfo, IkeSpis, TunnelId};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::EspSpi;

fn install_error(child: &ChildSaInfo, reason: impl Into<String>) -> DataplaneError {
    DataplaneError::Install {
        tunnel: child.tunnel,
        spi: child.inbound_spi,
        reason: reason.into(),
    }
}

/// How long a removed CHILD_SA keeps opening inbound packets (strongSwan's
/// `delete_rekeyed_delay` is 5 s): ESP the peer sent before it processed the DELETE, or that
/// the network reordered behind it, is still delivered.
pub(crate) const RETIRE_GRACE: Duration = Duration::from_secs(5);

impl Shared {
    /// Installs a CHILD_SA pair; with `outbound_active`, outbound traffic moves to it at once
    /// (from `replaces`), else when the SA now sending is removed.
    pub(crate) fn install_child(&self, child: &ChildSaInfo) -> Result<(), DataplaneError> {
        self.install_child_with(child, None)
    }

    /// [`install_child`](Self::install_child) with a soft sequence number limit of
    /// `rekey_after` instead of the default.
    pub(crate) fn install_child_with(
        &self,
        child: &ChildSaInfo,
        rekey_after: Option<u64>,
    ) -> Result<(), DataplaneError> {
        if child.inbound_spi.0 < 256 || child.outbound_spi.0 < 256 {
            // RFC 4303 §2.1: SPIs 1..=255 are reserved, 0 is never sent.
            return Err(install_error(child, "SPI in the reserved range 0..=255"));
        }
        if child.local_ts.is_empty() || child.remote_ts.is_empty() {
            return Err(install_error(child, "no traffic selectors"));
        }
        if self.io.relay_sock.is_some() && child.local.is_ipv4() != child.remote.is_ipv4() {
            return Err(install_error(
                child,
                format!(
                    "local {} and remote {} are of different families (relayed datagrams carry both)",
                    child.local, child.remote
                ),
            ));
        }
        let sock = self.io.outer_sock(child.local.ip()).ok_or_else(|| {
            install_error(child, format!("no NAT-T socket on {}", child.local.ip()))
        })?;
        let sa = SaPair::new(child, rekey_after).map_err(|e| install_error(child, e))?;
        let mut reg = self.registry();
        let binding = reg
            .overlay()
            .binding(child.tunnel)
            .cloned()
            .ok_or_else(|| install_error(child, "tunnel is not bound to an inside interface"))?;
        let entry = Child {
            tunnel: child.tunnel,
            ike: child.ike,
            inbound_spi: child.inbound_spi,
            outbound_spi: child.outbound_spi,
            inside: binding.inside.clone(),
            local: child.local,
            remote: child.remote,
            sock,
            local_ts: child.local_ts.clone(),
            remote_ts: child.remote_ts.clone(),
            state: Arc::new(ChildState {
                sa,
                counters: ChildCounters::default(),
                rekey_requested: AtomicBool::new(false),
                moved_reported: std::sync::Mutex::new(None),
            }),
            tenant: reg.tenant_slot(&binding.tenant),
        };
        if reg.contains(child.inbound_spi) {
            return Err(install_error(child, "inbound SPI already installed"));
        }
        reg.install(entry, child.replaces, child.outbound_active);
        self.publish(&reg);
        tracing::info!(tunnel = child.tunnel.0, tenant = %binding.tenant, spi_in = %child.inbound_spi,
            spi_out = %child.outbound_spi, remote = %child.remote, replaces = ?child.replaces,
            outbound_active = child.outbound_active, inside = ?binding.inside, proposal = %child.proposal, "CHILD_SA installed");
        Ok(())
    }

    /// Removes a CHILD_SA pair (a no-op if it is not installed).
    pub(crate) fn remove_child(&self, tunnel: TunnelId, inbound_spi: EspSpi, outbound_spi: EspSpi) {
        let mut reg = self.registry();
        if reg.retire(tunnel, inbound_spi, Instant::now() + RETIRE_GRACE) {
            self.publish(&reg);
            tracing::info!(tunnel = tunnel.0, spi_in = %inbound_spi, spi_out = %outbound_spi,
                grace_ms = RETIRE_GRACE.as_millis() as u64, "CHILD_SA removed; late inbound packets accepted during the grace");
        } else {
            tracing::debug!(tunnel = tunnel.0, spi_in = %inbound_spi, "remove_child: not installed");
        }
    }

    /// Drops the removed CHILD_SAs whose grace has ended (the workers call it periodically).
    /// A worker never waits for the registry here: while the control plane (or a status or
    /// metrics read) holds it, the expiry waits for the next round.
    pub(crate) fn expire_retired(&self, now: Instant) {
        let Some(mut reg) = self.try_registry() else {
            return;
        };
        let gone = reg.expire(now);
        if !gone.is_empty() {
            self.publish(&reg);
            for (tunnel, spi) in gone {
                tracing::debug!(tunnel = tunnel.0, spi_in = %spi, "removed CHILD_SA forgotten");
            }
        }
    }

    /// Moves the CHILD_SAs of an IKE SA to new outer addresses.
    pub(crate) fn update_peer(
        &self,
        tunnel: TunnelId,
        ike: IkeSpis,
        local: SocketAddr,
        remote: SocketAddr,
    ) {
        if self.io.relay_sock.is_some() && local.is_ipv4() != remote.is_ipv4() {
            tracing::warn!(tunnel = tunnel.0, %local, %remote, "update_peer: addresses of different families; keeping the old ones");
            return;
        }
        let Some(sock) = self.io.outer_sock(local.ip()) else {
            tracing::warn!(tunnel = tunnel.0, %local, "update_peer: no NAT-T socket on the new local address; keeping the old one");
            return;
        };
        let mut reg = self.registry();
        let moved = reg.update_peer(tunnel, ike, local, remote, sock);
        self.publish(&reg);
        tracing::info!(tunnel = tunnel.0, %local, %remote, children = moved, "peer address updated");
    }
}
