//! A VNet's route table: longest-prefix match from a destination address to the host VTEP
//! behind which it lives. One hash table per prefix length present, probed from the longest:
//! a lookup costs at most one probe per distinct length and never allocates.

use datapath::Route;
use ipnet::IpNet;
use rustc_hash::FxHashMap;
use std::net::IpAddr;

/// Longest-prefix-match table (IPv4 and IPv6 kept apart): per prefix length present, its
/// netmask and the hosts by network address.
#[derive(Debug, Default, Clone)]
pub(crate) struct RouteTable {
    v4: Vec<(u8, u32, FxHashMap<u32, IpAddr>)>,
    v6: Vec<(u8, u128, FxHashMap<u128, IpAddr>)>,
}

/// Why a route is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RouteError {
    /// The prefix length exceeds the family's address width.
    Length,
    /// The prefix has bits set beyond its length.
    HostBits,
    /// The same prefix appears twice.
    Duplicate,
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RouteError::Length => "prefix length exceeds the address width",
            RouteError::HostBits => "prefix has bits set beyond its length",
            RouteError::Duplicate => "prefix listed twice",
        })
    }
}

impl RouteTable {
    /// Builds the table; the error names the index of the first bad route.
    pub(crate) fn new(routes: &[Route]) -> Result<Self, (usize, RouteError)> {
        let mut t = Self::default();
        for (i, r) in routes.iter().enumerate() {
            t.insert(r).map_err(|e| (i, e))?;
        }
        t.v4.sort_by_key(|e| std::cmp::Reverse(e.0));
        t.v6.sort_by_key(|e| std::cmp::Reverse(e.0));
        Ok(t)
    }

    fn insert(&mut self, r: &Route) -> Result<(), RouteError> {
        let net = IpNet::new(r.prefix, r.len).map_err(|_| RouteError::Length)?;
        if net.network() != r.prefix {
            return Err(RouteError::HostBits);
        }
        let duplicate = match net {
            IpNet::V4(n) => insert(&mut self.v4, n.prefix_len(), n.netmask(), n.addr(), r.host),
            IpNet::V6(n) => insert(&mut self.v6, n.prefix_len(), n.netmask(), n.addr(), r.host),
        };
        if duplicate {
            return Err(RouteError::Duplicate);
        }
        Ok(())
    }

    /// The host of the longest prefix containing `dst`.
    pub(crate) fn lookup(&self, dst: IpAddr) -> Option<IpAddr> {
        match dst {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                self.v4
                    .iter()
                    .find_map(|(_, mask, m)| m.get(&(a & mask)).copied())
            }
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6
                    .iter()
                    .find_map(|(_, mask, m)| m.get(&(a & mask)).copied())
            }
        }
    }
}

/// Adds `network/len -> host` to the per-length tables of one family; true if the prefix was
/// there already.
fn insert<A: Copy + Eq + std::hash::Hash>(
    tables: &mut Vec<(u8, A, FxHashMap<A, IpAddr>)>,
    len: u8,
    mask: impl Into<A>,
    network: impl Into<A>,
    host: IpAddr,
) -> bool {
    let slot = match tables.iter().position(|(l, _, _)| *l == len) {
        Some(i) => &mut tables[i].2,
        None => {
            tables.push((len, mask.into(), FxHashMap::default()));
            &mut tables.last_mut().expect("just pushed").2
        }
    };
    slot.insert(network.into(), host).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(prefix: &str, len: u8, host: &str) -> Route {
        Route {
            prefix: prefix.parse().expect("prefix"),
            len,
            host: host.parse().expect("host"),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn longest_prefix_wins() {
        let t = RouteTable::new(&[
            r("10.0.0.0", 8, "192.0.2.1"),
            r("10.1.0.0", 16, "192.0.2.2"),
            r("10.1.2.0", 24, "192.0.2.3"),
            r("10.1.2.7", 32, "192.0.2.4"),
            r("0.0.0.0", 0, "192.0.2.9"),
            r("2001:db8::", 32, "2001:db8:ffff::1"),
            r("2001:db8:1::", 48, "2001:db8:ffff::2"),
        ])
        .expect("valid");
        assert_eq!(t.lookup(ip("10.1.2.7")), Some(ip("192.0.2.4")));
        assert_eq!(t.lookup(ip("10.1.2.8")), Some(ip("192.0.2.3")));
        assert_eq!(t.lookup(ip("10.1.3.1")), Some(ip("192.0.2.2")));
        assert_eq!(t.lookup(ip("10.200.0.1")), Some(ip("192.0.2.1")));
        assert_eq!(t.lookup(ip("172.16.0.1")), Some(ip("192.0.2.9")));
        assert_eq!(t.lookup(ip("2001:db8:1::5")), Some(ip("2001:db8:ffff::2")));
        assert_eq!(t.lookup(ip("2001:db8:2::5")), Some(ip("2001:db8:ffff::1")));
        assert_eq!(t.lookup(ip("2001:db9::1")), None);
    }

    #[test]
    fn invalid_routes_are_named() {
        assert_eq!(
            RouteTable::new(&[r("10.0.0.0", 33, "192.0.2.1")]).err(),
            Some((0, RouteError::Length))
        );
        assert_eq!(
            RouteTable::new(&[r("10.0.0.0", 8, "192.0.2.1"), r("10.0.0.1", 8, "192.0.2.1")]).err(),
            Some((1, RouteError::HostBits))
        );
        assert_eq!(
            RouteTable::new(&[r("10.0.0.0", 8, "192.0.2.1"), r("10.0.0.0", 8, "192.0.2.2")]).err(),
            Some((1, RouteError::Duplicate))
        );
        assert_eq!(
            RouteTable::new(&[r("::", 129, "::1")]).err(),
            Some((0, RouteError::Length))
        );
    }
}
