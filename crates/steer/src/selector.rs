//! The outbound steering table: (VNI, inner flow) → tunnel and data node (the paper's GEN,
//! §4.3 "Traffic forwarding": "GEN simply uses the traffic selector, an ACL (Access Control
//! List)-like filter exchanged when GMN negotiates CHILD SAs"; §6.1).
//!
//! A VXLAN packet from a cloud host carries a VNI and an inner IP packet. Per VNI the table
//! holds an ordered list of [`SelectorEntry`]s, each the outbound selector of one CHILD_SA
//! (destination = the remote traffic selector, on-premises; source = the local one, the
//! VNet) with its tunnel and the data node holding the SA, or one prefix behind a customer's
//! edge router attached at L2 (issue 16) with the data node serving the attachment.
//!
//! **Priority.** A lookup returns the *first* entry of the VNI's list, in the order the list
//! was given to [`SelectorTable::set_vni`], whose selector matches the flow, like the ordered
//! SPD of RFC 4301 §4.4.1 ("the SPD is an ordered database"). The control node orders the
//! list (e.g. narrower selectors first).
//!
//! **Updates** replace one VNI's whole list ([`SelectorTable::set_vni`]) and rebuild only that
//! VNI's index, off the packet path. Each VNI's list and index sit behind an `Arc`, so cloning
//! the table (the next snapshot the I/O layer swaps in) copies one pointer per VNI.
//!
//! **Index** (module `index`): faster than a linear scan for many tunnels per VNI, same
//! answer. See [`IndexStats`] for what was built.

mod index;

use rustc_hash::FxHashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;
pub use wire::flow::Flow;
use wire::flow::Ports;
use wire::ike::TrafficSelector;
use wire::vxlan::Vni;

use crate::error::SteerError;
use crate::ids::{NodeId, TunnelId};

use index::VniIndex;

/// An inclusive range of IPv4 or IPv6 addresses, valid by construction (one family, start not
/// above end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddrRange(Range);

/// The integer form of an [`AddrRange`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Range {
    V4(u32, u32),
    V6(u128, u128),
}

impl AddrRange {
    /// Every IPv4 address.
    pub const V4_ANY: Self = Self(Range::V4(0, u32::MAX));
    /// Every IPv6 address.
    pub const V6_ANY: Self = Self(Range::V6(0, u128::MAX));

    /// The addresses `start..=end`; both of one family, `start <= end`.
    pub fn new(start: IpAddr, end: IpAddr) -> Result<Self, SteerError> {
        let range = match (start, end) {
            (IpAddr::V4(s), IpAddr::V4(e)) => Range::V4(u32::from(s), u32::from(e)),
            (IpAddr::V6(s), IpAddr::V6(e)) => Range::V6(u128::from(s), u128::from(e)),
            _ => return Err(SteerError::AddressFamilyMismatch { start, end }),
        };
        let inverted = match range {
            Range::V4(s, e) => s > e,
            Range::V6(s, e) => s > e,
        };
        if inverted {
            return Err(SteerError::InvertedAddressRange { start, end });
        }
        Ok(Self(range))
    }

    /// The addresses of the prefix `addr/len` (host bits of `addr` are ignored).
    pub fn prefix(addr: IpAddr, len: u8) -> Result<Self, SteerError> {
        let net = IpNet::new(addr, len).map_err(|_| SteerError::InvalidPrefix { addr, len })?;
        Self::new(net.network(), net.broadcast())
    }

    /// A single address.
    pub fn host(addr: IpAddr) -> Self {
        match addr {
            IpAddr::V4(a) => Self(Range::V4(u32::from(a), u32::from(a))),
            IpAddr::V6(a) => Self(Range::V6(u128::from(a), u128::from(a))),
        }
    }

    /// First address.
    pub fn start(&self) -> IpAddr {
        match self.0 {
            Range::V4(s, _) => IpAddr::V4(Ipv4Addr::from(s)),
            Range::V6(s, _) => IpAddr::V6(Ipv6Addr::from(s)),
        }
    }

    /// Last address.
    pub fn end(&self) -> IpAddr {
        match self.0 {
            Range::V4(_, e) => IpAddr::V4(Ipv4Addr::from(e)),
            Range::V6(_, e) => IpAddr::V6(Ipv6Addr::from(e)),
        }
    }

    /// True for an IPv4 range.
    pub fn is_ipv4(&self) -> bool {
        matches!(self.0, Range::V4(..))
    }

    /// True if `addr` lies in the range (an address of the other family never does).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.0, addr) {
            (Range::V4(s, e), IpAddr::V4(a)) => (s..=e).contains(&u32::from(a)),
            (Range::V6(s, e), IpAddr::V6(a)) => (s..=e).contains(&u128::from(a)),
            _ => false,
        }
    }
}

/// A selector's ports, valid by construction: an inclusive range (start not above end), or
/// OPAQUE (start 65535, end 0 as IKEv2 encodes it). What they cover is `wire::flow::Ports`'
/// meaning, the one the data node applies too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    start: u16,
    end: u16,
}

impl PortRange {
    /// Every port, and every packet without ports (see [`Flow`]).
    pub const ANY: Self = Self {
        start: 0,
        end: u16::MAX,
    };

    /// OPAQUE (RFC 4301 §4.4.1.1): only packets whose ports are not available.
    pub const OPAQUE: Self = Self {
        start: u16::MAX,
        end: 0,
    };

    /// The ports `start..=end`, or OPAQUE for 65535–0; any other reversed range is an error.
    pub fn new(start: u16, end: u16) -> Result<Self, SteerError> {
        match Ports::from_fields(start, end) {
            Some(_) => Ok(Self { start, end }),
            None => Err(SteerError::InvertedPortRange { start, end }),
        }
    }

    /// A single port.
    pub const fn single(port: u16) -> Self {
        Self {
            start: port,
            end: port,
        }
    }

    /// First port (65535 for OPAQUE).
    pub const fn start(&self) -> u16 {
        self.start
    }

    /// Last port (0 for OPAQUE).
    pub const fn end(&self) -> u16 {
        self.end
    }

    /// The ports as `wire::flow` matches them.
    pub const fn ports(&self) -> Ports {
        if self.start > self.end {
            Ports::Opaque
        } else {
            Ports::Range {
                start: self.start,
                end: self.end,
            }
        }
    }

    /// True if a packet with this port (`None`: without ports) is covered.
    #[inline]
    pub fn matches(&self, port: Option<u16>) -> bool {
        self.ports().matches(port)
    }
}

/// An outbound selector: which inner packets a tunnel's CHILD_SA carries (RFC 4301 §4.4.1.1
/// selectors; RFC 7296 §3.13.1 traffic selectors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Selector {
    /// Destination addresses (the remote, on-premises side).
    pub dst: AddrRange,
    /// Source addresses (the local side, the VNet); the same family as `dst`.
    pub src: AddrRange,
    /// IP protocol; 0 matches any.
    pub proto: u8,
    /// Source ports.
    pub sport: PortRange,
    /// Destination ports.
    pub dport: PortRange,
}

impl Selector {
    /// Any packet from `src` to `dst`.
    pub fn between(src: AddrRange, dst: AddrRange) -> Self {
        Self {
            dst,
            src,
            proto: 0,
            sport: PortRange::ANY,
            dport: PortRange::ANY,
        }
    }

    /// The outbound selector of a CHILD_SA from its negotiated traffic selectors: `local`
    /// (ours, TSi when we initiated) gives the source, `remote` the destination. Each TS
    /// carries its own protocol; the SA carries packets matching both, so one of 0 ("any")
    /// yields the other and two different non-zero protocols are an error.
    pub fn from_traffic_selectors(
        local: &TrafficSelector,
        remote: &TrafficSelector,
    ) -> Result<Self, SteerError> {
        let proto = match (local.ip_proto, remote.ip_proto) {
            (0, p) | (p, 0) => p,
            (l, r) if l == r => l,
            (l, r) => {
                return Err(SteerError::ProtocolMismatch {
                    local: l,
                    remote: r,
                })
            }
        };
        Ok(Self {
            dst: AddrRange::new(remote.start, remote.end)?,
            src: AddrRange::new(local.start, local.end)?,
            proto,
            sport: PortRange::new(local.start_port, local.end_port)?,
            dport: PortRange::new(remote.start_port, remote.end_port)?,
        })
    }

    /// True if the selector covers `flow`: both addresses in range, the protocol equal (or the
    /// selector's 0), both ports covered as `wire::flow::Ports` says (a packet without ports
    /// meets only "any" and OPAQUE). The same answer as the negotiated traffic selectors give
    /// through `wire::ike::TrafficSelector::covers` on the data node.
    pub fn matches(&self, flow: &Flow) -> bool {
        self.dst.contains(flow.dst)
            && self.src.contains(flow.src)
            && (self.proto == 0 || self.proto == flow.proto)
            && self.sport.matches(flow.sport)
            && self.dport.matches(flow.dport)
    }
}

/// One outbound steering rule: a tunnel's selector and the data node holding its SA, or one
/// of a customer attachment's prefixes and the data node serving the attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SelectorEntry {
    /// Which packets.
    pub selector: Selector,
    /// The tunnel (for its rate limit and counters); None for an attachment's prefix, which
    /// has no rate limit and whose frames carry no tunnel id.
    pub tunnel: Option<TunnelId>,
    /// The data node holding the tunnel's outbound SA (or serving the attachment).
    pub node: NodeId,
}

/// What a VNI's index looks like: how much of the list the interval layers cover and how much
/// falls back to a scan. A lookup costs one binary search per layer plus, at worst, a check of
/// every fallback entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexStats {
    /// Entries in the VNI's list.
    pub entries: usize,
    /// Interval layers (both families together).
    pub layers: usize,
    /// Entries found through a layer's binary search.
    pub indexed: usize,
    /// Entries checked by scan (wide or overlapping selectors).
    pub fallback: usize,
}

/// One VNI's list and its index.
#[derive(Debug)]
struct VniSelectors {
    entries: Vec<SelectorEntry>,
    index: VniIndex,
}

/// (VNI, flow) → [`SelectorEntry`] (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct SelectorTable {
    vnis: FxHashMap<Vni, Arc<VniSelectors>>,
}

impl SelectorTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the whole list of `vni` (in priority order, first match wins) and rebuilds its
    /// index; an empty list removes the VNI. The list is validated whole before anything
    /// changes: a selector whose source and destination families differ is rejected.
    pub fn set_vni(&mut self, vni: Vni, entries: Vec<SelectorEntry>) -> Result<(), SteerError> {
        if entries.is_empty() {
            self.vnis.remove(&vni);
            return Ok(());
        }
        if u32::try_from(entries.len()).is_err() {
            return Err(SteerError::TooManySelectors {
                vni,
                count: entries.len(),
            });
        }
        for (index, e) in entries.iter().enumerate() {
            if e.selector.src.is_ipv4() != e.selector.dst.is_ipv4() {
                return Err(SteerError::SelectorFamilyMismatch {
                    vni,
                    index,
                    tunnel: e.tunnel,
                });
            }
        }
        let index = VniIndex::build(&entries);
        self.vnis
            .insert(vni, Arc::new(VniSelectors { entries, index }));
        Ok(())
    }

    /// Removes every entry of `vni`; false if it had none.
    pub fn remove_vni(&mut self, vni: Vni) -> bool {
        self.vnis.remove(&vni).is_some()
    }

    /// The list of `vni` in priority order (empty if none), e.g. to derive the next list.
    pub fn entries(&self, vni: Vni) -> &[SelectorEntry] {
        self.vnis.get(&vni).map_or(&[], |v| &v.entries)
    }

    /// The VNIs with entries, in no particular order.
    pub fn vnis(&self) -> impl Iterator<Item = Vni> + '_ {
        self.vnis.keys().copied()
    }

    /// Entries over all VNIs.
    pub fn len(&self) -> usize {
        self.vnis.values().map(|v| v.entries.len()).sum()
    }

    /// True if no VNI has entries.
    pub fn is_empty(&self) -> bool {
        self.vnis.is_empty()
    }

    /// The first entry of `vni`'s list whose selector matches `flow`: exactly
    /// `entries(vni).iter().find(|e| e.selector.matches(flow))`, found through the index.
    #[inline]
    pub fn lookup(&self, vni: Vni, flow: &Flow) -> Option<&SelectorEntry> {
        let v = self.vnis.get(&vni)?;
        let i = v.index.lookup(flow)?;
        v.entries.get(i as usize)
    }

    /// How `vni`'s index came out, if the VNI has entries.
    pub fn index_stats(&self, vni: Vni) -> Option<IndexStats> {
        self.vnis.get(&vni).map(|v| v.index.stats())
    }
}

#[cfg(test)]
mod tests;
