//! The compact snapshot of a route table: what a node stores so that its per-VM routes survive
//! a restart (`protego up` keeps it next to its state store). Not one record per VM in a
//! key-value store, but one file: about 13 bytes per IPv4 entry, 37 per IPv6 entry.
//!
//! ```text
//! magic "PGOVRT01"
//! u32 VNet count, then per VNet: u16 length + tenant name, u16 length + VNet name (UTF-8)
//! u64 entry count, then per entry:
//!     u8 kind: bit 0 set = VM address is IPv6, bit 1 set = host address is IPv6
//!     u32 VNet (index into the list above), VM address (4 or 16 bytes), host (4 or 16 bytes)
//! u64 FNV-1a hash of every byte before it
//! ```
//!
//! All integers big-endian. The names are the route file's (tenant, VNet name): the numbers a
//! table gives VNets ([`crate::VnetId`]) are the node's own and are not stored.

use fnv::FnvHasher;
use std::hash::Hasher;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const MAGIC: &[u8; 8] = b"PGOVRT01";

/// Why a snapshot could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("route snapshot, byte {offset}: {reason}")]
pub struct SnapshotError {
    /// Offset of the fault in the snapshot.
    pub offset: usize,
    /// What is wrong there.
    pub reason: &'static str,
}

/// One entry of a snapshot: the index of its (tenant, VNet) in [`Snapshot::vnets`], the VM's
/// address and its host's.
pub type SnapshotEntry = (u32, IpAddr, IpAddr);

/// A writer that hashes what it writes.
struct Hashing<W> {
    w: W,
    /// FNV-1a, 64 bits (`fnv`): enough to notice a torn or damaged file (not an
    /// adversary's).
    hash: FnvHasher,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hash.write(bytes);
        self.w.write_all(bytes)
    }
}

/// Writes a snapshot of `entries` (`entries` says how many there are; each names its VNet by
/// index into `vnets`, pairs of tenant and VNet name) to `w`. Returns the entries written.
/// Fails on a write error, a name longer than 65 535 bytes, or when `count` is not the number
/// of entries the iterator gives (nothing valid was written then).
pub fn write_snapshot<W: Write>(
    w: W,
    vnets: &[(&str, &str)],
    count: usize,
    entries: impl IntoIterator<Item = SnapshotEntry>,
) -> io::Result<usize> {
    let mut h = Hashing {
        w,
        hash: FnvHasher::default(),
    };
    h.put(MAGIC)?;
    let n = u32::try_from(vnets.len()).map_err(|_| invalid("too many VNets"))?;
    h.put(&n.to_be_bytes())?;
    for (tenant, vnet) in vnets {
        for name in [tenant, vnet] {
            let len = u16::try_from(name.len()).map_err(|_| invalid("name too long"))?;
            h.put(&len.to_be_bytes())?;
            h.put(name.as_bytes())?;
        }
    }
    h.put(&(count as u64).to_be_bytes())?;
    let mut written = 0;
    let mut buf = [0u8; 37];
    for (vnet, addr, host) in entries {
        let kind = u8::from(addr.is_ipv6()) | (u8::from(host.is_ipv6()) << 1);
        buf[0] = kind;
        buf[1..5].copy_from_slice(&vnet.to_be_bytes());
        let mut at = 5;
        for a in [addr, host] {
            at += match a {
                IpAddr::V4(a) => {
                    buf[at..at + 4].copy_from_slice(&a.octets());
                    4
                }
                IpAddr::V6(a) => {
                    buf[at..at + 16].copy_from_slice(&a.octets());
                    16
                }
            };
        }
        h.put(&buf[..at])?;
        written += 1;
    }
    if written != count {
        return Err(invalid("entry count differs from the entries given"));
    }
    let hash = h.hash.finish();
    h.w.write_all(&hash.to_be_bytes())?;
    h.w.flush()?;
    Ok(written)
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// A snapshot checked whole (magic, structure, hash): its VNets, and its entries to iterate.
#[derive(Debug)]
pub struct Snapshot<'a> {
    /// (tenant, VNet name) of each VNet index the entries use.
    pub vnets: Vec<(&'a str, &'a str)>,
    /// Entries.
    pub count: usize,
    /// The entries' bytes.
    body: &'a [u8],
}

/// A position-tracking reader of a snapshot's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], SnapshotError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(SnapshotError {
                offset: self.at,
                reason: what,
            });
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], SnapshotError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn name(&mut self) -> Result<&'a str, SnapshotError> {
        let len = u16::from_be_bytes(self.array("truncated name length")?);
        let at = self.at;
        let s = self.take(usize::from(len), "truncated name")?;
        core::str::from_utf8(s).map_err(|_| SnapshotError {
            offset: at,
            reason: "name is not UTF-8",
        })
    }

    fn addr(&mut self, v6: bool) -> Result<IpAddr, SnapshotError> {
        Ok(if v6 {
            IpAddr::V6(Ipv6Addr::from(self.array::<16>("truncated entry")?))
        } else {
            IpAddr::V4(Ipv4Addr::from(self.array::<4>("truncated entry")?))
        })
    }
}

/// Checks snapshot `bytes` whole: magic, structure, every entry's VNet index, the hash.
pub fn read_snapshot(bytes: &[u8]) -> Result<Snapshot<'_>, SnapshotError> {
    let Some(body_len) = bytes.len().checked_sub(8) else {
        return Err(SnapshotError {
            offset: 0,
            reason: "too short to be a route snapshot",
        });
    };
    let (body, tail) = bytes.split_at(body_len);
    let mut hash = FnvHasher::default();
    hash.write(body);
    let mut r = Reader { bytes: body, at: 0 };
    if r.take(MAGIC.len(), "not a route snapshot")? != MAGIC {
        return Err(SnapshotError {
            offset: 0,
            reason: "not a route snapshot (wrong magic)",
        });
    }
    let n = u32::from_be_bytes(r.array("truncated VNet count")?);
    let mut vnets = Vec::new();
    for _ in 0..n {
        vnets.push((r.name()?, r.name()?));
    }
    let count = u64::from_be_bytes(r.array("truncated entry count")?);
    let count = usize::try_from(count).map_err(|_| SnapshotError {
        offset: r.at - 8,
        reason: "entry count too large",
    })?;
    if hash.finish().to_be_bytes() != tail {
        return Err(SnapshotError {
            offset: body_len,
            reason: "hash mismatch (the file is damaged or was cut short)",
        });
    }
    let snapshot = Snapshot {
        vnets,
        count,
        body: &body[r.at..],
    };
    let mut seen = 0;
    for e in snapshot.entries() {
        e?;
        seen += 1;
    }
    if seen != count {
        return Err(SnapshotError {
            offset: body_len,
            reason: "entry count differs from the entries present",
        });
    }
    Ok(snapshot)
}

impl Snapshot<'_> {
    /// The entries, in the order written (each already checked by [`read_snapshot`]).
    pub fn entries(&self) -> impl Iterator<Item = Result<SnapshotEntry, SnapshotError>> + '_ {
        let mut r = Reader {
            bytes: self.body,
            at: 0,
        };
        let vnets = self.vnets.len();
        core::iter::from_fn(move || {
            if r.at == r.bytes.len() {
                return None;
            }
            let at = r.at;
            let entry = (|| {
                let [kind] = r.array::<1>("truncated entry")?;
                if kind > 3 {
                    return Err(SnapshotError {
                        offset: at,
                        reason: "unknown entry kind",
                    });
                }
                let vnet = u32::from_be_bytes(r.array("truncated entry")?);
                if vnet as usize >= vnets {
                    return Err(SnapshotError {
                        offset: at + 1,
                        reason: "VNet index out of range",
                    });
                }
                Ok((vnet, r.addr(kind & 1 != 0)?, r.addr(kind & 2 != 0)?))
            })();
            if entry.is_err() {
                r.at = r.bytes.len();
            }
            Some(entry)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("literal")
    }

    #[test]
    fn round_trip_and_damage_is_noticed() {
        let entries = vec![
            (0, ip("10.0.0.7"), ip("192.0.2.10")),
            (1, ip("10.0.0.7"), ip("2001:db8::10")),
            (1, ip("fd00::7"), ip("192.0.2.11")),
        ];
        let mut buf = Vec::new();
        let n = write_snapshot(
            &mut buf,
            &[("acme", "prod"), ("globex", "main")],
            entries.len(),
            entries.clone(),
        )
        .expect("written");
        assert_eq!(n, 3);
        // 8 magic + 4 + (2+4+2+4) + (2+6+2+4) + 8 count + 13 + 25 + 25 + 8 hash
        assert_eq!(buf.len(), 8 + 4 + 12 + 14 + 8 + 13 + 25 + 25 + 8);
        let s = read_snapshot(&buf).expect("valid");
        assert_eq!(s.vnets, vec![("acme", "prod"), ("globex", "main")]);
        let back: Vec<_> = s.entries().map(|e| e.expect("checked")).collect();
        assert_eq!(back, entries);
        for cut in [0, 7, 20, buf.len() - 1] {
            assert!(read_snapshot(&buf[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = buf.clone();
        bad[40] ^= 1;
        assert!(read_snapshot(&bad).is_err());
    }

    #[test]
    fn a_wrong_count_is_refused() {
        let mut buf = Vec::new();
        let e = write_snapshot(
            &mut buf,
            &[("a", "b")],
            2,
            [(0, ip("10.0.0.1"), ip("192.0.2.1"))],
        );
        assert!(e.is_err());
    }
}
