//! The VLAN tags of a customer's frame on a customer-facing port (issue 16, customer
//! attachments): the tag pair that names the attachment, read the same way wherever a frame
//! is classified (the data plane's attach stage, the steer node's port thread).
//!
//! An attachment is an 802.1ad S-tag (TPID 0x88a8) followed by an 802.1Q C-tag (0x8100), or a
//! single 802.1Q tag. Anything else (untagged, an S-tag alone, two 0x8100 tags, a third tag,
//! a VLAN id of 0 or 4095 in any tag) cannot be an attachment's. IEEE 802.1Q table 9-2
//! reserves VLAN id 0 (a priority tag: the frame belongs to no VLAN) and 4095; configured tags
//! are 1..=4094, which keeps S-tag 0 free to mean "single tag" in a tag pair.

use crate::ethernet::{
    EtherType, EthernetAddress, EthernetFrame, VlanPacket, ETHERNET_HEADER_LEN, VLAN_TAG_LEN,
};

/// Why a frame has no attachment's tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagError {
    /// The frame is too short for its Ethernet header or its tags.
    Malformed,
    /// The frame is whole, but its tags are not an attachment's (see the module docs).
    Unknown,
}

/// A tagged frame's tags and where its payload starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tagged {
    /// (S-tag or 0 for a single tag, C-tag), each 1..=4094.
    pub tags: (u16, u16),
    /// The EtherType after the tags.
    pub ethertype: EtherType,
    /// Offset of the payload.
    pub payload: usize,
    /// Destination MAC.
    pub dst: EthernetAddress,
    /// Source MAC.
    pub src: EthernetAddress,
}

/// Reads a frame's attachment tags (see the module docs).
pub fn read(frame: &[u8]) -> Result<Tagged, TagError> {
    let eth = EthernetFrame::new_checked(frame).map_err(|_| TagError::Malformed)?;
    let (dst, src) = (eth.dst_addr(), eth.src_addr());
    let tag = |at: usize| {
        frame
            .get(at..)
            .and_then(|b| VlanPacket::new_checked(b).ok())
            .ok_or(TagError::Malformed)
    };
    let is_tag = |t: EtherType| t == EtherType::VLAN || t == EtherType::QINQ;
    let vid = |t: &VlanPacket<&[u8]>| match t.tci().vid {
        0 | 4095 => Err(TagError::Unknown),
        v => Ok(v),
    };
    let (tags, ethertype, payload) = match eth.ethertype() {
        EtherType::QINQ => {
            let outer = tag(ETHERNET_HEADER_LEN)?;
            if outer.ethertype() != EtherType::VLAN {
                return Err(TagError::Unknown);
            }
            let inner = tag(ETHERNET_HEADER_LEN + VLAN_TAG_LEN)?;
            if is_tag(inner.ethertype()) {
                return Err(TagError::Unknown);
            }
            (
                (vid(&outer)?, vid(&inner)?),
                inner.ethertype(),
                ETHERNET_HEADER_LEN + 2 * VLAN_TAG_LEN,
            )
        }
        EtherType::VLAN => {
            let t = tag(ETHERNET_HEADER_LEN)?;
            if is_tag(t.ethertype()) {
                return Err(TagError::Unknown);
            }
            (
                (0, vid(&t)?),
                t.ethertype(),
                ETHERNET_HEADER_LEN + VLAN_TAG_LEN,
            )
        }
        _ => return Err(TagError::Unknown),
    };
    Ok(Tagged {
        tags,
        ethertype,
        payload,
        dst,
        src,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame with `tpids_vids` tags (outermost first) and `ethertype` after them.
    fn frame(tpids_vids: &[(u16, u16)], ethertype: u16) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
        for &(tpid, vid) in tpids_vids {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&vid.to_be_bytes());
        }
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(&[0x45, 0, 0, 20]);
        f
    }

    #[test]
    fn qinq_and_single_tags() {
        let t = read(&frame(&[(0x88a8, 100), (0x8100, 20)], 0x0800)).unwrap();
        assert_eq!(t.tags, (100, 20));
        assert_eq!(t.ethertype, EtherType::IPV4);
        assert_eq!(t.payload, 22);
        assert_eq!(t.src, EthernetAddress([2, 0, 0, 0, 0, 2]));
        let t = read(&frame(&[(0x8100, 7)], 0x86dd)).unwrap();
        assert_eq!(
            (t.tags, t.ethertype, t.payload),
            ((0, 7), EtherType::IPV6, 18)
        );
        // The priority bits do not change the VLAN id.
        let t = read(&frame(
            &[(0x88a8, 0xe000 | 100), (0x8100, 0x2000 | 20)],
            0x0806,
        ))
        .unwrap();
        assert_eq!(t.tags, (100, 20));
    }

    #[test]
    fn what_is_not_an_attachments_tags() {
        for tags in [
            &[][..],
            &[(0x88a8, 100)][..],
            &[(0x8100, 100), (0x8100, 20)][..],
            &[(0x88a8, 100), (0x8100, 20), (0x8100, 3)][..],
            &[(0x88a8, 0), (0x8100, 20)][..],
            &[(0x88a8, 4095), (0x8100, 20)][..],
            &[(0x88a8, 100), (0x8100, 0)][..],
            &[(0x8100, 0)][..],
            &[(0x8100, 4095)][..],
        ] {
            let f = frame(tags, 0x0800);
            assert_eq!(read(&f), Err(TagError::Unknown), "{tags:?}");
        }
    }

    #[test]
    fn every_truncation_is_an_error_never_a_panic() {
        let f = frame(&[(0x88a8, 100), (0x8100, 20)], 0x0800);
        for cut in 0..22 {
            assert_eq!(read(&f[..cut]), Err(TagError::Malformed), "{cut}");
        }
        assert!(read(&f[..22]).is_ok());
    }
}
