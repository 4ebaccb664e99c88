//! The customer-facing port table: (port, S-tag, C-tag) → the data node serving that
//! attachment (issue 16, the provider-edge gateway's "customer attachment at L2").
//!
//! A customer's edge router is attached to one tag pair of a port of a steer node: Q-in-Q
//! (802.1ad S-tag outside, 802.1Q C-tag inside: the S-tag names the customer, the C-tag the
//! VNet) or a single 802.1Q tag. The steer node reads the tags of each frame on the port,
//! looks the pair up here and sends the frame, tags included, inside Geneve to the data node
//! serving the attachment (`wire::relay::emit_l2_frame`). A single-tag attachment's key has
//! S-tag 0, which IEEE 802.1Q reserves (a priority tag), so it never collides with a Q-in-Q
//! pair. One hash lookup per frame, as [`crate::SpiTable`] per ESP packet; migrating an
//! attachment points its entry at another node.

use rustc_hash::FxHashMap;

use crate::error::SteerError;
use crate::ids::{AttachmentId, NodeId, PortId};
use wire::vxlan::Vni;

/// A port table key: the port, the S-tag (0 for a single-tag attachment) and the C-tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortKey {
    /// The customer-facing port.
    pub port: PortId,
    /// The outer 802.1ad tag's VLAN id, or 0 for a single 802.1Q tag.
    pub s_tag: u16,
    /// The (inner) 802.1Q tag's VLAN id.
    pub c_tag: u16,
}

impl PortKey {
    /// A checked key: the C-tag and a non-zero S-tag must be VLAN ids (1..=4094).
    pub fn new(port: PortId, s_tag: u16, c_tag: u16) -> Result<Self, SteerError> {
        let check = |which, vid: u16, zero_ok: bool| {
            if (vid == 0 && zero_ok) || (1..=4094).contains(&vid) {
                Ok(())
            } else {
                Err(SteerError::InvalidVlanId { port, which, vid })
            }
        };
        check("s_tag", s_tag, true)?;
        check("c_tag", c_tag, false)?;
        Ok(Self { port, s_tag, c_tag })
    }
}

/// Where a port's tag pair goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AttachEntry {
    /// The data node serving the attachment.
    pub node: NodeId,
    /// The attachment (for counters).
    pub attachment: AttachmentId,
    /// Its VNet's VNI: a CE's IP packet that one of the VNI's tunnel selectors takes goes to
    /// that tunnel's node instead, as the hosts' VXLAN does (None: always `node`).
    pub vni: Option<Vni>,
}

/// (port, S-tag, C-tag) → [`AttachEntry`] (see the module docs). `Clone`, so the I/O layer can
/// edit a copy and swap it in as the next snapshot.
#[derive(Debug, Clone, Default)]
pub struct PortTable {
    map: FxHashMap<PortKey, AttachEntry>,
}

impl PortTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Steers `key` to `entry`, returning the entry it replaced.
    pub fn insert(&mut self, key: PortKey, entry: AttachEntry) -> Option<AttachEntry> {
        self.map.insert(key, entry)
    }

    /// Stops steering `key`, returning its entry if it had one.
    pub fn remove(&mut self, key: PortKey) -> Option<AttachEntry> {
        self.map.remove(&key)
    }

    /// Where a frame on `port` with these tags goes, if anywhere: `s_tag` 0 for a frame with
    /// one tag. O(1). Unchecked ids (0 or 4095 as a C-tag) simply find nothing.
    #[inline]
    pub fn lookup(&self, port: PortId, s_tag: u16, c_tag: u16) -> Option<AttachEntry> {
        self.map.get(&PortKey { port, s_tag, c_tag }).copied()
    }

    /// Keeps only the entries for which `keep` returns true (e.g. drop every entry of a port
    /// that went away).
    pub fn retain(&mut self, mut keep: impl FnMut(PortKey, AttachEntry) -> bool) {
        self.map.retain(|&key, &mut entry| keep(key, entry));
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (PortKey, AttachEntry)> + '_ {
        self.map.iter().map(|(&k, &e)| (k, e))
    }

    /// Number of steered tag pairs.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if no tag pair is steered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(node: u32, attachment: u32) -> AttachEntry {
        AttachEntry {
            node: NodeId(node),
            attachment: AttachmentId(attachment),
            vni: None,
        }
    }

    fn key(port: u32, s: u16, c: u16) -> PortKey {
        PortKey::new(PortId(port), s, c).unwrap()
    }

    #[test]
    fn insert_lookup_migrate_remove() {
        let mut t = PortTable::new();
        assert!(t.is_empty());
        assert_eq!(t.insert(key(1, 100, 20), entry(1, 7)), None);
        assert_eq!(t.lookup(PortId(1), 100, 20), Some(entry(1, 7)));
        // Same tags on another port, or the tags swapped: another customer.
        assert_eq!(t.lookup(PortId(2), 100, 20), None);
        assert_eq!(t.lookup(PortId(1), 20, 100), None);
        // Migration: the same tag pair now goes to another node.
        assert_eq!(t.insert(key(1, 100, 20), entry(2, 7)), Some(entry(1, 7)));
        assert_eq!(t.lookup(PortId(1), 100, 20), Some(entry(2, 7)));
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove(key(1, 100, 20)), Some(entry(2, 7)));
        assert_eq!(t.remove(key(1, 100, 20)), None);
        assert!(t.is_empty());
    }

    #[test]
    fn a_single_tag_never_matches_a_tag_pair() {
        let mut t = PortTable::new();
        t.insert(key(1, 0, 20), entry(1, 1));
        t.insert(key(1, 30, 20), entry(2, 2));
        assert_eq!(t.lookup(PortId(1), 0, 20), Some(entry(1, 1)));
        assert_eq!(t.lookup(PortId(1), 30, 20), Some(entry(2, 2)));
        assert_eq!(t.lookup(PortId(1), 31, 20), None);
    }

    #[test]
    fn reserved_vlan_ids_are_refused() {
        for (s, c, which, vid) in [
            (0, 0, "c_tag", 0),
            (1, 4095, "c_tag", 4095),
            (4095, 1, "s_tag", 4095),
            (1, 5000, "c_tag", 5000),
        ] {
            assert_eq!(
                PortKey::new(PortId(3), s, c),
                Err(SteerError::InvalidVlanId {
                    port: PortId(3),
                    which,
                    vid
                })
            );
        }
        assert!(PortKey::new(PortId(3), 0, 1).is_ok());
        assert!(PortKey::new(PortId(3), 4094, 4094).is_ok());
        let e = PortKey::new(PortId(3), 1, 0).unwrap_err();
        assert_eq!(e.to_string(), "port3: c_tag 0 is not a VLAN id (1..=4094)");
    }

    #[test]
    fn snapshots_are_independent_and_retain_filters() {
        let mut t = PortTable::new();
        for i in 0..4000u32 {
            let (s, c) = (1 + (i / 4000) as u16, 1 + (i % 4000) as u16);
            t.insert(key(i % 2, s, c), entry(i % 4, i));
        }
        let snapshot = t.clone();
        t.retain(|k, _| k.port != PortId(1));
        assert_eq!(t.len(), 2000);
        assert_eq!(snapshot.len(), 4000);
        assert!(t.iter().all(|(k, _)| k.port == PortId(0)));
    }
}
