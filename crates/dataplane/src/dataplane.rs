//! [`Dataplane`]: opens the sockets and the TUN device, runs the worker threads (every worker
//! serves every input, see `worker` and `lane`), and implements
//! [`DataPath`] for the control plane. Workers block in `poll` on the inputs and the shutdown
//! eventfd; [`Dataplane::shutdown`] signals it and joins them.
//!
//! In relay mode ([`RelayConfig`](crate::RelayConfig)) the inputs are the Geneve socket (and
//! the TUN device); the steer nodes and the inside configuration (VNets, tunnel bindings) are
//! replaced at run time with [`Dataplane::set_relays`] and [`Dataplane::set_inside`].

use crate::feature::{Direction, FeatureChain};
use crate::pipeline::charge::TenantSlot;
use crate::relays;
use crate::shared::Shared;
use crate::stats::DropReason;
use crossbeam_channel::Sender;
use datapath::{
    DataPath, DataplaneConfig, DataplaneError, DataplaneStats, DispatchConfig, InstalledChild,
    RouteChange, RouteChangeReport, RouteStats, ToControl, TunnelBinding, VnetConfig, WorkerStats,
};
use ike::{ChildSaInfo, IkeSpis, TunnelId};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;
use wire::esp::{NAT_KEEPALIVE, NON_ESP_MARKER};
use wire::EspSpi;

/// The addresses the data plane's sockets are bound to (ports the kernel picked included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundAddrs {
    /// IKE sockets.
    pub ike: Vec<SocketAddr>,
    /// NAT-T (IKE with marker, ESP) sockets.
    pub natt: Vec<SocketAddr>,
    /// VXLAN sockets, one per local VTEP (in relay mode they only send, from an ephemeral
    /// port).
    pub vxlan: Vec<SocketAddr>,
    /// Relay mode: the Geneve socket.
    pub relay: Option<SocketAddr>,
}

/// The data plane of one node. Start it with [`Dataplane::start`], drive it through
/// [`DataPath`], stop it with [`Dataplane::shutdown`] (also done on drop).
pub struct Dataplane {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane")
            .field("addrs", &self.local_addrs())
            .finish_non_exhaustive()
    }
}

impl Dataplane {
    /// Validates `cfg`, opens the sockets (and the TUN device if `tun_name` is set) and starts
    /// the I/O threads. IKE datagrams and rekey requests are sent on `to_control`.
    ///
    /// A port of 0 in `cfg` lets the kernel pick one per socket (tests); see
    /// [`local_addrs`](Self::local_addrs).
    pub fn start(
        cfg: DataplaneConfig,
        to_control: Sender<ToControl>,
    ) -> Result<Arc<Self>, DataplaneError> {
        let shared = Arc::new(Shared::open(cfg, to_control)?);
        let dp = Arc::new(Self {
            shared: Arc::clone(&shared),
            threads: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .map_err(|source| DataplaneError::Start { source })
        };
        let result = (|| {
            shared
                .io
                .log_opened(shared.cfg.relay.as_ref().map(|r| &r.steer));
            for id in 0..shared.workers {
                let sh = Arc::clone(&shared);
                threads.push(spawn(
                    format!("dp-worker{id}"),
                    Box::new(move || crate::worker::run(&sh, id)),
                )?);
            }
            let cpus: Vec<String> = shared
                .worker_cpus
                .iter()
                .map(|c| c.map_or_else(|| "-".to_owned(), |c| c.to_string()))
                .collect();
            tracing::info!(workers = shared.workers, cpus = %cpus.join(","), batch = shared.cfg.batch, "data plane workers started");
            Ok(())
        })();
        *dp.threads.lock().unwrap_or_else(|p| p.into_inner()) = threads;
        if let Err(e) = result {
            dp.shutdown();
            return Err(e);
        }
        Ok(dp)
    }

    /// Stops and joins the threads (idempotent). Sockets close when the last reference goes.
    pub fn shutdown(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.waker.wake();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            if t.join().is_err() {
                tracing::error!("a data plane thread panicked");
            }
        }
    }

    /// Where the sockets are bound.
    pub fn local_addrs(&self) -> BoundAddrs {
        let io = &self.shared.io;
        BoundAddrs {
            ike: io.listen.iter().map(|l| io.local_addr(l.ike)).collect(),
            natt: io.listen.iter().map(|l| io.local_addr(l.natt)).collect(),
            vxlan: io.vteps.iter().map(|v| io.local_addr(v.recv)).collect(),
            relay: self.relay_addr(),
        }
    }

    /// The tunnels bound now (id, name, tenant, inside): what per-tunnel figures are
    /// labelled with.
    pub fn tunnel_bindings(&self) -> Vec<datapath::TunnelBinding> {
        self.shared.registry().overlay().tunnels.clone()
    }

    /// Relay mode: the address the Geneve socket is bound to (with the kernel's port if 0
    /// was asked for); None outside relay mode. Also in [`local_addrs`](Self::local_addrs).
    pub fn relay_addr(&self) -> Option<SocketAddr> {
        let io = &self.shared.io;
        io.relay_sock.map(|s| io.local_addr(s))
    }

    /// True if the VTEPs receive VXLAN (not in relay mode, or with self-dispatch when the
    /// VTEP port was free at start): only then can `set_dispatch` take a table.
    pub fn vteps_receive(&self) -> bool {
        self.shared.io.vteps_receive
    }

    /// The gateway MAC the VNet with (current) configuration index `vnet` answers ARP/ND
    /// with.
    pub fn gateway_mac(&self, vnet: usize) -> Option<[u8; 6]> {
        self.shared
            .tables
            .load()
            .overlay
            .vnets
            .get(vnet)
            .map(|v| v.mac.0)
    }

    /// Relay mode: replaces the steer nodes' Geneve addresses at once. Frames are accepted
    /// from these addresses only, and encrypted output goes to the first of them, in this
    /// order, that sent a valid frame (traffic or health probe) within the last 50 ms, or to
    /// the first when none did (empty: it is dropped, counted as `relay_no_steer`). The new
    /// list keeps what was heard from the steer nodes it keeps. Errors: not in relay mode
    /// ([`DataplaneError::Unsupported`]), or an address that is not unicast, has port 0, is
    /// not of the Geneve socket's family or is listed twice ([`DataplaneError::Config`]
    /// naming `steer[i]`); nothing changes then.
    pub fn set_relays(&self, steer: Vec<SocketAddr>) -> Result<(), DataplaneError> {
        self.shared.set_relays(steer)
    }

    /// The steer nodes' Geneve addresses now in use (empty outside relay mode).
    pub fn relays(&self) -> Vec<SocketAddr> {
        self.shared
            .tables
            .load()
            .relays
            .as_deref()
            .map(|r| r.steer().to_vec())
            .unwrap_or_default()
    }

    /// Replaces the VNets and tunnel bindings, validated whole first (errors name the field,
    /// e.g. `vnets[1].vtep`, `tunnels[0].inside`; nothing changes then). A VNet's `vtep` must
    /// be one of the VTEPs opened at start (see [`BoundAddrs::vxlan`]; in relay mode
    /// [`RelayConfig::vtep`](crate::RelayConfig::vtep) is always one). VNets whose configuration and index are unchanged keep their
    /// neighbour caches. Installed CHILD_SAs follow their tunnel's new binding; those of
    /// tunnels no longer bound are removed at once.
    pub fn set_inside(
        &self,
        vnets: Vec<VnetConfig>,
        tunnels: Vec<TunnelBinding>,
    ) -> Result<(), DataplaneError> {
        self.shared.set_inside(vnets, tunnels)
    }

    /// Sets the CPU fairness mode and the tenants' weights (issue 18 §3, docs/architecture.md
    /// "CPU charge"): workers start or stop charging from their next batch. Turning
    /// it on calibrates the cycle counter once (about 20 ms, on the calling thread). Errors: a
    /// weight of 0 ([`DataplaneError::Config`], naming the tenant).
    pub fn set_cpu_fairness(
        &self,
        fairness: &datapath::CpuFairnessConfig,
    ) -> Result<(), DataplaneError> {
        if let Some((tenant, _)) = fairness.weights.iter().find(|(_, w)| *w == 0) {
            return Err(DataplaneError::Config {
                field: format!("cpu_weight of tenant {tenant}"),
                reason: "must be an integer from 1 to 65535".into(),
            });
        }
        if fairness.mode != datapath::CpuFairness::Off {
            if let Some(why) = crate::sys::tsc::unusable() {
                return Err(DataplaneError::Config {
                    field: "cpu_fairness".into(),
                    reason: why,
                });
            }
        }
        let params = match fairness.mode {
            datapath::CpuFairness::Off => None,
            _ => Some(
                crate::pipeline::charge::fair_params(crate::sys::tsc::cycles_per_ns()).map_err(
                    |e| DataplaneError::Config {
                        field: "cpu_fairness".into(),
                        reason: e.to_string(),
                    },
                )?,
            ),
        };
        let mut reg = self.shared.registry();
        reg.tenants().configure(fairness, params);
        self.shared.publish(&reg);
        tracing::info!(
            mode = fairness.mode.as_str(),
            weights = fairness.weights.len(),
            "CPU fairness set"
        );
        Ok(())
    }

    /// Replaces the tenants' eBPF filters (`[[filter]]`, issue 18): each program is loaded,
    /// verified and compiled for every worker first (an error names the filter and changes
    /// nothing), then it runs as its tenant's feature chain stage for its direction from the
    /// workers' next batch. Programs of one tenant from the same object share its maps, and
    /// maps whose declaration is unchanged keep their contents.
    pub fn set_filters(&self, filters: &[datapath::FilterConfig]) -> Result<(), DataplaneError> {
        self.shared.set_filters(filters)
    }

    /// The maps of `tenant`'s filters (`filter::run::Map`: lookup, update, delete and dump by
    /// bytes), each once however many of its programs share it; empty if it has none.
    pub fn filter_maps(&self, tenant: &ids::TenantId) -> Vec<std::sync::Arc<filter::run::Map>> {
        self.shared.filters().tenant_maps(tenant)
    }

    /// Relay mode: replaces the customers attached at L2 on the steer nodes' ports
    /// ([`AttachmentPort::Steer`](datapath::AttachmentPort::Steer)), validated whole first
    /// (errors name the field, e.g. `attachments[1].routes[0]`; nothing changes then). A CE
    /// MAC already known for an attachment of the same name, port and tags is kept unless
    /// the new configuration gives one. Workers use them from their next batch on. Outside
    /// relay mode: [`DataplaneError::Unsupported`] (local interfaces are opened at start).
    pub fn set_attachments(
        &self,
        attachments: Vec<datapath::AttachmentConfig>,
    ) -> Result<(), DataplaneError> {
        self.shared.set_attachments(attachments)
    }

    /// The attachments' CE MACs known here, (attachment, MAC), in configuration order.
    pub fn ce_macs(&self) -> Vec<(String, [u8; 6])> {
        let t = self.shared.tables.load();
        t.attach
            .table
            .list
            .iter()
            .filter_map(|a| Some((a.name.clone(), a.ce_mac()?.0)))
            .collect()
    }

    /// Sets the MAC of attachment `attachment`'s CE (learned by another data node); an
    /// unknown name or a MAC that is not unicast is refused ([`DataplaneError::Config`]).
    pub fn set_ce_mac(&self, attachment: &str, mac: [u8; 6]) -> Result<(), DataplaneError> {
        self.shared.set_ce_mac(attachment, mac)
    }

    /// Sets `tenant`'s feature chain for `direction` (an empty chain removes it): the stages
    /// every packet of the tenant's tunnels runs through, in order, after decryption
    /// (inbound) or before the CHILD_SA is chosen and the packet encrypted (outbound); see
    /// [`Feature`](crate::Feature). Workers use it from their next batch on. Each stage's drop
    /// reasons are added to [`DataplaneStats::drops`] as `<tenant>/<reason>` (a tenant's
    /// reason keeps its counter when chains are replaced). Errors: a drop reason that is one
    /// of the data plane's own or named twice in the chain ([`DataplaneError::Config`]);
    /// nothing changes then, no counter included. Not on the [`DataPath`](crate::DataPath)
    /// trait yet: the control plane configures no chain until the ACL and NAT stages arrive.
    pub fn set_feature_chain(
        &self,
        tenant: &ids::TenantId,
        direction: Direction,
        chain: FeatureChain,
    ) -> Result<(), DataplaneError> {
        self.shared.set_feature_chain(tenant, direction, chain)
    }

    /// Relay mode: sends an IKE message (or a NAT keepalive, the single byte 0xFF) from
    /// `local`, a steer node's VIP on the IKE or NAT-T port, to `remote`, wrapped for the
    /// steer node ESP goes through (see [`relays::Relays::output`]).
    fn send_relayed(
        &self,
        relay_sock: usize,
        local: SocketAddr,
        remote: SocketAddr,
        payload: &[u8],
    ) -> Result<(), DataplaneError> {
        let sh = &self.shared;
        let fail = |kind: io::ErrorKind, what: String| DataplaneError::Send {
            to: remote,
            source: io::Error::new(kind, what),
        };
        let marker = if local.port() == sh.cfg.natt_port {
            payload != [NAT_KEEPALIVE]
        } else if local.port() == sh.cfg.ike_port {
            false
        } else {
            return Err(fail(
                io::ErrorKind::AddrNotAvailable,
                format!("{local} is on neither the IKE nor the NAT-T port"),
            ));
        };
        // The same choice as the data path's (the relays are shared through the tables):
        // the first steer node heard from recently.
        let now = Instant::now();
        let Some(steer) = sh
            .tables
            .load()
            .relays
            .as_deref()
            .and_then(|r| r.output(now))
        else {
            return Err(fail(
                io::ErrorKind::NotConnected,
                "no steer node to relay through".into(),
            ));
        };
        let frame = relays::ike_frame(local, remote, marker, payload)
            .map_err(|e| fail(io::ErrorKind::InvalidInput, e.to_string()))?;
        sh.io
            .send_datagram(relay_sock, &frame, steer)
            .map_err(|source| DataplaneError::Send { to: steer, source })
    }
}

impl Drop for Dataplane {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl DataPath for Dataplane {
    fn install_child(&self, child: &ChildSaInfo) -> Result<(), DataplaneError> {
        self.shared.install_child(child)
    }

    fn remove_child(&self, tunnel: TunnelId, inbound_spi: EspSpi, outbound_spi: EspSpi) {
        self.shared.remove_child(tunnel, inbound_spi, outbound_spi);
    }

    fn update_peer(&self, tunnel: TunnelId, ike: IkeSpis, local: SocketAddr, remote: SocketAddr) {
        self.shared.update_peer(tunnel, ike, local, remote);
    }

    fn send_ike(
        &self,
        local: SocketAddr,
        remote: SocketAddr,
        payload: &[u8],
    ) -> Result<(), DataplaneError> {
        let sh = &self.shared;
        if let Some(relay_sock) = sh.io.relay_sock {
            return self.send_relayed(relay_sock, local, remote, payload);
        }
        let Some((sock, marker)) = sh.io.ike_sock(local) else {
            return Err(DataplaneError::Send {
                to: remote,
                source: io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    format!("no IKE socket on {local}"),
                ),
            });
        };
        // RFC 3948 §2.3: a NAT keepalive is the single octet 0xFF, without the marker.
        let result = if marker && payload != [NAT_KEEPALIVE] {
            // RFC 3948 §2.2: IKE on the NAT-T port is preceded by the 4-byte non-ESP marker.
            let mut buf = Vec::with_capacity(NON_ESP_MARKER.len() + payload.len());
            buf.extend_from_slice(&NON_ESP_MARKER);
            buf.extend_from_slice(payload);
            sh.io.send_datagram(sock, &buf, remote)
        } else {
            sh.io.send_datagram(sock, payload, remote)
        };
        result.map_err(|source| DataplaneError::Send { to: remote, source })
    }

    fn stats(&self) -> DataplaneStats {
        let sh = &self.shared;
        let tables = sh.tables.load();
        let tenants = &tables.tenants;
        let kernel_drops = sh.gate().map(|g| {
            (0..tenants.names.len())
                .map(|s| g.drops(s as TenantSlot))
                .sum::<u64>()
        });
        // The registry's lock only for taking the CHILD_SAs; their counters are read after.
        let counters = sh.registry().counters();
        let children = counters.children();
        let tunnels = counters.tunnels(&children);
        DataplaneStats {
            children,
            tunnels,
            workers: sh
                .worker_stats
                .iter()
                .zip(&sh.worker_cpus)
                .map(|(w, cpu)| WorkerStats {
                    cpu: *cpu,
                    packets: w.packets.load(Ordering::Relaxed),
                    batches: w.batches.load(Ordering::Relaxed),
                    busy_ns: w.busy_ns.load(Ordering::Relaxed),
                    spin_ns: w.spin_ns.load(Ordering::Relaxed),
                })
                .collect(),
            drops: {
                let mut d = sh.drops.snapshot();
                // The kernel gate's drops are fair-share drops too.
                if let Some((_, n)) = d
                    .iter_mut()
                    .find(|(r, _)| r == DropReason::FairShare.name())
                {
                    *n += kernel_drops.unwrap_or(0);
                }
                d.extend(sh.feature_drops.snapshot());
                d
            },
            relay_probes_answered: sh.relay_probes_answered.load(Ordering::Relaxed),
            tenants: tenant_stats(sh, tenants),
            cpu_unattributed_ns: crate::sys::tsc::to_ns(
                sh.worker_stats
                    .iter()
                    .map(|w| w.cpu_unattributed.load(Ordering::Relaxed))
                    .sum(),
            ),
            cpu_capped_phases: sh
                .worker_stats
                .iter()
                .map(|w| w.cpu_capped.load(Ordering::Relaxed))
                .sum(),
            cpu_preempted_ns: crate::sys::tsc::to_ns(
                sh.worker_stats
                    .iter()
                    .map(|w| w.cpu_preempted.load(Ordering::Relaxed))
                    .sum(),
            ),
            fair_kernel_drops: kernel_drops,
            xdp: sh.io.xdp_stats(),
            dispatch: sh
                .cfg
                .dispatch
                .as_ref()
                .map(|_| sh.dispatch_counters.stats(tables.dispatch.as_deref())),
        }
    }

    fn set_cpu_fairness(
        &self,
        fairness: &datapath::CpuFairnessConfig,
    ) -> Result<(), DataplaneError> {
        Dataplane::set_cpu_fairness(self, fairness)
    }

    fn set_filters(&self, filters: &[datapath::FilterConfig]) -> Result<(), DataplaneError> {
        Dataplane::set_filters(self, filters)
    }

    fn filter_report(&self, tenant: Option<&ids::TenantId>) -> datapath::FilterReport {
        self.shared.filters().report(tenant)
    }

    fn filter_map(
        &self,
        tenant: &ids::TenantId,
        map: &str,
        op: datapath::FilterMapOp,
    ) -> Result<datapath::FilterMapAnswer, DataplaneError> {
        self.shared.filters().map_op(tenant, map, op)
    }

    fn installed(&self) -> Vec<InstalledChild> {
        self.shared.registry().installed()
    }

    fn set_relays(&self, steer: Vec<SocketAddr>) -> Result<(), DataplaneError> {
        Dataplane::set_relays(self, steer)
    }

    fn set_dispatch(&self, dispatch: DispatchConfig) -> Result<(), DataplaneError> {
        self.shared.set_dispatch(&dispatch)
    }

    fn check_inside(
        &self,
        vnets: &[VnetConfig],
        tunnels: &[TunnelBinding],
    ) -> Result<(), DataplaneError> {
        self.shared.check_inside(vnets, tunnels)
    }

    fn set_inside(
        &self,
        vnets: Vec<VnetConfig>,
        tunnels: Vec<TunnelBinding>,
    ) -> Result<(), DataplaneError> {
        Dataplane::set_inside(self, vnets, tunnels)
    }

    fn set_attachments(
        &self,
        attachments: Vec<datapath::AttachmentConfig>,
    ) -> Result<(), DataplaneError> {
        Dataplane::set_attachments(self, attachments)
    }

    fn set_ce_mac(&self, attachment: &str, mac: [u8; 6]) -> Result<(), DataplaneError> {
        Dataplane::set_ce_mac(self, attachment, mac)
    }

    fn change_routes(&self, change: RouteChange) -> Result<RouteChangeReport, DataplaneError> {
        let started = Instant::now();
        let report = self.shared.routes().change(change)?;
        tracing::info!(
            added = report.added,
            replaced = report.replaced,
            removed = report.removed,
            skipped = report.skipped,
            elapsed_us = started.elapsed().as_micros() as u64,
            "per-VM routes changed"
        );
        Ok(report)
    }

    fn write_routes(&self, out: &mut dyn io::Write) -> Result<usize, DataplaneError> {
        self.shared.routes().write_snapshot(out)
    }

    fn route_stats(&self) -> RouteStats {
        // Not from the writer: its lock is held for the whole of a bulk load.
        RouteStats::clone(&self.shared.route_readers.stats())
    }
}

/// The tenants' CPU counters, in name order; none while nothing was ever charged (fairness
/// off from the start: no calibration is run for an empty list).
fn tenant_stats(
    sh: &Shared,
    t: &crate::pipeline::charge::TenantTable,
) -> Vec<datapath::TenantStats> {
    // Enforcing: each tenant's tokens summed over the workers.
    let tokens = t.params.map(|_| {
        let mut sum = vec![0i64; t.names.len()];
        for w in &sh.worker_stats {
            let w = w.tokens.lock().unwrap_or_else(|p| p.into_inner());
            for (s, v) in sum.iter_mut().zip(w.iter()) {
                *s = s.saturating_add(*v);
            }
        }
        sum
    });
    let ns = |cycles: i64| {
        let n = crate::sys::tsc::to_ns(cycles.unsigned_abs()) as i64;
        if cycles < 0 {
            -n
        } else {
            n
        }
    };
    let charged = t
        .counters
        .iter()
        .any(|c| c.packets.load(Ordering::Relaxed) != 0 || c.cycles.load(Ordering::Relaxed) != 0);
    if t.mode == datapath::CpuFairness::Off && !charged {
        return Vec::new();
    }
    let recent = sh
        .recent_cpu
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .recent(std::time::Instant::now(), &t.counters);
    let mut v: Vec<datapath::TenantStats> = t
        .names
        .iter()
        .zip(&t.counters)
        .zip(&t.weights)
        .enumerate()
        .map(|(slot, ((name, c), &w))| datapath::TenantStats {
            tenant: name.clone(),
            cpu_weight: w,
            cpu_ns: crate::sys::tsc::to_ns(c.cycles.load(Ordering::Relaxed)),
            packets: c.packets.load(Ordering::Relaxed),
            fair_drops: c.fair_drops.load(Ordering::Relaxed)
                + sh.gate().map_or(0, |g| g.drops(slot as TenantSlot)),
            tokens_ns: tokens
                .as_ref()
                .and_then(|v| v.get(slot))
                .map(|&cycles| ns(cycles)),
            recent_cpu_ns: crate::sys::tsc::to_ns(recent.get(slot).copied().unwrap_or(0)),
        })
        .collect();
    v.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    v
}
