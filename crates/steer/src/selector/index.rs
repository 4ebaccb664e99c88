//! The per-VNI selector index: layers of disjoint address intervals searched by binary
//! search, and a fallback list for what does not fit in a layer.
//!
//! Per address family, the VNI's selectors become *rules* numbered in priority order. The
//! build takes a maximum set of rules whose destination ranges are pairwise disjoint (the
//! greedy earliest-end choice, which is optimal for interval scheduling) and, separately, the
//! same for source ranges; the larger set becomes a *layer*: its intervals sorted, searched on
//! that address by binary search. The remaining rules go through the same choice for the next
//! layer, up to [`MAX_LAYERS`] layers of at least [`MIN_LAYER`] rules each; what is left (wide
//! selectors such as `0.0.0.0/0`, heavily nested or identical ranges, small lists) is the
//! fallback list, in priority order.
//!
//! Disjoint ranges mean a layer has at most one interval containing a given address, so for a
//! flow every layer yields at most one candidate rule. Every rule that matches the flow has a
//! range containing the flow's address on its layer's key, so it is either that layer's
//! candidate or in the fallback list. The lookup checks each layer's candidate in full and then
//! scans the fallback list up to the best rule found so far: the smallest-numbered matching
//! rule among all candidates is the first match of the whole list, exactly what a linear scan
//! returns.
//!
//! Tunnels of one tenant to different sites have disjoint destination ranges and land in one
//! layer; several tunnels to one site with different VNet subnets land in a source layer. A
//! lookup then costs one or two binary searches instead of a scan of the list.

use std::net::IpAddr;

use wire::flow::port_key;

use super::{Flow, IndexStats, Range, SelectorEntry};

/// Fewest rules a layer must take to be worth a binary search.
const MIN_LAYER: usize = 4;
/// Most layers per address family; the rest is scanned.
const MAX_LAYERS: usize = 16;

/// A selector in integer form, for one address family.
#[derive(Debug, Clone, Copy)]
struct Rule<A> {
    dst: (A, A),
    src: (A, A),
    proto: u8,
    /// Port bounds as `wire::flow::port_key`s.
    sport: (u32, u32),
    dport: (u32, u32),
    /// Position in the VNI's list.
    entry: u32,
}

impl<A: Copy + Ord> Rule<A> {
    fn new(e: &SelectorEntry, entry: u32, dst: (A, A), src: (A, A)) -> Self {
        let s = &e.selector;
        Self {
            dst,
            src,
            proto: s.proto,
            sport: s.sport.ports().key_bounds(),
            dport: s.dport.ports().key_bounds(),
            entry,
        }
    }

    #[inline]
    fn matches(&self, k: &Key<A>) -> bool {
        self.dst.0 <= k.dst
            && k.dst <= self.dst.1
            && self.src.0 <= k.src
            && k.src <= self.src.1
            && (self.proto == 0 || self.proto == k.proto)
            && self.sport.0 <= k.sport
            && k.sport <= self.sport.1
            && self.dport.0 <= k.dport
            && k.dport <= self.dport.1
    }

    fn range(&self, on: On) -> (A, A) {
        match on {
            On::Dst => self.dst,
            On::Src => self.src,
        }
    }
}

/// A flow in integer form.
struct Key<A> {
    src: A,
    dst: A,
    proto: u8,
    sport: u32,
    dport: u32,
}

/// Which address a layer is sorted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    Dst,
    Src,
}

/// Rules with pairwise disjoint ranges on one address, sorted.
#[derive(Debug)]
struct Layer<A> {
    on: On,
    /// Range starts, ascending.
    starts: Vec<A>,
    /// Range ends, same order (also ascending: the ranges are disjoint).
    ends: Vec<A>,
    /// Rule numbers, same order.
    rules: Vec<u32>,
}

impl<A: Copy + Ord> Layer<A> {
    /// The rule whose range contains the key's address, if any.
    #[inline]
    fn candidate(&self, k: &Key<A>) -> Option<u32> {
        let a = match self.on {
            On::Dst => k.dst,
            On::Src => k.src,
        };
        let i = self.starts.partition_point(|&s| s <= a).checked_sub(1)?;
        if *self.ends.get(i)? < a {
            return None;
        }
        self.rules.get(i).copied()
    }
}

/// The index of one address family.
#[derive(Debug)]
struct FamilyIndex<A> {
    /// Rules in priority order.
    rules: Vec<Rule<A>>,
    layers: Vec<Layer<A>>,
    /// Rule numbers not in a layer, ascending.
    fallback: Vec<u32>,
}

impl<A: Copy + Ord> FamilyIndex<A> {
    fn build(rules: Vec<Rule<A>>) -> Self {
        let mut pool: Vec<u32> = (0..rules.len() as u32).collect();
        let mut layers = Vec::new();
        while pool.len() >= MIN_LAYER && layers.len() < MAX_LAYERS {
            let (by_dst, rest_dst) = disjoint(&rules, &pool, On::Dst);
            let (by_src, rest_src) = disjoint(&rules, &pool, On::Src);
            let (on, picked, rest) = if by_src.len() > by_dst.len() {
                (On::Src, by_src, rest_src)
            } else {
                (On::Dst, by_dst, rest_dst)
            };
            if picked.len() < MIN_LAYER {
                break;
            }
            let (starts, ends) = picked.iter().map(|&r| rules[r as usize].range(on)).unzip();
            layers.push(Layer {
                on,
                starts,
                ends,
                rules: picked,
            });
            pool = rest;
        }
        pool.sort_unstable();
        Self {
            rules,
            layers,
            fallback: pool,
        }
    }

    /// The list position of the first rule matching `k`.
    #[inline]
    fn lookup(&self, k: &Key<A>) -> Option<u32> {
        let matching = |r: u32| {
            self.rules
                .get(r as usize)
                .is_some_and(|rule| rule.matches(k))
        };
        let mut best = u32::MAX;
        for layer in &self.layers {
            if let Some(r) = layer.candidate(k) {
                if r < best && matching(r) {
                    best = r;
                }
            }
        }
        for &r in &self.fallback {
            if r >= best {
                break;
            }
            if matching(r) {
                best = r;
                break;
            }
        }
        self.rules.get(best as usize).map(|rule| rule.entry)
    }

    fn indexed(&self) -> usize {
        self.layers.iter().map(|l| l.rules.len()).sum()
    }
}

/// A largest subset of `pool` whose ranges on `on` are pairwise disjoint (earliest end
/// first), sorted by range, and the rest of `pool`.
fn disjoint<A: Copy + Ord>(rules: &[Rule<A>], pool: &[u32], on: On) -> (Vec<u32>, Vec<u32>) {
    let range = |r: u32| rules[r as usize].range(on);
    let mut order = pool.to_vec();
    order.sort_unstable_by_key(|&r| {
        let (lo, hi) = range(r);
        (hi, lo, r)
    });
    let (mut picked, mut rest) = (Vec::new(), Vec::new());
    let mut last_end: Option<A> = None;
    for r in order {
        let (lo, hi) = range(r);
        if last_end.is_none_or(|end| lo > end) {
            picked.push(r);
            last_end = Some(hi);
        } else {
            rest.push(r);
        }
    }
    (picked, rest)
}

/// The index of one VNI's list, both families.
#[derive(Debug)]
pub(super) struct VniIndex {
    v4: FamilyIndex<u32>,
    v6: FamilyIndex<u128>,
}

impl VniIndex {
    /// Indexes `entries` (at most `u32::MAX`, each of one family: the caller checked).
    pub(super) fn build(entries: &[SelectorEntry]) -> Self {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (i, e) in entries.iter().enumerate() {
            let i = i as u32;
            match (e.selector.dst.0, e.selector.src.0) {
                (Range::V4(dlo, dhi), Range::V4(slo, shi)) => {
                    v4.push(Rule::new(e, i, (dlo, dhi), (slo, shi)));
                }
                (Range::V6(dlo, dhi), Range::V6(slo, shi)) => {
                    v6.push(Rule::new(e, i, (dlo, dhi), (slo, shi)));
                }
                // Mixed families never match; `set_vni` rejects them before this.
                _ => {}
            }
        }
        Self {
            v4: FamilyIndex::build(v4),
            v6: FamilyIndex::build(v6),
        }
    }

    /// The list position of the first entry matching `flow`.
    #[inline]
    pub(super) fn lookup(&self, flow: &Flow) -> Option<u32> {
        match (flow.src, flow.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => self.v4.lookup(&Key {
                src: u32::from(src),
                dst: u32::from(dst),
                proto: flow.proto,
                sport: port_key(flow.sport),
                dport: port_key(flow.dport),
            }),
            (IpAddr::V6(src), IpAddr::V6(dst)) => self.v6.lookup(&Key {
                src: u128::from(src),
                dst: u128::from(dst),
                proto: flow.proto,
                sport: port_key(flow.sport),
                dport: port_key(flow.dport),
            }),
            _ => None,
        }
    }

    pub(super) fn stats(&self) -> IndexStats {
        IndexStats {
            entries: self.v4.rules.len() + self.v6.rules.len(),
            layers: self.v4.layers.len() + self.v6.layers.len(),
            indexed: self.v4.indexed() + self.v6.indexed(),
            fallback: self.v4.fallback.len() + self.v6.fallback.len(),
        }
    }
}
