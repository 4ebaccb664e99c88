//! Self-dispatch's table as the packet path reads it (issue 19 §1, docs/architecture.md
//! "Self-dispatch"): per dispatched VNet, its virtual MACs ([`dispatch::VmacSpace`]), which
//! data node owns each, and which of them are this node's. Part of the published tables, so
//! [`DataPath::set_dispatch`](crate::DataPath::set_dispatch) replaces it while the workers
//! run: a batch sees the old or the new owners, never a mix.
//!
//! What the stages do with it:
//! - decap: a frame to one of this node's virtual MACs is the gateway's, like one to the
//!   gateway MAC; a frame to another node's is sent on to that node unchanged (VXLAN to its
//!   VTEP), once: a frame that arrives from a data node is never sent on again;
//! - encap: an ARP request or neighbour solicitation for the gateway is answered only by the
//!   owner of `h(requester's MAC)`, with that virtual MAC; a packet delivered to a VM leaves
//!   from `h(VM's MAC)` when this node owns it (Algorithm 2, step 3), so the host's learning
//!   only ever points a virtual MAC at its owner;
//! - housekeeping: every owned virtual MAC is announced to the VNet's hosts every
//!   `announce_interval` and as soon as the node gains it (Algorithm 3).

use datapath::{DataplaneError, DispatchConfig};
use dispatch::VmacSpace;
use rustc_hash::FxHashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::ethernet::EthernetAddress;
use wire::vxlan::Vni;

/// The shortest `announce_interval` accepted: each round sends one frame per owned virtual
/// MAC and host.
pub(crate) const MIN_ANNOUNCE: Duration = Duration::from_millis(100);

/// The EtherType of announcement frames: IEEE 802's "local experimental" type, which hosts'
/// stacks ignore. An announcement goes from a virtual MAC to itself: the host's VXLAN device
/// learns where the virtual MAC lives, and its bridge, which has (or now learns) that MAC on
/// the VXLAN port the frame came in on, delivers it to no VM.
pub(crate) const ANNOUNCE_ETHERTYPE: u16 = 0x88b5;

/// The MAC a data node's frames come from when they come from none of its virtual MACs: its
/// requests to resolve VMs (sent as probes, so a VM's entry for the gateway stays the virtual
/// MAC it was given) and deliveries to VMs whose virtual MAC another node owns.
/// `02:50:48` and 24 bits of a hash of the node's VTEP address: distinct from the VNets'
/// gateway MACs (`02:50:47`) and virtual MACs, and each node's own, so that a host learns it
/// at that node and a VM's answer reaches the node that asked.
pub(crate) fn node_mac(vtep: IpAddr) -> EthernetAddress {
    let bytes = match vtep {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    };
    // SplitMix64's finalizer over both halves.
    let mut x = (bytes as u64) ^ ((bytes >> 64) as u64).rotate_left(32);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    let b = x.to_be_bytes();
    EthernetAddress([0x02, 0x50, 0x48, b[5], b[6], b[7]])
}

/// One VNet's virtual MACs and their owners.
#[derive(Debug)]
pub(crate) struct Share {
    space: VmacSpace,
    /// The data nodes' VTEP addresses.
    nodes: Vec<IpAddr>,
    /// Per virtual MAC index: its owner's index in `nodes`.
    owners: Vec<u16>,
    /// This node's index in `nodes` (None: it owns none of the VNet's virtual MACs).
    me: Option<u16>,
    /// Per virtual MAC index: the frames to it this node processed (cumulative, kept across
    /// tables of the same VNet and `K`): each virtual MAC's load, for the ring's choice of
    /// which to hand over.
    packets: Arc<[AtomicU64]>,
}

impl Share {
    /// Whether this node owns the virtual MAC of `index`.
    #[inline]
    pub(crate) fn owns(&self, index: u16) -> bool {
        self.me
            .is_some_and(|m| self.owners.get(usize::from(index)) == Some(&m))
    }

    /// The VTEP address of the node that owns the virtual MAC of `index`.
    pub(crate) fn owner(&self, index: u16) -> Option<IpAddr> {
        let o = *self.owners.get(usize::from(index))?;
        self.nodes.get(usize::from(o)).copied()
    }

    /// Whether `ip` is a data node's VTEP (other than this node's).
    pub(crate) fn is_other_node(&self, ip: IpAddr) -> bool {
        self.nodes
            .iter()
            .enumerate()
            .any(|(i, n)| *n == ip && self.me != Some(i as u16))
    }

    /// The index of `mac` if it is one of the VNet's virtual MACs.
    #[inline]
    pub(crate) fn index_of(&self, mac: EthernetAddress) -> Option<u16> {
        self.space.index_of(mac.0)
    }

    /// `h(vm)`: the index of the virtual MAC that serves the VM whose MAC is `vm`.
    #[inline]
    pub(crate) fn assign(&self, vm: [u8; 6]) -> u16 {
        self.space.assign(vm)
    }

    /// The virtual MAC of `index`.
    pub(crate) fn mac(&self, index: u16) -> EthernetAddress {
        EthernetAddress(self.space.mac(index))
    }

    /// The virtual MAC this node answers or sends with for the VM whose MAC is `vm`: `h(vm)`
    /// if this node owns it.
    #[inline]
    pub(crate) fn own_vmac_for(&self, vm: [u8; 6]) -> Option<EthernetAddress> {
        let i = self.assign(vm);
        self.owns(i).then(|| self.mac(i))
    }

    /// Counts a frame to virtual MAC `index` that this node processes.
    #[inline]
    pub(crate) fn count(&self, index: u16) {
        if let Some(c) = self.packets.get(usize::from(index)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The indices of the virtual MACs this node owns.
    pub(crate) fn owned(&self) -> impl Iterator<Item = u16> + '_ {
        let me = self.me;
        self.owners
            .iter()
            .enumerate()
            .filter(move |(_, o)| Some(**o) == me)
            // Fewer than 2^16 virtual MACs.
            .map(|(i, _)| i as u16)
    }
}

/// The whole table: the dispatched VNets by VNI.
#[derive(Debug)]
pub(crate) struct Dispatch {
    shares: FxHashMap<Vni, Share>,
    /// Algorithm 3's period.
    pub(crate) announce_interval: Duration,
    /// Virtual MACs this node gained and still owns, with the generation of the table that
    /// gave each: the next housekeeping round announces those newer than the last it
    /// announced, also when several tables came in between.
    pub(crate) gained: Vec<(Vni, u16, u64)>,
    /// Numbers the tables in the order they were built (the housekeeping announces each
    /// table's `gained` once).
    pub(crate) generation: u64,
    /// Virtual MACs this node gave away: it sends their frames on to the new owner while the
    /// hosts still send them here ([`Released`]).
    released: FxHashMap<(Vni, u16), Released>,
    /// How long after the hand-over, and after the last frame sent on, it keeps doing so.
    linger: Duration,
}

/// A virtual MAC this node gave away. Its frames are sent on to the new owner until `linger`
/// has passed both since the hand-over and since the last such frame: until the hosts have
/// moved. A fixed time would not do: the hosts move when the new owner announces the virtual
/// MAC, and this node may have refreshed their entries once more while it still owned it (its
/// periodic announcement, during a hand-over), so they may move only at the new owner's next
/// periodic announcement, up to `announce_interval` later.
#[derive(Debug)]
struct Released {
    /// When it was given away.
    since: Instant,
    /// The last frame sent on, in nanoseconds after `since` (0: none yet). Written by every
    /// worker that sends one on.
    last: AtomicU64,
}

impl Released {
    fn new(since: Instant) -> Self {
        Self {
            since,
            last: AtomicU64::new(0),
        }
    }

    /// Until when its frames are sent on.
    fn until(&self, linger: Duration) -> Instant {
        self.since + Duration::from_nanos(self.last.load(Ordering::Relaxed)) + linger
    }
}

/// What self-dispatch did, shared by the workers (see [`datapath::DispatchStats`]).
#[derive(Debug, Default)]
pub(crate) struct DispatchCounters {
    pub(crate) answered: AtomicU64,
    pub(crate) left_to_owner: AtomicU64,
    pub(crate) forwarded: AtomicU64,
    pub(crate) announced: AtomicU64,
}

impl DispatchCounters {
    /// Counts `n` more in `counter`.
    #[inline]
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters as the statistics give them, with what the table in use owns and
    /// counted.
    pub(crate) fn stats(&self, table: Option<&Dispatch>) -> datapath::DispatchStats {
        datapath::DispatchStats {
            owned: table.map_or(0, Dispatch::owned),
            vmac_packets: table.map(Dispatch::packets).unwrap_or_default(),
            answered: self.answered.load(Ordering::Relaxed),
            left_to_owner: self.left_to_owner.load(Ordering::Relaxed),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            announced: self.announced.load(Ordering::Relaxed),
        }
    }
}

fn config_err(field: impl Into<String>, reason: impl Into<String>) -> DataplaneError {
    DataplaneError::Config {
        field: field.into(),
        reason: reason.into(),
    }
}

impl Dispatch {
    /// Validates `cfg` whole (errors name the field, e.g. `dispatch.vnets[1].owners`) and
    /// builds the table of a node whose VTEPs are `local`; `previous` (the table it
    /// replaces) decides what is gained.
    pub(crate) fn build(
        cfg: &DispatchConfig,
        local: &[IpAddr],
        previous: Option<&Dispatch>,
        now: Instant,
    ) -> Result<Self, DataplaneError> {
        if cfg.announce_interval < MIN_ANNOUNCE {
            return Err(config_err(
                "dispatch.announce_interval",
                format!(
                    "{:?} is shorter than the {MIN_ANNOUNCE:?} an announcement round may repeat at",
                    cfg.announce_interval
                ),
            ));
        }
        let mut shares = FxHashMap::default();
        for (i, v) in cfg.vnets.iter().enumerate() {
            let field = |f: &str| format!("dispatch.vnets[{i}].{f}");
            let Some(vni) = Vni::new(v.vni) else {
                return Err(config_err(
                    field("vni"),
                    format!("{} does not fit in 24 bits", v.vni),
                ));
            };
            let space = VmacSpace::new(v.vni, cfg.vmacs)
                .map_err(|e| config_err("dispatch.vmacs", e.to_string()))?;
            if v.nodes.is_empty() || v.nodes.len() > usize::from(u16::MAX) {
                return Err(config_err(
                    field("nodes"),
                    format!("{} nodes: between 1 and {}", v.nodes.len(), u16::MAX),
                ));
            }
            for (n, ip) in v.nodes.iter().enumerate() {
                if ip.is_unspecified() || ip.is_multicast() {
                    return Err(config_err(
                        field(&format!("nodes[{n}]")),
                        format!("{ip} is not a unicast address"),
                    ));
                }
                if v.nodes[..n].contains(ip) {
                    return Err(config_err(
                        field(&format!("nodes[{n}]")),
                        format!("{ip} is listed twice"),
                    ));
                }
            }
            if v.owners.len() != space.len() as usize {
                return Err(config_err(
                    field("owners"),
                    format!(
                        "{} owners for {} virtual MACs: one per virtual MAC",
                        v.owners.len(),
                        space.len()
                    ),
                ));
            }
            if let Some((x, o)) = v
                .owners
                .iter()
                .enumerate()
                .find(|(_, o)| usize::from(**o) >= v.nodes.len())
            {
                return Err(config_err(
                    field(&format!("owners[{x}]")),
                    format!("node {o} does not exist ({} nodes)", v.nodes.len()),
                ));
            }
            let mine: Vec<usize> = (0..v.nodes.len())
                .filter(|&n| local.contains(&v.nodes[n]))
                .collect();
            if mine.len() > 1 {
                return Err(config_err(
                    field("nodes"),
                    "lists two of this node's VTEP addresses",
                ));
            }
            let packets = previous
                .and_then(|p| p.share(vni))
                .filter(|b| b.space == space)
                .map_or_else(
                    || (0..space.len()).map(|_| AtomicU64::new(0)).collect(),
                    |b| Arc::clone(&b.packets),
                );
            let share = Share {
                space,
                nodes: v.nodes.clone(),
                owners: v.owners.clone(),
                // At most 2^16 - 1 nodes.
                me: mine.first().map(|&n| n as u16),
                packets,
            };
            if shares.insert(vni, share).is_some() {
                return Err(config_err(
                    field("vni"),
                    format!("VNI {} is listed twice", v.vni),
                ));
            }
        }
        let generation = previous.map_or(1, |p| p.generation + 1);
        let owns = |vni: Vni, i: u16| shares.get(&vni).is_some_and(|s| s.owns(i));
        let mut gained: Vec<(Vni, u16, u64)> = previous
            .map(|p| {
                p.gained
                    .iter()
                    .copied()
                    .filter(|&(vni, i, _)| {
                        owns(vni, i)
                            && p.share(vni).map(|b| b.space) == shares.get(&vni).map(|s| s.space)
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (vni, share) in &shares {
            let before = previous.and_then(|p| p.share(*vni));
            for i in share.owned() {
                let had = before.is_some_and(|b| b.space == share.space && b.owns(i));
                if !had {
                    gained.push((*vni, i, generation));
                }
            }
        }
        gained.sort_unstable_by_key(|(v, i, _)| (v.get(), *i));
        let mut released = FxHashMap::default();
        if let Some(p) = previous {
            for (&(vni, i), r) in &p.released {
                if r.until(p.linger) > now && !owns(vni, i) {
                    let carried = Released::new(r.since);
                    carried
                        .last
                        .store(r.last.load(Ordering::Relaxed), Ordering::Relaxed);
                    released.insert((vni, i), carried);
                }
            }
            for (&vni, before) in &p.shares {
                for i in before.owned().filter(|&i| !owns(vni, i)) {
                    released.insert((vni, i), Released::new(now));
                }
            }
        }
        Ok(Self {
            shares,
            announce_interval: cfg.announce_interval,
            gained,
            generation,
            released,
            linger: cfg.linger,
        })
    }

    /// The share of VNI `vni`, if that VNet is dispatched.
    #[inline]
    pub(crate) fn share(&self, vni: Vni) -> Option<&Share> {
        self.shares.get(&vni)
    }

    /// Whether this node sends on a frame for virtual MAC `index` of `vni` arriving at `now`
    /// (it gave the virtual MAC away, and less than `linger` passed since then or since the
    /// last such frame); if so, the frame counts as the last one.
    pub(crate) fn lingers(&self, vni: Vni, index: u16, now: Instant) -> bool {
        if self.released.is_empty() {
            return false;
        }
        let Some(r) = self.released.get(&(vni, index)) else {
            return false;
        };
        if r.until(self.linger) <= now {
            return false;
        }
        let after =
            u64::try_from(now.saturating_duration_since(r.since).as_nanos()).unwrap_or(u64::MAX);
        // Written at most about once a millisecond: every worker sends such frames on.
        if after > r.last.load(Ordering::Relaxed).saturating_add(1_000_000) {
            r.last.fetch_max(after, Ordering::Relaxed);
        }
        true
    }

    /// The frames each virtual MAC this node owns received (cumulative): (VNI, index,
    /// frames), those with any, in VNI and index order.
    pub(crate) fn packets(&self) -> Vec<(u32, u16, u64)> {
        let mut v: Vec<(u32, u16, u64)> = self
            .shares
            .iter()
            .flat_map(|(vni, s)| {
                s.owned().filter_map(move |i| {
                    let n = s.packets[usize::from(i)].load(Ordering::Relaxed);
                    (n > 0).then_some((vni.get(), i, n))
                })
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Virtual MACs this node owns, over every dispatched VNet.
    pub(crate) fn owned(&self) -> u64 {
        self.shares.values().map(|s| s.owned().count() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datapath::VnetOwners;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn cfg(owners: Vec<u16>) -> DispatchConfig {
        DispatchConfig {
            vmacs: owners.len() as u32,
            announce_interval: Duration::from_secs(30),
            linger: Duration::from_secs(5),
            vnets: vec![VnetOwners {
                vni: 100,
                nodes: vec![ip("192.0.2.1"), ip("192.0.2.2")],
                owners,
            }],
        }
    }

    fn now() -> Instant {
        Instant::now()
    }

    fn vni() -> Vni {
        Vni::new(100).expect("vni")
    }

    #[test]
    fn a_node_owns_what_the_table_gives_its_vtep() {
        let d =
            Dispatch::build(&cfg(vec![0, 1, 1, 0]), &[ip("192.0.2.2")], None, now()).expect("ok");
        let s = d.share(vni()).expect("share");
        assert_eq!(s.owned().collect::<Vec<_>>(), vec![1, 2]);
        assert!(s.owns(1) && !s.owns(0) && !s.owns(9));
        assert_eq!(s.owner(0), Some(ip("192.0.2.1")));
        assert!(s.is_other_node(ip("192.0.2.1")) && !s.is_other_node(ip("192.0.2.2")));
        assert_eq!(d.owned(), 2);
        assert_eq!(d.gained, vec![(vni(), 1, 1), (vni(), 2, 1)]);
        // A VM's virtual MAC is offered only by its owner.
        let vm = (0..=255u8)
            .map(|b| [0x52, 0x54, 0, 0, 0, b])
            .find(|m| s.assign(*m) == 1)
            .expect("a VM hashed to index 1");
        assert_eq!(s.own_vmac_for(vm), Some(s.mac(1)));
        let other =
            Dispatch::build(&cfg(vec![0, 1, 1, 0]), &[ip("192.0.2.1")], None, now()).expect("ok");
        assert_eq!(other.share(vni()).expect("share").own_vmac_for(vm), None);
        // A node outside the list owns nothing.
        let outside =
            Dispatch::build(&cfg(vec![0, 1, 1, 0]), &[ip("192.0.2.9")], None, now()).expect("ok");
        assert_eq!(outside.owned(), 0);
    }

    #[test]
    fn only_what_a_new_table_adds_is_gained() {
        let me = [ip("192.0.2.2")];
        let t0 = now();
        let first = Dispatch::build(&cfg(vec![0, 1, 1, 0]), &me, None, t0).expect("ok");
        let second = Dispatch::build(&cfg(vec![1, 1, 0, 0]), &me, Some(&first), t0).expect("ok");
        // Index 0 is new; index 1, gained with the first table, is carried with its
        // generation (the housekeeping announces what is newer than it last announced).
        assert_eq!(second.gained, vec![(vni(), 0, 2), (vni(), 1, 1)]);
        assert_eq!(second.generation, first.generation + 1);
        // What it gave away (index 2) it sends on for `linger` (5 s) after the hand-over and
        // after the last frame it sent on: frames 4 s apart keep it going, a gap of `linger`
        // ends it.
        assert!(!second.lingers(vni(), 3, t0), "never its own");
        assert!(second.lingers(vni(), 2, t0 + Duration::from_secs(4)));
        assert!(second.lingers(vni(), 2, t0 + Duration::from_secs(8)));
        // A later table carries it on, with its last frame, unless the MAC came back.
        let t1 = t0 + Duration::from_secs(9);
        let third = Dispatch::build(&cfg(vec![1, 1, 0, 0]), &me, Some(&second), t1).expect("ok");
        assert!(third.lingers(vni(), 2, t0 + Duration::from_secs(12)));
        assert!(!third.lingers(vni(), 2, t0 + Duration::from_secs(17)));
        assert!(
            !third.lingers(vni(), 2, t0 + Duration::from_secs(18)),
            "ended"
        );
        let quiet = Dispatch::build(&cfg(vec![1, 1, 0, 0]), &me, Some(&second), t0).expect("ok");
        let back = Dispatch::build(&cfg(vec![1, 1, 1, 0]), &me, Some(&quiet), t1).expect("ok");
        assert!(!back.lingers(vni(), 2, t1));
        assert!(back.gained.contains(&(vni(), 2, back.generation)));
        // Without a frame it ends `linger` after the hand-over.
        let fresh = Dispatch::build(&cfg(vec![1, 1, 0, 0]), &me, Some(&first), t0).expect("ok");
        assert!(!fresh.lingers(vni(), 2, t0 + Duration::from_secs(5)));
    }

    #[test]
    fn bad_tables_are_refused_naming_the_field() {
        let me = [ip("192.0.2.1")];
        let err = |c: &DispatchConfig| match Dispatch::build(c, &me, None, now()) {
            Err(DataplaneError::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(err(&cfg(vec![])), "dispatch.vmacs");
        assert_eq!(err(&cfg(vec![0, 2])), "dispatch.vnets[0].owners[1]");
        let mut c = cfg(vec![0, 1]);
        c.vnets[0].owners.pop();
        assert_eq!(err(&c), "dispatch.vnets[0].owners");
        let mut c = cfg(vec![0, 1]);
        c.vnets[0].nodes[1] = c.vnets[0].nodes[0];
        assert_eq!(err(&c), "dispatch.vnets[0].nodes[1]");
        let mut c = cfg(vec![0, 1]);
        c.vnets.push(c.vnets[0].clone());
        assert_eq!(err(&c), "dispatch.vnets[1].vni");
        let mut c = cfg(vec![0, 1]);
        c.vnets[0].vni = 1 << 24;
        assert_eq!(err(&c), "dispatch.vnets[0].vni");
        let mut c = cfg(vec![0, 1]);
        c.announce_interval = Duration::from_millis(10);
        assert_eq!(err(&c), "dispatch.announce_interval");
        let mut c = cfg(vec![0, 1]);
        c.vnets[0].nodes.clear();
        assert_eq!(err(&c), "dispatch.vnets[0].nodes");
        let both = [ip("192.0.2.1"), ip("192.0.2.2")];
        assert!(matches!(
            Dispatch::build(&cfg(vec![0, 1]), &both, None, now()),
            Err(DataplaneError::Config { .. })
        ));
    }
}
