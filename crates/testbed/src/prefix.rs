//! IPv4/IPv6 prefixes (`10.1.0.0/24`) and interface addresses (`10.1.0.1/24`)
//! for describing topologies and writing `ip addr` / traffic-selector strings.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::error::{Error, Result};

/// A network prefix: the network address (host bits zero) and its length.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    network: IpAddr,
    len: u8,
}

/// An address on an interface together with the length of its subnet.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfAddr {
    /// The address itself.
    pub addr: IpAddr,
    /// The subnet's prefix length.
    pub len: u8,
}

fn max_len(addr: IpAddr) -> u8 {
    if addr.is_ipv4() {
        32
    } else {
        128
    }
}

fn to_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_bits(v4: bool, bits: u128) -> IpAddr {
    if v4 {
        // Callers keep v4 values below 2^32.
        IpAddr::V4(Ipv4Addr::from(bits as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(bits))
    }
}

fn mask(v4: bool, len: u8) -> u128 {
    let width = if v4 { 32 } else { 128 };
    let all: u128 = if v4 { u128::from(u32::MAX) } else { u128::MAX };
    if len == 0 {
        0
    } else {
        all & (all << (width - u32::from(len)))
    }
}

impl Prefix {
    /// The prefix `addr/len`; host bits of `addr` are cleared.
    pub fn new(addr: IpAddr, len: u8) -> Result<Prefix> {
        if len > max_len(addr) {
            return Err(Error::InvalidSpec {
                field: format!("{addr}/{len}"),
                reason: format!("prefix length exceeds {}", max_len(addr)),
            });
        }
        let bits = to_bits(addr) & mask(addr.is_ipv4(), len);
        Ok(Prefix {
            network: from_bits(addr.is_ipv4(), bits),
            len,
        })
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// Whether this is an IPv4 prefix.
    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    /// Whether `addr` lies inside the prefix.
    pub fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.is_ipv4()
            && to_bits(addr) & mask(self.is_ipv4(), self.len) == to_bits(self.network)
    }

    /// The `n`-th address of the prefix (0 is the network address itself).
    pub fn host(&self, n: u128) -> Result<IpAddr> {
        let host_bits = u32::from(max_len(self.network) - self.len);
        if host_bits < 128 && n >> host_bits != 0 {
            return Err(Error::InvalidSpec {
                field: self.to_string(),
                reason: format!("host number {n} does not fit the prefix"),
            });
        }
        Ok(from_bits(self.is_ipv4(), to_bits(self.network) | n))
    }

    /// The `n`-th address of the prefix as an interface address with this prefix length.
    pub fn if_addr(&self, n: u128) -> Result<IfAddr> {
        Ok(IfAddr {
            addr: self.host(n)?,
            len: self.len,
        })
    }
}

impl IfAddr {
    /// `addr/len`; fails if `len` is too long for the address family.
    pub fn new(addr: IpAddr, len: u8) -> Result<IfAddr> {
        Prefix::new(addr, len)?;
        Ok(IfAddr { addr, len })
    }

    /// The subnet the address lives in.
    pub fn prefix(&self) -> Prefix {
        Prefix::new(self.addr, self.len).expect("IfAddr lengths are validated at construction")
    }

    /// The address as a host prefix (`/32` or `/128`).
    pub fn host_prefix(&self) -> Prefix {
        Prefix::new(self.addr, max_len(self.addr)).expect("a full-length prefix is always valid")
    }
}

fn parse_pair(s: &str) -> Result<(IpAddr, u8)> {
    let bad = |reason: &str| Error::Parse {
        what: "IP prefix",
        detail: reason.to_owned(),
        input: s.to_owned(),
    };
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP address"))?;
    let len = match len {
        Some(l) => l.parse::<u8>().map_err(|_| bad("bad prefix length"))?,
        None => max_len(addr),
    };
    if len > max_len(addr) {
        return Err(bad("prefix length too long"));
    }
    Ok((addr, len))
}

impl FromStr for Prefix {
    type Err = Error;
    fn from_str(s: &str) -> Result<Prefix> {
        let (addr, len) = parse_pair(s)?;
        Prefix::new(addr, len)
    }
}

impl FromStr for IfAddr {
    type Err = Error;
    fn from_str(s: &str) -> Result<IfAddr> {
        let (addr, len) = parse_pair(s)?;
        IfAddr::new(addr, len)
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.len)
    }
}

impl fmt::Debug for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for IfAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl fmt::Debug for IfAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_hosts_and_containment() {
        let p: Prefix = "10.2.0.77/24".parse().expect("valid");
        assert_eq!(p.to_string(), "10.2.0.0/24");
        assert_eq!(p.host(1).expect("fits").to_string(), "10.2.0.1");
        assert!(p.host(256).is_err());
        assert!(p.contains("10.2.0.200".parse().expect("ip")));
        assert!(!p.contains("10.2.1.1".parse().expect("ip")));
        assert_eq!(p.if_addr(10).expect("fits").to_string(), "10.2.0.10/24");
    }

    #[test]
    fn v6_hosts() {
        let p: Prefix = "fd00:2::/64".parse().expect("valid");
        assert_eq!(p.host(0x10).expect("fits").to_string(), "fd00:2::10");
        assert!(p.contains("fd00:2::ffff".parse().expect("ip")));
        let all: Prefix = "::/0".parse().expect("valid");
        assert!(all.host(u128::MAX).is_ok());
    }

    #[test]
    fn rejects_garbage() {
        assert!("10.0.0.0/33".parse::<Prefix>().is_err());
        assert!("nonsense/8".parse::<Prefix>().is_err());
        assert!("10.0.0.1/x".parse::<IfAddr>().is_err());
        let a: IfAddr = "10.0.0.1/24".parse().expect("valid");
        assert_eq!(a.prefix().to_string(), "10.0.0.0/24");
        assert_eq!(a.host_prefix().to_string(), "10.0.0.1/32");
    }
}
