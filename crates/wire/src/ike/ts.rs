//! The Traffic Selector payloads TSi and TSr (RFC 7296 §3.13).
//!
//! ```text
//! Payload body (§3.13):
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Number of TSs |                 RESERVED                      |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                       <Traffic Selectors>                     ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//!
//! Traffic Selector (§3.13.1):
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |   TS Type     |IP Protocol ID*|       Selector Length         |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |           Start Port*         |           End Port*           |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                         Starting Address*                     ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                         Ending Address*                       ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use super::{
    codec::{count_u8, LenField, Reader},
    IkeWireError, TsType,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

mod text;

pub use text::TsSyntaxError;

/// One traffic selector (RFC 7296 §3.13.1): an address range with a protocol (0: any) and a
/// port range (0-65535: any; 65535-0: OPAQUE). The TS type is implied by the address family.
/// The one definition for the codec, the IKE engine, the data plane and the steer tables;
/// swanctl's text form and the set operations are in `ts/text.rs`, what it covers of a packet in
/// [`TrafficSelector::covers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrafficSelector {
    /// IP protocol ID (0 = any).
    pub ip_proto: u8,
    /// First port.
    pub start_port: u16,
    /// Last port.
    pub end_port: u16,
    /// First address.
    pub start: IpAddr,
    /// Last address (same family as `start`).
    pub end: IpAddr,
}

impl TrafficSelector {
    /// True if this selector covers one side of a packet: `addr` in range, `proto` matching
    /// and `port` (`None`: the packet has no ports) as [`crate::flow::Ports`] says. The one
    /// meaning of a selector match, shared by the data and steer nodes.
    pub fn covers(&self, addr: IpAddr, proto: u8, port: Option<u16>) -> bool {
        crate::flow::side_covers(
            (self.start, self.end),
            self.ip_proto,
            (self.start_port, self.end_port),
            addr,
            proto,
            port,
        )
    }

    /// The TS type for the address family.
    pub fn ts_type(&self) -> TsType {
        match self.start {
            IpAddr::V4(_) => TsType::IPV4_ADDR_RANGE,
            IpAddr::V6(_) => TsType::IPV6_ADDR_RANGE,
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, IkeWireError> {
        let ts_type = TsType(r.u8()?);
        let ip_proto = r.u8()?;
        let len = usize::from(r.u16()?);
        let alen = match ts_type {
            TsType::IPV4_ADDR_RANGE => 4,
            TsType::IPV6_ADDR_RANGE => 16,
            t => {
                return Err(IkeWireError::InvalidValue {
                    what: "TS type",
                    value: u32::from(t.0),
                })
            }
        };
        if len != 8 + 2 * alen {
            return Err(IkeWireError::BadLength {
                what: "traffic selector",
                length: len,
            });
        }
        let start_port = r.u16()?;
        let end_port = r.u16()?;
        let (start, end) = if alen == 4 {
            (
                IpAddr::V4(Ipv4Addr::from(r.u32()?)),
                IpAddr::V4(Ipv4Addr::from(r.u32()?)),
            )
        } else {
            let a = <[u8; 16]>::try_from(r.take(16)?).map_err(|_| IkeWireError::BadLength {
                what: "TS address",
                length: 16,
            })?;
            let b = <[u8; 16]>::try_from(r.take(16)?).map_err(|_| IkeWireError::BadLength {
                what: "TS address",
                length: 16,
            })?;
            (IpAddr::V6(Ipv6Addr::from(a)), IpAddr::V6(Ipv6Addr::from(b)))
        };
        Ok(Self {
            ip_proto,
            start_port,
            end_port,
            start,
            end,
        })
    }

    fn emit(&self, out: &mut Vec<u8>) -> Result<(), IkeWireError> {
        let start = out.len();
        out.push(self.ts_type().0);
        out.push(self.ip_proto);
        let len = LenField::u16(out, start, "selector length");
        out.extend_from_slice(&self.start_port.to_be_bytes());
        out.extend_from_slice(&self.end_port.to_be_bytes());
        for a in [self.start, self.end] {
            match (a, self.start) {
                (IpAddr::V4(a), IpAddr::V4(_)) => out.extend_from_slice(&a.octets()),
                (IpAddr::V6(a), IpAddr::V6(_)) => out.extend_from_slice(&a.octets()),
                _ => {
                    return Err(IkeWireError::InvalidValue {
                        what: "TS address family mismatch",
                        value: 0,
                    })
                }
            }
        }
        len.finish(out)
    }

    /// Encoded length.
    pub fn buffer_len(&self) -> usize {
        match self.start {
            IpAddr::V4(_) => 16,
            IpAddr::V6(_) => 40,
        }
    }
}

/// A TSi or TSr payload body.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TsPayload {
    /// The selectors.
    pub selectors: Vec<TrafficSelector>,
}

impl TsPayload {
    /// Parses a payload body.
    pub fn parse(body: &[u8]) -> Result<Self, IkeWireError> {
        let mut r = Reader::new(body, "TS payload");
        let count = r.u8()?;
        let _reserved = r.take(3)?;
        let mut selectors = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            selectors.push(TrafficSelector::decode(&mut r)?);
        }
        r.finish()?;
        Ok(Self { selectors })
    }

    /// Appends the body.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), IkeWireError> {
        out.push(count_u8(self.selectors.len(), "number of TSs")?);
        out.extend_from_slice(&[0, 0, 0]);
        for s in &self.selectors {
            s.emit(out)?;
        }
        Ok(())
    }

    /// Encoded body length.
    pub fn buffer_len(&self) -> usize {
        4 + self
            .selectors
            .iter()
            .map(TrafficSelector::buffer_len)
            .sum::<usize>()
    }
}
