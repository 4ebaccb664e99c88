//! Traffic selectors as people write and read them (swanctl's syntax), and as sets: the
//! narrowing of RFC 7296 §2.9 works on their intersection.

use std::net::IpAddr;

use ipnet::{IpNet, IpSubnets, Ipv4Subnets, Ipv6Subnets};

use super::TrafficSelector;

/// A traffic selector in swanctl's syntax that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid traffic selector {value:?}: {reason}")]
pub struct TsSyntaxError {
    /// The offending text.
    pub value: String,
    /// Why it is invalid.
    pub reason: &'static str,
}

impl TrafficSelector {
    /// Parses swanctl's syntax: `10.1.0.0/24`, `10.1.0.5`, `10.1.0.1-10.1.0.9`, with an optional
    /// `[proto/port]` suffix such as `10.1.0.0/24[tcp/443]`.
    pub fn parse(s: &str) -> Result<Self, TsSyntaxError> {
        let err = |reason: &'static str| TsSyntaxError {
            value: s.to_string(),
            reason,
        };
        let t = s.trim();
        let (net, suffix) = match t.find('[') {
            Some(i) => {
                let rest = t[i + 1..]
                    .strip_suffix(']')
                    .ok_or_else(|| err("missing ']'"))?;
                (&t[..i], Some(rest))
            }
            None => (t, None),
        };
        let (start, end) =
            parse_range(net).ok_or_else(|| err("expected ADDR, ADDR/PREFIX or ADDR-ADDR"))?;
        let mut ts = Self {
            ip_proto: 0,
            start_port: 0,
            end_port: 65535,
            start,
            end,
        };
        if let Some(suffix) = suffix {
            let (proto, port) = match suffix.split_once('/') {
                Some((a, b)) => (a, Some(b)),
                None => (suffix, None),
            };
            ts.ip_proto = match proto.to_ascii_lowercase().as_str() {
                "" | "%any" | "any" => 0,
                "icmp" => 1,
                "tcp" => 6,
                "udp" => 17,
                "gre" => 47,
                "ipv6-icmp" | "icmp6" | "icmpv6" => 58,
                "sctp" => 132,
                n => n.parse::<u8>().map_err(|_| err("unknown protocol"))?,
            };
            if let Some(port) = port {
                match port {
                    "" | "%any" | "any" => {}
                    "%opaque" | "opaque" => {
                        ts.start_port = 65535;
                        ts.end_port = 0;
                    }
                    p => {
                        let (a, b) = p.split_once('-').unwrap_or((p, p));
                        ts.start_port = a.parse().map_err(|_| err("invalid port"))?;
                        ts.end_port = b.parse().map_err(|_| err("invalid port"))?;
                        if ts.start_port > ts.end_port {
                            return Err(err("port range is reversed"));
                        }
                    }
                }
            }
        }
        Ok(ts)
    }

    /// True if `addr` lies within the address range (ignores protocol and ports).
    pub fn contains_addr(&self, addr: IpAddr) -> bool {
        crate::flow::addr_in((self.start, self.end), addr)
    }

    /// The intersection of two selectors, if not empty (RFC 7296 §2.9 narrowing).
    pub fn intersect(&self, other: &Self) -> Option<Self> {
        if !same_family(self.start, other.start) {
            return None;
        }
        let ip_proto = match (self.ip_proto, other.ip_proto) {
            (0, p) | (p, 0) => p,
            (a, b) if a == b => a,
            _ => return None,
        };
        let start_port = self.start_port.max(other.start_port);
        let end_port = self.end_port.min(other.end_port);
        let opaque = |t: &Self| t.start_port == 65535 && t.end_port == 0;
        let (start_port, end_port) = if opaque(self) || opaque(other) {
            // OPAQUE ports (RFC 7296 §3.13.1) only intersect with themselves or with "any".
            if (opaque(self) || self.is_any_port()) && (opaque(other) || other.is_any_port()) {
                (65535, 0)
            } else {
                return None;
            }
        } else if start_port > end_port {
            return None;
        } else {
            (start_port, end_port)
        };
        let start = self.start.max(other.start);
        let end = self.end.min(other.end);
        if start > end {
            return None;
        }
        Some(Self {
            ip_proto,
            start_port,
            end_port,
            start,
            end,
        })
    }

    /// True if every packet `self` matches is also matched by `other`.
    pub fn is_subset_of(&self, other: &Self) -> bool {
        self.intersect(other) == Some(*self)
    }

    fn is_any_port(&self) -> bool {
        self.start_port == 0 && self.end_port == 65535
    }
}

impl core::fmt::Display for TrafficSelector {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match prefix_len(self.start, self.end) {
            Some(p) => write!(f, "{}/{p}", self.start)?,
            None => write!(f, "{}..{}", self.start, self.end)?,
        }
        if self.ip_proto != 0 || !self.is_any_port() {
            write!(f, "[{}", self.ip_proto)?;
            if !self.is_any_port() {
                if self.start_port == self.end_port {
                    write!(f, "/{}", self.start_port)?;
                } else {
                    write!(f, "/{}-{}", self.start_port, self.end_port)?;
                }
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

/// The prefix length if `start..=end` is exactly one CIDR block.
fn prefix_len(start: IpAddr, end: IpAddr) -> Option<u8> {
    let mut blocks = match (start, end) {
        (IpAddr::V4(s), IpAddr::V4(e)) => IpSubnets::from(Ipv4Subnets::new(s, e, 0)),
        (IpAddr::V6(s), IpAddr::V6(e)) => IpSubnets::from(Ipv6Subnets::new(s, e, 0)),
        _ => return None,
    };
    let first = blocks.next()?;
    blocks.next().is_none().then_some(first.prefix_len())
}

/// Parses `ADDR`, `ADDR/PREFIX` or `ADDR-ADDR`.
fn parse_range(s: &str) -> Option<(IpAddr, IpAddr)> {
    if let Some((a, p)) = s.split_once('/') {
        let a: IpAddr = a.trim().parse().ok()?;
        // Host bits of `a` are ignored: the range is the whole block.
        let net = IpNet::new(a, p.trim().parse().ok()?).ok()?;
        return Some((net.network(), net.broadcast()));
    }
    if let Some((a, b)) = s.split_once('-') {
        let a: IpAddr = a.trim().parse().ok()?;
        let b: IpAddr = b.trim().parse().ok()?;
        return (same_family(a, b) && a <= b).then_some((a, b));
    }
    let a: IpAddr = s.trim().parse().ok()?;
    Some((a, a))
}
