//! Geneve header view, option TLVs and builder (RFC 8926 §3.4–3.5), with Protego's own
//! options (health probe, probe reply, tunnel id) in the Experimental Use option classes.
//!
//! Fixed header (§3.4) and options (§3.5):
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |Ver|  Opt Len  |O|C|    Rsvd.  |          Protocol Type        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |        Virtual Network Identifier (VNI)       |    Reserved   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                    Variable-Length Options                    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//!
//! one option:
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |          Option Class         |C|    Type     |R|R|R| Length  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |             Variable-Length Option Data (Length * 4)          |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! Opt Len and Length count 4-byte words; Opt Len excludes the 8-byte fixed header and
//! Length excludes the 4-byte option header. The payload follows the options and runs to the
//! end of the UDP datagram. Between Protego's steer and data nodes (docs/architecture.md, "The picture") the payload
//! is the whole packet the peer sent, outer IPv4/IPv6 and UDP headers included, so Protocol
//! Type is 0x0800 or 0x86DD; or, for a customer's edge router attached at L2, the tagged
//! Ethernet frame as it was on the customer's link, Protocol Type 0x6558 with a port option.
//!
//! # Protego's options
//!
//! Option class 0xFF50 ([`OptionClass::PROTEGO`]), inside 0xFF00–0xFFFF, the range IANA's
//! "Geneve Option Class" registry sets aside for Experimental Use (RFC 8926 §7). No Protego
//! type has the critical bit, so a receiver that does not know them skips them and still
//! forwards the packet (§3.5.1).
//!
//! | Type | Meaning                    | Data (big-endian)                          |
//! |------|----------------------------|--------------------------------------------|
//! | 0x01 | health probe               | probe id (u32), sender's stamp (u32)       |
//! | 0x02 | probe reply                | the probe's id and stamp, echoed           |
//! | 0x03 | tunnel id                  | tunnel id (u32), attached by the steer node|
//! | 0x04 | port                       | customer-facing port id (u32) of an L2 frame|
//!
//! The stamp is opaque to the replier (a sequence number or a sender-relative timestamp);
//! the prober compares it with its own clock when the reply arrives.

use core::fmt;

use crate::error::WireError;
use crate::ethernet::EtherType;
use crate::field::{need, room, set_u16, set_u32, u16_at, u32_at};
use crate::vxlan::Vni;

/// IANA-assigned UDP destination port for Geneve (RFC 8926 §3.3).
pub const GENEVE_PORT: u16 = 6081;
/// Length of the fixed Geneve header (without options).
pub const GENEVE_HEADER_LEN: usize = 8;
/// Length of an option header (class, type, length).
pub const OPTION_HEADER_LEN: usize = 4;
/// Largest total length of the options: Opt Len is 6 bits of 4-byte words.
pub const MAX_OPTIONS_LEN: usize = 63 * 4;
/// Largest data length of one option: Length is 5 bits of 4-byte words.
pub const MAX_OPTION_DATA_LEN: usize = 31 * 4;
/// Protocol Type of an Ethernet frame payload (Transparent Ethernet Bridging, RFC 8926 §3.4).
pub const PROTOCOL_ETHERNET: EtherType = EtherType(0x6558);
/// The O flag (control packet) in the second header octet.
pub const FLAG_CONTROL: u8 = 0x80;
/// The C flag (critical options present) in the second header octet.
pub const FLAG_CRITICAL: u8 = 0x40;

/// The only Geneve version (RFC 8926 §3.4).
const VERSION: u8 = 0;
const OPT_LEN_MASK: u8 = 0x3f;
const OPTION_LEN_MASK: u8 = 0x1f;
const TYPE_CRITICAL: u8 = 0x80;
const FLAGS: usize = 1;
const PROTOCOL_TYPE: usize = 2;
const VNI: usize = 4;

const fn malformed(field: &'static str) -> WireError {
    WireError::Malformed {
        what: "geneve",
        field,
    }
}

crate::iana_registry! {
    /// A Geneve Option Class (IANA "Geneve Option Class" registry, RFC 8926 §7): the
    /// namespace of an option's type.
    OptionClass(u16) {
        /// Protego's own options (see the module documentation); an Experimental Use value.
        PROTEGO = 0xff50,
    }
}

impl OptionClass {
    /// True for the Experimental Use range 0xFF00–0xFFFF (RFC 8926 §7).
    pub const fn is_experimental(self) -> bool {
        self.0 >= 0xff00
    }
}

/// An option type, meaningful within its [`OptionClass`]; the high bit is the critical bit.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct OptionType(pub u8);

impl OptionType {
    /// Protego health probe (class [`OptionClass::PROTEGO`]).
    pub const PROTEGO_PROBE: Self = Self(0x01);
    /// Protego probe reply (class [`OptionClass::PROTEGO`]).
    pub const PROTEGO_PROBE_REPLY: Self = Self(0x02);
    /// Protego tunnel id (class [`OptionClass::PROTEGO`]).
    pub const PROTEGO_TUNNEL_ID: Self = Self(0x03);
    /// Protego customer-facing port (class [`OptionClass::PROTEGO`]).
    pub const PROTEGO_PORT: Self = Self(0x04);

    /// True if the critical bit (the high-order bit) is set: a receiver that does not
    /// recognise the option must drop the packet (RFC 8926 §3.5.1).
    pub const fn is_critical(self) -> bool {
        self.0 & TYPE_CRITICAL != 0
    }
}

impl fmt::Debug for OptionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#04x}", self.0)
    }
}

impl fmt::Display for OptionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One option: class, type and data (a multiple of 4 bytes when parsed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GeneveOption<'a> {
    /// The namespace of the type.
    pub class: OptionClass,
    /// The type, critical bit included.
    pub option_type: OptionType,
    /// The option data, without the option header.
    pub data: &'a [u8],
}

impl<'a> GeneveOption<'a> {
    /// Reads the option at the start of `options`; returns it and its total length (header
    /// plus data). The three R bits are ignored (RFC 8926 §3.5).
    pub fn parse(options: &'a [u8]) -> Result<(Self, usize), WireError> {
        need("geneve option", options.len(), OPTION_HEADER_LEN)?;
        let len = OPTION_HEADER_LEN + usize::from(options[3] & OPTION_LEN_MASK) * 4;
        need("geneve option", options.len(), len)?;
        Ok((
            Self {
                class: OptionClass(u16_at(options, 0)),
                option_type: OptionType(options[2]),
                data: &options[OPTION_HEADER_LEN..len],
            },
            len,
        ))
    }

    /// True if the type's critical bit is set.
    pub const fn is_critical(&self) -> bool {
        self.option_type.is_critical()
    }

    /// Bytes [`Self::emit`] writes: the header and the data padded to a multiple of 4.
    pub const fn buffer_len(&self) -> usize {
        OPTION_HEADER_LEN + self.data.len().next_multiple_of(4)
    }

    /// The Length field for this option's data, if the data fits in 31 words.
    fn length_words(&self) -> Result<u8, WireError> {
        if self.data.len() > MAX_OPTION_DATA_LEN {
            return Err(malformed("option length"));
        }
        // At most 124 / 4 = 31 after the check above.
        u8::try_from(self.data.len().div_ceil(4)).map_err(|_| malformed("option length"))
    }

    /// Writes the option into `buf`, the data zero-padded to a multiple of 4 bytes and the R
    /// bits zero; returns [`Self::buffer_len`]. Data longer than 124 bytes is `Malformed`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let words = self.length_words()?;
        let len = self.buffer_len();
        room("geneve option", buf.len(), len)?;
        set_u16(buf, 0, self.class.0);
        buf[2] = self.option_type.0;
        buf[3] = words;
        let data_end = OPTION_HEADER_LEN + self.data.len();
        buf[OPTION_HEADER_LEN..data_end].copy_from_slice(self.data);
        buf[data_end..len].fill(0);
        Ok(len)
    }
}

/// Checks that `options` is an exact sequence of whole options.
fn check_options(mut options: &[u8]) -> Result<(), WireError> {
    while !options.is_empty() {
        // RFC 8926 §3.5: "Packets in which the total length of all options is not equal to
        // the 'Opt Len' in the base header are invalid and MUST be silently dropped."
        let (_, len) = GeneveOption::parse(options).map_err(|_| malformed("option length"))?;
        options = &options[len..];
    }
    Ok(())
}

/// An iterator over the options of a Geneve header.
#[derive(Debug, Clone)]
pub struct GeneveOptions<'a> {
    rest: &'a [u8],
}

impl<'a> GeneveOptions<'a> {
    /// Iterates over `options` after checking it is an exact sequence of whole options.
    pub fn new(options: &'a [u8]) -> Result<Self, WireError> {
        check_options(options)?;
        Ok(Self { rest: options })
    }
}

impl<'a> Iterator for GeneveOptions<'a> {
    type Item = GeneveOption<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        // Checked input never fails here; unchecked input ends the iteration at the first
        // option that does not fit.
        match GeneveOption::parse(self.rest) {
            Ok((option, len)) => {
                self.rest = &self.rest[len..];
                Some(option)
            }
            Err(_) => {
                self.rest = &[];
                None
            }
        }
    }
}

/// A read/write view of a Geneve header, its options and the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenevePacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> GenevePacket<T> {
    /// Wraps a buffer without checks; accessors may panic unless [`Self::check_len`] passed.
    pub const fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// Wraps a buffer after [`Self::check_len`].
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks the fixed header is present with version 0, the options (Opt Len) fit in the
    /// buffer, and the options fill Opt Len exactly. Reserved bits are not checked.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        need("geneve", b.len(), GENEVE_HEADER_LEN)?;
        // RFC 8926 §3.4: "Packets received by a tunnel endpoint with an unknown version MUST
        // be dropped." The layout after the first octet is only known for version 0.
        let version = self.version();
        if version != VERSION {
            return Err(WireError::Unsupported {
                what: "geneve",
                field: "version",
                value: u32::from(version),
            });
        }
        let header_len = self.header_len();
        need("geneve", b.len(), header_len)?;
        check_options(&b[GENEVE_HEADER_LEN..header_len])
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The Ver field (2 bits).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 6
    }

    /// Length of the options in bytes (Opt Len times 4).
    pub fn options_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[0] & OPT_LEN_MASK) * 4
    }

    /// Length of the fixed header plus the options: the offset of the payload.
    pub fn header_len(&self) -> usize {
        GENEVE_HEADER_LEN + self.options_len()
    }

    /// The O flag: a control message between tunnel endpoints, whose payload must not be
    /// forwarded (RFC 8926 §3.4).
    pub fn is_control(&self) -> bool {
        self.buffer.as_ref()[FLAGS] & FLAG_CONTROL != 0
    }

    /// The C flag: the sender says one or more options are critical. Check the options
    /// themselves with [`Self::unknown_critical_option`]; the flag alone is not trusted.
    pub fn critical_options_present(&self) -> bool {
        self.buffer.as_ref()[FLAGS] & FLAG_CRITICAL != 0
    }

    /// The EtherType of the payload (0x6558 Ethernet, 0x0800 IPv4, 0x86DD IPv6, ...).
    pub fn protocol_type(&self) -> EtherType {
        EtherType(u16_at(self.buffer.as_ref(), PROTOCOL_TYPE))
    }

    /// The 24-bit Virtual Network Identifier.
    pub fn vni(&self) -> Vni {
        // A u32 shifted right by 8 always fits in 24 bits.
        Vni::new(u32_at(self.buffer.as_ref(), VNI) >> 8).unwrap_or_default()
    }

    /// The raw options.
    pub fn options_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[GENEVE_HEADER_LEN..self.header_len()]
    }

    /// The options, in order.
    pub fn options(&self) -> GeneveOptions<'_> {
        GeneveOptions {
            rest: self.options_bytes(),
        }
    }

    /// The first critical option `is_known` does not recognise, if any. RFC 8926 §3.5.1:
    /// a tunnel endpoint that receives such an option "MUST drop the packet". Every option
    /// is examined whatever the C flag says. Unknown non-critical options are not reported
    /// (they are skipped).
    pub fn unknown_critical_option<F>(&self, mut is_known: F) -> Option<GeneveOption<'_>>
    where
        F: FnMut(&GeneveOption<'_>) -> bool,
    {
        self.options()
            .find(|option| option.is_critical() && !is_known(option))
    }

    /// True if an option is critical and not one of Protego's ([`ProtegoOption::recognises`]):
    /// a Protego node must drop the packet.
    pub fn has_unknown_critical_option(&self) -> bool {
        self.unknown_critical_option(|o| ProtegoOption::recognises(o.class, o.option_type))
            .is_some()
    }

    /// The payload after the options.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> GenevePacket<T> {
    /// Writes the fixed header: version 0, `options_len` bytes of options (a multiple of 4,
    /// at most 252; larger values are truncated to 6 bits of words), the flags, every
    /// reserved bit zero.
    fn set_fixed_header(&mut self, options_len: usize, flags: u8, repr: &GeneveRepr) {
        let b = self.buffer.as_mut();
        // Masked to 6 bits, so the cast cannot truncate.
        b[0] = (VERSION << 6) | ((options_len / 4) as u8 & OPT_LEN_MASK);
        b[FLAGS] = flags;
        set_u16(b, PROTOCOL_TYPE, repr.protocol_type.0);
        set_u32(b, VNI, repr.vni.get() << 8);
    }

    /// Sets or clears the O flag (control packet).
    pub fn set_control(&mut self, control: bool) {
        self.set_flag(FLAG_CONTROL, control);
    }

    /// Sets or clears the C flag (critical options present).
    pub fn set_critical_options_present(&mut self, critical: bool) {
        self.set_flag(FLAG_CRITICAL, critical);
    }

    fn set_flag(&mut self, flag: u8, on: bool) {
        let b = &mut self.buffer.as_mut()[FLAGS];
        if on {
            *b |= flag;
        } else {
            *b &= !flag;
        }
    }

    /// Sets the Protocol Type.
    pub fn set_protocol_type(&mut self, protocol_type: EtherType) {
        set_u16(self.buffer.as_mut(), PROTOCOL_TYPE, protocol_type.0);
    }

    /// Sets the VNI; the reserved octet after it becomes zero.
    pub fn set_vni(&mut self, vni: Vni) {
        set_u32(self.buffer.as_mut(), VNI, vni.get() << 8);
    }

    /// The raw options, mutable.
    pub fn options_bytes_mut(&mut self) -> &mut [u8] {
        let end = self.header_len();
        &mut self.buffer.as_mut()[GENEVE_HEADER_LEN..end]
    }

    /// The payload after the options, mutable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        &mut self.buffer.as_mut()[start..]
    }
}

/// The fixed fields of a Geneve header. The C flag and Opt Len follow from the options,
/// which [`GeneveBuilder`] (or [`Self::emit`]) writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GeneveRepr {
    /// The O flag: a control message between tunnel endpoints (its payload is never
    /// forwarded), such as an idle health probe.
    pub control: bool,
    /// The EtherType of the payload.
    pub protocol_type: EtherType,
    /// The network identifier.
    pub vni: Vni,
}

impl GeneveRepr {
    /// Reads the fixed fields of a packet that passes [`GenevePacket::check_len`]; reserved
    /// bits are ignored (RFC 8926 §3.4).
    pub fn parse<T: AsRef<[u8]>>(packet: &GenevePacket<T>) -> Result<Self, WireError> {
        packet.check_len()?;
        Ok(Self {
            control: packet.is_control(),
            protocol_type: packet.protocol_type(),
            vni: packet.vni(),
        })
    }

    /// Bytes [`Self::emit`] writes: the fixed header and the (padded) options.
    pub fn buffer_len(&self, options: &[GeneveOption<'_>]) -> usize {
        GENEVE_HEADER_LEN + options.iter().map(GeneveOption::buffer_len).sum::<usize>()
    }

    /// Writes the header and `options` into `buf`; returns the header length, the offset
    /// at which the caller writes the payload. See [`GeneveBuilder`].
    pub fn emit(&self, options: &[GeneveOption<'_>], buf: &mut [u8]) -> Result<usize, WireError> {
        let mut builder = GeneveBuilder::new(buf, self)?;
        for option in options {
            builder.push(option)?;
        }
        Ok(builder.finish())
    }
}

/// Writes a Geneve header and its options into a caller buffer, one option at a time;
/// [`Self::finish`] fills in Opt Len and the C flag and returns the payload offset.
///
/// ```
/// # use protego_wire::geneve::*;
/// # use protego_wire::{ethernet::EtherType, vxlan::Vni};
/// let mut buf = [0u8; 64];
/// let repr = GeneveRepr { control: false, protocol_type: EtherType::IPV4, vni: Vni::new(7).unwrap() };
/// let mut b = GeneveBuilder::new(&mut buf, &repr)?;
/// b.push_protego(&ProtegoOption::TunnelId(42))?;
/// let offset = b.finish();
/// assert_eq!(offset, 16);
/// // The caller writes the payload at buf[offset..].
/// # Ok::<(), protego_wire::error::WireError>(())
/// ```
#[derive(Debug)]
pub struct GeneveBuilder<'b> {
    buf: &'b mut [u8],
    repr: GeneveRepr,
    end: usize,
    critical: bool,
}

impl<'b> GeneveBuilder<'b> {
    /// Starts a header in `buf` (at least 8 bytes).
    pub fn new(buf: &'b mut [u8], repr: &GeneveRepr) -> Result<Self, WireError> {
        room("geneve", buf.len(), GENEVE_HEADER_LEN)?;
        Ok(Self {
            buf,
            repr: *repr,
            end: GENEVE_HEADER_LEN,
            critical: false,
        })
    }

    /// Appends an option (data zero-padded to a multiple of 4 bytes). Data over 124 bytes,
    /// or options totalling over 252 bytes, are `Malformed`; a full buffer is
    /// `BufferTooSmall`. On error nothing is appended.
    pub fn push(&mut self, option: &GeneveOption<'_>) -> Result<(), WireError> {
        option.length_words()?;
        let len = option.buffer_len();
        if self.end - GENEVE_HEADER_LEN + len > MAX_OPTIONS_LEN {
            return Err(malformed("opt len"));
        }
        room("geneve", self.buf.len(), self.end + len)?;
        self.end += option.emit(&mut self.buf[self.end..])?;
        self.critical |= option.is_critical();
        Ok(())
    }

    /// Appends one of Protego's options.
    pub fn push_protego(&mut self, option: &ProtegoOption) -> Result<(), WireError> {
        let mut data = [0u8; ProtegoOption::MAX_DATA_LEN];
        let len = option.write_data(&mut data);
        self.push(&GeneveOption {
            class: OptionClass::PROTEGO,
            option_type: option.option_type(),
            data: &data[..len],
        })
    }

    /// Bytes written so far (fixed header plus options).
    pub fn len(&self) -> usize {
        self.end
    }

    /// True if no option has been pushed.
    pub fn is_empty(&self) -> bool {
        self.end == GENEVE_HEADER_LEN
    }

    /// Writes the fixed header: version 0, Opt Len, the O flag, the C flag if any pushed
    /// option is critical (RFC 8926 §3.4), every reserved bit zero. Returns the header
    /// length, where the payload starts.
    pub fn finish(self) -> usize {
        let mut flags = 0;
        if self.repr.control {
            flags |= FLAG_CONTROL;
        }
        if self.critical {
            flags |= FLAG_CRITICAL;
        }
        let options_len = self.end - GENEVE_HEADER_LEN;
        GenevePacket::new_unchecked(&mut self.buf[..GENEVE_HEADER_LEN]).set_fixed_header(
            options_len,
            flags,
            &self.repr,
        );
        self.end
    }
}

/// A health probe, or the reply echoing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HealthProbe {
    /// Identifies the probe (chosen by the prober).
    pub id: u32,
    /// A sequence number or sender-relative timestamp, opaque to the replier.
    pub stamp: u32,
}

/// One of Protego's options (class [`OptionClass::PROTEGO`], none critical).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtegoOption {
    /// Type 0x01: a steer node asks the data node to answer.
    Probe(HealthProbe),
    /// Type 0x02: the data node's answer, echoing the probe.
    ProbeReply(HealthProbe),
    /// Type 0x03: the tunnel the steer node attributes the packet to.
    TunnelId(u32),
    /// Type 0x04: the customer-facing port (a cluster-wide id) an Ethernet frame came in on,
    /// or is to go out of.
    Port(u32),
}

impl ProtegoOption {
    /// Largest data length of a Protego option.
    pub const MAX_DATA_LEN: usize = 8;

    /// The option type.
    pub const fn option_type(&self) -> OptionType {
        match self {
            Self::Probe(_) => OptionType::PROTEGO_PROBE,
            Self::ProbeReply(_) => OptionType::PROTEGO_PROBE_REPLY,
            Self::TunnelId(_) => OptionType::PROTEGO_TUNNEL_ID,
            Self::Port(_) => OptionType::PROTEGO_PORT,
        }
    }

    /// True if `class` and `option_type` name one of Protego's options.
    pub fn recognises(class: OptionClass, option_type: OptionType) -> bool {
        class == OptionClass::PROTEGO
            && matches!(
                option_type,
                OptionType::PROTEGO_PROBE
                    | OptionType::PROTEGO_PROBE_REPLY
                    | OptionType::PROTEGO_TUNNEL_ID
                    | OptionType::PROTEGO_PORT
            )
    }

    /// The typed option, `None` for another class or an unknown Protego type (skipped like
    /// any unknown option); a known type with the wrong data length is `Malformed`.
    pub fn parse(option: &GeneveOption<'_>) -> Result<Option<Self>, WireError> {
        if !Self::recognises(option.class, option.option_type) {
            return Ok(None);
        }
        let bad = WireError::Malformed {
            what: "geneve protego option",
            field: "length",
        };
        let d = option.data;
        let probe = || -> Result<HealthProbe, WireError> {
            if d.len() != 8 {
                return Err(bad);
            }
            Ok(HealthProbe {
                id: u32_at(d, 0),
                stamp: u32_at(d, 4),
            })
        };
        let word = || -> Result<u32, WireError> {
            if d.len() != 4 {
                return Err(bad);
            }
            Ok(u32_at(d, 0))
        };
        Ok(Some(match option.option_type {
            OptionType::PROTEGO_PROBE => Self::Probe(probe()?),
            OptionType::PROTEGO_PROBE_REPLY => Self::ProbeReply(probe()?),
            OptionType::PROTEGO_PORT => Self::Port(word()?),
            _ => Self::TunnelId(word()?),
        }))
    }

    /// Writes the option data into `data`; returns its length.
    fn write_data(&self, data: &mut [u8; Self::MAX_DATA_LEN]) -> usize {
        match self {
            Self::Probe(p) | Self::ProbeReply(p) => {
                set_u32(data, 0, p.id);
                set_u32(data, 4, p.stamp);
                8
            }
            Self::TunnelId(id) | Self::Port(id) => {
                set_u32(data, 0, *id);
                4
            }
        }
    }

    /// Bytes [`Self::emit`] writes: the option header and data.
    pub const fn buffer_len(&self) -> usize {
        OPTION_HEADER_LEN
            + match self {
                Self::Probe(_) | Self::ProbeReply(_) => 8,
                Self::TunnelId(_) | Self::Port(_) => 4,
            }
    }

    /// Writes the whole option (header and data) into `buf`; returns [`Self::buffer_len`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let mut data = [0u8; Self::MAX_DATA_LEN];
        let len = self.write_data(&mut data);
        GeneveOption {
            class: OptionClass::PROTEGO,
            option_type: self.option_type(),
            data: &data[..len],
        }
        .emit(buf)
    }
}

#[cfg(test)]
mod tests;
