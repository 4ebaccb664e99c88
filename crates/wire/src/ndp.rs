//! IPv6 Neighbor Discovery (RFC 4861) Neighbor Solicitation (§4.3) and Neighbor
//! Advertisement (§4.4) messages with their link-layer address options (§4.6.1), inside
//! ICMPv6 (RFC 4443) with its pseudo-header checksum. Validation follows §7.1.1 / §7.1.2.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +---------------+---------------+-------------------------------+
//! | Type 135/136  |    Code 0     |          Checksum             |
//! +-+-+-+---------+---------------+-------------------------------+
//! |R|S|O|              Reserved (NS: all 32 bits reserved)        |
//! +-+-+-+---------------------------------------------------------+
//! |                     Target Address (128 bits)                 |
//! +---------------+---------------+-------------------------------+
//! | Option type   | Length (x8)   |  link-layer address ...       |
//! +---------------+---------------+-------------------------------+
//! ```

use std::net::Ipv6Addr;

use crate::checksum;
use crate::error::WireError;
use crate::ethernet::EthernetAddress;
use crate::field::{need, room, set_u16};
use crate::ip::IpProtocol;

/// ICMPv6 type of a Neighbor Solicitation.
pub const ICMPV6_NEIGHBOR_SOLICIT: u8 = 135;
/// ICMPv6 type of a Neighbor Advertisement.
pub const ICMPV6_NEIGHBOR_ADVERT: u8 = 136;
/// Option type: Source Link-Layer Address.
pub const OPT_SOURCE_LLADDR: u8 = 1;
/// Option type: Target Link-Layer Address.
pub const OPT_TARGET_LLADDR: u8 = 2;
/// The IPv6 Hop Limit every ND message carries (RFC 4861 §7.1).
pub const ND_HOP_LIMIT: u8 = 255;

const NS_NA_LEN: usize = 24;
const LLADDR_OPT_LEN: usize = 8;
const FLAG_ROUTER: u8 = 0x80;
const FLAG_SOLICITED: u8 = 0x40;
const FLAG_OVERRIDE: u8 = 0x20;

/// The flags of a Neighbor Advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NaFlags {
    /// R: the sender is a router.
    pub router: bool,
    /// S: sent in response to a solicitation.
    pub solicited: bool,
    /// O: override an existing cache entry.
    pub overrides: bool,
}

/// A Neighbor Solicitation or Advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NdpRepr {
    /// Neighbor Solicitation: who has `target_addr`?
    NeighborSolicit {
        /// The address being resolved.
        target_addr: Ipv6Addr,
        /// The sender's link-layer address, if included.
        source_lladdr: Option<EthernetAddress>,
    },
    /// Neighbor Advertisement: `target_addr` is at `target_lladdr`.
    NeighborAdvert {
        /// R/S/O flags.
        flags: NaFlags,
        /// The advertised address.
        target_addr: Ipv6Addr,
        /// The target's link-layer address, if included.
        target_lladdr: Option<EthernetAddress>,
    },
}

/// The solicited-node multicast group of `addr` (RFC 4291 §2.7.1): ff02::1:ffXX:XXXX.
pub fn solicited_node_multicast(addr: &Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0xff, o[13], o[14], o[15],
    ])
}

fn icmp_sum(src: &Ipv6Addr, dst: &Ipv6Addr, icmp: &[u8]) -> u16 {
    // ICMPv6 messages inside an IPv6 packet are < 2^16 bytes, so the length fits.
    let ph = checksum::pseudo_header_v6(src, dst, IpProtocol::ICMPV6, icmp.len() as u32);
    checksum::combine(&[ph, checksum::sum(icmp)])
}

fn malformed(field: &'static str) -> WireError {
    WireError::Malformed { what: "ndp", field }
}

impl NdpRepr {
    /// Parses and validates an ICMPv6 message (`icmp`, the whole IPv6 payload) received
    /// from `src` to `dst` with `hop_limit`. Checks RFC 4861 §7.1.1/§7.1.2: hop limit 255,
    /// checksum, code 0, length >= 24, target not multicast, no zero-length option, no
    /// source link-layer option from the unspecified address, no S flag to a multicast
    /// destination. Unknown options are ignored. Other ICMPv6 types are `Unsupported`.
    pub fn parse(
        src: &Ipv6Addr,
        dst: &Ipv6Addr,
        hop_limit: u8,
        icmp: &[u8],
    ) -> Result<Self, WireError> {
        need("ndp", icmp.len(), NS_NA_LEN)?;
        let ty = icmp[0];
        if ty != ICMPV6_NEIGHBOR_SOLICIT && ty != ICMPV6_NEIGHBOR_ADVERT {
            return Err(WireError::Unsupported {
                what: "icmpv6",
                field: "type",
                value: ty.into(),
            });
        }
        if hop_limit != ND_HOP_LIMIT {
            return Err(malformed("hop limit"));
        }
        if icmp_sum(src, dst, icmp) != 0xffff {
            return Err(WireError::Checksum { what: "icmpv6" });
        }
        if icmp[1] != 0 {
            return Err(malformed("code"));
        }
        let mut t = [0u8; 16];
        t.copy_from_slice(&icmp[8..24]);
        let target_addr = Ipv6Addr::from(t);
        if target_addr.is_multicast() {
            return Err(malformed("target address"));
        }
        let mut source_ll = None;
        let mut target_ll = None;
        let mut opts = &icmp[NS_NA_LEN..];
        while !opts.is_empty() {
            need("ndp option", opts.len(), 2)?;
            let len = usize::from(opts[1]) * 8;
            if len == 0 {
                return Err(malformed("option length"));
            }
            need("ndp option", opts.len(), len)?;
            let (opt, rest) = opts.split_at(len);
            match opt[0] {
                OPT_SOURCE_LLADDR | OPT_TARGET_LLADDR if len == LLADDR_OPT_LEN => {
                    let mut a = [0u8; 6];
                    a.copy_from_slice(&opt[2..8]);
                    let slot = if opt[0] == OPT_SOURCE_LLADDR {
                        &mut source_ll
                    } else {
                        &mut target_ll
                    };
                    *slot = Some(EthernetAddress(a));
                }
                // Other link types' address lengths, and unknown options: ignored (§4.6).
                _ => {}
            }
            opts = rest;
        }
        if ty == ICMPV6_NEIGHBOR_SOLICIT {
            if src.is_unspecified()
                && (source_ll.is_some() || *dst != solicited_node_multicast(&target_addr))
            {
                return Err(malformed("source link-layer address"));
            }
            Ok(Self::NeighborSolicit {
                target_addr,
                source_lladdr: source_ll,
            })
        } else {
            let flags = NaFlags {
                router: icmp[4] & FLAG_ROUTER != 0,
                solicited: icmp[4] & FLAG_SOLICITED != 0,
                overrides: icmp[4] & FLAG_OVERRIDE != 0,
            };
            if flags.solicited && dst.is_multicast() {
                return Err(malformed("solicited flag"));
            }
            Ok(Self::NeighborAdvert {
                flags,
                target_addr,
                target_lladdr: target_ll,
            })
        }
    }

    /// Length of the ICMPv6 message [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        let ll = match self {
            Self::NeighborSolicit {
                source_lladdr: l, ..
            }
            | Self::NeighborAdvert {
                target_lladdr: l, ..
            } => l,
        };
        NS_NA_LEN + if ll.is_some() { LLADDR_OPT_LEN } else { 0 }
    }

    /// Writes the ICMPv6 message, checksum included for the given IPv6 `src`/`dst`, into
    /// `buf`; the IPv6 header (Hop Limit 255, Next Header 58) is the caller's. Returns the
    /// message length.
    pub fn emit(&self, src: &Ipv6Addr, dst: &Ipv6Addr, buf: &mut [u8]) -> Result<usize, WireError> {
        let len = self.buffer_len();
        room("ndp", buf.len(), len)?;
        let b = &mut buf[..len];
        b.fill(0);
        let (target, ll, opt_type) = match *self {
            Self::NeighborSolicit {
                target_addr,
                source_lladdr,
            } => {
                b[0] = ICMPV6_NEIGHBOR_SOLICIT;
                (target_addr, source_lladdr, OPT_SOURCE_LLADDR)
            }
            Self::NeighborAdvert {
                flags,
                target_addr,
                target_lladdr,
            } => {
                b[0] = ICMPV6_NEIGHBOR_ADVERT;
                b[4] = (if flags.router { FLAG_ROUTER } else { 0 })
                    | (if flags.solicited { FLAG_SOLICITED } else { 0 })
                    | (if flags.overrides { FLAG_OVERRIDE } else { 0 });
                (target_addr, target_lladdr, OPT_TARGET_LLADDR)
            }
        };
        b[8..24].copy_from_slice(&target.octets());
        if let Some(mac) = ll {
            b[24] = opt_type;
            b[25] = 1;
            b[26..32].copy_from_slice(&mac.0);
        }
        let sum = icmp_sum(src, dst, b);
        set_u16(b, 2, !sum);
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ip::Ipv6Packet;
    use crate::testdata::{frame, NA, NS, VXLAN_NS};

    fn check_round_trip(eth_frame: &[u8]) -> NdpRepr {
        let ip = Ipv6Packet::new_checked(eth_frame).unwrap();
        assert_eq!(ip.next_header(), IpProtocol::ICMPV6);
        let (s, d) = (ip.src_addr(), ip.dst_addr());
        let r = NdpRepr::parse(&s, &d, ip.hop_limit(), ip.payload()).unwrap();
        let mut out = vec![0u8; r.buffer_len()];
        assert_eq!(r.emit(&s, &d, &mut out).unwrap(), ip.payload().len());
        assert_eq!(&out[..], ip.payload());
        r
    }

    #[test]
    fn captured_solicitations_and_advertisement() {
        let ns = frame(NS);
        let r = check_round_trip(&ns[14..]);
        assert_eq!(
            r,
            NdpRepr::NeighborSolicit {
                target_addr: "fd00:9::2".parse().unwrap(),
                source_lladdr: Some(EthernetAddress([2, 0, 0, 0, 0x0a, 0x01])),
            }
        );
        let v = frame(VXLAN_NS);
        let r = check_round_trip(&v[64..]);
        assert!(matches!(
            r,
            NdpRepr::NeighborSolicit {
                source_lladdr: Some(_),
                ..
            }
        ));

        let na = frame(NA);
        let r = check_round_trip(&na[14..]);
        assert_eq!(
            r,
            NdpRepr::NeighborAdvert {
                flags: NaFlags {
                    router: false,
                    solicited: true,
                    overrides: true
                },
                target_addr: "fd00:9::2".parse().unwrap(),
                target_lladdr: Some(EthernetAddress([2, 0, 0, 0, 0x0b, 0x02])),
            }
        );
        assert_eq!(
            solicited_node_multicast(&"fd00:9::2".parse().unwrap()),
            "ff02::1:ff00:2".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn validation() {
        let ns = frame(NS);
        let ip = Ipv6Packet::new_checked(&ns[14..]).unwrap();
        let (s, d) = (ip.src_addr(), ip.dst_addr());
        let icmp = ip.payload().to_vec();
        assert!(NdpRepr::parse(&s, &d, 64, &icmp).is_err(), "hop limit");
        assert!(NdpRepr::parse(&s, &d, 255, &icmp[..23]).is_err(), "short");
        let mut bad = icmp.clone();
        bad[10] ^= 1;
        assert_eq!(
            NdpRepr::parse(&s, &d, 255, &bad),
            Err(WireError::Checksum { what: "icmpv6" })
        );
        // A zero-length option, re-checksummed so only the option is wrong.
        let mut zero = icmp.clone();
        zero[25] = 0;
        let c = icmp_sum(&s, &d, &{
            let mut z = zero.clone();
            z[2] = 0;
            z[3] = 0;
            z
        });
        zero[2..4].copy_from_slice(&(!c).to_be_bytes());
        assert_eq!(
            NdpRepr::parse(&s, &d, 255, &zero),
            Err(malformed("option length"))
        );
        // DAD probe (unspecified source) must not carry a source link-layer option.
        let dad = NdpRepr::NeighborSolicit {
            target_addr: "fd00:9::2".parse().unwrap(),
            source_lladdr: None,
        };
        let mut out = vec![0u8; dad.buffer_len()];
        dad.emit(&Ipv6Addr::UNSPECIFIED, &d, &mut out).unwrap();
        assert!(NdpRepr::parse(&Ipv6Addr::UNSPECIFIED, &d, 255, &out).is_ok());
        let with_ll = NdpRepr::NeighborSolicit {
            target_addr: "fd00:9::2".parse().unwrap(),
            source_lladdr: Some(EthernetAddress([2, 0, 0, 0, 0, 1])),
        };
        let mut out = vec![0u8; with_ll.buffer_len()];
        with_ll.emit(&Ipv6Addr::UNSPECIFIED, &d, &mut out).unwrap();
        assert!(NdpRepr::parse(&Ipv6Addr::UNSPECIFIED, &d, 255, &out).is_err());
        // Solicited advertisement to a multicast destination is invalid.
        let na = NdpRepr::NeighborAdvert {
            flags: NaFlags {
                solicited: true,
                ..NaFlags::default()
            },
            target_addr: s,
            target_lladdr: None,
        };
        let all_nodes: Ipv6Addr = "ff02::1".parse().unwrap();
        let mut out = vec![0u8; na.buffer_len()];
        na.emit(&s, &all_nodes, &mut out).unwrap();
        assert!(NdpRepr::parse(&s, &all_nodes, 255, &out).is_err());
        // Other ICMPv6 types.
        let mut echo = icmp.clone();
        echo[0] = 128;
        assert!(matches!(
            NdpRepr::parse(&s, &d, 255, &echo),
            Err(WireError::Unsupported { .. })
        ));
        assert!(matches!(
            with_ll.emit(&s, &d, &mut [0u8; 31]),
            Err(WireError::BufferTooSmall { .. })
        ));
    }
}
