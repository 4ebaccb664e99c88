//! IPv4/IPv6 prefixes (`10.1.0.0/24`) and interface addresses (`10.1.0.1/24`)
//! for describing topologies and writing `ip addr` / traffic-selector strings.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::IpNet;

use crate::error::{Error, Result};

/// A network prefix: the network address (host bits zero) and its length.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix(IpNet);

/// An address on an interface together with the length of its subnet.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IfAddr {
    /// The address itself.
    pub addr: IpAddr,
    /// The subnet's prefix length.
    pub len: u8,
}

/// `addr/len` as an [`IpNet`] (host bits kept); fails if `len` is too long for the family.
fn net(addr: IpAddr, len: u8) -> Result<IpNet> {
    IpNet::new(addr, len).map_err(|_| Error::InvalidSpec {
        field: format!("{addr}/{len}"),
        reason: format!(
            "prefix length exceeds {}",
            if addr.is_ipv4() { 32 } else { 128 }
        ),
    })
}

impl Prefix {
    /// The prefix `addr/len`; host bits of `addr` are cleared.
    pub fn new(addr: IpAddr, len: u8) -> Result<Prefix> {
        Ok(Prefix(net(addr, len)?.trunc()))
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.0.network()
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.0.prefix_len()
    }

    /// Whether this is an IPv4 prefix.
    pub fn is_ipv4(&self) -> bool {
        self.0.network().is_ipv4()
    }

    /// Whether `addr` lies inside the prefix.
    pub fn contains(&self, addr: IpAddr) -> bool {
        self.0.contains(&addr)
    }

    /// The `n`-th address of the prefix (0 is the network address itself).
    pub fn host(&self, n: u128) -> Result<IpAddr> {
        let too_big = || Error::InvalidSpec {
            field: self.to_string(),
            reason: format!("host number {n} does not fit the prefix"),
        };
        Ok(match self.0 {
            IpNet::V4(p) => {
                let n = u32::try_from(n).map_err(|_| too_big())?;
                if n & !u32::from(p.hostmask()) != 0 {
                    return Err(too_big());
                }
                IpAddr::V4(Ipv4Addr::from(u32::from(p.network()) | n))
            }
            IpNet::V6(p) => {
                if n & !u128::from(p.hostmask()) != 0 {
                    return Err(too_big());
                }
                IpAddr::V6(Ipv6Addr::from(u128::from(p.network()) | n))
            }
        })
    }

    /// The `n`-th address of the prefix as an interface address with this prefix length.
    pub fn if_addr(&self, n: u128) -> Result<IfAddr> {
        Ok(IfAddr {
            addr: self.host(n)?,
            len: self.prefix_len(),
        })
    }
}

impl IfAddr {
    /// `addr/len`; fails if `len` is too long for the address family.
    pub fn new(addr: IpAddr, len: u8) -> Result<IfAddr> {
        net(addr, len)?;
        Ok(IfAddr { addr, len })
    }

    /// The subnet the address lives in.
    pub fn prefix(&self) -> Prefix {
        Prefix::new(self.addr, self.len).expect("IfAddr lengths are validated at construction")
    }

    /// The address as a host prefix (`/32` or `/128`).
    pub fn host_prefix(&self) -> Prefix {
        Prefix(IpNet::from(self.addr))
    }
}

/// `ADDRESS/LENGTH`, or a bare address as a full-length prefix; host bits are kept.
fn parse_net(s: &str) -> Result<IpNet> {
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
    let net = match len {
        Some(l) => {
            let len = l.parse::<u8>().map_err(|_| bad("bad prefix length"))?;
            IpNet::new(addr, len).map_err(|_| bad("prefix length too long"))?
        }
        None => IpNet::from(addr),
    };
    Ok(net)
}

impl FromStr for Prefix {
    type Err = Error;
    fn from_str(s: &str) -> Result<Prefix> {
        Ok(Prefix(parse_net(s)?.trunc()))
    }
}

impl FromStr for IfAddr {
    type Err = Error;
    fn from_str(s: &str) -> Result<IfAddr> {
        let net = parse_net(s)?;
        Ok(IfAddr {
            addr: net.addr(),
            len: net.prefix_len(),
        })
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
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
