//! The steer nodes' side: the relay list data nodes send through, the data nodes and
//! selectors steer nodes forward by, whole tables, and each steer node's shares of the
//! tunnels' rate limits.

use super::{
    Await, ClusterCore, Directive, Role, ShareAck, SteerNodes, SteerTables, SteerTarget,
    SteeredSelector, VniSelectors,
};
use std::net::SocketAddr;
use std::time::Instant;

impl ClusterCore {
    /// The steer nodes' Geneve addresses for the data nodes: live ones first, then those
    /// whose session ended (their forwarding may be fine; a data node sends to the first).
    pub fn relays(&self) -> Vec<SocketAddr> {
        let steer = |alive: bool| {
            self.nodes
                .values()
                .filter(move |n| n.role == Role::Steer && n.alive == alive)
                .map(|n| n.geneve)
        };
        steer(true).chain(steer(false)).collect()
    }

    /// The data nodes the steer nodes forward to and probe: every one with an open
    /// session, including those the probes declared dead (so the probes notice when they
    /// answer again; the steer node does not forward to a node its probes hold dead).
    pub fn steer_nodes(&self) -> SteerNodes {
        SteerNodes {
            data: self
                .nodes
                .iter()
                .filter(|(_, n)| n.role == Role::Data && (n.alive || n.session_open))
                .map(|(id, n)| SteerTarget {
                    node: *id,
                    name: n.name.clone(),
                    geneve: n.geneve,
                })
                .collect(),
            control: self.geneve,
        }
    }

    /// The selectors of one VNI: every tunnel of the VNI whose sending CHILD_SA is placed,
    /// each of its (local, remote) selector pairs steered to that SA's node.
    pub fn vni_selectors(&self, vni: u32) -> VniSelectors {
        let mut selectors = Vec::new();
        for c in self.children.values().filter(|c| c.sending) {
            let Some(node) = c.node else { continue };
            if self.tunnels.get(&c.tunnel).and_then(|t| t.vni) != Some(vni) {
                continue;
            }
            for l in &c.local_ts {
                for r in &c.remote_ts {
                    selectors.push(SteeredSelector {
                        tunnel: c.tunnel,
                        node,
                        local: *l,
                        remote: *r,
                    });
                }
            }
        }
        let neighbour_nodes = self.live_data_nodes();
        VniSelectors {
            vni,
            attachments: self.attachment_routes(vni),
            selectors,
            neighbour_nodes,
            gateway_ips: self.gateways.get(&vni).cloned().unwrap_or_default(),
        }
    }

    /// The VNIs of the configured tunnels and attachments.
    pub(crate) fn vnis(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .tunnels
            .values()
            .filter_map(|t| t.vni)
            .chain(self.attachment_vnis())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Every VNI's selectors, one directive each.
    pub(crate) fn all_vni_directives(&self) -> Vec<Directive> {
        self.vnis()
            .into_iter()
            .map(|v| Directive::SetSelectors(self.vni_selectors(v)))
            .collect()
    }

    /// The directive that steers `tunnel`'s outbound traffic (its VNI's selectors), if it
    /// has a VNI.
    pub(crate) fn tunnel_selectors(&self, tunnel: ike::TunnelId) -> Option<Directive> {
        let vni = self.tunnels.get(&tunnel).and_then(|t| t.vni)?;
        Some(Directive::SetSelectors(self.vni_selectors(vni)))
    }

    /// The limited tunnels and their limits, bit/s.
    pub(crate) fn tunnel_limits(&self) -> Vec<(steer::TunnelId, u64)> {
        self.tunnels
            .values()
            .filter_map(|t| Some((t.id, u64::from(t.rate_limit_mbit?) * 1_000_000)))
            .collect()
    }

    /// Moves the steer nodes' shares toward the division: each live steer node but `except`
    /// (whose whole tables are on their way) gets its changed shares in one directive, nodes
    /// with a lowered share first. Nothing before the control loop reconciled (the nodes
    /// keep what they have).
    pub(crate) fn rebalance(&mut self, now: Instant, except: Option<u32>) {
        if !self.reconciled {
            return;
        }
        let limits = self.tunnel_limits();
        let batches = self.shares.update(&limits, now);
        for (node, shares) in batches {
            if Some(node.0) == except
                || !self
                    .nodes
                    .get(&node.0)
                    .is_some_and(|n| n.alive && n.role == Role::Steer)
            {
                continue;
            }
            self.send_shares(node.0, shares);
        }
    }

    /// Queues `shares` to steer node `node`, keeping their answer pending: one
    /// [`Directive::SetShares`], or per tunnel a [`Directive::SetShare`] to a steer node
    /// that predates the division.
    fn send_shares(&mut self, node: u32, shares: Vec<(steer::TunnelId, steer::Share)>) {
        if shares.is_empty() {
            return;
        }
        let batches: Vec<(Vec<(steer::TunnelId, steer::Share)>, Directive)> =
            if self.shares.legacy(steer::NodeId(node)) {
                shares
                    .into_iter()
                    .map(|(t, s)| (vec![(t, s)], Directive::SetShare(t, s)))
                    .collect()
            } else {
                vec![(shares.clone(), Directive::SetShares(shares))]
            };
        for (shares, directive) in batches {
            let token = self.token();
            self.share_acks.push(ShareAck {
                node,
                shares,
                token,
            });
            self.emit(node, directive, Await::Shares(token));
        }
    }

    /// Queues whole `tables` to steer node `id`, keeping the answer pending (it confirms the
    /// shares they carry): waited for by the caller if `resync`, else polled.
    pub(crate) fn send_tables(&mut self, id: u32, tables: SteerTables, resync: bool) {
        let token = self.token();
        self.share_acks.push(ShareAck {
            node: id,
            shares: tables.limits.clone(),
            token,
        });
        let wait = if resync {
            Await::Resync(token)
        } else {
            Await::Shares(token)
        };
        self.emit(id, Directive::SteerTables(Box::new(tables)), wait);
    }

    /// The tunnels' limits at steer node `node`: its shares as last sent (a node outside the
    /// division, which never gets tables, would get the floor).
    pub fn limits(&self, node: u32) -> Vec<(steer::TunnelId, steer::Share)> {
        self.tunnel_limits()
            .into_iter()
            .map(|(tunnel, bps)| {
                let share = self
                    .shares
                    .sent(steer::NodeId(node), tunnel)
                    .unwrap_or_else(|| steer::Share {
                        limit: self.shares.outsider_share(bps),
                        fallback_bits_per_second: 0,
                    });
                (tunnel, share)
            })
            .collect()
    }

    /// The whole steering state of steer node `node` (the tables are the same for every
    /// steer node, but the rate limits are its shares and the port tags those of its own
    /// ports), including the SPIs of removed CHILD_SAs
    /// still in their grace.
    pub fn steer_tables(&self, node: u32) -> SteerTables {
        let mut spis: Vec<(wire::EspSpi, u32, ike::TunnelId)> = self
            .children
            .iter()
            .filter_map(|(spi, c)| Some((*spi, c.node?, c.tunnel)))
            .chain(
                self.retiring
                    .iter()
                    .filter_map(|r| Some((r.spi, r.node?, r.tunnel))),
            )
            .collect();
        spis.sort_by_key(|s| s.0);
        spis.dedup_by_key(|s| s.0);
        let vnis = self
            .vnis()
            .into_iter()
            .map(|v| self.vni_selectors(v))
            .collect();
        SteerTables {
            nodes: self.steer_nodes(),
            spis,
            vnis,
            limits: self.limits(node),
            attachments: self.steer_attachments(node),
        }
    }

    /// Queues the whole tables to every live steer node (each with its shares of the limits).
    pub(crate) fn push_tables(&mut self, now: Instant) {
        // The shares move with the tables, which carry each node's.
        let limits = self.tunnel_limits();
        let _carried = self.shares.update(&limits, now);
        for id in self.live_steers() {
            let tables = self.steer_tables(id);
            self.send_tables(id, tables, false);
        }
    }

    /// Queues the relay list to every live data node and the IKE relay (never an empty list:
    /// a data node keeps the last one).
    pub(crate) fn push_relays(&mut self) {
        self.outbox.ike_steers = Some(self.steer_addrs());
        let relays = self.relays();
        if relays.is_empty() {
            return;
        }
        self.fire_data_nodes(&Directive::Relays(relays));
    }
}
