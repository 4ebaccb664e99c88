//! TUN offloads in userspace: the `virtio_net_hdr` that prefixes every packet on an
//! `IFF_VNET_HDR` TUN device (virtio 1.x §5.1.6, legacy 10-byte layout in host byte order), the
//! split of the kernel's GSO super-packets into ordinary IP packets (TCP segmentation as
//! RFC 9293 §3.1 fields and RFC 791 / RFC 8200 §3 headers require; UDP segmentation for USO),
//! and [`TunWriter`](writer::TunWriter), which coalesces consecutive packets of one flow into one GSO super-packet
//! per write. Checksums follow RFC 1071, with the pseudo headers of RFC 9293 §3.1, RFC 768 and
//! RFC 8200 §8.1.
//!
//! The read side lives in [`split`] ([`split_frame`](split::split_frame)), the write side in [`writer`]
//! ([`TunWriter`](writer::TunWriter)); this file holds what both use: the header, the offload flags and the
//! drop reasons.

// The TUN worker moves to this API in issue 3's dataplane rewrite; until then parts are only
// used by the tests. Remove this allowance with the switch.

/// Bytes of the legacy `struct virtio_net_hdr`, the TUN default vnet header size.
pub(crate) const VNET_HDR_LEN: usize = 10;
/// The largest IP packet a TUN device carries: an IPv6 header and a 65535-byte payload.
pub(crate) const MAX_IP_PACKET: usize = 40 + 65535;
/// The most segments [`TunWriter`](writer::TunWriter) puts into one super-packet (the kernel's UDP_MAX_SEGMENTS
/// is at least 64; the TCP limit is far higher).
pub(crate) const MAX_SEGMENTS: usize = 64;

const F_NEEDS_CSUM: u8 = 1;
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
const GSO_UDP_L4: u8 = 5;
const GSO_ECN: u8 = 0x80;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_URG: u8 = 0x20;
const TCP_CWR: u8 = 0x80;
const TCP_CSUM_OFFSET: usize = 16;
const UDP_CSUM_OFFSET: usize = 6;

/// The offloads a TUN device has on. Without `vnet_hdr` the device is plain: one IP packet per
/// read or write, no header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Offloads {
    /// Every packet carries a `virtio_net_hdr` (`IFF_VNET_HDR`, `TUN_F_CSUM`).
    pub(crate) vnet_hdr: bool,
    /// TCP segmentation for IPv4 (`TUN_F_TSO4`).
    pub(crate) tso4: bool,
    /// TCP segmentation for IPv6 (`TUN_F_TSO6`).
    pub(crate) tso6: bool,
    /// UDP segmentation for IPv4 (`TUN_F_USO4`, Linux 6.2).
    pub(crate) uso4: bool,
    /// UDP segmentation for IPv6 (`TUN_F_USO6`, Linux 6.2).
    pub(crate) uso6: bool,
}

impl Offloads {
    /// A plain device.
    pub(crate) const NONE: Self = Self {
        vnet_hdr: false,
        tso4: false,
        tso6: false,
        uso4: false,
        uso6: false,
    };
    /// Everything this module handles.
    pub(crate) const ALL: Self = Self {
        vnet_hdr: true,
        tso4: true,
        tso6: true,
        uso4: true,
        uso6: true,
    };

    /// The same without UDP segmentation.
    pub(crate) fn without_uso(self) -> Self {
        Self {
            uso4: false,
            uso6: false,
            ..self
        }
    }

    /// Whether any segmentation offload is on.
    pub(crate) fn any_gso(self) -> bool {
        self.tso4 || self.tso6 || self.uso4 || self.uso6
    }

    /// The `TUNSETOFFLOAD` argument (`TUN_F_CSUM` whenever a segmentation offload is asked).
    pub(crate) fn tun_flags(self) -> libc::c_uint {
        let mut f = 0;
        for (on, bit) in [
            (self.tso4, libc::TUN_F_TSO4),
            (self.tso6, libc::TUN_F_TSO6),
            (self.uso4, libc::TUN_F_USO4),
            (self.uso6, libc::TUN_F_USO6),
        ] {
            if on {
                f |= bit | libc::TUN_F_CSUM;
            }
        }
        f
    }
}

impl std::fmt::Display for Offloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.vnet_hdr {
            return f.write_str("none");
        }
        f.write_str("vnet_hdr")?;
        for (on, name) in [
            (self.tso4, "tso4"),
            (self.tso6, "tso6"),
            (self.uso4, "uso4"),
            (self.uso6, "uso6"),
        ] {
            if on {
                write!(f, ",{name}")?;
            }
        }
        Ok(())
    }
}

/// The legacy `struct virtio_net_hdr` (`include/uapi/linux/virtio_net.h`), fields in host
/// byte order as TUN uses them unless `TUNSETVNETLE`/`BE` is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_NEEDS_CSUM` (1), `VIRTIO_NET_HDR_F_DATA_VALID` (2).
    pub(crate) flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`, possibly with the ECN bit (0x80).
    pub(crate) gso_type: u8,
    /// Bytes of headers (a hint from the kernel).
    pub(crate) hdr_len: u16,
    /// Payload bytes per segment.
    pub(crate) gso_size: u16,
    /// Where checksumming starts (the transport header).
    pub(crate) csum_start: u16,
    /// Where the checksum goes, from `csum_start`.
    pub(crate) csum_offset: u16,
}

impl VnetHdr {
    /// Reads a header from the first [`VNET_HDR_LEN`] bytes; None if fewer.
    pub(crate) fn parse(b: &[u8]) -> Option<Self> {
        let b: &[u8; VNET_HDR_LEN] = b.get(..VNET_HDR_LEN)?.try_into().ok()?;
        let u = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(Self {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    /// The wire form.
    pub(crate) fn emit(&self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        for (i, v) in [
            self.hdr_len,
            self.gso_size,
            self.csum_start,
            self.csum_offset,
        ]
        .into_iter()
        .enumerate()
        {
            b[2 + 2 * i..4 + 2 * i].copy_from_slice(&v.to_ne_bytes());
        }
        b
    }
}

macro_rules! tun_drops {
    ($($(#[$doc:meta])* $name:ident = $text:literal,)*) => {
        /// Why a frame read from an offload-enabled TUN device was dropped.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub(crate) enum TunDrop {
            $($(#[$doc])* $name,)*
        }
        impl TunDrop {
            /// Every reason, in index order.
            pub(crate) const ALL: &'static [TunDrop] = &[$(TunDrop::$name,)*];
            /// The name shown in stats.
            // Only the kernel tests (tests/tun.rs, which include this file) call it.
            #[cfg(test)]
            #[allow(dead_code)]
            pub(crate) fn name(self) -> &'static str {
                match self { $(TunDrop::$name => $text,)* }
            }
        }
    };
}

tun_drops! {
    /// A read shorter than the vnet header, or an empty packet.
    Short = "tun_short_read",
    /// A packet longer than any IP packet (the read filled the whole buffer).
    Truncated = "tun_read_truncated",
    /// An unknown GSO type, a zero `gso_size`, or checksum offsets outside the packet.
    BadHeader = "tun_vnet_bad_header",
    /// A GSO packet whose IP or transport headers do not parse or do not match its GSO type.
    GsoMalformed = "tun_gso_malformed",
    /// A GSO packet whose segments do not fit even an empty read batch.
    GsoTooLarge = "tun_gso_too_large",
}

/// Drop counts per [`TunDrop`] reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TunDrops([u64; 5]);

impl TunDrops {
    /// Counts one drop.
    pub(crate) fn add(&mut self, why: TunDrop) {
        self.0[why as usize] += 1;
    }

    /// The count for one reason.
    pub(crate) fn get(&self, why: TunDrop) -> u64 {
        self.0[why as usize]
    }

    /// The total.
    pub(crate) fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Non-zero counts.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (TunDrop, u64)> + '_ {
        TunDrop::ALL
            .iter()
            .map(|&d| (d, self.get(d)))
            .filter(|&(_, n)| n > 0)
    }

    /// Sets every count to zero.
    pub(crate) fn clear(&mut self) {
        self.0 = [0; 5];
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[path = "tun_offload/split.rs"]
pub(crate) mod split;
#[path = "tun_offload/writer.rs"]
pub(crate) mod writer;

#[cfg(test)]
#[path = "tun_offload/tests/mod.rs"]
mod tests;
