//! The Security Association payload: proposals, transforms and transform attributes
//! (RFC 7296 §3.3).
//!
//! ```text
//! Proposal Substructure (§3.3.1):
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Last Substruc |   RESERVED    |         Proposal Length       |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Proposal Num  |  Protocol ID  |    SPI Size   |Num  Transforms|
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                        SPI (variable)                         ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                        <Transforms>                           ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//!
//! Transform Substructure (§3.3.2):
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Last Substruc |   RESERVED    |        Transform Length       |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |Transform Type |   RESERVED    |          Transform ID         |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~                      Transform Attributes                     ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//!
//! Data Attributes (§3.3.5):
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |A|       Attribute Type        |    AF=0  Attribute Length     |
//! |F|                             |    AF=1  Attribute Value      |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                   AF=0  Attribute Value                       |
//! |                   AF=1  Not Transmitted                       |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```

use super::{
    codec::{count_u16, count_u8, LenField, Reader},
    IkeWireError, ProtocolId, TransformType,
};

/// Transform attribute type "Key Length" in bits (RFC 7296 §3.3.5), TV format.
pub const ATTR_KEY_LENGTH: u16 = 14;

/// The value of a transform attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttributeValue {
    /// Type/Value format (AF = 1): a two-octet value.
    Tv(u16),
    /// Type/Length/Value format (AF = 0).
    Tlv(Vec<u8>),
}

/// A transform attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribute {
    /// Attribute type (without the AF bit).
    pub ty: u16,
    /// Its value.
    pub value: AttributeValue,
}

impl Attribute {
    fn parse(r: &mut Reader<'_>) -> Result<Self, IkeWireError> {
        let t = r.u16()?;
        let ty = t & 0x7fff;
        if t & 0x8000 != 0 {
            Ok(Self {
                ty,
                value: AttributeValue::Tv(r.u16()?),
            })
        } else {
            let len = usize::from(r.u16()?);
            Ok(Self {
                ty,
                value: AttributeValue::Tlv(r.take(len)?.to_vec()),
            })
        }
    }

    fn emit(&self, out: &mut Vec<u8>) -> Result<(), IkeWireError> {
        match &self.value {
            AttributeValue::Tv(v) => {
                out.extend_from_slice(&(self.ty | 0x8000).to_be_bytes());
                out.extend_from_slice(&v.to_be_bytes());
            }
            AttributeValue::Tlv(v) => {
                out.extend_from_slice(&(self.ty & 0x7fff).to_be_bytes());
                out.extend_from_slice(&count_u16(v.len(), "attribute length")?.to_be_bytes());
                out.extend_from_slice(v);
            }
        }
        Ok(())
    }

    fn buffer_len(&self) -> usize {
        match &self.value {
            AttributeValue::Tv(_) => 4,
            AttributeValue::Tlv(v) => 4 + v.len(),
        }
    }
}

/// A transform substructure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transform {
    /// Transform type.
    pub ty: TransformType,
    /// Transform ID (meaning depends on `ty`).
    pub id: u16,
    /// Attributes (in practice only Key Length).
    pub attributes: Vec<Attribute>,
}

impl Transform {
    /// A transform without attributes.
    pub fn new(ty: TransformType, id: u16) -> Self {
        Self {
            ty,
            id,
            attributes: Vec::new(),
        }
    }

    /// A transform with a Key Length attribute when `key_bits` is set.
    pub fn with_key_length(ty: TransformType, id: u16, key_bits: Option<u16>) -> Self {
        let attributes = key_bits
            .map(|b| {
                vec![Attribute {
                    ty: ATTR_KEY_LENGTH,
                    value: AttributeValue::Tv(b),
                }]
            })
            .unwrap_or_default();
        Self { ty, id, attributes }
    }

    /// The Key Length attribute, if present.
    pub fn key_length(&self) -> Option<u16> {
        self.attributes.iter().find_map(|a| match a.value {
            AttributeValue::Tv(v) if a.ty == ATTR_KEY_LENGTH => Some(v),
            _ => None,
        })
    }

    /// True if the transform has an attribute other than Key Length, which RFC 7296 §3.3.6
    /// says makes it unacceptable to a receiver that does not know it.
    pub fn has_unknown_attributes(&self) -> bool {
        self.attributes
            .iter()
            .any(|a| !(a.ty == ATTR_KEY_LENGTH && matches!(a.value, AttributeValue::Tv(_))))
    }

    fn parse(r: &mut Reader<'_>) -> Result<(Self, bool), IkeWireError> {
        let last = r.u8()?;
        let _reserved = r.u8()?;
        let len = usize::from(r.u16()?);
        if len < 8 {
            return Err(IkeWireError::BadLength {
                what: "transform",
                length: len,
            });
        }
        let mut t = r.sub(len - 4, "transform")?;
        let ty = TransformType(t.u8()?);
        let _reserved = t.u8()?;
        let id = t.u16()?;
        let mut attributes = Vec::new();
        while !t.is_empty() {
            attributes.push(Attribute::parse(&mut t)?);
        }
        Ok((Self { ty, id, attributes }, last == 0))
    }

    fn emit(&self, out: &mut Vec<u8>, last: bool) -> Result<(), IkeWireError> {
        let start = out.len();
        out.push(if last { 0 } else { 3 });
        out.push(0);
        let len = LenField::u16(out, start, "transform length");
        out.push(self.ty.0);
        out.push(0);
        out.extend_from_slice(&self.id.to_be_bytes());
        for a in &self.attributes {
            a.emit(out)?;
        }
        len.finish(out)
    }

    /// Encoded length.
    pub fn buffer_len(&self) -> usize {
        8 + self
            .attributes
            .iter()
            .map(Attribute::buffer_len)
            .sum::<usize>()
    }
}

/// A proposal substructure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// Proposal number (the first is 1; a response echoes the accepted one's number).
    pub number: u8,
    /// Protocol (IKE, ESP, AH).
    pub protocol: ProtocolId,
    /// The sending entity's SPI: empty in IKE_SA_INIT, 8 bytes when rekeying an IKE SA, 4 for ESP.
    pub spi: Vec<u8>,
    /// Transforms.
    pub transforms: Vec<Transform>,
}

impl Proposal {
    /// The transforms of one type, in order.
    pub fn transforms_of(&self, ty: TransformType) -> impl Iterator<Item = &Transform> {
        self.transforms.iter().filter(move |t| t.ty == ty)
    }

    fn parse(r: &mut Reader<'_>) -> Result<(Self, bool), IkeWireError> {
        let last = r.u8()?;
        let _reserved = r.u8()?;
        let len = usize::from(r.u16()?);
        if len < 8 {
            return Err(IkeWireError::BadLength {
                what: "proposal",
                length: len,
            });
        }
        let mut p = r.sub(len - 4, "proposal")?;
        let number = p.u8()?;
        let protocol = ProtocolId(p.u8()?);
        let spi_size = usize::from(p.u8()?);
        let count = p.u8()?;
        let spi = p.take(spi_size)?.to_vec();
        let mut transforms = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            transforms.push(Transform::parse(&mut p)?.0);
        }
        p.finish()?;
        Ok((
            Self {
                number,
                protocol,
                spi,
                transforms,
            },
            last == 0,
        ))
    }

    fn emit(&self, out: &mut Vec<u8>, last: bool) -> Result<(), IkeWireError> {
        let start = out.len();
        out.push(if last { 0 } else { 2 });
        out.push(0);
        let len = LenField::u16(out, start, "proposal length");
        out.push(self.number);
        out.push(self.protocol.0);
        out.push(count_u8(self.spi.len(), "proposal SPI size")?);
        out.push(count_u8(self.transforms.len(), "number of transforms")?);
        out.extend_from_slice(&self.spi);
        for (i, t) in self.transforms.iter().enumerate() {
            t.emit(out, i + 1 == self.transforms.len())?;
        }
        len.finish(out)
    }

    /// Encoded length.
    pub fn buffer_len(&self) -> usize {
        8 + self.spi.len()
            + self
                .transforms
                .iter()
                .map(Transform::buffer_len)
                .sum::<usize>()
    }
}

/// The SA payload body: a list of proposals.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SaPayload {
    /// Proposals in the sender's preference order.
    pub proposals: Vec<Proposal>,
}

impl SaPayload {
    /// Parses a payload body. The "Last Substruc" fields are redundant with the lengths and are
    /// not trusted; the body must be consumed exactly.
    pub fn parse(body: &[u8]) -> Result<Self, IkeWireError> {
        let mut r = Reader::new(body, "SA payload");
        let mut proposals = Vec::new();
        while !r.is_empty() {
            proposals.push(Proposal::parse(&mut r)?.0);
        }
        if proposals.is_empty() {
            return Err(IkeWireError::BadLength {
                what: "SA payload",
                length: 0,
            });
        }
        Ok(Self { proposals })
    }

    /// Appends the body.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), IkeWireError> {
        for (i, p) in self.proposals.iter().enumerate() {
            p.emit(out, i + 1 == self.proposals.len())?;
        }
        Ok(())
    }

    /// Encoded body length.
    pub fn buffer_len(&self) -> usize {
        self.proposals.iter().map(Proposal::buffer_len).sum()
    }
}
