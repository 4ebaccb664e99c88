//! The outbound tunnel choice in O(log n): an index from destination address to the
//! CHILD_SAs whose remote traffic selectors (RFC 7296 §3.13.1, RFC 4301 §4.4.1.1) can cover
//! it, built once per published table snapshot, never per packet.
//!
//! Per IP version the destination space is cut into sorted, non-overlapping segments at every
//! start and every end + 1 of a remote selector's address range; each segment lists, in
//! priority order, the children with a remote selector whose range contains it (adjacent
//! segments with equal lists are merged). A lookup is a binary search for the destination's
//! segment followed by the exact selector check (addresses, protocol, ports, local side) on
//! that segment's candidates, usually one. Every child that can cover a packet has a remote
//! selector containing its destination, so it is among the candidates, in the same relative
//! order: the first candidate that covers the packet is exactly the first child of the whole
//! list that does, which is what the linear scan returned.
//!
//! Nested ranges can make the lists quadratic in the number of children; past a budget the
//! index is not built and the choice falls back to the linear scan (same result, more time).

use ike::TrafficSelector;
use std::net::IpAddr;

use wire::flow::Flow;

/// Up to this many children the linear scan is cheaper than a binary search.
pub(crate) const LINEAR_MAX: usize = 4;

/// Most list entries (child indices) per child before the index is abandoned for the scan:
/// disjoint or simply overlapping selectors stay far below it.
const BUDGET_PER_CHILD: usize = 64;
/// List entries always allowed, whatever the number of children.
const BUDGET_MIN: usize = 1 << 16;

/// An address family's integer form.
trait Addr: Copy + Ord {
    /// The next address; `None` after the last one.
    fn succ(self) -> Option<Self>;
}

impl Addr for u32 {
    fn succ(self) -> Option<Self> {
        self.checked_add(1)
    }
}

impl Addr for u128 {
    fn succ(self) -> Option<Self> {
        self.checked_add(1)
    }
}

/// The IPv4 address range `TrafficSelector::contains_addr` accepts for `ts`, if any. The
/// family is the start's; an end of the other family compares above (IPv6) every IPv4
/// address, as `IpAddr`'s order puts V4 before V6.
fn v4_range(ts: &TrafficSelector) -> Option<(u32, u32)> {
    let IpAddr::V4(start) = ts.start else {
        return None;
    };
    let end = match ts.end {
        IpAddr::V4(end) => u32::from(end),
        IpAddr::V6(_) => u32::MAX,
    };
    let start = u32::from(start);
    (start <= end).then_some((start, end))
}

/// The IPv6 address range of `ts`, if any (an IPv4 end lies below every IPv6 address).
fn v6_range(ts: &TrafficSelector) -> Option<(u128, u128)> {
    let (IpAddr::V6(start), IpAddr::V6(end)) = (ts.start, ts.end) else {
        return None;
    };
    let (start, end) = (u128::from(start), u128::from(end));
    (start <= end).then_some((start, end))
}

/// The segments of one address family.
#[derive(Debug, Clone)]
struct Segments<A> {
    /// First address of each segment, ascending; a segment ends where the next begins, the
    /// last at the end of the address space. Addresses below the first have no candidates.
    starts: Vec<A>,
    /// Per segment, its candidates: `members[lists[i].0 as usize..lists[i].1 as usize]`.
    lists: Vec<(u32, u32)>,
    /// Child indices, each list ascending (priority order).
    members: Vec<u32>,
}

impl<A: Addr> Segments<A> {
    /// Builds the segments of `ranges` (inclusive address range, child index); `None` if the
    /// lists would exceed `budget` entries.
    fn build(mut ranges: Vec<(A, A, u32)>, budget: usize) -> Option<Self> {
        let mut bounds: Vec<A> = Vec::with_capacity(ranges.len() * 2);
        for &(lo, hi, _) in &ranges {
            bounds.push(lo);
            bounds.extend(hi.succ());
        }
        bounds.sort_unstable();
        bounds.dedup();
        let seg = |a: A| bounds.partition_point(|&b| b <= a) - 1;
        // Segment span of each range; `hi + 1` is a bound unless `hi` is the last address.
        let span = |lo: A, hi: A| seg(lo)..hi.succ().map_or(bounds.len(), &seg);

        // Count first (a difference array), so a quadratic case is refused before it is built.
        let mut delta = vec![0i64; bounds.len() + 1];
        for &(lo, hi, _) in &ranges {
            let s = span(lo, hi);
            delta[s.start] += 1;
            delta[s.end] -= 1;
        }
        let mut running = 0i64;
        let mut total = 0usize;
        for d in &delta[..bounds.len()] {
            running += d;
            total += running as usize;
            if total > budget {
                return None;
            }
        }

        // Children in priority order, so each segment's list comes out ascending.
        ranges.sort_by_key(|r| r.2);
        let mut per_segment: Vec<Vec<u32>> = vec![Vec::new(); bounds.len()];
        for &(lo, hi, child) in &ranges {
            for list in &mut per_segment[span(lo, hi)] {
                // A child with several ranges over one segment is listed once.
                if list.last() != Some(&child) {
                    list.push(child);
                }
            }
        }

        let mut out = Self {
            starts: Vec::new(),
            lists: Vec::new(),
            members: Vec::new(),
        };
        for (start, list) in bounds.into_iter().zip(per_segment) {
            let same_as_last = out
                .lists
                .last()
                .is_some_and(|&(a, b)| out.members[a as usize..b as usize] == list[..]);
            if same_as_last {
                continue;
            }
            let first = out.members.len() as u32;
            out.members.extend_from_slice(&list);
            out.starts.push(start);
            out.lists.push((first, out.members.len() as u32));
        }
        Some(out)
    }

    /// The candidates for destination `a`, in priority order.
    fn candidates(&self, a: A) -> &[u32] {
        match self.starts.partition_point(|&s| s <= a).checked_sub(1) {
            Some(i) => {
                let (first, end) = self.lists[i];
                &self.members[first as usize..end as usize]
            }
            None => &[],
        }
    }

    fn entries(&self) -> usize {
        self.members.len()
    }
}

/// How a [`SelectorIndex`] chooses.
#[derive(Debug, Clone, Default)]
enum Mode {
    /// Scan every child in order: small sets, or an index over budget.
    #[default]
    Linear,
    /// Binary search per family, then the exact check on the candidates.
    Indexed {
        v4: Segments<u32>,
        v6: Segments<u128>,
    },
}

/// The outbound choice among a fixed list of children (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct SelectorIndex {
    mode: Mode,
}

impl SelectorIndex {
    /// Indexes children by their remote selectors; `remote_ts[i]` are child `i`'s, children in
    /// priority order. Sets of up to [`LINEAR_MAX`] children are scanned instead.
    pub(crate) fn build<'a>(
        remote_ts: impl ExactSizeIterator<Item = &'a [TrafficSelector]>,
    ) -> Self {
        Self::build_above(remote_ts, LINEAR_MAX)
    }

    /// [`Self::build`] with the scan for sets of up to `linear_max` children (tests index
    /// even the smallest sets).
    pub(crate) fn build_above<'a>(
        remote_ts: impl ExactSizeIterator<Item = &'a [TrafficSelector]>,
        linear_max: usize,
    ) -> Self {
        let children = remote_ts.len();
        if children <= linear_max || children > u32::MAX as usize {
            return Self::default();
        }
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (i, list) in remote_ts.enumerate() {
            for ts in list {
                v4.extend(v4_range(ts).map(|(lo, hi)| (lo, hi, i as u32)));
                v6.extend(v6_range(ts).map(|(lo, hi)| (lo, hi, i as u32)));
            }
        }
        let budget = BUDGET_MIN.max(BUDGET_PER_CHILD.saturating_mul(children));
        let mode = match Segments::build(v4, budget) {
            Some(v4) => match Segments::build(v6, budget.saturating_sub(v4.entries())) {
                Some(v6) => Mode::Indexed { v4, v6 },
                None => Mode::Linear,
            },
            None => Mode::Linear,
        };
        Self { mode }
    }

    /// True if lookups binary-search (false: they scan every child).
    pub(crate) fn is_indexed(&self) -> bool {
        matches!(self.mode, Mode::Indexed { .. })
    }

    /// The first of `children` (the list the index was built from, in the same order) that
    /// `covers` the packet, exactly as `children.iter().find(|c| covers(c, flow))`.
    #[inline]
    pub(crate) fn select<'a, T>(
        &self,
        children: &'a [T],
        flow: &Flow,
        covers: impl Fn(&T, &Flow) -> bool,
    ) -> Option<&'a T> {
        let candidates = match (&self.mode, flow.dst) {
            (Mode::Linear, _) => return children.iter().find(|c| covers(c, flow)),
            (Mode::Indexed { v4, .. }, IpAddr::V4(a)) => v4.candidates(u32::from(a)),
            (Mode::Indexed { v6, .. }, IpAddr::V6(a)) => v6.candidates(u128::from(a)),
        };
        candidates
            .iter()
            .filter_map(|&i| children.get(i as usize))
            .find(|c| covers(c, flow))
    }
}

#[cfg(test)]
mod tests;
